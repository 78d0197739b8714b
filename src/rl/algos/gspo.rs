//! GSPO (docs/algorithms.md §1.2): each policy alone, one clipped sequence ratio per response; and
//! GSPO×2, the paper's resource-equivalent baseline, which samples twice the group and makes
//! twice the updates (the one place where that doubling happens).

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde_json::{Value, json};

use super::sequence;
use crate::error::{Error, Result};
use crate::rl::algorithm::{AlgoSettings, Algorithm, BatchShape, MicroBatch, Routing, SequenceRecord};
use crate::rl::capability::Capabilities;
use crate::rl::hacpo::HacpoConfig;
use crate::rl::records::{PoolSample, SampleTerms};
use crate::rl::stats;

/// GSPO, or GSPO×2 when built with `doubled`.
pub struct Gspo {
    doubled: bool,
    core: HacpoConfig,
}

impl Gspo {
    pub fn new(settings: &AlgoSettings, doubled: bool) -> Result<Self> {
        let core = sequence::core_config(settings, false);
        core.validate()?;
        Ok(Gspo { doubled, core })
    }

    /// Own responses only: every ratio is 1 and no capability enters.
    fn caps() -> Capabilities {
        Capabilities::fixed(vec![])
    }
}

impl<B: Backend> Algorithm<B> for Gspo {
    fn name(&self) -> &'static str {
        if self.doubled { "gspo2x" } else { "gspo" }
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    fn shape(&self, requested: BatchShape) -> Result<BatchShape> {
        if !self.doubled {
            return Ok(requested);
        }
        if !requested.minibatch_prompts.is_multiple_of(2) {
            return Err(Error::config(
                "training config",
                "algo.minibatch_prompts: gspo2x halves the mini-batch, so it must be even",
            ));
        }
        Ok(BatchShape {
            group_size: requested.group_size * 2,
            minibatch_prompts: requested.minibatch_prompts / 2,
            ..requested
        })
    }

    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(group_advantages(samples, self.core.adv_epsilon, self.core.normalize_by_std))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        sequence::policy_loss(batch, &self.core, &Self::caps())
    }

    fn sequence_terms(&self, learner: usize, records: &[SequenceRecord]) -> Vec<SampleTerms> {
        sequence::terms(learner, records, &self.core, &Self::caps())
    }

    fn metrics(&self, _learner: usize, terms: &[SampleTerms]) -> Vec<(&'static str, f64)> {
        let own: Vec<&SampleTerms> = terms.iter().collect();
        vec![("gspo/clip_frac", sequence::clip_fraction(&own))]
    }

    fn audit(&self) -> Option<Value> {
        Some(json!({"config": self.core, "capabilities": []}))
    }
}

/// GRPO's group-normalised advantages over the samples' groups (§1.1).
pub fn group_advantages(samples: &[PoolSample], epsilon: f64, normalize_by_std: bool) -> Vec<f64> {
    let rewards: Vec<f64> = samples.iter().map(|s| s.reward).collect();
    let groups: Vec<usize> = samples.iter().map(|s| s.group).collect();
    stats::grpo_advantages(&rewards, &groups, epsilon, normalize_by_std)
}
