//! The operands of `hacpo_kernels::bf16_panel_products` on the CPU backend, and its products
//! split over the threads: a first operand whose pairs of elements along the shared dimension
//! are 32-bit words ([`Paired`]), a second packed in panels of 48 columns ([`packed`]). Training's
//! linear layers (`bf16_trained`) and the LM head's chunks ([`Packed`]) multiply so on a CPU with
//! AVX512-BF16.

use std::borrow::Cow;

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_flex::FlexTensor;

use super::bf16_matmul::{bits, pair_products};
use super::fused::{CpuBackend, contiguous, cpu_backend, elems, flex};
use super::kernels;
use super::parallel_fill::{filled, filled_in_chunks};
use super::primitive::tensor;

/// A bf16 matrix `b` (`[k, n]`) packed once to be the second operand of several products `a ·
/// b` (the LM head's chunks): packing the LM head of a 49k vocabulary costs about as much as
/// one chunk's product, the panels then run it at 1.3–1.9× the pair products' speed.
#[derive(Debug)]
pub struct Packed {
    words: Vec<u32>,
    k: usize,
    n: usize,
}

impl Packed {
    /// `b` packed, when it is a bf16 tensor of the plain CPU backend, stored `[k, n]` or as the
    /// transpose of `[n, k]`, and the CPU has AVX512-BF16; else `None` (multiply as usual).
    pub fn of<B: Backend>(b: &Tensor<B, 2>) -> Option<Packed> {
        if b.dtype() != DType::BF16 || cpu_backend::<B>(&[]) != Some(CpuBackend::Plain) || !pair_products() {
            return None;
        }
        let b = flex(b.clone());
        let [k, n] = [b.layout().shape()[0], b.layout().shape()[1]];
        let (bits, rows) = bits(&b)?;
        Some(Packed { words: packed(bits, if rows { (n, 1) } else { (1, k) }, k, n), k, n })
    }

    /// `a · b` for `a: [m, k]` in f32 on the plain CPU backend, rounded to bf16 (returned in
    /// f32).
    pub fn product<B: Backend>(&self, a: Tensor<B, 2>) -> Tensor<B, 2> {
        assert_eq!(a.dtype(), DType::F32, "the packed products' first operand is f32");
        let x = Paired::round(&flex(a));
        assert_eq!(x.cols, self.k, "a's columns are b's rows");
        let out = panel_products(&x.words, (x.row_words(), 1), x.rows, self.k, &self.words, self.n);
        tensor::<B, 2, _>(FlexTensor::from_data(TensorData::new(out, [x.rows, self.n])))
    }
}

/// `aᵀ · b` in bf16 for f32 `a: [r, m]` and `b: [r, n]` (both rounded to bf16, the products
/// summed over the `r` rows, the result rounded to bf16, returned in f32) through the panel
/// products, on the plain CPU backend with AVX512-BF16; else `None`. The LM head's gradient
/// takes it for each chunk of rows.
pub fn transposed_product<B: Backend>(a: &Tensor<B, 2>, b: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    if cpu_backend::<B>(&[a.dtype(), b.dtype()]) != Some(CpuBackend::Plain) || !pair_products() {
        return None;
    }
    let (a, b) = (Paired::round(&flex(a.clone())), Paired::round(&flex(b.clone())));
    let out = sum_over_rows(&a, &b);
    Some(tensor::<B, 2, _>(FlexTensor::from_data(TensorData::new(out, [a.cols, b.cols]))))
}

/// `aᵀ · b` rounded to bf16 (in f32) for `a` and `b` with as many rows, summed over them: a
/// weight's gradient `xᵀ · dy`.
pub(super) fn sum_over_rows(a: &Paired, b: &Paired) -> Vec<f32> {
    assert_eq!(a.rows, b.rows, "one row of b per row of a");
    let b_packed = packed(b.bits(), (b.stride(), 1), b.rows, b.cols);
    panel_products(&a.paired_rows(), (1, a.cols), a.cols, a.rows, &b_packed, b.cols)
}

/// A matrix rounded to bf16, each row padded with a zero to an even length: a row's elements
/// `2p, 2p + 1` are then one 32-bit word (low half first), as the panel products read their
/// first operand.
#[derive(Debug)]
pub(super) struct Paired {
    pub(super) words: Vec<u32>,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl Paired {
    /// The f32 matrix `a` (`[rows, cols]`, any layout) rounded to bf16 (ties to even).
    pub(super) fn round(a: &FlexTensor) -> Paired {
        let a = contiguous(a);
        let [rows, cols] = [a.layout().shape()[0], a.layout().shape()[1]];
        let row_words = cols.div_ceil(2);
        if rows * cols == 0 {
            return Paired { words: vec![0; rows * row_words], rows, cols };
        }
        let (values, per_task) = (elems(&a), (1 << 16) / cols + 1);
        let words = filled_in_chunks(rows * row_words, row_words * per_task, |task, words: &mut [u32]| {
            let bits: &mut [u16] = bytemuck::cast_slice_mut(words);
            for (bits, values) in bits.chunks_mut(2 * row_words).zip(values[task * per_task * cols..].chunks(cols)) {
                kernels::bf16_round_bits(values, &mut bits[..cols]);
            }
        });
        Paired { words, rows, cols }
    }

    pub(super) fn row_words(&self) -> usize {
        self.cols.div_ceil(2)
    }

    /// bf16 elements from one row to the next.
    pub(super) fn stride(&self) -> usize {
        2 * self.row_words()
    }

    /// The bits, rows [`Self::stride`] apart.
    pub(super) fn bits(&self) -> &[u16] {
        bytemuck::cast_slice(&self.words)
    }

    /// The bits row-major without the padding.
    pub(super) fn dense(&self) -> Cow<'_, [u16]> {
        if self.cols.is_multiple_of(2) {
            return Cow::Borrowed(self.bits());
        }
        Cow::Owned(self.bits().chunks(self.stride()).flat_map(|row| &row[..self.cols]).copied().collect())
    }

    /// Rows `2p, 2p + 1` interleaved (`[rows / 2, cols]` words): the first operand of a sum over
    /// the rows (`xᵀ · dy`, the weight's gradient).
    pub(super) fn paired_rows(&self) -> Vec<u32> {
        const PAIRS_PER_TASK: usize = 64;
        let len = self.rows.div_ceil(2) * self.cols;
        filled_in_chunks(len, PAIRS_PER_TASK * self.cols, |task, out| {
            let first = task * PAIRS_PER_TASK;
            let pairs = (first, first + out.len() / self.cols);
            kernels::pair_rows(self.bits(), self.stride(), (self.rows, self.cols), pairs, out);
        })
    }
}

/// The operand `shared × cols` whose element `(i, c)` is `src[i·strides.0 + c·strides.1]`,
/// packed in panels ([`kernels::pack_panels`]), one panel per task.
pub(super) fn packed(src: &[u16], strides: (usize, usize), shared: usize, cols: usize) -> Vec<u32> {
    let pairs = shared.div_ceil(2);
    filled_in_chunks(kernels::packed_len(pairs, cols), kernels::PANEL_COLS * pairs, |panel, out| {
        kernels::pack_panels(src, strides, (shared, cols), (panel, panel + 1), out);
    })
}

/// `a · b` rounded to bf16 (in f32) through the panel products: `rows` rows of `a` (word
/// `(r, p)` at `r·strides.0 + p·strides.1`), `shared` elements summed, `b` [`packed`] with
/// `cols` columns. The rows are split over the threads; the kernel rounds the sums as it
/// stores them.
pub(super) fn panel_products(
    a: &[u32],
    strides: (usize, usize),
    rows: usize,
    shared: usize,
    b: &[u32],
    cols: usize,
) -> Vec<f32> {
    // Nothing to sum (a weight's gradient over no rows) is zeros.
    if rows * cols * shared == 0 {
        return vec![0f32; rows * cols];
    }
    // Tasks of whole 8-row tiles, as equal as tiles allow and a multiple of the threads in
    // number (341 rows in tasks of 48 left one thread a sixth of the work to do alone), of at
    // most 16 tiles so that a task's rows stay in L2.
    let (threads, tiles) = (rayon::current_num_threads(), rows.div_ceil(8));
    let count = (4 * threads).max(tiles.div_ceil(16)).next_multiple_of(threads).min(tiles);
    let first = |task: usize| (8 * (task * tiles / count)).min(rows);
    let parts: Vec<usize> = (0..count).map(|task| (first(task + 1) - first(task)) * cols).collect();
    let pairs = shared.div_ceil(2);
    filled(&parts, |task, out| {
        let (first, rows) = (first(task), out.len() / cols);
        kernels::bf16_panel_products(&a[first * strides.0..], strides, rows, pairs, b, cols, out, cols, false, true);
    })
}
