//! The model zoo: short ids (`qwen-1.5b`, `llama-8b`, …) → Hugging Face repos.
//!
//! Entries live in `models/*.toml` and are compiled into the binary, so `hacpo` works from any
//! directory. Resolution order for a `--model` argument: an existing local path (directory or
//! `.gguf` file) → a zoo id found in the local hub cache → a download with hf-hub (progress
//! bars on stderr). `HF_HUB_OFFLINE=1` forbids the download; a missing cache entry then gives
//! an error naming the repo and how to provide the files.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::config::Family;
use crate::error::{Error, Result};

/// One `models/*.toml` entry.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ZooEntry {
    /// Short id users type.
    pub id: String,
    /// Hugging Face repo id.
    pub repo: String,
    pub family: Family,
    /// Approximate parameter count, for listings.
    pub params: String,
    /// Where the chat template comes from: `"tokenizer"` (the repo's tokenizer_config.json /
    /// chat_template.jinja) or `"none"` for base models without one.
    pub chat_template: String,
    /// Token ids that end a response (generation_config.json's, plus the chat turn end).
    pub eos_token_ids: Vec<u32>,
    #[serde(default)]
    pub description: String,
    /// The architecture numbers of the repo's `config.json` (same keys), so that the memory
    /// plan and `--dry-run` know the model's shape without downloading it.
    pub config: toml::Table,
}

impl ZooEntry {
    /// The model's shape from the entry's copy of its `config.json`.
    pub fn model_config(&self) -> Result<super::ModelConfig> {
        let mut json = serde_json::to_value(&self.config)
            .map_err(|e| Error::Internal(format!("models/{}.toml [config]: {e}", self.id)))?;
        json["model_type"] = self.family.model_type().into();
        json["eos_token_id"] = self.eos_token_ids.clone().into();
        super::ModelConfig::from_json(&json, &format!("models/{}.toml [config]", self.id))
    }
}

const ZOO_FILES: &[(&str, &str)] = &[
    ("qwen-0.5b", include_str!("../../models/qwen-0.5b.toml")),
    ("qwen-1.5b", include_str!("../../models/qwen-1.5b.toml")),
    ("qwen-3b", include_str!("../../models/qwen-3b.toml")),
    ("qwen-7b", include_str!("../../models/qwen-7b.toml")),
    ("qwen3-0.6b", include_str!("../../models/qwen3-0.6b.toml")),
    ("qwen3-1.7b", include_str!("../../models/qwen3-1.7b.toml")),
    ("qwen3-1.7b-base", include_str!("../../models/qwen3-1.7b-base.toml")),
    ("qwen3-4b", include_str!("../../models/qwen3-4b.toml")),
    ("qwen3-4b-base", include_str!("../../models/qwen3-4b-base.toml")),
    ("qwen3-8b", include_str!("../../models/qwen3-8b.toml")),
    ("llama-1b", include_str!("../../models/llama-1b.toml")),
    ("llama-3b", include_str!("../../models/llama-3b.toml")),
    ("llama-8b", include_str!("../../models/llama-8b.toml")),
    ("smollm2-135m", include_str!("../../models/smollm2-135m.toml")),
];

/// All zoo entries, in listing order.
pub fn entries() -> Vec<ZooEntry> {
    ZOO_FILES
        .iter()
        .map(|(name, text)| {
            let e: ZooEntry = toml::from_str(text).unwrap_or_else(|err| panic!("models/{name}.toml: {err}"));
            assert_eq!(&e.id, name, "models/{name}.toml declares a different id");
            e
        })
        .collect()
}

/// The zoo entry with this id or Hub repo id (`Qwen/Qwen2.5-1.5B-Instruct`, as a PEFT
/// adapter's `base_model_name_or_path` names it).
pub fn find(id: &str) -> Option<ZooEntry> {
    entries().into_iter().find(|e| e.id == id || e.repo == id)
}

/// What a `--model` argument resolved to.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    /// A Hugging Face model directory.
    Dir(PathBuf),
    /// A GGUF file.
    Gguf(PathBuf),
}

/// Resolves a `--model` argument; see the module docs for the order.
pub fn resolve(spec: &str) -> Result<(Resolved, Option<ZooEntry>)> {
    let path = Path::new(spec);
    if path.exists() {
        return Ok((local(path)?, None));
    }
    let Some(entry) = find(spec) else {
        if spec.contains('/') || spec.ends_with(".gguf") {
            return Err(Error::NotFound {
                what: "model path".into(),
                path: path.to_path_buf(),
                hint: "Pass an existing model directory, a .gguf file, or a zoo id (see `hacpo models`).".into(),
            });
        }
        let known = entries().iter().map(|e| e.id.clone()).collect::<Vec<_>>().join(", ");
        return Err(Error::UnknownModel { id: spec.into(), known });
    };
    let dir = fetch_repo(&entry.repo)?;
    Ok((Resolved::Dir(dir), Some(entry)))
}

fn local(path: &Path) -> Result<Resolved> {
    if path.is_dir() {
        return Ok(Resolved::Dir(path.to_path_buf()));
    }
    if path.extension().is_some_and(|e| e == "gguf") {
        return Ok(Resolved::Gguf(path.to_path_buf()));
    }
    Err(Error::InvalidArgument(format!(
        "{} is a file but not a .gguf file; pass a Hugging Face model directory (with \
         config.json and safetensors weights) or a GGUF file",
        path.display()
    )))
}

/// `HF_HUB_OFFLINE=1` (or `true`): nothing is downloaded from the hub, models or datasets.
pub(crate) fn hub_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Files a model directory needs, in the order we fetch them.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const OPTIONAL: [&str; 3] = ["tokenizer_config.json", "generation_config.json", "chat_template.jinja"];

/// The snapshot directory of `repo` in the hub cache, downloading missing files unless
/// offline.
fn fetch_repo(repo: &str) -> Result<PathBuf> {
    let cache = hf_hub::Cache::from_env();
    let cached = cache.model(repo.to_string());
    if let Some(dir) = complete_snapshot(&cached) {
        return Ok(dir);
    }
    let offline = hub_offline();
    let download_error = |reason: String| Error::Download {
        repo: repo.into(),
        reason,
        cache: cache.path().clone(),
        download: format!("huggingface-cli download {repo}"),
        local: "pass the model directory with --model /path/to/dir".into(),
    };
    if offline {
        return Err(download_error("HF_HUB_OFFLINE is set".into()));
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .map_err(|e| download_error(e.to_string()))?;
    let remote = api.model(repo.to_string());
    let _progress = crate::progress::Progress::in_logs_only(format!("downloading {repo}"), 0);
    let mut config_path = None;
    for f in REQUIRED {
        let p = remote.get(f).map_err(|e| download_error(format!("{f}: {e}")))?;
        config_path.get_or_insert(p);
    }
    for f in OPTIONAL {
        let _ = remote.get(f); // absent in many repos
    }
    match remote.get("model.safetensors.index.json") {
        Ok(index_path) => {
            let text = crate::error::read_to_string(&index_path)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| download_error(format!("model.safetensors.index.json: {e}")))?;
            let mut shards: Vec<String> = v["weight_map"]
                .as_object()
                .map(|m| m.values().filter_map(|s| s.as_str().map(String::from)).collect())
                .unwrap_or_default();
            shards.sort();
            shards.dedup();
            for s in shards {
                remote.get(&s).map_err(|e| download_error(format!("{s}: {e}")))?;
            }
        }
        Err(_) => {
            remote.get("model.safetensors").map_err(|e| download_error(format!("model.safetensors: {e}")))?;
        }
    }
    let config_path = config_path.expect("config.json fetched");
    Ok(config_path.parent().expect("snapshot dir").to_path_buf())
}

/// A cached snapshot that holds config, tokenizer and all weights.
fn complete_snapshot(cached: &hf_hub::CacheRepo) -> Option<PathBuf> {
    let config = cached.get("config.json")?;
    cached.get("tokenizer.json")?;
    let dir = config.parent()?.to_path_buf();
    let weights_ok = if let Some(index) = cached.get("model.safetensors.index.json") {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(index).ok()?).ok()?;
        v["weight_map"].as_object()?.values().all(|f| f.as_str().is_some_and(|f| dir.join(f).exists()))
    } else {
        cached.get("model.safetensors").is_some()
    };
    weights_ok.then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zoo_has_the_required_ids_and_parses() {
        let ids: Vec<String> = entries().into_iter().map(|e| e.id).collect();
        for want in [
            "qwen-0.5b",
            "qwen-1.5b",
            "qwen-3b",
            "qwen-7b",
            "qwen3-0.6b",
            "qwen3-1.7b",
            "qwen3-4b",
            "qwen3-8b",
            "llama-1b",
            "llama-3b",
            "llama-8b",
            "smollm2-135m",
        ] {
            assert!(ids.iter().any(|i| i == want), "missing {want}");
        }
    }

    #[test]
    fn unknown_id_lists_the_zoo() {
        let e = resolve("gpt-17").unwrap_err().to_string();
        assert!(e.contains("unknown model \"gpt-17\"") && e.contains("qwen-1.5b"), "{e}");
    }
}
