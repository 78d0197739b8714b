//! Long row reductions in two short stages.
//!
//! cubecl's wgpu reductions (burn 0.21, cubecl 0.10) cover at most 65 535 vector lines of a
//! row: measured on lavapipe, an odd-width row (line size 1) of 151 669 logits summed and
//! maxed only its first 65 535 elements, so the tokens at the end of a Qwen tokenizer's
//! vocabulary (its special tokens, EOS among them) dropped out of the log-sum-exp and
//! log-probabilities came out positive. Splitting a row into blocks of [`BLOCK`] and reducing
//! twice keeps every reduction short on every backend; the result is the same reduction.

use burn::tensor::{Tensor, backend::Backend};

/// Elements per block of the first stage.
pub const BLOCK: usize = 1024;

/// `t: [n, v]` as `[n, blocks, BLOCK]`, the last block padded with `fill` (the reduction's
/// identity: 0 for a sum, −∞ for a max); rows no longer than a block stay `[n, 1, v]`.
pub fn blocked_rows<B: Backend>(t: Tensor<B, 2>, fill: f32) -> Tensor<B, 3> {
    let [n, v] = t.dims();
    if v <= BLOCK {
        return t.reshape([n, 1, v]);
    }
    let blocks = v.div_ceil(BLOCK);
    let padded = match blocks * BLOCK - v {
        0 => t,
        pad => {
            let device = t.device();
            Tensor::cat(vec![t, Tensor::full([n, pad], fill, &device)], 1)
        }
    };
    padded.reshape([n, blocks, BLOCK])
}

/// Row sums `[n, 1]` of `t: [n, v]`, the first stage within blocks, in a fixed order.
pub fn row_sum<B: Backend>(t: Tensor<B, 2>) -> Tensor<B, 2> {
    let n = t.dims()[0];
    blocked_rows(t, 0.0).sum_dim(2).sum_dim(1).reshape([n, 1])
}

/// Row-wise `log Σ exp` `[n, 1]` of `z: [n, v]`, shifted by the row maximum.
pub fn row_logsumexp<B: Backend>(z: Tensor<B, 2>) -> Tensor<B, 2> {
    let n = z.dims()[0];
    let blocks = blocked_rows(z, f32::NEG_INFINITY);
    let max = blocks.clone().max_dim(2).max_dim(1); // [n, 1, 1]
    let sum = (blocks - max.clone()).exp().sum_dim(2).sum_dim(1);
    (sum.log() + max).reshape([n, 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type B = crate::backend::Cpu;

    #[test]
    fn two_stage_reductions_equal_one_stage_ones_at_any_width() {
        let device = Default::default();
        for v in [1, 7, BLOCK, BLOCK + 1, 3 * BLOCK - 5, 151_669] {
            let data: Vec<f32> = (0..2 * v).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
            let t = Tensor::<B, 2>::from_data(TensorData::new(data.clone(), [2, v]), &device);
            let sums: Vec<f32> = row_sum(t.clone()).into_data().into_vec().unwrap();
            let lses: Vec<f32> = row_logsumexp(t).into_data().into_vec().unwrap();
            for (r, row) in data.chunks(v).enumerate() {
                let sum: f64 = row.iter().map(|&x| x as f64).sum();
                let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
                assert!((sums[r] as f64 - sum).abs() <= 1e-5 * sum.abs().max(1.0), "{v}: sum {} vs {sum}", sums[r]);
                assert!((lses[r] as f64 - lse).abs() <= 1e-5 * lse.abs().max(1.0), "{v}: lse {} vs {lse}", lses[r]);
            }
        }
    }
}
