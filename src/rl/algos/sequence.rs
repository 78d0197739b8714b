//! The sequence-level policy loss shared by HACPO, naive sharing, GSPO and GSPO×2: one mean
//! log-prob per response, GSPO's clipped sequence ratio on own responses and HACPO's cross
//! term on others' (docs/algorithms.md §1.2, §2.9), through [`crate::rl::tensor::hacpo_objectives`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::rl::algorithm::{AlgoSettings, MicroBatch, SequenceRecord};
use crate::rl::capability::Capabilities;
use crate::rl::hacpo::{HacpoConfig, sample_terms};
use crate::rl::records::SampleTerms;
use crate::rl::tensor::{SequenceBatch, hacpo_objectives, sequence_mean};

/// The scalar core's full HACPO parameters from the run's settings.
pub fn core_config(s: &AlgoSettings, naive: bool) -> HacpoConfig {
    let h = &s.hacpo;
    HacpoConfig {
        alpha: h.alpha,
        delta: h.delta,
        delta_step: h.delta_step,
        eps_low: s.clip_low.unwrap_or(3e-4),
        eps_high: s.clip_high.unwrap_or(4e-4),
        max_abs_log_ratio: s.max_abs_log_ratio,
        adv_epsilon: s.adv_epsilon,
        normalize_by_std: s.normalize_by_std.unwrap_or(true),
        kl_coef: s.kl_coef,
        capability_baseline: h.capability_baseline,
        discrepancy_coef: h.discrepancy_coef,
        exp_is: h.exp_is,
        stepwise: h.stepwise,
        naive,
        uniform_reward_guard: h.uniform_reward_guard,
        binary_baseline_guard: h.binary_baseline_guard,
        max_reward: h.max_reward,
        minibatch_order: h.minibatch_order,
    }
}

/// `−Σ objectives / sequences of the mini-batch` for one micro-batch.
pub fn policy_loss<B: Backend>(batch: &MicroBatch<B>, cfg: &HacpoConfig, caps: &Capabilities) -> Tensor<B, 1> {
    let learner = batch.learner;
    let seq = SequenceBatch {
        mean_logp_source: batch.mean_logp_source.iter().map(|&x| x as f32).collect(),
        advantage: batch.advantages.iter().map(|&a| a as f32).collect(),
        coef: batch.sources.iter().map(|&s| cfg.coef(s, learner, caps) as f32).collect(),
        cross: batch.sources.iter().map(|&s| cfg.is_cross(s, learner)).collect(),
    };
    let mean = sequence_mean(batch.logp.clone(), batch.mask.clone());
    hacpo_objectives(mean, &seq, batch.minibatch_index, cfg).sum().div_scalar(batch.scope.sequences.max(1) as f64).neg()
}

/// The scalar core's terms of each response, for metrics and audits.
pub fn terms(learner: usize, records: &[SequenceRecord], cfg: &HacpoConfig, caps: &Capabilities) -> Vec<SampleTerms> {
    records
        .iter()
        .map(|r| {
            sample_terms(
                r.source,
                learner,
                r.advantage,
                r.mean_logp_target,
                r.mean_logp_source,
                r.minibatch_index,
                caps,
                cfg,
            )
        })
        .collect()
}

/// Share of responses whose clip removed the gradient (and that had one to remove).
pub fn clip_fraction(terms: &[&SampleTerms]) -> f64 {
    if terms.is_empty() {
        return 0.0;
    }
    terms.iter().filter(|t| t.grad_weight == 0.0 && t.advantage != 0.0).count() as f64 / terms.len() as f64
}

/// Mean of a term over responses (0 for none).
pub fn mean_of(terms: &[&SampleTerms], f: impl Fn(&SampleTerms) -> f64) -> f64 {
    if terms.is_empty() { 0.0 } else { terms.iter().map(|t| f(t)).sum::<f64>() / terms.len() as f64 }
}
