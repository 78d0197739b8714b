//! Workloads: what produces a step's samples from the policies and assigns their rewards.
//!
//! The trainer hands a [`Workload`] the policies and the step's prompts; it gets back
//! [`Sample`]s, each naming its policy, role and group key, and then asks the workload for
//! their rewards. Generation, tool calls and environment steps live here; advantages, routing
//! and updates do not. Held-out evaluation is the workload's too: it knows how its policies
//! answer together.
//!
//! - [`exchange::Exchange`] is HACPO's workload: every policy answers every prompt in the role
//!   `solver`, and everything goes to one pool.
//! - [`search::Search`] is the multi-agent search pipeline (Rewriter → BM25 → Reranker →
//!   Answerer) rolled out as MHGPO trees, rewards propagated from the Answerer upwards.
//! - [`turns::Turns`] is the turn-wise tool + plan team on the planning environments, rolled
//!   out as AT-GRPO's per-turn branches or as whole trajectories.
//!
//! [`build`] picks the workload of a config and checks its roles.

pub mod exchange;
pub mod pool;
pub mod search;
pub mod turns;

use std::sync::Arc;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::config::TaskKind;
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::generate::SamplingParams;
use crate::policy::Policy;
use crate::sample::Sample;
use crate::task::{Task, TaskPrompt};
use crate::tokenizer::Message;
use crate::train::metrics::Metrics;

/// The workloads `workload.kind` selects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// HACPO's: every policy answers every prompt, all samples in one pool.
    #[default]
    Exchange,
    /// The multi-agent search pipeline, trained with `mhgpo-is`, `mhgpo-fof`, `mhgpo-rr` or
    /// `mappo`.
    Search,
    /// A tool role and a plan role over turns on a planning environment, trained with
    /// `atgrpo`, `mas-grpo` or `single-grpo`.
    Turns,
}

/// `[workload]`: which workload, and each workload's settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadConfig {
    pub kind: WorkloadKind,
    pub search: search::SearchConfig,
    pub turns: turns::TurnsConfig,
}

impl WorkloadConfig {
    /// The pairing of workload and task, and the search workload's settings.
    pub fn validate(&self, cfg: &TrainConfig) -> Result<()> {
        let bad = |m: String| Err(Error::config("training config", m));
        match (self.kind, cfg.task.kind) {
            (WorkloadKind::Search, TaskKind::Qa) => self.search.validate(),
            (WorkloadKind::Search, other) => bad(format!(
                "workload.kind = \"search\" answers questions from passages: set task.kind = \"qa\" (it is {other:?})"
            )),
            (WorkloadKind::Exchange, TaskKind::Qa) => {
                bad("task.kind = \"qa\" is played by the search pipeline: set [workload] kind = \"search\"".into())
            }
            (WorkloadKind::Turns, TaskKind::Env) => {
                crate::env::EnvKind::parse(&cfg.task.train)
                    .map_err(|e| Error::config("training config", format!("task.train: {e}")))?;
                self.turns.validate()
            }
            (WorkloadKind::Turns, other) => bad(format!(
                "workload.kind = \"turns\" plays planning environments: set task.kind = \"env\" (it is {other:?})"
            )),
            (_, TaskKind::Env) => {
                bad("task.kind = \"env\" is played over turns: set [workload] kind = \"turns\"".into())
            }
            _ => Ok(()),
        }?;
        // The algorithm must train this workload: checked here so `--dry-run` says so too.
        let algorithm = crate::rl::registry::build::<crate::backend::Cpu>(&cfg.algo.name, &cfg.algo.settings())?;
        if let Some(m) = pairing_error(self.kind, algorithm.name(), algorithm.tree().is_some(), algorithm.turns()) {
            return bad(m);
        }
        if let (WorkloadKind::Turns, Some(t)) = (self.kind, algorithm.turns()) {
            turns::players(cfg, t.single_agent)?;
        }
        Ok(())
    }
}

/// The roles of workload `kind` (none for the exchange, whose one role every policy plays;
/// only the plan role for a single-agent turn-wise algorithm).
pub fn role_names(kind: WorkloadKind, single_agent: bool) -> Vec<&'static str> {
    match kind {
        WorkloadKind::Exchange => vec![],
        WorkloadKind::Search => crate::search::pipeline::Role::ALL.iter().map(|r| r.name()).collect(),
        WorkloadKind::Turns if single_agent => vec![turns::ROLES[1]],
        WorkloadKind::Turns => turns::ROLES.to_vec(),
    }
}

/// Whether `algorithm` trains workload `kind`.
pub fn trains<B: Backend>(kind: WorkloadKind, algorithm: &dyn crate::rl::algorithm::Algorithm<B>) -> bool {
    pairing_error(kind, algorithm.name(), algorithm.tree().is_some(), algorithm.turns()).is_none()
}

/// Why algorithm `name` cannot train workload `kind`, if it cannot.
fn pairing_error(
    kind: WorkloadKind,
    name: &str,
    tree: bool,
    turns: Option<crate::rl::atgrpo::TurnRollout>,
) -> Option<String> {
    match kind {
        WorkloadKind::Exchange if tree => {
            Some(format!("algo.name: {name} trains the search pipeline; set [workload] kind = \"search\""))
        }
        WorkloadKind::Exchange if turns.is_some() => {
            Some(format!("algo.name: {name} trains the turn-wise workload; set [workload] kind = \"turns\""))
        }
        WorkloadKind::Search if !tree => Some(format!(
            "algo.name: the search workload trains with mhgpo-is, mhgpo-fof, mhgpo-rr or mappo, not {name}"
        )),
        WorkloadKind::Turns if turns.is_none() => {
            Some(format!("algo.name: the turn-wise workload trains with atgrpo, mas-grpo or single-grpo, not {name}"))
        }
        _ => None,
    }
}

/// A role of a workload: its name, the policies that play it and how a prompt is put to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    pub name: String,
    /// Indices of the policies that play it.
    pub policies: Vec<usize>,
    /// The user message with `{prompt}` for the task's; `None`: the task's messages as they are.
    pub template: Option<String>,
}

impl Role {
    /// The messages this role sees for a task prompt.
    pub fn messages(&self, prompt: &TaskPrompt) -> Vec<Message> {
        let Some(template) = &self.template else { return prompt.messages.clone() };
        let mut messages = prompt.messages.clone();
        if let Some(last) = messages.iter_mut().rev().find(|m| m.role == "user") {
            last.content = template.replace("{prompt}", &last.content);
        }
        messages
    }
}

/// Sampling settings of one step.
#[derive(Clone, Debug)]
pub struct RolloutSettings {
    /// The training step (1-based), for seeds and error messages.
    pub step: u64,
    pub run_seed: u64,
    /// Samples per prompt per policy.
    pub group_size: usize,
    /// Temperature, top-p/k and length; the seed is derived per policy and chunk.
    pub sampling: SamplingParams,
    pub max_prompt_tokens: usize,
    /// Prompts generated together.
    pub batch_prompts: usize,
}

/// Seconds and tokens a policy spent producing its samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct RolloutTimings {
    pub generate: f64,
    pub generated_tokens: usize,
}

/// How held-out evaluation generates (greedy).
#[derive(Clone, Copy, Debug)]
pub struct ValidationSettings {
    pub max_prompt_tokens: usize,
    pub max_new_tokens: usize,
    /// Prompts generated together.
    pub batch_prompts: usize,
}

/// A workload the trainer can host.
pub trait Workload<B: Backend>: Send + Sync {
    fn name(&self) -> &str;

    /// The held-out metric that summarises a run (`val/accuracy`, `val/f1`).
    fn validation_key(&self) -> &'static str;

    /// The step's samples (rewards and old log-probs not yet filled in) and each policy's
    /// timings, indexed like `policies`.
    fn rollout(
        &self,
        policies: &[Policy<B>],
        prompts: &[TaskPrompt],
        settings: &RolloutSettings,
    ) -> Result<(Vec<Sample>, Vec<RolloutTimings>)>;

    /// Fills in every sample's reward (and, for trees, which samples are trained: MHGPO masks
    /// singletons). `samples` are in rollout order: a sample's `parent` indexes this slice.
    fn assign_rewards(&self, samples: &mut [Sample], prompts: &[TaskPrompt]) -> Result<()>;

    /// Metrics of the step's samples that every policy's record carries (the team's F1).
    fn metrics(&self, _samples: &[Sample], _prompts: &[TaskPrompt]) -> Metrics {
        Metrics::new()
    }

    /// Greedy held-out metrics of every policy (indexed like `policies`), including
    /// [`Workload::validation_key`].
    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>>;
}

/// How people name a held-out metric: `val/accuracy` → accuracy, `val/f1` → F1.
pub fn validation_label(key: &str) -> &str {
    match key.strip_prefix("val/").unwrap_or(key) {
        "f1" => "F1",
        other => other,
    }
}

/// The workload of `cfg`, its roles checked against the policies and the algorithm.
pub fn build<B: Backend, A: Backend>(
    cfg: &TrainConfig,
    task: Arc<dyn Task>,
    algorithm: &dyn crate::rl::algorithm::Algorithm<A>,
) -> Result<Box<dyn Workload<B>>> {
    let (tree, turns) = (algorithm.tree(), algorithm.turns());
    if let Some(m) = pairing_error(cfg.workload.kind, algorithm.name(), tree.is_some(), turns) {
        return Err(Error::config("training config", m));
    }
    Ok(match (cfg.workload.kind, tree, turns) {
        (WorkloadKind::Search, Some(tree), _) => Box::new(search::Search::new(cfg, task, tree)?),
        (WorkloadKind::Turns, _, Some(turns)) => Box::new(turns::Turns::new(cfg, task, turns)?),
        _ => Box::new(exchange::Exchange::new(cfg, task)?),
    })
}

/// One sampled completion of [`sample_in_chunks`], as a sample stores it.
pub struct Drawn {
    /// Index into the prompts.
    pub prompt: usize,
    pub sample_index: usize,
    pub response_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: crate::generate::FinishReason,
}

/// `num_samples` sampled completions of `policy` for each of `prompts`, `batch_prompts` prompts
/// at a time, chunk `c` seeded with `chunk_seed(c)`, in prompt then sample order; the seconds
/// and tokens spent are added to `timings`.
pub fn sample_in_chunks<B: Backend>(
    policy: &Policy<B>,
    prompts: &[Vec<u32>],
    settings: &RolloutSettings,
    num_samples: usize,
    chunk_seed: impl Fn(usize) -> u64,
    timings: &mut RolloutTimings,
) -> Result<Vec<Drawn>> {
    let model = policy.inference_model();
    let per_chunk = settings.batch_prompts.max(1);
    let mut out = Vec::with_capacity(prompts.len() * num_samples);
    for (c, chunk) in prompts.chunks(per_chunk).enumerate() {
        let mut params = settings.sampling.clone();
        params.seed = chunk_seed(c);
        let mut req = crate::generate::GenerateRequest::new(chunk, params);
        req.num_samples = num_samples;
        req.stop_token_ids = policy.eos_token_ids.clone();
        let started = std::time::Instant::now();
        let (completions, stats) = crate::generate::generate(&model, &req)?;
        timings.generate += started.elapsed().as_secs_f64();
        timings.generated_tokens += stats.generated_tokens;
        for done in completions {
            let (response_ids, text) = response(policy, done.token_ids)?;
            out.push(Drawn {
                prompt: c * per_chunk + done.prompt_index,
                sample_index: done.sample_index,
                response_ids,
                text,
                finish_reason: done.finish_reason,
            });
        }
    }
    Ok(out)
}

/// A generated completion as a sample stores it (ALGORITHMS.md §2.6): the terminal EOS removed
/// before anything else, the text decoded without special tokens; a response that is only EOS
/// keeps that single token and has empty text.
pub fn response<B: Backend>(policy: &Policy<B>, mut ids: Vec<u32>) -> Result<(Vec<u32>, String)> {
    if ids.last().is_some_and(|t| policy.eos_token_ids.contains(t)) {
        ids.pop();
    }
    if ids.is_empty() {
        return Ok((vec![policy.eos()?], String::new()));
    }
    let text = policy.tokenizer.decode(&ids, true)?;
    Ok((ids, text))
}

/// SplitMix64: independent seeds from (run seed, step, policy, chunk).
pub fn mix_seed(parts: &[u64]) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for &p in parts {
        x ^= p.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(x << 6).wrapping_add(x >> 2);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x = z ^ (z >> 31);
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_template_wraps_the_last_user_message() {
        let p = TaskPrompt { id: "1".into(), messages: vec![Message::user("2+2?")], gold: "4".into() };
        let plain = Role { name: "solver".into(), policies: vec![0], template: None };
        assert_eq!(plain.messages(&p), p.messages);
        let wrapped = Role { template: Some("Q: {prompt}\nA:".into()), ..plain };
        assert_eq!(wrapped.messages(&p)[0].content, "Q: 2+2?\nA:");
    }
}
