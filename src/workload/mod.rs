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
//! - [`delegate::Delegate`] is M-GRPO's main agent delegating to a search sub-agent, each
//!   conversation one sample with the environment's tokens masked.
//!
//! [`build`] picks the workload of a config and checks its roles.

pub mod delegate;
pub mod exchange;
pub mod pool;
pub mod roles;
pub mod search;
pub mod turns;

use std::sync::Arc;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::cluster::Bus;
use crate::error::{Error, Result};
use crate::generate::SamplingParams;
use crate::policy::Policy;
use crate::rl::registry::{self, RolloutShape};
use crate::sample::{Response, Sample};
use crate::task::{Task, TaskKind, TaskPrompt};
use crate::train::metrics::Metrics;
pub use roles::{Role, RoleConfig, RoleMap};

/// The workloads `workload.kind` selects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// HACPO's: every policy answers every prompt, all samples in one pool.
    #[default]
    Exchange,
    /// The multi-agent search pipeline, rolled out as trees.
    Search,
    /// A tool role and a plan role over turns on a planning environment.
    Turns,
    /// A main agent that delegates research to a search sub-agent (M-GRPO).
    Delegate,
}

/// One row of the pairing table: what a workload plays and which algorithms it trains.
struct Pairing {
    workload: WorkloadKind,
    /// What it does, as an error explains it.
    does: &'static str,
    /// The task kinds it plays.
    tasks: &'static [TaskKind],
    /// Whether it produces an algorithm's rollouts.
    produces: fn(RolloutShape) -> bool,
}

/// The one pairing table of workloads, tasks and algorithms (through their registered
/// [`RolloutShape`]). A new workload is a row here.
const PAIRINGS: [Pairing; 4] = [
    Pairing {
        workload: WorkloadKind::Exchange,
        does: "has every policy answer every prompt",
        tasks: &[TaskKind::Math, TaskKind::Arith],
        produces: |shape| matches!(shape, RolloutShape::Pool),
    },
    Pairing {
        workload: WorkloadKind::Search,
        does: "answers questions from passages",
        tasks: &[TaskKind::Qa],
        produces: |shape| matches!(shape, RolloutShape::Tree { .. }),
    },
    Pairing {
        workload: WorkloadKind::Turns,
        does: "plays planning environments over turns",
        tasks: &[TaskKind::Env],
        produces: |shape| matches!(shape, RolloutShape::Turns(_)),
    },
    Pairing {
        workload: WorkloadKind::Delegate,
        does: "answers questions by delegating searches to a sub-agent",
        tasks: &[TaskKind::Qa],
        produces: |shape| matches!(shape, RolloutShape::Delegate(_)),
    },
];

impl WorkloadKind {
    /// Its name in `workload.kind`.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Exchange => "exchange",
            WorkloadKind::Search => "search",
            WorkloadKind::Turns => "turns",
            WorkloadKind::Delegate => "delegate",
        }
    }

    fn pairing(self) -> &'static Pairing {
        PAIRINGS.iter().find(|p| p.workload == self).expect("every workload has a row")
    }

    /// The registered algorithms it trains.
    pub fn algorithms(self) -> Vec<&'static str> {
        let produces = self.pairing().produces;
        registry::shapes().into_iter().filter(|&(_, shape)| produces(shape)).map(|(name, _)| name).collect()
    }
}

/// `a, b, c or d`.
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Every registered algorithm, one line per workload that trains them (`hacpo train --help`).
pub fn algorithms_by_workload() -> String {
    let line = |p: &Pairing| format!("  {:<9} {}", p.workload.name(), p.workload.algorithms().join(", "));
    PAIRINGS.iter().map(line).collect::<Vec<_>>().join("\n")
}

/// Checks, from the pairing table, that workload `kind` plays `task` and trains algorithm
/// `algorithm`; the error says which key to change.
pub fn check_pairing(kind: WorkloadKind, task: TaskKind, algorithm: &str) -> Result<()> {
    check_task(kind, task)?;
    check_algorithm(kind, algorithm)
}

/// That workload `kind` plays task kind `task`.
fn check_task(kind: WorkloadKind, task: TaskKind) -> Result<()> {
    let bad = |m: String| Err(Error::config("training config", m));
    let row = kind.pairing();
    let quoted = |t: TaskKind| {
        format!("\"{}\"", serde_json::to_value(t).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default())
    };
    if !row.tasks.contains(&task) {
        let plays: Vec<String> = row.tasks.iter().map(|&t| quoted(t)).collect();
        let other = PAIRINGS
            .iter()
            .find(|p| p.tasks.contains(&task))
            .map_or(String::new(), |p| format!(", or [workload] kind = \"{}\" (which {})", p.workload.name(), p.does));
        return bad(format!(
            "workload.kind = \"{}\" {}: it plays task.kind = {}, not {}; set task.kind = {}{other}",
            kind.name(),
            row.does,
            plays.join(" or "),
            quoted(task),
            plays[0]
        ));
    }
    Ok(())
}

/// That workload `kind` produces the rollouts algorithm `algorithm` learns from.
fn check_algorithm(kind: WorkloadKind, algorithm: &str) -> Result<()> {
    let bad = |m: String| Err(Error::config("training config", m));
    let row = kind.pairing();
    let shape = registry::shape(algorithm).map_err(|e| Error::config("training config", format!("algo.name: {e}")))?;
    if !(row.produces)(shape) {
        let elsewhere = PAIRINGS.iter().find(|p| (p.produces)(shape)).map_or(String::new(), |p| {
            format!(
                "; {algorithm} trains the {} workload ([workload] kind = \"{}\")",
                p.workload.name(),
                p.workload.name()
            )
        });
        return bad(format!(
            "algo.name: the {} workload trains with {}, not {algorithm}{elsewhere}",
            kind.name(),
            or_list(&kind.algorithms())
        ));
    }
    Ok(())
}

/// `[workload]`: which workload, and each workload's settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadConfig {
    pub kind: WorkloadKind,
    pub search: search::SearchConfig,
    pub turns: turns::TurnsConfig,
    pub delegate: delegate::DelegateConfig,
}

impl WorkloadConfig {
    /// How a `[cluster]` run may spread this workload over processes: any way (`None`: its
    /// policies meet only in a step's samples), or as at most two processes with the two
    /// policies given on different ones (a team whose episodes pass outputs between them);
    /// an error says why it cannot be spread at all.
    pub fn spread(&self, algorithm: &str, roles: &RoleMap) -> std::result::Result<Option<[usize; 2]>, String> {
        match (self.kind, registry::shape(algorithm)) {
            (WorkloadKind::Exchange, _) => Ok(None),
            (WorkloadKind::Delegate, Ok(RolloutShape::Delegate(sub))) => {
                delegate::players(roles, sub).map(Some).map_err(|e| e.to_string())
            }
            // The search and turn-wise teams pass outputs between policies within a rollout
            // too; only the delegation team has its two sides built.
            (kind, _) => Err(format!(
                "cluster: the {:?} workload runs in one process for now (the exchange and delegate workloads \
                 spread); remove [cluster] to train in one process",
                kind.name()
            )),
        }
    }

    /// The pairing with the task and the algorithm, the chosen workload's settings and who
    /// plays its roles: everything `--dry-run` can say before a model loads.
    pub fn validate(&self, task: TaskKind, algorithm: &str, roles: &RoleMap) -> Result<()> {
        check_pairing(self.kind, task, algorithm)?;
        match (self.kind, registry::shape(algorithm)?) {
            (WorkloadKind::Search, _) => {
                self.search.validate()?;
                search::players(roles).map(drop)
            }
            (WorkloadKind::Turns, RolloutShape::Turns(t)) => {
                self.turns.validate()?;
                turns::players(roles, t.single_agent).map(drop)
            }
            (WorkloadKind::Delegate, RolloutShape::Delegate(sub)) => {
                self.delegate.validate()?;
                delegate::players(roles, sub).map(drop)
            }
            _ => Ok(()),
        }
    }
}

/// The roles workload `kind` plays with algorithm `algorithm` (none for the exchange, whose one
/// role every policy plays; only the plan role for a single-agent turn-wise algorithm).
pub fn role_names(kind: WorkloadKind, algorithm: &str) -> Vec<&'static str> {
    match (kind, registry::shape(algorithm)) {
        (WorkloadKind::Exchange, _) => vec![],
        (WorkloadKind::Search, _) => crate::search::pipeline::Role::ALL.iter().map(|r| r.name()).collect(),
        (WorkloadKind::Turns, Ok(RolloutShape::Turns(t))) if t.single_agent => vec![turns::ROLES[1]],
        (WorkloadKind::Turns, _) => turns::ROLES.to_vec(),
        (WorkloadKind::Delegate, Ok(RolloutShape::Delegate(crate::rl::mgrpo::SubAgent::None))) => {
            vec![delegate::ROLES[0]]
        }
        (WorkloadKind::Delegate, _) => delegate::ROLES.to_vec(),
    }
}

/// Sampling settings of one step.
#[derive(Clone)]
pub struct RolloutSettings<'a> {
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
    /// How many policies the run has; those handed to the workload are the ones this process
    /// samples (all, but in a cluster run its host's).
    pub policies: usize,
    /// The run's processes: a workload whose episodes pass outputs between policies that
    /// different processes hold talks to the others through it (one process: only itself).
    pub bus: &'a dyn Bus,
}

/// Seconds and tokens a policy spent producing its samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct RolloutTimings {
    pub generate: f64,
    pub generated_tokens: usize,
}

/// What a rollout produced: the step's samples (rewards and old log-probs not yet filled in),
/// each policy's timings (indexed like the policies), and what the workload measured on the
/// way that the samples do not carry (retrieval recall, episode outcomes).
#[derive(Default)]
pub struct Rollout {
    pub samples: Vec<Sample>,
    pub timings: Vec<RolloutTimings>,
    pub metrics: Metrics,
}

/// How held-out evaluation generates (greedy).
#[derive(Clone)]
pub struct ValidationSettings<'a> {
    /// The steps trained so far (0 before training).
    pub step: u64,
    pub max_prompt_tokens: usize,
    pub max_new_tokens: usize,
    /// Prompts generated together.
    pub batch_prompts: usize,
    /// How many policies the run has; those handed to the workload are the ones this process
    /// measures (all, but in a cluster run its host's), the others' metrics are empty.
    pub policies: usize,
    /// The run's processes, as in [`RolloutSettings::bus`].
    pub bus: &'a dyn Bus,
}

/// A workload the trainer can host.
pub trait Workload<B: Backend>: Send + Sync {
    fn name(&self) -> &str;

    /// The held-out metric that summarises a run (`val/accuracy`, `val/f1`).
    fn validation_key(&self) -> &'static str;

    /// The step's samples, timings and rollout measurements ([`Rollout`]).
    fn rollout(&self, policies: &[Policy<B>], prompts: &[TaskPrompt], settings: &RolloutSettings) -> Result<Rollout>;

    /// Fills in every sample's reward (and, for trees, which samples are trained: MHGPO masks
    /// singletons). `samples` are in rollout order: a sample's `parent` indexes this slice.
    fn assign_rewards(&self, samples: &mut [Sample], prompts: &[TaskPrompt]) -> Result<()>;

    /// Metrics of the step's samples, rewards assigned, that every policy's record carries
    /// (the team's F1).
    fn metrics(&self, _samples: &[Sample], _prompts: &[TaskPrompt]) -> Metrics {
        Metrics::new()
    }

    /// Greedy held-out metrics of every policy (indexed by policy index), including
    /// [`Workload::validation_key`].
    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>>;

    /// What the workload settled during the run that a resumed run must keep (M-GRPO's
    /// alignment target from a pilot), saved in `trainer_state.json`; null when nothing.
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Takes back what [`Workload::state`] saved.
    fn restore(&self, _state: serde_json::Value) -> Result<()> {
        Ok(())
    }
}

/// How people name a held-out metric: `val/accuracy` → accuracy, `val/f1` → F1.
pub fn validation_label(key: &str) -> &str {
    match key.strip_prefix("val/").unwrap_or(key) {
        "f1" => "F1",
        other => other,
    }
}

/// The workload `config` selects for algorithm `algorithm`'s rollouts, its roles resolved from
/// `roles`.
pub fn build<B: Backend>(
    config: &WorkloadConfig,
    roles: &RoleMap,
    task: Arc<dyn Task>,
    algorithm: &str,
) -> Result<Box<dyn Workload<B>>> {
    let shape = registry::shape(algorithm)?;
    Ok(match (config.kind, shape) {
        (WorkloadKind::Exchange, RolloutShape::Pool) => Box::new(exchange::Exchange::new(roles, task)?),
        (WorkloadKind::Search, RolloutShape::Tree { fork, credit }) => {
            Box::new(search::Search::new(&config.search, roles, task, fork, credit)?)
        }
        (WorkloadKind::Turns, RolloutShape::Turns(rollout)) => {
            Box::new(turns::Turns::new(&config.turns, roles, task, rollout)?)
        }
        (WorkloadKind::Delegate, RolloutShape::Delegate(sub)) => {
            Box::new(delegate::Delegate::new(&config.delegate, roles, task, sub)?)
        }
        (kind, _) => {
            // The pairing check names what to change.
            check_algorithm(kind, algorithm)?;
            return Err(Error::Internal(format!("no {} workload for {algorithm}", kind.name())));
        }
    })
}

/// One sampled completion of [`sample_in_chunks`].
pub struct Drawn {
    /// Index into the prompts.
    pub prompt: usize,
    pub sample_index: usize,
    pub response: Response,
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
            let (ids, text) = response(policy, done.token_ids)?;
            out.push(Drawn {
                prompt: c * per_chunk + done.prompt_index,
                sample_index: done.sample_index,
                response: Response { ids, text, finish_reason: done.finish_reason },
            });
        }
    }
    Ok(out)
}

/// `messages` in `policy`'s chat template; a prompt above `max_tokens` is refused (a role's
/// prompt that does not fit is a setting to change, not something to cut silently), the error
/// naming the role and ending with `hint`.
pub fn encode_within<B: Backend>(
    policy: &Policy<B>,
    role: &str,
    messages: &[crate::tokenizer::Message],
    max_tokens: usize,
    hint: &str,
) -> Result<Vec<u32>> {
    let ids = policy.encode_prompt(messages, usize::MAX)?;
    if ids.len() > max_tokens {
        return Err(Error::InvalidArgument(format!(
            "a {role} prompt of policy {} has {} tokens, above rollout.max_prompt_tokens = {max_tokens}; raise it{hint}",
            policy.name,
            ids.len()
        )));
    }
    Ok(ids)
}

/// A generated completion as a sample stores it (docs/algorithms.md §2.6): the terminal EOS removed
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_is_trained_by_exactly_one_workload() {
        for name in registry::names() {
            let by: Vec<&str> = PAIRINGS
                .iter()
                .filter(|p| p.workload.algorithms().contains(&name))
                .map(|p| p.workload.name())
                .collect();
            assert_eq!(by.len(), 1, "{name} is trained by {by:?}");
        }
        assert_eq!(WorkloadKind::Search.algorithms(), ["mhgpo-is", "mhgpo-fof", "mhgpo-rr", "mappo"]);
    }

    #[test]
    fn pairing_errors_name_the_key_to_change() {
        let err = |k, t, a| check_pairing(k, t, a).unwrap_err().to_string();
        let e = err(WorkloadKind::Search, TaskKind::Math, "mhgpo-is");
        assert!(e.contains("set task.kind = \"qa\", or [workload] kind = \"exchange\""), "{e}");
        assert!(err(WorkloadKind::Exchange, TaskKind::Qa, "hacpo").contains("kind = \"search\""));
        assert!(err(WorkloadKind::Exchange, TaskKind::Env, "hacpo").contains("kind = \"turns\""));
        let e = err(WorkloadKind::Search, TaskKind::Qa, "grpo");
        assert!(
            e.contains("mhgpo-is, mhgpo-fof, mhgpo-rr or mappo, not grpo") && e.contains("kind = \"exchange\""),
            "{e}"
        );
        assert!(err(WorkloadKind::Exchange, TaskKind::Math, "atgrpo").contains("kind = \"turns\""));
        assert!(check_pairing(WorkloadKind::Turns, TaskKind::Env, "single-grpo").is_ok());
    }
}
