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

    /// Why computing in this dtype on `device` is a poor choice, if it is, with the measured
    /// cost: it is offered for speed, and a user who picks it where it is slower is told
    /// rather than left to find out. On a CPU with AVX512-BF16, bf16 products run through
    /// `vdpbf16ps` at twice f32's rate and every phase measured is faster; on other CPUs the
    /// kernels compute in f32 and convert what they read: bf16 weights halve what decoding one
    /// sequence reads, but batches and training convert more than they save, and f16 is
    /// converted everywhere. On CUDA, burn's backend is built without autotuning, so a
    /// half-precision matmul takes one fixed kernel that runs no faster than the f32 one.
    pub fn speed_warning(self, device: &str) -> Option<String> {
        self.speed_warning_on(device, hacpo_kernels::bf16_dot_instructions())
    }

    /// [`Self::speed_warning`] on a CPU that has AVX512-BF16 or not.
    fn speed_warning_on(self, device: &str, cpu_bf16_pairs: bool) -> Option<String> {
        if self == Dtype::F32 || (device == "cpu" && self == Dtype::Bf16 && cpu_bf16_pairs) {
            return None;
        }
        let d = self.name();
        let (name, why) = if device == "cpu" {
            (
                "on the CPU",
                if self == Dtype::Bf16 {
                    "this CPU has no AVX512-BF16, so its kernels compute in f32 and convert what they read; `hacpo \
                     bench --compute-dtype bf16` against f32, SmolLM2-135M: bf16 on a 2-core AMD EPYC with AVX2, \
                     prefill 0.94x, decoding 1.86x at batch 1 but 0.74x at batch 32; a train step 0.60x on a 2-core \
                     Xeon"
                        .to_string()
                } else {
                    format!(
                        "its kernels compute {d} in f32 and convert what they read; measure with `hacpo bench --compute-dtype {d}`"
                    )
                },
            )
        } else if device.starts_with("cuda") {
            (
                "on CUDA",
                "its matmuls take one fixed kernel, and f32's already run on the tensor cores in TF32; `hacpo bench \
                 --compute-dtype bf16` against f32 on an H200, qwen-0.5b shape: prefill 1.12x, decoding 0.70x at \
                 batch 1 and 0.91x at batch 64, a train step 0.82x"
                    .to_string(),
            )
        } else {
            return None;
        };
        Some(format!("warning: {d} compute {name} is not faster than f32 in this build ({why}); use f32 {name}"))
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

    /// `a · b` multiplied in this dtype, returned in f32.
    pub fn matmul<B: Backend, const D: usize>(self, a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
        f32_weight(self.product(a, b))
    }

    /// `a · b` multiplied in this dtype and returned in it (for readers that take it as
    /// stored: widening it would change no value).
    pub fn product<B: Backend, const D: usize>(self, a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
        self.cast(a).matmul(self.cast(b))
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

#[cfg(test)]
mod tests {
    use super::Dtype;

    #[test]
    fn half_precision_warns_where_it_is_not_faster() {
        for (device, pairs) in [("cpu", false), ("cuda", false), ("cuda", true), ("cuda:1", true)] {
            assert_eq!(Dtype::F32.speed_warning_on(device, pairs), None);
            let w = Dtype::Bf16.speed_warning_on(device, pairs).unwrap();
            let name = if device == "cpu" { "on the CPU" } else { "on CUDA" };
            assert!(w.starts_with(&format!("warning: bf16 compute {name} is not faster than f32")), "{w}");
            assert!(w.ends_with(&format!("use f32 {name}")), "{w}");
        }
        // A CPU with AVX512-BF16 multiplies bf16 faster than f32; f16 it still converts.
        assert_eq!(Dtype::Bf16.speed_warning_on("cpu", true), None);
        assert!(Dtype::F16.speed_warning_on("cpu", true).unwrap().contains("--compute-dtype f16"));
        assert!(Dtype::F16.speed_warning_on("cpu", false).unwrap().contains("--compute-dtype f16"));
        assert_eq!(Dtype::F16.speed_warning("wgpu"), None);
    }
}
