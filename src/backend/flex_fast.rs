//! Fast paths for the flex CPU backend where burn 0.21's generic op is much slower than it
//! needs to be. Each function takes ordinary `Tensor<B, D>`s, does the work directly on the
//! flex buffer when `B` is [`Cpu`](super::Cpu) (checked at run time with `Any`, no `unsafe`),
//! and falls back to the generic burn ops for every other backend (CUDA, autodiff), so
//! callers stay backend-generic.

use std::cell::Cell;

thread_local! {
    static DISABLED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the fast paths off on this thread, so tests can check them against the
/// generic burn ops on the same backend.
pub fn without_fast_paths<R>(f: impl FnOnce() -> R) -> R {
    let before = DISABLED.with(|d| d.replace(true));
    let out = f();
    DISABLED.with(|d| d.set(before));
    out
}

/// Whether the fast paths are on for this thread (see [`without_fast_paths`]).
pub(crate) fn enabled() -> bool {
    !DISABLED.with(Cell::get)
}

use burn::tensor::{DType, Tensor, backend::Backend};
use burn_flex::FlexTensor;

use super::fused::{CpuBackend, contiguous, cpu_backend, flex, in_row_major_order};
use super::kernels;
use super::primitive::tensor;

/// The flex tensor behind `t`, or `t` back if `B` is not the flex backend (or the fast
/// paths are off).
fn as_flex<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<FlexTensor, Tensor<B, D>> {
    match cpu_backend::<B>(&[]) {
        Some(CpuBackend::Plain) => Ok(flex(t)),
        _ => Err(t),
    }
}

/// Wraps a flex tensor as a `Tensor<B, D>`; only called once [`as_flex`] succeeded for `B`.
fn from_flex<B: Backend, const D: usize>(t: FlexTensor) -> Tensor<B, D> {
    tensor::<B, D, FlexTensor>(t)
}

/// `buffer[.., .., start..start + t, ..] = new` for `[batch, heads, capacity, dim]` buffers.
///
/// burn-flex 0.21's `slice_assign` clones its input's `Arc` before asking for mutable access,
/// so it copies the whole buffer on every call: a KV cache append would cost O(cache) per
/// token. Here a uniquely owned f32 or bf16 buffer is written in place (`new` in its dtype).
pub fn write_slots<B: Backend>(buffer: Tensor<B, 4>, start: usize, new: Tensor<B, 4>) -> Tensor<B, 4> {
    let [b, h, t, d] = new.dims();
    let cap = buffer.dims()[2];
    assert!(start + t <= cap, "write_slots beyond capacity");
    // A training pass's keys and values (autodiff) come here as views of the projections'
    // token-major rows, which `slice_assign` would copy element by element on one thread.
    let generic = |buffer: Tensor<B, 4>, new: Tensor<B, 4>| {
        buffer.slice_assign([0..b, 0..h, start..start + t, 0..d], in_row_major_order(new))
    };
    let mut buf = match as_flex(buffer) {
        Ok(f) => f,
        Err(buffer) => return generic(buffer, new),
    };
    let dtype = buf.dtype();
    let in_place = buf.is_unique()
        && matches!(dtype, DType::F32 | DType::BF16)
        && new.dtype() == dtype
        && buf.layout().contiguous_offsets() == Some((0, b * h * cap * d));
    if !in_place {
        return generic(from_flex(buf), new);
    }
    let new = match as_flex(new) {
        Ok(f) => contiguous(&f),
        Err(_) => unreachable!("same backend as the buffer"),
    };
    if dtype == DType::F32 {
        copy_slots::<f32>(&mut buf, &new, [b * h, cap, t, d], start);
    } else {
        copy_slots::<half::bf16>(&mut buf, &new, [b * h, cap, t, d], start);
    }
    from_flex(buf)
}

/// Copies `new`'s `rows × t × d` elements into slots `start..start + t` of each of `buf`'s
/// `rows` rows of `cap` slots.
fn copy_slots<T: burn::tensor::Element + bytemuck::Pod>(
    buf: &mut FlexTensor,
    new: &FlexTensor,
    [rows, cap, t, d]: [usize; 4],
    start: usize,
) {
    let src = &new.storage::<T>()[new.layout().start_offset()..];
    let dst: &mut [T] = buf.storage_mut();
    for row in 0..rows {
        let from = &src[row * t * d..(row + 1) * t * d];
        let at = (row * cap + start) * d;
        dst[at..at + t * d].copy_from_slice(from);
    }
}

/// Contiguous f32 data of `t` when `B` is the flex backend.
fn flex_f32<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<FlexTensor> {
    let f = as_flex(t.clone()).ok()?;
    (f.dtype() == burn::tensor::DType::F32).then(|| contiguous(&f))
}

/// For logits `z: [n, vocab]` and `targets`, the log-probabilities at temperature
/// `1/inv_temperature` of each target and each row's log-sum-exp, in one fused pass per row.
/// `None` when `B` is not the flex backend (callers use tensor ops instead).
pub fn target_logprobs<B: Backend>(
    z: &Tensor<B, 2>,
    targets: &[u32],
    inv_temperature: f32,
) -> Option<(Vec<f32>, Vec<f32>)> {
    use rayon::prelude::*;
    let f = flex_f32(z)?;
    let vocab = z.dims()[1];
    let data: &[f32] = &f.storage::<f32>()[f.layout().start_offset()..];
    let (logp, lse): (Vec<f32>, Vec<f32>) = data
        .par_chunks(vocab)
        .zip(targets.par_iter())
        .map(|(row, &t)| {
            let lse = kernels::scaled_logsumexp(row, inv_temperature);
            (row[t as usize] * inv_temperature - lse, lse)
        })
        .unzip();
    Some((logp, lse))
}

/// Gradient of `Σ_i g_i · log softmax(z_i / T)[target_i]` with respect to `z`:
/// `(onehot(target_i) − softmax(z_i / T)) · g_i / T`, written over `z`'s own buffer when
/// possible. `Err(z)` when `B` is not the flex backend.
pub fn target_logprobs_grad<B: Backend>(
    z: Tensor<B, 2>,
    lse: &Tensor<B, 1>,
    targets: &[u32],
    grad: &Tensor<B, 1>,
    inv_temperature: f32,
) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
    use rayon::prelude::*;
    let vocab = z.dims()[1];
    let mut f = as_flex(z)?;
    if f.dtype() != burn::tensor::DType::F32 {
        return Err(from_flex(f));
    }
    // On the CPU backend reading these back is a copy of `rows` floats, not a device sync.
    let host = |t: &Tensor<B, 1>| t.clone().into_data().into_vec::<f32>().expect("f32 tensor");
    let (lse, grad) = (host(lse), host(grad));
    if !(f.is_unique() && f.layout().contiguous_offsets() == Some((0, lse.len() * vocab))) {
        f = FlexTensor::from_data(f.into_data()); // a fresh, owned, contiguous copy
    }
    let data: &mut [f32] = f.storage_mut();
    data[..lse.len() * vocab].par_chunks_mut(vocab).enumerate().for_each(|(i, row)| {
        let g = grad[i] * inv_temperature;
        kernels::neg_scaled_softmax(row, inv_temperature, lse[i], g);
        row[targets[i] as usize] += g;
    });
    Ok(from_flex(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use burn::tensor::TensorData;

    #[test]
    fn write_slots_matches_slice_assign() {
        let dev = Default::default();
        // f32 (scoring's and training's caches on the CPU) and bf16 (sampling's).
        for dtype in [DType::F32, DType::BF16] {
            let data: Vec<f32> = (0..2 * 3 * 5 * 4).map(|x| x as f32 * 0.37).collect();
            let buf = Tensor::<Cpu, 4>::from_data(TensorData::new(data, [2, 3, 5, 4]), &dev).cast(dtype);
            let new = Tensor::<Cpu, 4>::from_data(TensorData::new(vec![-1.3f32; 2 * 3 * 2 * 4], [2, 3, 2, 4]), &dev);
            let new = new.cast(dtype);
            let want = buf.clone().slice_assign([0..2, 0..3, 1..3, 0..4], new.clone()).into_data();
            let got = write_slots(buf, 1, new).into_data();
            assert_eq!(got, want, "{dtype:?}");
        }
    }

    #[test]
    fn a_training_pass_writes_strided_keys_with_slice_assigns_values_and_gradients() {
        type AD = crate::backend::CpuAutodiff;
        let dev = Default::default();
        let tensor = |shape: [usize; 4], scale: f32| {
            let data: Vec<f32> = (0..shape.iter().product()).map(|x| (x as f32 * scale).sin()).collect();
            Tensor::<AD, 4>::from_data(TensorData::new(data, shape), &dev)
        };
        let buffer = tensor([2, 3, 5, 4], 0.3).require_grad();
        // Token-major rows read with the heads first, as the attention's keys and values.
        let rows = tensor([2, 2, 3, 4], 0.7).require_grad();
        let run = |write: &dyn Fn(Tensor<AD, 4>, Tensor<AD, 4>) -> Tensor<AD, 4>| {
            let out = write(buffer.clone(), rows.clone().swap_dims(1, 2));
            let grads = (out.clone() * tensor([2, 3, 5, 4], 1.1)).sum().backward();
            (out.into_data(), buffer.grad(&grads).unwrap().into_data(), rows.grad(&grads).unwrap().into_data())
        };
        let want = run(&|b, new| b.slice_assign([0..2, 0..3, 1..3, 0..4], new));
        assert_eq!(run(&|b, new| write_slots(b, 1, new)), want);
        // The view reaches `slice_assign` in row-major order.
        let view = rows.clone().swap_dims(1, 2);
        let ordered = in_row_major_order(view.clone());
        let [view, ordered] = [view, ordered].map(|t| crate::backend::fused::ad(t).primitive);
        assert!(!view.is_contiguous() && ordered.is_contiguous());
    }
}
