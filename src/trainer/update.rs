//! The update stage of one policy: mini-batches, the algorithm's policy loss plus the KL term,
//! backward with gradient accumulation over micro-batches, global-norm clipping, AdamW.
//!
//! Everything stays on the device until an optimizer step is due: per-sequence means are
//! device ops on the padded log-probs, and the loss, KL and mean log-probs of a mini-batch's
//! micro-batches are read back once, just before its optimizer step (where a non-finite loss
//! stops the run without applying the update).

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde_json::json;

use super::routing::View;
use crate::error::{Error, Result};
use crate::generate::score::{response_hidden, token_logprobs_autodiff};
use crate::policy::Policy;
use crate::rl::algorithm::{Algorithm, MicroBatch, SequenceRecord};
use crate::rl::tensor::{
    AggregationScope, aggregate_scoped, clipped_value_loss, kl_k3_tokens, pad_host, pad_tokens, sequence_mean,
};
use crate::rl::{LossAggregation, PoolSample, SampleTerms};
use crate::sample::Sample;
use crate::train::critic::HeadLeaves;
use crate::train::metrics::Metrics;
use crate::train::optim::{GradStore, LrSchedule};

type AD<B> = burn::backend::Autodiff<B>;

/// What a policy learns from in this step, prepared by the earlier stages.
pub struct LearnerBatch<'a> {
    /// The routed samples (indices into the step's samples) …
    pub indices: Vec<usize>,
    /// … as the algorithm sees them, …
    pub pool: Vec<PoolSample>,
    /// … their advantages, …
    pub advantages: Vec<f64>,
    /// … the learner's token ids of each, …
    pub views: Vec<View>,
    /// … and the step's samples themselves (old log-probs, reference log-probs of own ones).
    pub samples: &'a [Sample],
    pub ref_logps: &'a [Option<Vec<f32>>],
    /// An actor-critic's per-token advantages and returns (in routed order) and settings.
    pub critic: Option<CriticBatch>,
}

/// What the critic adds to a learner's batch (`rl::mappo`).
pub struct CriticBatch {
    pub advantages: Vec<Vec<f32>>,
    pub returns: Vec<Vec<f32>>,
    pub settings: crate::rl::mappo::CriticSettings,
}

/// The settings of an update.
pub struct UpdateSettings {
    pub step: u64,
    /// Optimizer updates of this policy over the whole run (for the schedule).
    pub total_updates: u64,
    /// Optimizer updates per step (mini-batches of the routed samples, as equal as can be).
    pub minibatches: usize,
    /// Sequences per forward/backward pass.
    pub micro_batch_sequences: usize,
    /// Recompute the trunk layer by layer in the backward pass (`algo.gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    pub inv_temperature: f32,
    pub kl_coef: f64,
    pub grad_clip: f64,
    pub schedule: LrSchedule,
    /// The constant length of `seq-mean-token-sum-norm`.
    pub norm_length: usize,
    /// Where to write audit dumps (`run.dump_batches`), if anywhere.
    pub dump_dir: Option<PathBuf>,
}

/// Metrics of one policy's update.
#[derive(Debug, Default)]
pub struct UpdateReport {
    pub metrics: Metrics,
    pub update_s: f64,
    pub tokens: usize,
}

/// Updates `policy` on `batch` with `algo`.
pub fn update_policy<B: Backend>(
    policy: &mut Policy<B>,
    algo: &dyn Algorithm<AD<B>>,
    batch: &LearnerBatch<'_>,
    settings: &UpdateSettings,
) -> Result<UpdateReport> {
    let learner = policy.index;
    let started = Instant::now();
    let mut report = UpdateReport::default();
    let n = batch.indices.len();
    if n == 0 {
        // Nothing to learn from this step (a search policy whose outputs were all singletons).
        report.update_s = started.elapsed().as_secs_f64();
        return Ok(report);
    }
    let minibatches = algo.minibatches(&batch.pool, learner, settings.minibatches.clamp(1, n))?;
    let mut sums = Sums::default();
    let mut all_terms: Vec<SampleTerms> = Vec::new();
    for (m, mb) in minibatches.iter().enumerate() {
        // The policy's own rate (`[[agents]] lr`, else `algo.optimizer.lr`) on the shared schedule.
        let lr = settings.schedule.lr(policy.optimizer.config.lr, policy.optimizer.updates, settings.total_updates);
        let step = minibatch_step(policy, algo, batch, settings, m, mb)?;
        report.tokens += step.tokens;
        let records = sequence_records(batch, m, mb, &step.mean_logp_target);
        let terms = algo.sequence_terms(learner, &records);
        if let Some(dir) = &settings.dump_dir {
            write_dump(dir, settings.step, learner, m, algo, batch, mb, &records, &terms, step.pg)?;
        }
        all_terms.extend(terms);
        sums.add(&step, lr);
        let norm = step.grads_norm;
        if apply(policy, step, lr, batch, settings)? {
            sums.norm += norm;
            sums.applied += 1;
        }
    }
    policy.version += 1;
    report.update_s = started.elapsed().as_secs_f64();
    report.metrics = sums.metrics(policy, batch, minibatches.len());
    for (k, v) in algo.metrics(learner, &all_terms) {
        report.metrics.insert(k.into(), v);
    }
    Ok(report)
}

/// The mini-batches' losses and norms, summed over a learner's step.
#[derive(Default)]
struct Sums {
    pg: f64,
    kl: f64,
    vf: f64,
    /// Gradient norms of the applied updates.
    norm: f64,
    applied: usize,
    lr_last: f64,
}

impl Sums {
    fn add<B: Backend>(&mut self, step: &MinibatchStep<B>, lr: f64) {
        self.pg += step.pg;
        self.kl += step.kl;
        self.vf += step.vf;
        self.lr_last = lr;
    }

    fn metrics<B: Backend>(&self, policy: &Policy<B>, batch: &LearnerBatch<'_>, minibatches: usize) -> Metrics {
        let count = minibatches.max(1) as f64;
        let n = batch.advantages.len().max(1) as f64;
        let mut m = Metrics::new();
        m.insert("critic/advantages/mean".into(), batch.advantages.iter().sum::<f64>() / n);
        m.insert("actor/pg_loss".into(), self.pg / count);
        m.insert("actor/kl_loss".into(), self.kl / count);
        m.insert("actor/grad_norm".into(), self.norm / self.applied.max(1) as f64);
        if let Some(scaler) = &policy.optimizer.scaler {
            m.insert("actor/loss_scale".into(), scaler.scale);
            m.insert("actor/skipped_updates".into(), (minibatches - self.applied) as f64);
        }
        m.insert("actor/lr".into(), self.lr_last);
        if batch.critic.is_some() {
            m.insert("critic/vf_loss".into(), self.vf / count);
        }
        m
    }
}

/// Applies a mini-batch's gradients (and the value head's) at rate `lr`, unless f16's loss
/// scaler skips the step because the scaled gradients overflowed (and halves the scale).
/// Returns whether it applied them.
fn apply<B: Backend>(
    policy: &mut Policy<B>,
    step: MinibatchStep<B>,
    lr: f64,
    batch: &LearnerBatch<'_>,
    settings: &UpdateSettings,
) -> Result<bool> {
    if let Some(scaler) = policy.optimizer.scaler.as_mut() {
        let apply = scaler.update(step.grads_norm);
        if scaler.exhausted() {
            return Err(Error::NonFinite {
                agent: policy.name.clone(),
                step: settings.step,
                what: "gradient norm (with the f16 loss scale below 1)",
                value: step.grads_norm,
            });
        }
        if !apply {
            return Ok(false);
        }
    }
    policy.model = policy.optimizer.step(policy.model.clone(), step.grads, lr);
    if let (Some(head), Some(grad), Some(c)) = (policy.value_head.as_mut(), step.head_grad, &batch.critic) {
        let config = crate::train::optim::AdamWConfig { weight_decay: 0.0, ..policy.optimizer.config.clone() };
        head.step(&clip_host(grad, settings.grad_clip), c.settings.critic_lr, &config);
    }
    Ok(true)
}

/// What the algorithm's sequence terms and the audit read of mini-batch `m`'s responses.
fn sequence_records(batch: &LearnerBatch<'_>, m: usize, mb: &[usize], targets: &[f64]) -> Vec<SequenceRecord> {
    mb.iter()
        .zip(targets)
        .map(|(&j, &target)| SequenceRecord {
            source: batch.pool[j].agent,
            advantage: batch.advantages[j],
            mean_logp_target: target,
            mean_logp_source: batch.samples[batch.indices[j]].mean_logp(),
            minibatch_index: m,
        })
        .collect()
}

/// One mini-batch's gradients, read-backs and losses.
struct MinibatchStep<B: Backend> {
    grads: GradStore<B>,
    grads_norm: f64,
    pg: f64,
    kl: f64,
    mean_logp_target: Vec<f64>,
    tokens: usize,
    /// The value head's gradient (weight then bias) and the value loss, with a critic.
    head_grad: Option<Vec<f64>>,
    vf: f64,
}

/// `grad` scaled to an L2 norm of at most `max_norm` (0: no clipping).
fn clip_host(grad: Vec<f64>, max_norm: f64) -> Vec<f64> {
    let norm = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
    if max_norm > 0.0 && norm > max_norm { grad.into_iter().map(|g| g * max_norm / norm).collect() } else { grad }
}

/// The detached losses of a mini-batch's micro-batches, read back together.
#[derive(Default)]
struct Detached<B: Backend> {
    pg: Vec<Tensor<AD<B>, 1>>,
    kl: Vec<Tensor<AD<B>, 1>>,
    vf: Vec<Tensor<AD<B>, 1>>,
    /// Each sequence's mean log-prob under the learner.
    means: Vec<Tensor<AD<B>, 1>>,
}

impl<B: Backend> Detached<B> {
    /// One read-back for the whole mini-batch: the summed policy, KL and value losses, and
    /// every sequence's mean log-prob.
    fn read(self) -> (f64, f64, f64, Vec<f64>) {
        let (n_pg, n_kl, n_vf) = (self.pg.len(), self.kl.len(), self.vf.len());
        let mut parts = self.pg;
        parts.extend(self.kl);
        parts.extend(self.vf);
        parts.extend(self.means);
        let host: Vec<f64> = Tensor::cat(parts, 0).into_data().convert::<f64>().into_vec::<f64>().expect("f64 data");
        let pg = host[..n_pg].iter().sum();
        let kl = host[n_pg..n_pg + n_kl].iter().sum();
        let vf = host[n_pg + n_kl..n_pg + n_kl + n_vf].iter().sum();
        (pg, kl, vf, host[n_pg + n_kl + n_vf..].to_vec())
    }
}

/// The scopes a mini-batch's losses are normalised over: all its sequences and tokens; for
/// the KL term, its own sequences.
fn scopes(
    batch: &LearnerBatch<'_>,
    learner: usize,
    mb: &[usize],
    norm_length: usize,
) -> (AggregationScope, AggregationScope) {
    let scope = AggregationScope {
        sequences: mb.len(),
        tokens: mb.iter().map(|&j| batch.views[j].response_ids.len()).sum(),
        norm_length,
    };
    let own = mb.iter().filter(|&&j| batch.pool[j].agent == learner).count();
    (scope, AggregationScope { sequences: own.max(1), ..scope })
}

/// Forward and backward over the micro-batches of mini-batch `m` (positions `mb` of the
/// routed samples), one read-back, clipping.
fn minibatch_step<B: Backend>(
    policy: &Policy<B>,
    algo: &dyn Algorithm<AD<B>>,
    batch: &LearnerBatch<'_>,
    settings: &UpdateSettings,
    m: usize,
    mb: &[usize],
) -> Result<MinibatchStep<B>> {
    // The backward pass runs on `loss_scale ×` the loss (f16 compute); gradients are divided
    // back before clipping.
    let loss_scale = policy.optimizer.scaler.map_or(1.0, |s| s.scale);
    let scopes = scopes(batch, policy.index, mb, settings.norm_length);
    let mut grads = GradStore::<B>::default();
    let mut detached = Detached::<B>::default();
    let mut head_grad: Option<Vec<f64>> = None;
    let mut tokens = 0;
    for micro in mb.chunks(settings.micro_batch_sequences.max(1)) {
        let pass = MicroPass { policy, algo, batch, settings, m, micro, scopes };
        let (loss, head, trunk, n) = pass.loss(&mut detached)?;
        tokens += n;
        let g = if loss_scale == 1.0 { loss.backward() } else { loss.mul_scalar(loss_scale).backward() };
        grads.accumulate(&policy.model, &g);
        if let Some(trunk) = trunk {
            trunk.backward(&policy.model, &g, &mut grads);
        }
        if let Some(head) = head {
            let g: Vec<f64> = head.gradient(&g).into_iter().map(|x| x / loss_scale).collect();
            head_grad = Some(match head_grad.take() {
                Some(sum) => sum.iter().zip(&g).map(|(a, b)| a + b).collect(),
                None => g,
            });
        }
    }
    let (pg, kl, vf, mean_logp_target) = detached.read();
    let vf_coef = batch.critic.as_ref().map_or(0.0, |c| c.settings.vf_coef);
    let loss = pg + settings.kl_coef * kl + vf_coef * vf;
    if !loss.is_finite() {
        return Err(Error::NonFinite { agent: policy.name.clone(), step: settings.step, what: "loss", value: loss });
    }
    if loss_scale != 1.0 {
        grads.unscale(loss_scale);
    }
    let norm = grads.clip_global_norm(settings.grad_clip);
    // With f16's loss scaler an overflow is the scale's to handle (`update_policy`).
    if !norm.is_finite() && policy.optimizer.scaler.is_none() {
        return Err(Error::NonFinite {
            agent: policy.name.clone(),
            step: settings.step,
            what: "gradient norm",
            value: norm,
        });
    }
    Ok(MinibatchStep { grads, grads_norm: norm, pg, kl, mean_logp_target, tokens, head_grad, vf })
}

/// One micro-batch's forward pass and loss.
struct MicroPass<'a, 'b, B: Backend> {
    policy: &'a Policy<B>,
    algo: &'a dyn Algorithm<AD<B>>,
    batch: &'a LearnerBatch<'b>,
    settings: &'a UpdateSettings,
    m: usize,
    micro: &'a [usize],
    /// The mini-batch's scope and the KL term's.
    scopes: (AggregationScope, AggregationScope),
}

/// The trunk kept for recomputation in the backward pass (`algo.gradient_checkpointing`).
type Trunk<B> = Option<crate::train::recompute::Trunk<B>>;

impl<B: Backend> MicroPass<'_, '_, B> {
    fn own(&self, j: usize) -> bool {
        self.batch.pool[j].agent == self.policy.index
    }

    fn sample(&self, j: usize) -> &Sample {
        &self.batch.samples[self.batch.indices[j]]
    }

    /// The loss to back-propagate (the algorithm's policy loss, plus the KL and value terms),
    /// with its detached parts added to `detached`; the value head's tracked leaves, the
    /// recomputation trunk and the number of response tokens.
    #[allow(clippy::type_complexity)]
    fn loss(
        &self,
        detached: &mut Detached<B>,
    ) -> Result<(Tensor<AD<B>, 1>, Option<HeadLeaves<AD<B>>>, Trunk<B>, usize)> {
        let requests: Vec<(Vec<u32>, Vec<u32>)> = self
            .micro
            .iter()
            .map(|&j| (self.batch.views[j].prompt_ids.clone(), self.batch.views[j].response_ids.clone()))
            .collect();
        let (hidden, targets, lens, trunk) = if self.settings.gradient_checkpointing {
            let r = crate::train::recompute::forward(&self.policy.model, &requests)?;
            (r.hidden, r.targets, r.lens, Some(r.trunk))
        } else {
            let (hidden, targets, lens) = response_hidden(&self.policy.model, &requests)?;
            (hidden, targets, lens, None)
        };
        // The critic reads the same hidden states; its loss trains the trunk too.
        let critic = match (&self.batch.critic, &self.policy.value_head) {
            (Some(c), Some(head)) => Some((c, head.values_tracked(hidden.clone()))),
            _ => None,
        };
        let flat = token_logprobs_autodiff(
            hidden,
            self.policy.model.lm_head_weight(),
            &targets,
            self.settings.inv_temperature,
        );
        let (logp, mask) = pad_tokens(flat, &lens);
        let micro_batch = self.micro_batch(logp.clone(), mask.clone(), critic.as_ref().map(|(c, _)| *c));
        let pg = self.algo.policy_loss(&micro_batch);
        let mut loss = pg.clone();
        if let Some(kl) = self.kl_term(&logp, &mask) {
            loss = loss + kl.clone().mul_scalar(self.settings.kl_coef);
            detached.kl.push(kl.detach());
        }
        let mut leaves = None;
        if let Some((c, (values, head))) = critic {
            let vf = self.value_term(c, values, &lens, &mask);
            loss = loss + vf.clone().mul_scalar(c.settings.vf_coef);
            detached.vf.push(vf.detach());
            leaves = Some(head);
        }
        detached.means.push(sequence_mean(logp.detach(), mask.detach()));
        detached.pg.push(pg.detach());
        Ok((loss, leaves, trunk, targets.len()))
    }

    /// What the algorithm's loss reads of this micro-batch.
    fn micro_batch(
        &self,
        logp: Tensor<AD<B>, 2>,
        mask: Tensor<AD<B>, 2>,
        critic: Option<&CriticBatch>,
    ) -> MicroBatch<AD<B>> {
        let (width, device) = (mask.dims()[1], logp.device());
        let micro = self.micro;
        let old: Vec<Option<&[f32]>> =
            micro.iter().map(|&j| self.own(j).then(|| self.sample(j).token_logps.as_slice())).collect();
        MicroBatch {
            old_logp: pad_host(&old, width, &device),
            mean_logp_source: micro.iter().map(|&j| self.sample(j).mean_logp()).collect(),
            advantages: micro.iter().map(|&j| self.batch.advantages[j]).collect(),
            token_advantages: critic.map(|c| {
                let rows: Vec<Option<&[f32]>> = micro.iter().map(|&j| Some(c.advantages[j].as_slice())).collect();
                pad_host(&rows, width, &device)
            }),
            sources: micro.iter().map(|&j| self.batch.pool[j].agent).collect(),
            learner: self.policy.index,
            minibatch_index: self.m,
            scope: self.scopes.0,
            logp,
            mask,
        }
    }

    /// The k3 KL to the reference over own samples, if the run has one: another policy's
    /// sample carries that policy's reference log-probs, over its own tokens, which are not
    /// this learner's reference.
    fn kl_term(&self, logp: &Tensor<AD<B>, 2>, mask: &Tensor<AD<B>, 2>) -> Option<Tensor<AD<B>, 1>> {
        let refs: Vec<Option<&[f32]>> = self
            .micro
            .iter()
            .map(|&j| if self.own(j) { self.batch.ref_logps[self.batch.indices[j]].as_deref() } else { None })
            .collect();
        if self.settings.kl_coef <= 0.0 || !refs.iter().any(Option::is_some) {
            return None;
        }
        let (width, device) = (mask.dims()[1], logp.device());
        // Other policies' rows are zeroed before the exponential (0 − 0), not only masked
        // after it: exp of a very negative log-prob overflows, and 0 · inf in the backward is NaN.
        let own_mask: Vec<f32> = refs.iter().map(|r| r.is_some() as u8 as f32).collect();
        let own_mask = crate::rl::tensor::vector::<AD<B>>(own_mask, &device).reshape([self.micro.len(), 1]);
        let own_tokens = mask.clone() * own_mask;
        Some(aggregate_scoped(
            kl_k3_tokens(logp.clone() * own_tokens.clone(), pad_host(&refs, width, &device)),
            own_tokens,
            LossAggregation::SeqMeanTokenMean,
            self.scopes.1,
        ))
    }

    /// The critic's clipped value loss over every token of the micro-batch.
    fn value_term(
        &self,
        c: &CriticBatch,
        values: Tensor<AD<B>, 1>,
        lens: &[usize],
        mask: &Tensor<AD<B>, 2>,
    ) -> Tensor<AD<B>, 1> {
        let (values, _) = pad_tokens(values, lens);
        let (width, device) = (mask.dims()[1], values.device());
        let old: Vec<Option<&[f32]>> = self.micro.iter().map(|&j| Some(self.sample(j).values.as_slice())).collect();
        let returns: Vec<Option<&[f32]>> = self.micro.iter().map(|&j| Some(c.returns[j].as_slice())).collect();
        aggregate_scoped(
            clipped_value_loss(
                values,
                pad_host(&old, width, &device),
                pad_host(&returns, width, &device),
                c.settings.cliprange_value,
            ),
            mask.clone(),
            LossAggregation::TokenMean,
            self.scopes.0,
        )
    }
}

/// Writes one mini-batch's numbers for auditing against the RL core: the whole routed pool
/// (the advantages depend on every response of a group), and for each response of the
/// mini-batch the log-probs the loss used and the terms it computed.
#[allow(clippy::too_many_arguments)]
fn write_dump<B: Backend>(
    dir: &std::path::Path,
    step: u64,
    learner: usize,
    m: usize,
    algo: &dyn Algorithm<AD<B>>,
    batch: &LearnerBatch<'_>,
    mb: &[usize],
    records: &[SequenceRecord],
    terms: &[SampleTerms],
    pg_loss: f64,
) -> Result<()> {
    let pool: Vec<serde_json::Value> = batch
        .pool
        .iter()
        .zip(&batch.indices)
        .map(|(p, &i)| json!({"agent": p.agent, "prompt": p.group, "reward": p.reward, "text": batch.samples[i].text}))
        .collect();
    let minibatch: Vec<serde_json::Value> = mb
        .iter()
        .zip(records)
        .enumerate()
        .map(|(r, (&j, rec))| {
            json!({"pool_index": j, "mean_logp_target": rec.mean_logp_target,
                   "mean_logp_source": rec.mean_logp_source, "terms": terms.get(r)})
        })
        .collect();
    let mut body = json!({
        "step": step, "learner": learner, "algorithm": algo.name(), "minibatch_index": m,
        "pool": pool, "minibatch": minibatch, "pg_loss": pg_loss,
    });
    if let (Some(audit), Some(obj)) = (algo.audit(), body.as_object_mut()) {
        for (k, v) in audit.as_object().into_iter().flatten() {
            obj.insert(k.clone(), v.clone());
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let path = dir.join(format!("step-{step:06}-learner-{learner}-mb-{m}.json"));
    crate::error::write_atomic(&path, serde_json::to_string_pretty(&body).expect("json").as_bytes())
}
