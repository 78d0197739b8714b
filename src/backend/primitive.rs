//! Moving a tensor between `Tensor<B, D>` and `B`'s float primitive once the caller knows which
//! backend `B` is (a `TypeId` check): the CPU's fused ops ([`super::fused`]) and the GPU's
//! kernels ([`super::cube_fused`]) work on the primitives burn's ops work on.

use std::any::Any;

use burn::tensor::{Tensor, TensorPrimitive, backend::Backend};

/// The float primitive behind `t`, as `T`; only once the caller knows `B`'s primitive is `T`.
pub(crate) fn primitive<B: Backend, const D: usize, T: 'static>(t: Tensor<B, D>) -> T {
    let boxed: Box<dyn Any> = Box::new(t.into_primitive().tensor());
    *boxed.downcast::<T>().expect("B's float primitive is the type the caller checked")
}

/// Wraps a float primitive `T` of `B` as a tensor; only once the caller knows `B`'s primitive
/// is `T`.
pub(crate) fn tensor<B: Backend, const D: usize, T: 'static>(t: T) -> Tensor<B, D> {
    let boxed: Box<dyn Any> = Box::new(t);
    Tensor::from_primitive(TensorPrimitive::Float(*boxed.downcast().expect("B's float primitive")))
}
