//! Versioned weight snapshots in a run's object store: a policy's saved directory (the Hugging
//! Face layout, or a LoRA adapter) published under its name and version, and loaded by any
//! process of the run. What a rollout worker in another process, or M-GRPO's sub-agent server,
//! needs to follow a policy that trains elsewhere.
//!
//! Objects: `snap/<policy>/<version>/<file>` for each file, then the manifest
//! `snap/<policy>/<version>` listing them. The manifest goes last, so a reader who finds it
//! finds every file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use super::nats::NatsBus;
use super::store::RunStore;
use crate::error::{Error, Result};

#[derive(Serialize, Deserialize)]
struct Manifest {
    policy: String,
    version: u64,
    /// Paths relative to the snapshot's directory, `/`-separated.
    files: Vec<String>,
    bytes: u64,
}

fn manifest_name(policy: &str, version: u64) -> String {
    format!("snap/{policy}/{version}")
}

impl NatsBus {
    /// Publishes the files of `dir` as `policy`'s weights at `version`.
    pub fn publish_snapshot(&self, policy: &str, version: u64, dir: &Path) -> Result<()> {
        let store = self.store();
        let mut files = Vec::new();
        list_files(dir, dir, &mut files)?;
        files.sort();
        let prefix = manifest_name(policy, version);
        // A version names one set of weights for good: a reader may have fetched it already.
        if read_object(store, &prefix)?.is_some() {
            return Err(Error::InvalidArgument(format!(
                "run {:?} already has a snapshot of policy {policy:?} at version {version}; publish a new version",
                store.run
            )));
        }
        let mut total = 0u64;
        store.rt.block_on(async {
            for rel in &files {
                let path = dir.join(rel);
                let bytes = std::fs::read(&path).map_err(|e| Error::io("read", &path, e))?;
                total += bytes.len() as u64;
                store
                    .objects
                    .put(format!("{prefix}/{rel}").as_str(), &mut bytes.as_slice())
                    .await
                    .map_err(|e| store.trouble(&format!("store {}", path.display()), &e))?;
            }
            let manifest = Manifest { policy: policy.to_string(), version, files: files.clone(), bytes: total };
            let json = serde_json::to_vec(&manifest).expect("a manifest serialises");
            store
                .objects
                .put(prefix.as_str(), &mut json.as_slice())
                .await
                .map_err(|e| store.trouble("store a snapshot's manifest", &e))?;
            Ok(())
        })
    }

    /// Writes `policy`'s weights at `version` into the new directory `dest` (through a
    /// temporary directory beside it, renamed when complete; an existing `dest` is refused).
    pub fn fetch_snapshot(&self, policy: &str, version: u64, dest: &Path) -> Result<PathBuf> {
        let store = self.store();
        if dest.exists() {
            return Err(Error::InvalidArgument(format!(
                "{} exists; a snapshot is written into a new directory",
                dest.display()
            )));
        }
        let manifest: Manifest = match read_object(store, &manifest_name(policy, version))? {
            Some(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| store.trouble("read a snapshot's manifest", &e))?
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "run {:?} has no snapshot of policy {policy:?} at version {version}",
                    store.run
                )));
            }
        };
        let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
        let tmp = tempfile::Builder::new()
            .prefix(".snapshot-")
            .tempdir_in(parent)
            .map_err(|e| Error::io("create a directory in", parent, e))?;
        for rel in &manifest.files {
            // Only plain relative paths: a manifest must not write outside `dest`.
            if rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
                return Err(store.trouble("read a snapshot's manifest", &format!("it names the path {rel:?}")));
            }
            let name = format!("{}/{rel}", manifest_name(policy, version));
            let bytes = read_object(store, &name)?
                .ok_or_else(|| store.trouble(&format!("read {name}"), &"the object is missing"))?;
            let path = tmp.path().join(rel);
            if let Some(p) = path.parent() {
                std::fs::create_dir_all(p).map_err(|e| Error::io("create", p, e))?;
            }
            std::fs::write(&path, bytes).map_err(|e| Error::io("write", &path, e))?;
        }
        let tmp = tmp.keep();
        std::fs::rename(&tmp, dest).map_err(|e| Error::io("rename a snapshot into", dest, e))?;
        Ok(dest.to_path_buf())
    }
}

/// The bytes of object `name`, or `None` when there is no such object.
fn read_object(store: &RunStore, name: &str) -> Result<Option<Vec<u8>>> {
    use async_nats::jetstream::object_store::GetErrorKind;
    store.rt.block_on(async {
        let mut object = match store.objects.get(name).await {
            Ok(o) => o,
            Err(e) if e.kind() == GetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(store.trouble(&format!("read {name}"), &e)),
        };
        let mut bytes = Vec::new();
        object.read_to_end(&mut bytes).await.map_err(|e| store.trouble(&format!("read {name}"), &e))?;
        Ok(Some(bytes))
    })
}

/// Every file under `dir`, relative to `root`, `/`-separated.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))? {
        let path = entry.map_err(|e| Error::io("list", dir, e))?.path();
        if path.is_dir() {
            list_files(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).expect("under the root");
            out.push(rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
        }
    }
    Ok(())
}
