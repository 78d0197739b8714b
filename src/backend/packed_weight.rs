//! A weight kept packed for the CPU's panel products where the same weight multiplies again
//! and again: a rollout copy's, once per decoding step (`model::precision::rollout_copy`). A
//! bf16 weight on a CPU with AVX512-BF16 ([`bf16_panels::Packed`]), an f32 weight on a CPU
//! with AVX-512 or AVX2 ([`f32_matmul::PackedF32`]). The copy serves only the tensor it was packed
//! from: holding that tensor keeps its buffer alive, so a weight whose buffer and view are the
//! same is the same weight, and any other (a weight replaced, cast or loaded since) is
//! multiplied as usual.

use burn::tensor::{DType, Tensor, backend::Backend};
use burn_flex::FlexTensor;

use super::bf16_matmul;
use super::bf16_panels::{self, Packed};
use super::f32_matmul::{self, PackedF32};
use super::fused::{CpuBackend, cpu_backend, flex};
use crate::dtype::ComputeDtype;

#[cfg(test)]
thread_local! {
    /// How many products [`PackedWeight`]s have served on this thread (tests check that the
    /// rollout copy's run through them).
    pub(crate) static PACKED_PRODUCTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether a rollout copy whose products run in `compute` keeps its weights packed on the
/// backend `B`: the plain CPU backend, bf16 on a CPU with AVX512-BF16, f32 with AVX-512.
pub fn packs<B: Backend>(compute: ComputeDtype) -> bool {
    match compute {
        ComputeDtype::Bf16 => bf16_panels::packs::<B>(),
        ComputeDtype::F32 => f32_matmul::packs::<B>(),
        ComputeDtype::F16 => false,
    }
}

/// A second operand `b` (`[k, n]`) packed once for several products `a · b` in its dtype, bf16
/// or f32, on the plain CPU backend where the CPU has the panel products: the LM head's chunks
/// of a scoring or training pass, a [`PackedWeight`].
pub enum PackedPanels {
    Bf16(Packed),
    F32(PackedF32),
}

impl PackedPanels {
    /// `b` (stored `[k, n]` or as the transpose of `[n, k]`) packed, where its dtype packs on
    /// this CPU ([`packs`]); else `None` (multiply as usual).
    pub fn of<B: Backend>(b: &Tensor<B, 2>) -> Option<Self> {
        match b.dtype() {
            DType::BF16 => Packed::of(b).map(PackedPanels::Bf16),
            DType::F32 => PackedF32::of(b).map(PackedPanels::F32),
            _ => None,
        }
    }

    /// `a · b` for an f32 `a: [m, k]` on the plain CPU backend (in bf16 for a bf16 `b`,
    /// rounded, returned in f32); `a` back where an f32 product of its rows does not run the
    /// panels (`f32_matmul::PackedF32::product`).
    pub fn product<B: Backend>(&self, a: Tensor<B, 2>) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
        match self {
            PackedPanels::Bf16(packed) => Ok(packed.product(a)),
            PackedPanels::F32(packed) => packed.product(a),
        }
    }

    /// The compute dtype whose products this serves.
    fn compute(&self) -> ComputeDtype {
        match self {
            PackedPanels::Bf16(_) => ComputeDtype::Bf16,
            PackedPanels::F32(_) => ComputeDtype::F32,
        }
    }

    fn shape(&self) -> [usize; 2] {
        match self {
            PackedPanels::Bf16(packed) => packed.shape(),
            PackedPanels::F32(packed) => packed.shape(),
        }
    }
}

/// A weight of the plain CPU backend with its packed copy ([`packs`]).
pub struct PackedWeight {
    weight: FlexTensor,
    packed: PackedPanels,
}

impl PackedWeight {
    /// `weight` (`[k, n]`, stored so or a transposed view of `[n, k]`) packed, where its dtype
    /// packs on this CPU ([`packs`]).
    pub fn of<B: Backend>(weight: &Tensor<B, 2>) -> Option<Self> {
        let packed = PackedPanels::of(weight)?;
        Some(PackedWeight { weight: flex(weight.clone()), packed })
    }

    /// `a · weight` from the packed copy (a bf16 weight's rounded to bf16, in f32) for an f32
    /// `a: [m, k]` on the plain CPU backend and the weight it was packed from; `a` back
    /// otherwise, or for more rows than f32 products run on the panels.
    pub fn product<B: Backend>(&self, a: Tensor<B, 2>, weight: &Tensor<B, 2>) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
        if cpu_backend::<B>(&[a.dtype()]) != Some(CpuBackend::Plain) || !self.packed_from(weight) {
            return Err(a);
        }
        let y = self.packed.product(a)?;
        #[cfg(test)]
        PACKED_PRODUCTS.with(|n| n.set(n.get() + 1));
        Ok(y)
    }

    /// Whether `weight` (of the plain CPU backend) reads the buffer this was packed from,
    /// through the same view.
    fn packed_from<B: Backend>(&self, weight: &Tensor<B, 2>) -> bool {
        let theirs = flex(weight.clone());
        let same_buffer = std::sync::Arc::ptr_eq(&self.weight.data_arc(), &theirs.data_arc());
        same_buffer && self.weight.layout() == theirs.layout() && self.weight.dtype() == theirs.dtype()
    }
}

impl std::fmt::Debug for PackedWeight {
    /// The shape only: the values would print the whole weight.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [k, n] = self.packed.shape();
        f.debug_struct("PackedWeight").field("k", &k).field("n", &n).field("dtype", &self.weight.dtype()).finish()
    }
}

/// [`bf16_matmul::product`] for a 2-D `b`, from `packed` where that holds `b` packed (the
/// rollout copy's weights, [`packs`]) for products in `compute`.
pub fn product_with<B: Backend>(
    compute: ComputeDtype,
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
    packed: Option<&PackedWeight>,
) -> Tensor<B, 2> {
    let a = match packed {
        Some(packed) if packed.packed.compute() == compute => match packed.product(a, &b) {
            Ok(y) => return y,
            Err(a) => a,
        },
        _ => a,
    };
    bf16_matmul::product(compute, a, b)
}
