//! The policy losses as burn tensor expressions, for training with autodiff.
//!
//! A thin layer over the scalar core ([`super::objective`], [`super::hacpo`]): the same
//! formulas written with tensor ops so that gradients reach the model. Stop-gradients are
//! `detach()`, clips are `clamp` (zero gradient outside the band) and PPO's pessimism is
//! `min_pair`. The tests check every gradient here against the scalar core's analytic one.
//!
//! Token-level inputs are padded `[sequences, max_len]` tensors with a 0/1 `mask` of the same
//! shape (verl's `response_mask`); [`pad_tokens`] turns the trainer's flat per-token log-probs
//! into that layout on the device. Every sum that becomes a loss runs as a one-row reduction
//! ([`ordered_sum`]) so that a CPU run gives the same loss to the last bit every time.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use super::hacpo::HacpoConfig;
use super::objective::LossAggregation;
use super::records::SampleTerms;

/// Per-sequence constants of a HACPO mini-batch for one learner.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SequenceBatch {
    /// Old-policy mean log-prob (own responses) or the source agent's (cross).
    pub mean_logp_source: Vec<f32>,
    /// Advantage before ω.
    pub advantage: Vec<f32>,
    /// ω(source, learner); 1 for own responses.
    pub coef: Vec<f32>,
    pub cross: Vec<bool>,
}

impl SequenceBatch {
    pub fn len(&self) -> usize {
        self.advantage.len()
    }

    pub fn is_empty(&self) -> bool {
        self.advantage.is_empty()
    }

    /// From the scalar core's terms and the source log-probs, in the same order.
    pub fn from_terms(terms: &[SampleTerms], mean_logp_source: &[f64]) -> Self {
        SequenceBatch {
            mean_logp_source: mean_logp_source.iter().map(|&x| x as f32).collect(),
            advantage: terms.iter().map(|t| t.advantage as f32).collect(),
            coef: terms.iter().map(|t| t.coef as f32).collect(),
            cross: terms.iter().map(|t| t.cross).collect(),
        }
    }
}

/// A host vector as a device tensor.
pub fn vector<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// The sum of all elements as a one-row reduction in a fixed order, so the result is the same
/// to the last bit in every run (a whole-tensor `sum` is split across threads on the CPU
/// backend); in blocks, since a long row reduction loses its tail on wgpu (backend/reduce.rs).
pub fn ordered_sum<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 1> {
    let n = t.shape().num_elements();
    crate::backend::reduce::row_sum(t.reshape([1, n])).reshape([1])
}

/// Flat per-token values `[Σ lens]` (sequences back to back) → padded `[n, max_len]` values
/// and their 0/1 mask. Padding holds 0 (and receives no gradient), so the padded values can be
/// combined with padded host constants without producing inf or NaN.
pub fn pad_tokens<B: Backend>(flat: Tensor<B, 1>, lens: &[usize]) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let device = flat.device();
    let width = lens.iter().copied().max().unwrap_or(0).max(1);
    let n = lens.len();
    let mut index = Vec::with_capacity(n * width);
    let mut mask = Vec::with_capacity(n * width);
    let mut at = 0i64;
    for &l in lens {
        for t in 0..width {
            index.push(if t < l { at + t as i64 } else { 0 });
            mask.push(if t < l { 1f32 } else { 0.0 });
        }
        at += l as i64;
    }
    let index: Tensor<B, 1, Int> = Tensor::from_data(TensorData::new(index, [n * width]), &device);
    let mask: Tensor<B, 2> = Tensor::from_data(TensorData::new(mask, [n, width]), &device);
    let values = flat.select(0, index).reshape([n, width]) * mask.clone();
    (values, mask)
}

/// Host per-sequence token values → padded `[n, width]` (0 where a row is shorter or absent).
pub fn pad_host<B: Backend>(rows: &[Option<&[f32]>], width: usize, device: &B::Device) -> Tensor<B, 2> {
    let mut data = vec![0f32; rows.len() * width];
    for (i, row) in rows.iter().enumerate() {
        if let Some(r) = row {
            let l = r.len().min(width);
            data[i * width..i * width + l].copy_from_slice(&r[..l]);
        }
    }
    Tensor::from_data(TensorData::new(data, [rows.len(), width]), device)
}

/// Per-sequence HACPO objectives `[n]` given the learner's mean log-probs `[n]` (with grad) at
/// mini-batch update `minibatch_index`: GSPO on own sequences, the stepwise-clipped,
/// exponentially importance-weighted, ω-scaled ratio on cross sequences.
pub fn hacpo_objectives<B: Backend>(
    mean_logp_target: Tensor<B, 1>,
    batch: &SequenceBatch,
    minibatch_index: usize,
    cfg: &HacpoConfig,
) -> Tensor<B, 1> {
    let device = mean_logp_target.device();
    let adv = vector::<B>(batch.advantage.clone(), &device);
    let coef = vector::<B>(batch.coef.clone(), &device);
    let cross_mask = vector::<B>(batch.cross.iter().map(|&c| c as u8 as f32).collect(), &device);
    let own_mask = cross_mask.clone().neg().add_scalar(1.0);

    let max = cfg.max_abs_log_ratio;
    let s = (mean_logp_target - vector::<B>(batch.mean_logp_source.clone(), &device)).clamp(-max, max).exp();

    let own = (s.clone() * adv.clone()).min_pair(s.clone().clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv.clone());
    let c = s.clamp(cfg.cross_lower_bound(minibatch_index), 1.0);
    let cross = c.clone() * c.detach().powf_scalar(cfg.effective_alpha()) * coef * adv;
    own * own_mask + cross * cross_mask
}

/// The HACPO policy loss of a mini-batch: `−mean(objectives)`.
pub fn hacpo_policy_loss<B: Backend>(
    mean_logp_target: Tensor<B, 1>,
    batch: &SequenceBatch,
    minibatch_index: usize,
    cfg: &HacpoConfig,
) -> Tensor<B, 1> {
    hacpo_objectives(mean_logp_target, batch, minibatch_index, cfg).mean().neg()
}

/// Mean over each sequence's valid tokens: `[n, L]` → `[n]`.
pub fn sequence_mean<B: Backend>(values: Tensor<B, 2>, mask: Tensor<B, 2>) -> Tensor<B, 1> {
    let n = values.dims()[0];
    let lengths = mask.clone().sum_dim(1).clamp_min(1.0);
    ((values * mask).sum_dim(1) / lengths).reshape([n])
}

/// Aggregates per-token values `[n, L]` under `mask` into a scalar `[1]` (for
/// `SeqMeanTokenSumNorm` the constant length is the padded width `L`, verl's default).
pub fn aggregate<B: Backend>(values: Tensor<B, 2>, mask: Tensor<B, 2>, mode: LossAggregation) -> Tensor<B, 1> {
    let [n, width] = values.dims();
    match mode {
        LossAggregation::TokenMean => ordered_sum(values * mask.clone()) / ordered_sum(mask).clamp_min(1.0),
        LossAggregation::SeqMeanTokenMean => ordered_sum(sequence_mean(values, mask)).div_scalar(n.max(1) as f64),
        LossAggregation::SeqMeanTokenSumNorm => ordered_sum(values * mask).div_scalar((n.max(1) * width) as f64),
    }
}

/// What a micro-batch's share of a mini-batch aggregate is normalised by: summing
/// [`aggregate_scoped`] over the micro-batches of a mini-batch gives the mini-batch's
/// [`aggregate`] (gradient accumulation without a bias towards small micro-batches).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AggregationScope {
    /// Sequences in the mini-batch (those the mask selects).
    pub sequences: usize,
    /// Valid tokens in the mini-batch.
    pub tokens: usize,
    /// The constant length of `SeqMeanTokenSumNorm`.
    pub norm_length: usize,
}

/// A micro-batch's share of the mini-batch aggregate of per-token values `[n, L]`.
pub fn aggregate_scoped<B: Backend>(
    values: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    mode: LossAggregation,
    scope: AggregationScope,
) -> Tensor<B, 1> {
    match mode {
        LossAggregation::TokenMean => ordered_sum(values * mask).div_scalar(scope.tokens.max(1) as f64),
        LossAggregation::SeqMeanTokenMean => {
            ordered_sum(sequence_mean(values, mask)).div_scalar(scope.sequences.max(1) as f64)
        }
        LossAggregation::SeqMeanTokenSumNorm => {
            ordered_sum(values * mask).div_scalar((scope.sequences.max(1) * scope.norm_length.max(1)) as f64)
        }
    }
}

fn advantage_column<B: Backend>(advantage: &[f32], device: &B::Device) -> Tensor<B, 2> {
    vector::<B>(advantage.to_vec(), device).reshape([advantage.len(), 1])
}

/// GRPO's per-token clipped surrogate `[n, L]` before aggregation.
pub fn grpo_surrogate<B: Backend>(
    logp: Tensor<B, 2>,
    old_logp: Tensor<B, 2>,
    advantage: &[f32],
    eps_low: f64,
    eps_high: f64,
) -> Tensor<B, 2> {
    let adv = advantage_column::<B>(advantage, &logp.device());
    clipped_surrogate(logp, old_logp, adv, eps_low, eps_high)
}

/// PPO's per-token clipped surrogate `min(ρ·A, clip(ρ)·A)` `[n, L]`, with one advantage per
/// response (`[n, 1]`, broadcast) or per token (`[n, L]`, GAE).
pub fn clipped_surrogate<B: Backend>(
    logp: Tensor<B, 2>,
    old_logp: Tensor<B, 2>,
    advantage: Tensor<B, 2>,
    eps_low: f64,
    eps_high: f64,
) -> Tensor<B, 2> {
    let ratio = (logp - old_logp).exp();
    (ratio.clone() * advantage.clone()).min_pair(ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantage)
}

/// PPO's clipped value loss per token: `½·max((V − R)², (V_old + clip(V − V_old, ±c) − R)²)`.
pub fn clipped_value_loss<B: Backend>(
    values: Tensor<B, 2>,
    old_values: Tensor<B, 2>,
    returns: Tensor<B, 2>,
    cliprange: f64,
) -> Tensor<B, 2> {
    let clipped = old_values.clone() + (values.clone() - old_values).clamp(-cliprange, cliprange);
    let plain = (values - returns.clone()).powi_scalar(2);
    plain.max_pair((clipped - returns).powi_scalar(2)).mul_scalar(0.5)
}

/// GRPO's per-token clipped surrogate, aggregated: the objective to maximise.
pub fn grpo_objective<B: Backend>(
    logp: Tensor<B, 2>,
    old_logp: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    advantage: &[f32],
    eps_low: f64,
    eps_high: f64,
    mode: LossAggregation,
) -> Tensor<B, 1> {
    aggregate(grpo_surrogate(logp, old_logp, advantage, eps_low, eps_high), mask, mode)
}

/// GSPO in its token form (verl): every token carries `s_{i,t} = sg(s_i)·π(y_t)/sg(π(y_t))`,
/// whose value is the sequence ratio `s_i` and whose gradient is per token; aggregated with
/// `seq-mean-token-mean` it equals sequence-level GSPO.
#[allow(clippy::too_many_arguments)]
pub fn gspo_token_objective<B: Backend>(
    logp: Tensor<B, 2>,
    old_logp: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    advantage: &[f32],
    eps_low: f64,
    eps_high: f64,
    max_abs_log_ratio: f64,
    mode: LossAggregation,
) -> Tensor<B, 1> {
    let [n, len] = logp.dims();
    let adv = advantage_column::<B>(advantage, &logp.device());
    let mean_log_ratio = sequence_mean(logp.clone() - old_logp, mask.clone())
        .clamp(-max_abs_log_ratio, max_abs_log_ratio)
        .reshape([n, 1])
        .detach();
    let s = (mean_log_ratio.expand([n, len]) + logp.clone() - logp.detach()).exp();
    let surrogate = (s.clone() * adv.clone()).min_pair(s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv);
    aggregate(surrogate, mask, mode)
}

/// The k3 KL estimator to a reference per token `[n, L]`, clamped to [−10, 10].
pub fn kl_k3_tokens<B: Backend>(logp: Tensor<B, 2>, ref_logp: Tensor<B, 2>) -> Tensor<B, 2> {
    let x = ref_logp - logp;
    (x.clone().exp() - x - 1.0).clamp(-10.0, 10.0)
}

/// The k3 KL estimator to a reference, per token, clamped to [−10, 10], aggregated.
pub fn kl_k3<B: Backend>(
    logp: Tensor<B, 2>,
    ref_logp: Tensor<B, 2>,
    mask: Tensor<B, 2>,
    mode: LossAggregation,
) -> Tensor<B, 1> {
    aggregate(kl_k3_tokens(logp, ref_logp), mask, mode)
}
