//! The trainer: one staged step for every workload and algorithm (docs/algorithms.md §2.2 for
//! HACPO), checkpoints, resume and validation.
//!
//! ```text
//! prompts ─▶ rollout (workload) ─▶ rewards (workload) ─▶ old/ref log-probs ─▶ advantages
//!        ─▶ route + retokenise (per learner) ─▶ update (per policy) ─▶ metrics, checkpoint
//! ```
//!
//! Each stage is timed under verl's metric names (`timing_s/gen`, `timing_s/reward`,
//! `timing_s/old_log_prob`, `timing_s/ref`, `timing_s/adv`, `timing_s/update_actor`,
//! `timing_s/step`). A killed run resumes from its last complete checkpoint without losing or
//! repeating a step: every random choice derives from (seed, step, policy), and the data
//! cursor, the algorithm's state and the optimizer moments are part of the checkpoint.

mod gather;
pub mod micro_batches;
pub mod routing;
pub mod scoring;
pub mod signal;
pub mod update;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value};

use crate::cluster::{Bus, LocalBus};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::generate::{FinishReason, SamplingParams};
use crate::model::lora;
use crate::model::offload::HostModel;
use crate::model::precision::{reference_copy, set_compute, store_frozen};
use crate::policy::{Policy, Reference};
use crate::rl::algorithm::{ValueModel, ValuedResponse};
use crate::rl::{Algorithm, BatchShape, PoolSample, Routing};
use crate::run_dir::{RunDir, RunLock};
use crate::sample::Sample;
use crate::stable_hash::mix_seed;
use crate::task::{Task, TaskPrompt};
use crate::train::checkpoint::{self, AgentCheckpoint, SamplerState, TrainerState};
use crate::train::critic::{Critic, ValueHead, ValueTrunk};
use crate::train::metrics::{Metrics, MetricsSink};
use crate::train::optim::AdamWConfig;
use crate::workload::{Rollout, RolloutSettings, RolloutTimings, ValidationSettings, Workload};
use update::{LearnerBatch, UpdateSettings, update_policy};

/// A learner's routed samples with their advantages (and, with a value model, per token).
struct Advantaged {
    routed: routing::Routed,
    advantages: Vec<f64>,
    tokens: Option<crate::rl::algorithm::TokenAdvantages>,
}

/// What a finished run reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    pub run_dir: std::path::PathBuf,
    pub steps: u64,
    pub wall_s: f64,
    /// The last step's metrics per policy.
    pub last: Vec<(String, Metrics)>,
}

/// A training run in progress.
pub struct Trainer<B: Backend> {
    pub config: TrainConfig,
    pub run: RunDir,
    /// Held while the trainer lives: no second process trains in the same directory.
    _lock: RunLock,
    /// The policies this process trains, by index: every one, but in a cluster run its host's.
    pub policies: Vec<Policy<B>>,
    algorithm: Box<dyn Algorithm<Autodiff<B>>>,
    workload: Box<dyn Workload<B>>,
    task: Arc<dyn Task>,
    /// The batch shape after the algorithm's say (GSPO×2 doubles the group).
    shape: BatchShape,
    sampler: SamplerState,
    /// Completed steps.
    pub step: u64,
    pub total_steps: u64,
    metrics: MetricsSink,
    /// The last step's metrics per policy.
    pub last_metrics: Vec<(String, Metrics)>,
    bus: Box<dyn Bus>,
}

fn kwargs(table: &toml::Table) -> Map<String, Value> {
    match serde_json::to_value(table) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Gives every policy the algorithm's critic: a fresh value head (on a value model copied from
/// the policy, unless the head reads the policy's trunk), or the ones a checkpoint saved.
fn attach_critics<B: Backend>(
    policies: &mut [Policy<B>],
    value: ValueModel,
    resumed: Option<(&TrainerState, &Path)>,
    compute: crate::dtype::ComputeDtype,
    algorithm: &str,
) -> Result<()> {
    let missing = |what: &str, policy: &str| {
        Error::InvalidArgument(format!(
            "the checkpoint holds no {what} for policy {policy}: it was not written by {algorithm} with these \
             [algo.mappo] settings"
        ))
    };
    for p in policies.iter_mut() {
        let k = p.index;
        let head = match resumed {
            None => ValueHead::new(p.model.config.hidden_size),
            Some((s, _)) => s.value_heads.get(k).cloned().flatten().ok_or_else(|| missing("value head", &p.name))?,
        };
        // The critic's AdamW: the policy's betas and eps, no weight decay (as the head's).
        let optimizer = AdamWConfig { lr: value.lr, weight_decay: 0.0, ..p.optimizer.config.clone() };
        let trunk = match (value.own_trunk, resumed) {
            (false, _) => None,
            (true, None) => Some(ValueTrunk::copy_of(&p.model, optimizer)),
            (true, Some((s, dir))) => {
                if !s.value_trunks {
                    return Err(missing("value model", &p.name));
                }
                let model = match &p.lora {
                    Some(_) => lora::load_adapter(
                        ValueTrunk::copy_of(&p.model, optimizer).model,
                        &checkpoint::critic_dir(dir, k),
                    )?,
                    None => set_compute(
                        crate::model::load_hf_dir::<Autodiff<B>>(&checkpoint::critic_dir(dir, k), &p.device)?.model,
                        compute,
                    ),
                };
                let optimizer =
                    crate::train::optim::AdamW::load(&checkpoint::critic_optimizer_path(dir, k), &p.device, false)?;
                Some(ValueTrunk { model, optimizer })
            }
        };
        p.critic = Some(Critic { head, trunk });
    }
    Ok(())
}

/// Runs a stage and records its wall time under `name`.
fn timed<T>(timing: &mut Metrics, name: &str, stage: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let out = stage();
    timing.insert(name.into(), started.elapsed().as_secs_f64());
    out
}

/// What a session hands the trainer beside the config: the task, one device per policy, and
/// each policy's model as the loader reads it (a directory, a `.gguf`, a zoo id: a tiny agent's
/// id already resolved to its pre-trained copy, which the trainer knows nothing of).
pub struct Inputs<B: Backend> {
    pub task: Arc<dyn Task>,
    pub devices: Vec<B::Device>,
    pub models: Vec<String>,
    /// What the step's samples cross between processes through: this process alone
    /// ([`LocalBus`]), or the run's other hosts (a `[cluster]` run).
    pub bus: Box<dyn Bus>,
}

impl<B: Backend> Inputs<B> {
    /// The models as `config` names them: for configs whose models are paths or zoo ids.
    pub fn as_given(config: &TrainConfig, task: Arc<dyn Task>, devices: Vec<B::Device>) -> Self {
        Inputs {
            task,
            devices,
            models: config.policies.iter().map(|p| p.model.clone()).collect(),
            bus: Box::new(LocalBus::new()),
        }
    }

    fn check(&self, config: &TrainConfig) -> Result<()> {
        let n = config.policies.len();
        if self.devices.len() != n || self.models.len() != n {
            return Err(Error::Internal(format!(
                "{n} policies, {} devices and {} models handed to the trainer",
                self.devices.len(),
                self.models.len()
            )));
        }
        Ok(())
    }
}

impl<B: Backend> Trainer<B> {
    /// Starts a new run in `config.run.out_dir`.
    pub fn start(config: TrainConfig, inputs: Inputs<B>) -> Result<Self> {
        config.validate()?;
        inputs.check(&config)?;
        if inputs.task.train().is_empty() {
            return Err(Error::InvalidArgument("the task has no training prompts".into()));
        }
        let run = RunDir::new(&config.run.out_dir);
        run.prepare()?;
        let lock = run.lock()?;
        // Checked again under the lock: another process may have started a run here since.
        run.check_new()?;
        if !run.run_files().is_empty() {
            eprintln!(
                "note: {} holds a run that stopped before its first step; starting it over",
                run.path().display()
            );
        }
        Self::begin(config, run, lock, inputs)
    }

    /// Step 0 of a run in a directory this process holds the lock of.
    fn begin(config: TrainConfig, run: RunDir, lock: RunLock, inputs: Inputs<B>) -> Result<Self> {
        run.write_config(&config)?;
        let policies = Self::load_hosted(&config, &inputs, None)?;
        let metrics = MetricsSink::open(run.path(), config.run.tensorboard, None)?;
        Self::assemble(config, run, lock, policies, inputs, None, metrics)
    }

    /// Resumes the run in `run_dir` from its last complete checkpoint. `requested` (the
    /// config given on the command line, if any) must match the run's except for keys that
    /// may change (steps, output settings).
    pub fn resume(run_dir: &Path, requested: Option<TrainConfig>, inputs: Inputs<B>) -> Result<Self> {
        let run = RunDir::new(run_dir);
        let saved = run.read_config()?;
        let lock = run.lock()?;
        let config = TrainConfig::resumed(run_dir, saved, requested)?;
        config.validate()?;
        inputs.check(&config)?;
        let (candidates, mut passed) = checkpoint::resume_candidates(&run.checkpoints())?;
        if candidates.is_empty() {
            // Killed before its first checkpoint: nothing to continue from, so the run starts
            // over with its own config (the steps it had recorded are redone).
            eprintln!("note: {} has no checkpoint yet; training it again from step 0", run_dir.display());
            return Self::begin(config, run, lock, inputs);
        }
        // The newest checkpoint that loads: a damaged file in one (unreadable config, NaN
        // weights, a trainer state that is not its step's) falls back to the one before.
        let mut first_error = None;
        for ckpt in &candidates {
            let state = match checkpoint::load_state_of(ckpt, config.policies.len()) {
                Ok(state) => state,
                Err(e) => {
                    passed.push(format!("{}: {e}", ckpt.display()));
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            check_steps_left(&config, state.step, run_dir)?;
            let loaded = Self::load_hosted(&config, &inputs, Some(ckpt))
                .and_then(|policies| Self::check_restorable(&config, &state).map(|()| policies));
            let policies = match loaded {
                Ok(p) => p,
                Err(e) => {
                    passed.push(format!("{}: {e}", ckpt.display()));
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            if !passed.is_empty() {
                eprintln!(
                    "note: passed over damaged checkpoints ({}); resuming from {}",
                    passed.join("; "),
                    ckpt.display()
                );
            }
            let metrics = MetricsSink::open(run.path(), config.run.tensorboard, Some(state.step))?;
            tracing::info!(step = state.step, checkpoint = %ckpt.display(), "resuming");
            return Self::assemble(config, run, lock, policies, inputs, Some((state, ckpt)), metrics);
        }
        Err(first_error.expect("a candidate failed"))
    }

    /// Whether the algorithm's saved state (and the critic's value heads) can be restored.
    fn check_restorable(config: &TrainConfig, state: &TrainerState) -> Result<()> {
        let mut algorithm = crate::rl::registry::build::<Autodiff<B>>(&config.algo.name, &config.algo.settings())?;
        algorithm.restore(state.algorithm.clone())?;
        let trunks = algorithm.value_model().is_some_and(|v| v.own_trunk);
        if algorithm.value_model().is_some()
            && (state.value_heads.iter().flatten().count() != config.policies.len() - state.elsewhere.len()
                || trunks && !state.value_trunks)
        {
            return Err(Error::InvalidArgument(format!(
                "the trainer state holds no value head or value model for some policy: it was not written by {} \
                 with these [algo.mappo] settings",
                algorithm.name()
            )));
        }
        Ok(())
    }

    fn assemble(
        config: TrainConfig,
        run: RunDir,
        lock: RunLock,
        mut policies: Vec<Policy<B>>,
        inputs: Inputs<B>,
        resumed: Option<(TrainerState, &Path)>,
        metrics: MetricsSink,
    ) -> Result<Self> {
        let Inputs { task, bus, .. } = inputs;
        let mut algorithm = crate::rl::registry::build::<Autodiff<B>>(&config.algo.name, &config.algo.settings())?;
        let workload =
            crate::workload::build::<B>(&config.workload, &config.role_map(), task.clone(), &config.algo.name)?;
        check_policy_count(algorithm.as_ref(), config.policies.len())?;
        let shape = algorithm.shape(config.requested_shape())?;
        let total_steps = total_steps(&config, task.train().len());
        if let Some(value) = algorithm.value_model() {
            let resumed = resumed.as_ref().map(|(s, dir)| (s, *dir));
            attach_critics(&mut policies, value, resumed, config.algo.compute_dtype, algorithm.name())?;
        }
        let (sampler, step) = match resumed {
            Some((s, _)) => {
                algorithm.restore(s.algorithm)?;
                workload.restore(s.workload)?;
                (s.sampler, s.step)
            }
            None => (SamplerState::default(), 0),
        };
        Ok(Trainer {
            config,
            run,
            _lock: lock,
            policies,
            algorithm,
            workload,
            task,
            shape,
            sampler,
            step,
            total_steps,
            metrics,
            last_metrics: vec![],
            bus,
        })
    }

    /// The policies this process trains, fresh or from `checkpoint`: the others (a cluster run's
    /// other hosts') are not loaded at all.
    fn load_hosted(config: &TrainConfig, inputs: &Inputs<B>, checkpoint: Option<&Path>) -> Result<Vec<Policy<B>>> {
        let hosted = config.hosted(inputs.bus.host())?;
        (0..config.policies.len())
            .filter(|&k| hosted[k])
            .map(|k| Self::load_policy(config, k, inputs, checkpoint))
            .collect()
    }

    fn load_policy(config: &TrainConfig, k: usize, inputs: &Inputs<B>, checkpoint: Option<&Path>) -> Result<Policy<B>> {
        let (source, device) = (inputs.models[k].clone(), inputs.devices[k].clone());
        let lora = config.policies[k].lora.clone();
        // The reference first: offloaded, it passes through the device on its way to host
        // memory, and should not meet the policy's weights there.
        let reference = load_reference::<B>(config, k, &source, &device, lora.is_some())?;
        let mut pretrained = match (checkpoint, &lora) {
            (Some(c), None) => crate::model::load_hf_dir::<Autodiff<B>>(&checkpoint::agent_dir(c, k), &device)?,
            (None, None) => crate::model::load::<Autodiff<B>>(&source, &device)?,
            // LoRA: the base as configured, frozen, with fresh or checkpointed adapters.
            (c, Some(l)) => {
                let mut p = crate::model::load::<Autodiff<B>>(&source, &device)?;
                p.model = match c {
                    Some(c) => lora::load_adapter(p.model, &checkpoint::agent_dir(c, k))?,
                    None => lora::attach(p.model, l, mix_seed(&[config.run.seed, 0x10AA, k as u64])),
                };
                p.model = store_frozen(p.model, config.policies[k].frozen_dtype);
                let trainable = lora::adapter_parameters(&p.model.config, l);
                let total = p.model.config.num_parameters() as u64 + trainable;
                tracing::info!(
                    policy = config.policy_name(k),
                    rank = l.rank,
                    "LoRA: {trainable} trainable parameters of {total} ({:.2}%)",
                    100.0 * trainable as f64 / total as f64
                );
                p
            }
        };
        let compute = config.algo.compute_dtype;
        pretrained.model = crate::train::autodiff_graph::join(set_compute(pretrained.model, compute));
        let offload = config.policies[k].offload;
        let mut policy = Policy::new(
            k,
            config.policy_name(k),
            source,
            device.clone(),
            pretrained,
            reference,
            kwargs(&config.policies[k].chat_template_kwargs),
            AdamWConfig {
                lr: config.policies[k].lr.unwrap_or(config.algo.optimizer.lr),
                ..config.algo.optimizer.clone()
            },
        );
        policy.lora = lora;
        if let Some(c) = checkpoint {
            policy.optimizer = crate::train::optim::AdamW::load(&checkpoint::optimizer_path(c, k), &device, offload)?;
        }
        policy.optimizer.set_offload(offload, &device);
        // f16 gradients need a loss scale; a resumed run keeps its saved one.
        if compute == crate::dtype::ComputeDtype::F16 && policy.optimizer.scaler.is_none() {
            let scale = config.algo.f16_loss_scale;
            policy.optimizer.scaler = Some(crate::train::loss_scale::LossScaler { scale, ..Default::default() });
        }
        Ok(policy)
    }

    /// The algorithm's registry name.
    pub fn algorithm_name(&self) -> &'static str {
        self.algorithm.name()
    }

    /// The prompts of the next step, advancing the cursor (a fresh shuffle each epoch).
    fn next_prompts(&mut self) -> Vec<TaskPrompt> {
        let all = self.task.train();
        let n = self.config.algo.prompts_per_step;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let mut order: Vec<usize> = (0..all.len()).collect();
            let mut rng =
                rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(&[self.config.run.seed, 0xDA7A, self.sampler.epoch]));
            order.shuffle(&mut rng);
            while out.len() < n && self.sampler.position < order.len() {
                out.push(all[order[self.sampler.position]].clone());
                self.sampler.position += 1;
            }
            if self.sampler.position >= order.len() {
                self.sampler = SamplerState { epoch: self.sampler.epoch + 1, position: 0 };
            }
        }
        out
    }

    /// Optimizer updates of one policy per step: its routed samples over the mini-batch size.
    fn updates_per_step(&self) -> u64 {
        let sources = match self.algorithm.routing() {
            Routing::Own => 1,
            Routing::Shared => self.config.policies.len(),
        };
        (sources * self.config.algo.prompts_per_step / self.shape.minibatch_prompts.max(1)) as u64
    }

    /// Whether the update's own forward pass gives the old policy's log-probs, saving the
    /// scoring stage's pass: with one optimizer update per step (TRL's `num_iterations = 1`)
    /// that pass runs on the old weights. Not with a value model (the scoring pass reads its
    /// values), nor when a policy learns from another's samples (it reads their log-probs
    /// before their owner's update), nor when the config asks for the separate pass.
    fn old_logps_in_update(&self) -> bool {
        !self.config.algo.score_old_separately
            && self.updates_per_step() == 1
            && self.algorithm.value_model().is_none()
            && (self.algorithm.routing() == Routing::Own || self.config.policies.len() == 1)
    }

    /// Runs until `total_steps`, with a progress bar, metrics and checkpoints.
    pub fn run(&mut self) -> Result<RunSummary> {
        let started = Instant::now();
        let bar = crate::progress::Progress::new("step", self.total_steps);
        bar.set_position(self.step);
        while self.step < self.total_steps {
            let phases = self.train_step()?;
            bar.set_position(self.step);
            bar.set_message(phases);
            let last = self.step == self.total_steps;
            let every = self.config.run.checkpoint_every as u64;
            let interrupted = crate::train::interrupt::requested();
            if last || interrupted || (every > 0 && self.step.is_multiple_of(every)) {
                self.save_checkpoint()?;
                kill_point(self.step);
            }
            if interrupted && !last {
                bar.finish();
                return Err(Error::Interrupted {
                    step: self.step,
                    total: self.total_steps,
                    run_dir: self.run.path().display().to_string(),
                });
            }
        }
        bar.finish();
        Ok(RunSummary {
            run_dir: self.run.path().to_path_buf(),
            steps: self.step,
            wall_s: started.elapsed().as_secs_f64(),
            last: self.last_metrics.clone(),
        })
    }

    /// One training step; returns a one-line summary of its stage timings.
    pub fn train_step(&mut self) -> Result<String> {
        let started = Instant::now();
        let step = self.step + 1;
        let mut timing = Metrics::new();
        let mut prompts = self.next_prompts();
        let Rollout { mut samples, timings: mut generation, metrics: measured } =
            self.workload.rollout(&self.policies, &prompts, &self.rollout_settings(step))?;
        timed(&mut timing, "timing_s/reward", || self.workload.assign_rewards(&mut samples, &prompts))?;
        if self.config.algo.filter_groups {
            (prompts, samples) = self.draw_until_signal(step, prompts, samples, &mut generation, &mut timing)?;
        }
        into_step_order(&mut samples);
        let held: Vec<usize> = self.policies.iter().map(|p| p.index).collect();
        if self.config.run.dump_rollouts {
            // Before scoring, so a step that diverges is on disk; this process's own samples
            // (not the stand-ins a split team lists for another host's).
            self.run.write_rollouts(step, samples.iter().filter(|s| held.contains(&s.policy)))?;
        }
        let mut scored = self.score(step, &mut samples, &mut timing)?;
        if self.bus.hosts().len() > 1 {
            // The wait for the slowest host included: what spreading the run costs per step.
            (samples, scored) = timed(&mut timing, "timing_s/gather", || {
                gather::gather_step(self.bus.as_ref(), step, samples, scored, &held)
            })?;
        }

        let advantages = timed(&mut timing, "timing_s/adv", || self.advantages(&samples))?;
        let (batches, retokenize_s) = self.route(&samples, advantages, &scored.ref_logps)?;
        let mut reports = timed(&mut timing, "timing_s/update_actor", || self.update(step, &batches))?;
        timing.insert("timing_s/step".into(), started.elapsed().as_secs_f64());
        if let Some(peak) = crate::alloc::peak_resident_bytes() {
            // The whole process's (every policy's) high-water mark so far.
            timing.insert("perf/peak_rss_gb".into(), peak as f64 / 1e9);
        }
        // What the rollout measured is the first draw's: all of its prompts, flat ones too (an
        // unbiased look at the policy, where the kept prompts lean to mixed outcomes); what the
        // samples say covers the prompts kept from every draw.
        timing.extend(measured);
        timing.extend(self.workload.metrics(&samples, &prompts));
        let summary = format!(
            "gen {:.1}s | old-logp {:.1}s | retok {:.2}s | update {:.1}s",
            generation.iter().map(|t| t.generate).fold(0.0, f64::max),
            timing["timing_s/old_log_prob"],
            retokenize_s.iter().sum::<f64>(),
            timing["timing_s/update_actor"]
        );
        drop(batches);
        update::keep_old_logps(&mut samples, &mut reports);
        self.record(step, &samples, &generation, &retokenize_s, reports, &timing)?;
        self.step = step;
        self.bus.reached(step);
        Ok(summary)
    }

    /// DAPO's dynamic sampling (`algo.filter_groups`): while the step has fewer than
    /// `prompts_per_step` prompts with signal and fewer than `filter_max_draws` rollouts, draw
    /// the next prompts (the data cursor moves on, each draw samples with a seed of its own);
    /// then keep the first prompts with signal, with flat groups out of the loss.
    fn draw_until_signal(
        &mut self,
        step: u64,
        mut prompts: Vec<TaskPrompt>,
        mut samples: Vec<Sample>,
        generation: &mut [RolloutTimings],
        timing: &mut Metrics,
    ) -> Result<(Vec<TaskPrompt>, Vec<Sample>)> {
        let want = self.config.algo.prompts_per_step;
        let mut draws = 1;
        while signal::prompts_with_signal(&samples).len() < want && draws < self.config.algo.filter_max_draws {
            let more = self.next_prompts();
            let mut settings = self.rollout_settings(step);
            settings.run_seed = mix_seed(&[settings.run_seed, 0xD1A5, draws as u64]);
            let Rollout { samples: mut drawn, timings: times, .. } =
                self.workload.rollout(&self.policies, &more, &settings)?;
            self.workload.assign_rewards(&mut drawn, &more)?;
            // One step's numbering: prompts and parent links after those already drawn, and
            // group keys of their own (a prompt drawn twice in a step forms two groups).
            let (first_prompt, first_sample) = (prompts.len(), samples.len());
            for s in &mut drawn {
                s.prompt += first_prompt;
                s.parent = s.parent.map(|p| p + first_sample);
                s.group = crate::sample::GroupKey::new(&[&format!("draw{draws}"), &s.group.0]);
            }
            for (total, t) in generation.iter_mut().zip(times) {
                total.generate += t.generate;
                total.generated_tokens += t.generated_tokens;
            }
            prompts.extend(more);
            samples.extend(drawn);
            draws += 1;
        }
        let with_signal = signal::prompts_with_signal(&samples).len();
        timing.insert("groups/draws".into(), draws as f64);
        timing.insert("groups/prompts_with_signal".into(), with_signal as f64 / prompts.len().max(1) as f64);
        // No signal in any draw (every group flat): the first draw's prompts train as they are
        // (their advantages are 0) rather than stopping the run.
        let kept = if with_signal == 0 {
            signal::keep_first(&mut samples, want)
        } else {
            signal::keep_signal(&mut samples, want)
        };
        let mut by_index: Vec<Option<TaskPrompt>> = prompts.into_iter().map(Some).collect();
        Ok((kept.iter().map(|&i| by_index[i].take().expect("kept once")).collect(), samples))
    }

    /// Sampling settings of step `step` (the seed is derived per policy by the workload).
    fn rollout_settings(&self, step: u64) -> RolloutSettings<'_> {
        let r = &self.config.rollout;
        RolloutSettings {
            step,
            run_seed: self.config.run.seed,
            group_size: self.shape.group_size,
            sampling: SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                top_k: r.top_k,
                max_new_tokens: r.max_new_tokens,
                seed: 0,
            },
            max_prompt_tokens: r.max_prompt_tokens,
            batch_prompts: r.batch_prompts,
            policies: self.config.policies.len(),
            bus: self.bus.as_ref(),
        }
    }

    /// Old (and, with a KL term, reference) log-probs of every policy's own samples.
    fn score(&self, step: u64, samples: &mut [Sample], timing: &mut Metrics) -> Result<scoring::Scored> {
        let scored = scoring::score_samples(
            &self.policies,
            samples,
            &scoring::ScoreSettings {
                step,
                micro_batches: micro_batches::MicroBatching::of(&self.config.algo),
                temperature: self.config.rollout.temperature,
                old: !self.old_logps_in_update(),
                with_reference: self.config.algo.kl_coef > 0.0,
            },
        )?;
        timing.insert("timing_s/old_log_prob".into(), scored.old_s);
        timing.insert("timing_s/ref".into(), scored.ref_s);
        Ok(scored)
    }

    /// The algorithm sees the whole step, then each policy's routed samples get advantages:
    /// per response, and with a value model per token from the values the scoring stage read
    /// (the response's advantage then being its tokens' mean).
    fn advantages(&mut self, samples: &[Sample]) -> Result<Vec<Advantaged>> {
        let everything: Vec<PoolSample> =
            samples.iter().map(|s| PoolSample { agent: s.policy, group: 0, reward: s.reward() }).collect();
        self.algorithm.observe(&everything, self.config.policies.len());
        let routing = self.algorithm.routing();
        let valued = self.algorithm.value_model().is_some();
        self.policies
            .iter()
            .map(|p| {
                let k = p.index;
                let routed = routing::route(samples, k, routing);
                let mut advantages = self.algorithm.advantages(&routed.pool, k)?;
                let tokens = match valued {
                    false => None,
                    true => Some(self.algorithm.token_advantages(&valued_responses(samples, &routed.indices)?)?),
                };
                if let Some(t) = &tokens {
                    advantages = t.means();
                }
                Ok(Advantaged { routed, advantages, tokens })
            })
            .collect()
    }

    /// Each policy's batch: its routed samples in its own tokens (and seconds spent on that).
    fn route<'a>(
        &self,
        samples: &'a [Sample],
        advantages: Vec<Advantaged>,
        ref_logps: &'a [Option<Vec<f32>>],
    ) -> Result<(Vec<LearnerBatch<'a>>, Vec<f64>)> {
        let r = &self.config.rollout;
        let mut batches = Vec::with_capacity(self.policies.len());
        let mut seconds = Vec::with_capacity(self.policies.len());
        for (policy, Advantaged { routed, advantages, tokens }) in self.policies.iter().zip(advantages) {
            let t = Instant::now();
            let views =
                routing::views(policy, samples, &routed.indices, r.cross_max_prompt_tokens, r.max_response_tokens)?;
            seconds.push(t.elapsed().as_secs_f64());
            batches.push(LearnerBatch {
                indices: routed.indices,
                pool: routed.pool,
                advantages,
                views,
                samples,
                ref_logps,
                tokens,
            });
        }
        Ok((batches, seconds))
    }

    /// Updates every policy this process trains on its batch (concurrently when `run.concurrent_updates`).
    fn update(&mut self, step: u64, batches: &[LearnerBatch<'_>]) -> Result<Vec<update::UpdateReport>> {
        let a = &self.config.algo;
        let settings = UpdateSettings {
            step,
            total_updates: self.total_steps * self.updates_per_step(),
            minibatches: self.updates_per_step() as usize,
            micro_batches: micro_batches::MicroBatching::of(a),
            gradient_checkpointing: a.gradient_checkpointing,
            inv_temperature: 1.0 / self.config.rollout.temperature.max(1e-6),
            kl_coef: a.kl_coef,
            value_lr: self.algorithm.value_model().map(|v| v.lr),
            grad_clip: a.grad_clip,
            schedule: a.schedule.clone(),
            norm_length: self.shape.norm_length,
            dump_dir: self.config.run.dump_batches.then(|| self.run.batches()),
            old_logps_from_pass: self.old_logps_in_update(),
        };
        let algorithm = self.algorithm.as_ref();
        let mut policies: Vec<&mut Policy<B>> = self.policies.iter_mut().collect();
        if !(self.config.run.concurrent_updates && policies.len() > 1) {
            let one_by_one = |(p, b): (&mut &mut Policy<B>, &LearnerBatch<'_>)| {
                crate::backend::training_on_a_cpu_worker::<B, _>(|| update_policy(p, algorithm, b, &settings))
            };
            return policies.iter_mut().zip(batches).map(one_by_one).collect();
        }
        let settings = &settings;
        let items = policies.into_iter().zip(batches).map(|(p, b)| (p.index, (p, b)));
        crate::policy::per_policy(items, "update", |(p, b)| update_policy(p, algorithm, b, settings))
            .into_iter()
            .collect()
    }

    /// One metrics record per policy: the stage timings, its samples' statistics, its update's
    /// metrics and, when due, its held-out accuracy.
    fn record(
        &mut self,
        step: u64,
        samples: &[Sample],
        generation: &[RolloutTimings],
        retokenize_s: &[f64],
        reports: Vec<update::UpdateReport>,
        timing: &Metrics,
    ) -> Result<()> {
        let step_s = timing["timing_s/step"];
        self.last_metrics.clear();
        let validation = if self.should_validate(step) { Some(self.validate_all(step)?) } else { None };
        let held: Vec<(usize, String)> = self.policies.iter().map(|p| (p.index, p.name.clone())).collect();
        for (((k, name), mut report), retokenize_s) in held.into_iter().zip(reports).zip(retokenize_s) {
            let own: Vec<&Sample> = samples.iter().filter(|s| s.policy == k).collect();
            let n_own = own.len().max(1) as f64;
            let mean = |f: &dyn Fn(&Sample) -> f64| own.iter().map(|s| f(s)).sum::<f64>() / n_own;
            let m = &mut report.metrics;
            m.extend(timing.iter().map(|(k, v)| (k.clone(), *v)));
            m.insert("timing_s/gen".into(), generation[k].generate);
            m.insert("timing_s/retokenize".into(), *retokenize_s);
            m.insert("timing_s/update".into(), report.update_s);
            m.insert("critic/score/mean".into(), mean(&|s| s.reward()));
            m.extend(signal::metrics(samples, k));
            m.insert("response_length/mean".into(), mean(&|s| s.response_ids.len() as f64));
            m.insert(
                "response_length/clip_ratio".into(),
                mean(&|s| (s.finish_reason == FinishReason::Length) as u8 as f64),
            );
            m.insert("perf/generated_tokens".into(), generation[k].generated_tokens as f64);
            m.insert("perf/update_tokens".into(), report.tokens as f64);
            m.insert("perf/micro_batches".into(), report.micro_batches as f64);
            m.insert(
                "perf/throughput".into(),
                (generation[k].generated_tokens + report.tokens) as f64 / step_s.max(1e-9),
            );
            if let Some(v) = &validation {
                m.extend(v[k].iter().map(|(k, v)| (k.clone(), *v)));
            }
            self.metrics.record(step, &name, &report.metrics)?;
            self.last_metrics.push((name, report.metrics));
        }
        Ok(())
    }

    fn should_validate(&self, step: u64) -> bool {
        let every = self.config.task.val_every as u64;
        !self.task.validation().is_empty() && every > 0 && (step.is_multiple_of(every) || step == self.total_steps)
    }

    /// Greedy held-out metrics of every policy after `step` steps (0: before training), as the
    /// workload measures them.
    fn validate_all(&self, step: u64) -> Result<Vec<Metrics>> {
        self.workload.validate(
            &self.policies,
            &ValidationSettings {
                step,
                max_prompt_tokens: self.config.rollout.max_prompt_tokens,
                max_new_tokens: self.config.task.val_max_new_tokens,
                batch_prompts: self.config.rollout.batch_prompts,
                policies: self.config.policies.len(),
                bus: self.bus.as_ref(),
            },
        )
    }

    /// The held-out metric that summarises the run (`val/accuracy`, or `val/f1` for search).
    pub fn validation_key(&self) -> &'static str {
        self.workload.validation_key()
    }

    /// Greedy held-out score ([`Trainer::validation_key`]) of every policy this process trains,
    /// by name.
    pub fn accuracies(&self) -> Result<crate::run_dir::Accuracies> {
        let key = self.validation_key();
        let progress =
            crate::progress::Progress::new(format!("held-out {}", crate::workload::validation_label(key)), 0);
        let metrics = self.validate_all(self.step)?;
        progress.finish();
        Ok(self.policies.iter().map(|p| (p.name.clone(), metrics[p.index].get(key).copied().unwrap_or(0.0))).collect())
    }

    /// Whether the task has held-out prompts.
    pub fn validates(&self) -> bool {
        !self.task.validation().is_empty()
    }

    /// Writes a complete checkpoint of the current state.
    pub fn save_checkpoint(&self) -> Result<std::path::PathBuf> {
        // Indexed like the run's policies; in a cluster run each process writes those it trains.
        let n = self.config.policies.len();
        let mut parts: Vec<Option<AgentCheckpoint<'_, B>>> = (0..n).map(|_| None).collect();
        let mut value_heads = vec![None; n];
        for p in &self.policies {
            parts[p.index] = Some(AgentCheckpoint {
                // The master weights: the rollout copy may be rounded to bf16/f16.
                model: p.master_model(),
                lora: p.lora.as_ref().map(|l| (l, lora::base_name(&p.spec))),
                tokenizer: &p.tokenizer,
                eos_token_ids: &p.eos_token_ids,
                optimizer: &p.optimizer,
                critic: p.critic.as_ref().and_then(|c| c.trunk.as_ref()).map(|t| (t.inference_model(), &t.optimizer)),
            });
            value_heads[p.index] = p.critic.as_ref().map(|c| c.head.clone());
        }
        let names: Vec<String> = (0..n).map(|k| self.config.policy_name(k)).collect();
        let state = TrainerState {
            step: self.step,
            sampler: self.sampler,
            algorithm: self.algorithm.state(),
            workload: self.workload.state(),
            elsewhere: names
                .iter()
                .enumerate()
                .filter(|&(k, _)| parts[k].is_none())
                .map(|(_, name)| name.clone())
                .collect(),
            policies: names,
            value_heads: if value_heads.iter().any(Option::is_some) { value_heads } else { vec![] },
            value_trunks: self.policies.iter().any(|p| p.critic.as_ref().is_some_and(|c| c.trunk.is_some())),
        };
        checkpoint::save(&self.run.checkpoints(), &parts, &state, 3)
    }
}

/// A resumed run's `--steps` is not below the steps it has completed.
fn check_steps_left(config: &TrainConfig, done: u64, run_dir: &Path) -> Result<()> {
    if config.run.steps == 0 || config.run.steps as u64 >= done {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "--steps {} is below the {done} steps {} has completed; give at least {done}",
        config.run.steps,
        run_dir.display(),
    )))
}

/// An algorithm that compares policies (HACPO) needs at least its minimum of them.
fn check_policy_count<B: burn::tensor::backend::AutodiffBackend>(algorithm: &dyn Algorithm<B>, n: usize) -> Result<()> {
    if n >= algorithm.min_policies() {
        return Ok(());
    }
    Err(Error::config(
        "training config",
        format!("algo.name: {} needs at least {} policies, found {n}", algorithm.name(), algorithm.min_policies()),
    ))
}

/// Sorts a step's samples into step order (by policy, prompt and position), numbers them, and
/// makes parent links (multi-stage workloads) follow; returns each sample's former position.
fn into_step_order(samples: &mut [Sample]) -> Vec<usize> {
    for (i, s) in samples.iter_mut().enumerate() {
        s.id = i;
    }
    samples.sort_by_key(|s| (s.policy, s.prompt, s.sample_index));
    let former: Vec<usize> = samples.iter().map(|s| s.id).collect();
    let mut moved_to = vec![0; samples.len()];
    for (i, &f) in former.iter().enumerate() {
        moved_to[f] = i;
    }
    for (i, s) in samples.iter_mut().enumerate() {
        s.id = i;
        s.parent = s.parent.map(|p| moved_to[p]);
    }
    former
}

/// `run.steps`, or one epoch of `train_prompts` when it is 0.
fn total_steps(config: &TrainConfig, train_prompts: usize) -> u64 {
    let epoch_steps = (train_prompts as u64).div_ceil(config.algo.prompts_per_step as u64).max(1);
    if config.run.steps > 0 { config.run.steps as u64 } else { epoch_steps }
}

/// What a token-level estimator reads of a learner's routed samples: reward and values.
fn valued_responses<'a>(samples: &'a [Sample], indices: &[usize]) -> Result<Vec<ValuedResponse<'a>>> {
    if let Some(&i) = indices.iter().find(|&&i| samples[i].values.len() != samples[i].response_ids.len()) {
        return Err(Error::Internal(format!(
            "sample {i} of policy {} has {} values for {} tokens: a value model learns from its own samples only",
            samples[i].policy,
            samples[i].values.len(),
            samples[i].response_ids.len()
        )));
    }
    Ok(indices.iter().map(|&i| ValuedResponse { reward: samples[i].reward(), values: &samples[i].values }).collect())
}

/// Tests of crash recovery: `HACPO_TEST_KILL_AFTER_CHECKPOINT=N` ends the process abruptly (no
/// destructors, lock left behind, like SIGKILL) right after the checkpoint of step N is
/// written, a deterministic point where polling for the file would race with the next step.
fn kill_point(step: u64) {
    if std::env::var("HACPO_TEST_KILL_AFTER_CHECKPOINT").is_ok_and(|v| v.trim() == step.to_string()) {
        eprintln!("HACPO_TEST_KILL_AFTER_CHECKPOINT: killed after the checkpoint of step {step}");
        std::process::abort();
    }
}

/// Policy `k`'s KL reference: the starting model, also on resume (none without a KL term,
/// and with LoRA, whose reference is the base under the adapters: no copy is loaded). With
/// `offload` it waits in host memory between scoring passes.
fn load_reference<B: Backend>(
    config: &TrainConfig,
    k: usize,
    source: &str,
    device: &B::Device,
    lora: bool,
) -> Result<Option<Reference<B>>> {
    let (offload, compute) = (config.policies[k].offload, config.algo.compute_dtype);
    let reference = if config.algo.kl_coef > 0.0 && !lora {
        let model = crate::model::load::<B>(source, device)?.model;
        // With half-precision compute, stored as its forward reads it (half the bytes).
        let stored = set_compute(store_frozen(model, config.policies[k].frozen_dtype), compute);
        // Offloaded in the dtype the forward reads too; `reference_model` redoes the CPU's
        // bf16 re-layout after each upload (the cast is then a no-op).
        Some(match offload {
            true => Reference::Host(HostModel::of(reference_copy(stored))),
            false => Reference::Device(reference_copy(stored)),
        })
    } else {
        None
    };
    if offload {
        let copy = match &reference {
            Some(Reference::Host(host)) => format!("the {} reference, ", crate::memory_plan::gb(host.bytes() as u64)),
            _ => String::new(),
        };
        let name = config.policy_name(k);
        tracing::info!(policy = name, "offloaded: {copy}AdamW moments and summed gradients wait in host memory");
    }
    Ok(reference)
}
