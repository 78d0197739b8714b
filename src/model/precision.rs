//! Precision: how weights are stored and in which dtype the matmuls run.
//!
//! **Storage** (`[[agents]] frozen_dtype`). A LoRA policy's frozen base and a full
//! fine-tune's KL reference are only ever read, so they can be stored in bf16 or f16 at half
//! the bytes (32 GB → 16 GB for an 8B model). Each layer casts a stored weight where it is
//! used ([`crate::dtype::f32_weight`], [`ComputeDtype::matmul`]); trainable weights, adapters and optimizer
//! moments stay f32.
//!
//! **Compute** (`algo.compute_dtype`), mixed precision as PyTorch's autocast does it: the
//! projections, the attention products and the LM head multiply in bf16/f16 (tensor cores on
//! a GPU); the residual stream, RMSNorm, softmax, log-softmax, LoRA adapters and the
//! optimizer stay f32, and every matmul's result comes back as f32. Master weights stay f32;
//! the backward pass keeps the half-precision copies the matmuls read, and the gradients
//! reach the f32 weights through the casts. Sampling and scoring read [`rollout_copy`], the
//! policy with every weight stored in the compute dtype once, so decoding does not cast the
//! whole model per token; the KL reference is stored the same way ([`reference_copy`]), and
//! with bf16 the KV cache too ([`ComputeDtype::attention`]; on the CPU only sampling's,
//! scoring's and training's staying f32: [`crate::model::KvCache::for_sampling`]). On a CPU
//! with AVX512-BF16 the rollout copy keeps its weights packed for the panel products as well
//! (`Linear::packed`, as many bytes again; an f32 copy too on a CPU with AVX-512 or AVX2, for
//! decoding's f32 panel products), and training's bf16 products (forward and
//! backward) pack theirs once per product (`backend::bf16_trained`); elsewhere the rollout
//! copy's bf16 weights are read as stored by [`crate::backend::bf16_matmul`].
//! f16 training scales the loss ([`crate::train::loss_scale`]) so that small gradients stay
//! within f16's range; bf16 has f32's range and needs no scaling.
//!
//! Where it is available: CUDA (bf16, f16), the CPU backend (both; bf16 faster than f32 in
//! prefill, decoding and training on a CPU with AVX512-BF16, elsewhere only for decoding a few
//! sequences, see [`ComputeDtype::speed_warning`]), wgpu f16
//! only: WGSL has no bf16 type, and cubecl-wgpu 0.10 does not fail on one but computes
//! garbage, so the config refuses it there.

use std::sync::Arc;

use burn::module::Param;
use burn::tensor::{DType, Tensor, backend::Backend};

use crate::backend::bf16_matmul;
use crate::backend::cast::cast;
use crate::backend::packed_weight::{self, PackedWeight};
use crate::dtype::{ComputeDtype, Dtype, FrozenDtype};

use super::transformer::{CausalLm, Linear};
use super::weights::{ParamVisitor, map_linears, walk_params};

/// `model` computing its matmuls in `dtype` (see the module docs). Weights are unchanged.
pub fn set_compute<B: Backend>(model: CausalLm<B>, dtype: ComputeDtype) -> CausalLm<B> {
    CausalLm { compute: dtype, ..model }
}

/// What sampling and scoring read: `model` with every weight but the LoRA adapters stored in
/// its compute dtype, so that a decoding step does not cast the whole model again. A weight
/// already stored in that dtype (a bf16 LoRA base) is shared, not copied. The values are the
/// ones the training forward casts to, so old and new log-probs see the same weights. An f32
/// model is returned as it is, its weights shared. Where the CPU's panel products run (bf16
/// with AVX512-BF16, f32 with AVX-512: `packed_weight::packs`), the copy keeps its weights
/// packed for them too ([`packed_for_decoding`]).
pub fn rollout_copy<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    let model = in_compute_dtype(model);
    match model.compute {
        _ if packed_weight::packs::<B>(model.compute) => packed_for_decoding(model),
        Dtype::Bf16 => relaid_out(model),
        _ => model,
    }
}

/// What a LoRA policy's KL reference reads before its adapters are stripped: the rollout copy,
/// packed in bf16 (whose packed products serve scoring's passes of any length) but not in f32
/// (whose serve decoding's rows only, so that packing would cost a model's bytes for nothing).
pub fn lora_reference_copy<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    if model.compute.is_f32() { model } else { rollout_copy(model) }
}

/// What a KL reference loaded apart keeps: [`rollout_copy`]'s values, never packed (that
/// would take as many bytes again for one scoring pass a step), laid out for the unpacked
/// products.
pub fn reference_copy<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    let model = in_compute_dtype(model);
    if model.compute != Dtype::Bf16 {
        return model;
    }
    relaid_out(model)
}

/// `model` with every weight but the LoRA adapters (which run in f32, see `Linear::forward`)
/// stored in its compute dtype.
fn in_compute_dtype<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    if model.compute.is_f32() {
        return model;
    }
    let dtype = model.compute;
    cast_params(model, dtype, |name, _| !name.contains(".lora_"))
}

/// A bf16 `model` with each projection's weights in one run per output, as the CPU's bf16
/// product reads them fastest unpacked.
fn relaid_out<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    struct Relayout;
    impl<B: Backend> ParamVisitor<B> for Relayout {
        fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            p
        }
        fn matrix(&mut self, name: &str, p: Param<Tensor<B, 2>>, stored_transposed: bool) -> Param<Tensor<B, 2>> {
            if stored_transposed && !name.contains(".lora_") { p.map(bf16_matmul::for_decoding) } else { p }
        }
    }
    walk_params(model, &mut Relayout)
}

/// `model` with each projection's weight and the LM head packed for the CPU's panel products
/// (`Linear::packed`), where they run (`packed_weight::packs`): decoding multiplies the same
/// weights once per token. Packed, bf16 weights run at 1.8× the pair products' speed a core,
/// and f32 ones are streamed from memory where a panel read in place is not.
fn packed_for_decoding<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    let bf16 = model.compute == Dtype::Bf16;
    // Only weights stored in the compute dtype: an f32 copy over a bf16 LoRA base reads its
    // base through casts (new buffers each time, which no packed copy serves).
    let dtype = DType::from(model.compute.burn());
    let pack = |w: &Tensor<B, 2>| (w.dtype() == dtype).then(|| PackedWeight::of(w).map(Arc::new)).flatten();
    let stored_head = model.lm_head.as_ref().map(|head| head.val()).unwrap_or_else(|| model.embed_tokens.val());
    let lm_head_packed = (stored_head.dtype() == dtype).then(|| pack(&model.lm_head_weight().transpose())).flatten();
    let model = map_linears(model, |_, _, l| {
        Ok(match pack(&l.weight.val()) {
            Some(packed) => Linear { packed: Some(packed), ..l },
            // Not packed (a layout the packing does not read): a bf16 one laid out as unpacked
            // products read it.
            None if bf16 => Linear { weight: l.weight.map(bf16_matmul::for_decoding), ..l },
            None => l,
        })
    });
    CausalLm { lm_head_packed, ..model.expect("packing cannot fail") }
}

/// `model` with every weight that does not train (no gradient required) stored as `dtype`.
pub fn store_frozen<B: Backend>(model: CausalLm<B>, dtype: FrozenDtype) -> CausalLm<B> {
    if dtype.is_f32() {
        return model;
    }
    cast_params(model, dtype, |_, trainable| !trainable)
}

/// `model` with the parameters that `select(name, requires_grad)` picks stored as `dtype`.
fn cast_params<B: Backend>(model: CausalLm<B>, dtype: Dtype, select: impl Fn(&str, bool) -> bool) -> CausalLm<B> {
    struct Cast<F> {
        dtype: Dtype,
        select: F,
    }
    impl<B: Backend, F: Fn(&str, bool) -> bool> ParamVisitor<B> for Cast<F> {
        fn vector(&mut self, name: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            if (self.select)(name, p.is_require_grad()) { p.map(|t| cast(t, self.dtype.burn())) } else { p }
        }
        fn matrix(&mut self, name: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
            if (self.select)(name, p.is_require_grad()) { p.map(|t| cast(t, self.dtype.burn())) } else { p }
        }
    }
    walk_params(model, &mut Cast { dtype, select })
}

#[cfg(test)]
mod tests {
    use burn::backend::Autodiff;
    use burn::module::AutodiffModule;

    use super::*;
    use crate::backend::Cpu;
    use crate::backend::flex_fast::without_fast_paths;
    use crate::model::lora::tests::{logits, logits_tensor, max_diff, model};
    use crate::model::lora::{LoraConfig, attach};
    use crate::model::weights::linears;

    /// `‖a − b‖ / ‖b‖`.
    fn relative(a: &[f32], b: &[f32]) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (d / n).sqrt()
    }

    /// Log-probs of the fixed prompt's next tokens through the training op, and the gradients
    /// of their sum for q_proj, down_proj and the embedding (the LM head, tied).
    fn grads(m: &CausalLm<Autodiff<Cpu>>) -> (Vec<f32>, [Vec<f32>; 3]) {
        scaled_grads(m, 1.0, 1.0)
    }

    /// [`grads`] of `weight ×` the sum, the backward pass run on `scale ×` that and the
    /// gradients divided back (the loss scaler's arithmetic).
    fn scaled_grads(m: &CausalLm<Autodiff<Cpu>>, weight: f64, scale: f64) -> (Vec<f32>, [Vec<f32>; 3]) {
        use burn::tensor::{Int, TensorData};
        let ids = [5i64, 9, 1, 33, 60, 2, 17];
        let t = ids.len();
        let input = Tensor::<Autodiff<Cpu>, 2, Int>::from_data(TensorData::new(ids.to_vec(), [1, t]), &m.device());
        let layout = m.layout_tensors(&crate::model::Layout::dense(1, t));
        let hidden = m.forward_hidden(input, &layout, None).reshape([t, 32]);
        let targets = [9u32, 1, 33, 60, 2, 17, 40];
        let logp = crate::generate::score::token_logprobs_autodiff(hidden, m.lm_head_weight(), &targets, 1.0);
        let values = logp.clone().into_data().convert::<f32>().into_vec().unwrap();
        let g = logp.sum().mul_scalar(weight * scale).backward();
        let host = |t: Tensor<Cpu, 2>| {
            assert_eq!(t.dtype(), DType::F32, "master gradients are f32");
            t.div_scalar(scale).into_data().convert::<f32>().into_vec::<f32>().unwrap()
        };
        let layer = &m.layers[0];
        (
            values,
            [
                host(layer.self_attn.q_proj.weight.val().grad(&g).unwrap()),
                host(layer.mlp.down_proj.weight.val().grad(&g).unwrap()),
                host(m.embed_tokens.val().grad(&g).unwrap()),
            ],
        )
    }

    #[test]
    fn half_precision_compute_keeps_log_probs_and_gradients_close_to_f32_and_the_master_weights_f32() {
        let full = model::<Autodiff<Cpu>>(true);
        let (reference, reference_grads) = grads(&full);
        for (dtype, values_tol, grad_tol) in [(ComputeDtype::Bf16, 5e-2, 3e-2), (ComputeDtype::F16, 5e-3, 3e-3)] {
            let half = set_compute(full.clone(), dtype);
            let (values, gs) = grads(&half);
            let d = max_diff(&values, &reference);
            // Not f32 in disguise: the products did run in the lower precision.
            assert!(d > 0.0 && d < values_tol, "{dtype:?}: log-probs differ by {d}");
            for (g, r) in gs.iter().zip(&reference_grads) {
                let e = relative(g, r);
                assert!(e > 0.0 && e < grad_tol, "{dtype:?}: gradients differ by {e} (relative)");
            }
            assert_eq!(half.layers[0].mlp.up_proj.weight.val().dtype(), DType::F32, "master weights stay f32");
        }
    }

    /// A loss of 1e-6 × the log-probs (per-token gradients as small as a long batch's mean
    /// gives) loses its gradients in f16's subnormals; scaled by the loss scaler's initial
    /// 2^16 they come back to f16's usual precision.
    #[test]
    fn the_loss_scale_keeps_small_f16_gradients_out_of_the_subnormals() {
        use crate::train::loss_scale::INIT_SCALE;
        let full = model::<Autodiff<Cpu>>(true);
        let (_, reference) = scaled_grads(&full, 1e-6, 1.0);
        let half = set_compute(full, ComputeDtype::F16);
        let error = |scale: f64| {
            let (_, gs) = scaled_grads(&half, 1e-6, scale);
            gs.iter().zip(&reference).map(|(g, r)| relative(g, r)).fold(0.0, f64::max)
        };
        let (unscaled, scaled) = (error(1.0), error(INIT_SCALE));
        assert!(scaled < 5e-3, "scaled: {scaled}");
        assert!(unscaled > 10.0 * scaled, "unscaled {unscaled} vs scaled {scaled}");
    }

    #[test]
    fn the_rollout_copy_stores_weights_in_the_compute_dtype_and_gives_the_training_forwards_logits() {
        let config = LoraConfig { rank: 4, ..Default::default() };
        let full = attach(model::<Cpu>(false), &config, 1);
        assert_eq!(rollout_copy(full.clone()).embed_tokens.val().dtype(), DType::F32, "f32: the model itself");
        for dtype in [ComputeDtype::Bf16, ComputeDtype::F16] {
            let training = set_compute(full.clone(), dtype);
            let copy = rollout_copy(training.clone());
            let stored = DType::from(dtype.burn());
            let attn = &copy.layers[1].self_attn;
            assert_eq!(attn.q_proj.weight.val().dtype(), stored);
            assert_eq!(copy.lm_head.as_ref().unwrap().val().dtype(), stored);
            assert_eq!(copy.norm.weight.val().dtype(), stored);
            assert_eq!(attn.q_proj.lora.as_ref().unwrap().a.val().dtype(), DType::F32, "adapters stay f32");
            // The values the training forward casts to: the same logits.
            let d = max_diff(&logits(&copy), &logits(&training));
            assert!(d < 1e-6, "{dtype:?}: the copy's logits differ by {d}");
        }
    }

    #[test]
    fn the_rollout_copys_products_run_from_its_packed_weights_where_the_cpu_has_the_panel_products() {
        use crate::backend::kernels::{bf16_dot_instructions, f32_panel_instructions};
        use crate::backend::packed_weight::PACKED_PRODUCTS;
        // bf16 within its rounding of the training forward (whose products are not all the
        // panels'); f32 to the bit, every f32 product running the one panel kernel.
        let cases =
            [(ComputeDtype::Bf16, bf16_dot_instructions(), 1e-2), (ComputeDtype::F32, f32_panel_instructions(), 0.0)];
        for ((dtype, packs, tolerance), tied) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let what = format!("{dtype:?}, tied {tied}");
            let training = set_compute(model::<Cpu>(tied), dtype);
            let copy = rollout_copy(training.clone());
            for (name, l) in linears(&copy) {
                assert_eq!(l.packed.is_some(), packs, "{what}, {name}: packed only with the instructions");
            }
            assert_eq!(copy.lm_head_packed.is_some(), packs, "{what}: the LM head");
            // Every product of a forward from the packed copies (7 a layer and the LM head), none
            // left to the usual path by a weight that no longer matches its copy.
            PACKED_PRODUCTS.with(|n| n.set(0));
            let got = logits(&copy);
            let served = PACKED_PRODUCTS.with(|n| n.get());
            assert_eq!(served, if packs { 7 * copy.layers.len() + 1 } else { 0 }, "{what}");
            let d = max_diff(&got, &logits(&training));
            assert!(d <= tolerance, "{what}: the packed copy's logits differ by {d}");
            // Scoring reads the LM head from the same packed copy, not packed again.
            // Six response tokens: f32's panels take more rows than decoding's few (4).
            let requests = [(vec![5u32, 9, 1], vec![33u32, 60, 2, 17, 8, 41])];
            let score = |m: &CausalLm<Cpu>| {
                PACKED_PRODUCTS.with(|n| n.set(0));
                let scored = crate::generate::score::score(m, &requests, 1.0).unwrap().remove(0);
                (scored, PACKED_PRODUCTS.with(|n| n.get()))
            };
            let ((kept, with_head), (unkept, without)) =
                (score(&copy), score(&CausalLm { lm_head_packed: None, ..copy.clone() }));
            assert_eq!(with_head, without + usize::from(packs), "{what}: the head's one chunk");
            assert!(max_diff(&kept, &unkept) <= tolerance, "{what}: scores");
            // A packed copy does not survive a walk that may replace the weights.
            let walked = walk_params(copy, &mut NoChange);
            assert!(walked.lm_head_packed.is_none() && walked.layers[0].mlp.up_proj.packed.is_none());
        }
    }

    /// Every parameter as it is.
    struct NoChange;
    impl<B: Backend> ParamVisitor<B> for NoChange {
        fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            p
        }
        fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
            p
        }
    }

    /// The last position's logits of `ids` run as a 4-token prefill and then one token at a
    /// time through the KV cache (a sampling cache's, or scoring's).
    fn cached_last_logits(m: &CausalLm<Cpu>, ids: &[i64], sampling: bool) -> Vec<f32> {
        use crate::model::{KvCache, Layout};
        use burn::tensor::{Int, TensorData};
        let cache = KvCache::new(m.config.num_hidden_layers, 4);
        let mut cache = if sampling { cache.for_sampling() } else { cache };
        let mut hidden = None;
        for (start, chunk) in [(0, &ids[..4]), (4, &ids[4..5]), (5, &ids[5..6]), (6, &ids[6..])] {
            let t = chunk.len();
            let input = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(chunk.to_vec(), [1, t]), &m.device());
            let layout = Layout { start, ..Layout::dense(1, t) };
            let h = m.forward_hidden(input, &m.layout_tensors(&layout), Some(&mut cache));
            hidden = Some(h.slice([0..1, t - 1..t, 0..32]).reshape([1, 32]));
        }
        m.logits(hidden.unwrap()).into_data().convert::<f32>().into_vec().unwrap()
    }

    #[test]
    fn decoding_through_the_kv_cache_stays_within_the_compute_dtypes_rounding_of_the_uncached_forward() {
        let ids = [5i64, 9, 1, 33, 60, 2, 17];
        for (dtype, tolerance) in [(ComputeDtype::F32, 1e-5), (ComputeDtype::Bf16, 5e-2)] {
            let m = rollout_copy(set_compute(model::<Cpu>(false), dtype));
            // The CPU's own bf16 products with an f32 cache (scoring's) or a bf16 one
            // (sampling's), and burn's generic ops with a bf16 cache (the GPUs' path).
            for (generic, sampling) in [(false, false), (false, true), (true, false)] {
                let run = || (logits(&m), cached_last_logits(&m, &ids, sampling));
                let (whole, cached) = if generic { without_fast_paths(run) } else { run() };
                let d = max_diff(&cached, &whole[6 * 64..]);
                assert!(
                    d < tolerance,
                    "{dtype:?}, generic ops {generic}, sampling {sampling}: cached decoding differs by {d}"
                );
            }
        }
    }

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
