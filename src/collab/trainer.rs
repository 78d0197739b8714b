//! The collaborative training loop (ALGORITHMS.md §2.2, Algorithm 1).
//!
//! Each step: take the next prompt batch; every agent samples G responses per prompt on its
//! own thread and publishes them to the [`RolloutPool`]; the capability tracker records every
//! agent's accuracy; then each learner updates on its view of the pool. Metrics go to
//! `metrics.jsonl` (and TensorBoard), checkpoints to `checkpoints/`, and a killed run resumes
//! from its last complete checkpoint without losing or repeating a step: every random choice
//! derives from (seed, step, agent), and the data cursor, capability windows and optimizer
//! moments are part of the checkpoint.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value};

use super::agent::Agent;
use super::pool::RolloutPool;
use super::rollout::{Rollout, RolloutSettings, RolloutTimings, mix_seed, rollout};
use super::update::{UpdateContext, update_learner};
use crate::config::{Algo, TrainConfig};
use crate::error::{Error, Result, write_atomic};
use crate::generate::SamplingParams;
use crate::model::zoo;
use crate::rl::CapabilityTracker;
use crate::task::{Task, TaskPrompt};
use crate::train::checkpoint::{self, AgentCheckpoint, SamplerState, TrainerState};
use crate::train::metrics::{Metrics, MetricsSink};

/// What a finished run reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub steps: u64,
    pub wall_s: f64,
    /// The last step's metrics per agent.
    pub last: Vec<(String, Metrics)>,
}

/// A training run in progress.
pub struct Trainer<B: Backend> {
    pub config: TrainConfig,
    pub run_dir: PathBuf,
    pub agents: Vec<Agent<B>>,
    task: Arc<dyn Task>,
    tracker: CapabilityTracker,
    sampler: SamplerState,
    /// Completed steps.
    pub step: u64,
    pub total_steps: u64,
    metrics: MetricsSink,
    /// The last step's metrics per agent.
    pub last_metrics: Vec<(String, Metrics)>,
}

fn agent_name(cfg: &TrainConfig, k: usize) -> String {
    cfg.agents[k].name.clone().unwrap_or_else(|| {
        let base = Path::new(&cfg.agents[k].model).file_name().and_then(|n| n.to_str()).unwrap_or(&cfg.agents[k].model);
        format!("agent{k}-{base}")
    })
}

fn kwargs(table: &toml::Table) -> Map<String, Value> {
    match serde_json::to_value(table) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Fails fast on an unknown agent id, before any model or dataset is loaded.
pub fn check_agent_specs(cfg: &TrainConfig) -> Result<()> {
    for a in &cfg.agents {
        if !Path::new(&a.model).exists() && zoo::find(&a.model).is_none() && crate::tiny::find(&a.model).is_none() {
            let mut known: Vec<String> = zoo::entries().iter().map(|e| e.id.clone()).collect();
            known.extend(crate::tiny::ids().into_iter().map(String::from));
            let known = known.join(", ");
            return Err(Error::UnknownModel { id: a.model.clone(), known });
        }
    }
    Ok(())
}

/// Creates the run directory and checks it is writable.
fn prepare_run_dir(dir: &Path) -> Result<()> {
    let unwritable = |e: std::io::Error| {
        Error::InvalidArgument(format!(
            "cannot write to the run directory {}: {e}; choose another with --out",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(unwritable)?;
    let probe = dir.join(".write-test");
    std::fs::write(&probe, b"").map_err(unwritable)?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

impl<B: Backend> Trainer<B> {
    /// Starts a new run in `config.run.out_dir` with one device per agent.
    pub fn start(config: TrainConfig, task: Arc<dyn Task>, devices: Vec<B::Device>) -> Result<Self> {
        config.validate()?;
        check_agent_specs(&config)?;
        if task.train().is_empty() {
            return Err(Error::InvalidArgument("the task has no training prompts".into()));
        }
        let run_dir = config.run.out_dir.clone();
        if checkpoint::latest(&run_dir)?.is_some() {
            return Err(Error::InvalidArgument(format!(
                "{} already holds a run; continue it with --resume {} or choose another --out",
                run_dir.display(),
                run_dir.display()
            )));
        }
        prepare_run_dir(&run_dir)?;
        write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
        let mut agents = Vec::new();
        for (k, a) in config.agents.iter().enumerate() {
            agents.push(Self::load_agent(&config, k, &a.model, devices[k].clone(), None)?);
        }
        let metrics = MetricsSink::open(&run_dir, config.run.tensorboard, None)?;
        Ok(Self::assemble(config, run_dir, agents, task, None, metrics))
    }

    /// Resumes the run in `run_dir` from its last complete checkpoint. `requested` (the
    /// config given on the command line, if any) must match the run's except for keys that
    /// may change (steps, output settings).
    pub fn resume(
        run_dir: &Path,
        requested: Option<TrainConfig>,
        task: Arc<dyn Task>,
        devices: Vec<B::Device>,
    ) -> Result<Self> {
        let saved = TrainConfig::load(&run_dir.join("config.toml"), &[]).map_err(|e| match e {
            Error::NotFound { path, .. } => Error::NotFound {
                what: "run to resume".into(),
                path,
                hint: "--resume takes a run directory written by `hacpo train` (it holds config.toml).".into(),
            },
            other => other,
        })?;
        let config = match requested {
            Some(req) => {
                let diff = saved.differences(&req);
                if !diff.is_empty() {
                    return Err(Error::InvalidArgument(format!(
                        "{} was trained with a different configuration; these keys differ (saved → requested): {}",
                        run_dir.display(),
                        diff.join("; ")
                    )));
                }
                TrainConfig { run: crate::config::RunConfig { out_dir: run_dir.to_path_buf(), ..req.run }, ..saved }
            }
            None => TrainConfig {
                run: crate::config::RunConfig { out_dir: run_dir.to_path_buf(), ..saved.run.clone() },
                ..saved
            },
        };
        config.validate()?;
        let Some(ckpt) = checkpoint::latest(run_dir)? else {
            return Err(Error::InvalidArgument(format!(
                "{} has no complete checkpoint yet; start it again without --resume",
                run_dir.display()
            )));
        };
        let state = checkpoint::load_state(&ckpt)?;
        let mut agents = Vec::new();
        for (k, a) in config.agents.iter().enumerate() {
            agents.push(Self::load_agent(&config, k, &a.model, devices[k].clone(), Some(&ckpt))?);
        }
        let metrics = MetricsSink::open(run_dir, config.run.tensorboard, Some(state.step))?;
        tracing::info!(step = state.step, checkpoint = %ckpt.display(), "resuming");
        Ok(Self::assemble(config, run_dir.to_path_buf(), agents, task, Some(state), metrics))
    }

    fn assemble(
        config: TrainConfig,
        run_dir: PathBuf,
        agents: Vec<Agent<B>>,
        task: Arc<dyn Task>,
        state: Option<TrainerState>,
        metrics: MetricsSink,
    ) -> Self {
        let per_step = config.algo.prompts_per_step as u64;
        let epoch_steps = (task.train().len() as u64).div_ceil(per_step).max(1);
        let total_steps = if config.run.steps > 0 { config.run.steps as u64 } else { epoch_steps };
        let (tracker, sampler, step) = match state {
            Some(s) => (s.capability, s.sampler, s.step),
            None => (CapabilityTracker::new(agents.len(), config.algo.capability.clone()), SamplerState::default(), 0),
        };
        Trainer { config, run_dir, agents, task, tracker, sampler, step, total_steps, metrics, last_metrics: vec![] }
    }

    fn load_agent(
        config: &TrainConfig,
        k: usize,
        spec: &str,
        device: B::Device,
        checkpoint: Option<&Path>,
    ) -> Result<Agent<B>> {
        let source = crate::tiny::resolve(spec, config)?;
        let spec = source.as_str();
        let pretrained = match checkpoint {
            Some(c) => crate::model::load_hf_dir::<Autodiff<B>>(&checkpoint::agent_dir(c, k), &device)?,
            None => crate::model::load::<Autodiff<B>>(spec, &device)?,
        };
        // The reference is always the starting model, also on resume.
        let reference =
            if config.algo.hacpo.kl_coef > 0.0 { Some(crate::model::load::<B>(spec, &device)?.model) } else { None };
        let mut agent = Agent::new(
            k,
            agent_name(config, k),
            spec.to_string(),
            device.clone(),
            pretrained,
            reference,
            kwargs(&config.agents[k].chat_template_kwargs),
            config.algo.optimizer.clone(),
        );
        if let Some(c) = checkpoint {
            agent.optimizer = crate::train::optim::AdamW::load(&checkpoint::optimizer_path(c, k), &device)?;
        }
        Ok(agent)
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

    fn group_and_minibatch(&self) -> (usize, usize) {
        let a = &self.config.algo;
        if a.name == Algo::Gspo2x {
            (a.group_size * 2, a.minibatch_prompts / 2)
        } else {
            (a.group_size, a.minibatch_prompts)
        }
    }

    /// Runs until `total_steps`, with a progress bar, metrics and checkpoints.
    pub fn run(&mut self) -> Result<RunSummary> {
        let started = Instant::now();
        let bar = indicatif::ProgressBar::new(self.total_steps).with_style(
            indicatif::ProgressStyle::with_template("step {pos}/{len} {bar:25} [{elapsed} < {eta}] {msg}")
                .expect("template"),
        );
        bar.set_position(self.step);
        while self.step < self.total_steps {
            let phases = self.train_step()?;
            bar.set_position(self.step);
            bar.set_message(phases);
            let last = self.step == self.total_steps;
            let every = self.config.run.checkpoint_every as u64;
            if last || (every > 0 && self.step.is_multiple_of(every)) {
                self.save_checkpoint()?;
            }
        }
        bar.finish_and_clear();
        Ok(RunSummary {
            run_dir: self.run_dir.clone(),
            steps: self.step,
            wall_s: started.elapsed().as_secs_f64(),
            last: self.last_metrics.clone(),
        })
    }

    /// One training step; returns a one-line summary of its phase timings.
    pub fn train_step(&mut self) -> Result<String> {
        let step_started = Instant::now();
        let step = self.step + 1;
        let prompts = self.next_prompts();
        let (g, minibatch_prompts) = self.group_and_minibatch();
        let cfg = self.config.clone();
        let task = self.task.clone();

        // Rollout phase: every agent on its own thread, all rollouts to everyone.
        let pool_channels = RolloutPool::<Rollout>::new(self.agents.len());
        let results: Vec<Result<(Vec<Rollout>, RolloutTimings)>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .agents
                .iter()
                .map(|agent| {
                    let mut endpoint = pool_channels.endpoint(agent.index);
                    let settings = RolloutSettings {
                        step,
                        group_size: g,
                        sampling: SamplingParams {
                            temperature: cfg.rollout.temperature,
                            top_p: cfg.rollout.top_p,
                            top_k: cfg.rollout.top_k,
                            max_new_tokens: cfg.rollout.max_new_tokens,
                            seed: mix_seed(&[cfg.run.seed, step, agent.index as u64]),
                        },
                        max_prompt_tokens: cfg.rollout.max_prompt_tokens,
                        batch_prompts: cfg.rollout.batch_prompts,
                        score_batch: cfg.algo.micro_batch_sequences,
                    };
                    let prompts = &prompts;
                    let task = task.as_ref();
                    s.spawn(move || {
                        let _span = tracing::info_span!("rollout", agent = %agent.name, step).entered();
                        match rollout(agent, prompts, task, &settings) {
                            Ok((mine, timings)) => {
                                endpoint.publish(mine);
                                endpoint.finish();
                                endpoint.collect().map(|all| (all, timings))
                            }
                            Err(e) => {
                                endpoint.fail(e.to_string());
                                Err(e)
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("an agent's rollout thread panicked".into()))))
                .collect()
        });
        let mut pool = Vec::new();
        let mut timings = Vec::new();
        for (k, r) in results.into_iter().enumerate() {
            let (all, t) = r.map_err(|e| match e {
                Error::Internal(m) => Error::Internal(format!("step {step}, agent {}: {m}", self.agents[k].name)),
                other => other,
            })?;
            if k == 0 {
                pool = all;
            }
            timings.push(t);
        }
        pool.sort_by_key(|r| (r.agent, r.prompt_index, r.sample));

        // Capabilities: this step's accuracy of every agent, then the smoothed estimates.
        let per_agent: Vec<Vec<f64>> =
            (0..self.agents.len()).map(|k| pool.iter().filter(|r| r.agent == k).map(|r| r.reward).collect()).collect();
        self.tracker.update(&per_agent);
        let caps = self.tracker.capabilities();

        // Update phase.
        let rollout_phase_s = step_started.elapsed().as_secs_f64();
        let ctx = UpdateContext {
            config: &cfg,
            group_size: g,
            minibatch_prompts,
            step,
            total_updates: self.total_steps * (self.agents.len() as u64) * (cfg.algo.prompts_per_step as u64)
                / minibatch_prompts.max(1) as u64,
            capabilities: &caps,
            dump_dir: cfg.run.dump_batches.then(|| self.run_dir.join("batches")),
        };
        let reports: Vec<_> = if cfg.run.concurrent_updates && self.agents.len() > 1 {
            std::thread::scope(|s| {
                let handles: Vec<_> =
                    self.agents.iter_mut().map(|a| s.spawn(|| update_learner(a, &pool, &ctx))).collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| Err(Error::Internal("an agent's update thread panicked".into())))
                    })
                    .collect::<Result<Vec<_>>>()
            })?
        } else {
            self.agents.iter_mut().map(|a| update_learner(a, &pool, &ctx)).collect::<Result<Vec<_>>>()?
        };

        // Metrics.
        let step_s = step_started.elapsed().as_secs_f64();
        // Per-agent phase times overlap (agents run concurrently); these two are wall clock and
        // add up to the step.
        let update_phase_s = step_s - rollout_phase_s;
        let mut summary = String::new();
        self.last_metrics.clear();
        for (k, (mut report, t)) in reports.into_iter().zip(timings).enumerate() {
            let m = &mut report.metrics;
            m.insert("timing_s/gen".into(), t.generate);
            m.insert("timing_s/reward".into(), t.reward);
            m.insert("timing_s/old_logp".into(), t.score);
            m.insert("timing_s/retokenize".into(), report.retokenize_s);
            m.insert("timing_s/ref".into(), report.reference_s);
            m.insert("timing_s/update".into(), report.update_s);
            m.insert("timing_s/step".into(), step_s);
            m.insert("timing_s/rollout_phase".into(), rollout_phase_s);
            m.insert("timing_s/update_phase".into(), update_phase_s);
            m.insert("perf/generated_tokens".into(), t.generated_tokens as f64);
            m.insert("perf/update_tokens".into(), report.tokens as f64);
            m.insert("perf/throughput".into(), (t.generated_tokens + report.tokens) as f64 / step_s.max(1e-9));
            if k == 0 {
                summary = format!(
                    "gen {:.1}s | old-logp {:.1}s | retok {:.2}s | update {:.1}s",
                    t.generate, t.score, report.retokenize_s, report.update_s
                );
            }
            if self.should_validate(step) {
                let acc = self.validate(k)?;
                report.metrics.insert("val/accuracy".into(), acc);
            }
            self.metrics.record(step, &self.agents[k].name, &report.metrics)?;
            self.last_metrics.push((self.agents[k].name.clone(), report.metrics));
        }
        self.step = step;
        Ok(summary)
    }

    fn should_validate(&self, step: u64) -> bool {
        let every = self.config.task.val_every as u64;
        !self.task.validation().is_empty() && every > 0 && (step.is_multiple_of(every) || step == self.total_steps)
    }

    /// Greedy accuracy of agent `k` on the validation prompts.
    pub fn validate(&self, k: usize) -> Result<f64> {
        let agent = &self.agents[k];
        let prompts = self.task.validation();
        let model = agent.inference_model();
        let ids: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| agent.encode_prompt(&p.messages, self.config.rollout.max_prompt_tokens))
            .collect::<Result<_>>()?;
        let texts = crate::generate::greedy_responses(
            &model,
            &agent.tokenizer,
            &agent.eos_token_ids,
            &ids,
            self.config.task.val_max_new_tokens,
            self.config.rollout.batch_prompts,
        )?;
        let correct: f64 = prompts.iter().zip(&texts).map(|(p, t)| self.task.reward(p, t)).sum();
        Ok(correct / prompts.len().max(1) as f64)
    }

    /// Writes a complete checkpoint of the current state.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let agents: Vec<AgentCheckpoint<'_, B>> = self
            .agents
            .iter()
            .map(|a| AgentCheckpoint {
                model: a.inference_model(),
                tokenizer: &a.tokenizer,
                eos_token_ids: &a.eos_token_ids,
                optimizer: &a.optimizer,
            })
            .collect();
        let state = TrainerState {
            step: self.step,
            sampler: self.sampler,
            capability: self.tracker.clone(),
            agents: self.agents.iter().map(|a| a.name.clone()).collect(),
        };
        checkpoint::save(&self.run_dir, &agents, &state, 3)
    }
}
