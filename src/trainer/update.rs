//! The update stage of one policy: mini-batches, the algorithm's loss terms plus the KL term,
//! backward with gradient accumulation over micro-batches, global-norm clipping, AdamW (and,
//! for an algorithm with a value model, the value head's own step).
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

use super::micro_batches::MicroBatching;
use super::routing::View;
use crate::error::{Error, Result};
use crate::generate::score::{response_hidden, split_rows, token_logprobs_autodiff};
use crate::policy::Policy;
use crate::rl::algorithm::{Algorithm, MicroBatch, SequenceRecord, TokenAdvantages, ValueBatch};
use crate::rl::stats::unbiased_std;
use crate::rl::tensor::{
    AggregationScope, aggregate_scoped, kl_k3_tokens, ordered_sum, pad_host, pad_tokens, sequence_mean, vector,
};
use crate::rl::{LossAggregation, PoolSample, SampleTerms};
use crate::sample::{Sample, mean_logp};
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
    /// An algorithm with a value model: its per-token advantages and returns (routed order).
    pub tokens: Option<TokenAdvantages>,
}

/// The settings of an update.
pub struct UpdateSettings {
    pub step: u64,
    /// Optimizer updates of this policy over the whole run (for the schedule).
    pub total_updates: u64,
    /// Optimizer updates per step (mini-batches of the routed samples, as equal as can be).
    pub minibatches: usize,
    /// What bounds a forward/backward pass (`algo.micro_batch_sequences` or
    /// `algo.micro_batch_tokens`).
    pub micro_batches: MicroBatching,
    /// Recompute the trunk layer by layer in the backward pass (`algo.gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    pub inv_temperature: f32,
    pub kl_coef: f64,
    /// The value head's rate, for an algorithm with a value model.
    pub value_lr: Option<f64>,
    pub grad_clip: f64,
    pub schedule: LrSchedule,
    /// The constant length of `seq-mean-token-sum-norm`.
    pub norm_length: usize,
    /// Where to write audit dumps (`run.dump_batches`), if anywhere.
    pub dump_dir: Option<PathBuf>,
    /// The old policy's log-probs come from this update's own forward pass instead of the
    /// scoring stage: with one mini-batch per step it runs on the old weights.
    pub old_logps_from_pass: bool,
}

/// Metrics of one policy's update.
#[derive(Debug, Default)]
pub struct UpdateReport {
    pub metrics: Metrics,
    pub update_s: f64,
    pub tokens: usize,
    /// Forward/backward passes (micro-batches) over all its mini-batches.
    pub micro_batches: usize,
    /// With `old_logps_from_pass`: each own sample's old log-probs (by step sample index), as
    /// the scoring stage would have left them in `token_logps`.
    pub old_logps: Vec<(usize, Vec<f32>)>,
}

/// Puts the old log-probs that the updates' passes read into their samples, for what reads
/// them after the update (the sampled entropy).
pub fn keep_old_logps(samples: &mut [Sample], reports: &mut [UpdateReport]) {
    for (i, logps) in reports.iter_mut().flat_map(|r| std::mem::take(&mut r.old_logps)) {
        samples[i].token_logps = logps;
    }
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
    if settings.old_logps_from_pass && minibatches.len() != 1 {
        // A second mini-batch would run on weights the first one moved.
        return Err(Error::Internal(format!(
            "old log-probs from the update's pass with {} mini-batches",
            minibatches.len()
        )));
    }
    let mut sums = Sums::default();
    let mut all_terms: Vec<SampleTerms> = Vec::new();
    for (m, mb) in minibatches.iter().enumerate() {
        let view = |j: usize| &batch.views[j];
        let micros = settings.micro_batches.cut(mb, |j| (&view(j).prompt_ids, &view(j).response_ids));
        // The micro-batches' order is the one their read-backs come in.
        let mb = &micros.concat();
        // The policy's own rate (`[[agents]] lr`, else `algo.optimizer.lr`) on the shared schedule.
        let lr = settings.schedule.lr(policy.optimizer.config.lr, policy.optimizer.updates, settings.total_updates);
        let mut step = minibatch_step(policy, algo, batch, settings, m, &micros)?;
        report.tokens += step.tokens;
        report.micro_batches += micros.len();
        let records = sequence_records(batch, m, mb, &step.mean_logp_target, &step.old_logps);
        let old = std::mem::take(&mut step.old_logps).into_iter();
        report.old_logps.extend(mb.iter().zip(old).filter_map(|(&j, lp)| Some((batch.indices[j], lp?))));
        let terms = algo.sequence_terms(learner, &records);
        if let Some(dir) = &settings.dump_dir {
            let pg = step.terms.first().map_or(0.0, |&(_, v)| v);
            write_dump(dir, settings.step, learner, m, algo, batch, mb, &records, &terms, pg)?;
        }
        all_terms.extend(terms);
        sums.add(&step, lr);
        let (norm, critic_norm) = (step.grads_norm, step.value_trunk.as_ref().map(|(_, n)| *n));
        if apply(policy, step, lr, settings)? {
            sums.norm += norm;
            sums.critic_norm = critic_norm.map(|n| n + sums.critic_norm.unwrap_or(0.0));
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
    /// The algorithm's loss terms, by metric.
    terms: Vec<(&'static str, f64)>,
    kl: f64,
    /// `actor/ppo_kl` of the mini-batches with own tokens, and how many those were.
    ppo_kl: f64,
    ppo_kl_minibatches: usize,
    /// Gradient norms of the applied updates (the policy's, a value model's).
    norm: f64,
    critic_norm: Option<f64>,
    applied: usize,
    lr_last: f64,
}

impl Sums {
    fn add<B: Backend>(&mut self, step: &MinibatchStep<B>, lr: f64) {
        for &(metric, value) in &step.terms {
            match self.terms.iter_mut().find(|(m, _)| *m == metric) {
                Some((_, sum)) => *sum += value,
                None => self.terms.push((metric, value)),
            }
        }
        self.kl += step.kl;
        if let Some(ppo_kl) = step.ppo_kl {
            self.ppo_kl += ppo_kl;
            self.ppo_kl_minibatches += 1;
        }
        self.lr_last = lr;
    }

    fn metrics<B: Backend>(&self, policy: &Policy<B>, batch: &LearnerBatch<'_>, minibatches: usize) -> Metrics {
        let count = minibatches.max(1) as f64;
        let n = batch.advantages.len().max(1) as f64;
        let mut m = Metrics::new();
        m.insert("critic/advantages/mean".into(), batch.advantages.iter().sum::<f64>() / n);
        if let Some(ev) = explained_variance(batch) {
            m.insert("critic/vf_explained_var".into(), ev);
        }
        for &(metric, sum) in &self.terms {
            m.insert(metric.into(), sum / count);
        }
        m.insert("actor/kl_loss".into(), self.kl / count);
        if self.ppo_kl_minibatches > 0 {
            m.insert("actor/ppo_kl".into(), self.ppo_kl / self.ppo_kl_minibatches as f64);
        }
        m.insert("actor/grad_norm".into(), self.norm / self.applied.max(1) as f64);
        if let Some(norm) = self.critic_norm {
            m.insert("critic/grad_norm".into(), norm / self.applied.max(1) as f64);
        }
        if let Some(scaler) = &policy.optimizer.scaler {
            m.insert("actor/loss_scale".into(), scaler.scale);
            m.insert("actor/skipped_updates".into(), (minibatches - self.applied) as f64);
        }
        m.insert("actor/lr".into(), self.lr_last);
        m
    }
}

/// How much of the returns' variance over the batch's tokens the values at step start explain
/// (verl's `critic/vf_explained_var`: 1 − Var(returns − values) / Var(returns)), with a value
/// model.
fn explained_variance(batch: &LearnerBatch<'_>) -> Option<f64> {
    let tokens = batch.tokens.as_ref()?;
    let (returns, errors): (Vec<f64>, Vec<f64>) = tokens
        .returns
        .iter()
        .zip(&batch.indices)
        .flat_map(|(ret, &i)| ret.iter().zip(&batch.samples[i].values).map(|(&r, &v)| (r as f64, r as f64 - v as f64)))
        .unzip();
    // A ratio of two variances over the same tokens: the divisor cancels.
    let total = unbiased_std(&returns);
    (total > 0.0).then(|| 1.0 - (unbiased_std(&errors) / total).powi(2))
}

/// Applies a mini-batch's gradients at rate `lr` (the value head's at its own), unless f16's loss
/// scaler skips the step because the scaled gradients overflowed (and halves the scale).
/// Returns whether it applied them.
fn apply<B: Backend>(
    policy: &mut Policy<B>,
    step: MinibatchStep<B>,
    lr: f64,
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
    policy.optimizer.update(&mut policy.model, step.grads, lr);
    if let (Some(critic), Some(lr)) = (policy.critic.as_mut(), settings.value_lr) {
        if let Some(grad) = step.head_grad {
            let config = crate::train::optim::AdamWConfig { weight_decay: 0.0, ..policy.optimizer.config.clone() };
            critic.head.step(&clip_host(grad, settings.grad_clip), lr, &config);
        }
        if let (Some(trunk), Some((grads, _))) = (critic.trunk.as_mut(), step.value_trunk) {
            trunk.optimizer.update(&mut trunk.model, grads, lr);
        }
    }
    Ok(true)
}

/// What the algorithm's sequence terms and the audit read of mini-batch `m`'s responses.
/// `old`: the old log-probs read from the update's pass (in `mb` order), if it gave them.
fn sequence_records(
    batch: &LearnerBatch<'_>,
    m: usize,
    mb: &[usize],
    targets: &[f64],
    old: &[Option<Vec<f32>>],
) -> Vec<SequenceRecord> {
    mb.iter()
        .zip(targets)
        .enumerate()
        .map(|(r, (&j, &target))| SequenceRecord {
            source: batch.pool[j].agent,
            advantage: batch.advantages[j],
            mean_logp_target: target,
            mean_logp_source: match old.get(r).and_then(Option::as_deref) {
                Some(logps) => mean_logp(logps),
                None => batch.samples[batch.indices[j]].mean_logp(),
            },
            minibatch_index: m,
        })
        .collect()
}

/// One mini-batch's gradients, read-backs and losses.
struct MinibatchStep<B: Backend> {
    grads: GradStore<B>,
    grads_norm: f64,
    /// The algorithm's loss terms (summed over the micro-batches), by metric.
    terms: Vec<(&'static str, f64)>,
    kl: f64,
    /// The mean old − new log-prob over its own tokens (none: no own sample in it).
    ppo_kl: Option<f64>,
    mean_logp_target: Vec<f64>,
    tokens: usize,
    /// The old log-probs its pass read (`old_logps_from_pass`), in mini-batch order; empty
    /// otherwise.
    old_logps: Vec<Option<Vec<f32>>>,
    /// The value head's gradient (weight then bias), with a value model.
    head_grad: Option<Vec<f64>>,
    /// A value model's own gradients and their norm before clipping.
    value_trunk: Option<ClippedGrads<B>>,
}

/// Clipped gradients and their norm before clipping.
type ClippedGrads<B> = (GradStore<B>, f64);

/// `grad` scaled to an L2 norm of at most `max_norm` (0: no clipping).
fn clip_host(grad: Vec<f64>, max_norm: f64) -> Vec<f64> {
    let norm = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
    if max_norm > 0.0 && norm > max_norm { grad.into_iter().map(|g| g * max_norm / norm).collect() } else { grad }
}

/// A loss term's metric and weight, and its detached value in each micro-batch.
type TermValues<B> = (&'static str, f64, Vec<Tensor<AD<B>, 1>>);

/// The detached losses of a mini-batch's micro-batches, read back together.
struct Detached<B: Backend> {
    /// Each loss term, in the algorithm's order.
    terms: Vec<TermValues<B>>,
    kl: Vec<Tensor<AD<B>, 1>>,
    /// Each micro-batch's [Σ old − new log-prob, token count] over its own tokens.
    drift: Vec<Tensor<AD<B>, 1>>,
    /// Each sequence's mean log-prob under the learner.
    means: Vec<Tensor<AD<B>, 1>>,
}

/// A mini-batch's losses on the host.
struct ReadBack {
    /// Each term's (metric, weight, sum over micro-batches).
    terms: Vec<(&'static str, f64, f64)>,
    /// The KL term's sum.
    kl: f64,
    /// The mean old − new log-prob over the own tokens, if there were any.
    ppo_kl: Option<f64>,
    /// Every sequence's mean log-prob.
    means: Vec<f64>,
}

impl<B: Backend> Detached<B> {
    fn new() -> Self {
        Detached { terms: Vec::new(), kl: Vec::new(), drift: Vec::new(), means: Vec::new() }
    }

    fn push_term(&mut self, metric: &'static str, weight: f64, value: Tensor<AD<B>, 1>) {
        match self.terms.iter_mut().find(|(m, _, _)| *m == metric) {
            Some((_, _, values)) => values.push(value),
            None => self.terms.push((metric, weight, vec![value])),
        }
    }

    /// One read-back for the whole mini-batch.
    fn read(self) -> ReadBack {
        let counts: Vec<usize> = self.terms.iter().map(|(_, _, v)| v.len()).collect();
        let n_kl = self.kl.len();
        let n_drift = 2 * self.drift.len();
        let mut labels = Vec::new();
        let mut parts = Vec::new();
        for (metric, weight, values) in self.terms {
            labels.push((metric, weight));
            parts.extend(values);
        }
        parts.extend(self.kl);
        parts.extend(self.drift);
        parts.extend(self.means);
        let host: Vec<f64> = Tensor::cat(parts, 0).into_data().convert::<f64>().into_vec::<f64>().expect("f64 data");
        let mut at = 0;
        let mut terms = Vec::new();
        for ((metric, weight), n) in labels.into_iter().zip(counts) {
            terms.push((metric, weight, host[at..at + n].iter().sum()));
            at += n;
        }
        let kl = host[at..at + n_kl].iter().sum();
        at += n_kl;
        let (drift, tokens) = host[at..at + n_drift].chunks(2).fold((0.0, 0.0), |(d, t), c| (d + c[0], t + c[1]));
        let ppo_kl = (tokens > 0.0).then(|| drift / tokens);
        ReadBack { terms, kl, ppo_kl, means: host[at + n_drift..].to_vec() }
    }
}

/// The scopes a mini-batch's losses are normalised over: all its sequences and tokens (over
/// its micro-batches `micros`); for the KL term, its own sequences.
fn scopes(
    batch: &LearnerBatch<'_>,
    learner: usize,
    micros: &[Vec<usize>],
    norm_length: usize,
) -> (AggregationScope, AggregationScope) {
    let mb = || micros.iter().flatten();
    let scope = AggregationScope {
        sequences: mb().count(),
        tokens: mb().map(|&j| batch.views[j].trained_tokens()).sum(),
        norm_length,
    };
    let own = mb().filter(|&&j| batch.pool[j].agent == learner).count();
    (scope, AggregationScope { sequences: own.max(1), ..scope })
}

/// Forward and backward over the micro-batches `micros` of mini-batch `m` (positions of the
/// routed samples), one read-back, clipping.
fn minibatch_step<B: Backend>(
    policy: &Policy<B>,
    algo: &dyn Algorithm<AD<B>>,
    batch: &LearnerBatch<'_>,
    settings: &UpdateSettings,
    m: usize,
    micros: &[Vec<usize>],
) -> Result<MinibatchStep<B>> {
    // The backward pass runs on `loss_scale ×` the loss (f16 compute); gradients are divided
    // back before clipping.
    let loss_scale = policy.optimizer.scaler.map_or(1.0, |s| s.scale);
    let scopes = scopes(batch, policy.index, micros, settings.norm_length);
    let mut grads = policy.optimizer.grad_store(&policy.device);
    let mut detached = Detached::<B>::new();
    let mut critic = CriticGrads::<B>::of(policy);
    let (mut tokens, mut old_logps) = (0, Vec::new());
    for micro in micros {
        let pass = MicroPass { policy, algo, batch, settings, m, micro, scopes };
        let MicroLoss { loss, head, trunk, tokens: n, old } = pass.loss(&mut detached)?;
        tokens += n;
        old_logps.extend(old);
        let g = if loss_scale == 1.0 { loss.backward() } else { loss.mul_scalar(loss_scale).backward() };
        grads.accumulate(&policy.model, &g);
        if let Some(trunk) = trunk {
            trunk.backward(&policy.model, &g, &mut grads);
        }
        critic.add(policy, head, &g, loss_scale);
    }
    let ReadBack { terms, kl, ppo_kl, means: mean_logp_target } = detached.read();
    let non_finite = |what, value| Error::NonFinite { agent: policy.name.clone(), step: settings.step, what, value };
    let loss = total_loss(&terms, kl, settings.kl_coef);
    if !loss.is_finite() {
        return Err(non_finite("loss", loss));
    }
    if loss_scale != 1.0 {
        grads.unscale(loss_scale);
    }
    let norm = grads.clip_global_norm(settings.grad_clip);
    // With f16's loss scaler an overflow is the scale's to handle (`apply`).
    if !norm.is_finite() && policy.optimizer.scaler.is_none() {
        return Err(non_finite("gradient norm", norm));
    }
    let terms = terms.into_iter().map(|(metric, _, sum)| (metric, sum)).collect();
    let (head_grad, value_trunk) = critic.finish(loss_scale, settings.grad_clip);
    Ok(MinibatchStep {
        grads,
        grads_norm: norm,
        terms,
        kl,
        ppo_kl,
        mean_logp_target,
        tokens,
        old_logps,
        head_grad,
        value_trunk,
    })
}

/// A mini-batch's loss from its read-back terms (metric, weight, sum) and KL sum: the policy
/// term, the KL term, then the others, the order the loss was built in.
fn total_loss(terms: &[(&str, f64, f64)], kl: f64, kl_coef: f64) -> f64 {
    let weighted = |(_, w, v): &(&str, f64, f64)| if *w == 1.0 { *v } else { w * v };
    terms.iter().skip(1).fold(terms.first().map_or(0.0, weighted) + kl_coef * kl, |acc, t| acc + weighted(t))
}

/// A critic's gradients summed over a mini-batch's micro-batches: its head's (on the host)
/// and its value model's, if it has one.
struct CriticGrads<B: Backend> {
    head: Option<Vec<f64>>,
    trunk: Option<GradStore<B>>,
}

impl<B: Backend> CriticGrads<B> {
    fn of(policy: &Policy<B>) -> Self {
        let trunk = policy.critic.as_ref().and_then(|c| c.trunk.as_ref()).map(|_| GradStore::default());
        CriticGrads { head: None, trunk }
    }

    /// Adds one backward pass's gradients (of `loss_scale ×` the loss).
    fn add(&mut self, policy: &Policy<B>, head: Option<HeadLeaves<AD<B>>>, g: &GradsOf<B>, loss_scale: f64) {
        if let (Some(store), Some(trunk)) = (self.trunk.as_mut(), policy.critic.as_ref().and_then(|c| c.trunk.as_ref()))
        {
            store.accumulate(&trunk.model, g);
        }
        if let Some(head) = head {
            let g: Vec<f64> = head.gradient(g).into_iter().map(|x| x / loss_scale).collect();
            self.head = Some(match self.head.take() {
                Some(sum) => sum.iter().zip(&g).map(|(a, b)| a + b).collect(),
                None => g,
            });
        }
    }

    /// The head's gradient, and the value model's unscaled and clipped with its norm before
    /// clipping: a value model's gradients are clipped on their own, as a separate critic's are.
    fn finish(self, loss_scale: f64, clip: f64) -> (Option<Vec<f64>>, Option<ClippedGrads<B>>) {
        let trunk = self.trunk.map(|mut g| {
            if loss_scale != 1.0 {
                g.unscale(loss_scale);
            }
            let norm = g.clip_global_norm(clip);
            (g, norm)
        });
        (self.head, trunk)
    }
}

/// The gradients of one backward pass.
type GradsOf<B> = <AD<B> as burn::tensor::backend::AutodiffBackend>::Gradients;

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

/// A micro-batch's loss to back-propagate and what its pass leaves beside it.
struct MicroLoss<B: Backend> {
    /// The algorithm's terms and the KL term.
    loss: Tensor<AD<B>, 1>,
    /// The value head's tracked leaves, with a value head.
    head: Option<HeadLeaves<AD<B>>>,
    trunk: Trunk<B>,
    /// Response tokens.
    tokens: usize,
    /// With `old_logps_from_pass`: each own row's log-probs, read from this pass (micro
    /// order); empty otherwise.
    old: Vec<Option<Vec<f32>>>,
}

impl<B: Backend> MicroPass<'_, '_, B> {
    fn own(&self, j: usize) -> bool {
        self.batch.pool[j].agent == self.policy.index
    }

    fn sample(&self, j: usize) -> &Sample {
        &self.batch.samples[self.batch.indices[j]]
    }

    /// The loss to back-propagate, with its detached parts added to `detached`.
    fn loss(&self, detached: &mut Detached<B>) -> Result<MicroLoss<B>> {
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
        // A value head on the policy's trunk reads the same hidden states (its loss trains the
        // trunk too); one on a value model of its own, that model's.
        let values = match (&self.batch.tokens, &self.policy.critic) {
            (Some(_), Some(critic)) => Some(match &critic.trunk {
                None => critic.head.values_tracked(hidden.clone()),
                Some(trunk) => critic.head.values_tracked(response_hidden(&trunk.model, &requests)?.0),
            }),
            _ => None,
        };
        let flat = token_logprobs_autodiff(
            hidden,
            self.policy.model.lm_head_weight(),
            &targets,
            self.settings.inv_temperature,
        );
        let old = self.old_from_pass(&flat, &lens)?;
        let (logp, mask) = pad_tokens(flat, &lens);
        let mask = self.without_environment_tokens(mask);
        let (values, leaves) = values.map(|(v, leaves)| (pad_tokens(v, &lens).0, leaves)).unzip();
        let micro_batch = self.micro_batch(logp.clone(), mask.clone(), values, &old);
        detached.drift.push(self.drift(&micro_batch));
        let mut terms = self.algo.loss_terms(&micro_batch).into_iter();
        let first = terms.next().ok_or_else(|| Error::Internal(format!("{} gave no loss term", self.algo.name())))?;
        let mut loss =
            if first.weight == 1.0 { first.value.clone() } else { first.value.clone().mul_scalar(first.weight) };
        detached.push_term(first.metric, first.weight, first.value.detach());
        // The KL term right after the policy term, as the loss has always been summed.
        if let Some(kl) = self.kl_term(&logp, &mask) {
            loss = loss + kl.clone().mul_scalar(self.settings.kl_coef);
            detached.kl.push(kl.detach());
        }
        for t in terms {
            loss = loss + t.value.clone().mul_scalar(t.weight);
            detached.push_term(t.metric, t.weight, t.value.detach());
        }
        detached.means.push(sequence_mean(logp.detach(), mask.detach()));
        Ok(MicroLoss { loss, head: leaves, trunk, tokens: targets.len(), old })
    }

    /// With `old_logps_from_pass`, the own rows' log-probs of this pass, detached: the old
    /// policy's, since the weights have not moved this step. The loss's ratio then divides by
    /// the very values it is computed from and is exactly 1 at the old weights, as in TRL with
    /// `num_iterations = 1`.
    fn old_from_pass(&self, flat: &Tensor<AD<B>, 1>, lens: &[usize]) -> Result<Vec<Option<Vec<f32>>>> {
        if !self.settings.old_logps_from_pass {
            return Ok(Vec::new());
        }
        let rows = split_rows(flat.clone().inner(), lens)?;
        let own = |(&j, row): (&usize, Vec<f32>)| {
            if !self.own(j) {
                return Ok(None);
            }
            // A diverged model (NaN/inf weights or activations) shows here first.
            match row.iter().find(|x| !x.is_finite()) {
                Some(&bad) => Err(Error::NonFinite {
                    agent: self.policy.name.clone(),
                    step: self.settings.step,
                    what: "log-probability of its own sample",
                    value: bad as f64,
                }),
                None => Ok(Some(row)),
            }
        };
        self.micro.iter().zip(rows).map(own).collect()
    }

    /// The own rows' Σ (old − new log-prob) and their token count, detached: verl's
    /// `actor/ppo_kl` before the division, how far the policy the loss's ratios divide by is
    /// from the one being trained (0 to rounding in a step's first update, where they are the
    /// same weights; another policy's samples have no old log-probs of the learner's).
    fn drift(&self, batch: &MicroBatch<AD<B>>) -> Tensor<AD<B>, 1> {
        let own = self.rows_where(self.micro.iter().map(|&j| self.own(j)), &batch.logp.device());
        let tokens = batch.mask.clone().detach() * own;
        // The other rows zeroed before the difference, as in `kl_term`.
        let drift = batch.old_logp.clone() - batch.logp.clone().detach() * tokens.clone();
        Tensor::cat(vec![ordered_sum(drift * tokens.clone()), ordered_sum(tokens)], 0)
    }

    /// A `[rows, 1]` column of 1 for the micro-batch's rows where `keep` holds, else 0.
    fn rows_where(&self, keep: impl Iterator<Item = bool>, device: &B::Device) -> Tensor<AD<B>, 2> {
        let keep: Vec<f32> = keep.map(|k| k as u8 as f32).collect();
        vector::<AD<B>>(keep, device).reshape([self.micro.len(), 1])
    }

    /// `mask` with the tokens the environment wrote between a trajectory's turns set to 0, so
    /// every term (loss, KL, sequence means) leaves them out.
    fn without_environment_tokens(&self, mask: Tensor<AD<B>, 2>) -> Tensor<AD<B>, 2> {
        let views = || self.micro.iter().map(|&j| &self.batch.views[j]);
        if views().all(|v| v.loss_mask.is_empty()) {
            return mask;
        }
        let (width, device) = (mask.dims()[1], mask.device());
        let rows: Vec<Vec<f32>> = views()
            .map(|v| match v.loss_mask.is_empty() {
                true => vec![1.0; v.response_ids.len()],
                false => v.loss_mask.iter().map(|&m| m as u8 as f32).collect(),
            })
            .collect();
        mask * pad_host(&rows.iter().map(|r| Some(r.as_slice())).collect::<Vec<_>>(), width, &device)
    }

    /// What the algorithm's loss reads of this micro-batch; `predicted`: the value head's
    /// padded predictions, with a value model; `from_pass`: the old log-probs this pass read,
    /// if it gave them (else the scoring stage's, in the samples).
    fn micro_batch(
        &self,
        logp: Tensor<AD<B>, 2>,
        mask: Tensor<AD<B>, 2>,
        predicted: Option<Tensor<AD<B>, 2>>,
        from_pass: &[Option<Vec<f32>>],
    ) -> MicroBatch<AD<B>> {
        let (width, device) = (mask.dims()[1], logp.device());
        let micro = self.micro;
        let rows = |rows: Vec<Option<&[f32]>>| pad_host(&rows, width, &device);
        let old: Vec<Option<&[f32]>> = match from_pass.is_empty() {
            true => micro.iter().map(|&j| self.own(j).then(|| self.sample(j).token_logps.as_slice())).collect(),
            false => from_pass.iter().map(Option::as_deref).collect(),
        };
        // An own row's old log-probs are the sample's when the scoring stage gave them; another
        // policy's sample carries its source's mean.
        let mean_logp_source =
            micro.iter().zip(&old).map(|(&j, row)| row.map_or_else(|| self.sample(j).mean_logp(), mean_logp)).collect();
        let old_logp = rows(old);
        let value = match (predicted, &self.batch.tokens) {
            (Some(predicted), Some(t)) => Some(ValueBatch {
                advantages: rows(micro.iter().map(|&j| Some(t.advantages[j].as_slice())).collect()),
                predicted,
                old: rows(micro.iter().map(|&j| Some(self.sample(j).values.as_slice())).collect()),
                returns: rows(micro.iter().map(|&j| Some(t.returns[j].as_slice())).collect()),
            }),
            _ => None,
        };
        MicroBatch {
            old_logp,
            mean_logp_source,
            advantages: micro.iter().map(|&j| self.batch.advantages[j]).collect(),
            value,
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
        let own_tokens = mask.clone() * self.rows_where(refs.iter().map(Option::is_some), &device);
        Some(aggregate_scoped(
            kl_k3_tokens(logp.clone() * own_tokens.clone(), pad_host(&refs, width, &device)),
            own_tokens,
            LossAggregation::SeqMeanTokenMean,
            self.scopes.1,
        ))
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
            json!({"pool_index": j, "tokens": batch.views[j].trained_tokens(),
                   "mean_logp_target": rec.mean_logp_target, "mean_logp_source": rec.mean_logp_source,
                   "terms": terms.get(r)})
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
