//! Experiment configuration: TOML files (`configs/*.toml`), `--set key.path=value`
//! overrides, validation with errors that name the key, and the diff used to refuse resuming
//! a run with a different configuration.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::rl::{CapabilityConfig, HacpoConfig, LossAggregation};
use crate::train::optim::{AdamWConfig, LrSchedule};

/// The training algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    /// Collaborative: every agent learns from every agent's rollouts (ALGORITHMS.md §2).
    Hacpo,
    /// Each agent alone, sequence-level ratio (§1.2).
    Gspo,
    /// Each agent alone, token-level ratio (§1.1).
    Grpo,
    /// GSPO with twice the own rollouts and twice the updates (the paper's resource-equivalent
    /// baseline).
    Gspo2x,
    /// Sharing with every HACPO mechanism off: cross samples treated as own.
    Naive,
}

impl Algo {
    pub fn parse(s: &str) -> Result<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_lowercase())).map_err(|_| {
            Error::InvalidArgument(format!("unknown algorithm {s:?}; use hacpo, gspo, grpo, gspo2x or naive"))
        })
    }

    /// Whether agents learn from each other's rollouts.
    pub fn shares(self) -> bool {
        matches!(self, Algo::Hacpo | Algo::Naive)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Run directory (metrics, checkpoints, resolved config).
    pub out_dir: PathBuf,
    pub seed: u64,
    /// Training steps; 0 means one pass over the training prompts.
    pub steps: usize,
    /// Checkpoint every N steps (and at the end); 0 only at the end.
    pub checkpoint_every: usize,
    /// Also write TensorBoard event files.
    pub tensorboard: bool,
    /// Write each learner's mini-batch numbers (pool, log-probs, advantages, ratios,
    /// objectives) to `RUN_DIR/batches/` for auditing against the RL core.
    pub dump_batches: bool,
    /// Update agents that share a device concurrently instead of one after another.
    pub concurrent_updates: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            out_dir: PathBuf::from("runs/hacpo"),
            seed: 0,
            steps: 0,
            checkpoint_every: 10,
            tensorboard: false,
            dump_batches: false,
            concurrent_updates: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlgoConfig {
    pub name: Algo,
    /// Rollouts per prompt per agent (G).
    pub group_size: usize,
    pub prompts_per_step: usize,
    /// Mini-batch size in prompts (× G sequences); one optimizer update per mini-batch.
    pub minibatch_prompts: usize,
    /// Sequences per forward/backward pass (gradient accumulation within a mini-batch).
    pub micro_batch_sequences: usize,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    pub optimizer: AdamWConfig,
    pub schedule: LrSchedule,
    /// GRPO's clip and loss aggregation.
    pub grpo_eps_low: f64,
    pub grpo_eps_high: f64,
    pub grpo_loss_agg: LossAggregation,
    pub hacpo: HacpoConfig,
    pub capability: CapabilityConfig,
    /// `f32` (default). `bf16` compute is not available on the CPU backend.
    pub compute_dtype: String,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        AlgoConfig {
            name: Algo::Hacpo,
            group_size: 8,
            prompts_per_step: 128,
            minibatch_prompts: 64,
            micro_batch_sequences: 8,
            grad_clip: 1.0,
            optimizer: AdamWConfig::default(),
            schedule: LrSchedule::default(),
            grpo_eps_low: 0.2,
            grpo_eps_high: 0.28,
            grpo_loss_agg: LossAggregation::TokenMean,
            hacpo: HacpoConfig::default(),
            capability: CapabilityConfig::default(),
            compute_dtype: "f32".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub max_new_tokens: usize,
    /// Own prompts longer than this keep their last tokens.
    pub max_prompt_tokens: usize,
    /// The same for another agent's prompt re-rendered in the learner's template.
    pub cross_max_prompt_tokens: usize,
    /// Responses retokenised for a learner keep their first tokens.
    pub max_response_tokens: usize,
    /// Prompts generated together.
    pub batch_prompts: usize,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 4096,
            max_prompt_tokens: 1024,
            cross_max_prompt_tokens: 1536,
            max_response_tokens: 4096,
            batch_prompts: 16,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// `math` (benchmark files) or `arith` (generated word problems, `[task.arith]`).
    pub kind: String,
    /// Training problems: a benchmark name (`math_train`, `gsm8k`, …), optionally `name=path`.
    pub train: String,
    /// `full` or `boxed-exact`.
    pub grade_mode: String,
    /// Validation benchmark (`math500`), empty for none.
    pub validation: String,
    pub val_every: usize,
    pub val_limit: Option<usize>,
    pub val_max_new_tokens: usize,
    /// The generator of the `arith` task.
    pub arith: crate::data::arith::ArithConfig,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            kind: "math".into(),
            train: "math_train".into(),
            grade_mode: "full".into(),
            validation: String::new(),
            val_every: 3,
            val_limit: None,
            val_max_new_tokens: 4096,
            arith: Default::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// A zoo id, a Hugging Face directory or a `.gguf` file.
    pub model: String,
    /// Display name in metrics (default: `agent<k>-<model>`).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_device")]
    pub device: String,
    /// Extra chat-template variables (`enable_thinking = false` for Qwen3).
    #[serde(default)]
    pub chat_template_kwargs: toml::Table,
}

fn default_device() -> String {
    "cpu".into()
}

/// A whole training run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    #[serde(default)]
    pub run: RunConfig,
    #[serde(default)]
    pub algo: AlgoConfig,
    #[serde(default)]
    pub rollout: RolloutConfig,
    #[serde(default)]
    pub task: TaskConfig,
    #[serde(default)]
    pub pretrain: PretrainConfig,
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
}

/// Overrides of the tiny agents' pre-training budgets (`models/tiny/*.toml`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PretrainConfig {
    /// Pre-training steps; 0 keeps each tiny agent's own budget. Weights pre-trained with a
    /// different budget are cached separately.
    pub max_steps: usize,
}

impl TrainConfig {
    /// Reads a TOML file and applies `key.path=value` overrides.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = crate::error::read_to_string(path)?;
        Self::from_toml(&text, &path.display().to_string(), overrides)
    }

    /// Parses TOML text (`source` names it in errors) and applies overrides.
    pub fn from_toml(text: &str, source: &str, overrides: &[String]) -> Result<Self> {
        let mut value: toml::Table =
            toml::from_str(text).map_err(|e| Error::config(source, format!("not valid TOML: {}", e.message())))?;
        for o in overrides {
            apply_override(&mut value, o)?;
        }
        // serde_path_to_error names the offending key (`algo.nokey: unknown field …`).
        let config: TrainConfig = serde_path_to_error::deserialize(toml::Value::Table(value)).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().message().to_string();
            Error::config(source, if path == "." { message } else { format!("{path}: {message}") })
        })?;
        Ok(config)
    }

    /// The config as TOML (written into the run directory).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serialises")
    }

    /// Rejects inconsistent settings, naming the key.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, m: String| Err(Error::config("training config", format!("{key}: {m}")));
        let a = &self.algo;
        if self.agents.is_empty() {
            return bad("agents", "no agents; add [[agents]] entries or pass --agents a,b".into());
        }
        if a.name.shares() && self.agents.len() < 2 {
            return bad("agents", format!("{:?} needs at least two agents, found {}", a.name, self.agents.len()));
        }
        if a.group_size < 2 {
            return bad(
                "algo.group_size",
                format!("must be at least 2 (advantages compare responses within a group), got {}", a.group_size),
            );
        }
        if a.prompts_per_step == 0 || a.minibatch_prompts == 0 || a.micro_batch_sequences == 0 {
            return bad(
                "algo",
                "prompts_per_step, minibatch_prompts and micro_batch_sequences must be positive".into(),
            );
        }
        if !a.prompts_per_step.is_multiple_of(a.minibatch_prompts) {
            return bad(
                "algo.minibatch_prompts",
                format!(
                    "{} prompts per step cannot be split into mini-batches of {} prompts",
                    a.prompts_per_step, a.minibatch_prompts
                ),
            );
        }
        if a.name == Algo::Gspo2x && !a.minibatch_prompts.is_multiple_of(2) {
            return bad("algo.minibatch_prompts", "gspo2x halves the mini-batch, so it must be even".into());
        }
        if a.compute_dtype != "f32" {
            return bad(
                "algo.compute_dtype",
                format!("{:?} is not available; use \"f32\" (f32 master weights and compute)", a.compute_dtype),
            );
        }
        // Written so that NaN fails too.
        if a.grad_clip.is_nan() || a.grad_clip < 0.0 || a.optimizer.lr.is_nan() || a.optimizer.lr <= 0.0 {
            return bad("algo", "grad_clip must be ≥ 0 and optimizer.lr > 0".into());
        }
        a.schedule.validate()?;
        a.hacpo.validate()?;
        if self.rollout.temperature <= 0.0 {
            return bad(
                "rollout.temperature",
                "must be > 0: a group of greedy rollouts is one rollout repeated".into(),
            );
        }
        if !crate::task::KINDS.contains(&self.task.kind.as_str()) {
            return bad(
                "task.kind",
                format!("unknown task {:?}; available: {}", self.task.kind, crate::task::KINDS.join(", ")),
            );
        }
        if self.task.kind == "arith" {
            self.task.arith.validate()?;
        }
        crate::reward::GradeMode::parse(&self.task.grade_mode)?;
        for (i, ag) in self.agents.iter().enumerate() {
            crate::backend::DeviceSpec::parse(&ag.device)
                .map_err(|e| Error::config("training config", format!("agents[{i}].device: {e}")))?;
        }
        Ok(())
    }

    /// Keys whose values differ (dotted paths), ignoring those that may change on resume.
    pub fn differences(&self, other: &TrainConfig) -> Vec<String> {
        let (a, b) = (flatten(self), flatten(other));
        let may_change = ["run.steps", "run.out_dir", "run.checkpoint_every", "run.tensorboard", "run.dump_batches"];
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| !may_change.contains(&k.as_str()) && a.get(*k) != b.get(*k))
            .map(|k| {
                let show = |m: &std::collections::BTreeMap<String, String>| {
                    m.get(k).cloned().unwrap_or_else(|| "(unset)".into())
                };
                format!("{k}: {} → {}", show(&a), show(&b))
            })
            .collect()
    }
}

fn flatten(c: &TrainConfig) -> std::collections::BTreeMap<String, String> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut std::collections::BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    walk(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, v, out);
                }
            }
            toml::Value::Array(items) if items.iter().all(|i| i.is_table()) => {
                for (i, v) in items.iter().enumerate() {
                    walk(&format!("{prefix}.{i}"), v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk("", &toml::Value::try_from(c).expect("config serialises"), &mut out);
    out
}

/// `a.b.c=value`: the value parsed as TOML (`4`, `1e-6`, `true`, `"x"`, `[1, 2]`), or as a
/// bare string when that fails.
pub fn apply_override(root: &mut toml::Table, assignment: &str) -> Result<()> {
    let (path, raw) = assignment
        .split_once('=')
        .ok_or_else(|| Error::InvalidArgument(format!("--set {assignment:?}: expected key.path=value")))?;
    let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let keys: Vec<&str> = path.trim().split('.').collect();
    let mut cur = root;
    for (i, key) in keys.iter().enumerate() {
        let last = i + 1 == keys.len();
        if last {
            cur.insert(key.to_string(), value);
            return Ok(());
        }
        // `agents.1.model`: an index into an array of tables.
        if let Some(next) = keys.get(i + 1).and_then(|k| k.parse::<usize>().ok()) {
            let arr = cur
                .get_mut(*key)
                .and_then(toml::Value::as_array_mut)
                .ok_or_else(|| Error::InvalidArgument(format!("--set {path}: {key} is not a list")))?;
            let table = arr
                .get_mut(next)
                .and_then(toml::Value::as_table_mut)
                .ok_or_else(|| Error::InvalidArgument(format!("--set {path}: {key} has no entry {next}")))?;
            if i + 2 == keys.len() {
                return Err(Error::InvalidArgument(format!("--set {path}: name a field of {key}.{next}")));
            }
            // Continue inside the indexed table, skipping the index key.
            let rest = keys[i + 2..].join(".");
            return apply_override(table, &format!("{rest}={raw}"));
        }
        cur = cur
            .entry(key.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| Error::InvalidArgument(format!("--set {path}: {key} is not a table")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
[algo]
name = "hacpo"
group_size = 4
[[agents]]
model = "a"
[[agents]]
model = "b"
"#;

    #[test]
    fn overrides_and_diffs() {
        let c = TrainConfig::from_toml(
            TOML,
            "t",
            &["algo.hacpo.alpha=2.5".into(), "agents.1.device=cpu".into(), "run.seed=7".into()],
        )
        .unwrap();
        assert_eq!(c.algo.hacpo.alpha, 2.5);
        assert_eq!(c.run.seed, 7);
        assert_eq!(c.agents.len(), 2);
        let d = TrainConfig::from_toml(TOML, "t", &["algo.group_size=8".into(), "run.steps=99".into()]).unwrap();
        let diff = TrainConfig::from_toml(TOML, "t", &[]).unwrap().differences(&d);
        assert_eq!(diff, vec!["algo.group_size: 4 → 8".to_string()]);
    }

    #[test]
    fn errors_name_the_key() {
        let e = TrainConfig::from_toml("[algo]\ngroup_sise = 4", "cfg.toml", &[]).unwrap_err().to_string();
        assert!(e.contains("group_sise") && e.contains("cfg.toml"), "{e}");
        let mut c = TrainConfig::from_toml(TOML, "t", &[]).unwrap();
        c.algo.group_size = 1;
        assert!(c.validate().unwrap_err().to_string().contains("algo.group_size"));
        c.algo.group_size = 4;
        c.algo.minibatch_prompts = 48;
        assert!(c.validate().unwrap_err().to_string().contains("cannot be split"));
        assert!(Algo::parse("ppo").unwrap_err().to_string().contains("unknown algorithm"));
    }
}
