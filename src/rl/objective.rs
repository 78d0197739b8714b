//! Per-token and per-sequence policy objectives with their analytic gradients
//! (docs/algorithms.md §1, §2.6–2.9). Plain f64 over scalars and slices: the reference the tensor
//! losses in [`super::tensor`] are checked against.
//!
//! Every function returns the objective (to be maximised) and its derivative with respect to
//! the *new* policy's log-probability (a token's ℓ, or a sequence's mean ℓ).

use serde::{Deserialize, Serialize};

/// A value and its derivative.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WithGrad {
    pub value: f64,
    pub grad: f64,
}

/// PPO's pessimistic clipped surrogate `min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)`, `ρ = e^x`,
/// with the derivative with respect to `x` (the new log-probability minus the old).
/// Inside the band both branches agree; outside it the clipped branch, when it is the
/// minimum, carries no gradient.
pub fn clipped_surrogate(log_ratio: f64, advantage: f64, eps_low: f64, eps_high: f64) -> WithGrad {
    let rho = log_ratio.exp();
    let clipped_rho = rho.clamp(1.0 - eps_low, 1.0 + eps_high);
    let (unclipped, clipped) = (rho * advantage, clipped_rho * advantage);
    if unclipped <= clipped || clipped_rho == rho {
        WithGrad { value: unclipped, grad: rho * advantage }
    } else {
        WithGrad { value: clipped, grad: 0.0 }
    }
}

/// Clamps a log-ratio to ±`max_abs`; the flag says whether it was inside (gradient flows).
pub fn clamp_log_ratio(log_ratio: f64, max_abs: f64) -> (f64, bool) {
    (log_ratio.clamp(-max_abs, max_abs), log_ratio.abs() <= max_abs)
}

/// GSPO's sequence objective: the clipped surrogate on the length-normalised log-ratio
/// `mean_new − mean_old` (clamped to ±`max_abs_log_ratio`); derivative w.r.t. `mean_new`.
pub fn gspo_sequence(
    mean_logp_new: f64,
    mean_logp_old: f64,
    advantage: f64,
    eps_low: f64,
    eps_high: f64,
    max_abs_log_ratio: f64,
) -> WithGrad {
    let (log_s, inside) = clamp_log_ratio(mean_logp_new - mean_logp_old, max_abs_log_ratio);
    let o = clipped_surrogate(log_s, advantage, eps_low, eps_high);
    WithGrad { value: o.value, grad: if inside { o.grad } else { 0.0 } }
}

/// HACPO's cross-agent objective (§2.7–2.8): with `s = exp(clamp(mean_tgt − mean_src, ±10))`
/// and `c = clamp(s, lower, 1)`, the value is `c · sg(c)^α · coef · A`; the derivative with
/// respect to `mean_tgt` is `s^{1+α} · coef · A` inside `[lower, 1]` and 0 outside.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossTerm {
    pub ratio: f64,
    pub clipped_ratio: f64,
    pub objective: WithGrad,
}

#[allow(clippy::too_many_arguments)]
pub fn cross_sequence(
    mean_logp_target: f64,
    mean_logp_source: f64,
    advantage: f64,
    coef: f64,
    lower: f64,
    alpha: f64,
    max_abs_log_ratio: f64,
) -> CrossTerm {
    let (log_s, inside) = clamp_log_ratio(mean_logp_target - mean_logp_source, max_abs_log_ratio);
    let s = log_s.exp();
    let c = s.clamp(lower.min(1.0), 1.0);
    let weight = c.powf(alpha) * coef * advantage;
    let in_band = inside && s >= lower && s <= 1.0;
    CrossTerm {
        ratio: s,
        clipped_ratio: c,
        objective: WithGrad { value: c * weight, grad: if in_band { s * weight } else { 0.0 } },
    }
}

/// The k3 ("low_var_kl") estimator of KL(π‖π_ref) for one token, clamped to [−10, 10] as in
/// verl: `e^{ℓ_ref − ℓ} − (ℓ_ref − ℓ) − 1`; derivative w.r.t. ℓ is `1 − e^{ℓ_ref − ℓ}`.
pub fn kl_k3(logp: f64, ref_logp: f64) -> WithGrad {
    let x = ref_logp - logp;
    let kl = x.exp() - x - 1.0;
    let clamped = kl.clamp(-10.0, 10.0);
    WithGrad { value: clamped, grad: if clamped == kl { 1.0 - x.exp() } else { 0.0 } }
}

/// How per-token terms become one loss (verl's `loss_agg_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAggregation {
    /// Mean over every valid token of the mini-batch.
    TokenMean,
    /// Mean over each sequence's tokens, then over sequences.
    SeqMeanTokenMean,
    /// Sum over each sequence's tokens divided by a constant length, then mean over sequences
    /// (Dr. GRPO: no per-response length normalisation, so long wrong answers are not favoured).
    SeqMeanTokenSumNorm,
}

impl LossAggregation {
    /// The weight of each token of a sequence of `len` tokens in a batch with these lengths
    /// (`SeqMeanTokenSumNorm` divides by the longest sequence; see [`Self::token_weight_norm`]).
    pub fn token_weight(self, len: usize, lengths: &[usize]) -> f64 {
        self.token_weight_norm(len, lengths, lengths.iter().copied().max().unwrap_or(1))
    }

    /// The weight of each token with an explicit constant length for `SeqMeanTokenSumNorm`.
    pub fn token_weight_norm(self, len: usize, lengths: &[usize], norm_length: usize) -> f64 {
        match self {
            LossAggregation::TokenMean => 1.0 / lengths.iter().sum::<usize>().max(1) as f64,
            LossAggregation::SeqMeanTokenMean => 1.0 / (lengths.len().max(1) * len.max(1)) as f64,
            LossAggregation::SeqMeanTokenSumNorm => 1.0 / (lengths.len().max(1) * norm_length.max(1)) as f64,
        }
    }

    /// Aggregates per-token values (one vector per sequence).
    pub fn aggregate(self, values: &[Vec<f64>]) -> f64 {
        let lengths: Vec<usize> = values.iter().map(Vec::len).collect();
        let norm = lengths.iter().copied().max().unwrap_or(1);
        self.aggregate_norm(values, norm)
    }

    /// Aggregates per-token values with a constant length for `SeqMeanTokenSumNorm`.
    pub fn aggregate_norm(self, values: &[Vec<f64>], norm_length: usize) -> f64 {
        let lengths: Vec<usize> = values.iter().map(Vec::len).collect();
        values.iter().map(|v| v.iter().sum::<f64>() * self.token_weight_norm(v.len(), &lengths, norm_length)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipped_surrogate_branches() {
        let (lo, hi) = (0.2, 0.28);
        // Positive advantage above the band: clipped, no gradient.
        let o = clipped_surrogate(1.5f64.ln(), 2.0, lo, hi);
        assert!((o.value - 1.28 * 2.0).abs() < 1e-12 && o.grad == 0.0);
        // Positive advantage below the band: pessimistic unclipped branch keeps its gradient.
        let o = clipped_surrogate(0.5f64.ln(), 2.0, lo, hi);
        assert!((o.value - 1.0).abs() < 1e-12 && (o.grad - 1.0).abs() < 1e-12);
        // Negative advantage below the band: clipped, no gradient.
        let o = clipped_surrogate(0.5f64.ln(), -1.0, lo, hi);
        assert!((o.value + 0.8).abs() < 1e-12 && o.grad == 0.0);
        // Negative advantage above the band: unclipped with gradient.
        let o = clipped_surrogate(1.5f64.ln(), -1.0, lo, hi);
        assert!((o.value + 1.5).abs() < 1e-12 && (o.grad + 1.5).abs() < 1e-12);
    }

    #[test]
    fn kl_k3_is_zero_at_the_reference_and_positive_elsewhere() {
        assert_eq!(kl_k3(-1.0, -1.0), WithGrad { value: 0.0, grad: 0.0 });
        let k = kl_k3(-1.0, -1.5);
        assert!(k.value > 0.0);
        // Finite-difference check of the derivative.
        let h = 1e-6;
        let fd = (kl_k3(-1.0 + h, -1.5).value - kl_k3(-1.0 - h, -1.5).value) / (2.0 * h);
        assert!((fd - k.grad).abs() < 1e-6);
        assert_eq!(kl_k3(0.0, 20.0).value, 10.0);
    }

    #[test]
    fn aggregation_modes() {
        let v = vec![vec![1.0, 1.0, 1.0], vec![4.0]];
        assert!((LossAggregation::TokenMean.aggregate(&v) - 7.0 / 4.0).abs() < 1e-12);
        assert!((LossAggregation::SeqMeanTokenMean.aggregate(&v) - 2.5).abs() < 1e-12);
        // Token sums (3 and 4) over a constant length 10, mean over the two sequences.
        assert!((LossAggregation::SeqMeanTokenSumNorm.aggregate_norm(&v, 10) - 0.35).abs() < 1e-12);
    }
}
