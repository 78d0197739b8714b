//! GRPO (docs/algorithms.md §1.1): each policy alone, a clipped ratio per token, group-normalised
//! advantages, verl's loss aggregation (token-mean by default), DAPO's 0.2/0.28 clip band.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::gspo::group_advantages;
use crate::error::Result;
use crate::rl::algorithm::{AlgoSettings, Algorithm, MicroBatch, Routing};
use crate::rl::objective::LossAggregation;
use crate::rl::records::PoolSample;
use crate::rl::tensor::{aggregate_scoped, grpo_surrogate};

/// The token-level clipped surrogate with its settings; Dr. GRPO reuses it.
pub struct TokenClip {
    pub eps_low: f64,
    pub eps_high: f64,
    pub aggregation: LossAggregation,
    pub adv_epsilon: f64,
    pub normalize_by_std: bool,
}

impl TokenClip {
    /// `−aggregate(min(ρ·A, clip(ρ)·A))` over the micro-batch, normalised for its mini-batch.
    pub fn loss<B: Backend>(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        let adv: Vec<f32> = batch.advantages.iter().map(|&a| a as f32).collect();
        let surrogate = grpo_surrogate(batch.logp.clone(), batch.old_logp.clone(), &adv, self.eps_low, self.eps_high);
        aggregate_scoped(surrogate, batch.mask.clone(), self.aggregation, batch.scope).neg()
    }
}

pub struct Grpo(pub TokenClip);

impl Grpo {
    pub fn new(s: &AlgoSettings) -> Result<Self> {
        Ok(Grpo(TokenClip {
            eps_low: s.clip_low.unwrap_or(0.2),
            eps_high: s.clip_high.unwrap_or(0.28),
            aggregation: s.loss_agg.unwrap_or(LossAggregation::TokenMean),
            adv_epsilon: s.adv_epsilon,
            normalize_by_std: s.normalize_by_std.unwrap_or(true),
        }))
    }
}

impl<B: Backend> Algorithm<B> for Grpo {
    fn name(&self) -> &'static str {
        "grpo"
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(group_advantages(samples, self.0.adv_epsilon, self.0.normalize_by_std))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        self.0.loss(batch)
    }
}
