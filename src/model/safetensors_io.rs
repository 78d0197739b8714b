//! Hugging Face safetensors checkpoints: single file or sharded with
//! `model.safetensors.index.json`, read through a memory map; and writing them back.
//!
//! Headers are validated up front (a truncated download fails here with the file named, not
//! later with garbage weights). Data in bf16/f16/f32/f64 is widened to f32 master weights.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::Metadata};
use serde_json::Value;

use super::weights::{HostTensor, Pending, WeightSource, bytes_to_f32};
use crate::error::{Error, Result, temp_path_for};

struct MappedFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    header_len: usize,
    metadata: Metadata,
}

/// Weights of one HF model directory.
pub struct SafetensorsSource {
    dir: PathBuf,
    files: Vec<MappedFile>,
    /// tensor name → index into `files`
    index: HashMap<String, usize>,
}

impl SafetensorsSource {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let file_names: Vec<String> = if index_path.exists() {
            let text = crate::error::read_to_string(&index_path)?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| Error::config(index_path.display().to_string(), format!("not valid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| Error::config(index_path.display().to_string(), "missing the \"weight_map\" object"))?;
            let mut names: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
            names.sort();
            names.dedup();
            names
        } else if single.exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(Error::NotFound {
                what: "model weights".into(),
                path: single,
                hint: "Expected model.safetensors or model.safetensors.index.json with its shards \
                       in the model directory."
                    .into(),
            });
        };

        let mut files = Vec::new();
        let mut index = HashMap::new();
        for name in file_names {
            let f = map_file(&dir.join(&name))?;
            for tensor in f.metadata.tensors().keys() {
                index.insert(tensor.clone(), files.len());
            }
            files.push(f);
        }
        Ok(SafetensorsSource { dir: dir.to_path_buf(), files, index })
    }

    /// Opens one `.safetensors` file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let f = map_file(path)?;
        let index = f.metadata.tensors().keys().map(|k| (k.clone(), 0)).collect();
        Ok(SafetensorsSource { dir: path.to_path_buf(), files: vec![f], index })
    }

    /// Names of all tensors in the checkpoint.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.index.keys().cloned().collect();
        v.sort();
        v
    }
}

fn map_file(path: &Path) -> Result<MappedFile> {
    let file = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
    // SAFETY: the map is read-only and we never hand out references that outlive it; a file
    // changed underneath us by another process is outside what any loader can defend against.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io("map", path, e))?;
    let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| Error::WeightFile {
        path: path.to_path_buf(),
        message: format!("{e}. The file is truncated or not a safetensors file; download it again."),
    })?;
    Ok(MappedFile { path: path.to_path_buf(), mmap, header_len, metadata })
}

impl WeightSource for SafetensorsSource {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn take(&mut self, name: &str) -> Result<Option<HostTensor>> {
        let Some(&fi) = self.index.get(name) else { return Ok(None) };
        let f = &self.files[fi];
        let info = f.metadata.info(name).expect("indexed tensor has info");
        let start = 8 + f.header_len + info.data_offsets.0;
        let end = 8 + f.header_len + info.data_offsets.1;
        let data = bytes_to_f32(&f.mmap[start..end], info.dtype)
            .map_err(|m| Error::WeightFile { path: f.path.clone(), message: format!("tensor {name}: {m}") })?;
        Ok(Some(HostTensor { shape: info.shape.clone(), data }))
    }
}

/// Storage dtype for saved checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    F32,
    Bf16,
}

impl SaveDtype {
    /// The name transformers uses in `config.json`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(SaveDtype::F32),
            "bf16" | "bfloat16" => Ok(SaveDtype::Bf16),
            other => Err(Error::InvalidArgument(format!("unknown dtype {other:?}; use f32 or bf16"))),
        }
    }

    pub fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::Bf16 => "bfloat16",
        }
    }
}

/// A [`Pending`] tensor in a file's dtype, its bytes made as the file is written.
struct ByteView<'a> {
    dtype: SaveDtype,
    tensor: Pending<'a>,
}

impl ByteView<'_> {
    fn len(&self) -> usize {
        self.tensor.elements() * if self.dtype == SaveDtype::F32 { 4 } else { 2 }
    }
}

impl safetensors::View for &ByteView<'_> {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            SaveDtype::F32 => Dtype::F32,
            SaveDtype::Bf16 => Dtype::BF16,
        }
    }
    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        let values = self.tensor.values();
        assert_eq!(values.len(), self.tensor.elements(), "{}: values of another shape", self.tensor.name);
        match (self.dtype, values) {
            (SaveDtype::F32, Cow::Borrowed(v)) => Cow::Borrowed(bytemuck::cast_slice(v)),
            (SaveDtype::F32, Cow::Owned(v)) => Cow::Owned(bytemuck::cast_slice(&v).to_vec()),
            (SaveDtype::Bf16, v) => Cow::Owned(v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()),
        }
    }
    fn data_len(&self) -> usize {
        self.len()
    }
}

/// Gives `path` the permissions of a file created the ordinary way in its directory (the
/// process's umask): the safetensors crate writes through a private temporary file (mode
/// 0600), which would leave weights unreadable to the group that reads the rest of a run.
fn ordinary_mode(path: &Path) -> Result<()> {
    let made = crate::error::probe_beside(&path.with_extension("mode-probe"));
    let permissions = made.map_err(|e| Error::io("write", path, e))?.permissions();
    std::fs::set_permissions(path, permissions).map_err(|e| Error::io("write", path, e))
}

fn to_views<'a, T: Into<Pending<'a>>>(tensors: impl IntoIterator<Item = T>, dtype: SaveDtype) -> Vec<ByteView<'a>> {
    tensors.into_iter().map(|t| ByteView { dtype, tensor: t.into() }).collect()
}

/// Writes one safetensors file through a temporary name and a rename, with ordinary mode.
fn write_file(path: &Path, views: &[&ByteView<'_>]) -> Result<()> {
    let tmp = temp_path_for(path);
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views.iter().map(|v| (v.tensor.name.as_str(), *v)), Some(meta), &tmp).map_err(
        |e| {
            // A failed write (a full disk) leaves no partial file behind and says it was a write.
            let _ = std::fs::remove_file(&tmp);
            match e {
                safetensors::SafeTensorError::IoError(io) => Error::io("write", &tmp, io),
                other => Error::Internal(format!("cannot serialise {}: {other}", tmp.display())),
            }
        },
    )?;
    ordinary_mode(&tmp)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename into place", path, e))
}

/// Writes `tensors` as the single safetensors file `path` (written atomically), producing each
/// one's bytes as it is reached.
pub fn write_safetensors_file<'a, T: Into<Pending<'a>>>(
    path: &Path,
    tensors: impl IntoIterator<Item = T>,
    dtype: SaveDtype,
) -> Result<()> {
    let views = to_views(tensors, dtype);
    write_file(path, &views.iter().collect::<Vec<_>>())
}

/// Writes `tensors` into `dir` as `model.safetensors`, or as shards of at most
/// `max_shard_bytes` plus `model.safetensors.index.json`. Each file is written to a temporary
/// name and renamed, so an interrupted save never leaves a truncated file under a real name.
pub fn write_safetensors<'a, T: Into<Pending<'a>>>(
    dir: &Path,
    tensors: impl IntoIterator<Item = T>,
    dtype: SaveDtype,
    max_shard_bytes: usize,
) -> Result<Vec<PathBuf>> {
    let views = to_views(tensors, dtype);

    // Greedy sharding in checkpoint order, like transformers' `shard_checkpoint`.
    let mut shards: Vec<Vec<&ByteView>> = vec![vec![]];
    let mut size = 0usize;
    for v in &views {
        if size > 0 && size + v.len() > max_shard_bytes {
            shards.push(vec![]);
            size = 0;
        }
        size += v.len();
        shards.last_mut().expect("non-empty").push(v);
    }

    let n = shards.len();
    let mut written = Vec::new();
    let mut weight_map = BTreeMap::new();
    let total: usize = views.iter().map(ByteView::len).sum();
    for (i, shard) in shards.iter().enumerate() {
        let name = if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
        };
        let path = dir.join(&name);
        write_file(&path, shard)?;
        for v in shard {
            weight_map.insert(v.tensor.name.clone(), name.clone());
        }
        written.push(path);
    }
    if n > 1 {
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join("model.safetensors.index.json");
        crate::error::write_atomic(&path, serde_json::to_string_pretty(&index).expect("json").as_bytes())?;
        written.push(path);
    } else {
        // A stale index from an earlier sharded save would shadow the new single file.
        let _ = std::fs::remove_file(dir.join("model.safetensors.index.json"));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::backend::Cpu;

    fn tensors() -> Vec<(String, HostTensor)> {
        let t = |shape: Vec<usize>, k: f32| {
            let n = shape.iter().product::<usize>();
            HostTensor { shape, data: (0..n).map(|i| (i as f32 * 0.37 + k).sin() * 1e3).collect() }
        };
        vec![
            ("a.weight".into(), t(vec![7, 5], 1.0)),
            ("b.bias".into(), t(vec![11], 2.0)),
            ("c".into(), t(vec![3, 9], 3.0)),
        ]
    }

    /// Every file of `dir`, by name.
    fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
            .collect()
    }

    /// Tensors written from host memory, borrowed, or downloaded from a device as the writer
    /// reaches them give the same files (single and sharded, f32 and bf16); each download
    /// happens once, while writing.
    #[test]
    fn tensors_produced_when_written_give_the_same_files() {
        let device = Default::default();
        let host = tensors();
        let on_device: Vec<_> = host
            .iter()
            .map(|(n, t)| {
                let data = burn::tensor::TensorData::new(t.data.clone(), [t.data.len()]);
                (n.clone(), burn::tensor::Tensor::<Cpu, 1>::from_data(data, &device), t)
            })
            .collect();
        for dtype in [SaveDtype::F32, SaveDtype::Bf16] {
            for max_shard in [usize::MAX, 100] {
                let write = |tensors: Vec<Pending<'_>>| {
                    let dir = tempfile::tempdir().unwrap();
                    write_safetensors(dir.path(), tensors, dtype, max_shard).unwrap();
                    files(dir.path())
                };
                let owned = write(host.iter().cloned().map(Pending::from).collect());
                // Sharded: at least two shards and the index.
                assert_eq!(owned.len() >= 3, max_shard == 100, "{:?}", owned.keys());
                let borrowed = write(host.iter().map(|(n, t)| Pending::borrowed(n.clone(), t)).collect());
                assert_eq!(borrowed, owned);
                let downloads = Cell::new(0);
                let later = on_device
                    .iter()
                    .map(|(n, t, h)| {
                        Pending::later(n.clone(), h.shape.clone(), || {
                            downloads.set(downloads.get() + 1);
                            Pending::device(n.clone(), t.clone()).into_host().data
                        })
                    })
                    .collect();
                assert_eq!(downloads.get(), 0);
                assert_eq!(write(later), owned);
                assert_eq!(downloads.get(), 3, "each tensor produced once");
            }
        }
        // A file reads back as what was written.
        let dir = tempfile::tempdir().unwrap();
        write_safetensors_file(&dir.path().join("x.safetensors"), host.clone(), SaveDtype::F32).unwrap();
        let mut src = SafetensorsSource::open_file(&dir.path().join("x.safetensors")).unwrap();
        for (n, t) in &host {
            assert_eq!(src.take(n).unwrap().as_ref(), Some(t));
        }
    }
}
