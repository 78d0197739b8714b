//! Rotary position embedding in Hugging Face's *rotate-half* convention, with Llama-3.1
//! frequency-dependent scaling.
//!
//! burn's `RotaryEncoding` rotates interleaved pairs (x0,x1),(x2,x3)…; HF checkpoints pair
//! dimension i with i + d/2, so we implement it ourselves. The inverse frequencies and angles
//! are computed in f32 exactly as transformers does (`base ** (arange(0, d, 2) / d)`, then
//! `inv_freq @ positions`), so that long positions agree to the last bit that matters.

use crate::model::config::{Llama3RopeScaling, ModelConfig};

/// Inverse frequencies for one head (length `head_dim / 2`).
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(config: &ModelConfig) -> Self {
        let dim = config.head_dim;
        let base = config.rope_theta as f32;
        let mut inv_freq: Vec<f32> = (0..dim).step_by(2).map(|i| 1.0f32 / base.powf(i as f32 / dim as f32)).collect();
        if let Some(s) = &config.rope_scaling {
            llama3_scale(&mut inv_freq, s);
        }
        Rope { inv_freq }
    }

    pub fn half_dim(&self) -> usize {
        self.inv_freq.len()
    }

    /// Writes `cos` and `sin` rows (each `head_dim` long: the half-table twice) for `position`.
    pub fn fill_row(&self, position: usize, cos: &mut [f32], sin: &mut [f32]) {
        let half = self.half_dim();
        let p = position as f32;
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let angle = f * p;
            let (s, c) = angle.sin_cos();
            cos[i] = c;
            cos[i + half] = c;
            sin[i] = s;
            sin[i + half] = s;
        }
    }
}

/// transformers' `_compute_llama3_parameters`, in f32 as there.
fn llama3_scale(inv_freq: &mut [f32], s: &Llama3RopeScaling) {
    let factor = s.factor as f32;
    let old_ctx = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_ctx / s.low_freq_factor as f32;
    let high_freq_wavelen = old_ctx / s.high_freq_factor as f32;
    for f in inv_freq.iter_mut() {
        let wavelen = 2.0 * std::f32::consts::PI / *f;
        let scaled = if wavelen > low_freq_wavelen { *f / factor } else { *f };
        let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
        *f = if is_medium {
            let smooth =
                (old_ctx / wavelen - s.low_freq_factor as f32) / (s.high_freq_factor as f32 - s.low_freq_factor as f32);
            (1.0 - smooth) * scaled / factor + smooth * scaled
        } else {
            scaled
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let mut f = vec![1.0f32, 1e-5];
        llama3_scale(&mut f, &s);
        assert_eq!(f[0], 1.0); // wavelength 6.28 < 2048: untouched
        assert!((f[1] - 1e-5 / 8.0).abs() < 1e-12); // wavelength 628k > 8192: divided
    }
}
