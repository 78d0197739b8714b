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

use std::any::{Any, TypeId};

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, Int, Shape, Tensor, TensorMetadata, TensorPrimitive, backend::Backend};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

/// Rows `index` of `x` (`[rows, width]` → `[index.len(), width]`), whose gradient with
/// respect to `x` is gathered back through `back`: input row `r` takes the gradient of output
/// row `back[r]`, or zero where `back[r]` is `index.len()` (a row nothing read).
///
/// The caller vouches that every output row with a gradient other than zero reads an input
/// row `r` with `back[r]` naming it; then the gradient is `select`'s, whose sums it skips.
pub fn gather_rows<B: Backend>(x: Tensor<B, 2>, index: Tensor<B, 1, Int>, back: Tensor<B, 1, Int>) -> Tensor<B, 2> {
    /// Runs [`tracked`] when `B` is `Autodiff` over one of the inner backends named.
    macro_rules! over {
        ($($inner:ty),*) => {$(
            if TypeId::of::<B>() == TypeId::of::<Autodiff<$inner>>() {
                return tracked::<B, $inner>(x, index, back);
            }
        )*};
    }
    over!(super::Cpu);
    #[cfg(feature = "cuda")]
    over!(super::Cuda);
    #[cfg(feature = "wgpu")]
    over!(super::Wgpu);
    // No gradient to take (or an autodiff backend not named above, where `select`'s is right).
    x.select(0, index)
}

fn tracked<B: Backend, I: Backend>(x: Tensor<B, 2>, index: Tensor<B, 1, Int>, back: Tensor<B, 1, Int>) -> Tensor<B, 2> {
    let x: FloatTensor<Autodiff<I>> = cast(x.into_primitive().tensor());
    let index: IntTensor<I> = cast(index.into_primitive());
    let back: IntTensor<I> = cast(back.into_primitive());
    let out = I::float_select(x.primitive, 0, index);
    let out = match Backward::<I, 1>::prepare::<NoCheckpointing>(GatherRows, [x.node]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(back, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(cast(out)))
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
    use burn::tensor::TensorData;

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
}
