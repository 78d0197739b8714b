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
    let (mut pg_sum, mut kl_sum, mut norm_sum, mut lr_last, mut vf_sum) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut applied = 0usize;
    let mut all_terms: Vec<SampleTerms> = Vec::new();
    for (m, mb) in minibatches.iter().enumerate() {
        // The policy's own rate (`[[agents]] lr`, else `algo.optimizer.lr`) on the shared schedule.
        let lr = settings.schedule.lr(policy.optimizer.config.lr, policy.optimizer.updates, settings.total_updates);
        let step = minibatch_step(policy, algo, batch, settings, m, mb)?;
        report.tokens += step.tokens;
        let norm = step.grads_norm;
        // f16's loss scaler skips a step whose scaled gradients overflowed (and halves the scale).
        let apply = match policy.optimizer.scaler.as_mut() {
            Some(scaler) => {
                let apply = scaler.update(norm);
                if scaler.exhausted() {
                    return Err(Error::NonFinite {
                        agent: policy.name.clone(),
                        step: settings.step,
                        what: "gradient norm (with the f16 loss scale below 1)",
                        value: norm,
                    });
                }
                apply
            }
            None => true,
        };
        if apply {
            policy.model = policy.optimizer.step(policy.model.clone(), step.grads, lr);
            if let (Some(head), Some(grad), Some(c)) = (policy.value_head.as_mut(), step.head_grad, &batch.critic) {
                let config = crate::train::optim::AdamWConfig { weight_decay: 0.0, ..policy.optimizer.config.clone() };
                head.step(&clip_host(grad, settings.grad_clip), c.settings.critic_lr, &config);
            }
            norm_sum += norm;
            applied += 1;
        }
        vf_sum += step.vf;
        let records: Vec<SequenceRecord> = mb
            .iter()
            .zip(&step.mean_logp_target)
            .map(|(&j, &target)| SequenceRecord {
                source: batch.pool[j].agent,
                advantage: batch.advantages[j],
                mean_logp_target: target,
                mean_logp_source: batch.samples[batch.indices[j]].mean_logp(),
                minibatch_index: m,
            })
            .collect();
        let terms = algo.sequence_terms(learner, &records);
        if let Some(dir) = &settings.dump_dir {
            write_dump(dir, settings.step, learner, m, algo, batch, mb, &records, &terms, step.pg)?;
        }
        all_terms.extend(terms);
        pg_sum += step.pg;
        kl_sum += step.kl;
        lr_last = lr;
    }
    policy.version += 1;
    report.update_s = started.elapsed().as_secs_f64();

    let count = minibatches.len().max(1) as f64;
    let m = &mut report.metrics;
    m.insert("critic/advantages/mean".into(), batch.advantages.iter().sum::<f64>() / n.max(1) as f64);
    m.insert("actor/pg_loss".into(), pg_sum / count);
    m.insert("actor/kl_loss".into(), kl_sum / count);
    m.insert("actor/grad_norm".into(), norm_sum / applied.max(1) as f64);
    if let Some(scaler) = &policy.optimizer.scaler {
        m.insert("actor/loss_scale".into(), scaler.scale);
        m.insert("actor/skipped_updates".into(), (minibatches.len() - applied) as f64);
    }
    m.insert("actor/lr".into(), lr_last);
    if batch.critic.is_some() {
        m.insert("critic/vf_loss".into(), vf_sum / count);
    }
    for (k, v) in algo.metrics(learner, &all_terms) {
        m.insert(k.into(), v);
    }
    Ok(report)
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
    let learner = policy.index;
    // The backward pass runs on `loss_scale ×` the loss (f16 compute); gradients are divided
    // back before clipping.
    let loss_scale = policy.optimizer.scaler.map_or(1.0, |s| s.scale);
    let own = |j: usize| batch.pool[j].agent == learner;
    let scope = AggregationScope {
        sequences: mb.len(),
        tokens: mb.iter().map(|&j| batch.views[j].response_ids.len()).sum(),
        norm_length: settings.norm_length,
    };
    let kl_scope = AggregationScope { sequences: mb.iter().filter(|&&j| own(j)).count().max(1), ..scope };
    let with_kl = settings.kl_coef > 0.0;
    let mut grads = GradStore::<B>::default();
    let (mut pgs, mut kls, mut means, mut vfs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut head_grad: Option<Vec<f64>> = None;
    let mut tokens = 0;
    for micro in mb.chunks(settings.micro_batch_sequences.max(1)) {
        let requests: Vec<(Vec<u32>, Vec<u32>)> =
            micro.iter().map(|&j| (batch.views[j].prompt_ids.clone(), batch.views[j].response_ids.clone())).collect();
        let (hidden, targets, lens, trunk) = if settings.gradient_checkpointing {
            let r = crate::train::recompute::forward(&policy.model, &requests)?;
            (r.hidden, r.targets, r.lens, Some(r.trunk))
        } else {
            let (hidden, targets, lens) = response_hidden(&policy.model, &requests)?;
            (hidden, targets, lens, None)
        };
        tokens += targets.len();
        // The critic reads the same hidden states; its loss trains the trunk too.
        let critic = match (&batch.critic, &policy.value_head) {
            (Some(c), Some(head)) => Some((c, head.values_tracked(hidden.clone()))),
            _ => None,
        };
        let flat = token_logprobs_autodiff(hidden, policy.model.lm_head_weight(), &targets, settings.inv_temperature);
        let (logp, mask) = pad_tokens(flat, &lens);
        let width = mask.dims()[1];
        let device = logp.device();
        let sample = |j: usize| &batch.samples[batch.indices[j]];
        let old: Vec<Option<&[f32]>> =
            micro.iter().map(|&j| own(j).then(|| sample(j).token_logps.as_slice())).collect();
        let micro_batch = MicroBatch {
            logp: logp.clone(),
            mask: mask.clone(),
            old_logp: pad_host(&old, width, &device),
            mean_logp_source: micro.iter().map(|&j| sample(j).mean_logp()).collect(),
            advantages: micro.iter().map(|&j| batch.advantages[j]).collect(),
            token_advantages: critic.as_ref().map(|(c, _)| {
                let rows: Vec<Option<&[f32]>> = micro.iter().map(|&j| Some(c.advantages[j].as_slice())).collect();
                pad_host(&rows, width, &device)
            }),
            sources: micro.iter().map(|&j| batch.pool[j].agent).collect(),
            learner,
            minibatch_index: m,
            scope,
        };
        let pg = algo.policy_loss(&micro_batch);
        let mut loss = pg.clone();
        // Own samples only: another policy's sample carries that policy's reference log-probs,
        // over its own tokens, which are not this learner's reference.
        let refs: Vec<Option<&[f32]>> =
            micro.iter().map(|&j| if own(j) { batch.ref_logps[batch.indices[j]].as_deref() } else { None }).collect();
        if with_kl && refs.iter().any(Option::is_some) {
            // The KL term covers own samples: other policies' have no reference log-probs here.
            // Their rows are zeroed before the exponential (0 − 0), not only masked after it:
            // exp of a very negative log-prob overflows, and 0 · inf in the backward is NaN.
            let own_mask: Vec<f32> = refs.iter().map(|r| r.is_some() as u8 as f32).collect();
            let own_mask = crate::rl::tensor::vector::<AD<B>>(own_mask, &device).reshape([micro.len(), 1]);
            let own_tokens = mask.clone() * own_mask;
            let kl = aggregate_scoped(
                kl_k3_tokens(logp.clone() * own_tokens.clone(), pad_host(&refs, width, &device)),
                own_tokens,
                LossAggregation::SeqMeanTokenMean,
                kl_scope,
            );
            loss = loss + kl.clone().mul_scalar(settings.kl_coef);
            kls.push(kl.detach());
        }
        let mut leaves = None;
        if let Some((c, (values, head))) = critic {
            let (values, _) = pad_tokens(values, &lens);
            let old: Vec<Option<&[f32]>> = micro.iter().map(|&j| Some(sample(j).values.as_slice())).collect();
            let returns: Vec<Option<&[f32]>> = micro.iter().map(|&j| Some(c.returns[j].as_slice())).collect();
            let vf = aggregate_scoped(
                clipped_value_loss(
                    values,
                    pad_host(&old, width, &device),
                    pad_host(&returns, width, &device),
                    c.settings.cliprange_value,
                ),
                mask.clone(),
                LossAggregation::TokenMean,
                scope,
            );
            loss = loss + vf.clone().mul_scalar(c.settings.vf_coef);
            vfs.push(vf.detach());
            leaves = Some(head);
        }
        means.push(sequence_mean(logp.detach(), mask.detach()));
        pgs.push(pg.detach());
        let g = if loss_scale == 1.0 { loss.backward() } else { loss.mul_scalar(loss_scale).backward() };
        grads.accumulate(&policy.model, &g);
        if let Some(trunk) = trunk {
            trunk.backward(&policy.model, &g, &mut grads);
        }
        if let Some(head) = leaves {
            let g: Vec<f64> = head.gradient(&g).into_iter().map(|x| x / loss_scale).collect();
            head_grad = Some(match head_grad.take() {
                Some(sum) => sum.iter().zip(&g).map(|(a, b)| a + b).collect(),
                None => g,
            });
        }
    }
    // One read-back for the whole mini-batch: losses, KL and every sequence's mean log-prob.
    let (n_pg, n_kl, n_vf) = (pgs.len(), kls.len(), vfs.len());
    let vf_coef = batch.critic.as_ref().map_or(0.0, |c| c.settings.vf_coef);
    let mut parts = pgs;
    parts.extend(kls);
    parts.extend(vfs);
    parts.extend(means);
    let host: Vec<f64> = Tensor::cat(parts, 0).into_data().convert::<f64>().into_vec::<f64>().expect("f64 data");
    let pg: f64 = host[..n_pg].iter().sum();
    let kl: f64 = host[n_pg..n_pg + n_kl].iter().sum();
    let vf: f64 = host[n_pg + n_kl..n_pg + n_kl + n_vf].iter().sum();
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
    Ok(MinibatchStep {
        grads,
        grads_norm: norm,
        pg,
        kl,
        mean_logp_target: host[n_pg + n_kl + n_vf..].to_vec(),
        tokens,
        head_grad,
        vf,
    })
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
