//! Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): GRPO without the two
//! normalisations that bias it, the group standard deviation in the advantage (`A = r − mean`)
//! and the per-response length in the loss (each response's token sum is divided by one
//! constant length, `seq-mean-token-sum-norm`). Everything else is GRPO's.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::grpo::TokenClip;
use super::gspo::group_advantages;
use crate::error::Result;
use crate::rl::algorithm::{AlgoSettings, Algorithm, BatchShape, MicroBatch, Routing};
use crate::rl::objective::LossAggregation;
use crate::rl::records::PoolSample;

pub struct DrGrpo {
    clip: TokenClip,
    /// `algo.drgrpo.norm_length`; 0 until [`Algorithm::shape`] resolves it.
    norm_length: usize,
}

impl DrGrpo {
    pub fn new(s: &AlgoSettings) -> Result<Self> {
        Ok(DrGrpo {
            clip: TokenClip {
                eps_low: s.clip_low.unwrap_or(0.2),
                eps_high: s.clip_high.unwrap_or(0.28),
                aggregation: s.loss_agg.unwrap_or(LossAggregation::SeqMeanTokenSumNorm),
                adv_epsilon: s.adv_epsilon,
                normalize_by_std: s.normalize_by_std.unwrap_or(false),
            },
            norm_length: s.drgrpo.norm_length,
        })
    }

    /// The constant length the token sums are divided by.
    pub fn norm_length(&self, shape: &BatchShape) -> usize {
        if self.norm_length > 0 { self.norm_length } else { shape.norm_length }
    }
}

impl<B: Backend> Algorithm<B> for DrGrpo {
    fn name(&self) -> &'static str {
        "drgrpo"
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    fn shape(&self, requested: BatchShape) -> Result<BatchShape> {
        Ok(BatchShape { norm_length: self.norm_length(&requested), ..requested })
    }

    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        Ok(group_advantages(samples, self.clip.adv_epsilon, self.clip.normalize_by_std))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        self.clip.loss(batch)
    }
}
