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
use crate::model::lora::{self, LoraConfig};
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
    /// What the workload settled during the run (`Workload::state`), if anything.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub workload: serde_json::Value,
    #[serde(alias = "agents")]
    pub policies: Vec<String>,
    /// Each policy's value head (actor-critic algorithms), with its optimizer state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value_heads: Vec<Option<super::critic::ValueHead>>,
    /// Whether each policy's critic has a value model of its own (`agent-K-critic/`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub value_trunks: bool,
    /// In a cluster run, the policies another process trains: their parts are in that
    /// process's checkpoints, not this one's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elsewhere: Vec<String>,
}

impl TrainerState {
    /// Whether policy `k`'s part is in this checkpoint.
    pub fn holds(&self, k: usize) -> bool {
        !self.elsewhere.contains(&self.policies[k])
    }
}

/// One policy's part of a checkpoint.
pub struct AgentCheckpoint<'a, B: Backend> {
    pub model: CausalLm<B>,
    /// A LoRA policy's settings and base (what `base_model_name_or_path` says): only its
    /// adapter is written, in PEFT's layout, not the frozen base.
    pub lora: Option<(&'a LoraConfig, String)>,
    pub tokenizer: &'a Tokenizer,
    pub eos_token_ids: &'a [u32],
    pub optimizer: &'a AdamW<B>,
    /// The critic's value model and its optimizer (actor-critic algorithms with one).
    pub critic: Option<(CausalLm<B>, &'a AdamW<B>)>,
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

/// The value model of agent `k`'s critic inside a checkpoint (same layout as the agent's).
pub fn critic_dir(checkpoint: &Path, k: usize) -> PathBuf {
    checkpoint.join(format!("agent-{k}-critic"))
}

/// The optimizer file of agent `k`'s value model inside a checkpoint.
pub fn critic_optimizer_path(checkpoint: &Path, k: usize) -> PathBuf {
    checkpoint.join(format!("agent-{k}-critic.optim.safetensors"))
}

/// Writes a complete checkpoint for `state.step` under `root` (a run's `checkpoints/`) and
/// keeps the newest `keep_last`.
pub fn save<B: Backend>(
    root: &Path,
    agents: &[Option<AgentCheckpoint<'_, B>>],
    state: &TrainerState,
    keep_last: usize,
) -> Result<PathBuf> {
    let name = step_dir_name(state.step);
    let tmp = root.join(format!(".tmp-{name}"));
    let dir = root.join(&name);
    let _ = std::fs::remove_dir_all(&tmp);
    let written = (|| {
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
        for (k, a) in agents.iter().enumerate() {
            let Some(a) = a else { continue };
            save_model(a, &a.model, &agent_dir(&tmp, k))?;
            a.optimizer.save(&optimizer_path(&tmp, k))?;
            if let Some((model, optimizer)) = &a.critic {
                save_model(a, model, &critic_dir(&tmp, k))?;
                optimizer.save(&critic_optimizer_path(&tmp, k))?;
            }
        }
        write_atomic(&tmp.join("trainer_state.json"), serde_json::to_string_pretty(state).expect("json").as_bytes())
    })();
    if let Err(e) = written {
        // A failed write (a full disk) leaves no half-written checkpoint behind.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // A checkpoint of the same step (a step repeated after a crash) is set aside, not deleted,
    // until the new one is in place.
    let aside = root.join(format!(".old-{name}"));
    let replaced = dir.exists() && std::fs::rename(&dir, &aside).is_ok();
    std::fs::rename(&tmp, &dir).map_err(|e| Error::io("rename into place", &dir, e))?;
    if replaced {
        let _ = std::fs::remove_dir_all(&aside);
    }
    write_atomic(&root.join("latest"), name.as_bytes())?;
    prune(root, keep_last)?;
    Ok(dir)
}

/// `model` (the agent's or its critic's) in Hugging Face layout, or with LoRA its adapter.
fn save_model<B: Backend>(a: &AgentCheckpoint<'_, B>, model: &CausalLm<B>, dir: &Path) -> Result<()> {
    match &a.lora {
        Some((config, base)) => {
            lora::save_adapter(model, config, base, dir)?;
            a.tokenizer.save(dir)
        }
        None => save_pretrained(model, a.tokenizer, a.eos_token_ids, dir, SaveDtype::F32),
    }
}

/// The checkpoint directories under `root` (complete or not) and their steps, newest first.
pub fn step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| Error::io("list", root, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let step = p.file_name()?.to_str()?.strip_prefix("step-")?.parse::<u64>().ok()?;
            p.is_dir().then_some((step, p))
        })
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    Ok(dirs)
}

/// The directory `latest` names, if the pointer exists and is readable.
fn latest_pointer(root: &Path) -> Option<PathBuf> {
    let name = std::fs::read_to_string(root.join("latest")).ok()?;
    let name = name.trim();
    (!name.is_empty() && !name.contains('/')).then(|| root.join(name))
}

/// Removes all but the newest `keep` checkpoints by step number; never the one `latest` names.
fn prune(root: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let latest = latest_pointer(root);
    for (_, old) in step_dirs(root)?.into_iter().skip(keep) {
        if Some(&old) != latest.as_ref() {
            std::fs::remove_dir_all(&old).map_err(|e| Error::io("remove", &old, e))?;
        }
    }
    Ok(())
}

/// Whether `root` holds any checkpoint, complete or not (or a `latest` pointer).
pub fn any(root: &Path) -> Result<bool> {
    Ok(root.join("latest").exists() || !step_dirs(root)?.is_empty())
}

/// Why the checkpoint at `dir` cannot be resumed from, or `None` when it is complete: its
/// trainer state parses and every policy's config, tokenizer, weights and optimizer state are
/// there, with safetensors files as long as their headers say.
pub fn damage(dir: &Path) -> Option<String> {
    let state = match load_state(dir) {
        Ok(s) => s,
        Err(_) => return Some("trainer_state.json is missing or unreadable".into()),
    };
    for k in (0..state.policies.len()).filter(|&k| state.holds(k)) {
        if let Some(why) = part_damage(dir, &agent_dir(dir, k), &optimizer_path(dir, k)) {
            return Some(why);
        }
        let critic = state.value_trunks.then(|| part_damage(dir, &critic_dir(dir, k), &critic_optimizer_path(dir, k)));
        if let Some(why) = critic.flatten() {
            return Some(why);
        }
    }
    None
}

/// Why one model of a checkpoint (a policy or its value model, in `part`, with its optimizer
/// state at `optimizer`) is incomplete, if it is.
fn part_damage(dir: &Path, part: &Path, optimizer: &Path) -> Option<String> {
    let name = |f: &Path| f.strip_prefix(dir).unwrap_or(f).display().to_string();
    // A LoRA policy's part is its adapter (PEFT layout) and tokenizer.
    let adapter = lora::is_adapter_dir(part);
    let needed = if adapter { [lora::CONFIG_FILE, "tokenizer.json"] } else { ["config.json", "tokenizer.json"] };
    for f in needed {
        if !part.join(f).is_file() {
            return Some(format!("{} is missing", name(&part.join(f))));
        }
    }
    let weights: Vec<PathBuf> = if adapter {
        vec![part.join(lora::WEIGHTS_FILE)]
    } else {
        match std::fs::read_to_string(part.join("model.safetensors.index.json")) {
            Ok(index) => {
                let v: serde_json::Value = match serde_json::from_str(&index) {
                    Ok(v) => v,
                    Err(_) => {
                        return Some(format!("{} is unreadable", name(&part.join("model.safetensors.index.json"))));
                    }
                };
                let mut files: Vec<String> = v["weight_map"]
                    .as_object()
                    .map(|m| m.values().filter_map(|f| f.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                files.sort();
                files.dedup();
                files.into_iter().map(|f| part.join(f)).collect()
            }
            Err(_) => vec![part.join("model.safetensors")],
        }
    };
    for f in weights.iter().map(PathBuf::as_path).chain(std::iter::once(optimizer)) {
        if let Err(why) = check_safetensors(f) {
            return Some(format!("{} {why}", name(f)));
        }
    }
    None
}

/// A safetensors file whose length is the one its header promises.
fn check_safetensors(path: &Path) -> std::result::Result<(), String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|_| "is missing".to_string())?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| "is truncated (no header)".to_string())?;
    let n = u64::from_le_bytes(n);
    if n > 100_000_000 || 8 + n > size {
        return Err("is truncated (header)".into());
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|_| "is truncated (header)".to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&header).map_err(|_| "has an unreadable header".to_string())?;
    let end = v.as_object().into_iter().flatten().filter_map(|(_, t)| t["data_offsets"][1].as_u64()).max().unwrap_or(0);
    if 8 + n + end != size {
        return Err(format!("is truncated ({size} bytes, the header needs {})", 8 + n + end));
    }
    Ok(())
}

/// The checkpoints to resume from under `root`, in the order to try them: the one `latest`
/// names, then the others newest first, each complete as far as [`damage`] can tell without
/// loading it; and why each one passed over was. Nothing is deleted on the way. An error when
/// checkpoints exist but none is complete.
pub fn resume_candidates(root: &Path) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let latest = latest_pointer(root);
    let dirs = step_dirs(root)?;
    let mut passed: Vec<String> = Vec::new();
    if latest.is_none() && !dirs.is_empty() {
        passed.push(format!("{} is missing or unreadable", root.join("latest").display()));
    }
    let ordered = latest.iter().cloned().chain(dirs.into_iter().map(|(_, d)| d).filter(|d| Some(d) != latest.as_ref()));
    let mut complete = Vec::new();
    for dir in ordered {
        match damage(&dir) {
            None => complete.push(dir),
            Some(why) => passed.push(format!("{} is damaged ({why})", dir.display())),
        }
    }
    if complete.is_empty() && !passed.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "no complete checkpoint to resume from under {}: {}. Nothing was deleted; start a new run with another --out",
            root.display(),
            passed.join("; ")
        )));
    }
    Ok((complete, passed))
}

/// The first of [`resume_candidates`], with the note on those passed over (if any).
pub fn resume_point(root: &Path) -> Result<Option<(PathBuf, Option<String>)>> {
    let (complete, passed) = resume_candidates(root)?;
    Ok(complete.into_iter().next().map(|dir| (dir, (!passed.is_empty()).then(|| passed.join("; ")))))
}

/// A checkpoint's trainer state, checked against the checkpoint it is in: its step is the
/// directory's and it names `policies` policies (a hand-edited or misplaced state is damage).
pub fn load_state_of(checkpoint: &Path, policies: usize) -> Result<TrainerState> {
    let state = load_state(checkpoint)?;
    let path = checkpoint.join("trainer_state.json");
    let dir_step =
        checkpoint.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("step-")?.parse::<u64>().ok());
    if dir_step != Some(state.step) {
        return Err(Error::config(
            path.display().to_string(),
            format!("it says step {} but lies in {}", state.step, checkpoint.display()),
        ));
    }
    if state.policies.len() != policies {
        return Err(Error::config(
            path.display().to_string(),
            format!("it names {} policies but the run has {policies}", state.policies.len()),
        ));
    }
    Ok(state)
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

    fn fake_checkpoint(root: &Path, step: u64, weights_len: usize) -> PathBuf {
        let dir = root.join(step_dir_name(step));
        std::fs::create_dir_all(agent_dir(&dir, 0)).unwrap();
        let state = TrainerState {
            step,
            sampler: SamplerState::default(),
            algorithm: serde_json::Value::Null,
            workload: serde_json::Value::Null,
            policies: vec!["a".into()],
            value_heads: vec![],
            value_trunks: false,
            elsewhere: vec![],
        };
        std::fs::write(dir.join("trainer_state.json"), serde_json::to_string(&state).unwrap()).unwrap();
        for f in ["config.json", "tokenizer.json"] {
            std::fs::write(agent_dir(&dir, 0).join(f), "{}").unwrap();
        }
        let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0u8; 8]);
        bytes.truncate(8 + header.len() + weights_len);
        std::fs::write(agent_dir(&dir, 0).join("model.safetensors"), &bytes).unwrap();
        let mut optim = (header.len() as u64).to_le_bytes().to_vec();
        optim.extend_from_slice(header);
        optim.extend_from_slice(&[0u8; 8]);
        std::fs::write(optimizer_path(&dir, 0), &optim).unwrap();
        dir
    }

    #[test]
    fn resume_falls_back_to_the_newest_complete_checkpoint_and_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        assert!(resume_point(root).unwrap().is_none());
        let ten = fake_checkpoint(root, 10, 8);
        let twenty = fake_checkpoint(root, 20, 3); // truncated weights
        std::fs::write(root.join("latest"), "step-000020").unwrap();
        assert!(damage(&ten).is_none());
        assert!(damage(&twenty).unwrap().contains("agent-0/model.safetensors is truncated"));
        let (dir, note) = resume_point(root).unwrap().unwrap();
        assert_eq!(dir, ten);
        assert!(note.unwrap().contains("damaged"));
        assert!(twenty.exists(), "nothing deleted");
        // No `latest` at all: the newest complete one, and it says so.
        std::fs::remove_file(root.join("latest")).unwrap();
        let (dir, note) = resume_point(root).unwrap().unwrap();
        assert_eq!(dir, ten);
        assert!(note.unwrap().contains("latest is missing"));
        assert!(any(root).unwrap());
        // Only damaged checkpoints: an error that deletes nothing.
        std::fs::remove_file(ten.join("trainer_state.json")).unwrap();
        let e = resume_point(root).unwrap_err().to_string();
        assert!(e.contains("no complete checkpoint") && e.contains("Nothing was deleted"), "{e}");
    }

    #[test]
    fn a_cluster_process_checkpoint_needs_only_the_policies_it_trains() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = fake_checkpoint(tmp.path(), 1, 8);
        let state_path = dir.join("trainer_state.json");
        let mut state: TrainerState = serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
        state.policies.push("b".into());
        std::fs::write(&state_path, serde_json::to_string(&state).unwrap()).unwrap();
        let why = damage(&dir).expect("policy b's part is missing");
        assert!(why.contains("agent-1"), "{why}");
        state.elsewhere = vec!["b".into()];
        std::fs::write(&state_path, serde_json::to_string(&state).unwrap()).unwrap();
        assert_eq!(damage(&dir), None, "b is trained, and checkpointed, by another process");
        assert!(state.holds(0) && !state.holds(1));
    }

    #[test]
    fn pruning_orders_by_step_number_and_keeps_what_latest_names() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for step in [9, 10, 1_000_000, 11] {
            fake_checkpoint(root, step, 8);
        }
        // `latest` names an older checkpoint (say, a resumed run's): it survives pruning.
        std::fs::write(root.join("latest"), "step-000009").unwrap();
        prune(root, 2).unwrap();
        let left: Vec<u64> = step_dirs(root).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(left, vec![1_000_000, 11, 9]);
    }

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
