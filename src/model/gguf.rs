//! GGUF import: metadata, tensors (F32, F16, BF16, Q8_0, Q4_0, Q4_1 dequantised to f32), the
//! embedded tokenizer and chat template.
//!
//! GGUF differs from Hugging Face checkpoints in three ways we undo here:
//! - names (`blk.3.attn_q.weight` ↔ `model.layers.3.self_attn.q_proj.weight`);
//! - dimension order (`ne[0]` is the contiguous dimension, so dims are reversed);
//! - for the `llama` architecture, llama.cpp's converter permutes the rows of q/k so that RoPE
//!   rotates interleaved pairs; we permute them back to HF's rotate-half order.
//!
//! Llama-3.1 RoPE scaling is stored as a `rope_freqs.weight` tensor of per-frequency factors;
//! we recover the `llama3` parameters by matching it against the published settings.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::config::ModelConfig;
use super::weights::{HostTensor, WeightSource};
use crate::error::{Error, Result};
use crate::tokenizer::{Tokenizer, gguf_vocab::GgufVocab};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    fn as_i64(&self) -> Option<i64> {
        match self {
            GgufValue::Int(i) => Some(*i),
            _ => None,
        }
    }
    fn as_f64(&self) -> Option<f64> {
        match self {
            GgufValue::Float(f) => Some(*f),
            GgufValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    Bf16,
}

impl GgmlType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block)
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
        }
    }
}

struct TensorInfo {
    /// HF order (outermost first).
    shape: Vec<usize>,
    ty: GgmlType,
    offset: usize,
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    pub metadata: HashMap<String, GgufValue>,
    tensors: HashMap<String, TensorInfo>,
    data_start: usize,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| format!("unexpected end of file at byte {} (the file is truncated)", self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u64()? as usize;
        let bytes = self.take(n)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A count read from the file, checked against the bytes left: each item takes at least
    /// `min_bytes`, so a count the file cannot hold is damage, found before reserving memory.
    fn count(&mut self, what: &str, min_bytes: usize) -> std::result::Result<usize, String> {
        let n = self.u64()?;
        if n > (self.remaining() / min_bytes.max(1)) as u64 {
            return Err(format!(
                "{what} count {n} is more than the {} bytes left in the file can hold (the file is truncated or damaged)",
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn value(&mut self, ty: u32, depth: usize) -> std::result::Result<GgufValue, String> {
        let b = |c: &mut Self, n| c.take(n);
        Ok(match ty {
            0 => GgufValue::Int(b(self, 1)?[0] as i64),
            1 => GgufValue::Int(b(self, 1)?[0] as i8 as i64),
            2 => GgufValue::Int(u16::from_le_bytes(b(self, 2)?.try_into().expect("2")) as i64),
            3 => GgufValue::Int(i16::from_le_bytes(b(self, 2)?.try_into().expect("2")) as i64),
            4 => GgufValue::Int(self.u32()? as i64),
            5 => GgufValue::Int(self.u32()? as i32 as i64),
            6 => GgufValue::Float(f32::from_le_bytes(b(self, 4)?.try_into().expect("4")) as f64),
            7 => GgufValue::Bool(b(self, 1)?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                // GGUF writers nest arrays at most once or twice; a deeper file is damaged or
                // hostile, and would overflow the stack.
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"));
                }
                let elem = self.u32()?;
                let n = self.count("array element", min_value_bytes(elem))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::Int(self.u64()? as i64),
            11 => GgufValue::Int(self.u64()? as i64),
            12 => GgufValue::Float(f64::from_le_bytes(b(self, 8)?.try_into().expect("8"))),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

/// How deep metadata arrays may nest.
const MAX_ARRAY_DEPTH: usize = 8;

/// The fewest bytes a metadata value of type `ty` takes in the file.
fn min_value_bytes(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        _ => 8,
    }
}

/// The most dimensions a ggml tensor has (GGML_MAX_DIMS).
const MAX_DIMS: usize = 4;

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
        // SAFETY: read-only map; see `safetensors_io::map_file`.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io("map", path, e))?;
        let err = |message: String| Error::Gguf { path: path.to_path_buf(), message };
        let mut c = Cursor { buf: &mmap, pos: 0 };
        let magic = c.take(4).map_err(err)?;
        if magic != b"GGUF" {
            return Err(err("not a GGUF file (bad magic number)".into()));
        }
        let version = c.u32().map_err(err)?;
        if version < 2 {
            return Err(err(format!("GGUF version {version} is too old (need 2 or 3)")));
        }
        if version > 3 {
            return Err(err(format!("GGUF version {version} is newer than this hacpo reads (2 or 3)")));
        }
        // A tensor's info takes at least 24 bytes, a key-value pair 12.
        let n_tensors = c.count("tensor", 24).map_err(err)?;
        let n_kv = c.count("metadata key", 12).map_err(err)?;
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = c.string().map_err(err)?;
            let ty = c.u32().map_err(err)?;
            let value = c.value(ty, 0).map_err(|m| err(format!("metadata {key}: {m}")))?;
            metadata.insert(key, value);
        }
        let mut tensors = HashMap::new();
        for _ in 0..n_tensors {
            let name = c.string().map_err(err)?;
            let n_dims = c.u32().map_err(err)? as usize;
            if !(1..=MAX_DIMS).contains(&n_dims) {
                return Err(err(format!("tensor {name} has {n_dims} dimensions (ggml tensors have 1 to {MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(c.u64().map_err(err)? as usize);
            }
            let ty_id = c.u32().map_err(err)?;
            let offset = c.u64().map_err(err)? as usize;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
                err(format!(
                    "tensor {name} has ggml type {ty_id}, which hacpo cannot dequantise \
                     (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
                ))
            })?;
            dims.reverse();
            tensors.insert(name, TensorInfo { shape: dims, ty, offset });
        }
        let alignment = metadata.get("general.alignment").and_then(GgufValue::as_i64).unwrap_or(32);
        if !(1..=1 << 20).contains(&alignment) {
            return Err(err(format!("general.alignment {alignment} is not a usable alignment")));
        }
        let alignment = alignment as usize;
        let data_start = c.pos.div_ceil(alignment) * alignment;
        // Check every tensor lies inside the file now, so a truncated download fails here (and
        // sizes that overflow are damage, not a wrapped-around read).
        for (name, t) in &tensors {
            let (per, bytes) = t.ty.block();
            let n = t.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
            let end = n
                .filter(|n| n % per == 0)
                .and_then(|n| (n / per).checked_mul(bytes))
                .and_then(|len| len.checked_add(data_start)?.checked_add(t.offset));
            match end {
                Some(end) if end <= mmap.len() => {}
                Some(end) => {
                    return Err(err(format!(
                        "tensor {name} ends at byte {end} but the file has {} bytes (truncated download?)",
                        mmap.len()
                    )));
                }
                None => {
                    return Err(err(format!(
                        "tensor {name} has shape {:?}, which is not a whole number of {:?} blocks of {per} or overflows",
                        t.shape, t.ty
                    )));
                }
            }
        }
        Ok(GgufFile { path: path.to_path_buf(), mmap, metadata, tensors, data_start })
    }

    fn meta(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&GgufValue> {
        self.meta(key)
            .ok_or_else(|| Error::Gguf { path: self.path.clone(), message: format!("metadata key {key} is missing") })
    }

    /// Dequantises tensor `name` (GGUF name) to f32 in HF dimension order.
    fn read(&self, name: &str) -> Option<HostTensor> {
        let t = self.tensors.get(name)?;
        let n: usize = t.shape.iter().product();
        let (per, bytes) = t.ty.block();
        let start = self.data_start + t.offset;
        let raw = &self.mmap[start..start + n / per * bytes];
        Some(HostTensor { shape: t.shape.clone(), data: dequantize(raw, t.ty, n) })
    }

    /// The model configuration in HF terms.
    pub fn config(&self) -> Result<ModelConfig> {
        let arch = self.require("general.architecture")?.as_str().unwrap_or_default().to_string();
        if super::config::Family::from_model_type(&arch).is_none() {
            return Err(Error::UnsupportedArchitecture {
                found: arch,
                file: self.path.display().to_string(),
                supported: super::config::Family::SUPPORTED,
            });
        }
        let int = |k: &str| -> Result<i64> {
            self.require(&format!("{arch}.{k}"))?.as_i64().ok_or_else(|| Error::Gguf {
                path: self.path.clone(),
                message: format!("metadata {arch}.{k} is not an integer"),
            })
        };
        let float = |k: &str| self.meta(&format!("{arch}.{k}")).and_then(GgufValue::as_f64);
        let hidden = int("embedding_length")?;
        let heads = int("attention.head_count")?;
        let kv_heads =
            self.meta(&format!("{arch}.attention.head_count_kv")).and_then(GgufValue::as_i64).unwrap_or(heads);
        let head_dim = self
            .meta(&format!("{arch}.attention.key_length"))
            .and_then(GgufValue::as_i64)
            .unwrap_or(hidden.checked_div(heads).unwrap_or(0));
        let vocab = match self.meta(&format!("{arch}.vocab_size")).and_then(GgufValue::as_i64) {
            Some(v) => v as usize,
            None => self.tensors.get("token_embd.weight").map(|t| t.shape[0]).unwrap_or(0),
        };
        let theta = float("rope.freq_base").unwrap_or(10000.0);
        let mut cfg = json!({
            "model_type": arch,
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": int("feed_forward_length")?,
            "num_hidden_layers": int("block_count")?,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            "rope_theta": theta,
            "max_position_embeddings": int("context_length")?,
            "tie_word_embeddings": !self.tensors.contains_key("output.weight"),
            "attention_bias": self.tensors.contains_key("blk.0.attn_q.bias"),
        });
        if let Some(id) = self.meta("tokenizer.ggml.bos_token_id").and_then(GgufValue::as_i64) {
            cfg["bos_token_id"] = json!(id);
        }
        let eos: Vec<i64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
            .iter()
            .filter_map(|k| self.meta(k).and_then(GgufValue::as_i64))
            .collect();
        cfg["eos_token_id"] = json!(eos);
        if let Some(factors) = self.read("rope_freqs.weight") {
            let scaling = match_llama3_scaling(&factors.data, theta, head_dim as usize).ok_or_else(|| Error::Gguf {
                path: self.path.clone(),
                message: "rope_freqs.weight does not match any known Llama-3 RoPE scaling".into(),
            })?;
            cfg["rope_scaling"] = scaling;
        }
        ModelConfig::from_json(&cfg, &self.path.display().to_string())
    }

    /// The embedded tokenizer and chat template.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let strings = |key: &str| -> Vec<String> {
            match self.meta(key) {
                Some(GgufValue::Array(a)) => a.iter().filter_map(|v| v.as_str().map(String::from)).collect(),
                _ => vec![],
            }
        };
        let id = |key: &str| self.meta(key).and_then(GgufValue::as_i64).map(|v| v as u32);
        let vocab = GgufVocab {
            model: self.meta("tokenizer.ggml.model").and_then(GgufValue::as_str).unwrap_or_default().into(),
            pre: self.meta("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default").into(),
            tokens: strings("tokenizer.ggml.tokens"),
            token_types: match self.meta("tokenizer.ggml.token_type") {
                Some(GgufValue::Array(a)) => a.iter().filter_map(|v| v.as_i64().map(|x| x as i32)).collect(),
                _ => vec![],
            },
            merges: strings("tokenizer.ggml.merges"),
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_id: id("tokenizer.ggml.eos_token_id"),
            add_bos_token: matches!(self.meta("tokenizer.ggml.add_bos_token"), Some(GgufValue::Bool(true))),
        };
        if vocab.tokens.is_empty() {
            return Err(Error::Gguf { path: self.path.clone(), message: "the file embeds no tokenizer".into() });
        }
        let inner = vocab.to_tokenizer(&self.path.display().to_string())?;
        let mut special = Map::new();
        for (key, id) in [("bos_token", vocab.bos_token_id), ("eos_token", vocab.eos_token_id)] {
            if let Some(tok) = id.and_then(|i| vocab.tokens.get(i as usize)) {
                special.insert(key.into(), Value::String(tok.clone()));
            }
        }
        let template = self.meta("tokenizer.chat_template").and_then(GgufValue::as_str);
        Tokenizer::from_parts(inner, template, special)
    }
}

/// The recovered `rope_scaling` for llama.cpp's stored factors, trying Llama 3.1 (factor 8)
/// and 3.2 (factor 32) settings.
fn match_llama3_scaling(factors: &[f32], theta: f64, head_dim: usize) -> Option<Value> {
    for factor in [8.0f64, 16.0, 32.0] {
        let (low, high, old) = (1.0f64, 4.0f64, 8192.0f64);
        let ok = factors.iter().enumerate().all(|(i, &got)| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let want = if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            ((got as f64 - want) / want).abs() < 1e-3
        });
        if ok && factors.len() == head_dim / 2 {
            return Some(json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": old as usize}));
        }
    }
    None
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises `n` elements of type `ty` (ggml's reference dequantisers).
fn dequantize(raw: &[u8], ty: GgmlType, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Bf16 => {
            for (o, c) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(raw.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (j, x) in o.iter_mut().enumerate() {
                    *x = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(raw.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(raw.chunks_exact(20)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = (q & 0x0f) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
        }
    }
    out
}

/// Undoes llama.cpp's q/k row permutation: GGUF row `(head, j, t)` is HF row `(head, t, j)`
/// with `t ∈ {0, 1}` selecting the rotate-half half and `j < head_dim/2`.
fn unpermute_rows(t: &HostTensor, heads: usize) -> HostTensor {
    let rows = t.shape[0];
    let cols: usize = t.shape[1..].iter().product();
    let half = rows / heads / 2;
    let mut data = vec![0f32; t.data.len()];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..half {
                let hf_row = h * 2 * half + s * half + j;
                let gguf_row = h * 2 * half + j * 2 + s;
                data[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&t.data[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    HostTensor { shape: t.shape.clone(), data }
}

/// GGUF tensors served under their HF names.
pub struct GgufWeights {
    file: GgufFile,
    /// (heads for q, kv heads for k) when rows must be un-permuted (llama architecture).
    unpermute: Option<(usize, usize)>,
}

impl GgufWeights {
    pub fn new(file: GgufFile, config: &ModelConfig) -> Self {
        let unpermute = (config.family == super::config::Family::Llama)
            .then_some((config.num_attention_heads, config.num_key_value_heads));
        GgufWeights { file, unpermute }
    }
}

/// HF name → GGUF name.
fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{kind}"))
}

impl WeightSource for GgufWeights {
    fn describe(&self) -> String {
        self.file.path.display().to_string()
    }

    fn take(&mut self, name: &str) -> Result<Option<HostTensor>> {
        let Some(t) = gguf_name(name).and_then(|g| self.file.read(&g)) else { return Ok(None) };
        Ok(Some(match self.unpermute {
            Some((q_heads, _)) if name.contains("self_attn.q_proj") => unpermute_rows(&t, q_heads),
            Some((_, kv_heads)) if name.contains("self_attn.k_proj") => unpermute_rows(&t, kv_heads),
            _ => t,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_and_q8_0_dequantise_like_ggml() {
        // One Q4_1 block: d = 0.5, m = -1, nibbles 0..15 low and 15..0 high.
        let mut b = Vec::new();
        b.extend_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        b.extend_from_slice(&half::f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let x = dequantize(&b, GgmlType::Q4_1, 32);
        assert_eq!(x[0], -1.0);
        assert_eq!(x[15], 6.5);
        assert_eq!(x[16], 6.5);
        let mut q = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        q.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = dequantize(&q, GgmlType::Q8_0, 32);
        assert_eq!(y[0], -4.0);
        assert_eq!(y[31], 3.75);
    }

    #[test]
    fn q4_0_and_f16_dequantise_like_ggml() {
        // Q4_0: x = (nibble − 8)·d.
        let mut b = half::f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = dequantize(&b, GgmlType::Q4_0, 32);
        assert_eq!((x[0], x[8], x[15], x[16], x[31]), (-16.0, 0.0, 14.0, 14.0, -16.0));
        let f: Vec<u8> = [1.5f32, -0.25].iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        assert_eq!(dequantize(&f, GgmlType::F16, 2), vec![1.5, -0.25]);
        let g: Vec<u8> = [3.0f32, -7.5].iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        assert_eq!(dequantize(&g, GgmlType::Bf16, 2), vec![3.0, -7.5]);
    }

    #[test]
    fn llama3_rope_factors_are_recognised() {
        // llama.cpp's rope_freqs for Llama 3.1 (factor 8), head_dim 128, theta 500000.
        let (theta, dim) = (500000.0f64, 128usize);
        let factors: Vec<f32> = (0..dim / 2)
            .map(|i| {
                let wavelen = 2.0 * std::f64::consts::PI * theta.powf((2 * i) as f64 / dim as f64);
                if wavelen < 2048.0 {
                    1.0
                } else if wavelen > 8192.0 {
                    8.0
                } else {
                    let smooth = (8192.0 / wavelen - 1.0) / 3.0;
                    (1.0 / ((1.0 - smooth) / 8.0 + smooth)) as f32
                }
            })
            .collect();
        let v = match_llama3_scaling(&factors, theta, dim).expect("recognised");
        assert_eq!(v["factor"], 8.0);
        assert!(match_llama3_scaling(&vec![2.0; dim / 2], theta, dim).is_none());
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: reshape(heads, 2, half, cols).swapaxes(1, 2)
        let (heads, half, cols) = (2, 3, 2);
        let rows = heads * 2 * half;
        let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..half {
                    let src = h * 2 * half + s * half + j;
                    let dst = h * 2 * half + j * 2 + s;
                    gguf[dst * cols..(dst + 1) * cols].copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        let back = unpermute_rows(&HostTensor { shape: vec![rows, cols], data: gguf }, heads);
        assert_eq!(back.data, hf);
    }

    #[test]
    fn names_map_both_ways() {
        assert_eq!(gguf_name("model.layers.12.self_attn.o_proj.weight").unwrap(), "blk.12.attn_output.weight");
        assert_eq!(gguf_name("model.layers.0.mlp.down_proj.weight").unwrap(), "blk.0.ffn_down.weight");
        assert_eq!(gguf_name("model.layers.1.self_attn.q_proj.bias").unwrap(), "blk.1.attn_q.bias");
    }
}
