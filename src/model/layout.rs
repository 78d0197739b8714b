//! Where each token of a batch sits: RoPE positions and the attention mask.
//!
//! One description serves training, scoring, prefill and decode. Rows are *left-padded*: row
//! `b` has `pads[b]` empty slots before its first token. A forward pass feeds the slots
//! `start .. start + len` of every row (the same for all rows, so the KV cache stays one
//! rectangular tensor). Slot `s` of row `b` has RoPE position `s - pads[b]`; a query at slot `i`
//! sees key slots `pads[b] ..= i`. Query slots inside the padding see only themselves, which
//! keeps their softmax finite; their outputs are never read.

use burn::tensor::{Tensor, TensorData, backend::Backend};

use super::rope::Rope;

/// Slots fed to one forward pass, for every row of the batch.
#[derive(Clone, Debug)]
pub struct Layout {
    pub pads: Vec<usize>,
    pub start: usize,
    pub len: usize,
}

impl Layout {
    /// A batch of `batch` unpadded rows of `len` tokens from position 0 (training, scoring;
    /// right padding needs no mask because later slots never influence earlier ones).
    pub fn dense(batch: usize, len: usize) -> Self {
        Layout { pads: vec![0; batch], start: 0, len }
    }

    pub fn batch(&self) -> usize {
        self.pads.len()
    }

    /// Number of key slots visible to this pass (cache + new tokens).
    pub fn keys(&self) -> usize {
        self.start + self.len
    }

    fn padded(&self) -> bool {
        self.pads.iter().any(|&p| p > 0)
    }
}

/// Device tensors for one forward pass: RoPE tables and the additive attention bias.
pub struct LayoutTensors<B: Backend> {
    /// `[batch or 1, 1, len, head_dim]`
    pub cos: Tensor<B, 4>,
    pub sin: Tensor<B, 4>,
    /// `[batch or 1, 1, 1, len, keys]`, 0 where allowed and -inf where masked; `None` when
    /// a single query attends to every cached key (unpadded decode).
    pub bias: Option<Tensor<B, 5>>,
}

impl<B: Backend> LayoutTensors<B> {
    pub fn new(layout: &Layout, rope: &Rope, device: &B::Device) -> Self {
        let head_dim = rope.half_dim() * 2;
        let (t, s) = (layout.len, layout.keys());
        // Rows share one table unless padding shifts their positions.
        let rows = if layout.padded() { layout.batch() } else { 1 };

        let mut cos = vec![0f32; rows * t * head_dim];
        let mut sin = vec![0f32; rows * t * head_dim];
        for r in 0..rows {
            for q in 0..t {
                let pos = (layout.start + q).saturating_sub(layout.pads[r]);
                let off = (r * t + q) * head_dim;
                rope.fill_row(pos, &mut cos[off..off + head_dim], &mut sin[off..off + head_dim]);
            }
        }

        let bias = if t == 1 && !layout.padded() {
            None
        } else {
            let mut bias = vec![f32::NEG_INFINITY; rows * t * s];
            for r in 0..rows {
                let pad = layout.pads[r];
                for q in 0..t {
                    let slot = layout.start + q;
                    let row = &mut bias[(r * t + q) * s..(r * t + q + 1) * s];
                    if slot < pad {
                        row[slot] = 0.0;
                    } else {
                        row[pad..=slot].fill(0.0);
                    }
                }
            }
            Some(Tensor::from_data(TensorData::new(bias, [rows, 1, 1, t, s]), device))
        };

        LayoutTensors {
            cos: Tensor::from_data(TensorData::new(cos, [rows, 1, t, head_dim]), device),
            sin: Tensor::from_data(TensorData::new(sin, [rows, 1, t, head_dim]), device),
            bias,
        }
    }
}
