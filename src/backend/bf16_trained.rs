//! Training's bf16 products on the CPU: a linear layer's `x · w` for its f32 master weight
//! `w`, with the backward pass as one autodiff op.
//!
//! The numbers are those of burn's ops on the bf16 casts: the inputs, the weight and the
//! incoming gradient rounded to bf16, products accumulated in f32, each product rounded to
//! bf16 (returned in f32). burn's ops copy each bf16 operand to f32 for the f32 GEMM, forward
//! and backward, and a bf16 train step ran at 0.6× f32's speed.
//!
//! On a CPU with AVX512-BF16 the three products run through `hacpo_kernels::
//! bf16_panel_products`: the first operand's pairs of elements along the shared dimension are
//! 32-bit words (a row-major bf16 matrix is that already, and the weight's gradient reads the
//! inputs' rows paired), the second operand is packed in panels of 48 columns. The packing
//! replaces the transposes the pair products needed ([`super::bf16_matmul`]'s kernel, which
//! reduces each output's partial sums across a register at the end): on a 2-core AMD EPYC
//! (Zen 5) the panels ran the training shapes at 510–530 GFLOP/s a core, the pair products at
//! 280–385. Elsewhere the operands are widened for the f32 GEMM (exact: bf16 numbers are f32
//! numbers) and the results rounded.

use std::borrow::Cow;
use std::sync::Arc;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::Cpu;
use super::bf16_matmul::{bits_of_f32, pair_products, round_to_bf16, transpose_bits, widened};
use super::cast::widen;
use super::fused::{ad, contiguous, elems};
use super::kernels;
use super::primitive::tensor;

#[cfg(test)]
thread_local! {
    /// How many master weights [`trained`] has rounded on this thread (tests count the casts a
    /// forward pass makes).
    pub(crate) static WEIGHTS_ROUNDED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `a · b` in bf16 on the CPU autodiff backend, for `a: [m, k]` and the f32 master weight
/// `b: [k, n]` (stored so, or a transposed view of `[n, k]`), with its backward (see the
/// module docs).
pub(super) fn trained<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    let (a, b) = (ad(a), ad(b));
    let x = Paired::round(&a.primitive);
    #[cfg(test)]
    WEIGHTS_ROUNDED.with(|n| n.set(n.get() + 1));
    let w = Weight::round(&b.primitive);
    let (m, k, n) = (x.rows, x.cols, w.n);
    let out = if pair_products() {
        panel_products(&x.words, (x.row_words(), 1), m, k, &packed(&w.bits, w.strides, k, n), n)
    } else {
        rounded(widened(widen(&x.dense()), m, k, &w.bits, w.rows(), n))
    };
    let out = FlexTensor::from_data(TensorData::new(out, [m, n]));
    let state = Arc::new(PairProductState { x, w });
    let out = match PairProduct.prepare::<NoCheckpointing>([a.node.clone(), b.node.clone()]).compute_bound().stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    tensor::<B, D, _>(out)
}

/// A matrix rounded to bf16, each row padded with a zero to an even length: a row's elements
/// `2p, 2p + 1` are then one 32-bit word (low half first), as the panel products read their
/// first operand.
#[derive(Debug)]
struct Paired {
    words: Vec<u32>,
    rows: usize,
    cols: usize,
}

impl Paired {
    /// The f32 matrix `a` (`[rows, cols]`, any layout) rounded to bf16 (ties to even).
    fn round(a: &FlexTensor) -> Paired {
        let a = contiguous(a);
        let [rows, cols] = [a.layout().shape()[0], a.layout().shape()[1]];
        let mut paired = Paired { words: vec![0; rows * cols.div_ceil(2)], rows, cols };
        if rows * cols == 0 {
            return paired;
        }
        let (stride, per_task) = (paired.stride(), (1 << 16) / cols + 1);
        let bits: &mut [u16] = bytemuck::cast_slice_mut(&mut paired.words);
        bits.par_chunks_mut(stride * per_task).zip(elems(&a).par_chunks(cols * per_task)).for_each(|(bits, values)| {
            for (bits, values) in bits.chunks_mut(stride).zip(values.chunks(cols)) {
                kernels::bf16_round_bits(values, &mut bits[..cols]);
            }
        });
        paired
    }

    fn row_words(&self) -> usize {
        self.cols.div_ceil(2)
    }

    /// bf16 elements from one row to the next.
    fn stride(&self) -> usize {
        2 * self.row_words()
    }

    /// The bits, rows [`Self::stride`] apart.
    fn bits(&self) -> &[u16] {
        bytemuck::cast_slice(&self.words)
    }

    /// The bits row-major without the padding.
    fn dense(&self) -> Cow<'_, [u16]> {
        if self.cols % 2 == 0 {
            return Cow::Borrowed(self.bits());
        }
        Cow::Owned(self.bits().chunks(self.stride()).flat_map(|row| &row[..self.cols]).copied().collect())
    }

    /// Rows `2p, 2p + 1` interleaved (`[rows / 2, cols]` words): the first operand of a sum over
    /// the rows (`xᵀ · dy`, the weight's gradient).
    fn paired_rows(&self) -> Vec<u32> {
        const PAIRS_PER_TASK: usize = 64;
        let mut out = vec![0u32; self.rows.div_ceil(2) * self.cols];
        if self.cols == 0 {
            return out;
        }
        out.par_chunks_mut(PAIRS_PER_TASK * self.cols).enumerate().for_each(|(task, out)| {
            let first = task * PAIRS_PER_TASK;
            let pairs = (first, first + out.len() / self.cols);
            kernels::pair_rows(self.bits(), self.stride(), (self.rows, self.cols), pairs, out);
        });
        out
    }
}

/// A master weight `[k, n]` rounded to bf16, in the layout it was stored in: element `(i, c)`
/// at `i·strides.0 + c·strides.1`.
#[derive(Debug)]
struct Weight {
    bits: Vec<u16>,
    strides: (usize, usize),
    n: usize,
}

impl Weight {
    /// `w` rounded ([`bits_of_f32`]: read without a copy when stored `[k, n]` or `[n, k]`).
    fn round(w: &FlexTensor) -> Weight {
        let [k, n] = [w.layout().shape()[0], w.layout().shape()[1]];
        let (bits, rows) = bits_of_f32(w);
        Weight { bits, strides: if rows { (n, 1) } else { (1, k) }, n }
    }

    /// Whether the bits are `[k, n]` row-major (else `[n, k]`), as [`widened`] reads them.
    fn rows(&self) -> bool {
        self.strides.1 == 1
    }
}

#[derive(Debug)]
struct PairProductState {
    /// The inputs rounded, `[m, k]`.
    x: Paired,
    /// The weight rounded.
    w: Weight,
}

#[derive(Debug)]
struct PairProduct;

impl Backward<Cpu, 2> for PairProduct {
    type State = Arc<PairProductState>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let PairProductState { x, w } = &*ops.state;
        let (m, k, n) = (x.rows, x.cols, w.n);
        let dy = Paired::round(&grads.consume::<Cpu>(&ops.node));
        let [node_x, node_w] = ops.parents;
        if let Some(node) = node_x {
            // dx = dy · wᵀ, summed over the weight's columns.
            let dx = if pair_products() {
                let transposed = packed(&w.bits, (w.strides.1, w.strides.0), n, k);
                panel_products(&dy.words, (dy.row_words(), 1), m, n, &transposed, k)
            } else {
                rounded(widened(widen(&dy.dense()), m, n, &w.bits, !w.rows(), k))
            };
            grads.register::<Cpu>(node.id, FlexTensor::from_data(TensorData::new(dx, [m, k])));
        }
        if let Some(node) = node_w {
            // dw = xᵀ · dy, summed over the rows.
            let dw = if pair_products() {
                let dy = packed(dy.bits(), (dy.stride(), 1), m, n);
                panel_products(&x.paired_rows(), (1, k), k, m, &dy, n)
            } else {
                rounded(widened(widen(&transpose_bits(&x.dense(), m, k)), k, m, &dy.dense(), true, n))
            };
            grads.register::<Cpu>(node.id, FlexTensor::from_data(TensorData::new(dw, [k, n])));
        }
    }
}

/// `values` rounded to bf16 (in f32).
fn rounded(mut values: Vec<f32>) -> Vec<f32> {
    round_to_bf16(&mut values);
    values
}

/// The operand `shared × cols` whose element `(i, c)` is `src[i·strides.0 + c·strides.1]`,
/// packed in panels ([`kernels::pack_panels`]), one panel per task.
fn packed(src: &[u16], strides: (usize, usize), shared: usize, cols: usize) -> Vec<u32> {
    let pairs = shared.div_ceil(2);
    let mut out = vec![0u32; kernels::packed_len(pairs, cols)];
    if pairs == 0 {
        return out;
    }
    out.par_chunks_mut(kernels::PANEL_COLS * pairs).enumerate().for_each(|(panel, out)| {
        kernels::pack_panels(src, strides, (shared, cols), (panel, panel + 1), out);
    });
    out
}

/// `a · b` rounded to bf16 (in f32) through the panel products: `rows` rows of `a` (word
/// `(r, p)` at `r·strides.0 + p·strides.1`), `shared` elements summed, `b` [`packed`] with
/// `cols` columns. The rows are split over the threads, each task rounding its rows while
/// they are in cache.
fn panel_products(a: &[u32], strides: (usize, usize), rows: usize, shared: usize, b: &[u32], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    if rows * cols == 0 {
        return out;
    }
    let per_task = rows.div_ceil(4 * rayon::current_num_threads()).next_multiple_of(8).clamp(8, 128);
    out.par_chunks_mut(per_task * cols).enumerate().for_each(|(task, out)| {
        let first = task * per_task;
        let pairs = shared.div_ceil(2);
        kernels::bf16_panel_products(
            &a[first * strides.0..],
            strides,
            out.len() / cols,
            pairs,
            b,
            cols,
            out,
            cols,
            false,
        );
        kernels::bf16_round(out);
    });
    out
}
