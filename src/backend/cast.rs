//! f32 ↔ bf16 casts on the CPU backend, over the threads and rounded to the nearest bf16
//! (ties to even), with the backward pass of a tracked cast as a custom autodiff op.
//!
//! burn-flex casts one element at a time on one thread, f32 to bf16 through f64 and
//! `half::bf16::from_f64` (which may round an f32 just above a halfway point down, see
//! [`super::bf16_matmul`]). A bf16 train step of SmolLM2-135M cast its tied LM head (28M
//! numbers) three times that way, forward, its gradient, and the gradient back to the f32
//! master weight: 47 ms each on a Zen 5, with the other core idle. Other backends and dtypes
//! take burn's cast ([`cast_to`]).

use burn::tensor::{DType, FloatDType, Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use half::bf16;

use super::Cpu;
use super::fused::{CpuBackend, ad, contiguous, cpu_backend, elems, flex};
use super::kernels;
use super::parallel_fill::mapped_in_chunks;
use super::primitive::tensor;
use crate::dtype::{ComputeDtype, cast_to};

/// Elements per rayon task.
const TASK: usize = 1 << 16;

/// `t` in `dtype` ([`cast_to`]), between f32 and bf16 on the CPU backends by this module's
/// kernels.
pub fn cast<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: FloatDType) -> Tensor<B, D> {
    let (from, to) = (t.dtype(), DType::from(dtype));
    let pair = matches!((from, to), (DType::F32, DType::BF16) | (DType::BF16, DType::F32));
    match pair.then(|| cpu_backend::<B>(&[])).flatten() {
        Some(CpuBackend::Plain) => tensor::<B, D, _>(convert(&flex(t), to)),
        Some(CpuBackend::Autodiff) => {
            let t = ad(t);
            let out = convert(&t.primitive, to);
            let out = match Cast.prepare::<NoCheckpointing>([t.node.clone()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish(from, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            };
            tensor::<B, D, _>(out)
        }
        None => cast_to(t, dtype),
    }
}

/// `t` rounded to `compute` and returned in f32, as a layer reads a weight that computes in f32
/// (a norm's, a bias, the embedding's rows): the same values as [`cast`]'s, which the rollout
/// copy stores (`model::precision::rollout_copy`), so that sampling and the update agree.
pub fn rounded<B: Backend, const D: usize>(compute: ComputeDtype, t: Tensor<B, D>) -> Tensor<B, D> {
    cast(cast(t, compute.burn()), FloatDType::F32)
}

/// `t` (f32 or bf16) as `to` (the other), in `t`'s shape.
fn convert(t: &FlexTensor, to: DType) -> FlexTensor {
    let t = contiguous(t);
    let shape = t.layout().shape().to_vec();
    if to == DType::BF16 {
        let bits: Vec<bf16> = bytemuck::cast_vec(bf16_bits(elems(&t)));
        return FlexTensor::from_data(TensorData::new(bits, shape));
    }
    let all: &[u16] = bytemuck::cast_slice(t.storage::<bf16>());
    let bits = &all[t.layout().start_offset()..][..t.layout().num_elements()];
    FlexTensor::from_data(TensorData::new(widen(bits), shape))
}

/// `values` rounded to bf16 (ties to even), as bits.
pub(crate) fn bf16_bits(values: &[f32]) -> Vec<u16> {
    mapped_in_chunks(values, TASK, kernels::bf16_round_bits)
}

/// bf16 bits as f32 numbers (exact: bf16 is f32's upper half).
pub(crate) fn widen(bits: &[u16]) -> Vec<f32> {
    mapped_in_chunks(bits, TASK, |bits, wide| {
        wide.iter_mut().zip(bits).for_each(|(v, &h)| *v = f32::from_bits((h as u32) << 16));
    })
}

/// The backward pass of a tracked [`cast`]: the gradient cast to the input's dtype (its state;
/// a bf16 weight's gradient, rounded, widened for its f32 master weight).
#[derive(Debug)]
struct Cast;

impl Backward<Cpu, 1> for Cast {
    type State = DType;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Cpu>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let grad = if grad.dtype() == ops.state { grad } else { convert(&grad, ops.state) };
            grads.register::<Cpu>(node.id, grad);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    type Ad = burn::backend::Autodiff<Cpu>;

    /// burn's cast, which these kernels replace, with `half`'s f32 rounding in place of its
    /// rounding through f64.
    fn reference(values: &[f32]) -> Vec<f32> {
        values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
    }

    #[test]
    fn casts_round_to_nearest_even_and_widen_exactly_both_ways_and_through_autodiff() {
        let dev = Default::default();
        // Ties of both parities, a value just above a halfway point (which the f64 path
        // rounds down), NaN, infinities, subnormals and zeros, then random numbers over two
        // tasks of elements.
        let mut values =
            vec![1.0039062, 1.0117188, 1.0039064, f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-40, -0.0, 0.0];
        let random = Tensor::<Cpu, 1>::random([2 * TASK + 7], Distribution::Normal(0.0, 3.0), &dev);
        values.extend(random.into_data().to_vec::<f32>().unwrap());
        let n = values.len();
        let want = reference(&values);
        let same = |got: Vec<f32>, what: &str| {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what} [{i}]: {g} against {w}");
            }
        };
        let plain = cast(Tensor::<Cpu, 1>::from_data(TensorData::new(values.clone(), [n]), &dev), FloatDType::BF16);
        assert_eq!(plain.dtype(), DType::BF16);
        same(cast(plain, FloatDType::F32).into_data().to_vec::<f32>().unwrap(), "plain round trip");

        // Through autodiff: the gradient of Σ cast(x) ∘ g is g rounded to bf16, widened.
        let g = Tensor::<Ad, 1>::from_data(TensorData::new(values.clone(), [n]), &dev);
        let x = Tensor::<Ad, 1>::random([n], Distribution::Default, &dev).require_grad();
        let y = cast(x.clone(), FloatDType::BF16);
        assert_eq!(y.dtype(), DType::BF16);
        let grads = (cast(y, FloatDType::F32) * g).sum().backward();
        let dx = x.grad(&grads).unwrap();
        assert_eq!(dx.dtype(), DType::F32);
        same(dx.into_data().to_vec::<f32>().unwrap(), "gradient");
    }
}
