//! f32 products on the CPU backend, split over the threads here rather than inside the GEMM.
//!
//! - **A few rows** (decoding a few sequences): burn-flex runs a product below 192³
//!   multiply-adds on one thread, and decoding one sequence multiplies one row by each linear
//!   layer's weight: every layer's product read its weight at one core's memory bandwidth while
//!   the other cores waited. Here each thread reads a contiguous slice of the weight's rows, one
//!   sequential stream, into partial sums of every output, added at the end.
//! - **More rows** (prefill, decoding many sequences without AVX2, training's forward and
//!   both gradients as a custom autodiff op): one single-threaded GEMM per thread on a block of
//!   the output's rows, or of its columns when the output is wider than tall. burn-flex's
//!   threaded GEMM zeroes the output on the calling thread first and meets the threads again
//!   for every packed block of the shared dimension; on a 2-core AMD EPYC with AVX2 a tiny-5m
//!   prefill scaled 1.2× from one thread to two (PyTorch's 1.6×).
//! - **Decoding's rows on a CPU with AVX-512 or AVX2** (5 to 256) run the panel kernel
//!   (`hacpo_kernels::f32_panel_products_to`) instead of `gemm`, which packs the whole weight
//!   again for every product: from the rollout copy's packed weights ([`PackedF32`]), else
//!   reading a row-major weight in place or packing another for the call. Small products take
//!   one task on the calling thread rather than burn's single-threaded `gemm`.

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::Cpu;
use super::fused::{CpuBackend, ad, contiguous, cpu_backend, elems, flex};
use super::kernels::{self, PANEL_COLS, Panels};
use super::panel_split::{self, Block};
use super::parallel_fill::{filled_in_chunks, written};
use super::primitive::tensor;

/// Rows up to which inference splits a product along the shared dimension: each thread's
/// partial sums, rows × columns, stay in cache while the weight streams through (in L1 for a
/// layer of SmolLM2's size).
const FEW_ROWS: usize = 4;
/// Weights below this many elements stay on one thread (the split and the sum of the parts
/// cost more than they save on a small model).
const MIN_SPLIT: usize = 1 << 18;

/// `a · b` for f32 `a: [m, k]` and `b: [k, n]` on the CPU backend (with autodiff or not), by
/// the shared dimension for up to [`FEW_ROWS`] rows and a row-major `b` (inference), else
/// through the panel kernel where it runs ([`runs_panels`]) or in blocks of the output from
/// [`MIN_BLOCKS`] multiply-adds; the operands back otherwise (other backends, ranks or dtypes,
/// one thread, small products `gemm` would run).
#[allow(clippy::type_complexity)]
pub fn matmul<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    let [m, k, n] = [a.dims()[0], a.dims()[D - 1], b.dims()[D - 1]];
    let applies = D == 2 && b.dims()[0] == k && a.dtype() == DType::F32 && b.dtype() == DType::F32;
    let Some(backend) = cpu_backend::<B>(&[]).filter(|_| applies) else {
        return Err((a, b));
    };
    if m > FEW_ROWS || backend == CpuBackend::Autodiff {
        let split = m * k * n >= MIN_BLOCKS && rayon::current_num_threads() >= 2;
        if !split && !runs_panels(m) {
            return Err((a, b));
        }
        return Ok(match backend {
            CpuBackend::Plain => tensor::<B, D, _>(in_blocks(&flex(a), &flex(b), m, k, n)),
            CpuBackend::Autodiff => trained(a, b),
        });
    }
    if k * n < MIN_SPLIT {
        return Err((a, b));
    }
    let (a, b) = (flex(a), flex(b));
    if b.layout().strides() != [n as isize, 1] {
        return Err((tensor::<B, D, _>(a), tensor::<B, D, _>(b)));
    }
    let w = &b.storage::<f32>()[b.layout().start_offset()..][..k * n];
    let x = contiguous(&a);
    let x = elems(&x);
    let tasks = rayon::current_num_threads().min(k);
    let mut parts: Vec<Vec<f32>> = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let mut part = vec![0f32; m * n];
            kernels::f32_rows_accumulate(x, m, k, w, n, (t * k / tasks, (t + 1) * k / tasks), &mut part);
            part
        })
        .collect();
    let mut out = parts.swap_remove(0);
    for part in &parts {
        kernels::add_into(&mut out, part);
    }
    Ok(tensor::<B, D, _>(FlexTensor::from_data(TensorData::new(out, [m, n]))))
}

/// `a · b` through [`matmul`] where it applies, else burn's own product.
pub fn product<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    matmul(a, b).unwrap_or_else(|(a, b)| a.matmul(b))
}

/// Multiply-adds from which a product of more rows is split over the threads (burn-flex's
/// own threshold for its threaded GEMM).
const MIN_BLOCKS: usize = 192 * 192 * 192;

/// Whether an f32 product of `m` rows runs the panel kernel: on a CPU with AVX-512 or AVX2, up to
/// [`panel_split::PANEL_ROWS`] rows (decoding's products, reading weights that `gemm` would
/// pack again for each; a training pass that short too, so that its products are scoring's).
/// More rows (a prefill, training's micro-batches) stay with `gemm`, which blocks them for the
/// caches: the panel kernel in their place made a GRPO step's update 7% slower.
fn runs_panels(m: usize) -> bool {
    m <= panel_split::PANEL_ROWS && kernels::f32_panel_instructions()
}

/// `a · b` through the panel kernel where it runs ([`runs_panels`]), else as one
/// single-threaded GEMM per thread, each on a block of the output's rows or, when the output is
/// wider than tall, of its columns (each thread then reads only its part of the weight).
fn in_blocks(a: &FlexTensor, b: &FlexTensor, m: usize, k: usize, n: usize) -> FlexTensor {
    if let Some(out) = runs_panels(m).then(|| panel_kernel(a, b, m, k, n)).flatten() {
        return out;
    }
    let tasks = rayon::current_num_threads();
    let by_rows = m >= n;
    let (len, unit) = if by_rows { (m, 8) } else { (n, 16) };
    let units = len.div_ceil(unit);
    let bounds: Vec<usize> = (0..=tasks).map(|t| (t * units / tasks * unit).min(len)).collect();
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    let [a_rs, a_cs] = [a.layout().strides()[0], a.layout().strides()[1]];
    let [b_rs, b_cs] = [b.layout().strides()[0], b.layout().strides()[1]];
    // From the whole buffer's pointer: a view may step back from its first element.
    let a_ptr = a.storage::<f32>().as_ptr().wrapping_add(a.layout().start_offset()) as usize;
    let b_ptr = b.storage::<f32>().as_ptr().wrapping_add(b.layout().start_offset()) as usize;
    let out_ptr = out.as_mut_ptr() as usize;
    (0..tasks).into_par_iter().for_each(|t| {
        let (lo, hi) = (bounds[t], bounds[t + 1]);
        if lo == hi {
            return;
        }
        let (rows, cols) = if by_rows { ((lo, hi), (0, n)) } else { ((0, m), (lo, hi)) };
        // SAFETY: the views' strides and offsets are burn's for shapes [m, k] and [k, n]; each
        // task writes its own rows or columns of `out`, which has room for m × n.
        unsafe {
            gemm::gemm(
                rows.1 - rows.0,
                cols.1 - cols.0,
                k,
                (out_ptr as *mut f32).add(rows.0 * n + cols.0),
                1,
                n as isize,
                false,
                (a_ptr as *const f32).offset(rows.0 as isize * a_rs),
                a_cs,
                a_rs,
                (b_ptr as *const f32).offset(cols.0 as isize * b_cs),
                b_cs,
                b_rs,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    });
    // SAFETY: the tasks wrote every element (their blocks cover all rows or all columns).
    unsafe { out.set_len(m * n) };
    FlexTensor::from_data(TensorData::new(out, [m, n]))
}

/// `a · b` through `hacpo_kernels::f32_panel_products_to` on a CPU with AVX-512 or AVX2, `b` read in
/// place when its rows are consecutive floats, else packed first (decoding's LM head is packed
/// once in the rollout copy, [`PackedF32`]); `None` elsewhere, or for a view that steps back
/// through its buffer. Its sums do not depend on the split or the layout: a product of so many
/// rows is the same to the bit from a packed copy, in place or packed for the call.
fn panel_kernel(a: &FlexTensor, b: &FlexTensor, m: usize, k: usize, n: usize) -> Option<FlexTensor> {
    if !kernels::f32_panel_instructions() {
        return None;
    }
    let ((a_data, (a_rs, a_cs)), (b_data, (b_rs, b_cs))) = (strided(a)?, strided(b)?);
    let buffer: Vec<f32>;
    let (b_data, panels) = if b_cs == 1 || n == 1 {
        (b_data, Panels::in_place(b_rs))
    } else {
        buffer = packed(b_data, (b_rs, b_cs), k, n);
        (&buffer[..], Panels::packed(k))
    };
    let out = panel_products((a_data, (a_rs, a_cs)), m, k, (b_data, panels), n);
    Some(FlexTensor::from_data(TensorData::new(out, [m, n])))
}

/// A 2-D f32 tensor's elements from its first, and its row and column strides; `None` for a
/// view that steps back through its buffer (the kernels read forward from a slice).
fn strided(t: &FlexTensor) -> Option<(&[f32], (usize, usize))> {
    let [rs, cs] = [t.layout().strides()[0], t.layout().strides()[1]];
    let strides = (usize::try_from(rs).ok()?, usize::try_from(cs).ok()?);
    Some((&t.storage::<f32>()[t.layout().start_offset()..], strides))
}

/// `a · b` (`m × k` by `k × n`, at most [`panel_split::PANEL_ROWS`] rows) through the panel
/// kernel, `a(r, i)` at `a.0[r·a.1.0 + i·a.1.1]` and `b` in `panels`, the threads splitting
/// the panels (each read from memory once); below [`MIN_BLOCKS`] multiply-adds as one task on
/// the calling thread. Each output is one tile's sum in the order of the shared dimension,
/// however the work is split and wherever `b` lies.
fn panel_products(a: (&[f32], (usize, usize)), m: usize, k: usize, b: (&[f32], Panels), n: usize) -> Vec<f32> {
    let ((a_data, a_strides), (b_data, panels)) = (a, b);
    let write = |Block { top, bottom, first, end }: Block, start: *mut f32| {
        if top == bottom || first == end {
            return;
        }
        let (a, b) = (&a_data[top * a_strides.0..], &b_data[first / PANEL_COLS * panels.panel..]);
        // SAFETY: the split hands each task its own block of the `m × n` buffer, only written.
        unsafe {
            let out = start.add(top * n + first);
            kernels::f32_panel_products_to(a, a_strides, bottom - top, k, (b, panels), end - first, out, n, false);
        }
    };
    if m * k * n < MIN_BLOCKS {
        // SAFETY: the one block is the whole output.
        unsafe { written(m * n, 1, |_, start| write(Block { top: 0, bottom: m, first: 0, end: n }, start)) }
    } else {
        // SAFETY: `write` writes every element of each block it is given.
        unsafe { panel_split::by_panels(m, n, write) }
    }
}

/// Whether f32 weights of the backend `B` are packed for the panel products: the plain CPU
/// backend on a CPU with AVX-512 or AVX2.
pub fn packs<B: Backend>() -> bool {
    cpu_backend::<B>(&[]) == Some(CpuBackend::Plain) && kernels::f32_panel_instructions()
}

/// An f32 matrix `b` (`[k, n]`) packed once in panels to be the second operand of several
/// products `a · b` (an f32 rollout copy's weights, once per decoding step): a panel read in
/// place is 48 floats a row, rows apart, which the hardware does not stream from memory, and
/// decoding reads the whole model per token.
pub struct PackedF32 {
    values: Vec<f32>,
    k: usize,
    n: usize,
}

impl PackedF32 {
    /// `b` packed, when it is an f32 matrix of the plain CPU backend on a CPU with AVX-512 or AVX2
    /// (stored `[k, n]` or as the transpose of `[n, k]`); else `None`.
    pub fn of<B: Backend>(b: &Tensor<B, 2>) -> Option<Self> {
        if b.dtype() != DType::F32 || !packs::<B>() {
            return None;
        }
        let b = flex(b.clone());
        let [k, n] = [b.layout().shape()[0], b.layout().shape()[1]];
        let (src, strides) = strided(&b)?;
        Some(PackedF32 { values: packed(src, strides, k, n), k, n })
    }

    /// `a · b` for an f32 `a: [m, k]` on the plain CPU backend, where [`matmul`] runs its rows
    /// on the panels ([`runs_panels`], past [`FEW_ROWS`]: the product is then [`matmul`]'s to the
    /// bit); `a` back otherwise. Decoding one sequence streams the weight along the shared
    /// dimension faster (71 against 59 tokens/s on SmolLM2-135M).
    pub fn product<B: Backend>(&self, a: Tensor<B, 2>) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
        let m = a.dims()[0];
        if !Self::serves(m) {
            return Err(a);
        }
        let a = contiguous(&flex(a));
        assert_eq!(a.layout().shape()[1], self.k, "a's columns are b's rows");
        let out = panel_products((elems(&a), (self.k, 1)), m, self.k, (&self.values, Panels::packed(self.k)), self.n);
        Ok(tensor::<B, 2, _>(FlexTensor::from_data(TensorData::new(out, [m, self.n]))))
    }

    /// Rows and columns of `b`.
    pub fn shape(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// Whether [`Self::product`] serves products of `rows` rows.
    pub fn serves(rows: usize) -> bool {
        rows > FEW_ROWS && runs_panels(rows)
    }
}

/// The operand `k × n` whose element `(i, c)` is `src[i·strides.0 + c·strides.1]` in
/// [`Panels::packed`]'s layout, a panel per task.
fn packed(src: &[f32], strides: (usize, usize), k: usize, n: usize) -> Vec<f32> {
    filled_in_chunks(n.div_ceil(PANEL_COLS) * PANEL_COLS * k, PANEL_COLS * k, |panel, out| {
        kernels::pack_f32_panels(src, strides, (k, n), (panel, panel + 1), out)
    })
}

/// [`in_blocks`] as an autodiff op: the forward and both gradients (`dy · wᵀ`, `xᵀ · dy`, read
/// through transposed views) split over the threads the same way.
fn trained<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    let (a, b) = (ad(a), ad(b));
    let (m, k, n) = (a.primitive.layout().shape()[0], a.primitive.layout().shape()[1], b.primitive.layout().shape()[1]);
    let out = in_blocks(&a.primitive, &b.primitive, m, k, n);
    let prep = BlockProduct.prepare::<NoCheckpointing>([a.node.clone(), b.node.clone()]).compute_bound().stateful();
    let out = match prep {
        OpsKind::Tracked(prep) => prep.finish((a.primitive.clone(), b.primitive.clone()), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    tensor::<B, D, _>(out)
}

#[derive(Debug)]
struct BlockProduct;

impl Backward<Cpu, 2> for BlockProduct {
    /// The operands `x: [m, k]` and `w: [k, n]` (shared storage, no copy).
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, w) = &ops.state;
        let [m, k, n] = [x.layout().shape()[0], x.layout().shape()[1], w.layout().shape()[1]];
        let dy = grads.consume::<Cpu>(&ops.node);
        let [node_x, node_w] = ops.parents;
        if let Some(node) = node_x {
            grads.register::<Cpu>(node.id, in_blocks(&dy, &w.transpose(0, 1), m, n, k));
        }
        if let Some(node) = node_w {
            grads.register::<Cpu>(node.id, in_blocks(&x.transpose(0, 1), &dy, k, m, n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use burn::tensor::Distribution;

    #[test]
    fn few_rows_products_are_burns_within_the_sums_order() {
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        // One to four rows, an odd shared dimension (unequal slices), weights above and below
        // the split's threshold, and a transposed weight (burn's product).
        for (m, k, n) in [(1, 577, 500), (3, 640, 410), (4, 1024, 256), (2, 64, 64)] {
            let a = Tensor::<Cpu, 2>::random([m, k], u, &dev);
            let stored = Tensor::<Cpu, 2>::random([k, n], u, &dev);
            let transposed = Tensor::<Cpu, 2>::random([n, k], u, &dev).transpose();
            for (name, w) in [("stored", stored), ("transposed", transposed)] {
                let want: Vec<f32> = a.clone().matmul(w.clone()).into_data().to_vec().unwrap();
                let split = k * n >= MIN_SPLIT && name == "stored";
                let got = match matmul(a.clone(), w) {
                    Ok(y) => {
                        assert!(split, "{m}x{k}x{n} {name}: split below the threshold or for another layout");
                        y
                    }
                    Err((a, w)) => {
                        assert!(!split, "{m}x{k}x{n} {name}: not split");
                        a.matmul(w)
                    }
                };
                assert_close(&want, &got.into_data().to_vec::<f32>().unwrap(), k, &format!("{m}x{k}x{n} {name}"));
            }
        }
    }

    /// `want` and `got` agree within f32 sums of `inner` terms in another order.
    fn assert_close(want: &[f32], got: &[f32], inner: usize, what: &str) {
        assert_eq!(want.len(), got.len(), "{what}: lengths");
        for (i, (w, g)) in want.iter().zip(got).enumerate() {
            assert!((w - g).abs() <= 1e-5 * (inner as f32).sqrt() * w.abs().max(1.0), "{what} [{i}]: {g} against {w}");
        }
    }

    #[test]
    fn products_split_in_blocks_are_burns_within_the_sums_order() {
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        // Taller than wide (rows split), wider than tall (columns split), five rows and an LM
        // head's width, sizes that are no multiple of the blocks' units, and one below the
        // threshold (burn's product, or the panel kernel in one task). For the panel kernel:
        // a shared dimension in two blocks, its most rows and one more (`gemm`'s), one column,
        // and partial panels and tiles.
        let shapes = [(300, 257, 190), (37, 300, 1000), (5, 576, 3000), (1024, 64, 33), (40, 40, 40)];
        let panels = [(9, 1100, 97), (256, 48, 49), (257, 48, 49), (6, 700, 1), (13, 1, 50)];
        for (m, k, n) in shapes.into_iter().chain(panels) {
            let split = m * k * n >= MIN_BLOCKS || runs_panels(m);
            // Operands stored row-major and read through transposes (a gradient's layouts).
            for transposed in [false, true] {
                let (a, w) = if transposed {
                    (
                        Tensor::<Cpu, 2>::random([k, m], u, &dev).transpose(),
                        Tensor::<Cpu, 2>::random([n, k], u, &dev).transpose(),
                    )
                } else {
                    (Tensor::<Cpu, 2>::random([m, k], u, &dev), Tensor::<Cpu, 2>::random([k, n], u, &dev))
                };
                let want: Vec<f32> = a.clone().matmul(w.clone()).into_data().to_vec().unwrap();
                let what = format!("{m}x{k}x{n}, transposed {transposed}");
                let got = match matmul(a, w) {
                    Ok(y) => {
                        assert!(split, "{what}: split below the threshold");
                        y
                    }
                    Err((a, w)) => {
                        assert!(!split, "{what}: not split");
                        a.matmul(w)
                    }
                };
                assert_close(&want, &got.into_data().to_vec::<f32>().unwrap(), k, &what);
            }
        }
    }

    #[test]
    fn training_products_split_in_blocks_have_burns_gradients() {
        type Ad = burn::backend::Autodiff<Cpu>;
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        let read = |t: Tensor<Cpu, 2>| t.into_data().to_vec::<f32>().unwrap();
        // A linear layer's weight stored `[k, n]`, an LM head read through its embedding's
        // transpose, and two rows (training takes the blocks however few the rows).
        for (m, k, n, transposed) in [(200, 192, 230, false), (64, 96, 2000, true), (2, 300, 13000, false)] {
            let a = Tensor::<Ad, 2>::random([m, k], u, &dev).require_grad();
            let g = Tensor::<Ad, 2>::random([m, n], u, &dev);
            let stored = Tensor::<Ad, 2>::random(if transposed { [n, k] } else { [k, n] }, u, &dev).require_grad();
            // A backward pass frees its graph: each product reads the weight anew.
            let gradients = |split: bool| {
                let w = if transposed { stored.clone().transpose() } else { stored.clone() };
                let y = if split {
                    matmul(a.clone(), w).unwrap_or_else(|_| panic!("{m}x{k}x{n}: not split"))
                } else {
                    a.clone().matmul(w)
                };
                let grads = (y.clone() * g.clone()).sum().backward();
                let gw = stored.grad(&grads).unwrap();
                [read(y.inner()), read(a.grad(&grads).unwrap()), read(if transposed { gw.transpose() } else { gw })]
            };
            let (got, want) = (gradients(true), gradients(false));
            let what = [("product", k), ("inputs' gradient", n), ("weight's gradient", m)];
            for ((want, got), (what, inner)) in want.iter().zip(&got).zip(what) {
                assert_close(want, got, inner, &format!("{m}x{k}x{n}, transposed {transposed}: {what}"));
            }
        }
    }

    #[test]
    fn a_packed_f32_weights_products_are_the_unpacked_ones_to_the_bit() {
        let dev = Default::default();
        let u = Distribution::Uniform(-1.0, 1.0);
        let read =
            |t: Tensor<Cpu, 2>| t.into_data().to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // A weight stored `[k, n]` and one read through the transpose of `[n, k]` (the LM head),
        // each multiplied by rows from decoding's one to the panels' most and past them.
        for (k, n, transposed) in [(576, 200, false), (100, 1000, true), (1030, 49, false)] {
            let w = match transposed {
                true => Tensor::<Cpu, 2>::random([n, k], u, &dev).transpose(),
                false => Tensor::<Cpu, 2>::random([k, n], u, &dev),
            };
            let Some(packed) = PackedF32::of(&w) else {
                assert!(!kernels::f32_panel_instructions(), "an f32 CPU weight not packed on a CPU with AVX2");
                eprintln!("this CPU has no AVX2 (or HACPO_CPU_KERNELS=baseline): nothing is packed");
                return;
            };
            for m in [1, 4, 5, 8, 33, 256, 257] {
                let a = Tensor::<Cpu, 2>::random([m, k], u, &dev);
                let what = format!("{m}x{k}x{n}, transposed {transposed}");
                // Decoding's few rows sum along the shared dimension's slices, and more rows than
                // the panels take run `gemm`: both from the weight as stored.
                let served = m > FEW_ROWS && m <= panel_split::PANEL_ROWS;
                match packed.product(a.clone()) {
                    Ok(y) => {
                        assert!(served, "{what}: served");
                        let usual = matmul(a, w.clone()).unwrap_or_else(|_| panic!("{what}: the panels"));
                        assert_eq!(read(y), read(usual), "{what}");
                    }
                    Err(_) => assert!(!served, "{what}: not served"),
                }
            }
        }
    }
}
