//! f32 products on the CPU backend, split over the threads here rather than inside the GEMM.
//!
//! - **A few rows** (decoding a few sequences): burn-flex runs a product below 192³
//!   multiply-adds on one thread, and decoding one sequence multiplies one row by each linear
//!   layer's weight: every layer's product read its weight at one core's memory bandwidth while
//!   the other cores waited. Here each thread reads a contiguous slice of the weight's rows, one
//!   sequential stream, into partial sums of every output, added at the end.
//! - **More rows** (prefill, decoding many sequences, training's forward and both gradients as
//!   a custom autodiff op): one single-threaded GEMM per thread on a block of the output's rows,
//!   or of its columns when the output is wider than tall. burn-flex's threaded GEMM zeroes the
//!   output on the calling thread first and meets the threads again for every packed block of
//!   the shared dimension; on a 2-core AMD EPYC with AVX2 a tiny-5m prefill scaled 1.2× from
//!   one thread to two (PyTorch's 1.6×).

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::Cpu;
use super::fused::{CpuBackend, ad, contiguous, cpu_backend, elems, flex};
use super::kernels;
use super::primitive::tensor;

/// Rows up to which inference splits a product along the shared dimension: each thread's
/// partial sums, rows × columns, stay in cache while the weight streams through (in L1 for a
/// layer of SmolLM2's size).
const FEW_ROWS: usize = 4;
/// Weights below this many elements stay on one thread (the split and the sum of the parts
/// cost more than they save on a small model).
const MIN_SPLIT: usize = 1 << 18;

/// `a · b` for f32 `a: [m, k]` and `b: [k, n]` on the CPU backend (with autodiff or not), by
/// the shared dimension for up to [`FEW_ROWS`] rows and a row-major `b` (inference), else in
/// blocks of the output from [`MIN_BLOCKS`] multiply-adds; the operands back otherwise (other
/// backends, ranks or dtypes, one thread, small products).
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
        if m * k * n < MIN_BLOCKS || rayon::current_num_threads() < 2 {
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

/// `a · b` as one single-threaded GEMM per thread, each on a block of the output's rows or,
/// when the output is wider than tall, of its columns (each thread then reads only its part
/// of the weight).
fn in_blocks(a: &FlexTensor, b: &FlexTensor, m: usize, k: usize, n: usize) -> FlexTensor {
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
        // threshold (burn's product).
        for (m, k, n) in [(300, 257, 190), (37, 300, 1000), (5, 576, 3000), (1024, 64, 33), (40, 40, 40)] {
            let split = m * k * n >= MIN_BLOCKS;
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
}
