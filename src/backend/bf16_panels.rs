//! The operands of `hacpo_kernels::bf16_panel_products` on the CPU backend, and its products
//! split over the threads: a first operand whose pairs of elements along the shared dimension
//! are 32-bit words ([`Paired`]), a second packed in panels of 48 columns ([`packed`]). Training's
//! linear layers (`bf16_trained`), the LM head's chunks ([`Packed`]) and the rollout copy's
//! weights (`packed_weight::PackedWeight`) multiply so on a CPU with AVX512-BF16.

use std::borrow::Cow;

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_flex::FlexTensor;

use super::bf16_matmul::{bits, pair_products};
use super::fused::{CpuBackend, contiguous, cpu_backend, elems, flex};
use super::kernels;
use super::panel_split::{self, Block};
use super::parallel_fill::filled_in_chunks;
use super::primitive::tensor;

/// A bf16 matrix `b` (`[k, n]`) packed once to be the second operand of several products `a ·
/// b` (the LM head's chunks, a rollout copy's weights): packing the LM head of a 49k vocabulary
/// costs about as much as one chunk's product, the panels then run it at 1.3–1.9× the pair
/// products' speed.
#[derive(Debug)]
pub struct Packed {
    words: Vec<u32>,
    k: usize,
    n: usize,
}

/// Whether bf16 operands of the backend `B` are packed for the panel products: the plain CPU
/// backend on a CPU with AVX512-BF16.
pub fn packs<B: Backend>() -> bool {
    cpu_backend::<B>(&[]) == Some(CpuBackend::Plain) && pair_products()
}

impl Packed {
    /// `b` packed, when it is a bf16 tensor of a backend that [`packs`], stored `[k, n]` or as
    /// the transpose of `[n, k]`; else `None` (multiply as usual).
    pub fn of<B: Backend>(b: &Tensor<B, 2>) -> Option<Packed> {
        if b.dtype() != DType::BF16 || !packs::<B>() {
            return None;
        }
        let b = flex(b.clone());
        let [k, n] = [b.layout().shape()[0], b.layout().shape()[1]];
        let (bits, rows) = bits(&b)?;
        Some(Packed { words: packed(bits, if rows { (n, 1) } else { (1, k) }, k, n), k, n })
    }

    /// `a · b` for `a: [m, k]` in f32 on the plain CPU backend, rounded to bf16 (returned in
    /// f32). Up to [`panel_split::PANEL_ROWS`] rows (decoding) the threads split `b`'s panels,
    /// each read once; more rows (a prefill, scoring's chunks) the rows.
    pub fn product<B: Backend>(&self, a: Tensor<B, 2>) -> Tensor<B, 2> {
        assert_eq!(a.dtype(), DType::F32, "the packed products' first operand is f32");
        let x = Paired::round(&flex(a));
        assert_eq!(x.cols, self.k, "a's columns are b's rows");
        let by = if x.rows <= panel_split::PANEL_ROWS { by_panels } else { panel_products };
        let out = by(&x.words, (x.row_words(), 1), x.rows, self.k, &self.words, self.n);
        tensor::<B, 2, _>(FlexTensor::from_data(TensorData::new(out, [x.rows, self.n])))
    }

    /// Rows and columns of `b`.
    pub fn shape(&self) -> [usize; 2] {
        [self.k, self.n]
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

/// [`panel_products`] with the threads splitting `b`'s panels ([`panel_split::by_panels`]):
/// decoding's products, each panel read from memory by one task.
fn by_panels(a: &[u32], strides: (usize, usize), rows: usize, shared: usize, b: &[u32], cols: usize) -> Vec<f32> {
    if rows * cols * shared == 0 {
        return vec![0f32; rows * cols];
    }
    // SAFETY: `blocks` writes every element of each block it is given.
    unsafe { panel_split::by_panels(rows, cols, blocks(a, strides, shared, b, cols)) }
}

/// `a · b` rounded to bf16 (in f32) through the panel products: `rows` rows of `a` (word
/// `(r, p)` at `r·strides.0 + p·strides.1`), `shared` elements summed, `b` [`packed`] with
/// `cols` columns. The rows are split over the threads ([`panel_split::by_rows`]); the kernel
/// rounds the sums as it stores them.
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
    // SAFETY: `blocks` writes every element of each block it is given.
    unsafe { panel_split::by_rows(rows, cols, blocks(a, strides, shared, b, cols)) }
}

/// The panel products of a block of the output, written (rounded to bf16) into a buffer of
/// `cols` columns from its first element.
fn blocks<'a>(
    a: &'a [u32],
    strides: (usize, usize),
    shared: usize,
    b: &'a [u32],
    cols: usize,
) -> impl Fn(Block, *mut f32) + Sync + 'a {
    let pairs = shared.div_ceil(2);
    move |Block { top, bottom, first, end }, start| {
        if top == bottom || first == end {
            return;
        }
        let (a, b) = (&a[top * strides.0..], &b[first * pairs..]);
        // SAFETY: the split hands each task its own block, inside the buffer; it is written
        // only (`add` false).
        unsafe {
            let out = start.add(top * cols + first);
            kernels::bf16_panel_products_to(a, strides, bottom - top, pairs, b, end - first, out, cols, false, true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::backend::packed_weight::PackedWeight;
    use burn::tensor::{Distribution, FloatDType};

    /// A bf16 weight `[k, n]` stored as the rollout copy stores it: the transpose of `[n, k]`.
    fn weight(k: usize, n: usize) -> Tensor<Cpu, 2> {
        Tensor::<Cpu, 2>::random([n, k], Distribution::Uniform(-1.0, 1.0), &Default::default())
            .cast(FloatDType::BF16)
            .transpose()
    }

    fn values(t: Tensor<Cpu, 2>) -> Vec<f32> {
        t.into_data().to_vec().unwrap()
    }

    #[test]
    fn decodings_products_split_by_panels_are_the_row_splits_to_the_bit() {
        if !pair_products() {
            assert!(PackedWeight::of(&weight(8, 8)).is_none(), "packed without AVX512-BF16");
            eprintln!("this CPU has no AVX512-BF16: checked only that no weight is packed");
            return;
        }
        // Rows of one tile, a partial one, several; columns of one panel, a partial last one,
        // fewer panels than tasks and many; shared sizes odd and past one block of 512 pairs.
        for (rows, k, n) in [(1, 33, 5), (3, 64, 48), (8, 7, 100), (9, 1030, 97), (32, 64, 1000), (256, 16, 50)] {
            let a = Tensor::<Cpu, 2>::random([rows, k], Distribution::Uniform(-1.0, 1.0), &Default::default());
            let packed = Packed::of(&weight(k, n)).expect("packed");
            let x = Paired::round(&flex(a.clone()));
            let args = (&x.words[..], (x.row_words(), 1), rows, k, &packed.words[..], n);
            let by_rows = panel_products(args.0, args.1, args.2, args.3, args.4, args.5);
            let by_columns = by_panels(args.0, args.1, args.2, args.3, args.4, args.5);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&by_columns), bits(&by_rows), "{rows}x{k}x{n}");
            assert_eq!(bits(&values(packed.product(a))), bits(&by_rows), "{rows}x{k}x{n}: Packed::product");
        }
    }

    #[test]
    fn a_packed_weight_serves_only_the_weight_it_was_packed_from() {
        let w = weight(40, 70);
        let Some(packed) = PackedWeight::of(&w) else {
            assert!(!pair_products(), "a bf16 CPU weight not packed on a CPU with AVX512-BF16");
            eprintln!("this CPU has no AVX512-BF16: nothing is packed");
            return;
        };
        let a = Tensor::<Cpu, 2>::random([5, 40], Distribution::Uniform(-1.0, 1.0), &Default::default());
        let want = values(super::super::bf16_matmul::matmul(a.clone(), w.clone()).unwrap_or_else(|_| panic!("CPU")));
        let got = values(packed.product(a.clone(), &w.clone()).expect("the weight it was packed from"));
        let off = want.iter().zip(&got).map(|(w, g)| (w - g).abs() / w.abs().max(1e-3)).fold(0f32, f32::max);
        assert!(off <= 1.0 / 128.0, "the packed product strays {off} from the pair products' (one bf16 step)");
        // The same values in another buffer (a weight cast or loaded again), or another view of
        // the same buffer: multiplied as usual.
        let copy = Tensor::<Cpu, 2>::from_data(w.to_data(), &Default::default());
        let view = w.clone().slice([0..40, 0..69]);
        for (other, what) in [(copy, "a copy"), (view, "another view")] {
            assert!(packed.product(a.clone(), &other).is_err(), "{what} was served");
        }
        // Only f32 inputs, on the plain backend.
        assert!(packed.product(a.clone().cast(FloatDType::BF16), &w).is_err(), "a bf16 input was served");
    }
}
