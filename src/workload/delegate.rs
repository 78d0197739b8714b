//! The delegation workload (`workload.kind = "delegate"`, M-GRPO, docs/algorithms.md §4): a
//! main agent answers questions over turns, delegating research to a sub-agent that searches
//! the QA task's passages (`src/delegate/`).
//!
//! Each question gets K episodes (`algo.group_size`). An episode's main conversation is one
//! sample (role `main`, group: the question's K main samples); each delegation's sub-agent
//! conversation is one sample (role `sub`), linked to its main sample by `parent`. The
//! sub-agent's group is the question's sub-trajectories after trajectory alignment to `d` per
//! episode: a duplicate is a second copy of the sample (it counts in the statistics and the
//! loss), a dropped one stays for the record with `train = false`, an episode that never
//! delegated adds nothing. Rewards come from the main agent's answer (exact match, or F1 over
//! a threshold) and each conversation's format (`rl::mgrpo`).

use std::sync::Arc;

use burn::tensor::backend::Backend;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::roles::RoleMap;
use super::{Rollout, RolloutSettings, RolloutTimings, ValidationSettings, Workload};
use crate::cluster::Bus;
use crate::delegate::conversation::{Conversation, Speech, State};
use crate::delegate::judge::{Judge, JudgeKind, Report};
use crate::delegate::relay::{self, Line, Relay};
use crate::delegate::team::{self, Episode, Instructions, Limits, Mode, Tools, Voice};
use crate::error::{Error, Result};
use crate::generate::{FinishReason, GenerateRequest, SamplingParams};
use crate::policy::{Policy, held};
use crate::rl::mgrpo::{MainOutcome, MgrpoSettings, SubAgent, SubReward, align, copies, question_seed};
use crate::sample::{GroupKey, Response, Sample};
use crate::search::metric::score;
use crate::search::task::{Passages, QaTask, answers, question_text};
use crate::stable_hash::mix_seed;
use crate::task::{Task, TaskPrompt};
use crate::train::metrics::Metrics;

/// The roles, in `[[roles]]` names.
pub const ROLES: [&str; 2] = ["main", "sub"];
const MAIN: usize = 0;
const SUB: usize = 1;

/// `[workload.delegate]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DelegateConfig {
    /// The main agent's turns per episode.
    pub main_turns: usize,
    /// A sub-agent's turns per delegation.
    pub sub_turns: usize,
    /// Delegations per episode.
    pub calls: usize,
    /// Passages a search returns.
    pub search_k: usize,
    /// Tokens of one conversation, prompt and turns (what an update's sequence holds).
    pub max_tokens: usize,
    /// A main answer is correct at this F1 or above; unset: exact match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub f1_threshold: Option<f64>,
    /// What the agents' system prompts say: `"full"` (each tool's call format, for models new
    /// to the protocol) or `"brief"` (one sentence, for agents pre-trained on its turns).
    pub instructions: Instructions,
    /// Rewards and trajectory alignment (`[workload.delegate.mgrpo]`; ε is `algo.adv_epsilon`).
    pub mgrpo: MgrpoSettings,
    /// Training questions of a pilot that sets the alignment target d before the first step
    /// (§4.3): the team plays each K times with the initial policies, and d is the 99th
    /// percentile of delegations per episode, kept for the whole run. 0: `mgrpo.align` as
    /// given.
    pub pilot_questions: usize,
    /// The judge of the sub-agent reward's r_expert term (§4.2, weight `mgrpo.sub_weights[2]`):
    /// `"none"` (the term is 0) or `"grounded"` (the share of its findings it read in the
    /// tools' replies).
    pub judge: JudgeKind,
}

impl Default for DelegateConfig {
    fn default() -> Self {
        DelegateConfig {
            main_turns: 4,
            sub_turns: 4,
            calls: 3,
            search_k: 3,
            max_tokens: 1024,
            f1_threshold: None,
            instructions: Instructions::Full,
            mgrpo: MgrpoSettings::default(),
            pilot_questions: 0,
            judge: JudgeKind::None,
        }
    }
}

impl DelegateConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::config("training config", format!("workload.delegate.{m}")));
        let counts = [
            ("main_turns", self.main_turns),
            ("sub_turns", self.sub_turns),
            ("calls", self.calls),
            ("search_k", self.search_k),
        ];
        for (key, v) in counts {
            if v == 0 {
                return bad(format!("{key}: at least 1"));
            }
        }
        if self.max_tokens < 16 {
            return bad(format!("max_tokens: {} cannot hold a prompt and a turn", self.max_tokens));
        }
        if let Some(t) = self.f1_threshold
            && !(t > 0.0 && t <= 1.0)
        {
            return bad(format!("f1_threshold: {t} is not in (0, 1]"));
        }
        if self.judge != JudgeKind::None && self.mgrpo.sub_reward == SubReward::Released {
            return bad(format!(
                "judge: {:?} scores the paper's r_expert term; the released reward table (mgrpo.sub_reward = \
                 \"released\") has none. Set mgrpo.sub_reward = \"paper\" or judge = \"none\"",
                self.judge
            ));
        }
        if self.mgrpo.epsilon != MgrpoSettings::default().epsilon {
            return bad(
                "mgrpo.epsilon: a run's ε is algo.adv_epsilon; this one is for `hacpo rl inspect` batches".into()
            );
        }
        self.mgrpo.validate().map_err(|e| Error::config("training config", format!("workload.delegate.mgrpo.{e}")))
    }

    fn limits(&self, turn_tokens: usize) -> Limits {
        Limits {
            main_turns: self.main_turns,
            sub_turns: self.sub_turns,
            calls: self.calls,
            max_tokens: self.max_tokens,
            turn_tokens,
        }
    }

    /// 1 when `prediction` answers the question, else 0.
    fn correct(&self, prediction: &str, gold: &[String]) -> f64 {
        let s = score(prediction, gold);
        let right = match self.f1_threshold {
            Some(t) => s.f1 >= t,
            None => s.em >= 1.0,
        };
        f64::from(u8::from(right))
    }
}

/// The policies that play main and sub (the main agent's for both when the sub is absent).
pub fn players(roles: &RoleMap, sub: SubAgent) -> Result<[usize; 2]> {
    let needed: &[usize] = if sub == SubAgent::None { &[MAIN] } else { &[MAIN, SUB] };
    let p = roles.players("delegate", &ROLES, needed)?;
    let main = p[MAIN].expect("the main role is needed");
    Ok([main, p[SUB].unwrap_or(main)])
}

/// The delegation workload.
pub struct Delegate {
    config: DelegateConfig,
    players: [usize; 2],
    sub: SubAgent,
    task: Arc<dyn Task>,
    passages: Arc<Passages>,
    /// The alignment target a pilot settled (`pilot_questions`), once it has run or a
    /// checkpoint brought it back.
    piloted: std::sync::OnceLock<usize>,
    judge: Option<Box<dyn Judge>>,
}

/// What a checkpoint keeps of the workload.
#[derive(Serialize, Deserialize)]
struct PilotState {
    align: usize,
}

impl Delegate {
    pub fn new(config: &DelegateConfig, roles: &RoleMap, task: Arc<dyn Task>, sub: SubAgent) -> Result<Self> {
        config.validate()?;
        let any: &dyn std::any::Any = task.as_ref();
        let passages = any.downcast_ref::<QaTask>().map(QaTask::passages).ok_or_else(|| {
            Error::config("training config", "the delegate workload needs a task with passages: task.kind = \"qa\"")
        })?;
        let piloted = std::sync::OnceLock::new();
        let judge = config.judge.build();
        Ok(Delegate { config: config.clone(), players: players(roles, sub)?, sub, task, passages, piloted, judge })
    }

    /// Sub-trajectory slots per episode: the pilot's d, else `mgrpo.align`.
    fn align_target(&self) -> usize {
        self.piloted.get().copied().unwrap_or(self.config.mgrpo.align)
    }

    /// Runs the pilot (`pilot_questions`) unless it has run: the first training questions, K
    /// episodes each, sampled as a step's with the policies as they are (before the first
    /// update), over the bus like a step when the team is split, so every process settles the
    /// same d.
    /// Returns the seconds it took, when it ran.
    fn pilot<B: Backend>(&self, policies: &[Policy<B>], settings: &RolloutSettings) -> Result<Option<f64>> {
        let n = self.config.pilot_questions.min(self.task.train().len());
        if n == 0 || self.sub == SubAgent::None || self.piloted.get().is_some() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let k = settings.group_size;
        let questions = asked(&self.task.train()[..n], k);
        let progress = crate::progress::Progress::new(format!("delegation pilot ({n} questions × {k})"), 0);
        let line = BusLine { bus: settings.bus, step: 0, play: "pilot" };
        let seed = mix_seed(&[settings.run_seed, 0x9170]);
        let mut timings = vec![RolloutTimings::default(); settings.policies];
        let batch = settings.batch_prompts * k;
        let episodes = self.play(policies, &questions, &settings.sampling, batch, seed, &line, &mut timings)?;
        progress.finish();
        let calls: Vec<usize> = episodes.iter().map(|e| e.subs.len()).collect();
        let d = crate::rl::mgrpo::pilot_align(&calls, 0.99);
        eprintln!(
            "  delegation pilot: {:.2} delegations per episode, at most {}; sub-trajectories aligned to d = {d} \
             per episode (the 99th percentile)",
            calls.iter().sum::<usize>() as f64 / calls.len().max(1) as f64,
            calls.iter().max().copied().unwrap_or(0)
        );
        let _ = self.piloted.set(d);
        Ok(Some(started.elapsed().as_secs_f64()))
    }

    /// The judge's score of a sub-agent sample's research (`None` without a judge).
    fn expert(&self, sample: &Sample) -> Option<f64> {
        let judge = self.judge.as_ref()?;
        Some(Report::of(&sample.messages, &sample.text).map_or(0.0, |r| judge.score(&r)))
    }

    fn mode(&self) -> Mode {
        if self.sub == SubAgent::None { Mode::Single } else { Mode::Delegate }
    }

    /// Episodes for `questions`, each agent sampling with `sampling` (greedy when its
    /// temperature is 0); generation time per policy added to `timings`. When another process
    /// trains one of the two agents, this process plays its own agent's side and the two meet
    /// over `line` ([`crate::delegate::relay`]): the episodes are the one-process episodes, the
    /// other side's conversations known by how they ended.
    #[allow(clippy::too_many_arguments)]
    fn play<B: Backend>(
        &self,
        policies: &[Policy<B>],
        questions: &[&str],
        sampling: &SamplingParams,
        batch: usize,
        seed: u64,
        line: &BusLine<'_>,
        timings: &mut [RolloutTimings],
    ) -> Result<Vec<Episode>> {
        let voice = |k: usize| held(policies, k).ok().map(|p| PolicyVoice::new(p, sampling, batch));
        let main = voice(self.players[MAIN]);
        // One policy playing both roles speaks with one copy of its weights.
        let shared = self.players[SUB] == self.players[MAIN];
        let own_sub = if shared { None } else { voice(self.players[SUB]) };
        let sub = if shared { main.as_ref() } else { own_sub.as_ref() };
        let tools =
            Tools { passages: &self.passages, search_k: self.config.search_k, instructions: self.config.instructions };
        let limits = self.config.limits(sampling.max_new_tokens);
        let episodes = match (&main, sub) {
            (Some(main), Some(sub)) => team::play(main, sub, &tools, questions, self.mode(), &limits, seed)?,
            (Some(main), None) => {
                let mut relay = Relay::new(line);
                let mains = team::lead(main, &mut relay, &tools, questions, self.mode(), &limits, seed)?;
                relay.finish(mains)?
            }
            (None, Some(sub)) => relay::serve(sub, &tools, &limits, questions.len(), seed, line)?,
            (None, None) => return Err(Error::Internal("this process plays neither agent of the team".into())),
        };
        for voice in main.iter().chain(own_sub.as_ref()) {
            let t = &mut timings[voice.policy.index];
            t.generate += voice.spent.get().0;
            t.generated_tokens += voice.spent.get().1;
        }
        Ok(episodes)
    }

    /// The samples of prompt `p`'s K episodes: the main conversations first, then the aligned
    /// sub-agent conversations; and the alignment's duplicated, dropped and masked slots.
    fn samples(
        &self,
        policies: [Player; 2],
        p: usize,
        prompt: &TaskPrompt,
        episodes: &[Episode],
        seed: u64,
    ) -> (Vec<Sample>, [usize; 3]) {
        let gold = answers(prompt);
        let mut out: Vec<Sample> = vec![];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(question_seed(seed, &format!("{}#{p}", prompt.id)));
        let k = episodes.len();
        // Each agent's group: the question's main conversations, its aligned sub conversations.
        let group = |role: usize| GroupKey::new(&[&prompt.id, &p.to_string(), ROLES[role]]);
        for (i, e) in episodes.iter().enumerate() {
            let correct = match &e.main.state {
                State::Done(answer) => self.config.correct(answer, &gold),
                _ => 0.0,
            };
            out.push(Sample {
                score: Some(correct),
                ..conversation_sample(policies[MAIN], &e.main, ROLES[MAIN], group(MAIN), p, i)
            });
        }
        let mut next_index = k;
        let mut counts = [0; 3];
        for (i, e) in episodes.iter().enumerate() {
            let slots = align(e.subs.len(), self.align_target(), &mut rng);
            counts[2] += slots.iter().filter(|s| **s == crate::rl::mgrpo::Slot::Masked).count();
            for (sub, c) in e.subs.iter().zip(copies(&slots, e.subs.len())) {
                counts[0] += c.saturating_sub(1);
                counts[1] += usize::from(c == 0);
                let base = conversation_sample(policies[SUB], sub, ROLES[SUB], group(SUB), p, 0);
                // A dropped sub-trajectory stays for the record, out of the loss.
                for _ in 0..c.max(1) {
                    out.push(Sample {
                        parent: Some(i),
                        sample_index: next_index,
                        train: c > 0 && self.sub == SubAgent::Trained,
                        ..base.clone()
                    });
                    next_index += 1;
                }
            }
        }
        (out, counts)
    }
}

/// Each prompt's question, `k` times: one per episode.
fn asked(prompts: &[TaskPrompt], k: usize) -> Vec<&str> {
    prompts.iter().flat_map(|p| std::iter::repeat_n(question_text(p), k)).collect()
}

/// Who a sample is of: the policy's index, its weights version and its first EOS id.
type Player = (usize, u64, u32);

/// The team's two sides over the run's bus: each round of a play is a phase of its step,
/// named after the play (a step's rollout, or the held-out play after it), and the other
/// side's part is the other host's.
struct BusLine<'a> {
    bus: &'a dyn Bus,
    step: u64,
    play: &'static str,
}

impl Line for BusLine<'_> {
    fn round(&self, phase: &str, mine: Vec<u8>) -> Result<Vec<u8>> {
        let me = self.bus.hosts().iter().position(|h| h == self.bus.host());
        let parts = self.bus.all_gather(self.step, &format!("delegate-{}-{phase}", self.play), mine)?;
        let mut others = parts.into_iter().enumerate().filter(|(i, _)| Some(*i) != me);
        match (others.next(), others.next()) {
            (Some((_, theirs)), None) => Ok(theirs),
            _ => Err(Error::Internal("a team split between processes has exactly two hosts".into())),
        }
    }
}

/// A conversation as a sample of `player` in `role`: its token sequence, loss mask and
/// messages; penalty −1 when it ended without a result (a format failure or a limit). A
/// conversation that ended before its first turn (its prompt alone too long) is the EOS.
fn conversation_sample(
    (policy, version, eos): Player,
    c: &Conversation,
    role: &str,
    group: GroupKey,
    prompt: usize,
    sample_index: usize,
) -> Sample {
    let (text, penalty) = match &c.state {
        State::Done(result) => (result.clone(), 0.0),
        State::Failed(_) | State::Open => (c.messages.last().map(|m| m.content.clone()).unwrap_or_default(), -1.0),
    };
    let (ids, loss_mask) =
        if c.response_ids.is_empty() { (vec![eos], vec![]) } else { (c.response_ids.clone(), c.loss_mask.clone()) };
    let response = Response { ids, text, finish_reason: FinishReason::Stop };
    Sample {
        role: role.into(),
        group,
        turn: c.turns as u32,
        sample_index,
        loss_mask,
        penalty,
        ..Sample::new(policy, version, prompt, c.messages.clone(), c.prompt_ids.clone(), response)
    }
}

/// A policy generating turns: one batched generation per call, stopped at an action's closing
/// tag or the EOS.
struct PolicyVoice<'a, B: Backend> {
    policy: &'a Policy<B>,
    model: crate::model::CausalLm<B>,
    sampling: SamplingParams,
    batch: usize,
    stops: Vec<String>,
    /// Seconds and tokens generated so far.
    spent: std::cell::Cell<(f64, usize)>,
}

impl<'a, B: Backend> PolicyVoice<'a, B> {
    fn new(policy: &'a Policy<B>, sampling: &SamplingParams, batch: usize) -> Self {
        PolicyVoice {
            policy,
            model: policy.inference_model(),
            sampling: sampling.clone(),
            batch: batch.max(1),
            stops: team::STOP_STRINGS.iter().map(|s| s.to_string()).collect(),
            spent: std::cell::Cell::new((0.0, 0)),
        }
    }
}

impl<B: Backend> Voice for PolicyVoice<'_, B> {
    fn speech(&self) -> Speech<'_> {
        Speech {
            tokenizer: &self.policy.tokenizer,
            chat_kwargs: &self.policy.chat_kwargs,
            eos_token_ids: &self.policy.eos_token_ids,
        }
    }

    fn turns(&self, sequences: &[Vec<u32>], seed: u64) -> Result<Vec<Vec<u32>>> {
        let mut out = vec![vec![]; sequences.len()];
        for (c, chunk) in sequences.chunks(self.batch).enumerate() {
            let params = SamplingParams { seed: mix_seed(&[seed, c as u64]), ..self.sampling.clone() };
            let mut req = GenerateRequest::new(chunk, params);
            req.stop_token_ids = self.policy.eos_token_ids.clone();
            req.stop_strings = self.stops.clone();
            req.tokenizer = Some(&self.policy.tokenizer);
            let started = std::time::Instant::now();
            let (done, stats) = crate::generate::generate(&self.model, &req)?;
            let (s, t) = self.spent.get();
            self.spent.set((s + started.elapsed().as_secs_f64(), t + stats.generated_tokens));
            for d in done {
                out[c * self.batch + d.prompt_index] = d.token_ids;
            }
        }
        Ok(out)
    }
}

impl<B: Backend> Workload<B> for Delegate {
    fn name(&self) -> &str {
        "delegate"
    }

    fn validation_key(&self) -> &'static str {
        "val/f1"
    }

    fn rollout(&self, policies: &[Policy<B>], prompts: &[TaskPrompt], settings: &RolloutSettings) -> Result<Rollout> {
        let pilot_s = self.pilot(policies, settings)?;
        let k = settings.group_size;
        let questions = asked(prompts, k);
        let mut timings = vec![RolloutTimings::default(); settings.policies];
        let seed = mix_seed(&[settings.run_seed, settings.step, 0xDE1E]);
        let line = BusLine { bus: settings.bus, step: settings.step, play: "rollout" };
        let batch = settings.batch_prompts * k;
        let episodes = self.play(policies, &questions, &settings.sampling, batch, seed, &line, &mut timings)?;
        // Another process's agent: its samples here stand in for that process's (what this
        // side's rewards read), and the gather replaces them with the real ones.
        let player = |k: usize| match held(policies, k) {
            Ok(p) => Ok((p.index, p.version, p.eos()?)),
            Err(_) => Ok((k, 0, 0)),
        };
        let players = [player(self.players[MAIN])?, player(self.players[SUB])?];
        let (mut samples, mut alignment) = (vec![], [0; 3]);
        for (p, (prompt, group)) in prompts.iter().zip(episodes.chunks(k)).enumerate() {
            let first = samples.len();
            let (mut mine, counts) = self.samples(players, p, prompt, group, seed);
            // Parent links index the step's samples.
            for s in &mut mine {
                s.parent = s.parent.map(|i| first + i);
            }
            samples.extend(mine);
            alignment.iter_mut().zip(counts).for_each(|(a, c)| *a += c);
        }
        let mut metrics = episode_metrics(&episodes, prompts.len(), alignment);
        metrics.insert("delegate/align_target".into(), self.align_target() as f64);
        if let Some(seconds) = pilot_s {
            // Inside the first step's time: said apart, so that step's figures can be read.
            metrics.insert("timing_s/pilot".into(), seconds);
        }
        Ok(Rollout { samples, timings, metrics })
    }

    fn assign_rewards(&self, samples: &mut [Sample], _prompts: &[TaskPrompt]) -> Result<()> {
        let outcome = |s: &Sample| MainOutcome { format_ok: s.penalty == 0.0, correct: s.score.unwrap_or(0.0) };
        let mains: Vec<Option<MainOutcome>> =
            samples.iter().map(|s| (s.role == ROLES[MAIN]).then(|| outcome(s))).collect();
        let r = &self.config.mgrpo;
        for s in samples.iter_mut() {
            s.reward = Some(match s.parent {
                None => r.main_reward(s.penalty == 0.0, s.score.unwrap_or(0.0)),
                Some(parent) => {
                    let main = mains.get(parent).copied().flatten().ok_or_else(|| {
                        Error::Internal(format!("a sub-agent sample's parent {parent} is not a main sample"))
                    })?;
                    r.sub_reward(s.penalty == 0.0, &main, self.expert(s))
                }
            });
        }
        Ok(())
    }

    fn metrics(&self, samples: &[Sample], prompts: &[TaskPrompt]) -> Metrics {
        let mains: Vec<&Sample> = samples.iter().filter(|s| s.role == ROLES[MAIN]).collect();
        let n = mains.len().max(1) as f64;
        let mut m = Metrics::new();
        let scores: Vec<_> = mains
            .iter()
            .map(|s| if s.penalty == 0.0 { score(&s.text, &answers(&prompts[s.prompt])) } else { Default::default() })
            .collect();
        m.insert("delegate/f1".into(), scores.iter().map(|s| s.f1).sum::<f64>() / n);
        m.insert("delegate/em".into(), scores.iter().map(|s| s.em).sum::<f64>() / n);
        if self.judge.is_some() {
            // Over the step's sub-agent samples that reported (aligned copies, and dropped ones
            // for the record); a failed one has no findings (its text is its last turn).
            let judged: Vec<f64> = samples
                .iter()
                .filter(|s| s.role == ROLES[SUB] && s.penalty == 0.0)
                .filter_map(|s| self.expert(s))
                .collect();
            m.insert("delegate/judge".into(), judged.iter().sum::<f64>() / judged.len().max(1) as f64);
        }
        m
    }

    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>> {
        let held_out = self.task.validation();
        let questions: Vec<&str> = held_out.iter().map(question_text).collect();
        let mut timings = vec![RolloutTimings::default(); settings.policies];
        let greedy = SamplingParams::greedy(settings.max_new_tokens);
        let line = BusLine { bus: settings.bus, step: settings.step, play: "validation" };
        let episodes = self.play(policies, &questions, &greedy, settings.batch_prompts, 0, &line, &mut timings)?;
        let n = held_out.len().max(1) as f64;
        let (mut f1, mut em) = (0.0, 0.0);
        for (e, q) in episodes.iter().zip(held_out) {
            if let State::Done(answer) = &e.main.state {
                let s = score(answer, &answers(q));
                (f1, em) = (f1 + s.f1, em + s.em);
            }
        }
        let calls = episodes.iter().map(|e| e.subs.len()).sum::<usize>() as f64 / n;
        let team = Metrics::from([
            ("val/f1".to_string(), f1 / n),
            ("val/em".to_string(), em / n),
            ("val/calls".to_string(), calls),
        ]);
        Ok(vec![team; settings.policies])
    }

    fn state(&self) -> serde_json::Value {
        match self.piloted.get() {
            Some(&align) => serde_json::to_value(PilotState { align }).unwrap_or_default(),
            None => serde_json::Value::Null,
        }
    }

    fn restore(&self, state: serde_json::Value) -> Result<()> {
        if state.is_null() {
            return Ok(());
        }
        let PilotState { align } = serde_json::from_value(state).map_err(|e| {
            Error::Internal(format!("the checkpoint's delegation pilot cannot be read ({e}): is it the same hacpo?"))
        })?;
        let _ = self.piloted.set(align.max(1));
        Ok(())
    }
}

/// What the episodes did: calls per episode, format failures, and the alignment's duplicated,
/// dropped and masked slots per question.
fn episode_metrics(episodes: &[Episode], questions: usize, [duplicates, dropped, masked]: [usize; 3]) -> Metrics {
    let n = episodes.len().max(1) as f64;
    let q = questions.max(1) as f64;
    let subs: Vec<&Conversation> = episodes.iter().flat_map(|e| &e.subs).collect();
    let failed = |c: &Conversation| !matches!(c.state, State::Done(_));
    Metrics::from([
        ("delegate/calls_per_episode".to_string(), subs.len() as f64 / n),
        ("delegate/main_format_fail".to_string(), episodes.iter().filter(|e| failed(&e.main)).count() as f64 / n),
        (
            "delegate/sub_format_fail".to_string(),
            subs.iter().filter(|c| failed(c)).count() as f64 / subs.len().max(1) as f64,
        ),
        ("delegate/align_duplicates".to_string(), duplicates as f64 / q),
        ("delegate/align_dropped".to_string(), dropped as f64 / q),
        ("delegate/align_masked".to_string(), masked as f64 / q),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::algos::mgrpo::group_population_advantages;
    use crate::rl::mgrpo::{Rollout as Outcomes, SubOutcome, question};
    use crate::rl::{PoolSample, Routing};
    use crate::search::corpus::{Document, Question};
    use crate::tokenizer::Message;

    fn conversation(state: State) -> Conversation {
        Conversation {
            messages: vec![],
            prompt_ids: vec![1, 2],
            response_ids: vec![3, 4, 5],
            loss_mask: vec![true, false, true],
            turns: 2,
            state,
        }
    }

    /// With the grounded judge, a sub-agent's reward adds 0.5 × the share of its findings it
    /// read (the paper's β3), on top of 0.1 for format and 0.4 × the main agent's correctness;
    /// the released reward table has no judge term and refuses one.
    #[test]
    fn the_grounded_judge_scores_the_sub_agent_reward_term() {
        let q = Question { id: "q1".into(), question: "Who?".into(), answers: vec!["Ann Lee".into()] };
        let doc = Document { id: "d".into(), title: "t".into(), text: "x".into() };
        let task: Arc<dyn Task> = Arc::new(QaTask::new(vec![q], vec![], vec![doc]).unwrap());
        let roles = RoleMap { policies: vec!["p".into()], roles: vec![] };
        let mgrpo = MgrpoSettings { align: 1, ..Default::default() };
        let config = DelegateConfig { judge: JudgeKind::Grounded, mgrpo, ..Default::default() };
        let workload = Delegate::new(&config, &roles, task.clone(), SubAgent::Trained).unwrap();
        let research = |findings: &str| {
            let mut c = conversation(State::Done(findings.into()));
            c.messages = vec![
                Message::system("Research the task."),
                Message::user("Who wrote it?"),
                Message::assistant("<tool_call>…</tool_call>"),
                Message::user(crate::delegate::protocol::tool_response("It was written by Ann Lee.")),
                Message::assistant(format!("<result>{findings}</result>")),
            ];
            c
        };
        let episodes = vec![
            Episode { main: conversation(State::Done("Ann Lee".into())), subs: vec![research("Ann Lee")] },
            Episode { main: conversation(State::Done("Ann Lee".into())), subs: vec![research("Bob Stone")] },
            Episode { main: conversation(State::Done("Bob".into())), subs: vec![research("written by Ann")] },
        ];
        let (mut samples, _) = workload.samples([(0, 0, 7), (0, 0, 7)], 0, &task.train()[0], &episodes, 1);
        <Delegate as Workload<crate::backend::Cpu>>::assign_rewards(&workload, &mut samples, task.train()).unwrap();
        let subs: Vec<f64> = samples.iter().filter(|s| s.role == "sub").map(|s| s.reward.unwrap()).collect();
        for (got, want) in subs.iter().zip([0.1 + 0.4 + 0.5, 0.1 + 0.4, 0.1 + 0.5]) {
            assert!((got - want).abs() < 1e-12, "{subs:?}");
        }
        let m = <Delegate as Workload<crate::backend::Cpu>>::metrics(&workload, &samples, task.train());
        assert!((m["delegate/judge"] - 2.0 / 3.0).abs() < 1e-12, "{m:?}");

        let released = MgrpoSettings { sub_reward: SubReward::Released, ..Default::default() };
        let err = DelegateConfig { mgrpo: released, ..config }.validate().unwrap_err().to_string();
        assert!(err.contains("workload.delegate.judge") && err.contains("released"), "{err}");
    }

    /// The fixture of docs/mgrpo-batch.md as episodes: the samples the workload makes of them,
    /// their rewards and the algorithm's advantages are `rl::mgrpo::question`'s, alignment
    /// included (the same seed gives the same duplicates and drops).
    #[test]
    fn samples_rewards_and_advantages_are_m_grpo_s() {
        let q = Question { id: "q1".into(), question: "Who?".into(), answers: vec!["Ann Lee".into()] };
        let doc = Document { id: "d".into(), title: "t".into(), text: "x".into() };
        let task: Arc<dyn Task> = Arc::new(QaTask::new(vec![q.clone()], vec![], vec![doc]).unwrap());
        let roles = RoleMap { policies: vec!["p".into()], roles: vec![] };
        let config = DelegateConfig { mgrpo: MgrpoSettings { align: 2, ..Default::default() }, ..Default::default() };
        let workload = Delegate::new(&config, &roles, task.clone(), SubAgent::Trained).unwrap();
        let done = |a: &str| conversation(State::Done(a.into()));
        let failed = || conversation(State::Failed("no result".into()));
        let episodes = vec![
            Episode { main: done("Ann Lee"), subs: vec![done("a")] },
            Episode { main: done("Bob"), subs: vec![done("b"), failed()] },
            Episode { main: failed(), subs: vec![] },
            Episode { main: done("ann lee"), subs: vec![done("c"), done("d"), done("e")] },
        ];
        let prompt = &task.train()[0];
        let (mut samples, counts) = workload.samples([(0, 0, 7), (0, 0, 7)], 0, prompt, &episodes, 99);
        <Delegate as Workload<crate::backend::Cpu>>::assign_rewards(&workload, &mut samples, task.train()).unwrap();
        assert_eq!(counts, [1, 1, 2], "one duplicate, one drop, two masked slots");
        assert!(samples.iter().all(|s| s.loss_mask == [true, false, true]));

        let sub = |ok| SubOutcome { format_ok: ok, expert: None };
        let outcome = |ok, correct| MainOutcome { format_ok: ok, correct };
        let rollouts = vec![
            Outcomes { main: outcome(true, 1.0), subs: vec![sub(true)] },
            Outcomes { main: outcome(true, 0.0), subs: vec![sub(true), sub(false)] },
            Outcomes { main: outcome(false, 0.0), subs: vec![] },
            Outcomes { main: outcome(true, 1.0), subs: vec![sub(true), sub(true), sub(true)] },
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(question_seed(99, "q1#0"));
        let want = question(&rollouts, &MgrpoSettings { epsilon: 1e-6, ..config.mgrpo.clone() }, &mut rng);

        // What the trainer does: route the trained samples, number their groups, advantages.
        let routed = crate::trainer::routing::route(&samples, 0, Routing::Own);
        let pool: Vec<PoolSample> = routed.pool.clone();
        let advantages = group_population_advantages(&pool, 1e-6);
        let mains: Vec<f64> = routed
            .indices
            .iter()
            .zip(&advantages)
            .filter(|(i, _)| samples[**i].parent.is_none())
            .map(|(_, a)| *a)
            .collect();
        assert_eq!(mains.len(), 4);
        for (a, b) in mains.iter().zip(&want.main_advantages) {
            assert!((a - b).abs() < 1e-12, "main {mains:?} vs {:?}", want.main_advantages);
        }
        // Each sub-trajectory: as many trained copies as slots, each with its advantage.
        let mut at = 4;
        for (k, e) in episodes.iter().enumerate() {
            for i in 0..e.subs.len() {
                let copies = want.sub_copies[k][i];
                let these = &samples[at..at + copies.max(1)];
                assert!(these.iter().all(|s| s.parent == Some(k) && s.train == (copies > 0)), "{k}/{i}");
                assert!(these.iter().all(|s| s.reward == Some(want.sub_rewards[k][i])));
                for j in at..at + copies {
                    let pos = routed.indices.iter().position(|&x| x == j).unwrap();
                    assert!((advantages[pos] - want.sub_advantages[k][i]).abs() < 1e-12);
                }
                at += copies.max(1);
            }
        }
        assert_eq!(at, samples.len());
        // A conversation that ended before its first turn is its policy's EOS.
        let empty = Conversation { response_ids: vec![], loss_mask: vec![], turns: 0, ..failed() };
        let s = conversation_sample((0, 0, 7), &empty, "main", GroupKey::new(&["q"]), 0, 0);
        assert_eq!((s.response_ids, s.loss_mask, s.penalty), (vec![7], vec![], -1.0));
    }
}
