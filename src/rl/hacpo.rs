//! HACPO for n ≥ 2 agents (docs/algorithms.md §2): capability-aware advantages, the discrepancy
//! coefficient, exponential importance sampling, stepwise clipping and mini-batch ordering.
//!
//! For a learner k, every response of the joint pool (its own and the other agents') gets an
//! advantage against k's *capability-weighted* baseline; own responses then use GSPO, cross
//! responses use `clamp(s, lower_m, 1) · sg(·)^α · ω(source, k) · A`. Each mechanism has a
//! switch, and `naive` turns them all off and treats cross responses as the learner's own
//! (plain GSPO over the pool), the paper's "naive sharing" baseline.
//!
//! Invariant: one prompt group holds the same number of responses from every agent; anything
//! else is an error, because the weighted baseline would silently be biased.

use serde::{Deserialize, Serialize};

use super::capability::Capabilities;
use super::objective::{WithGrad, cross_sequence, gspo_sequence};
use super::records::{PoolSample, SampleTerms};
use super::stats::{group_members, mean, unbiased_std};
use crate::error::{Error, Result};

/// How a learner's pool is cut into mini-batches (§2.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MinibatchOrder {
    /// Own responses first, then other agents' in agent order (verl-v1: mini-batches are purely
    /// own or purely cross).
    SelfFirst,
    /// Every mini-batch holds the same share of own and cross responses.
    Interleaved,
}

/// HACPO settings; the defaults are docs/algorithms.md §2.10's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HacpoConfig {
    /// Exponential importance-sampling exponent α (§2.7).
    pub alpha: f64,
    /// Initial cross clip lower bound is `1 − delta` (§2.8).
    pub delta: f64,
    /// The lower bound rises by `delta_step` per mini-batch update within a step.
    pub delta_step: f64,
    /// GSPO clip on own responses.
    pub eps_low: f64,
    pub eps_high: f64,
    /// Clamp of the log sequence ratio.
    pub max_abs_log_ratio: f64,
    /// Added to the group standard deviation.
    pub adv_epsilon: f64,
    pub normalize_by_std: bool,
    /// KL-to-reference coefficient (own responses only).
    pub kl_coef: f64,
    /// Capability-weighted baseline (off: plain mean of the pool).
    pub capability_baseline: bool,
    /// ω(source, learner) on cross responses (off: 1).
    pub discrepancy_coef: bool,
    /// Exponential importance sampling (off: α = 0).
    pub exp_is: bool,
    /// Stepwise rising lower bound (off: δ_step = 0).
    pub stepwise: bool,
    /// Naive sharing: all mechanisms off, cross responses treated as own.
    pub naive: bool,
    /// All rewards of a group equal → plain mean baseline (all advantages 0).
    pub uniform_reward_guard: bool,
    /// Weighted baseline above `max_reward` → the learner's own mean reward in the group.
    pub binary_baseline_guard: bool,
    pub max_reward: f64,
    pub minibatch_order: MinibatchOrder,
}

impl Default for HacpoConfig {
    fn default() -> Self {
        HacpoConfig {
            alpha: 1.0,
            delta: 0.2,
            delta_step: 0.025,
            eps_low: 3e-4,
            eps_high: 4e-4,
            max_abs_log_ratio: 10.0,
            adv_epsilon: super::stats::ADV_EPSILON,
            normalize_by_std: true,
            kl_coef: 0.001,
            capability_baseline: true,
            discrepancy_coef: true,
            exp_is: true,
            stepwise: true,
            naive: false,
            uniform_reward_guard: true,
            binary_baseline_guard: true,
            max_reward: 1.0,
            minibatch_order: MinibatchOrder::SelfFirst,
        }
    }
}

impl HacpoConfig {
    fn uses_capability_baseline(&self) -> bool {
        self.capability_baseline && !self.naive
    }

    /// Whether a response from `source` is a cross response for `learner` (naive: never).
    pub fn is_cross(&self, source: usize, learner: usize) -> bool {
        source != learner && !self.naive
    }

    /// The effective α.
    pub fn effective_alpha(&self) -> f64 {
        if self.exp_is && !self.naive { self.alpha } else { 0.0 }
    }

    /// Cross clip lower bound at mini-batch update `m`: `min(1, 1 − δ + m·δ_step)`.
    pub fn cross_lower_bound(&self, minibatch_index: usize) -> f64 {
        let step = if self.stepwise { self.delta_step } else { 0.0 };
        (1.0 - self.delta + minibatch_index as f64 * step).min(1.0)
    }

    /// The coefficient ω(source, learner) on a response (1 for own responses or when off).
    pub fn coef(&self, source: usize, learner: usize, caps: &Capabilities) -> f64 {
        if self.is_cross(source, learner) && self.discrepancy_coef { caps.ratio(source, learner) } else { 1.0 }
    }

    /// Rejects values outside their meaningful range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("invalid HACPO setting: {m}")));
        if !(self.alpha.is_finite() && self.alpha >= 0.0) {
            return bad(format!("alpha must be ≥ 0, got {}", self.alpha));
        }
        if !(0.0..1.0).contains(&self.delta) {
            return bad(format!("delta must be in [0, 1), got {}", self.delta));
        }
        if !(self.delta_step.is_finite() && self.delta_step >= 0.0) {
            return bad(format!("delta_step must be ≥ 0, got {}", self.delta_step));
        }
        if !(self.eps_low >= 0.0 && self.eps_low < 1.0 && self.eps_high.is_finite() && self.eps_high >= 0.0) {
            return bad(format!(
                "eps_low must be in [0, 1) and eps_high ≥ 0, got {} and {}",
                self.eps_low, self.eps_high
            ));
        }
        if !(self.max_abs_log_ratio.is_finite()
            && self.max_abs_log_ratio > 0.0
            && self.adv_epsilon.is_finite()
            && self.adv_epsilon >= 0.0)
        {
            return bad("max_abs_log_ratio must be a finite number > 0 and adv_epsilon a finite number ≥ 0".into());
        }
        if self.max_reward.is_nan() {
            return bad("max_reward must be a number (it bounds the weighted baseline)".into());
        }
        Ok(())
    }
}

/// Advantages (before ω) of every pool response for `learner` (§2.4), in pool order.
pub fn advantages(samples: &[PoolSample], learner: usize, caps: &Capabilities, cfg: &HacpoConfig) -> Result<Vec<f64>> {
    let n = caps.num_agents();
    if learner >= n {
        return Err(Error::InvalidArgument(format!("learner {learner} is not one of the {n} agents")));
    }
    let groups: Vec<usize> = samples.iter().map(|s| s.group).collect();
    let mut out = vec![0.0; samples.len()];
    for (group, members) in group_members(&groups) {
        check_group_balance(samples, &members, n, group)?;
        let rewards: Vec<f64> = members.iter().map(|&i| samples[i].reward).collect();
        let uniform = rewards.iter().all(|&r| r == rewards[0]);
        let baseline = if !cfg.uses_capability_baseline() || (cfg.uniform_reward_guard && uniform) {
            mean(&rewards)
        } else {
            // Agent j's rewards weigh ω(k, j) = P̂_k / P̂_j = 1 / ratio(j, k).
            let weighted: f64 = members
                .iter()
                .map(|&i| {
                    let s = &samples[i];
                    let w = if s.agent == learner { 1.0 } else { 1.0 / caps.ratio(s.agent, learner) };
                    w * s.reward
                })
                .sum::<f64>()
                / rewards.len() as f64;
            if cfg.binary_baseline_guard && weighted > cfg.max_reward {
                let own: Vec<f64> =
                    members.iter().filter(|&&i| samples[i].agent == learner).map(|&i| samples[i].reward).collect();
                mean(&own)
            } else {
                weighted
            }
        };
        let denom =
            if rewards.len() > 1 && cfg.normalize_by_std { unbiased_std(&rewards) + cfg.adv_epsilon } else { 1.0 };
        for (&i, r) in members.iter().zip(&rewards) {
            out[i] = (r - baseline) / denom;
        }
    }
    Ok(out)
}

/// Every agent must appear in each group with the same number of responses.
fn check_group_balance(samples: &[PoolSample], members: &[usize], num_agents: usize, group: usize) -> Result<()> {
    let mut counts = vec![0usize; num_agents];
    for &i in members {
        let a = samples[i].agent;
        if a >= num_agents {
            return Err(Error::InvalidArgument(format!(
                "a response of prompt group {group} comes from agent {a}, but there are only {num_agents} agents"
            )));
        }
        counts[a] += 1;
    }
    if counts.iter().any(|&c| c != counts[0]) {
        return Err(Error::InvalidArgument(format!(
            "prompt group {group} has responses per agent {counts:?}; HACPO needs the same number from every agent"
        )));
    }
    Ok(())
}

/// Terms of one response with source `source` for `learner` at mini-batch update `m`.
#[allow(clippy::too_many_arguments)]
pub fn sample_terms(
    source: usize,
    learner: usize,
    advantage: f64,
    mean_logp_target: f64,
    mean_logp_source: f64,
    minibatch_index: usize,
    caps: &Capabilities,
    cfg: &HacpoConfig,
) -> SampleTerms {
    let coef = cfg.coef(source, learner, caps);
    if cfg.is_cross(source, learner) {
        let t = cross_sequence(
            mean_logp_target,
            mean_logp_source,
            advantage,
            coef,
            cfg.cross_lower_bound(minibatch_index),
            cfg.effective_alpha(),
            cfg.max_abs_log_ratio,
        );
        SampleTerms {
            advantage,
            coef,
            ratio: t.ratio,
            clipped_ratio: t.clipped_ratio,
            objective: t.objective.value,
            grad_weight: t.objective.grad,
            cross: true,
        }
    } else {
        let WithGrad { value, grad } = gspo_sequence(
            mean_logp_target,
            mean_logp_source,
            advantage,
            cfg.eps_low,
            cfg.eps_high,
            cfg.max_abs_log_ratio,
        );
        let ratio = (mean_logp_target - mean_logp_source).clamp(-cfg.max_abs_log_ratio, cfg.max_abs_log_ratio).exp();
        SampleTerms {
            advantage,
            coef,
            ratio,
            clipped_ratio: ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high),
            objective: value,
            grad_weight: grad,
            cross: false,
        }
    }
}

/// The policy loss of a mini-batch: the negative mean objective over its sequences.
pub fn policy_loss(terms: &[SampleTerms]) -> f64 {
    if terms.is_empty() { 0.0 } else { -terms.iter().map(|t| t.objective).sum::<f64>() / terms.len() as f64 }
}

/// Cuts a learner's pool into `num_minibatches` mini-batches of pool indices.
pub fn minibatches(
    samples: &[PoolSample],
    learner: usize,
    num_minibatches: usize,
    order: MinibatchOrder,
) -> Result<Vec<Vec<usize>>> {
    let m = num_minibatches.max(1);
    let own: Vec<usize> = (0..samples.len()).filter(|&i| samples[i].agent == learner).collect();
    let mut cross: Vec<usize> = (0..samples.len()).filter(|&i| samples[i].agent != learner).collect();
    cross.sort_by_key(|&i| samples[i].agent); // stable: agent order, then pool order
    let uneven = |what: &str, n: usize| {
        Error::InvalidArgument(format!(
            "{n} {what} responses cannot be split into {m} equal mini-batches; choose a mini-batch size that divides them"
        ))
    };
    match order {
        MinibatchOrder::SelfFirst => {
            let all: Vec<usize> = own.into_iter().chain(cross).collect();
            if !all.len().is_multiple_of(m) {
                return Err(uneven("pool", all.len()));
            }
            Ok(all.chunks(all.len() / m).map(<[usize]>::to_vec).collect())
        }
        MinibatchOrder::Interleaved => {
            if !own.len().is_multiple_of(m) {
                return Err(uneven("own", own.len()));
            }
            if !cross.len().is_multiple_of(m) {
                return Err(uneven("cross", cross.len()));
            }
            let (a, b) = (own.len() / m, cross.len() / m);
            Ok((0..m)
                .map(|i| own[i * a..(i + 1) * a].iter().chain(&cross[i * b..(i + 1) * b]).copied().collect())
                .collect())
        }
    }
}
