//! Storage precision of the weights that do not train.
//!
//! A LoRA policy's frozen base and a full fine-tune's KL reference are only ever read, so they
//! can be stored in bf16 or f16 at half the bytes (32 GB → 16 GB for an 8B model). Compute
//! stays f32: each layer casts a stored weight to f32 where it is used ([`f32_weight`]), one
//! weight at a time, and trainable weights, adapters and optimizer moments stay f32.
//!
//! Where it is available: CUDA (bf16, f16), the CPU backend (both, but burn-flex casts through
//! f64, so each use costs a conversion), wgpu f16 only: WGSL has no bf16 type, and cubecl-wgpu
//! 0.10 does not fail on one but computes garbage, so the config refuses it there.

use burn::module::Param;
use burn::tensor::{DType, FloatDType, Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

use super::transformer::CausalLm;
use super::weights::{ParamVisitor, walk_params};

/// `[[agents]] frozen_dtype`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrozenDtype {
    #[default]
    F32,
    Bf16,
    F16,
}

impl FrozenDtype {
    pub fn is_f32(&self) -> bool {
        *self == FrozenDtype::F32
    }

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            FrozenDtype::F32 => "f32",
            FrozenDtype::Bf16 => "bf16",
            FrozenDtype::F16 => "f16",
        }
    }

    /// The dtype the config spells `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [FrozenDtype::F32, FrozenDtype::Bf16, FrozenDtype::F16].into_iter().find(|d| d.name() == name)
    }

    /// Bytes per stored weight.
    pub fn bytes(self) -> u64 {
        match self {
            FrozenDtype::F32 => 4,
            FrozenDtype::Bf16 | FrozenDtype::F16 => 2,
        }
    }

    fn burn(self) -> FloatDType {
        match self {
            FrozenDtype::F32 => FloatDType::F32,
            FrozenDtype::Bf16 => FloatDType::BF16,
            FrozenDtype::F16 => FloatDType::F16,
        }
    }
}

/// `t` in f32, cast if it is stored in another precision.
pub fn f32_weight<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    if t.dtype() == DType::F32 { t } else { t.cast(FloatDType::F32) }
}

/// `model` with every weight that does not train (no gradient required) stored as `dtype`.
pub fn store_frozen<B: Backend>(model: CausalLm<B>, dtype: FrozenDtype) -> CausalLm<B> {
    if dtype == FrozenDtype::F32 {
        return model;
    }
    struct Cast(FloatDType);
    impl<B: Backend> ParamVisitor<B> for Cast {
        fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            if p.is_require_grad() { p } else { p.map(|t| t.cast(self.0)) }
        }
        fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
            if p.is_require_grad() { p } else { p.map(|t| t.cast(self.0)) }
        }
    }
    walk_params(model, &mut Cast(dtype.burn()))
}

#[cfg(test)]
mod tests {
    use burn::backend::Autodiff;
    use burn::module::AutodiffModule;

    use super::*;
    use crate::backend::Cpu;
    use crate::model::lora::tests::{logits, logits_tensor, max_diff, model};
    use crate::model::lora::{LoraConfig, attach};

    #[test]
    fn a_lora_base_in_bf16_or_f16_keeps_the_logits_and_trains_only_the_adapters_in_f32() {
        type Ad = Autodiff<Cpu>;
        let config = LoraConfig { rank: 4, ..Default::default() };
        // Tied: the embedding is the LM head too, both stored in the lower precision.
        let full = attach(model::<Ad>(true), &config, 1);
        let reference = logits(&full);
        for (dtype, tolerance) in [(FrozenDtype::Bf16, 5e-2), (FrozenDtype::F16, 5e-3)] {
            let half = store_frozen(full.clone(), dtype);
            assert_ne!(half.embed_tokens.val().dtype(), DType::F32);
            let adapter = half.layers[0].self_attn.q_proj.lora.as_ref().unwrap();
            assert_eq!(adapter.a.val().dtype(), DType::F32, "adapters stay f32");
            let d = max_diff(&logits(&half), &reference);
            assert!(d < tolerance, "{dtype:?}: logits differ by {d}");
            let grads = logits_tensor(&half).powi_scalar(2).mean().backward();
            let mut store = crate::train::optim::GradStore::<Cpu>::default();
            store.accumulate(&half, &grads);
            let names = store.names();
            assert_eq!(names.len(), 2 * 7 * 2, "{dtype:?}: {names:?}");
            // Merging casts the stored weight up first.
            let merged = crate::model::lora::merge(half.valid());
            assert_eq!(merged.layers[1].mlp.up_proj.weight.val().dtype(), DType::F32);
        }
    }
}
