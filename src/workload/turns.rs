//! The turn-wise multi-agent workload (`workload.kind = "turns"`, docs/algorithms.md §5): a tool
//! role and a plan role solve a generated planning task (`src/env/`) over up to T turns.
//!
//! ```text
//! per turn, for every unfinished episode:
//!   tool role: K outputs ─▶ the tool (simulate on a copy, or run the program) ─▶ local rewards
//!              the best branch's report goes to the plan role
//!   plan role: K outputs ─▶ each applied to a copy of the state ─▶ team rewards
//!              the best branch is executed: every branch continues from it
//! ```
//!
//! That is AT-GRPO's tree sampling (`atgrpo`): every decision's K branches share one prompt and
//! form the group (task, agent, turn). With whole trajectories (`mas-grpo`, `single-grpo`) K
//! episodes per task run side by side, one output per decision, and outputs group by identical
//! prompt: the tool's groups are singletons after the first turn, the planner's from the first
//! (its prompt holds its own trajectory's tool output) unless the tool outputs coincide.
//! Rewards are immediate: a plan branch gets `α · (its moves' environment reward)` (its team
//! and local reward are one quantity); a tool branch `α · (the executed plan's reward this
//! turn) + (its own moves' reward on a copy)`, −1 when its answer is unreadable or its program
//! fails. The team term is the same for a decision's K tool branches, so in AT-GRPO's groups it
//! cancels: the tool learns from its own proposals. Roles run turn by turn over all episodes at once, each role one
//! batched generation by the policy that plays it: one policy for both roles (shared) or one
//! per role through `[[roles]]`.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::roles::RoleMap;
use super::{Rollout, RolloutSettings, RolloutTimings, ValidationSettings, Workload, encode_within, sample_in_chunks};
use crate::env::task::instance;
use crate::env::tool::{self, PythonLimits, ToolResult};
use crate::env::{EnvKind, FORMAT_PENALTY, Instance, Outcome};
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::policy::{Policy, held};
use crate::rl::atgrpo::{Decision, Grouping, TurnRollout, best_branch, group_key, mixed_reward};
use crate::sample::{Response, Sample};
use crate::stable_hash::mix_seed;
use crate::task::{Task, TaskPrompt};
use crate::tokenizer::Message;
use crate::train::metrics::Metrics;

/// Which tool the tool role's output goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolKind {
    /// The tool role writes moves; they are simulated on a copy of the state.
    #[default]
    Simulate,
    /// The tool role writes a Python program that prints the moves (`[workload.turns.python]`).
    Python,
}

/// What a branch's moves earn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnReward {
    /// The environment's step rewards (PettingLLMs': per move, shaping, goal bonus).
    #[default]
    Steps,
    /// 1 when the branch's answer solves the task, else 0 (an unreadable answer still −1):
    /// progress that does not arrive earns nothing.
    Success,
}

impl TurnReward {
    /// The reward of an applied answer's outcome.
    fn of(self, outcome: &Outcome) -> f64 {
        match self {
            _ if outcome.format_error.is_some() => FORMAT_PENALTY,
            TurnReward::Steps => outcome.reward,
            TurnReward::Success => f64::from(u8::from(outcome.solved)),
        }
    }
}

/// `[workload.turns]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TurnsConfig {
    /// The turn limit T: an episode not solved by then fails.
    pub turns: usize,
    /// α in `α · team + local`.
    pub alpha: f64,
    pub tool: ToolKind,
    /// `steps` (the default, the paper's) or `success`.
    pub reward: TurnReward,
    /// The python tool's interpreter and limits.
    pub python: PythonLimits,
}

impl Default for TurnsConfig {
    fn default() -> Self {
        TurnsConfig {
            turns: 4,
            alpha: 1.0,
            tool: ToolKind::Simulate,
            reward: TurnReward::Steps,
            python: PythonLimits::default(),
        }
    }
}

impl TurnsConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, m: String| Err(Error::config("training config", format!("workload.turns.{key}: {m}")));
        if !(1..=64).contains(&self.turns) {
            return bad("turns", format!("the turn limit is 1 to 64, not {}", self.turns));
        }
        // α = 0 would zero the plan role's reward (its team and local rewards are one quantity).
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad("alpha", format!("α weighs the team reward: a number > 0, not {}", self.alpha));
        }
        let p = &self.python;
        if !(p.timeout_s.is_finite() && p.timeout_s > 0.0 && p.timeout_s <= 600.0) {
            return bad("python.timeout_s", format!("seconds in (0, 600], not {}", p.timeout_s));
        }
        if !(64..=1 << 20).contains(&p.memory_mib) {
            return bad(
                "python.memory_mib",
                format!("64 MiB (Python itself needs some) to 1 TiB, not {}", p.memory_mib),
            );
        }
        if !(1..=1 << 16).contains(&p.disk_mib) {
            return bad("python.disk_mib", format!("1 to 65536 MiB, not {}", p.disk_mib));
        }
        if !(1..=4096).contains(&p.processes) {
            return bad("python.processes", format!("1 to 4096, not {}", p.processes));
        }
        if p.output_bytes == 0 || p.output_bytes > 64 << 20 || p.python.is_empty() {
            return bad(
                "python",
                "output_bytes must be between 1 and 64 MiB and python must name an interpreter".into(),
            );
        }
        if self.tool == ToolKind::Python {
            // A missing interpreter or sandbox is said before anything loads, not in the first step.
            tool::check_python(p)?;
        }
        Ok(())
    }
}

/// The roles, in turn order.
pub const ROLES: [&str; 2] = ["tool", "plan"];
const TOOL: usize = 0;
const PLAN: usize = 1;
/// Characters of the tool's output and report a plan prompt shows (outputs are bounded by
/// `max_new_tokens`, a program's printout is not).
const SHOWN_CHARS: usize = 800;
/// Past turns a prompt recounts.
const HISTORY: usize = 2;
const GENERATE_STREAM: u64 = 0x7A125;

/// The workload.
pub struct Turns {
    task: Arc<dyn Task>,
    prompts: Prompts,
    config: TurnsConfig,
    rollout: TurnRollout,
    /// The policy that plays each role, in [`ROLES`] order.
    players: [usize; 2],
}

/// Who plays each role, in [`ROLES`] order; single-agent: only the plan role plays (the tool
/// slot then names the plan's policy, which never plays it).
pub fn players(roles: &RoleMap, single_agent: bool) -> Result<[usize; 2]> {
    let needed: &[usize] = if single_agent { &[PLAN] } else { &[TOOL, PLAN] };
    let p = roles.players("turn-wise", &ROLES, needed)?;
    let plan = p[PLAN].expect("the plan role is needed");
    Ok([p[TOOL].unwrap_or(plan), plan])
}

/// The roles' prompts (also what the tiny planner is pre-trained on, `tiny::planner`).
#[derive(Clone, Copy, Debug)]
pub struct Prompts {
    pub kind: EnvKind,
    /// The turn limit T the prompts name.
    pub turns: usize,
    pub tool: ToolKind,
}

impl Prompts {
    pub fn new(kind: EnvKind, config: &TurnsConfig) -> Prompts {
        Prompts { kind, turns: config.turns, tool: config.tool }
    }

    fn describe_task(&self) -> &'static str {
        match self.kind {
            EnvKind::PlanPath => "Plan-Path: walk from S to the goal G without entering walls (#).",
            EnvKind::Sokoban => "Sokoban: push the box ($) onto the target (.).",
            EnvKind::Sudoku => "Sudoku 4x4: fill the empty cells.",
        }
    }

    /// The last [`HISTORY`] turns' lines ([`executed_line`]).
    fn history(history: &[String]) -> String {
        let from = history.len().saturating_sub(HISTORY);
        history[from..].iter().map(|h| format!("{h}\n")).collect()
    }

    /// The tool role's prompt at `turn` (from 0).
    pub fn tool(&self, state: &Instance, history: &[String], turn: usize) -> Vec<Message> {
        let ask = match self.tool {
            ToolKind::Simulate => format!(
                "Propose the moves to try; they will be simulated and the planner sees the result. Answer with {}.",
                self.kind.answer_format()
            ),
            ToolKind::Python => format!(
                "Write a Python program in a ```python block that finds the moves and prints them as **Actions List**: {}.",
                self.kind.answer_format().trim_start_matches("#### ")
            ),
        };
        let text = format!(
            "You are the tool agent. {}\nTurn {} of {}.\n{}\n{}{ask}",
            self.describe_task(),
            turn + 1,
            self.turns,
            state.render(),
            Self::history(history)
        );
        vec![Message::user(text)]
    }

    /// The plan role's prompt at `turn`, with the tool's best branch ([`tool_shown`]) when
    /// there is a tool role.
    pub fn plan(&self, state: &Instance, history: &[String], turn: usize, tool: Option<&str>) -> Vec<Message> {
        let tool = tool.map_or(String::new(), |t| format!("{t}\n"));
        let text = format!(
            "You are the plan agent. {}\nTurn {} of {}.\n{}\n{}{tool}Decide the moves to execute now. Answer with {}.",
            self.describe_task(),
            turn + 1,
            self.turns,
            state.render(),
            Self::history(history),
            self.kind.answer_format()
        );
        vec![Message::user(text)]
    }
}

/// What the plan role is shown of a tool branch: its output and the tool's report.
pub fn tool_shown(text: &str, report: &str) -> String {
    let said: String = text.trim().chars().take(SHOWN_CHARS).collect();
    let report: String = report.chars().take(SHOWN_CHARS).collect();
    format!("The tool agent proposed:\n{said}\n{report}")
}

/// The history line of an executed turn (`turn` from 0).
pub fn executed_line(turn: usize, state: &Instance, outcome: &Outcome) -> String {
    format!("Turn {}: executed {}", turn + 1, state.describe(outcome))
}

/// One task being played.
#[derive(Clone, Debug)]
struct Episode {
    /// Index into the step's prompts.
    prompt: usize,
    state: Instance,
    /// What each past turn executed and what came of it.
    history: Vec<String>,
    turns: usize,
}

/// One output of one role, in the order [`Turns::play`] asked for them.
#[derive(Clone, Debug)]
struct Output {
    episode: usize,
    turn: usize,
    role: usize,
    messages: Vec<Message>,
    reward: f64,
    penalty: f64,
    /// Plan outputs: whether this branch solved the task.
    solved: bool,
}

/// What a step's (or a validation's) episodes did.
#[derive(Clone, Copy, Debug, Default)]
struct EpisodeStats {
    episodes: usize,
    solved: usize,
    turns: usize,
    /// Moves (or fills) the plan role's outputs applied, and how many of them were refused.
    applied: usize,
    invalid: usize,
    /// Plan outputs, and those that could not be read.
    plans: usize,
    unreadable: usize,
    tool_runs: usize,
    tool_errors: usize,
}

impl EpisodeStats {
    fn rate(n: usize, d: usize) -> f64 {
        if d == 0 { 0.0 } else { n as f64 / d as f64 }
    }

    /// Success rate, turns, invalid and unreadable answers, tool errors.
    fn metrics(&self) -> Metrics {
        let mut m = Metrics::new();
        m.insert("turns/success_rate".into(), Self::rate(self.solved, self.episodes));
        m.insert("turns/mean_turns".into(), Self::rate(self.turns, self.episodes));
        m.insert("turns/invalid_action_rate".into(), Self::rate(self.invalid, self.applied));
        m.insert("turns/unreadable_rate".into(), Self::rate(self.unreadable, self.plans));
        m.insert("turns/tool_error_rate".into(), Self::rate(self.tool_errors, self.tool_runs));
        m
    }
}

/// Generates the outputs of one role for a batch of prompts: `branches` texts per prompt.
type Generate<'a> = dyn FnMut(usize, usize, &[Vec<Message>], usize) -> Result<Vec<Vec<String>>> + 'a;

impl Turns {
    /// The team on `task`'s environments, rolled out as `rollout` says.
    pub fn new(config: &TurnsConfig, roles: &RoleMap, task: Arc<dyn Task>, rollout: TurnRollout) -> Result<Self> {
        let kind = task
            .train()
            .first()
            .or(task.validation().first())
            .map(instance)
            .transpose()?
            .map(|i| i.kind())
            .ok_or_else(|| Error::config("training config", "task.env: no instances to play"))?;
        config.validate()?;
        Ok(Turns {
            players: players(roles, rollout.single_agent)?,
            task,
            prompts: Prompts::new(kind, config),
            config: config.clone(),
            rollout,
        })
    }

    fn use_tool(&self, state: &Instance, text: &str) -> Result<ToolResult> {
        match self.config.tool {
            ToolKind::Simulate => Ok(tool::simulate(state, text)),
            ToolKind::Python => tool::python(state, text, &self.config.python),
        }
    }

    /// [`Self::use_tool`] on every (state, output) pair, in order. Python programs run on as
    /// many threads as the machine has cores: each waits on a child process (up to its time
    /// limit), so one after another a step's K × environments programs would add up.
    fn use_tools(&self, jobs: &[(&Instance, &str)]) -> Result<Vec<ToolResult>> {
        let threads = match self.config.tool {
            ToolKind::Simulate => 1,
            ToolKind::Python => std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len()),
        };
        if threads <= 1 {
            return jobs.iter().map(|(state, text)| self.use_tool(state, text)).collect();
        }
        let chunk = jobs.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        part.iter().map(|(state, text)| self.use_tool(state, text)).collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(jobs.len());
            for h in handles {
                all.extend(h.join().map_err(|_| Error::Internal("a python tool thread panicked".into()))??);
            }
            Ok(all)
        })
    }

    /// Plays `episodes` for up to T turns, `branches` outputs per decision (the best one
    /// executed); returns every output in the order `generate` produced them, and the stats.
    fn play(
        &self,
        episodes: &mut [Episode],
        branches: usize,
        generate: &mut Generate<'_>,
    ) -> Result<(Vec<Output>, EpisodeStats)> {
        let mut outputs = Vec::new();
        let mut stats = EpisodeStats { episodes: episodes.len(), ..Default::default() };
        let reward = self.config.reward;
        for turn in 0..self.config.turns {
            let active: Vec<usize> = (0..episodes.len()).filter(|&e| !episodes[e].state.done()).collect();
            if active.is_empty() {
                break;
            }
            // The tool role: each branch's tool result; the best one is shown to the planner.
            let mut shown: Vec<Option<String>> = vec![None; episodes.len()];
            let mut tool_outputs: Vec<(usize, usize)> = Vec::new(); // (output index, episode)
            if !self.rollout.single_agent {
                let messages: Vec<Vec<Message>> =
                    active.iter().map(|&e| self.prompts.tool(&episodes[e].state, &episodes[e].history, turn)).collect();
                let texts = generate(TOOL, turn, &messages, branches)?;
                check_counts(&texts, active.len(), branches)?;
                let states: &[Episode] = episodes;
                let jobs: Vec<(&Instance, &str)> = active
                    .iter()
                    .zip(&texts)
                    .flat_map(|(&e, texts)| texts.iter().map(move |t| (&states[e].state, t.as_str())))
                    .collect();
                let mut results = self.use_tools(&jobs)?.into_iter();
                for ((&e, messages), texts) in active.iter().zip(messages).zip(&texts) {
                    let mut locals = Vec::with_capacity(branches);
                    let mut reports = Vec::with_capacity(branches);
                    for text in texts {
                        let result = results.next().expect("a result per job");
                        stats.tool_runs += 1;
                        stats.tool_errors += usize::from(result.tool_error);
                        let unreadable = result.outcome.as_ref().is_none_or(|o| o.format_error.is_some());
                        let local =
                            result.outcome.as_ref().filter(|_| !unreadable).map_or(FORMAT_PENALTY, |o| reward.of(o));
                        locals.push(local);
                        reports.push(tool_shown(text, &result.report));
                        tool_outputs.push((outputs.len(), e));
                        outputs.push(Output {
                            episode: e,
                            turn,
                            role: TOOL,
                            messages: messages.clone(),
                            reward: local,
                            penalty: if unreadable { FORMAT_PENALTY } else { 0.0 },
                            solved: false,
                        });
                    }
                    shown[e] = Some(reports.swap_remove(best_branch(&locals)));
                }
            }
            // The plan role: each branch applied to a copy; the best one is executed.
            let messages: Vec<Vec<Message>> = active
                .iter()
                .map(|&e| self.prompts.plan(&episodes[e].state, &episodes[e].history, turn, shown[e].as_deref()))
                .collect();
            let texts = generate(PLAN, turn, &messages, branches)?;
            check_counts(&texts, active.len(), branches)?;
            let mut executed = vec![0.0; episodes.len()];
            for ((&e, messages), texts) in active.iter().zip(messages).zip(texts) {
                let mut results: Vec<(Instance, Outcome)> = Vec::with_capacity(branches);
                for text in &texts {
                    let mut copy = episodes[e].state.clone();
                    let outcome = copy.apply(text);
                    stats.plans += 1;
                    stats.applied += outcome.applied;
                    stats.invalid += outcome.invalid;
                    stats.unreadable += usize::from(outcome.format_error.is_some());
                    outputs.push(Output {
                        episode: e,
                        turn,
                        role: PLAN,
                        messages: messages.clone(),
                        reward: mixed_reward(self.config.alpha, reward.of(&outcome), 0.0),
                        penalty: if outcome.format_error.is_some() { FORMAT_PENALTY } else { 0.0 },
                        solved: outcome.solved,
                    });
                    results.push((copy, outcome));
                }
                let rewards: Vec<f64> = results.iter().map(|(_, o)| reward.of(o)).collect();
                let best = best_branch(&rewards);
                let (state, outcome) = results.swap_remove(best);
                let line = executed_line(turn, &state, &outcome);
                let ep = &mut episodes[e];
                ep.state = state;
                ep.history.push(line);
                ep.turns += 1;
                executed[e] = reward.of(&outcome);
            }
            // A tool branch shares the team's executed reward of its turn.
            for (i, e) in tool_outputs {
                outputs[i].reward = mixed_reward(self.config.alpha, executed[e], outputs[i].reward);
            }
        }
        stats.solved = episodes.iter().filter(|e| e.state.solved()).count();
        stats.turns = episodes.iter().map(|e| e.turns).sum();
        Ok((outputs, stats))
    }
}

/// Every prompt got its `branches` outputs (the branch bookkeeping relies on it).
fn check_counts(texts: &[Vec<String>], prompts: usize, branches: usize) -> Result<()> {
    if texts.len() != prompts || texts.iter().any(|t| t.len() != branches) {
        return Err(Error::Internal(format!("expected {branches} outputs for each of {prompts} prompts")));
    }
    Ok(())
}

/// `messages` in `policy`'s chat template; a prompt longer than `max_tokens` is an error.
fn encode<B: Backend>(policy: &Policy<B>, role: usize, messages: &[Message], max_tokens: usize) -> Result<Vec<u32>> {
    encode_within(policy, ROLES[role], messages, max_tokens, "")
}

/// A generated output, with the prompt ids and the policy (and weights version) it came from.
struct Generated {
    prompt_ids: Vec<u32>,
    response: Response,
    policy: usize,
    version: u64,
}

impl<B: Backend> Workload<B> for Turns {
    fn name(&self) -> &str {
        "turns"
    }

    fn validation_key(&self) -> &'static str {
        "val/success"
    }

    fn rollout(&self, policies: &[Policy<B>], prompts: &[TaskPrompt], settings: &RolloutSettings) -> Result<Rollout> {
        let k = settings.group_size;
        let (per_task, branches) = match self.rollout.grouping {
            Grouping::TurnWise => (1, k),
            Grouping::Trajectory => (k, 1),
        };
        let mut episodes = Vec::with_capacity(prompts.len() * per_task);
        for (p, prompt) in prompts.iter().enumerate() {
            let state = instance(prompt)?;
            episodes.extend((0..per_task).map(|_| Episode {
                prompt: p,
                state: state.clone(),
                history: vec![],
                turns: 0,
            }));
        }
        let mut timings = vec![RolloutTimings::default(); settings.policies];
        let mut drawn: Vec<Generated> = Vec::new();
        let mut generate =
            |role: usize, turn: usize, messages: &[Vec<Message>], branches: usize| -> Result<Vec<Vec<String>>> {
                let policy = held(policies, self.players[role])?;
                let _span =
                tracing::info_span!("rollout", policy = %policy.name, role = ROLES[role], turn, step = settings.step)
                    .entered();
                let ids: Vec<Vec<u32>> = messages
                    .iter()
                    .map(|m| encode(policy, role, m, settings.max_prompt_tokens))
                    .collect::<Result<_>>()?;
                let seed = |c: usize| {
                    mix_seed(&[settings.run_seed, settings.step, GENERATE_STREAM, turn as u64, role as u64, c as u64])
                };
                let mut outs = sample_in_chunks(policy, &ids, settings, branches, seed, &mut timings[policy.index])?;
                // Outputs in episode then branch order, as `play` reads them.
                outs.sort_by_key(|o| (o.prompt, o.sample_index));
                let mut texts = vec![Vec::with_capacity(branches); ids.len()];
                for out in outs {
                    texts[out.prompt].push(out.response.text.clone());
                    drawn.push(Generated {
                        prompt_ids: ids[out.prompt].clone(),
                        response: out.response,
                        policy: policy.index,
                        version: policy.version,
                    });
                }
                Ok(texts)
            };
        let (outputs, stats) = self.play(&mut episodes, branches, &mut generate)?;
        if outputs.len() != drawn.len() {
            return Err(Error::Internal(format!("{} outputs for {} generations", outputs.len(), drawn.len())));
        }
        let mut counters = vec![0usize; prompts.len()];
        let mut samples = Vec::with_capacity(outputs.len());
        for (o, d) in outputs.into_iter().zip(drawn) {
            let p = episodes[o.episode].prompt;
            let task = format!("{}@{p}", prompts[p].id);
            let prompt_text: String = o.messages.iter().map(|m| m.content.as_str()).collect();
            let group = group_key(
                self.rollout.grouping,
                &Decision { task: &task, role: ROLES[o.role], turn: o.turn as u32, prompt: &prompt_text },
            );
            let sample_index = counters[p];
            counters[p] += 1;
            samples.push(Sample {
                role: ROLES[o.role].to_string(),
                group,
                turn: o.turn as u32,
                sample_index,
                // Immediate rewards: the rollout already knows them (AT-GRPO §5.2).
                reward: Some(o.reward),
                penalty: o.penalty,
                score: (o.role == PLAN).then_some(f64::from(u8::from(o.solved))),
                ..Sample::new(d.policy, d.version, p, o.messages, d.prompt_ids, d.response)
            });
        }
        Ok(Rollout { samples, timings, metrics: stats.metrics() })
    }

    /// Rewards are immediate and set by the rollout; this checks that none is missing.
    fn assign_rewards(&self, samples: &mut [Sample], _prompts: &[TaskPrompt]) -> Result<()> {
        match samples.iter().position(|s| s.reward.is_none()) {
            Some(i) => Err(Error::Internal(format!("turn-wise sample {i} has no reward"))),
            None => Ok(()),
        }
    }

    /// Each role's reward and the sizes of the groups actually formed (the episodes' outcomes
    /// come with the rollout).
    fn metrics(&self, samples: &[Sample], _prompts: &[TaskPrompt]) -> Metrics {
        let mean = |xs: &[f64]| if xs.is_empty() { 0.0 } else { xs.iter().sum::<f64>() / xs.len() as f64 };
        let mut m = Metrics::new();
        m.insert("turns/outputs".into(), samples.len() as f64);
        let mut groups: std::collections::HashMap<&crate::sample::GroupKey, usize> = Default::default();
        for x in samples {
            *groups.entry(&x.group).or_default() += 1;
        }
        m.insert("turns/group_size".into(), EpisodeStats::rate(samples.len(), groups.len()));
        m.insert(
            "turns/singleton_groups".into(),
            EpisodeStats::rate(groups.values().filter(|&&n| n == 1).count(), groups.len()),
        );
        for role in ROLES {
            let rewards: Vec<f64> = samples.iter().filter(|x| x.role == role).map(|x| x.reward()).collect();
            if !rewards.is_empty() {
                m.insert(format!("turns/{role}/reward"), mean(&rewards));
            }
        }
        m
    }

    /// The team plays every held-out instance greedily, one branch per decision.
    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>> {
        let mut episodes: Vec<Episode> = self
            .task
            .validation()
            .iter()
            .enumerate()
            .map(|(p, prompt)| Ok(Episode { prompt: p, state: instance(prompt)?, history: vec![], turns: 0 }))
            .collect::<Result<_>>()?;
        let mut generate =
            |role: usize, _turn: usize, messages: &[Vec<Message>], _branches: usize| -> Result<Vec<Vec<String>>> {
                let policy = held(policies, self.players[role])?;
                let ids: Vec<Vec<u32>> = messages
                    .iter()
                    .map(|m| encode(policy, role, m, settings.max_prompt_tokens))
                    .collect::<Result<_>>()?;
                let texts = greedy_responses(
                    &policy.inference_model(),
                    &policy.tokenizer,
                    &policy.eos_token_ids,
                    &ids,
                    settings.max_new_tokens,
                    settings.batch_prompts,
                )?;
                Ok(texts.into_iter().map(|t| vec![t]).collect())
            };
        let (_, s) = self.play(&mut episodes, 1, &mut generate)?;
        let team = Metrics::from([
            ("val/success".to_string(), EpisodeStats::rate(s.solved, s.episodes)),
            ("val/mean_turns".to_string(), EpisodeStats::rate(s.turns, s.episodes)),
            ("val/invalid_action_rate".to_string(), EpisodeStats::rate(s.invalid, s.applied)),
            ("val/unreadable_rate".to_string(), EpisodeStats::rate(s.unreadable, s.plans)),
            ("val/tool_error_rate".to_string(), EpisodeStats::rate(s.tool_errors, s.tool_runs)),
        ]);
        Ok(vec![team; settings.policies])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Split;

    /// The step reward pays for progress; the success reward only for arriving; both give an
    /// unreadable answer the format penalty.
    #[test]
    fn a_branch_earns_its_steps_or_only_its_success() {
        let start = Instance::generate(EnvKind::PlanPath, Split::Train, 0);
        let solution = start.solution().unwrap();
        let first_move: String = solution.chars().take_while(|&c| c != ',').collect::<String>() + "]";
        let (mut solved, mut partial, mut unreadable) = (start.clone(), start.clone(), start);
        let solved = solved.apply(&format!("#### {solution}"));
        let partial = partial.apply(&format!("#### {first_move}"));
        let unreadable = unreadable.apply("no list here");
        assert!(solved.solved && !partial.solved && partial.format_error.is_none(), "{first_move}");
        assert_eq!(TurnReward::Steps.of(&solved), solved.reward);
        assert!(TurnReward::Steps.of(&partial) > 0.5, "a move toward the goal earns about 1");
        assert_eq!(TurnReward::Success.of(&solved), 1.0);
        assert_eq!(TurnReward::Success.of(&partial), 0.0);
        for r in [TurnReward::Steps, TurnReward::Success] {
            assert_eq!(r.of(&unreadable), FORMAT_PENALTY);
        }
        let cfg: TurnsConfig = toml::from_str("reward = \"success\"").unwrap();
        assert_eq!(cfg.reward, TurnReward::Success);
        assert!(toml::from_str::<TurnsConfig>("reward = \"arrival\"").is_err());
    }
}
