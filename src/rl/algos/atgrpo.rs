//! AT-GRPO and its baselines on the turn-wise workload (ALGORITHMS.md §5): the rollout shape
//! differs, the loss does not. `atgrpo` branches K candidates at every (task, agent, turn) and
//! continues from the best; `mas-grpo` rolls K whole trajectories per task and groups identical
//! prompts (singletons after the first turn); `single-grpo` is the plan role alone, with whole
//! trajectories. All three train GRPO's token-level clipped surrogate on group-normalised
//! advantages, each policy on its own samples.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::grpo::TokenClip;
use super::gspo::group_advantages;
use crate::error::{Error, Result};
use crate::rl::algorithm::{AlgoSettings, Algorithm, MicroBatch, Routing};
use crate::rl::atgrpo::{Grouping, TurnRollout};
use crate::rl::hacpo::PoolSample;
use crate::rl::objective::LossAggregation;

pub struct Atgrpo {
    name: &'static str,
    clip: TokenClip,
    turns: TurnRollout,
}

impl Atgrpo {
    /// `variant` is `atgrpo`, `mas-grpo` or `single-grpo`.
    pub fn new(s: &AlgoSettings, variant: &str) -> Result<Self> {
        let (name, grouping, single_agent) = match variant {
            "atgrpo" => ("atgrpo", Grouping::TurnWise, false),
            "mas-grpo" => ("mas-grpo", Grouping::Trajectory, false),
            "single-grpo" => ("single-grpo", Grouping::Trajectory, true),
            other => return Err(Error::Internal(format!("no AT-GRPO variant {other:?}"))),
        };
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
            turns: TurnRollout { grouping, single_agent },
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

    fn turns(&self) -> Option<TurnRollout> {
        Some(self.turns)
    }

    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(group_advantages(samples, self.clip.adv_epsilon, self.clip.normalize_by_std))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        self.clip.loss(batch)
    }
}
