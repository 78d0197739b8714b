//! Transformer language models in burn: the Llama-3.x / Qwen2 / Qwen3 families, their
//! configuration, weight loading (HF safetensors, GGUF), saving and the model zoo.
//!
//! The entry point is [`load`]: give it what a user typed after `--model` (a directory, a
//! `.gguf` file or a zoo id) and get back the model with its tokenizer and stop tokens.

pub mod config;
pub mod gguf;
pub mod kv_cache;
pub mod layout;
pub mod lora;
pub mod offload;
pub mod precision;
pub mod rope;
pub mod safetensors_io;
pub mod transformer;
pub mod weights;
pub mod zoo;

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

pub use config::{Family, ModelConfig};
pub use kv_cache::KvCache;
pub use layout::{Layout, LayoutTensors, Pad};
pub use rope::Rope;
pub use safetensors_io::SaveDtype;
pub use transformer::CausalLm;

use crate::error::{Error, Result, write_atomic};
use crate::tokenizer::Tokenizer;

/// A loaded model with everything needed to prompt it.
#[derive(Debug)]
pub struct Pretrained<B: Backend> {
    pub model: CausalLm<B>,
    pub tokenizer: Tokenizer,
    /// Token ids that end a response.
    pub eos_token_ids: Vec<u32>,
    /// Where it came from (directory or file).
    pub source: PathBuf,
}

/// Loads `spec` (directory, `.gguf` file or zoo id; see [`zoo::resolve`]) onto `device`.
pub fn load<B: Backend>(spec: &str, device: &B::Device) -> Result<Pretrained<B>> {
    let (resolved, entry) = zoo::resolve(spec)?;
    let _span = tracing::info_span!("load_model", model = spec).entered();
    let started = std::time::Instant::now();
    let mut pretrained = match resolved {
        zoo::Resolved::Dir(dir) if lora::is_adapter_dir(&dir) && !dir.join("config.json").is_file() => {
            load_adapter_dir(&dir, None, device)?
        }
        zoo::Resolved::Dir(dir) => load_hf_dir(&dir, device)?,
        zoo::Resolved::Gguf(path) => load_gguf(&path, device)?,
    };
    if let Some(e) = entry {
        merge_ids(&mut pretrained.eos_token_ids, &e.eos_token_ids);
    }
    tracing::info!(
        params = pretrained.model.config.num_parameters(),
        seconds = started.elapsed().as_secs_f64(),
        "model loaded"
    );
    Ok(pretrained)
}

/// Loads the base model a PEFT adapter directory names (or `base`, when given) and merges the
/// adapter into it: the model a user means by `--model <adapter dir>`. The merged weights
/// are trainable, like any loaded model's.
pub fn load_adapter_dir<B: Backend>(dir: &Path, base: Option<&str>, device: &B::Device) -> Result<Pretrained<B>> {
    let base = adapter_base(dir, base)?;
    let mut pretrained = load::<B>(&base, device)?;
    let adapted = lora::load_adapter(pretrained.model, dir)?;
    pretrained.model = lora::set_trainable(lora::merge(adapted), true);
    pretrained.source = dir.to_path_buf();
    Ok(pretrained)
}

/// The base model of the PEFT adapter in `dir`: `base` when given, else what its
/// `base_model_name_or_path` names.
pub fn adapter_base(dir: &Path, base: Option<&str>) -> Result<String> {
    let info = lora::read_adapter_info(dir)?;
    let base = adapter_base_of(dir, &info, base)?;
    // An adapter on an adapter (or on itself) would recurse without end.
    if lora::is_adapter_dir(Path::new(&base)) {
        return Err(Error::config(
            dir.join(lora::CONFIG_FILE).display().to_string(),
            format!("base_model_name_or_path {base:?} is itself an adapter directory; name a base model"),
        ));
    }
    Ok(base)
}

fn adapter_base_of(dir: &Path, info: &lora::AdapterInfo, base: Option<&str>) -> Result<String> {
    Ok(match base {
        Some(b) => b.to_string(),
        None if info.base.is_empty() => {
            return Err(Error::config(
                dir.join(lora::CONFIG_FILE).display().to_string(),
                "base_model_name_or_path is empty; name the base model with --model",
            ));
        }
        // A relative path is tried from the working directory, then beside the adapter.
        None if !Path::new(&info.base).exists() && dir.join(&info.base).exists() => {
            dir.join(&info.base).display().to_string()
        }
        None => info.base.clone(),
    })
}

/// Loads the model of a Hugging Face directory (`config.json` and safetensors weights only).
pub fn load_model_dir<B: Backend>(dir: &Path, device: &B::Device) -> Result<CausalLm<B>> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let mut source = safetensors_io::SafetensorsSource::open_dir(dir)?;
    weights::build(&config, &mut source, device)
}

/// Loads a Hugging Face model directory: model, tokenizer and stop tokens.
pub fn load_hf_dir<B: Backend>(dir: &Path, device: &B::Device) -> Result<Pretrained<B>> {
    // Config and tokenizer first: a mismatch should fail before gigabytes of weights load.
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    check_vocab(&tokenizer, &config, dir)?;
    let model = weights::build(&config, &mut safetensors_io::SafetensorsSource::open_dir(dir)?, device)?;
    let mut eos = model.config.eos_token_ids.clone();
    merge_ids(&mut eos, &generation_config_eos(dir)?);
    if let Some(id) = tokenizer.special_token("eos_token").and_then(|t| tokenizer.token_to_id(t)) {
        merge_ids(&mut eos, &[id]);
    }
    Ok(Pretrained { model, tokenizer, eos_token_ids: eos, source: dir.to_path_buf() })
}

/// Imports a GGUF file (weights dequantised to f32, embedded tokenizer and chat template).
pub fn load_gguf<B: Backend>(path: &Path, device: &B::Device) -> Result<Pretrained<B>> {
    let file = gguf::GgufFile::open(path)?;
    let config = file.config()?;
    let tokenizer = file.tokenizer()?;
    check_vocab(&tokenizer, &config, path)?;
    let eos = config.eos_token_ids.clone();
    let mut source = gguf::GgufWeights::new(file, &config);
    let model = weights::build(&config, &mut source, device)?;
    Ok(Pretrained { model, tokenizer, eos_token_ids: eos, source: path.to_path_buf() })
}

/// Writes `model` and `tokenizer` to `dir` in Hugging Face layout: `config.json`,
/// `generation_config.json`, safetensors weights (sharded above 4 GiB) and tokenizer files.
pub fn save_pretrained<B: Backend>(
    model: &CausalLm<B>,
    tokenizer: &Tokenizer,
    eos_token_ids: &[u32],
    dir: &Path,
    dtype: SaveDtype,
) -> Result<()> {
    save_model(model, eos_token_ids, dir, dtype)?;
    tokenizer.save(dir)
}

/// Writes the model part of [`save_pretrained`]: config, generation config and weights.
pub fn save_model<B: Backend>(model: &CausalLm<B>, eos_token_ids: &[u32], dir: &Path, dtype: SaveDtype) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let mut config = model.config.clone();
    config.eos_token_ids = eos_token_ids.to_vec();
    safetensors_io::write_safetensors(dir, weights::to_write(model), dtype, 4 << 30)?;
    let config_json = serde_json::to_string_pretty(&config.to_hf_json(dtype.torch_name())).expect("json");
    write_atomic(&dir.join("config.json"), config_json.as_bytes())?;
    let mut generation = serde_json::json!({"eos_token_id": eos_token_ids});
    if let Some(b) = config.bos_token_id {
        generation["bos_token_id"] = b.into();
    }
    write_atomic(&dir.join("generation_config.json"), generation.to_string().as_bytes())
}

/// A tokenizer that can produce ids beyond the embedding table belongs to another model.
fn check_vocab(tokenizer: &Tokenizer, config: &ModelConfig, source: &Path) -> Result<()> {
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(Error::Tokenizer(format!(
            "{}: the tokenizer has {} tokens but the model's embedding has only {} rows; \
             tokenizer.json belongs to a different model",
            source.display(),
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    Ok(())
}

fn generation_config_eos(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(vec![]);
    }
    let v: serde_json::Value = serde_json::from_str(&crate::error::read_to_string(&path)?)
        .map_err(|e| Error::config(path.display().to_string(), format!("not valid JSON: {e}")))?;
    Ok(match &v["eos_token_id"] {
        serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect(),
        x => x.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
    })
}

fn merge_ids(into: &mut Vec<u32>, more: &[u32]) {
    for &id in more {
        if !into.contains(&id) {
            into.push(id);
        }
    }
}
