//! Training's bf16 products on the CPU: a linear layer's `x · w` for its f32 master weight
//! `w`, with the backward pass as one autodiff op.
//!
//! The numbers are those of a bf16 product: the inputs, the weight and the incoming gradient
//! rounded to the nearest bf16 (`cast`'s rounding), products accumulated in f32, each product
//! rounded to bf16 (returned in f32); burn's ops on the bf16 casts give the same up to the
//! order of the sums and their rounding of a few values through f64. burn's ops copy each
//! bf16 operand to f32 for the f32 GEMM, forward and backward, and a bf16 train step ran at
//! 0.6× f32's speed.
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

use std::sync::Arc;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;

use super::Cpu;
use super::bf16_matmul::{bits_of_f32, pair_products, round_to_bf16, transpose_bits, widened};
use super::bf16_panels::{Paired, packed, panel_products, sum_over_rows};
use super::cast::widen;
use super::fused::ad;
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
    assert_eq!(w.bits.len(), k * n, "a · b: a's columns are b's rows");
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
                sum_over_rows(x, &dy)
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
