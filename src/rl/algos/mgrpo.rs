//! M-GRPO (docs/algorithms.md §4): the main agent's and the sub-agent's policies each learn
//! from their own trajectories; a group is a question's K main trajectories, or its aligned
//! sub-trajectories (duplicates are repeated samples, so they count twice). Advantages divide
//! by the group's population standard deviation plus ε, a flat group gets 0 (§4.3); the loss
//! is GRPO's token-level clipped surrogate with the released stack's 0.2/0.28 band and no KL
//! (§4.4), over each trajectory's own tokens (the environment's are masked by the trainer).
//! The three registry entries differ only in the rollouts (`rl::mgrpo::SubAgent`).

use std::collections::HashMap;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::grpo::TokenClip;
use crate::error::Result;
use crate::rl::algorithm::{AlgoSettings, Algorithm, MicroBatch, Routing};
use crate::rl::mgrpo::population_advantages;
use crate::rl::objective::LossAggregation;
use crate::rl::records::PoolSample;

pub struct Mgrpo {
    name: &'static str,
    clip: TokenClip,
}

impl Mgrpo {
    /// `name` is `mgrpo`, `mgrpo-main-only` or `search-grpo`.
    pub fn new(s: &AlgoSettings, name: &'static str) -> Result<Self> {
        Ok(Mgrpo {
            name,
            clip: TokenClip {
                eps_low: s.clip_low.unwrap_or(0.2),
                eps_high: s.clip_high.unwrap_or(0.28),
                aggregation: s.loss_agg.unwrap_or(LossAggregation::TokenMean),
                adv_epsilon: s.adv_epsilon,
                normalize_by_std: true,
            },
        })
    }
}

/// Population-std advantages within each group, in the samples' order.
pub fn group_population_advantages(samples: &[PoolSample], epsilon: f64) -> Vec<f64> {
    let mut members: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, s) in samples.iter().enumerate() {
        members.entry(s.group).or_default().push(i);
    }
    let mut out = vec![0.0; samples.len()];
    for idx in members.values() {
        let rewards: Vec<f64> = idx.iter().map(|&i| samples[i].reward).collect();
        for (&i, a) in idx.iter().zip(population_advantages(&rewards, epsilon)) {
            out[i] = a;
        }
    }
    out
}

impl<B: Backend> Algorithm<B> for Mgrpo {
    fn name(&self) -> &'static str {
        self.name
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(group_population_advantages(samples, self.clip.adv_epsilon))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        self.clip.loss(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_normalise_apart_with_the_population_std() {
        let s = |group, reward| PoolSample { agent: 0, group, reward };
        let samples = [s(0, 1.0), s(1, 0.5), s(0, 0.0), s(1, 0.5), s(0, 0.5)];
        let a = group_population_advantages(&samples, 0.0);
        let sd = (0.5f64 / 3.0).sqrt();
        assert!((a[0] - 0.5 / sd).abs() < 1e-12 && (a[2] + 0.5 / sd).abs() < 1e-12 && a[4].abs() < 1e-12, "{a:?}");
        assert_eq!((a[1], a[3]), (0.0, 0.0), "a flat group has no signal");
    }
}
