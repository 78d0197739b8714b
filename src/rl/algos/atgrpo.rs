//! AT-GRPO and its baselines on the turn-wise workload (docs/algorithms.md §5): the rollout shape
//! differs, the loss does not. `atgrpo` branches K candidates at every (task, agent, turn) and
//! continues from the best; `mas-grpo` rolls K whole trajectories per task and groups identical
//! prompts (singletons after the first turn); `single-grpo` is the plan role alone, with whole
//! trajectories. All three train GRPO's token-level clipped surrogate on group-normalised
//! advantages, each policy on its own samples.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::grpo::TokenClip;
use super::gspo::group_advantages;
use crate::error::Result;
use crate::rl::algorithm::{AlgoSettings, Algorithm, MicroBatch, Routing};
use crate::rl::objective::LossAggregation;
use crate::rl::records::PoolSample;

/// The three variants differ only in their rollouts (the registry's shapes), not in their loss.
pub struct Atgrpo {
    name: &'static str,
    clip: TokenClip,
}

impl Atgrpo {
    /// `name` is `atgrpo`, `mas-grpo` or `single-grpo`.
    pub fn new(s: &AlgoSettings, name: &'static str) -> Result<Self> {
        Ok(Atgrpo {
            name,
            // PettingLLMs' (verl's) defaults: clip 0.2/0.2, token-mean, unbiased std, ε 1e-6.
            clip: TokenClip {
                eps_low: s.clip_low.unwrap_or(0.2),
                eps_high: s.clip_high.unwrap_or(0.2),
                aggregation: s.loss_agg.unwrap_or(LossAggregation::TokenMean),
                adv_epsilon: s.adv_epsilon,
                normalize_by_std: s.normalize_by_std.unwrap_or(true),
            },
        })
    }
}

impl<B: Backend> Algorithm<B> for Atgrpo {
    fn name(&self) -> &'static str {
        self.name
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(group_advantages(samples, self.clip.adv_epsilon, self.clip.normalize_by_std))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        self.clip.loss(batch)
    }
}
