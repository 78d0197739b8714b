//! bf16 matmuls on the CPU without the trip through f32 copies of the weights.
//!
//! burn-flex multiplies bf16 tensors by copying both operands to f32 (a strided view, such as
//! the LM head read through its embedding, first to a contiguous copy), running the f32 GEMM
//! and rounding the result: decoding SmolLM2-135M one token at a time ran at a tenth of f32's
//! speed, the whole model copied per token, and a bf16 train step at 0.6× f32's. Here the
//! bf16 operands are read as they are stored, at half f32's bytes:
//!
//! - on a CPU with AVX512-BF16, every product runs through `vdpbf16ps`, which multiplies pairs
//!   of bf16 numbers at twice the rate of f32 FMAs: the rollout copy keeps its weights packed
//!   for `hacpo_kernels::bf16_panel_products` (`packed_weight::PackedWeight`, read by
//!   `packed_weight::product_with`: its prefill and decoding); training's linear layers
//!   (`bf16_trained`) and the log-prob op's LM head (`bf16_panels::Packed`) pack their second
//!   operand once per product or pass; other bf16 weights (a KL reference's) are read as
//!   stored here (`hacpo_kernels::bf16_dot_products`);
//! - elsewhere, decoding's few rows read the weights as bf16 tile by tile, and a prefill's many
//!   rows and training's products widen them for the f32 GEMM.
//!
//! The numbers are burn-flex's: the operands rounded to bf16, products accumulated in f32, the
//! result rounded to bf16 (returned in f32); only the order of the sums differs. The rounding
//! is hacpo's own: burn-flex casts f32 to bf16 through f64 and `half`'s `bf16::from_f64`, which
//! drops the f64's low 32 bits before rounding, so that an f32 just above a halfway point may
//! round down (55 of a million random f32s; 1.0039064 becomes 1.0), and a bf16 training
//! product through burn's casts strayed four bf16 steps from the rounded sums where its output
//! nearly cancelled.

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_flex::FlexTensor;
use half::bf16;
use rayon::prelude::*;

use super::Cpu;
use super::cast::{bf16_bits, widen};
use super::fused::{CpuBackend, contiguous, cpu_backend, elems, flex};
use super::parallel_fill::filled_in_chunks;
use super::primitive::tensor;
use super::{f32_matmul, kernels};
use crate::dtype::ComputeDtype;

/// Rows up to which the weights are read as bf16 tile by tile; above, widening them once and
/// running the f32 GEMM is faster (its kernel is tuned further than the tiles).
const TILED_ROWS: usize = 64;
/// Rows up to which a weight stored as the transpose of `[n, k]` is read as bf16, one column
/// after the other; above, through the f32 GEMM.
const DOT_ROWS: usize = 4;
/// Columns per parallel task of the tiled product (a multiple of its 16-column tiles), and of
/// the pair products (whose task's weights, 256 × k bf16, then stay in L2).
const TASK_COLS: usize = 256;
/// Rows up to which the pair products split their work over the threads by columns: each task
/// then reads its columns' weights once, where tasks of rows would each read all of them
/// (decoding SmolLM2-135M at batch 64 on a Zen 5: 1,380–1,425 tokens/s by columns, 970–1,000
/// by rows of 16). Above, a prefill's many rows by rows, at most this many per task.
const PAIR_ROWS_BY_COLUMNS: usize = 256;
const TASK_ROWS: usize = 128;

/// `a · b` multiplied in `compute` ([`ComputeDtype::matmul`]), bf16 on the CPU backend by this
/// module's path (and f32 products split over the threads by [`f32_matmul`]), returned in f32.
pub fn product<B: Backend, const D: usize>(compute: ComputeDtype, a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    if compute == ComputeDtype::F32 {
        return f32_matmul::matmul(a, b).unwrap_or_else(|(a, b)| compute.matmul(a, b));
    }
    if compute != ComputeDtype::Bf16 {
        return compute.matmul(a, b);
    }
    if D == 2 && cpu_backend::<B>(&[a.dtype(), b.dtype()]) == Some(CpuBackend::Autodiff) {
        return super::bf16_trained::trained(a, b);
    }
    // Rounded by hacpo's cast, as the rollout copy is (a recomputed forward reads the masters).
    match matmul(a, super::cast::cast(b, compute.burn())) {
        Ok(y) => y,
        Err((a, b)) => compute.matmul(a, b),
    }
}

/// `w` (`[k, n]`) holding the same values, read through the transpose of an `[n, k]` buffer
/// on the CPU backend: each output's weights are then contiguous, which is how the products
/// here read them fastest (decoding streams them; the pair products need no copy). The linear
/// weights of a bf16 copy that is not packed (stored `[in, out]`, read 32 bytes per row,
/// decoding SmolLM2-135M ran no faster in bf16 than in f32: a KL reference's, any on a CPU
/// without AVX512-BF16) and the LM head's gradient product take it. Other backends' tensors
/// are returned as they are.
pub fn for_decoding<B: Backend>(w: Tensor<B, 2>) -> Tensor<B, 2> {
    if cpu_backend::<B>(&[]) != Some(CpuBackend::Plain) {
        return w;
    }
    let is_bf16 = w.dtype() == DType::BF16;
    let w = flex(w);
    if let Some((bits, true)) = is_bf16.then(|| bits(&w)).flatten() {
        // A bf16 `[k, n]` in rows: the blocked transpose (burn's copy goes element by element).
        let [k, n] = [w.layout().shape()[0], w.layout().shape()[1]];
        let t: Vec<bf16> = bytemuck::cast_vec(transpose_bits(bits, k, n));
        return tensor::<B, 2, _>(FlexTensor::from_data(TensorData::new(t, [n, k])).transpose(0, 1));
    }
    tensor::<B, 2, _>(w.transpose(0, 1).to_contiguous().transpose(0, 1))
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
    // Any layout but the two is read from a row-major copy.
    let b = if bits(&b).is_some() { b } else { contiguous(&b) };
    let (w, rows) = bits(&b).expect("a contiguous tensor is row-major");
    // Decoding one sequence waits on reading the weights, not on multiplying them: there the
    // one-column-at-a-time f32 kernel read an unpacked bf16 copy faster (SmolLM2-135M, 80
    // against 70 tokens/s on a Zen 4).
    let one_row_streamed = m == 1 && !rows;
    let out = if pair_products() && !one_row_streamed {
        // Each output's weights in one contiguous run, as an unpacked bf16 copy stores them.
        let transposed;
        let bt = if rows {
            transposed = transpose_bits(w, k, n);
            &transposed[..]
        } else {
            w
        };
        dot_products(&rounded_rows(&a), m, k, bt, n)
    } else {
        let x: Vec<f32> = elems(&contiguous(&a)).iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let mut out = if m <= if rows { TILED_ROWS } else { DOT_ROWS } {
            // The dot-product kernel reads every row of `x` again for each column: few rows only.
            tiled(&x, m, k, w, rows, n)
        } else {
            widened(x, m, k, w, rows, n)
        };
        round_to_bf16(&mut out);
        out
    };
    Ok(tensor::<B, D, _>(FlexTensor::from_data(TensorData::new(out, [m, n]))))
}

/// The bf16 elements of `b`'s buffer as bits, and whether `b` reads them as `[k, n]` row-major
/// (else as the transpose of `[n, k]` row-major); `None` for any other layout.
pub(super) fn bits(b: &FlexTensor) -> Option<(&[u16], bool)> {
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

#[cfg(test)]
thread_local! {
    /// Set by tests to run the portable kernels on a CPU that has AVX512-BF16.
    static PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether products go through AVX512-BF16's pair products ([`dot_products`]).
pub(super) fn pair_products() -> bool {
    #[cfg(test)]
    if PORTABLE.with(|p| p.get()) {
        return false;
    }
    kernels::bf16_dot_instructions()
}

/// `x · btᵀ` rounded to bf16 (in f32), for `x` (`[m, k]`) and `bt` (`[n, k]`) row-major bf16
/// bits, through AVX512-BF16's pair products. A prefill's many rows are split over the threads
/// by rows, each task writing its rows of the result and rounding them while they are in
/// cache; decoding's rows (up to [`PAIR_ROWS_BY_COLUMNS`]) by columns. A CPU without the
/// instructions widens the operands for the f32 GEMM (exact: bf16 numbers are f32 numbers)
/// and rounds the result.
fn dot_products(xb: &[u16], m: usize, k: usize, bt: &[u16], n: usize) -> Vec<f32> {
    if m * k * n == 0 {
        return vec![0f32; m * n];
    }
    if !pair_products() {
        let mut out = widened(widen(xb), m, k, bt, false, n);
        round_to_bf16(&mut out);
        return out;
    }
    if m > PAIR_ROWS_BY_COLUMNS {
        let per_task = m.div_ceil(4 * rayon::current_num_threads()).clamp(16, TASK_ROWS);
        return filled_in_chunks(m * n, per_task * n, |task, out| {
            let rows = out.len() / n;
            let xb = &xb[task * per_task * k..][..rows * k];
            for first in (0..n).step_by(TASK_COLS) {
                let cols = (first, (first + TASK_COLS).min(n));
                kernels::bf16_dot_products(xb, k, rows, k, bt, cols, &mut out[first..], n);
            }
            round_to_bf16(out);
        });
    }
    by_columns(m, n, |cols, part| {
        kernels::bf16_dot_products(xb, k, m, k, bt, cols, part, cols.1 - cols.0);
        round_to_bf16(part);
    })
}

/// The `m × n` result of `fill`, which writes columns `cols` of all rows into `part` (`m ×
/// width`, row-major), run for tasks of at most [`TASK_COLS`] columns over the threads, each
/// reading only its columns' weights (decoding's rows). The tasks are a multiple of the
/// threads in number where there are enough 16-column tiles, and equal in width to within one
/// tile, so that no thread waits on a last task alone or leaves a small product to one thread.
fn by_columns(m: usize, n: usize, fill: impl Fn((usize, usize), &mut [f32]) + Sync) -> Vec<f32> {
    let threads = rayon::current_num_threads();
    let count = threads * n.div_ceil(threads * TASK_COLS);
    let tiles = n.div_ceil(16);
    let edge = |t: usize| (16 * (t * tiles / count.max(1))).min(n);
    let tasks: Vec<(usize, usize)> = (0..count).map(|t| (edge(t), edge(t + 1))).filter(|(a, b)| a < b).collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&cols| {
            let mut part = vec![0f32; m * (cols.1 - cols.0)];
            fill(cols, &mut part);
            part
        })
        .collect();
    // Assembled over the threads too: at 256 rows the LM head's result is 50 MB.
    let rows_per_task = m.div_ceil(4 * threads).max(1);
    filled_in_chunks(m * n, rows_per_task * n, |task, out| {
        for (i, row) in out.chunks_exact_mut(n).enumerate() {
            let r = task * rows_per_task + i;
            for (&(first, end), part) in tasks.iter().zip(&parts) {
                row[first..end].copy_from_slice(&part[r * (end - first)..][..end - first]);
            }
        }
    })
}

/// Each value to its nearest bf16 number (ties to even), kept in f32.
pub(super) fn round_to_bf16(values: &mut [f32]) {
    values.par_chunks_mut(1 << 16).for_each(kernels::bf16_round);
}

/// The f32 matrix `a` (`[m, k]`) rounded to bf16, as row-major bits; a transposed view (an LM
/// head's gradient reads its logits' gradient so) through a blocked transpose of the bits,
/// not burn's element-by-element copy.
fn rounded_rows(a: &FlexTensor) -> Vec<u16> {
    match bits_of_f32(a) {
        (bits, true) => bits,
        (bits, false) => transpose_bits(&bits, a.layout().shape()[1], a.layout().shape()[0]),
    }
}

/// `w` (`[k, n]` row-major bits) as `[n, k]` row-major, 32 columns of `w` per task (a
/// column walk through a large `w` misses the cache on every element).
pub(super) fn transpose_bits(w: &[u16], k: usize, n: usize) -> Vec<u16> {
    const TASK_COLS: usize = 32;
    filled_in_chunks(k * n, TASK_COLS * k, |task, t| {
        let first = task * TASK_COLS;
        kernels::transpose_u16(w, k, n, (first, first + t.len() / k), t);
    })
}

/// An f32 matrix `[k, n]` rounded to bf16 bits, and whether they are `[k, n]` row-major (else
/// `[n, k]` row-major: the matrix was a transposed view, read without a copy; any other layout
/// is read from a row-major copy).
pub(super) fn bits_of_f32(w: &FlexTensor) -> (Vec<u16>, bool) {
    let layout = w.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    if strides == [1, shape[0] as isize] {
        let all = &w.storage::<f32>()[layout.start_offset()..][..shape[0] * shape[1]];
        return (bf16_bits(all), false);
    }
    (bf16_bits(elems(&contiguous(w))), true)
}

/// `x · w` tile by tile (`w` as [`bits`] reads it), the columns split over the threads.
fn tiled(x: &[f32], m: usize, k: usize, w: &[u16], rows: bool, n: usize) -> Vec<f32> {
    by_columns(m, n, |cols, part| {
        if rows {
            kernels::bf16_matmul_rows(x, m, k, w, n, cols, part);
        } else {
            kernels::bf16_matmul_cols(x, m, k, w, cols, part);
        }
    })
}

/// `x · w` through the f32 GEMM, `w`'s elements widened to f32 in the order they are stored.
pub(super) fn widened(x: Vec<f32>, m: usize, k: usize, w: &[u16], rows: bool, n: usize) -> Vec<f32> {
    let wide = widen(w);
    let wide = if rows {
        Tensor::<Cpu, 2>::from_data(TensorData::new(wide, [k, n]), &Default::default())
    } else {
        Tensor::<Cpu, 2>::from_data(TensorData::new(wide, [n, k]), &Default::default()).transpose()
    };
    let x = Tensor::<Cpu, 2>::from_data(TensorData::new(x, [m, k]), &Default::default());
    f32_matmul::product(x, wide).into_data().into_vec::<f32>().expect("an f32 product")
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, FloatDType};

    /// A matrix's values rounded to bf16, in f64.
    fn rounded<B: Backend>(t: Tensor<B, 2>) -> Vec<f64> {
        let values = t.cast(FloatDType::F32).into_data().to_vec::<f32>().unwrap();
        values.iter().map(|&x| bf16::from_f32(x).to_f32() as f64).collect()
    }

    /// `Σ_t x[i, t] · y[t, j]` of the bf16-rounded operands (`rows × inner`, `inner × cols`),
    /// in f64, rounded to bf16: what a bf16 product with f32 sums gives, up to the sums'
    /// order. (Not burn-flex's bf16 product: some of its outputs are further off, from partial
    /// sums rounded to bf16, it seems.)
    fn exact(x: &[f64], y: &[f64], (rows, inner, cols): (usize, usize, usize)) -> Vec<f32> {
        (0..rows * cols)
            .map(|o| {
                let sum: f64 = (0..inner).map(|t| x[o / cols * inner + t] * y[t * cols + o % cols]).sum();
                bf16::from_f64(sum).to_f32()
            })
            .collect()
    }

    #[test]
    fn bf16_products_are_the_rounded_sums_for_every_layout_and_size() {
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        // The pair products where the CPU has them, and the portable kernels everywhere.
        let kernels: &[bool] = if kernels::bf16_dot_instructions() { &[false, true] } else { &[true] };
        if !kernels::bf16_dot_instructions() {
            eprintln!("this CPU has no AVX512-BF16: only the portable bf16 products are checked here");
        }
        // Rows for the tiles (1, 3: a partial row group, 5), for the GEMM (70, 130), the pair
        // products' tasks of columns (up to 256 rows) and of rows (300: several tasks, the last
        // shorter); columns that do and do not fill the last tile and task; inner sizes with and
        // without a last partial register of 32.
        let shapes = [(1, 40, 16), (3, 33, 45), (5, 64, 300), (70, 24, 37), (2, 7, 1), (130, 70, 260), (300, 70, 50)];
        for (m, k, n) in shapes {
            // The inputs in rows, and read through a transpose (an LM head's gradient).
            let (a, a_t) = (Tensor::<Cpu, 2>::random([m, k], u, &dev), Tensor::<Cpu, 2>::random([k, m], u, &dev));
            let stored = Tensor::<Cpu, 2>::random([k, n], u, &dev).cast(FloatDType::BF16);
            let embedding = Tensor::<Cpu, 2>::random([n, k], u, &dev).cast(FloatDType::BF16);
            let sliced = Tensor::<Cpu, 2>::random([k, n + 3], u, &dev).cast(FloatDType::BF16).slice([0..k, 2..n + 2]);
            let cases = [
                ("[k, n]", a.clone(), stored),
                ("[n, k] transposed", a, embedding.transpose()),
                ("a strided view, inputs transposed", a_t.transpose(), sliced),
            ];
            for (name, a, b) in cases {
                let want = exact(&rounded(a.clone()), &rounded(b.clone()), (m, k, n));
                for &portable in kernels {
                    PORTABLE.with(|p| p.set(portable));
                    let got = matmul(a.clone(), b.clone()).unwrap_or_else(|_| panic!("the CPU path"));
                    PORTABLE.with(|p| p.set(false));
                    let got: Vec<f32> = got.into_data().to_vec().unwrap();
                    let name = format!("{m}x{k}x{n}, {name}, {}", if portable { "portable" } else { "pair products" });
                    assert_bf16_close(&want, &got, k, &name);
                    assert!(got.iter().all(|v| bf16::from_f32(*v).to_f32() == *v), "{name}: not rounded to bf16");
                }
            }
        }
    }

    /// `want` and `got` equal or neighbouring bf16 numbers, mostly equal: sums of `inner`
    /// products of numbers below 1 in another order round to the neighbour, rarely, and where
    /// they cancel to almost nothing, differ by the f32 sums' rounding.
    fn assert_bf16_close(want: &[f32], got: &[f32], inner: usize, name: &str) {
        assert_eq!(want.len(), got.len(), "{name}");
        let off = |w: f32, g: f32| (w - g).abs() - (w.abs() / 128.0).max(2e-6 * inner as f32);
        let (worst, by) = want
            .iter()
            .zip(got)
            .enumerate()
            .fold((0, f32::MIN), |(i, by), (j, (&w, &g))| if off(w, g) > by { (j, off(w, g)) } else { (i, by) });
        assert!(
            by <= 0.0,
            "{name}: [{worst}] {} against {}, beyond the neighbouring bf16 number",
            got[worst],
            want[worst]
        );
        let same = want.iter().zip(got).filter(|(w, g)| w == g).count();
        assert!(same * 10 >= want.len() * 9, "{name}: {same} of {} equal", want.len());
    }

    #[test]
    fn bf16_training_products_and_their_gradients_are_the_rounded_sums() {
        type Ad = burn::backend::Autodiff<Cpu>;
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        // The pair products where the CPU has them, and the widened operands everywhere.
        let kernels: &[bool] = if kernels::bf16_dot_instructions() {
            &[false, true]
        } else {
            eprintln!("this CPU has no AVX512-BF16: only bf16 training's widened products are checked here");
            &[true]
        };
        let read = |t: Tensor<Cpu, 2>| t.into_data().to_vec::<f32>().unwrap();
        let transpose = |x: &[f64], rows: usize, cols: usize| -> Vec<f64> {
            (0..rows * cols).map(|o| x[o % rows * cols + o / rows]).collect()
        };
        // A weight stored `[k, n]` (the linear layers) and read through a transpose (an LM head);
        // shared dimensions of two blocks (1,100 forward; 1,030 rows for the weight's gradient)
        // and none (no rows: the weight's gradient is zeros).
        for (m, k, n, &portable) in
            [(3, 33, 45), (130, 70, 260), (17, 64, 8), (20, 1100, 50), (1030, 40, 20), (0, 40, 20)]
                .into_iter()
                .flat_map(|(m, k, n)| kernels.iter().map(move |p| (m, k, n, p)))
        {
            for transposed in [false, true] {
                let (a, g) = (Tensor::<Ad, 2>::random([m, k], u, &dev), Tensor::<Ad, 2>::random([m, n], u, &dev));
                let stored = Tensor::<Ad, 2>::random(if transposed { [n, k] } else { [k, n] }, u, &dev);
                let (a, stored) = (a.require_grad(), stored.require_grad());
                let w = if transposed { stored.clone().transpose() } else { stored.clone() };
                PORTABLE.with(|p| p.set(portable));
                let y = product(ComputeDtype::Bf16, a.clone(), w.clone());
                let grads = (y.clone() * g.clone()).sum().backward();
                PORTABLE.with(|p| p.set(false));
                let gw = stored.grad(&grads).unwrap();
                let gw = if transposed { gw.transpose() } else { gw };
                let got = [read(y.inner()), read(a.grad(&grads).unwrap()), read(gw)];
                let (av, wv, gv) = (rounded(a.inner()), rounded(w.inner()), rounded(g.inner()));
                let want = [
                    exact(&av, &wv, (m, k, n)),
                    exact(&gv, &transpose(&wv, k, n), (m, n, k)),
                    exact(&transpose(&av, m, k), &gv, (k, m, n)),
                ];
                let what = [("product", k), ("inputs' gradient", n), ("weight's gradient", m)];
                for ((want, got), (what, inner)) in want.iter().zip(&got).zip(what) {
                    let how = if portable { "widened" } else { "AVX512-BF16" };
                    assert_bf16_close(
                        want,
                        got,
                        inner,
                        &format!("{m}x{k}x{n}, transposed {transposed}, {how}: {what}"),
                    );
                }
            }
        }
    }
}
