//! bf16 matmuls on the CPU without the trip through f32 copies of the weights.
//!
//! burn-flex multiplies bf16 tensors by copying both operands to f32 (a strided view, such as
//! the LM head read through its embedding, first to a contiguous copy), running the f32 GEMM
//! and rounding the result: decoding SmolLM2-135M one token at a time ran at a tenth of f32's
//! speed, the whole model copied per token. Here the rollout copy's bf16 weights are read as
//! they are stored, at half f32's bytes, which is what decoding waits on; a batch of many rows
//! (a prefill) widens the weights once and runs the f32 GEMM. The numbers are burn-flex's:
//! the activations rounded to bf16, products accumulated in f32, the result rounded to bf16
//! (returned in f32), only the order of the sums differs.
//!
//! Inference only (the plain CPU backend); training's bf16 matmuls take burn's ops.

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_flex::FlexTensor;
use half::bf16;
use rayon::prelude::*;

use super::Cpu;
use super::fused::{CpuBackend, contiguous, cpu_backend, elems, flex, tensor};
use super::kernels;
use crate::dtype::ComputeDtype;

/// Rows up to which the weights are read as bf16 tile by tile; above, widening them once and
/// running the f32 GEMM is faster (its kernel is tuned further than the tiles).
const TILED_ROWS: usize = 64;
/// Rows up to which a weight stored as the transpose of `[n, k]` is read as bf16, one column
/// after the other; above, through the f32 GEMM.
const DOT_ROWS: usize = 4;
/// Columns per parallel task of the tiled product (a multiple of its 16-column tiles).
const TASK_COLS: usize = 256;

/// `a · b` multiplied in `compute` ([`ComputeDtype::matmul`]), bf16 on the CPU backend by this
/// module's path, returned in f32.
pub fn product<B: Backend, const D: usize>(compute: ComputeDtype, a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    if compute != ComputeDtype::Bf16 {
        return compute.matmul(a, b);
    }
    match matmul(a, compute.cast(b)) {
        Ok(y) => y,
        Err((a, b)) => compute.matmul(a, b),
    }
}

/// `w` (`[in, out]`) holding the same values, read through the transpose of an `[out, in]`
/// buffer on the CPU backend: each output's weights are then contiguous, which is how the
/// decoding product streams them fastest (a stored `[in, out]` weight is read 32 bytes per
/// row, and decoding SmolLM2-135M ran no faster in bf16 than in f32). Other backends' tensors
/// are returned as they are.
pub fn for_decoding<B: Backend>(w: Tensor<B, 2>) -> Tensor<B, 2> {
    if cpu_backend::<B>(&[]) != Some(CpuBackend::Plain) {
        return w;
    }
    tensor::<B, 2, _>(flex(w).transpose(0, 1).to_contiguous().transpose(0, 1))
}

/// `a · b` in bf16 for `a: [m, k]` in f32 and a bf16 `b: [k, n]` (stored so, or a transposed
/// view of `[n, k]`), as f32; the operands back where this path does not apply (other
/// backends, dtypes or ranks).
#[allow(clippy::type_complexity)]
pub fn matmul<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    let applies = D == 2 && a.dtype() == DType::F32 && b.dtype() == DType::BF16;
    if !applies || cpu_backend::<B>(&[]) != Some(CpuBackend::Plain) {
        return Err((a, b));
    }
    let (a, b) = (flex(a), flex(b));
    let [m, k] = [a.layout().shape()[0], a.layout().shape()[1]];
    let n = b.layout().shape()[1];
    let x: Vec<f32> = elems(&contiguous(&a)).iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    // The dot-product kernel reads every row of `x` again for each column: few rows only.
    // Any other layout is read from a row-major copy.
    let b = if bits(&b).is_some() { b } else { contiguous(&b) };
    let (w, rows) = bits(&b).expect("a contiguous tensor is row-major");
    let mut out = if m <= if rows { TILED_ROWS } else { DOT_ROWS } {
        tiled(&x, m, k, w, rows, n)
    } else {
        widened(x, m, k, w, rows, n)
    };
    out.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32());
    Ok(tensor::<B, D, _>(FlexTensor::from_data(TensorData::new(out, [m, n]))))
}

/// The bf16 elements of `b`'s buffer as bits, and whether `b` reads them as `[k, n]` row-major
/// (else as the transpose of `[n, k]` row-major); `None` for any other layout.
fn bits(b: &FlexTensor) -> Option<(&[u16], bool)> {
    let layout = b.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    let (k, n) = (shape[0], shape[1]);
    let rows = strides == [n as isize, 1];
    let cols = strides == [1, k as isize];
    if !(rows || cols) {
        return None;
    }
    let all: &[u16] = bytemuck::cast_slice(b.storage::<bf16>());
    Some((&all[layout.start_offset()..][..k * n], rows))
}

/// `x · w` tile by tile (`w` as [`bits`] reads it), the columns split over the threads.
fn tiled(x: &[f32], m: usize, k: usize, w: &[u16], rows: bool, n: usize) -> Vec<f32> {
    let tasks: Vec<(usize, usize)> = (0..n).step_by(TASK_COLS).map(|c| (c, (c + TASK_COLS).min(n))).collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&cols| {
            let mut part = vec![0f32; m * (cols.1 - cols.0)];
            if rows {
                kernels::bf16_matmul_rows(x, m, k, w, n, cols, &mut part);
            } else {
                kernels::bf16_matmul_cols(x, m, k, w, cols, &mut part);
            }
            part
        })
        .collect();
    let mut out = vec![0f32; m * n];
    for (&(first, end), part) in tasks.iter().zip(&parts) {
        for (r, row) in part.chunks_exact(end - first).enumerate() {
            out[r * n + first..r * n + end].copy_from_slice(row);
        }
    }
    out
}

/// `x · w` through the f32 GEMM, `w`'s elements widened to f32 in the order they are stored.
fn widened(x: Vec<f32>, m: usize, k: usize, w: &[u16], rows: bool, n: usize) -> Vec<f32> {
    let mut wide = vec![0f32; k * n];
    wide.par_chunks_mut(1 << 16).zip(w.par_chunks(1 << 16)).for_each(|(wide, w)| {
        wide.iter_mut().zip(w).for_each(|(v, &h)| *v = f32::from_bits((h as u32) << 16));
    });
    let wide = if rows {
        Tensor::<Cpu, 2>::from_data(TensorData::new(wide, [k, n]), &Default::default())
    } else {
        Tensor::<Cpu, 2>::from_data(TensorData::new(wide, [n, k]), &Default::default()).transpose()
    };
    let x = Tensor::<Cpu, 2>::from_data(TensorData::new(x, [m, k]), &Default::default());
    x.matmul(wide).into_data().into_vec::<f32>().expect("an f32 product")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::flex_fast::without_fast_paths;
    use burn::tensor::{Distribution, FloatDType};

    /// burn's own bf16 product, rounded the same way.
    fn reference(a: Tensor<Cpu, 2>, b: Tensor<Cpu, 2>) -> Vec<f32> {
        without_fast_paths(|| a.cast(FloatDType::BF16).matmul(b).cast(FloatDType::F32)).into_data().to_vec().unwrap()
    }

    #[test]
    fn bf16_products_match_burns_for_every_layout_and_size() {
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        // Rows for the tiles (1, 3: a partial row group, 5) and for the GEMM; columns that do
        // and do not fill the last tile and task.
        for (m, k, n) in [(1, 40, 16), (3, 33, 45), (5, 64, 300), (70, 24, 37), (2, 7, 1)] {
            let a = Tensor::<Cpu, 2>::random([m, k], u, &dev);
            let stored = Tensor::<Cpu, 2>::random([k, n], u, &dev).cast(FloatDType::BF16);
            let embedding = Tensor::<Cpu, 2>::random([n, k], u, &dev).cast(FloatDType::BF16);
            let sliced = Tensor::<Cpu, 2>::random([k, n + 3], u, &dev).cast(FloatDType::BF16).slice([0..k, 2..n + 2]);
            for (name, b) in
                [("[k, n]", stored), ("[n, k] transposed", embedding.transpose()), ("a strided view", sliced)]
            {
                let want = reference(a.clone(), b.clone());
                let got: Vec<f32> =
                    matmul(a.clone(), b).unwrap_or_else(|_| panic!("the CPU path")).into_data().to_vec().unwrap();
                // Sums in another order may round to the neighbouring bf16 number, rarely.
                let neighbours = want.iter().zip(&got).all(|(w, g)| (w - g).abs() <= w.abs() / 128.0 + 1e-30);
                let same = want.iter().zip(&got).filter(|(w, g)| w == g).count();
                assert!(neighbours, "{m}x{k}x{n}, {name}: beyond the neighbouring bf16 number");
                assert!(same * 10 >= want.len() * 9, "{m}x{k}x{n}, {name}: {same} of {} equal", want.len());
                assert!(got.iter().all(|v| bf16::from_f32(*v).to_f32() == *v), "{name}: not rounded to bf16");
            }
        }
    }
}
