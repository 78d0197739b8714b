//! Dynamic loss scaling for f16 compute, as PyTorch's `torch.amp.GradScaler` does it.
//!
//! f16 keeps 5 exponent bits: a gradient below about 6e-8 flushes to zero in the half-precision
//! matmuls of the backward pass. The update multiplies the loss by `scale` before the backward
//! pass, so that the gradients flowing through f16 are `scale` times larger, and divides the
//! accumulated f32 gradients by it before clipping. When the scaled gradients overflow (a
//! non-finite norm), the optimizer step is skipped and the scale halved; after
//! [`GROWTH_INTERVAL`] steps without overflow it doubles. bf16 has f32's range and needs none.
//! The state is saved with the optimizer, so a resumed run continues with the same scale.

use serde::{Deserialize, Serialize};

/// PyTorch's defaults: `init_scale=2**16, growth_factor=2, backoff_factor=0.5,
/// growth_interval=2000`.
pub const INIT_SCALE: f64 = 65536.0;
pub const GROWTH_INTERVAL: u64 = 2000;

/// Below this the gradients overflow even unscaled: the run has diverged, not the scale.
pub const MIN_SCALE: f64 = 1.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// What the loss is multiplied by.
    pub scale: f64,
    /// Optimizer steps since the last overflow or growth.
    pub good_steps: u64,
    /// Steps skipped for overflow over the run.
    pub skipped: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler { scale: INIT_SCALE, good_steps: 0, skipped: 0 }
    }
}

impl LossScaler {
    /// After an optimizer step whose unscaled gradient norm was `norm`: whether to apply it.
    /// A non-finite norm skips the step and halves the scale; a run of finite ones doubles it.
    pub fn update(&mut self, norm: f64) -> bool {
        if !norm.is_finite() {
            self.scale *= 0.5;
            self.good_steps = 0;
            self.skipped += 1;
            return false;
        }
        self.good_steps += 1;
        if self.good_steps == GROWTH_INTERVAL {
            self.scale *= 2.0;
            self.good_steps = 0;
        }
        true
    }

    /// Whether the scale has fallen so low that overflow cannot be the scale's fault.
    pub fn exhausted(&self) -> bool {
        self.scale < MIN_SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_the_scale_and_skips_and_a_clean_run_doubles_it() {
        let mut s = LossScaler::default();
        assert!(!s.update(f64::INFINITY));
        assert!(!s.update(f64::NAN));
        assert_eq!((s.scale, s.good_steps, s.skipped), (INIT_SCALE / 4.0, 0, 2));
        for _ in 0..GROWTH_INTERVAL - 1 {
            assert!(s.update(1.0));
        }
        assert_eq!(s.scale, INIT_SCALE / 4.0);
        assert!(s.update(1.0));
        assert_eq!((s.scale, s.good_steps), (INIT_SCALE / 2.0, 0));
        // 2^16 halves 17 times before it is below 1.
        let mut s = LossScaler::default();
        for _ in 0..16 {
            s.update(f64::INFINITY);
            assert!(!s.exhausted());
        }
        s.update(f64::INFINITY);
        assert!(s.exhausted());
    }
}
