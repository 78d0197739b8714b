//! MAPPO, the actor-critic baseline MHGPO is compared with, as MMOA-RAG runs it (TRL 0.9 PPO,
//! docs/algorithms.md §3.2): each agent's output is rewarded with the team's answer F1 plus its own
//! format penalty at its last token, a value head on the policy's trunk estimates each token's
//! value, GAE gives per-token advantages (whitened over the learner's batch), and the loss is
//! PPO's clipped surrogate plus `vf_coef` × the clipped value loss.
//!
//! Rollouts are independent trajectories: G per question (the fork-on-first shape with no
//! group baseline), so MAPPO and MHGPO see the same number of outputs per step. Where this
//! differs from MMOA-RAG, on purpose, so that the comparison isolates the critic: the KL term
//! is the trainer's k3 loss (`algo.kl_coef`) rather than a per-token KL penalty in the reward,
//! one pass over the mini-batches per step rather than two PPO epochs, and full fine-tuning
//! rather than LoRA.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::error::{Error, Result};
use crate::rl::algorithm::{
    AlgoSettings, Algorithm, LossTerm, MicroBatch, Routing, TokenAdvantages, ValueModel, ValuedResponse,
};
use crate::rl::mappo::CriticSettings;
use crate::rl::objective::LossAggregation;
use crate::rl::records::PoolSample;
use crate::rl::tensor::{aggregate_scoped, clipped_surrogate, clipped_value_loss};

pub struct Mappo {
    eps_low: f64,
    eps_high: f64,
    aggregation: LossAggregation,
    critic: CriticSettings,
}

impl Mappo {
    pub fn new(s: &AlgoSettings) -> Result<Self> {
        s.mappo.validate().map_err(|e| Error::config("training config", format!("algo.mappo: {e}")))?;
        Ok(Mappo {
            // TRL's symmetric cliprange 0.2.
            eps_low: s.clip_low.unwrap_or(0.2),
            eps_high: s.clip_high.unwrap_or(0.2),
            aggregation: s.loss_agg.unwrap_or(LossAggregation::TokenMean),
            critic: s.mappo,
        })
    }
}

/// The trainer hands an algorithm with a value model its value side in every micro-batch.
const VALUE_SIDE: &str = "the trainer gives an algorithm with a value model its per-token advantages and values";

impl<B: Backend> Algorithm<B> for Mappo {
    fn name(&self) -> &'static str {
        "mappo"
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    fn value_model(&self) -> Option<ValueModel> {
        Some(ValueModel { lr: self.critic.critic_lr, own_trunk: !self.critic.shared_trunk })
    }

    /// GAE over the values the scoring stage read, whitened over the learner's batch
    /// (`rl::mappo::token_advantages`).
    fn token_advantages(&self, responses: &[ValuedResponse<'_>]) -> Result<TokenAdvantages> {
        let rewards: Vec<f64> = responses.iter().map(|r| r.reward).collect();
        let values: Vec<&[f32]> = responses.iter().map(|r| r.values).collect();
        let (advantages, returns) = crate::rl::mappo::token_advantages(&rewards, &values, &self.critic);
        Ok(TokenAdvantages { advantages, returns })
    }

    /// No group baseline: the per-token advantages replace these.
    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(vec![0.0; samples.len()])
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        let advantages = batch.value.as_ref().expect(VALUE_SIDE).advantages.clone();
        let surrogate =
            clipped_surrogate(batch.logp.clone(), batch.old_logp.clone(), advantages, self.eps_low, self.eps_high);
        aggregate_scoped(surrogate, batch.mask.clone(), self.aggregation, batch.scope).neg()
    }

    /// PPO's clipped surrogate plus `vf_coef` × the clipped value loss over every token.
    fn loss_terms(&self, batch: &MicroBatch<B>) -> Vec<LossTerm<B>> {
        let v = batch.value.as_ref().expect(VALUE_SIDE);
        let vf = aggregate_scoped(
            clipped_value_loss(v.predicted.clone(), v.old.clone(), v.returns.clone(), self.critic.cliprange_value),
            batch.mask.clone(),
            LossAggregation::TokenMean,
            batch.scope,
        );
        vec![
            LossTerm { metric: "actor/pg_loss", weight: 1.0, value: self.policy_loss(batch) },
            LossTerm { metric: "critic/vf_loss", weight: self.critic.vf_coef, value: vf },
        ]
    }
}
