//! Row gathers whose gradient is a gather too, on every backend.
//!
//! burn's `select` takes its gradient by adding each output row into a zeroed input
//! (`select_add`). On the CubeCL backends (CUDA, wgpu) that kernel runs one thread per column
//! and walks every index in turn, since two indices may name the same row: a few hundred
//! threads doing thousands of dependent steps each. The packed tokens of a training
//! micro-batch go through such gathers four times a layer for every padded pass (its slots
//! and back; the final hidden states' one gather keeps `select`: a group's responses all read
//! their prompt's last row).
//!
//! Those gathers read each input row at most once (a pass's padding slots aside, whose
//! gradient is exactly zero: later slots never influence earlier ones, and the padding's own
//! outputs are dropped). So the gradient is itself a gather: input row `r` takes the output
//! row that read it, or zero. [`gather_rows`] is `select` with that backward, a custom autodiff
//! op over whichever backend runs under `Autodiff`.
//!
//! A pass without padding takes its rows as one range, [`row_range`]: a view, whose gradient
//! puts the range's back among zeros in one pass. burn's `slice` takes it as a zeroed input
//! with the rows assigned into it, which burn-flex runs as three passes over the whole input
//! (a zeroed buffer, copied into an aligned one, copied again before the write), for each
//! pass's queries, keys and values in every layer: 3% of the embedded default's run.

use std::any::{Any, TypeId};
use std::ops::Range;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{
    DType, FloatDType, Int, Shape, Slice, Tensor, TensorData, TensorMetadata, TensorPrimitive, backend::Backend,
};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;

use super::fused::{contiguous, elems};

/// Returns `tracked::<B, I>(args)` when `B` is `Autodiff` over an inner backend `I` this build
/// runs; otherwise goes on to what follows it.
macro_rules! on_autodiff {
    ($b:ident, $tracked:ident($($arg:expr),*)) => {
        on_autodiff!(@one $b, super::Cpu, $tracked($($arg),*));
        #[cfg(feature = "cuda")]
        on_autodiff!(@one $b, super::Cuda, $tracked($($arg),*));
        #[cfg(feature = "wgpu")]
        on_autodiff!(@one $b, super::Wgpu, $tracked($($arg),*));
    };
    (@one $b:ident, $inner:ty, $tracked:ident($($arg:expr),*)) => {
        if TypeId::of::<$b>() == TypeId::of::<Autodiff<$inner>>() {
            return $tracked::<$b, $inner>($($arg),*);
        }
    };
}

/// Rows `index` of `x` (`[rows, width]` → `[index.len(), width]`), whose gradient with
/// respect to `x` is gathered back through `back`: input row `r` takes the gradient of output
/// row `back[r]`, or zero where `back[r]` is `index.len()` (a row nothing read).
///
/// The caller vouches that every output row with a gradient other than zero reads an input
/// row `r` with `back[r]` naming it; then the gradient is `select`'s, whose sums it skips.
pub fn gather_rows<B: Backend>(x: Tensor<B, 2>, index: Tensor<B, 1, Int>, back: Tensor<B, 1, Int>) -> Tensor<B, 2> {
    on_autodiff!(B, tracked(x, index, back));
    // No gradient to take (or an autodiff backend not named above, where `select`'s is right).
    x.select(0, index)
}

fn tracked<B: Backend, I: Backend>(x: Tensor<B, 2>, index: Tensor<B, 1, Int>, back: Tensor<B, 1, Int>) -> Tensor<B, 2> {
    let index: IntTensor<I> = cast(index.into_primitive());
    let back: IntTensor<I> = cast(back.into_primitive());
    recorded::<B, I, _>(GatherRows, x, |x| (back, I::float_select(x, 0, index)))
}

/// `forward`'s output from `x`'s values (`B` being `Autodiff<I>`), with `op`'s backward (and
/// the state `forward` gives) recorded for it where `x` is tracked.
fn recorded<B: Backend, I: Backend, O: Backward<I, 1>>(
    op: O,
    x: Tensor<B, 2>,
    forward: impl FnOnce(FloatTensor<I>) -> (O::State, FloatTensor<I>),
) -> Tensor<B, 2> {
    let x: FloatTensor<Autodiff<I>> = cast(x.into_primitive().tensor());
    let (state, out) = forward(x.primitive);
    let out = match op.prepare::<NoCheckpointing>([x.node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(cast(out)))
}

/// Rows `rows` of `x` (`[rows, width]`), a view, whose gradient with respect to `x` is the
/// range's put back among zeros in one pass ([`put_rows`]): `slice`'s values, without its
/// copies (see the module docs).
pub fn row_range<B: Backend>(x: Tensor<B, 2>, rows: Range<usize>) -> Tensor<B, 2> {
    on_autodiff!(B, tracked_range(x, rows));
    let width = x.dims()[1];
    x.slice([rows, 0..width])
}

fn tracked_range<B: Backend, I: Backend>(x: Tensor<B, 2>, rows: Range<usize>) -> Tensor<B, 2> {
    let len = x.dims()[0];
    recorded::<B, I, _>(RowRange, x, |x| {
        let width = x.shape()[1];
        let out = I::float_slice(x, &[Slice::from(rows.clone()), Slice::from(0..width)]);
        ((rows, len), out)
    })
}

thread_local! {
    /// How many [`row_range`] gradients this thread has put back (tests check that the op, not
    /// `slice`'s fallback, ran).
    pub(crate) static RANGES_PUT_BACK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[derive(Debug)]
struct RowRange;

impl<I: Backend> Backward<I, 1> for RowRange {
    /// The rows taken, and how many the input has.
    type State = (Range<usize>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let (rows, len) = ops.state;
        RANGES_PUT_BACK.with(|n| n.set(n.get() + 1));
        grads.register::<I>(parent.id, put_rows::<I>(grad, rows, len));
    }
}

/// `grad` (`[rows.len(), width]`) as rows `rows` of `[len, width]` zeros: on the CPU one buffer
/// written once, elsewhere a concatenation.
fn put_rows<I: Backend>(grad: FloatTensor<I>, rows: Range<usize>, len: usize) -> FloatTensor<I> {
    let width = grad.shape()[1];
    if TypeId::of::<I>() == TypeId::of::<super::Cpu>() && grad.dtype() == DType::F32 {
        let grad = contiguous(&cast::<FloatTensor<I>, FlexTensor>(grad));
        let mut out = Vec::with_capacity(len * width);
        out.resize(rows.start * width, 0.0);
        out.extend_from_slice(elems(&grad));
        out.resize(len * width, 0.0);
        return cast(FlexTensor::from_data(TensorData::new(out, [len, width])));
    }
    let (device, dtype) = (I::float_device(&grad), FloatDType::from(grad.dtype()));
    let zeros = |n: usize| I::float_zeros(Shape::new([n, width]), &device, dtype);
    let before = (rows.start > 0).then(|| zeros(rows.start));
    let after = (len > rows.end).then(|| zeros(len - rows.end));
    let parts: Vec<_> = before.into_iter().chain([grad]).chain(after).collect();
    if parts.len() == 1 { parts.into_iter().next().expect("one part") } else { I::float_cat(parts, 0) }
}

/// `from` as `To`, the same type under the name the caller knows it by.
fn cast<From: 'static, To: 'static>(from: From) -> To {
    let boxed: Box<dyn Any> = Box::new(from);
    *boxed.downcast().expect("the same backend's primitive")
}

#[derive(Debug)]
struct GatherRows;

impl<I: Backend> Backward<I, 1> for GatherRows {
    /// `back`, the output row each input row takes its gradient from.
    type State = IntTensor<I>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<I>(&ops.node);
        let [Some(parent)] = ops.parents else { return };
        let shape = grad.shape();
        let zero = I::float_zeros(Shape::new([1, shape[1]]), &I::float_device(&grad), FloatDType::from(grad.dtype()));
        // The zero row at `index.len()` serves the input rows nothing read.
        let grad = I::float_cat(vec![grad, zero], 0);
        grads.register::<I>(parent.id, I::float_select(grad, 0, ops.state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;

    type Ad = Autodiff<Cpu>;

    /// Rows 2, 0 and 4 of five, then a padding row that reads row 0; rows 1 and 3 are read by
    /// none. The gradient is `select`'s while the padding row's is zero; given one, it is
    /// dropped where `select` adds it to row 0 (which shows the custom backward ran).
    #[test]
    fn the_gradient_is_gathered_back_and_skips_what_padding_read() {
        let dev = Default::default();
        let data: Vec<f32> = (0..15).map(|i| i as f32 * 0.37 - 2.0).collect();
        let x = Tensor::<Ad, 2>::from_data(TensorData::new(data, [5, 3]), &dev).require_grad();
        let ints = |v: Vec<i64>| Tensor::<Ad, 1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), &dev);
        let (index, back) = (ints(vec![2, 0, 4, 0]), ints(vec![1, 4, 0, 4, 2]));
        let host = |t: Tensor<Cpu, 2>| t.into_data().into_vec::<f32>().unwrap();
        let grad = |out: Tensor<Ad, 2>, padding: f32| {
            let w = [1.0, 2.0, 3.0, -1.0, 0.5, 4.0, 2.0, 2.0, -3.0, padding, padding, padding];
            let w = Tensor::<Ad, 2>::from_data(TensorData::new(w.to_vec(), [4, 3]), &dev);
            host(x.grad(&(out * w).sum().backward()).unwrap())
        };
        let ours = || gather_rows(x.clone(), index.clone(), back.clone());
        let select = || x.clone().select(0, index.clone());
        assert_eq!(host(ours().inner()), host(select().inner()));
        let plain = gather_rows(x.clone().inner(), index.clone().inner(), back.clone().inner());
        assert_eq!(host(plain), host(select().inner()));
        assert_eq!(grad(ours(), 0.0), grad(select(), 0.0));
        let (ours, select) = (grad(ours(), 1.0), grad(select(), 1.0));
        assert_eq!(ours[3..], select[3..]);
        assert_eq!(ours[..3].iter().map(|g| g + 1.0).collect::<Vec<_>>(), select[..3]);
    }

    /// Rows taken as ranges have `slice`'s values and gradient, to the bit, over ranges that
    /// overlap (a row's gradient summed from two) and leave a row out (zero), on the CPU's
    /// buffer and on the concatenation other backends run.
    #[test]
    fn a_row_range_has_the_values_and_gradient_of_a_slice() {
        let dev = Default::default();
        let data: Vec<f32> = (0..18).map(|i| (i as f32 * 0.73).sin()).collect();
        let x = Tensor::<Ad, 2>::from_data(TensorData::new(data, [6, 3]), &dev).require_grad();
        let host = |t: Tensor<Cpu, 2>| t.into_data().into_vec::<f32>().unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let gradient = |take: &dyn Fn(Range<usize>) -> Tensor<Ad, 2>| {
            let parts = [0..2, 2..5, 1..4].map(|rows| {
                let n = rows.len();
                let w: Vec<f32> = (0..n * 3).map(|i| 0.5 - i as f32 * 0.31 + rows.start as f32).collect();
                (take(rows) * Tensor::<Ad, 2>::from_data(TensorData::new(w, [n, 3]), &dev)).sum()
            });
            let loss = parts.into_iter().reduce(|a, b| a + b).unwrap();
            host(x.grad(&loss.backward()).unwrap())
        };
        let sliced = |rows: Range<usize>| x.clone().slice([rows, 0..3]);
        assert_eq!(host(row_range(x.clone(), 2..5).inner()), host(sliced(2..5).inner()));
        assert_eq!(host(row_range(x.clone().inner(), 1..4)), host(sliced(1..4).inner()));
        RANGES_PUT_BACK.with(|n| n.set(0));
        let ours = gradient(&|rows| row_range(x.clone(), rows));
        assert_eq!(RANGES_PUT_BACK.with(|n| n.get()), 3, "the op's backward ran, not slice's");
        assert_eq!(bits(ours.clone()), bits(gradient(&sliced)));
        assert!(ours[15..].iter().all(|&g| g == 0.0) && ours[..15].iter().all(|&g| g != 0.0), "{ours:?}");
        let grad =
            |v: Vec<f32>, n| Tensor::<Cpu, 2>::from_data(TensorData::new(v, [n, 3]), &dev).into_primitive().tensor();
        for (rows, len) in [(2..4, 6), (0..2, 2), (0..2, 5), (3..5, 5)] {
            let g: Vec<f32> = (0..rows.len() * 3).map(|i| i as f32 - 2.5).collect();
            let want = Tensor::<Cpu, 2>::zeros([len, 3], &dev).slice_assign(
                [rows.clone(), 0..3],
                Tensor::from_primitive(TensorPrimitive::Float(grad(g.clone(), rows.len()))),
            );
            let cpu: Tensor<Cpu, 2> = Tensor::from_primitive(TensorPrimitive::Float(put_rows::<Cpu>(
                grad(g.clone(), rows.len()),
                rows.clone(),
                len,
            )));
            assert_eq!(host(cpu), host(want.clone()), "{rows:?} of {len}");
            // The concatenation, as other backends run it: the CPU's buffer is f32 only.
            let half = Tensor::<Cpu, 2>::from_primitive(TensorPrimitive::Float(grad(g, rows.len())));
            let half = half.cast(FloatDType::F16).into_primitive().tensor();
            let cat: Tensor<Cpu, 2> = Tensor::from_primitive(TensorPrimitive::Float(put_rows::<Cpu>(half, rows, len)));
            assert_eq!(host(cat.cast(FloatDType::F32)), host(want), "concatenated");
        }
    }
}
