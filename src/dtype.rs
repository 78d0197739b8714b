//! The dtypes the config names (`[[agents]] frozen_dtype`, `algo.compute_dtype`) and the casts
//! a layer applies where it reads a weight. A leaf: the config, the backend's kernels and the
//! model all name a dtype; how a model is stored and computed in one is `model::precision`.

use burn::tensor::{DType, FloatDType, Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

/// A floating-point dtype the config names: `[[agents]] frozen_dtype` (storage of the weights
/// that do not train) and `algo.compute_dtype` (the matmuls) take the same three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    F32,
    Bf16,
    F16,
}

/// `[[agents]] frozen_dtype`.
pub type FrozenDtype = Dtype;

/// `algo.compute_dtype`: the dtype of the matmuls (see the module docs).
pub type ComputeDtype = Dtype;

impl Dtype {
    pub fn is_f32(&self) -> bool {
        *self == Dtype::F32
    }

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// The dtype the config spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Dtype::F32, Dtype::Bf16, Dtype::F16].into_iter().find(|d| d.name() == name)
    }

    /// Why computing in this dtype on the CPU is a poor choice, if it is. The CPU's kernels
    /// compute in f32: a half-precision forward converts what it reads and gains nothing, so
    /// a user who picks it (it is offered for GPUs) gets a slower run, which is said, with the
    /// measured cost, rather than left to be found.
    pub fn cpu_warning(self) -> Option<String> {
        (self != Dtype::F32).then(|| {
            format!(
                "warning: {} compute on the CPU is slower than f32 in this build (its kernels compute in f32 and \
                 convert what they read; `hacpo bench --compute-dtype {}` against f32, 2-core Xeon with AVX512-BF16, \
                 SmolLM2-135M: prefill 0.54x, decoding 0.18-0.29x, a train step 0.60x); use f32 on the CPU",
                self.name(),
                self.name()
            )
        })
    }

    /// Bytes per number.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    pub fn burn(self) -> FloatDType {
        match self {
            Dtype::F32 => FloatDType::F32,
            Dtype::Bf16 => FloatDType::BF16,
            Dtype::F16 => FloatDType::F16,
        }
    }

    /// The dtype of the attention products and of the KV cache: bf16 when computing in bf16,
    /// else f32. f16's range is too narrow for the probabilities and their gradients: on
    /// wgpu, two HACPO steps' gradient norm came out 12.4 against f32's 21.0 with f16
    /// products, and matched with f32 ones; bf16 has f32's range (flash attention multiplies
    /// in it).
    pub fn attention(self) -> Dtype {
        if self == Dtype::Bf16 { Dtype::Bf16 } else { Dtype::F32 }
    }

    /// `t` in this dtype (unchanged when it already is).
    pub fn cast<B: Backend, const D: usize>(self, t: Tensor<B, D>) -> Tensor<B, D> {
        cast_to(t, self.burn())
    }

    /// A weight as this dtype's forward reads it: rounded to the dtype, returned in f32 (for
    /// the norms, biases and embedding, which compute in f32). The rollout copy stores
    /// exactly these values.
    pub fn weight<B: Backend, const D: usize>(self, t: Tensor<B, D>) -> Tensor<B, D> {
        f32_weight(self.cast(t))
    }

    /// `a · b` multiplied in this dtype, returned in f32.
    pub fn matmul<B: Backend, const D: usize>(self, a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
        f32_weight(self.cast(a).matmul(self.cast(b)))
    }
}

/// `t` in f32, cast if it is stored in another precision.
pub fn f32_weight<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    cast_to(t, FloatDType::F32)
}

/// `t` in `dtype`, unchanged (no copy) when it already is.
pub fn cast_to<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    if t.dtype() == DType::from(dtype) { t } else { t.cast(dtype) }
}
