//! One learner's update on the step's rollouts: advantages, views, mini-batches, losses,
//! gradient accumulation, global-norm clipping, AdamW.
//!
//! HACPO and naive sharing train on the whole pool (every agent's rollouts); GSPO, GSPO×2
//! and GRPO on the learner's own. Sequence-level algorithms (HACPO, naive, GSPO) take one
//! mean log-prob per response from the chunked log-prob op and hand it to the RL core's
//! tensor objectives; GRPO works per token. The KL to the frozen reference covers own
//! responses only. Everything the loss uses is also evaluated by the scalar core, which feeds
//! the metrics (clip fractions, mean ratios) and the optional `hacpo rl inspect` dumps.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use serde_json::json;

use super::agent::Agent;
use super::rollout::Rollout;
use super::view::{View, views};
use crate::config::{Algo, TrainConfig};
use crate::error::{Error, Result};
use crate::generate::score::{response_hidden, score, token_logprobs_autodiff};
use crate::rl::hacpo::{self as algo, HacpoConfig, PoolSample, SampleTerms};
use crate::rl::tensor::{SequenceBatch, hacpo_objectives};
use crate::rl::{Capabilities, LossAggregation, stats};
use crate::train::metrics::Metrics;
use crate::train::optim::GradStore;

/// What one update needs besides the agent and the pool.
pub struct UpdateContext<'a> {
    pub config: &'a TrainConfig,
    /// Group size and mini-batch size in prompts actually used (GSPO×2 doubles/halves them).
    pub group_size: usize,
    pub minibatch_prompts: usize,
    pub step: u64,
    /// Optimizer updates over the whole run (for the schedule).
    pub total_updates: u64,
    pub capabilities: &'a Capabilities,
    /// Where to write `hacpo rl inspect` inputs, if anywhere.
    pub dump_dir: Option<PathBuf>,
}

/// Timings and metrics of one learner's update.
#[derive(Debug, Default)]
pub struct UpdateReport {
    pub metrics: Metrics,
    pub retokenize_s: f64,
    pub reference_s: f64,
    pub update_s: f64,
    pub tokens: usize,
}

/// The HACPO settings in force for this algorithm.
pub fn effective_hacpo(config: &TrainConfig) -> HacpoConfig {
    HacpoConfig { naive: config.algo.hacpo.naive || config.algo.name == Algo::Naive, ..config.algo.hacpo.clone() }
}

/// `[sequences, tokens]` averaging matrix: row i holds 1/len_i over sequence i's tokens.
fn averaging<B: Backend>(lens: &[usize], device: &B::Device) -> Tensor<B, 2> {
    let total: usize = lens.iter().sum();
    let mut data = vec![0f32; lens.len() * total];
    let mut at = 0;
    for (i, &l) in lens.iter().enumerate() {
        for t in at..at + l {
            data[i * total + t] = 1.0 / l as f32;
        }
        at += l;
    }
    Tensor::from_data(TensorData::new(data, [lens.len(), total]), device)
}

/// Sum of a token vector as a one-row reduction: one thread adds it in order, so the loss is
/// the same to the last bit in every run (a whole-tensor `sum` of a long vector is split
/// across threads on the CPU backend).
fn ordered_sum<B: Backend>(t: Tensor<B, 1>) -> Tensor<B, 1> {
    t.unsqueeze::<2>().sum_dim(1).reshape([1])
}

fn vector<B: Backend>(v: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = v.len();
    Tensor::from_data(TensorData::new(v, [n]), device)
}

/// Updates `agent` on `pool` (all rollouts of the step, sorted by agent, prompt, sample).
pub fn update_learner<B: Backend>(
    agent: &mut Agent<B>,
    pool: &[Rollout],
    ctx: &UpdateContext<'_>,
) -> Result<UpdateReport> {
    let cfg = ctx.config;
    let algo_name = cfg.algo.name;
    let learner = agent.index;
    let hcfg = effective_hacpo(cfg);
    let mut report = UpdateReport::default();
    let inv_t = 1.0 / cfg.rollout.temperature.max(1e-6);

    let rollouts: Vec<&Rollout> =
        if algo_name.shares() { pool.iter().collect() } else { pool.iter().filter(|r| r.agent == learner).collect() };
    let samples: Vec<PoolSample> =
        rollouts.iter().map(|r| PoolSample { agent: r.agent, group: r.prompt_index, reward: r.reward }).collect();
    let advantages = if algo_name.shares() {
        algo::advantages(&samples, learner, ctx.capabilities, &hcfg)?
    } else {
        let rewards: Vec<f64> = samples.iter().map(|s| s.reward).collect();
        let groups: Vec<usize> = samples.iter().map(|s| s.group).collect();
        stats::grpo_advantages(&rewards, &groups, hcfg.adv_epsilon, hcfg.normalize_by_std)
    };
    let mean_src: Vec<f64> = rollouts.iter().map(|r| r.mean_logp()).collect();

    let started = Instant::now();
    let owned: Vec<Rollout> = rollouts.iter().map(|r| (*r).clone()).collect();
    let views: Vec<View> = views(agent, &owned, cfg.rollout.cross_max_prompt_tokens, cfg.rollout.max_response_tokens)?;
    report.retokenize_s = started.elapsed().as_secs_f64();

    // Reference log-probs of own responses, for the KL term.
    let kl_coef = hcfg.kl_coef;
    let started = Instant::now();
    let mut ref_logps: Vec<Option<Vec<f32>>> = vec![None; rollouts.len()];
    if kl_coef > 0.0
        && let Some(reference) = &agent.reference
    {
        let own: Vec<usize> = (0..rollouts.len()).filter(|&i| rollouts[i].agent == learner).collect();
        for chunk in own.chunks(cfg.algo.micro_batch_sequences.max(1)) {
            let req: Vec<(Vec<u32>, Vec<u32>)> =
                chunk.iter().map(|&i| (views[i].prompt_ids.clone(), views[i].response_ids.clone())).collect();
            for (&i, lp) in chunk.iter().zip(score(reference, &req, cfg.rollout.temperature.max(1e-6))?) {
                ref_logps[i] = Some(lp);
            }
        }
    }
    report.reference_s = started.elapsed().as_secs_f64();

    // Mini-batches.
    let per_minibatch = ctx.minibatch_prompts * ctx.group_size;
    if per_minibatch == 0 || !rollouts.len().is_multiple_of(per_minibatch) {
        return Err(Error::InvalidArgument(format!(
            "{} rollouts cannot be split into mini-batches of {per_minibatch} sequences",
            rollouts.len()
        )));
    }
    let count = rollouts.len() / per_minibatch;
    let minibatches = if algo_name.shares() {
        algo::minibatches(&samples, learner, count, hcfg.minibatch_order)?
    } else {
        (0..count).map(|m| (m * per_minibatch..(m + 1) * per_minibatch).collect()).collect()
    };

    let started = Instant::now();
    let device = agent.device.clone();
    let (mut pg_sum, mut kl_sum, mut norm_sum, mut lr_last) = (0.0, 0.0, 0.0, 0.0);
    let mut all_terms: Vec<SampleTerms> = Vec::new();
    for (m, mb) in minibatches.iter().enumerate() {
        let lr = cfg.algo.schedule.lr(cfg.algo.optimizer.lr, agent.optimizer.updates, ctx.total_updates);
        let n_mb = mb.len() as f64;
        let n_own_mb = mb.iter().filter(|&&i| rollouts[i].agent == learner).count().max(1) as f64;
        let mb_tokens: usize = mb.iter().map(|&i| views[i].response_ids.len()).sum();
        let mut grads = GradStore::<B>::default();
        let (mut mb_pg, mut mb_kl) = (0.0, 0.0);
        let mut dump_samples = Vec::new();
        for micro in mb.chunks(cfg.algo.micro_batch_sequences.max(1)) {
            let requests: Vec<(Vec<u32>, Vec<u32>)> =
                micro.iter().map(|&i| (views[i].prompt_ids.clone(), views[i].response_ids.clone())).collect();
            let (hidden, targets, lens) = response_hidden(&agent.model, &requests)?;
            report.tokens += targets.len();
            let logp = token_logprobs_autodiff(hidden, agent.model.lm_head_weight(), &targets, inv_t);
            let n_tok = targets.len();
            let mean = averaging(&lens, &device).matmul(logp.clone().reshape([n_tok, 1])).reshape([lens.len()]);
            let host_mean: Vec<f64> = mean.clone().into_data().convert::<f64>().into_vec::<f64>().expect("f64");

            let pg = if algo_name == Algo::Grpo {
                // Token level: per-token ratio against the old per-token log-probs.
                let mut old = Vec::with_capacity(n_tok);
                let mut adv = Vec::with_capacity(n_tok);
                let mut w = Vec::with_capacity(n_tok);
                for (&i, &l) in micro.iter().zip(&lens) {
                    old.extend_from_slice(&rollouts[i].token_logps);
                    adv.extend(std::iter::repeat_n(advantages[i] as f32, l));
                    let weight = match cfg.algo.grpo_loss_agg {
                        LossAggregation::TokenMean => 1.0 / mb_tokens.max(1) as f32,
                        LossAggregation::SeqMeanTokenMean => 1.0 / (n_mb as f32 * l as f32),
                    };
                    w.extend(std::iter::repeat_n(weight, l));
                }
                let (old, adv, w) = (vector(old, &device), vector(adv, &device), vector(w, &device));
                let ratio = (logp.clone() - old).exp();
                let (lo, hi) = (1.0 - cfg.algo.grpo_eps_low, 1.0 + cfg.algo.grpo_eps_high);
                let obj = (ratio.clone() * adv.clone()).min_pair(ratio.clamp(lo, hi) * adv);
                ordered_sum(obj * w).neg()
            } else {
                let terms: Vec<SampleTerms> = micro
                    .iter()
                    .zip(&host_mean)
                    .map(|(&i, &tgt)| {
                        algo::sample_terms(
                            rollouts[i].agent,
                            learner,
                            advantages[i],
                            tgt,
                            mean_src[i],
                            m,
                            ctx.capabilities,
                            &hcfg,
                        )
                    })
                    .collect();
                let srcs: Vec<f64> = micro.iter().map(|&i| mean_src[i]).collect();
                let batch = SequenceBatch::from_terms(&terms, &srcs);
                if ctx.dump_dir.is_some() {
                    for ((&i, &tgt), t) in micro.iter().zip(&host_mean).zip(&terms) {
                        dump_samples.push((i, tgt, *t));
                    }
                }
                all_terms.extend(terms);
                hacpo_objectives(mean, &batch, m, &hcfg).sum().div_scalar(n_mb).neg()
            };

            let mut loss = pg.clone();
            let mut kl_value = 0.0;
            if kl_coef > 0.0 && micro.iter().any(|&i| ref_logps[i].is_some()) {
                let mut reference = Vec::with_capacity(n_tok);
                let mut w = Vec::with_capacity(n_tok);
                for (&i, &l) in micro.iter().zip(&lens) {
                    match &ref_logps[i] {
                        Some(r) => {
                            reference.extend_from_slice(r);
                            w.extend(std::iter::repeat_n(1.0 / (l as f32 * n_own_mb as f32), l));
                        }
                        None => {
                            reference.extend(std::iter::repeat_n(0.0, l));
                            w.extend(std::iter::repeat_n(0.0, l));
                        }
                    }
                }
                let x = vector(reference, &device) - logp;
                let kl = (x.clone().exp() - x - 1.0).clamp(-10.0, 10.0);
                let kl = ordered_sum(kl * vector(w, &device));
                kl_value = kl.clone().into_scalar().elem::<f64>();
                loss = loss + kl.mul_scalar(kl_coef);
            }
            let pg_value = pg.into_scalar().elem::<f64>();
            let loss_value = pg_value + kl_coef * kl_value;
            if !loss_value.is_finite() {
                return Err(Error::NonFinite {
                    agent: agent.name.clone(),
                    step: ctx.step,
                    what: "loss",
                    value: loss_value,
                });
            }
            mb_pg += pg_value;
            mb_kl += kl_value;
            let g = loss.backward();
            grads.accumulate(&agent.model, &g);
        }
        let norm = grads.clip_global_norm(cfg.algo.grad_clip);
        if !norm.is_finite() {
            return Err(Error::NonFinite {
                agent: agent.name.clone(),
                step: ctx.step,
                what: "gradient norm",
                value: norm,
            });
        }
        agent.model = agent.optimizer.step(agent.model.clone(), grads, lr);
        if let Some(dir) = &ctx.dump_dir {
            write_dump(dir, ctx, learner, m, &hcfg, &dump_samples, &rollouts, &mean_src, mb_pg)?;
        }
        pg_sum += mb_pg;
        kl_sum += mb_kl;
        norm_sum += norm;
        lr_last = lr;
    }
    report.update_s = started.elapsed().as_secs_f64();
    agent.policy_version += 1;

    let own: Vec<&&Rollout> = rollouts.iter().filter(|r| r.agent == learner).collect();
    let n_own = own.len().max(1) as f64;
    let count_f = minibatches.len().max(1) as f64;
    let m = &mut report.metrics;
    m.insert("critic/score/mean".into(), own.iter().map(|r| r.reward).sum::<f64>() / n_own);
    m.insert("critic/advantages/mean".into(), advantages.iter().sum::<f64>() / advantages.len().max(1) as f64);
    m.insert("actor/pg_loss".into(), pg_sum / count_f);
    m.insert("actor/kl_loss".into(), kl_sum / count_f);
    m.insert("actor/grad_norm".into(), norm_sum / count_f);
    m.insert("actor/lr".into(), lr_last);
    m.insert("response_length/mean".into(), own.iter().map(|r| r.response_ids.len() as f64).sum::<f64>() / n_own);
    m.insert(
        "response_length/clip_ratio".into(),
        own.iter().filter(|r| r.finish_reason == crate::generate::FinishReason::Length).count() as f64 / n_own,
    );
    m.insert("hacpo/capability".into(), ctx.capabilities.values.get(learner).copied().unwrap_or(1.0));
    let cross: Vec<&SampleTerms> = all_terms.iter().filter(|t| t.cross).collect();
    let selfs: Vec<&SampleTerms> = all_terms.iter().filter(|t| !t.cross).collect();
    let frac = |v: &[&SampleTerms], f: &dyn Fn(&SampleTerms) -> bool| {
        if v.is_empty() { 0.0 } else { v.iter().filter(|t| f(t)).count() as f64 / v.len() as f64 }
    };
    let mean_of = |v: &[&SampleTerms], f: &dyn Fn(&SampleTerms) -> f64| {
        if v.is_empty() { 0.0 } else { v.iter().map(|t| f(t)).sum::<f64>() / v.len() as f64 }
    };
    if algo_name.shares() {
        m.insert("hacpo/omega_mean".into(), mean_of(&cross, &|t| t.coef));
        m.insert("hacpo/cross_ratio_mean".into(), mean_of(&cross, &|t| t.ratio));
        m.insert("hacpo/cross_clip_frac".into(), frac(&cross, &|t| t.grad_weight == 0.0 && t.advantage != 0.0));
    }
    if algo_name != Algo::Grpo {
        m.insert("hacpo/self_clip_frac".into(), frac(&selfs, &|t| t.grad_weight == 0.0 && t.advantage != 0.0));
    }
    Ok(report)
}

/// Writes one mini-batch's numbers for auditing against the RL core: the whole pool (the
/// advantages depend on every response of a prompt), and for each response of the mini-batch
/// the log-probs the loss used and the terms it computed.
#[allow(clippy::too_many_arguments)]
fn write_dump(
    dir: &std::path::Path,
    ctx: &UpdateContext<'_>,
    learner: usize,
    m: usize,
    hcfg: &HacpoConfig,
    samples: &[(usize, f64, SampleTerms)],
    rollouts: &[&Rollout],
    mean_src: &[f64],
    pg_loss: f64,
) -> Result<()> {
    let pool: Vec<serde_json::Value> = rollouts
        .iter()
        .map(|r| json!({"agent": r.agent, "prompt": r.prompt_index, "reward": r.reward, "text": r.text}))
        .collect();
    let minibatch: Vec<serde_json::Value> = samples
        .iter()
        .map(|(i, tgt, t)| {
            json!({"pool_index": i, "mean_logp_target": tgt, "mean_logp_source": mean_src[*i], "terms": t})
        })
        .collect();
    let body = json!({
        "step": ctx.step, "learner": learner, "minibatch_index": m, "capabilities": ctx.capabilities.values,
        "config": hcfg, "pool": pool, "minibatch": minibatch, "pg_loss": pg_loss,
    });
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let path = dir.join(format!("step-{:06}-learner-{learner}-mb-{m}.json", ctx.step));
    crate::error::write_atomic(&path, serde_json::to_string_pretty(&body).expect("json").as_bytes())
}
