//! Checkpoints: every policy in Hugging Face layout (transformers and vLLM load it) plus its
//! optimizer state, and the trainer state (step, data cursor, the algorithm's state as JSON,
//! which this module stores without knowing what it is).
//!
//! A checkpoint is written into `checkpoints/.tmp-step-NNNNNN/` and renamed to
//! `checkpoints/step-NNNNNN/` when complete; only then is `checkpoints/latest` (re)written,
//! atomically. A run killed at any moment therefore leaves the previous checkpoint intact and
//! `latest` pointing at a complete one.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::optim::AdamW;
use crate::error::{Error, Result, write_atomic};
use crate::model::{CausalLm, SaveDtype, save_pretrained};
use crate::tokenizer::Tokenizer;

/// Where the next training prompts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    pub epoch: u64,
    pub position: usize,
}

/// Everything besides weights and optimizer moments that a resumed run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Completed steps.
    pub step: u64,
    pub sampler: SamplerState,
    /// The algorithm's state (HACPO: its capability windows; checkpoints written before the
    /// algorithm registry called it `capability`).
    #[serde(alias = "capability", default)]
    pub algorithm: serde_json::Value,
    #[serde(alias = "agents")]
    pub policies: Vec<String>,
}

/// One policy's part of a checkpoint.
pub struct AgentCheckpoint<'a, B: Backend> {
    pub model: CausalLm<B>,
    pub tokenizer: &'a Tokenizer,
    pub eos_token_ids: &'a [u32],
    pub optimizer: &'a AdamW<B>,
}

fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// The directory of agent `k` inside a checkpoint.
pub fn agent_dir(checkpoint: &Path, k: usize) -> PathBuf {
    checkpoint.join(format!("agent-{k}"))
}

/// The optimizer file of agent `k` inside a checkpoint.
pub fn optimizer_path(checkpoint: &Path, k: usize) -> PathBuf {
    checkpoint.join(format!("agent-{k}.optim.safetensors"))
}

/// Writes a complete checkpoint for `state.step` under `root` (a run's `checkpoints/`) and
/// keeps the newest `keep_last`.
pub fn save<B: Backend>(
    root: &Path,
    agents: &[AgentCheckpoint<'_, B>],
    state: &TrainerState,
    keep_last: usize,
) -> Result<PathBuf> {
    let name = step_dir_name(state.step);
    let tmp = root.join(format!(".tmp-{name}"));
    let dir = root.join(&name);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    for (k, a) in agents.iter().enumerate() {
        save_pretrained(&a.model, a.tokenizer, a.eos_token_ids, &agent_dir(&tmp, k), SaveDtype::F32)?;
        a.optimizer.save(&optimizer_path(&tmp, k))?;
    }
    write_atomic(&tmp.join("trainer_state.json"), serde_json::to_string_pretty(state).expect("json").as_bytes())?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| Error::io("rename into place", &dir, e))?;
    write_atomic(&root.join("latest"), name.as_bytes())?;
    prune(&root, keep_last)?;
    Ok(dir)
}

/// Removes all but the newest `keep` complete checkpoints.
fn prune(root: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(|e| Error::io("list", root, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("step-")))
        .collect();
    dirs.sort();
    for old in dirs.iter().take(dirs.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(old).map_err(|e| Error::io("remove", old, e))?;
    }
    Ok(())
}

/// The last complete checkpoint under `root` (a run's `checkpoints/`), if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>> {
    let pointer = root.join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = crate::error::read_to_string(&pointer)?;
    let dir = root.join(name.trim());
    Ok(dir.join("trainer_state.json").exists().then_some(dir))
}

/// Reads a checkpoint's trainer state.
pub fn load_state(checkpoint: &Path) -> Result<TrainerState> {
    let path = checkpoint.join("trainer_state.json");
    serde_json::from_str(&crate::error::read_to_string(&path)?)
        .map_err(|e| Error::config(path.display().to_string(), format!("corrupt trainer state: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoints written before the algorithm registry (`capability`, `agents`) still load.
    #[test]
    fn an_older_trainer_state_reads_into_the_algorithm_state() {
        let old = r#"{"step": 7, "sampler": {"epoch": 1, "position": 3},
            "capability": {"config": {}, "windows": [[0.5], [0.25]], "steps": 1}, "agents": ["a", "b"]}"#;
        let s: TrainerState = serde_json::from_str(old).unwrap();
        assert_eq!((s.step, s.sampler.position, s.policies.len()), (7, 3, 2));
        assert_eq!(s.algorithm["windows"][1][0], 0.25);
        let round: TrainerState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(round, s);
    }
}
