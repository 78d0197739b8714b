//! Experiment configuration: TOML files (`configs/*.toml`), `--set key.path=value`
//! overrides, validation with errors that name the key, and the diff used to refuse resuming
//! a run with a different configuration.

mod task;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::rl::{AlgoSettings, CapabilityConfig, DrGrpoSettings, HacpoSettings, LossAggregation};
use crate::train::optim::{AdamWConfig, LrSchedule};
pub use task::{TaskConfig, TaskKind};

pub use crate::generate::MAX_TOKENS;
/// The largest group (G) and the most prompts per step a config may ask for.
const MAX_GROUP: usize = 1 << 12;
const MAX_PROMPTS_PER_STEP: usize = 1 << 20;

/// `hacpo train` with no arguments: two tiny heterogeneous agents on generated arithmetic.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../configs/tiny-duo.toml");
/// How errors and logs name the embedded default.
pub const EMBEDDED_DEFAULT_NAME: &str = "configs/tiny-duo.toml (embedded default)";

/// The dtype of the matmuls (`algo.compute_dtype`; see [`crate::model::precision`]).
pub use crate::dtype::ComputeDtype;

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
    /// Write every step's samples (role, group, prompt, response, reward, whether trained) to
    /// `RUN_DIR/rollouts/step-NNNNNN.jsonl`, as verl's `rollout_data_dir` does.
    pub dump_rollouts: bool,
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
            dump_rollouts: false,
        }
    }
}

/// `[algo]`: which algorithm (by registry name), the batch shape and optimizer, the settings
/// every algorithm shares, and one table per algorithm with settings of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlgoConfig {
    /// A name in the algorithm registry (`hacpo --help` lists them, with the workload that
    /// trains each).
    pub name: String,
    /// Samples per prompt per policy (G).
    pub group_size: usize,
    pub prompts_per_step: usize,
    /// Mini-batch size in prompts (× G sequences); one optimizer update per mini-batch.
    pub minibatch_prompts: usize,
    /// Sequences per forward/backward pass (gradient accumulation within a mini-batch).
    pub micro_batch_sequences: usize,
    /// A token budget per forward/backward pass instead (verl's dynamic batch size; 0: off,
    /// `micro_batch_sequences` cuts them): as many sequences as fit in this many token slots
    /// (the attention's slots, padding included, and each response's copy of its shared
    /// prompt), at least the run's longest sequence (the memory plan refuses less). Memory is the
    /// budget's whatever the lengths; short responses run many to a pass. Also the scoring
    /// stage's batches. Gradients are unchanged.
    pub micro_batch_tokens: usize,
    /// Recompute each decoder layer in the backward pass instead of keeping its activations
    /// (gradient checkpointing): activations of one layer instead of all, for a third more
    /// compute. Gradients are unchanged.
    pub gradient_checkpointing: bool,
    /// Score the old policy's log-probs in a pass of their own even when the update's forward
    /// pass can give them (one mini-batch per step, no value model, no policy learning from
    /// another's samples; then they are the same numbers and the pass is one forward pass
    /// over every sample saved). For audits against runs from before that saving.
    pub score_old_separately: bool,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    pub optimizer: AdamWConfig,
    pub schedule: LrSchedule,
    /// KL-to-reference coefficient (k3, own samples only); 0 loads no reference model.
    pub kl_coef: f64,
    /// Clip band `[1 − clip_low, 1 + clip_high]`; unset: the algorithm's (GSPO and HACPO
    /// 3e-4/4e-4, GRPO 0.2/0.28).
    pub clip_low: Option<f64>,
    pub clip_high: Option<f64>,
    /// Loss aggregation of token-level losses; unset: the algorithm's (GRPO `token-mean`,
    /// Dr. GRPO `seq-mean-token-sum-norm`).
    pub loss_agg: Option<LossAggregation>,
    /// Added to the group standard deviation.
    pub adv_epsilon: f64,
    /// Divide advantages by the group standard deviation; unset: the algorithm's (Dr. GRPO: no).
    pub normalize_by_std: Option<bool>,
    /// Clamp of a log sequence ratio.
    pub max_abs_log_ratio: f64,
    pub hacpo: HacpoSettings,
    pub capability: CapabilityConfig,
    pub drgrpo: DrGrpoSettings,
    /// MAPPO's critic (`[algo.mappo]`: gamma, lam, vf_coef, cliprange_value, whiten).
    pub mappo: crate::rl::mappo::CriticSettings,
    /// The matmuls' dtype: "f32", "bf16" or "f16" (see `model::precision`).
    pub compute_dtype: ComputeDtype,
    /// The f16 loss scaler's initial scale (PyTorch's `GradScaler(init_scale=2**16)`); halved
    /// on overflow, doubled after 2,000 clean steps. Only f16 compute uses it.
    pub f16_loss_scale: f64,
    /// DAPO's dynamic sampling: groups whose rewards are all equal leave the loss, prompts
    /// with no other group leave the step, and more prompts are drawn until the step has
    /// `prompts_per_step` prompts with signal (`trainer/signal.rs`).
    pub filter_groups: bool,
    /// With `filter_groups`: the most rollouts of a step (the first included).
    pub filter_max_draws: usize,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        AlgoConfig {
            name: "hacpo".into(),
            group_size: 8,
            prompts_per_step: 128,
            minibatch_prompts: 64,
            micro_batch_sequences: 8,
            micro_batch_tokens: 0,
            gradient_checkpointing: false,
            score_old_separately: false,
            grad_clip: 1.0,
            optimizer: AdamWConfig::default(),
            schedule: LrSchedule::default(),
            kl_coef: 0.001,
            clip_low: None,
            clip_high: None,
            loss_agg: None,
            adv_epsilon: crate::rl::stats::ADV_EPSILON,
            normalize_by_std: None,
            max_abs_log_ratio: 10.0,
            hacpo: HacpoSettings::default(),
            capability: CapabilityConfig::default(),
            drgrpo: DrGrpoSettings::default(),
            mappo: Default::default(),
            compute_dtype: ComputeDtype::F32,
            f16_loss_scale: crate::train::loss_scale::INIT_SCALE,
            filter_groups: false,
            filter_max_draws: 4,
        }
    }
}

impl AlgoConfig {
    /// What the algorithm registry builds an algorithm from.
    pub fn settings(&self) -> AlgoSettings {
        AlgoSettings {
            kl_coef: self.kl_coef,
            clip_low: self.clip_low,
            clip_high: self.clip_high,
            loss_agg: self.loss_agg,
            adv_epsilon: self.adv_epsilon,
            normalize_by_std: self.normalize_by_std,
            max_abs_log_ratio: self.max_abs_log_ratio,
            hacpo: self.hacpo.clone(),
            capability: self.capability.clone(),
            drgrpo: self.drgrpo.clone(),
            mappo: self.mappo,
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

/// One policy (`[[policies]]`, also accepted as `[[agents]]`): a model that samples and learns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// A zoo id, a Hugging Face directory or a `.gguf` file.
    pub model: String,
    /// Display name in metrics and `[[roles]]` (default: `agent<k>-<model>`).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_device")]
    pub device: String,
    /// Extra chat-template variables (`enable_thinking = false` for Qwen3).
    #[serde(default)]
    pub chat_template_kwargs: toml::Table,
    /// Train LoRA adapters on a frozen base instead of every weight (`[agents.lora]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<crate::model::lora::LoraConfig>,
    /// This policy's learning rate (default `algo.optimizer.lr`): adapters usually want 10–100×
    /// a full fine-tune's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Storage of the weights that do not train (a LoRA base, the KL reference): `f32`, `bf16`
    /// or `f16`; compute stays f32.
    #[serde(default, skip_serializing_if = "crate::dtype::FrozenDtype::is_f32")]
    pub frozen_dtype: crate::dtype::FrozenDtype,
    /// Keep in host memory what the device does not need between uses: AdamW's moments, the
    /// gradients summed over micro-batches (with gradient checkpointing the device then holds
    /// one layer's at a time) and the KL reference outside the scoring stage. The same update
    /// to the bit, for copies between host and device at every step. The memory plan turns it
    /// on by itself when a GPU's run fits no other way; on the CPU it saves nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offload: bool,
}

fn default_device() -> String {
    "cpu".into()
}

impl PolicyConfig {
    /// A policy of `model` with every other setting at its default (CPU, fully fine-tuned).
    pub fn new(model: impl Into<String>) -> Self {
        PolicyConfig {
            model: model.into(),
            name: None,
            device: default_device(),
            chat_template_kwargs: Default::default(),
            lora: None,
            lr: None,
            frozen_dtype: Default::default(),
            offload: false,
        }
    }
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
    /// What produces a step's samples (`[workload]`): the HACPO exchange or the search pipeline.
    #[serde(default)]
    pub workload: crate::workload::WorkloadConfig,
    #[serde(default)]
    pub pretrain: PretrainConfig,
    /// The policies (`[[agents]]` in configs written before roles existed).
    #[serde(default)]
    pub policies: Vec<PolicyConfig>,
    /// Who plays which role; empty: every policy plays the one role `solver`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleConfig>,
    /// The policies spread over several processes linked by NATS (docs/distributed.md);
    /// absent: one process trains them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

pub use crate::workload::RoleConfig;

/// A key an older hacpo wrote under `[algo]`, and its place now.
struct Moved {
    /// Its old path under `[algo]`.
    old: &'static str,
    /// Its path now, from the top of the config.
    new: &'static str,
    /// Whether its value applied to the algorithm of that name (a migration keeps only those).
    applies: fn(&str) -> bool,
}

const fn moved(old: &'static str, new: &'static str, applies: fn(&str) -> bool) -> Moved {
    Moved { old, new, applies }
}

/// Every moved key, in the order an old config's first one is reported.
#[rustfmt::skip]
const MOVED: &[Moved] = &[
    moved("hacpo.kl_coef", "algo.kl_coef", |_| true),
    moved("hacpo.eps_low", "algo.clip_low", |name| name != "grpo"),
    moved("hacpo.eps_high", "algo.clip_high", |name| name != "grpo"),
    moved("hacpo.adv_epsilon", "algo.adv_epsilon", |_| true),
    moved("hacpo.normalize_by_std", "algo.normalize_by_std", |_| true),
    moved("hacpo.max_abs_log_ratio", "algo.max_abs_log_ratio", |_| true),
    // `naive = true` became `name = "naive"`; `naive = false` said nothing.
    moved("hacpo.naive", "algo.name", |_| true),
    moved("grpo_eps_low", "algo.clip_low", |name| name == "grpo"),
    moved("grpo_eps_high", "algo.clip_high", |name| name == "grpo"),
    moved("grpo_loss_agg", "algo.loss_agg", |name| name == "grpo"),
    // How the search tree branches and carries rewards is the workload's (one table per shape).
    moved("mhgpo.aggregate", "workload.search.aggregate", |name| name.starts_with("mhgpo")),
    moved("mhgpo.propagate_penalties", "workload.search.propagate_penalties", |name| name.starts_with("mhgpo")),
    moved("mhgpo.rr_probabilities", "workload.search.rr_probabilities", |name| name.starts_with("mhgpo")),
];

impl Moved {
    /// Removes this key from the `[algo]` table, returning its value (and the table it was in
    /// when that is left empty).
    fn take(&self, algo: &mut toml::Table) -> Option<toml::Value> {
        match self.old.split_once('.') {
            Some((table, key)) => {
                let inner = algo.get_mut(table)?.as_table_mut()?;
                let value = inner.remove(key);
                if value.is_some() && inner.is_empty() {
                    algo.remove(table);
                }
                value
            }
            None => algo.remove(self.old),
        }
    }

    /// Puts `value` at this key's new place.
    fn put(&self, root: &mut toml::Table, value: toml::Value) {
        let mut parts: Vec<&str> = self.new.split('.').collect();
        let key = parts.pop().expect("a path has a key");
        let mut table = root;
        for part in parts {
            let entry = table.entry(part).or_insert_with(|| toml::Value::Table(Default::default()));
            if !entry.is_table() {
                *entry = toml::Value::Table(Default::default());
            }
            table = entry.as_table_mut().expect("made a table");
        }
        table.insert(key.to_string(), value);
    }

    /// Where it lives now, as the error for a config that still uses it says.
    fn new_place(&self) -> String {
        match self.new {
            "algo.name" => "algo.name = \"naive\" (naive sharing is an algorithm of its own)".into(),
            new if new.starts_with("workload.") => {
                format!("{new} (how the search workload branches and credits its trees is its own setting)")
            }
            new => format!("{new} (settings shared by every algorithm live at algo.*)"),
        }
    }
}

/// A TOML syntax error with its line and column.
fn toml_error(text: &str, source: &str, e: &toml::de::Error) -> Error {
    let at = e
        .span()
        .map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(" at line {line}, column {column}")
        })
        .unwrap_or_default();
    Error::config(source, format!("not valid TOML{at}: {}", e.message()))
}

/// Carries moved keys of a config written by an older hacpo to their new places, keeping what
/// applied to its algorithm (GSPO's clip band to GSPO-family runs, GRPO's to GRPO runs).
fn migrate_moved(root: &mut toml::Table) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(toml::Value::Table(algo)) = root.get_mut("algo") else { return notes };
    let name = algo.get("name").and_then(|v| v.as_str()).unwrap_or("hacpo").to_string();
    let taken: Vec<(&Moved, toml::Value)> = MOVED.iter().filter_map(|m| Some((m, m.take(algo)?))).collect();
    for (m, value) in taken {
        let value = match m.new {
            "algo.name" if value.as_bool() == Some(true) => toml::Value::String("naive".into()),
            "algo.name" => continue,
            _ => value,
        };
        if (m.applies)(&name) {
            notes.push(format!("algo.{} read as {}", m.old, m.new));
            m.put(root, value);
        } else if !m.old.starts_with("mhgpo.") {
            // (Every older config held [algo.mhgpo], tree settings that nothing but an MHGPO
            // run read: dropping them from another run's config loses nothing worth a note.)
            notes.push(format!("algo.{} dropped (it does not apply to {name})", m.old));
        }
    }
    notes
}

/// Fails on the first moved key present in a raw config table.
fn check_moved(root: &toml::Table, source: &str) -> Result<()> {
    let Some(toml::Value::Table(algo)) = root.get("algo") else { return Ok(()) };
    let mut algo = algo.clone();
    match MOVED.iter().find(|m| m.take(&mut algo).is_some()) {
        Some(m) => Err(Error::config(source, format!("algo.{} has moved: write it as {}", m.old, m.new_place()))),
        None if algo.contains_key("mhgpo") => Err(Error::config(
            source,
            "[algo.mhgpo] has moved: MHGPO's tree settings are [workload.search] keys (aggregate, \
             propagate_penalties, rr_probabilities)",
        )),
        None => Ok(()),
    }
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

    /// Reads a run's own `config.toml`: one written by an older hacpo has its moved keys
    /// carried to their new places (each said in the returned notes) instead of failing, so
    /// the run can still be resumed and reported.
    pub fn load_saved(path: &Path, overrides: &[String]) -> Result<(Self, Vec<String>)> {
        let text = crate::error::read_to_string(path)?;
        let source = path.display().to_string();
        let mut value: toml::Table = toml::from_str(&text).map_err(|e| toml_error(&text, &source, &e))?;
        let notes = migrate_moved(&mut value);
        Ok((Self::from_table(value, &source, overrides)?, notes))
    }

    /// Parses TOML text (`source` names it in errors) and applies overrides.
    pub fn from_toml(text: &str, source: &str, overrides: &[String]) -> Result<Self> {
        let value: toml::Table = toml::from_str(text).map_err(|e| toml_error(text, source, &e))?;
        Self::from_table(value, source, overrides)
    }

    /// A parsed config table with overrides applied, checked and typed.
    fn from_table(mut value: toml::Table, source: &str, overrides: &[String]) -> Result<Self> {
        // `[[agents]]` is the older name of `[[policies]]`.
        if let Some(agents) = value.remove("agents") {
            if value.contains_key("policies") {
                return Err(Error::config(
                    source,
                    "both [[agents]] and [[policies]]; keep one (they are the same list)",
                ));
            }
            value.insert("policies".into(), agents);
        }
        for o in overrides {
            apply_override(&mut value, o)?;
        }
        check_moved(&value, source)?;
        // serde_path_to_error names the offending key (`algo.nokey: unknown field …`).
        let config: TrainConfig = serde_path_to_error::deserialize(toml::Value::Table(value)).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().message().to_string();
            // A bad value that came from `--set` is blamed on that argument, not on the file.
            let dotted = path.replace('[', ".").replace(']', "");
            let from_set = overrides.iter().rev().find(|o| {
                let key = policies_key(o.split_once('=').map_or(o.as_str(), |(k, _)| k));
                dotted == key || dotted.starts_with(&format!("{key}."))
            });
            match from_set {
                Some(o) => Error::InvalidArgument(format!("--set {o}: {path}: {message}")),
                None => Error::config(source, if path == "." { message } else { format!("{path}: {message}") }),
            }
        })?;
        crate::rl::registry::check(&config.algo.name).map_err(|e| Error::config(source, format!("algo.name: {e}")))?;
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
        if self.policies.is_empty() {
            return bad("policies", "no policies; add [[policies]] entries or pass --agents a,b".into());
        }
        crate::rl::registry::check(&a.name).map_err(|e| Error::config("training config", format!("algo.name: {e}")))?;
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
        // Every number is checked finite and in range here, before anything loads: an infinite
        // epsilon or log-ratio bound trains nothing, a min_ratio of 5 raises the learning rate.
        let o = &a.optimizer;
        let numbers: [(&str, f64, bool, &str); 13] = [
            ("algo.grad_clip", a.grad_clip, a.grad_clip >= 0.0, "a finite number ≥ 0"),
            // 0 is a control run: everything but the weights' change (the learnability tests' negative control).
            ("algo.optimizer.lr", o.lr, o.lr >= 0.0, "a finite number ≥ 0"),
            ("algo.optimizer.beta1", o.beta1, (0.0..1.0).contains(&o.beta1), "in [0, 1)"),
            ("algo.optimizer.beta2", o.beta2, (0.0..1.0).contains(&o.beta2), "in [0, 1)"),
            ("algo.optimizer.eps", o.eps, o.eps > 0.0, "a finite number > 0"),
            ("algo.optimizer.weight_decay", o.weight_decay, o.weight_decay >= 0.0, "a finite number ≥ 0"),
            ("algo.schedule.min_ratio", a.schedule.min_ratio, (0.0..=1.0).contains(&a.schedule.min_ratio), "in [0, 1]"),
            ("algo.kl_coef", a.kl_coef, a.kl_coef >= 0.0, "a finite number ≥ 0"),
            ("algo.clip_low", a.clip_low.unwrap_or(0.0), (0.0..1.0).contains(&a.clip_low.unwrap_or(0.0)), "in [0, 1)"),
            ("algo.clip_high", a.clip_high.unwrap_or(0.0), a.clip_high.unwrap_or(0.0) >= 0.0, "a finite number ≥ 0"),
            ("algo.adv_epsilon", a.adv_epsilon, a.adv_epsilon >= 0.0, "a finite number ≥ 0"),
            ("algo.max_abs_log_ratio", a.max_abs_log_ratio, a.max_abs_log_ratio > 0.0, "a finite number > 0"),
            ("algo.f16_loss_scale", a.f16_loss_scale, a.f16_loss_scale >= 1.0, "a finite number ≥ 1 (default 65536)"),
        ];
        for (key, value, in_range, must) in numbers {
            if !(value.is_finite() && in_range) {
                return bad(key, format!("must be {must}, got {value}"));
            }
        }
        let r = &self.rollout;
        if !(r.temperature.is_finite() && r.temperature > 0.0) {
            return bad(
                "rollout.temperature",
                format!(
                    "must be a finite number > 0 (a group of greedy rollouts is one rollout repeated), got {}",
                    r.temperature
                ),
            );
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return bad("rollout.top_p", format!("must be in (0, 1], got {}", r.top_p));
        }
        // Token budgets: at least one token, and below any context a model has (a larger
        // number is a typo, and would overflow the memory plan's arithmetic).
        let tokens: [(&str, usize); 6] = [
            ("rollout.max_new_tokens", r.max_new_tokens),
            ("rollout.max_prompt_tokens", r.max_prompt_tokens),
            ("rollout.cross_max_prompt_tokens", r.cross_max_prompt_tokens),
            ("rollout.max_response_tokens", r.max_response_tokens),
            ("rollout.batch_prompts", r.batch_prompts),
            ("task.val_max_new_tokens", self.task.val_max_new_tokens),
        ];
        for (key, n) in tokens {
            if n == 0 || n > MAX_TOKENS {
                return bad(key, format!("must be between 1 and {MAX_TOKENS}, got {n}"));
            }
        }
        if a.group_size > MAX_GROUP || a.prompts_per_step > MAX_PROMPTS_PER_STEP {
            return bad(
                "algo",
                format!(
                    "group_size ({}) must be at most {MAX_GROUP} and prompts_per_step ({}) at most {MAX_PROMPTS_PER_STEP}",
                    a.group_size, a.prompts_per_step
                ),
            );
        }
        a.capability.validate().map_err(|m| Error::config("training config", format!("algo.capability: {m}")))?;
        a.mappo.validate().map_err(|m| Error::config("training config", format!("algo.mappo: {m}")))?;
        if !(1..=64).contains(&a.filter_max_draws) {
            return bad("algo.filter_max_draws", format!("must be between 1 and 64, got {}", a.filter_max_draws));
        }
        if self.pretrain.max_steps > 10_000_000 {
            return bad("pretrain.max_steps", format!("must be at most 10000000, got {}", self.pretrain.max_steps));
        }
        if self.task.train_limit == Some(0) {
            return bad("task.train_limit", "0 would leave no training prompt; leave it unset for all of them".into());
        }
        if self.task.val_limit == Some(0) {
            return bad("task.val_limit", "0 would score no held-out prompt; leave it unset for all of them".into());
        }
        if self.task.kind == TaskKind::Arith {
            self.task.arith.validate()?;
        }
        if self.task.kind == TaskKind::Env {
            self.task.env.validate()?;
        }
        if self.task.kind == TaskKind::Qa && self.task.train == crate::search::task::TINY_KB {
            self.task.kb.validate()?;
        }
        if self.task.kind == TaskKind::Env {
            crate::env::EnvKind::parse(&self.task.train)
                .map_err(|e| Error::config("training config", format!("task.train: {e}")))?;
        }
        // The algorithm's own settings (HACPO's α, δ; MAPPO's critic): checked by building it.
        crate::rl::registry::build::<crate::backend::Cpu>(&a.name, &a.settings())?;
        let names: Vec<String> = (0..self.policies.len()).map(|k| self.policy_name(k)).collect();
        for (i, p) in self.policies.iter().enumerate() {
            let device = crate::backend::DeviceSpec::parse_name(&p.device)
                .map_err(|e| Error::config("training config", format!("policies[{i}].device: {e}")))?;
            if device == crate::backend::DeviceSpec::Wgpu && p.frozen_dtype == crate::dtype::FrozenDtype::Bf16 {
                return bad(
                    &format!("policies[{i}].frozen_dtype"),
                    "bf16 is not available on wgpu (WGSL has no bf16 type); use f16 there, or bf16 on a CUDA device"
                        .into(),
                );
            }
            if device == crate::backend::DeviceSpec::Wgpu && self.algo.compute_dtype == ComputeDtype::Bf16 {
                return bad(
                    "algo.compute_dtype",
                    format!(
                        "bf16 is not available on wgpu, where policies[{i}] runs (WGSL has no bf16 type); use \"f16\" \
                         there, or bf16 on a CUDA device"
                    ),
                );
            }
            if names[..i].contains(&names[i]) {
                return bad(&format!("policies[{i}].name"), format!("{:?} names two policies", names[i]));
            }
            if let Some(lora) = &p.lora {
                lora.validate(&format!("policies[{i}].lora")).map_err(|m| Error::config("training config", m))?;
            }
            if let Some(lr) = p.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
                return bad(&format!("policies[{i}].lr"), format!("must be a positive number, got {lr}"));
            }
        }
        for (i, r) in self.roles.iter().enumerate() {
            for p in &r.policies {
                if self.policy_index(p).is_none() {
                    return bad(
                        &format!("roles[{i}].policies"),
                        format!("no policy {p:?}; the policies are {}", names.join(", ")),
                    );
                }
            }
        }
        self.workload.validate(self.task.kind, &a.name, &self.role_map())?;
        if let Some(c) = &self.cluster {
            self.validate_cluster(c)?;
        }
        Ok(())
    }

    /// `[cluster]`: its hosts cover the policies, and the run is one the trainer can spread.
    fn validate_cluster(&self, c: &crate::cluster::ClusterConfig) -> Result<()> {
        let bad = |m: String| Err(Error::config("training config", m));
        let names: Vec<String> = (0..self.policies.len()).map(|k| self.policy_name(k)).collect();
        if let Err(m) = c.validate(&names) {
            return bad(m);
        }
        match self.workload.spread(&self.algo.name, &self.role_map()) {
            Err(why) => return bad(why),
            Ok(None) => {}
            Ok(Some(sides)) => {
                let host_of = |k: usize| c.hosts.iter().position(|h| h.policies.contains(&names[k]));
                if c.hosts.len() > 2 || (c.hosts.len() == 2 && host_of(sides[0]) == host_of(sides[1])) {
                    return bad(format!(
                        "cluster: the {} workload's team plays across two processes, one holding policy {:?} and \
                         the other {:?}: name two hosts, one for each",
                        self.workload.kind.name(),
                        names[sides[0]],
                        names[sides[1]]
                    ));
                }
            }
        }
        if self.algo.filter_groups {
            return bad("cluster: algo.filter_groups draws more prompts until a step has enough signal, a \
                 decision every process would have to take together (not built yet); turn one off"
                .into());
        }
        Ok(())
    }

    /// The config every process of a cluster run must share, as TOML: all of it but the run
    /// directory, which is each process's own.
    pub fn shared_toml(&self) -> String {
        let mut shared = self.clone();
        shared.run.out_dir = Default::default();
        shared.to_toml()
    }

    /// Which policies the process of `host` trains (indexed like `policies`): every one, or in a
    /// cluster run those the host names.
    pub fn hosted(&self, host: &str) -> Result<Vec<bool>> {
        let n = self.policies.len();
        let Some(cluster) = &self.cluster else { return Ok(vec![true; n]) };
        let host = cluster.host(host).map_err(Error::InvalidArgument)?;
        Ok((0..n).map(|k| host.policies.contains(&self.policy_name(k))).collect())
    }

    /// The display name of policy `k` (metrics, logs, roles).
    pub fn policy_name(&self, k: usize) -> String {
        let p = &self.policies[k];
        p.name.clone().unwrap_or_else(|| {
            let base = Path::new(&p.model).file_name().and_then(|n| n.to_str()).unwrap_or(&p.model);
            format!("agent{k}-{base}")
        })
    }

    /// The policy a role entry names (a name, or an index).
    pub fn policy_index(&self, name: &str) -> Option<usize> {
        self.role_map().index(name)
    }

    /// The policies' names and the `[[roles]]` entries, as the workloads resolve them.
    pub fn role_map(&self) -> crate::workload::RoleMap {
        crate::workload::RoleMap {
            policies: (0..self.policies.len()).map(|k| self.policy_name(k)).collect(),
            roles: self.roles.clone(),
        }
    }

    /// The batch shape this config asks for, before its algorithm shapes it
    /// ([`crate::rl::Algorithm::shape`]: GSPO×2 doubles the group).
    pub fn requested_shape(&self) -> crate::rl::BatchShape {
        crate::rl::BatchShape {
            policies: self.policies.len(),
            group_size: self.algo.group_size,
            minibatch_prompts: self.algo.minibatch_prompts,
            norm_length: self.rollout.max_new_tokens,
        }
    }

    /// The config a resumed run in `run_dir` trains with: the run's own (`saved`), with what
    /// the command line (`requested`) may change: steps, output settings, devices. Any other
    /// difference is refused, naming the keys.
    pub fn resumed(run_dir: &Path, saved: TrainConfig, requested: Option<TrainConfig>) -> Result<TrainConfig> {
        let Some(req) = requested else {
            return Ok(TrainConfig { run: RunConfig { out_dir: run_dir.to_path_buf(), ..saved.run.clone() }, ..saved });
        };
        let diff = saved.differences(&req);
        if !diff.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{} was trained with a different configuration; these keys differ (saved → requested): {}",
                run_dir.display(),
                diff.join("; ")
            )));
        }
        let mut policies = saved.policies;
        for (p, r) in policies.iter_mut().zip(&req.policies) {
            (p.device, p.offload) = (r.device.clone(), r.offload);
        }
        Ok(TrainConfig { run: RunConfig { out_dir: run_dir.to_path_buf(), ..req.run }, policies, ..saved })
    }

    /// Keys whose values differ (dotted paths), ignoring those that may change on resume.
    pub fn differences(&self, other: &TrainConfig) -> Vec<String> {
        let (a, b) = (flatten(self), flatten(other));
        let may_change = [
            "run.steps",
            "run.out_dir",
            "run.checkpoint_every",
            "run.tensorboard",
            "run.dump_batches",
            "run.dump_rollouts",
        ];
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| !may_change.contains(&k.as_str()) && !is_placement_key(k) && a.get(*k) != b.get(*k))
            .map(|k| {
                let show = |m: &std::collections::BTreeMap<String, String>| {
                    m.get(k).cloned().unwrap_or_else(|| "(unset)".into())
                };
                format!("{k}: {} → {}", show(&a), show(&b))
            })
            .collect()
    }
}

/// `policies.N.device` and `policies.N.offload`: a resumed run may move to other devices and
/// keep its state elsewhere (a checkpoint is the same files either way).
fn is_placement_key(key: &str) -> bool {
    key.strip_prefix("policies.")
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(index, field)| index.parse::<usize>().is_ok() && matches!(field, "device" | "offload"))
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

/// A `--set` key with `agents.` read as `policies.` (the older name of the list).
fn policies_key(key: &str) -> String {
    let key = key.trim();
    key.strip_prefix("agents.").map_or_else(|| key.to_string(), |rest| format!("policies.{rest}"))
}

/// `a.b.c=value`: the value parsed as TOML (`4`, `1e-6`, `true`, `"x"`, `[1, 2]`), or as a
/// bare string when that fails.
pub fn apply_override(root: &mut toml::Table, assignment: &str) -> Result<()> {
    let (path, raw) = assignment
        .split_once('=')
        .ok_or_else(|| Error::InvalidArgument(format!("--set {assignment:?}: expected key.path=value")))?;
    let path = policies_key(path);
    let value: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let keys: Vec<&str> = path.split('.').collect();
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
        assert_eq!(c.policies.len(), 2);
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
        let e = TrainConfig::from_toml("[algo]\nname = \"ppo\"", "t", &[]).unwrap_err().to_string();
        assert!(e.contains("algo.name") && e.contains("unknown algorithm") && e.contains("drgrpo"), "{e}");
    }

    #[test]
    fn a_bad_set_value_blames_the_set_argument() {
        let e = TrainConfig::from_toml(TOML, "cfg.toml", &["algo.group_size=[1,".into()]).unwrap_err().to_string();
        assert!(e.contains("--set algo.group_size=[1,") && !e.contains("cfg.toml"), "{e}");
        let e = TrainConfig::from_toml(TOML, "cfg.toml", &["agents.0.device=3".into()]).unwrap_err().to_string();
        assert!(e.contains("--set agents.0.device=3"), "{e}");
    }

    #[test]
    fn toml_syntax_errors_give_line_and_column() {
        let e = TrainConfig::from_toml("[run]\nseed = 1\nsteps = = 4\n", "bad.toml", &[]).unwrap_err().to_string();
        assert!(e.contains("bad.toml") && e.contains("line 3, column"), "{e}");
    }

    #[test]
    fn moved_keys_name_their_migration() {
        let e = TrainConfig::from_toml("[algo.hacpo]\nkl_coef = 0.0", "old.toml", &[]).unwrap_err().to_string();
        assert!(e.contains("algo.hacpo.kl_coef has moved") && e.contains("algo.kl_coef"), "{e}");
        let e = TrainConfig::from_toml("[algo]\ngrpo_eps_high = 0.3", "old.toml", &[]).unwrap_err().to_string();
        assert!(e.contains("algo.clip_high"), "{e}");
        let e = TrainConfig::from_toml(TOML, "t", &["algo.hacpo.naive=true".into()]).unwrap_err().to_string();
        assert!(e.contains("algo.name = \"naive\""), "{e}");
        let e = TrainConfig::from_toml("[algo.mhgpo]\n", "old.toml", &[]).unwrap_err().to_string();
        assert!(e.contains("[algo.mhgpo] has moved") && e.contains("[workload.search]"), "{e}");
    }

    #[test]
    fn a_saved_config_of_an_older_hacpo_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let old = "[algo]\nname = \"grpo\"\ngrpo_eps_high = 0.3\n[algo.hacpo]\nkl_coef = 0.0\neps_low = 0.001\n[[agents]]\nmodel = \"a\"\n";
        std::fs::write(&path, old).unwrap();
        let (c, notes) = TrainConfig::load_saved(&path, &[]).unwrap();
        assert_eq!((c.algo.kl_coef, c.algo.clip_high, c.algo.clip_low), (0.0, Some(0.3), None));
        assert_eq!(c.policies.len(), 1);
        assert!(notes.iter().any(|n| n.contains("algo.hacpo.eps_low dropped")), "{notes:?}");
        std::fs::write(&path, "[algo.hacpo]\nnaive = true\neps_low = 0.001\n").unwrap();
        let (c, _) = TrainConfig::load_saved(&path, &[]).unwrap();
        assert_eq!((c.algo.name.as_str(), c.algo.clip_low), ("naive", Some(0.001)));
        // MHGPO's tree settings moved to the search workload's table.
        let tree = "[workload]\nkind = \"search\"\n[workload.search.penalties]\nreranker = -0.5\n\
                    [algo]\nname = \"mhgpo-rr\"\n[algo.mhgpo]\naggregate = \"max\"\nrr_probabilities = [0.0, 0.0, 1.0]\n";
        std::fs::write(&path, tree).unwrap();
        let (c, notes) = TrainConfig::load_saved(&path, &[]).unwrap();
        let search = &c.workload.search;
        assert_eq!(
            (search.aggregate, search.rr_probabilities, search.penalties.reranker),
            (crate::rl::mhgpo::Aggregate::Max, [0.0, 0.0, 1.0], -0.5)
        );
        assert!(notes.iter().any(|n| n == "algo.mhgpo.aggregate read as workload.search.aggregate"), "{notes:?}");
        // Every older config held [algo.mhgpo]; in another algorithm's run it is dropped quietly.
        std::fs::write(&path, "[algo]\nname = \"hacpo\"\n[algo.mhgpo]\naggregate = \"mean\"\n").unwrap();
        let (c, notes) = TrainConfig::load_saved(&path, &[]).unwrap();
        assert!(notes.is_empty() && c.workload == crate::workload::WorkloadConfig::default(), "{notes:?}");
    }

    #[test]
    fn bf16_frozen_weights_are_refused_on_wgpu_and_f16_is_not() {
        use crate::dtype::FrozenDtype;
        let mut c = TrainConfig::from_toml(EMBEDDED_DEFAULT, "default", &[]).unwrap();
        c.policies[0].device = "wgpu".into();
        c.policies[0].frozen_dtype = FrozenDtype::Bf16;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("policies[0].frozen_dtype") && e.contains("bf16 is not available on wgpu"), "{e}");
        c.policies[0].frozen_dtype = FrozenDtype::F16;
        c.validate().unwrap();
    }

    #[test]
    fn bf16_compute_is_refused_on_wgpu_and_f16_is_not() {
        let mut c = TrainConfig::from_toml(EMBEDDED_DEFAULT, "default", &["algo.compute_dtype=bf16".into()]).unwrap();
        c.validate().unwrap();
        c.policies[1].device = "wgpu".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("algo.compute_dtype") && e.contains("policies[1]") && e.contains("use \"f16\""), "{e}");
        c.algo.compute_dtype = ComputeDtype::F16;
        c.validate().unwrap();
    }

    #[test]
    fn embedded_default_parses_and_validates() {
        let c = TrainConfig::from_toml(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, &[]).unwrap();
        c.validate().unwrap();
        assert_eq!(c.policies.len(), 2);
        assert_eq!(c.task.kind, TaskKind::Arith);
    }
}
