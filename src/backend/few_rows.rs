//! f32 products of a few rows on the CPU backend (decoding a few sequences), split over the
//! threads along the shared dimension.
//!
//! burn-flex runs a product of fewer than 192³ multiply-adds on one thread, and decoding one
//! sequence multiplies one row by each linear layer's weight: every layer's product read its
//! weight at one core's memory bandwidth while the other cores waited. Here each thread reads
//! a contiguous slice of the weight's rows, one sequential stream, into partial sums of every
//! output, added at the end.

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::fused::{CpuBackend, contiguous, cpu_backend, elems, flex, tensor};
use super::kernels;

/// Rows up to which a product goes this way: each thread's partial sums, rows × columns,
/// stay in cache while the weight streams through (in L1 for a layer of SmolLM2's size).
const FEW_ROWS: usize = 4;
/// Weights below this many elements stay on one thread (the split and the sum of the parts
/// cost more than they save on a small model).
const MIN_SPLIT: usize = 1 << 18;

/// `a · b` for an f32 `a: [m, k]` of at most [`FEW_ROWS`] rows and an f32 `b: [k, n]` stored
/// row-major, on the plain CPU backend; the operands back otherwise.
#[allow(clippy::type_complexity)]
pub fn matmul<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    let [m, k, n] = [a.dims()[0], a.dims()[D - 1], b.dims()[D - 1]];
    let applies = D == 2
        && b.dims()[0] == k
        && a.dtype() == DType::F32
        && b.dtype() == DType::F32
        && m <= FEW_ROWS
        && k * n >= MIN_SPLIT;
    if !applies || cpu_backend::<B>(&[]) != Some(CpuBackend::Plain) {
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
                let got: Vec<f32> = got.into_data().to_vec().unwrap();
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        (w - g).abs() <= 1e-5 * (k as f32).sqrt() * w.abs().max(1.0),
                        "{m}x{k}x{n} {name} [{i}]: {g} against {w}"
                    );
                }
            }
        }
    }
}
