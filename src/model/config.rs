//! Hugging Face `config.json` → one normalised [`ModelConfig`] for the three families.
//!
//! Reads both layouts in the wild: transformers 4.x (`rope_theta`, `rope_scaling`,
//! `torch_dtype`) and 5.x (`rope_parameters = {rope_theta, rope_type, …}`, `dtype`). Family
//! defaults follow transformers' config classes (e.g. Qwen2 always has q/k/v biases, Qwen3 has
//! q/k RMSNorm). Saving writes the 4.x layout, which both major versions of transformers read.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

/// The transformer families hacpo implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Llama 3 / 3.1 / 3.2 (and SmolLM2, which is Llama-architecture).
    Llama,
    /// Qwen2 and Qwen2.5: biases on q/k/v.
    Qwen2,
    /// Qwen3: RMSNorm on q and k per head, explicit `head_dim`.
    Qwen3,
}

impl Family {
    pub const SUPPORTED: &'static str = "llama (Llama-3.x, SmolLM2), qwen2 (Qwen2/2.5), qwen3";

    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    pub fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Family::Llama),
            "qwen2" => Some(Family::Qwen2),
            "qwen3" => Some(Family::Qwen3),
            _ => None,
        }
    }
}

/// Llama-3.1 frequency-dependent RoPE scaling (`rope_type = "llama3"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// Everything the forward pass needs, in one flat struct whatever the family.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the attention output projection (Llama/Qwen3 `attention_bias = true`).
    pub o_bias: bool,
    /// Bias on gate/up/down (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm on q and k per head before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The checkpoint's storage dtype as written in config.json (`bfloat16`, `float32`, …).
    pub dtype: Option<String>,
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::error::read_to_string(path).map_err(|e| match e {
            Error::NotFound { path, .. } => Error::NotFound {
                what: "config.json".into(),
                path,
                hint: "A Hugging Face model directory holds config.json, model.safetensors (or \
                       sharded model-*.safetensors with model.safetensors.index.json) and \
                       tokenizer.json."
                    .into(),
            },
            other => other,
        })?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::config(path.display().to_string(), format!("not valid JSON: {e}")))?;
        Self::from_json(&value, &path.display().to_string())
    }

    /// Parses a `config.json` value; `file` names it in errors.
    pub fn from_json(value: &Value, file: &str) -> Result<Self> {
        let obj = value.as_object().ok_or_else(|| Error::config(file, "expected a JSON object at the top level"))?;
        let r = Reader { obj, file };

        let model_type = r.opt_str("model_type")?.unwrap_or_default();
        let family = Family::from_model_type(&model_type).ok_or_else(|| {
            let found = if model_type.is_empty() {
                r.obj.get("architectures").map(|a| a.to_string()).unwrap_or_else(|| "(no model_type)".into())
            } else {
                model_type.clone()
            };
            Error::UnsupportedArchitecture { found, file: file.into(), supported: Family::SUPPORTED }
        })?;

        if let Some(act) = r.opt_str("hidden_act")?
            && act != "silu"
        {
            return Err(Error::config(file, format!("hidden_act {act:?} is not supported (only silu)")));
        }
        if r.opt_bool("use_sliding_window")?.unwrap_or(false) {
            return Err(Error::config(
                file,
                "use_sliding_window = true is not supported; hacpo implements full attention",
            ));
        }

        let hidden_size = r.usize("hidden_size")?;
        let num_attention_heads = r.usize("num_attention_heads")?;
        let num_key_value_heads = r.opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(Error::config(
                file,
                format!(
                    "num_attention_heads ({num_attention_heads}) must be a positive multiple of \
                     num_key_value_heads ({num_key_value_heads})"
                ),
            ));
        }
        let head_dim = match r.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(Error::config(
                    file,
                    "head_dim is missing and hidden_size is not divisible by num_attention_heads",
                ));
            }
        };
        if head_dim % 2 != 0 {
            return Err(Error::config(file, format!("head_dim {head_dim} must be even for RoPE")));
        }

        // RoPE: 5.x keeps everything in `rope_parameters`; 4.x has `rope_theta` + `rope_scaling`.
        let rope_params = r.opt_object("rope_parameters")?;
        let rope_scaling = r.opt_object("rope_scaling")?;
        let rope_theta = match rope_params.and_then(|p| p.get("rope_theta")) {
            Some(v) => v.as_f64().ok_or_else(|| Error::config(file, "rope_parameters.rope_theta must be a number"))?,
            None => r.opt_f64("rope_theta")?.unwrap_or(10000.0),
        };
        let scaling_obj = rope_params.or(rope_scaling);
        let rope_scaling = match scaling_obj {
            None => None,
            Some(s) => parse_rope_scaling(s, file)?,
        };

        let attention_bias = r.opt_bool("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            Family::Qwen2 => (true, false),
            Family::Llama | Family::Qwen3 => (attention_bias, attention_bias),
        };

        let config = ModelConfig {
            family,
            vocab_size: r.usize("vocab_size")?,
            hidden_size,
            intermediate_size: r.usize("intermediate_size")?,
            num_hidden_layers: r.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: r.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: r.opt_usize("max_position_embeddings")?.unwrap_or(4096),
            tie_word_embeddings: r.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: family == Family::Llama && r.opt_bool("mlp_bias")?.unwrap_or(false),
            qk_norm: family == Family::Qwen3,
            bos_token_id: r.opt_token_ids("bos_token_id")?.and_then(|v| v.first().copied()),
            eos_token_ids: r.opt_token_ids("eos_token_id")?.unwrap_or_default(),
            dtype: r.opt_str("dtype")?.or(r.opt_str("torch_dtype")?),
        };
        config.check(file)?;
        Ok(config)
    }

    /// Refuses sizes no real model has (a damaged or hostile config.json would otherwise
    /// reserve gigabytes before any weight is read) and numbers the forward pass cannot use
    /// (a negative `rope_theta` or `rms_norm_eps` gives garbage text, not an error).
    fn check(&self, file: &str) -> Result<()> {
        let sizes: [(&str, usize, usize); 8] = [
            ("vocab_size", self.vocab_size, 1 << 22),
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("num_hidden_layers", self.num_hidden_layers, 1 << 10),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            ("num_key_value_heads", self.num_key_value_heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 10),
            ("max_position_embeddings", self.max_position_embeddings, 1 << 24),
        ];
        for (key, value, most) in sizes {
            if value == 0 || value > most {
                return Err(Error::config(
                    file,
                    format!(
                        "{key:?} is {value}; it must be between 1 and {most} (the file is damaged or not a model config)"
                    ),
                ));
            }
        }
        let positive = |key: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::config(file, format!("{key:?} is {v}; it must be a finite number above 0")))
            }
        };
        positive("rms_norm_eps", self.rms_norm_eps)?;
        if self.rms_norm_eps >= 1.0 {
            return Err(Error::config(file, format!("\"rms_norm_eps\" is {}; it must be below 1", self.rms_norm_eps)));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(Error::config(
                file,
                format!("\"rope_theta\" is {}; it must be a finite number above 1", self.rope_theta),
            ));
        }
        if let Some(s) = &self.rope_scaling {
            positive("rope_scaling.factor", s.factor)?;
            positive("rope_scaling.low_freq_factor", s.low_freq_factor)?;
            positive("rope_scaling.high_freq_factor", s.high_freq_factor)?;
            if s.high_freq_factor <= s.low_freq_factor || s.original_max_position_embeddings == 0 {
                return Err(Error::config(
                    file,
                    "llama3 rope scaling needs high_freq_factor above low_freq_factor and original_max_position_embeddings above 0",
                ));
            }
        }
        Ok(())
    }

    /// `config.json` in the transformers 4.x layout (readable by 4.x and 5.x).
    pub fn to_hf_json(&self, dtype: &str) -> Value {
        let mut m = Map::new();
        m.insert("architectures".into(), json!([self.family.architecture()]));
        m.insert("model_type".into(), json!(self.family.model_type()));
        m.insert("vocab_size".into(), json!(self.vocab_size));
        m.insert("hidden_size".into(), json!(self.hidden_size));
        m.insert("intermediate_size".into(), json!(self.intermediate_size));
        m.insert("num_hidden_layers".into(), json!(self.num_hidden_layers));
        m.insert("num_attention_heads".into(), json!(self.num_attention_heads));
        m.insert("num_key_value_heads".into(), json!(self.num_key_value_heads));
        m.insert("head_dim".into(), json!(self.head_dim));
        m.insert("hidden_act".into(), json!("silu"));
        m.insert("rms_norm_eps".into(), json!(self.rms_norm_eps));
        m.insert("rope_theta".into(), json!(self.rope_theta));
        if let Some(s) = &self.rope_scaling {
            m.insert(
                "rope_scaling".into(),
                json!({
                    "rope_type": "llama3",
                    "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor,
                    "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings,
                }),
            );
        }
        m.insert("max_position_embeddings".into(), json!(self.max_position_embeddings));
        m.insert("tie_word_embeddings".into(), json!(self.tie_word_embeddings));
        match self.family {
            Family::Qwen2 => {
                m.insert("use_sliding_window".into(), json!(false));
            }
            Family::Llama => {
                m.insert("attention_bias".into(), json!(self.qkv_bias));
                m.insert("mlp_bias".into(), json!(self.mlp_bias));
            }
            Family::Qwen3 => {
                m.insert("attention_bias".into(), json!(self.qkv_bias));
                m.insert("use_sliding_window".into(), json!(false));
            }
        }
        if let Some(b) = self.bos_token_id {
            m.insert("bos_token_id".into(), json!(b));
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => {
                m.insert("eos_token_id".into(), json!(one));
            }
            many => {
                m.insert("eos_token_id".into(), json!(many));
            }
        }
        m.insert("torch_dtype".into(), json!(dtype));
        m.insert("use_cache".into(), json!(true));
        Value::Object(m)
    }

    /// Number of query heads sharing one key/value head (GQA group size).
    pub fn gqa_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Total parameter count (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        let (d, h, kv, hd, f) = (
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.intermediate_size,
        );
        let attn = d * h * hd
            + 2 * d * kv * hd
            + h * hd * d
            + if self.qkv_bias { h * hd + 2 * kv * hd } else { 0 }
            + if self.o_bias { d } else { 0 }
            + if self.qk_norm { 2 * hd } else { 0 };
        let mlp = 3 * d * f + if self.mlp_bias { 2 * f + d } else { 0 };
        let layer = attn + mlp + 2 * d;
        let embed = self.vocab_size * d;
        embed + self.num_hidden_layers * layer + d + if self.tie_word_embeddings { 0 } else { embed }
    }
}

fn parse_rope_scaling(s: &Map<String, Value>, file: &str) -> Result<Option<Llama3RopeScaling>> {
    let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
    match kind {
        "default" => Ok(None),
        "llama3" => {
            let num = |k: &str| {
                s.get(k)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| Error::config(file, format!("llama3 rope scaling needs a numeric {k:?}")))
            };
            Ok(Some(Llama3RopeScaling {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: {
                    let n = num("original_max_position_embeddings")?;
                    if !(n.is_finite() && n >= 1.0 && n <= (1u64 << 24) as f64) {
                        return Err(Error::config(
                            file,
                            format!(
                                "llama3 rope scaling's original_max_position_embeddings {n} is not a context length"
                            ),
                        ));
                    }
                    n as usize
                },
            }))
        }
        other => Err(Error::config(file, format!("rope type {other:?} is not supported (supported: default, llama3)"))),
    }
}

/// Typed access to config keys with errors that name the key.
struct Reader<'a> {
    obj: &'a Map<String, Value>,
    file: &'a str,
}

impl Reader<'_> {
    fn present(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| Error::config(self.file, format!("required key {key:?} is missing")))
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| Error::config(self.file, format!("{key:?} must be a non-negative integer, found {v}"))),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::config(self.file, format!("{key:?} must be a number, found {v}"))),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Error::config(self.file, format!("{key:?} must be true or false, found {v}"))),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<String>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| Error::config(self.file, format!("{key:?} must be a string, found {v}"))),
        }
    }

    fn opt_object(&self, key: &str) -> Result<Option<&Map<String, Value>>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_object()
                .map(Some)
                .ok_or_else(|| Error::config(self.file, format!("{key:?} must be an object, found {v}"))),
        }
    }

    /// A token id given as an integer or a list of integers.
    fn opt_token_ids(&self, key: &str) -> Result<Option<Vec<u32>>> {
        let bad = |v: &Value| {
            Error::config(self.file, format!("{key:?} must be a token id or a list of token ids, found {v}"))
        };
        match self.present(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad(i)))
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).map(|n| Some(vec![n])).ok_or_else(|| bad(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "eos_token_id": [1, 2], "bos_token_id": 0
        })
    }

    #[test]
    fn reads_4x_and_5x_rope_layouts_identically() {
        let mut v4 = base();
        v4["rope_theta"] = json!(500000.0);
        v4["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v4["torch_dtype"] = json!("bfloat16");
        let mut v5 = base();
        v5["rope_parameters"] = json!({"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        v5["dtype"] = json!("bfloat16");
        let a = ModelConfig::from_json(&v4, "a").unwrap();
        let b = ModelConfig::from_json(&v5, "b").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope_theta, 500000.0);
        assert_eq!(a.rope_scaling.as_ref().unwrap().original_max_position_embeddings, 8192);
        assert_eq!(a.head_dim, 16);
        assert_eq!(a.eos_token_ids, vec![1, 2]);
        assert_eq!(a.dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn family_defaults() {
        let mut q2 = base();
        q2["model_type"] = json!("qwen2");
        let c = ModelConfig::from_json(&q2, "q2").unwrap();
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
        let mut q3 = base();
        q3["model_type"] = json!("qwen3");
        q3["head_dim"] = json!(32);
        let c = ModelConfig::from_json(&q3, "q3").unwrap();
        assert!(!c.qkv_bias && c.qk_norm && c.head_dim == 32);
    }

    #[test]
    fn errors_name_the_key() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_json(&v, "cfg.json").unwrap_err().to_string();
        assert!(e.contains("hidden_size") && e.contains("cfg.json"), "{e}");
        let mut v = base();
        v["model_type"] = json!("gpt2");
        let e = ModelConfig::from_json(&v, "cfg.json").unwrap_err().to_string();
        assert!(e.contains("gpt2") && e.contains("unsupported"), "{e}");
        let mut v = base();
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        let e = ModelConfig::from_json(&v, "cfg.json").unwrap_err().to_string();
        assert!(e.contains("yarn"), "{e}");
    }

    #[test]
    fn hf_json_round_trips() {
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = ModelConfig::from_json(&v, "x").unwrap();
        let back = ModelConfig::from_json(&c.to_hf_json("float32"), "y").unwrap();
        assert_eq!(ModelConfig { dtype: None, ..c }, ModelConfig { dtype: None, ..back });
    }
}
