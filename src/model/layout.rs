//! Where each token of a batch sits: RoPE positions and the attention mask.
//!
//! One description serves training, scoring, prefill and decode. A row may have one run of
//! empty slots, its [`Pad`]: `len` slots from slot `at`. Usually `at` is 0 (*left padding*);
//! a prefill whose prompts share a beginning keeps that beginning first and pads between it
//! and the rest of each prompt ([`crate::generate`]). A forward pass feeds the slots
//! `start .. start + len` of every row (the same for all rows, so the KV cache stays one
//! rectangular tensor). Slots after the pad have RoPE positions `s - pad.len`; a query at
//! slot `i` sees every key slot `..= i` outside its row's pad. Query slots inside the pad see
//! only themselves, which keeps their softmax finite; their outputs are never read.
//!
//! The device tensors are laid out for speed: every elementwise op of RoPE and of the mask is
//! either same-shape or "one row shared by all rows", the two patterns burn's ops run with
//! contiguous loops (on burn-flex a broadcast over a middle dimension walks a strided iterator,
//! ~10× slower), and that the CPU's fused RoPE (`backend::fused::rope`) and the GPU's kernel
//! read. Tables are therefore expanded over heads on the host, once per forward pass.

use burn::tensor::{Tensor, TensorData, backend::Backend};

use super::rope::Rope;

/// A row's empty slots: `len` of them from slot `at`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pad {
    pub at: usize,
    pub len: usize,
}

impl Pad {
    /// `len` empty slots before the row's first token.
    pub fn left(len: usize) -> Self {
        Pad { at: 0, len }
    }

    fn contains(&self, slot: usize) -> bool {
        (self.at..self.at + self.len).contains(&slot)
    }
}

/// Slots fed to one forward pass, for every row of the batch.
#[derive(Clone, Debug)]
pub struct Layout {
    pub pads: Vec<Pad>,
    pub start: usize,
    pub len: usize,
}

impl Layout {
    /// A batch of `batch` unpadded rows of `len` tokens from position 0 (training, scoring;
    /// right padding needs no mask because later slots never influence earlier ones).
    pub fn dense(batch: usize, len: usize) -> Self {
        Layout { pads: vec![Pad::default(); batch], start: 0, len }
    }

    /// `pads[b]` empty slots before row `b`'s first token.
    pub fn left_padded(pads: &[usize], start: usize, len: usize) -> Self {
        Layout { pads: pads.iter().map(|&p| Pad::left(p)).collect(), start, len }
    }

    pub fn batch(&self) -> usize {
        self.pads.len()
    }

    /// Number of key slots visible to this pass (cache + new tokens).
    pub fn keys(&self) -> usize {
        self.start + self.len
    }

    fn padded(&self) -> bool {
        self.pads.iter().any(|p| p.len > 0)
    }

    /// RoPE position of slot `slot` in row `row` (that of the pad's first slot inside it).
    fn position(&self, row: usize, slot: usize) -> usize {
        let pad = self.pads[row];
        if slot < pad.at { slot } else { slot.saturating_sub(pad.len).max(pad.at) }
    }

    /// Whether the query at `slot` of `row` may attend to key slot `key`.
    fn visible(&self, row: usize, slot: usize, key: usize) -> bool {
        let pad = self.pads[row];
        if pad.contains(slot) { key == slot } else { key <= slot && !pad.contains(key) }
    }
}

/// Head geometry the tables are expanded for.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub query: usize,
    pub key_value: usize,
    pub dim: usize,
}

/// RoPE tables for one set of heads, `[rows, t * heads * head_dim]` (rows = 1 when all rows
/// share positions): `cos`, and `sin` with the rotate-half sign folded in (`−sin` on the first
/// half of each head, `+sin` on the second).
pub struct RopeTables<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
}

/// Device tensors for one forward pass.
pub struct LayoutTensors<B: Backend> {
    /// Query tables, pre-multiplied by the attention scale `1/sqrt(head_dim)`.
    pub query: RopeTables<B>,
    pub key: RopeTables<B>,
    /// Additive attention bias (0 or −∞) to add to scores viewed as `[rows, n]`: `[1, t*keys]`
    /// when rows share the mask (broadcast over batch and heads), else the full
    /// `[batch, heads*t*keys]`. `None` when a single query sees every cached key.
    pub bias: Option<Tensor<B, 2>>,
    /// The model's matmul dtype, for the layers this is passed through.
    pub compute: crate::dtype::ComputeDtype,
}

/// The query and key tables of `positions` (`rows` rows of as many positions each): one
/// cos/sin row per position, expanded over the heads; the query's scaled by `1/sqrt(head_dim)`.
pub fn rope_tables<B: Backend>(
    positions: &[usize],
    rows: usize,
    rope: &Rope,
    heads: Heads,
    device: &B::Device,
) -> [RopeTables<B>; 2] {
    let hd = heads.dim;
    let half = hd / 2;
    let mut base_cos = vec![0f32; positions.len() * hd];
    let mut base_sin = vec![0f32; positions.len() * hd];
    for (i, &position) in positions.iter().enumerate() {
        let (c, sn) = (&mut base_cos[i * hd..(i + 1) * hd], &mut base_sin[i * hd..(i + 1) * hd]);
        rope.fill_row(position, c, sn);
        sn[..half].iter_mut().for_each(|x| *x = -*x);
    }
    let per_row = positions.len() / rows.max(1);
    let scale = 1.0 / (hd as f32).sqrt();
    let tables = |n_heads: usize, scale: f32| {
        let expand = |base: &[f32]| {
            let mut out = Vec::with_capacity(base.len() * n_heads);
            for row in base.chunks(hd) {
                for _ in 0..n_heads {
                    out.extend(row.iter().map(|x| x * scale));
                }
            }
            Tensor::<B, 2>::from_data(TensorData::new(out, [rows, per_row * n_heads * hd]), device)
        };
        RopeTables { cos: expand(&base_cos), sin: expand(&base_sin) }
    };
    [tables(heads.query, scale), tables(heads.key_value, 1.0)]
}

impl<B: Backend> LayoutTensors<B> {
    pub fn new(layout: &Layout, rope: &Rope, heads: Heads, device: &B::Device) -> Self {
        let (t, s) = (layout.len, layout.keys());
        let padded = layout.padded();
        let rows = if padded { layout.batch() } else { 1 };

        let positions: Vec<usize> =
            (0..rows).flat_map(|r| (0..t).map(move |q| layout.position(r, layout.start + q))).collect();
        let [query, key] = rope_tables(&positions, rows, rope, heads, device);

        let bias = if t == 1 && !padded {
            None
        } else if !padded {
            let mut bias = vec![f32::NEG_INFINITY; t * s];
            for q in 0..t {
                bias[q * s..q * s + layout.start + q + 1].fill(0.0);
            }
            Some(Tensor::from_data(TensorData::new(bias, [1, t * s]), device))
        } else {
            let per_head = t * s;
            let mut bias = vec![f32::NEG_INFINITY; rows * heads.query * per_head];
            for r in 0..rows {
                let first = r * heads.query * per_head;
                for q in 0..t {
                    for k in 0..s {
                        if layout.visible(r, layout.start + q, k) {
                            bias[first + q * s + k] = 0.0;
                        }
                    }
                }
                let (head0, rest) = bias[first..first + heads.query * per_head].split_at_mut(per_head);
                for h in rest.chunks_mut(per_head) {
                    h.copy_from_slice(head0);
                }
            }
            Some(Tensor::from_data(TensorData::new(bias, [rows, heads.query * per_head]), device))
        };

        LayoutTensors { query, key, bias, compute: Default::default() }
    }
}
