//! The slice kernels of the fused CPU ops (AVX-512, AVX2 and baseline, picked at run time) and
//! their tests. The kernels live in the crate `hacpo-kernels` (`kernels/`), a dependency, so
//! that test builds, which compile this crate at opt-level 1, still compile them vectorised.
//! `HACPO_CPU_KERNELS` (`avx2`, `baseline`) caps their instructions below what the CPU has.

pub use hacpo_kernels::{
    AdamWStep, PANEL_COLS, Panels, adamw, add_into, bf16_dot_instructions, bf16_dot_products, bf16_matmul_cols,
    bf16_matmul_rows, bf16_panel_products, bf16_panel_products_to, bf16_round, bf16_round_bits, f32_panel_instructions,
    f32_panel_products_to, f32_rows_accumulate, neg_scaled_softmax, pack_f32_panels, pack_panels, packed_len,
    pair_rows, query_key_scores, query_key_scores_bf16, rms_norm, rms_norm_backward, rope, scaled_logsumexp, silu_mul,
    silu_mul_backward, softmax, softmax_backward, transpose_u16, weighted_values, weighted_values_bf16,
};
pub use hacpo_kernels::{LEVEL_VARIABLE, Level, detected_level, level};

use crate::{Error, Result};

/// The instructions the kernels run ([`level`]), after checking [`LEVEL_VARIABLE`]: a value
/// that names no level is an error the command line reports before anything loads, rather than
/// a cap silently ignored (an empty one caps nothing, as unset). Logs the level (`-v`).
pub fn checked_level() -> Result<Level> {
    if let Some(value) = std::env::var_os(LEVEL_VARIABLE) {
        let names = [Level::Avx512, Level::Avx2, Level::Baseline].map(Level::name).join(", ");
        let empty = value.to_str().is_some_and(|v| v.trim().is_empty());
        if !empty && value.to_str().and_then(Level::parse).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{LEVEL_VARIABLE}={value:?} names no instruction set of hacpo's CPU kernels: use one of {names} \
                 (it caps them below what the CPU has), or unset it"
            )));
        }
    }
    let (level, detected) = (level(), detected_level());
    match level == detected {
        true => tracing::info!("CPU kernels: {} (the best this CPU has)", level.name()),
        false => tracing::info!("CPU kernels: {} ({LEVEL_VARIABLE}; this CPU has {})", level.name(), detected.name()),
    }
    Ok(level)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Vec<f32>> {
        (1..40).map(|n| (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7).collect()).collect()
    }

    /// Decoding's few-query kernels for `rows` queries over `keys` keys and values (`k`, or its
    /// bf16 `bits`), run as two calls split at key `split`: scores `keys + 2` apart, outputs
    /// `out_stride` apart.
    #[allow(clippy::too_many_arguments)]
    fn few_queries(
        q: (&[f32], usize),
        rows: usize,
        (k, bits, kv_stride): (&[f32], Option<&[u16]>, usize),
        keys: usize,
        d: usize,
        out_stride: usize,
        split: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let (q, q_stride) = q;
        let p_stride = keys + 2;
        let mut scores = vec![0f32; rows * p_stride];
        let mut out = vec![0f32; rows * out_stride];
        for (first, end) in [(0, split), (split, keys)] {
            // Without rows there are no scores to index.
            let (n, at, first) = (end - first, first * kv_stride, first.min(scores.len()));
            let accumulate = first > 0;
            match bits {
                Some(bits) => {
                    query_key_scores_bf16(
                        q,
                        q_stride,
                        rows,
                        &bits[at..],
                        (n, kv_stride),
                        d,
                        (&mut scores[first..], p_stride),
                    );
                    let (p, v) = ((&scores[first..], p_stride), (&bits[at..], (n, kv_stride)));
                    weighted_values_bf16(p, rows, v, d, (&mut out, out_stride), accumulate);
                }
                None => {
                    query_key_scores(q, q_stride, rows, &k[at..], (n, kv_stride), d, (&mut scores[first..], p_stride));
                    let (p, v) = ((&scores[first..], p_stride), (&k[at..], (n, kv_stride)));
                    weighted_values(p, rows, v, d, (&mut out, out_stride), accumulate);
                }
            }
        }
        (scores, out)
    }

    #[test]
    fn few_query_scores_and_weighted_values_match_the_definitions() {
        let value = |i: usize| ((i * 37 % 23) as f32 - 11.0) * 0.09;
        // Every row tile (1–4, and 4 then 1–3), whole 64-wide strips with a 16-wide one after
        // (d = 80), part strips (24, 40), keys none or one.
        let shapes = [(1, 5, 16), (3, 33, 64), (4, 7, 24), (7, 19, 40), (5, 1, 8), (2, 0, 16), (0, 4, 16)];
        for (rows, keys, d) in shapes.into_iter().chain([(4, 9, 80), (6, 12, 128), (8, 3, 64), (2, 21, 32)]) {
            // Rows and keys further apart than a row, as in the KV cache's buffers.
            let (q_stride, kv_stride, out_stride) = (d + 3, d + 5, d + 1);
            let q: Vec<f32> = (0..rows * q_stride).map(value).collect();
            let exact: Vec<f32> = (0..keys * kv_stride).map(|i| value(i + 7)).collect();
            // bf16 keys and values: the same kernels read their bits and widen them.
            let mut bits = vec![0u16; exact.len()];
            bf16_round_bits(&exact, &mut bits);
            let rounded: Vec<f32> = bits.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
            let p_stride = keys + 2;
            for bf16 in [false, true] {
                let k = if bf16 { &rounded } else { &exact };
                let kv = (k.as_slice(), bf16.then_some(bits.as_slice()), kv_stride);
                let (scores, out) = few_queries((&q, q_stride), rows, kv, keys, d, out_stride, keys);
                for r in 0..rows {
                    for j in 0..keys {
                        let want: f64 = (0..d).map(|i| q[r * q_stride + i] as f64 * k[j * kv_stride + i] as f64).sum();
                        let got = scores[r * p_stride + j];
                        assert!(
                            (got as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                            "{rows}x{keys}x{d}: score {got} {want}"
                        );
                    }
                    for i in 0..d {
                        let want: f64 =
                            (0..keys).map(|j| scores[r * p_stride + j] as f64 * k[j * kv_stride + i] as f64).sum();
                        let got = out[r * out_stride + i];
                        assert!(
                            (got as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                            "{rows}x{keys}x{d}: value {got} {want}"
                        );
                    }
                    // The gaps between output rows, and the scores' between their rows, are left
                    // alone.
                    assert!(out[r * out_stride + d..(r + 1) * out_stride].iter().all(|&x| x == 0.0));
                    assert!(scores[r * p_stride + keys..(r + 1) * p_stride].iter().all(|&x| x == 0.0));
                }
                // Keys split at a multiple of four (decoding reads a group's shared prompt from
                // one row and the rest from each row's own) give the same bits as one call.
                for split in (4..keys).step_by(4) {
                    let (split_scores, split_out) = few_queries((&q, q_stride), rows, kv, keys, d, out_stride, split);
                    let bits_of = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits_of(&split_scores), bits_of(&scores), "{rows}x{keys}x{d} split at {split}: scores");
                    assert_eq!(bits_of(&split_out), bits_of(&out), "{rows}x{keys}x{d} split at {split}: values");
                }
            }
        }
    }

    #[test]
    fn softmax_matches_the_definition_at_every_length() {
        for row in rows() {
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|x| (x - max).exp()).sum();
            let mut got = row.clone();
            softmax(&mut got);
            for (g, x) in got.iter().zip(&row) {
                assert!((g - (x - max).exp() / sum).abs() < 1e-6);
            }
        }
        let mut masked = vec![f32::NEG_INFINITY; 20];
        softmax(&mut masked);
        assert!(masked.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn scaled_logsumexp_and_softmax_match_the_definitions() {
        for row in rows() {
            let want: f64 = row.iter().map(|&x| (x as f64 * 0.5).exp()).sum::<f64>().ln();
            let lse = scaled_logsumexp(&row, 0.5);
            assert!((lse as f64 - want).abs() < 1e-5, "{lse} vs {want}");
            let mut probs = row.clone();
            neg_scaled_softmax(&mut probs, 0.5, lse, 2.0);
            for (p, x) in probs.iter().zip(&row) {
                assert!((*p as f64 + 2.0 * (x * 0.5 - lse).exp() as f64).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn silu_mul_and_its_gradient_match_finite_differences() {
        let g: Vec<f32> = (0..37).map(|i| i as f32 * 0.3 - 5.0).collect();
        let u: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.05).collect();
        let mut y = vec![0.0; 37];
        silu_mul(&g, &u, &mut y);
        let f = |g: f32, u: f32| g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
        let (mut dg, mut du) = (g.clone(), u.clone());
        silu_mul_backward(&[1.0; 37], &mut dg, &mut du);
        for i in 0..37 {
            assert!((y[i] as f64 - f(g[i], u[i])).abs() < 1e-5);
            let h = 1e-3f32;
            let num_g = (f(g[i] + h, u[i]) - f(g[i] - h, u[i])) / (2.0 * h as f64);
            let num_u = (f(g[i], u[i] + h) - f(g[i], u[i] - h)) / (2.0 * h as f64);
            assert!((dg[i] as f64 - num_g).abs() < 1e-3, "dg {i}: {} vs {num_g}", dg[i]);
            assert!((du[i] as f64 - num_u).abs() < 1e-3, "du {i}: {} vs {num_u}", du[i]);
        }
    }

    #[test]
    fn rms_norm_gradient_matches_finite_differences() {
        for x in rows() {
            let n = x.len();
            let w: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.1).collect();
            let dy: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin()).collect();
            // Loss Σ dy ∘ rms_norm(x, w), in f64.
            let loss = |x: &[f32], w: &[f32]| {
                let r = 1.0 / (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64 + 1e-5).sqrt();
                (0..n).map(|i| dy[i] as f64 * x[i] as f64 * r * w[i] as f64).sum::<f64>()
            };
            let mut out = vec![0.0; n];
            let r = rms_norm(&x, &w, 1e-5, &mut out);
            let (mut dx, mut dw) = (dy.clone(), vec![0.0; n]);
            rms_norm_backward(&mut dx, &x, &w, r, &mut dw);
            for i in 0..n {
                let h = 1e-2f32;
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[i] += h;
                xm[i] -= h;
                let num = (loss(&xp, &w) - loss(&xm, &w)) / (2.0 * h as f64);
                assert!((dx[i] as f64 - num).abs() < 2e-3, "n {n} dx {i}: {} vs {num}", dx[i]);
                let (mut wp, mut wm) = (w.clone(), w.clone());
                wp[i] += h;
                wm[i] -= h;
                let num = (loss(&x, &wp) - loss(&x, &wm)) / (2.0 * h as f64);
                assert!((dw[i] as f64 - num).abs() < 2e-3, "n {n} dw {i}: {} vs {num}", dw[i]);
            }
        }
    }

    #[test]
    fn bf16_panel_products_of_packed_operands_are_the_sums_of_the_products() {
        if !bf16_dot_instructions() {
            let run = || bf16_panel_products(&[0], (1, 1), 1, 1, &[0; PANEL_COLS], 1, &mut [0.0], 1, false, false);
            assert!(std::panic::catch_unwind(run).is_err(), "ran without AVX512-BF16");
            eprintln!("this CPU has no AVX512-BF16: checked only that the panel products refuse to run");
            return;
        }
        let bits = |i: usize| half::bf16::from_f32(((i * 7919 % 211) as f32 - 105.0) / 37.0).to_bits();
        let value = |b: u16| f32::from_bits((b as u32) << 16) as f64;
        // Rows for every last tile (1 to 8) and several tiles; shared sizes odd and even, one
        // element, none, and past a block of 512 pairs (two equal blocks); columns that fill
        // no, one and several panels.
        for (rows, k, n) in
            [(1, 1, 1), (3, 2, 47), (8, 33, 48), (9, 64, 49), (15, 7, 100), (20, 1100, 5), (6, 1025, 97), (2, 0, 3)]
        {
            // `a` read both ways: its rows paired along memory (a product's first operand) and
            // the rows of its transpose paired by `pair_rows` (a sum over rows, `xᵀ · dy`).
            let a: Vec<u16> = (0..rows * k).map(bits).collect();
            // The transpose `k × rows`, its rows 3 elements further apart than their length.
            let t_stride = rows + 3;
            let at: Vec<u16> = (0..k * t_stride)
                .map(|i| if i % t_stride < rows { a[i % t_stride * k + i / t_stride] } else { 1 })
                .collect();
            let pairs = k.div_ceil(2);
            let words: Vec<u32> = (0..rows * pairs)
                .map(|w| {
                    let (r, p) = (w / pairs, w % pairs);
                    let hi = if 2 * p + 1 < k { a[r * k + 2 * p + 1] as u32 } else { 0 };
                    a[r * k + 2 * p] as u32 | hi << 16
                })
                .collect();
            let mut paired = vec![0u32; pairs * rows];
            pair_rows(&at, t_stride, (k, rows), (0, pairs), &mut paired);
            // `b` (`k × n`) stored row-major and as its transpose: both packings.
            let b: Vec<u16> = (0..k * n).map(|i| bits(i + 13)).collect();
            let bt: Vec<u16> = (0..n * k).map(|i| b[i % k * n + i / k]).collect();
            let panels = n.div_ceil(PANEL_COLS);
            let pack = |src: &[u16], strides| {
                let mut out = vec![u32::MAX; packed_len(pairs, n)];
                pack_panels(src, strides, (k, n), (0, panels), &mut out);
                out
            };
            let (packed, packed_t) = (pack(&b, (n, 1)), pack(&bt, (1, k)));
            assert_eq!(packed, packed_t, "{rows}x{k}x{n}: the two layouts pack alike");
            let out_stride = n + 5;
            for ((words, strides), add) in [((&words, (pairs, 1)), false), ((&paired, (1, rows)), true)] {
                let mut out = vec![f32::NAN; rows * out_stride];
                if add {
                    out.chunks_mut(out_stride).for_each(|row| row[..n].fill(0.5));
                }
                bf16_panel_products(words, strides, rows, pairs, &packed, n, &mut out, out_stride, add, false);
                // Rounded as stored: each sum's nearest bf16, with the other's bits.
                let mut rounded = out.clone();
                if add {
                    rounded.chunks_mut(out_stride).for_each(|row| row[..n].fill(0.5));
                }
                bf16_panel_products(words, strides, rows, pairs, &packed, n, &mut rounded, out_stride, add, true);
                for (r, (got, sum)) in rounded.iter().zip(&out).enumerate() {
                    let want = half::bf16::from_f32(*sum).to_f32();
                    assert!(got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(), "[{r}]: {got} vs {want}");
                }
                for r in 0..rows {
                    for c in 0..n {
                        let terms = (0..k).map(|i| value(a[r * k + i]) * value(b[i * n + c]));
                        let (sum, size) = terms.fold((0.0, 0.0), |(s, z), t| (s + t, z + t.abs()));
                        let want = sum + if add { 0.5 } else { 0.0 };
                        let got = out[r * out_stride + c] as f64;
                        assert!(
                            (got - want).abs() <= 1e-6 * size,
                            "{rows}x{k}x{n} add {add} [{r}, {c}]: {got} vs {want}"
                        );
                    }
                    assert!(
                        out[r * out_stride + n..(r + 1) * out_stride].iter().all(|v| v.is_nan()),
                        "wrote past a row"
                    );
                }
            }
        }
    }

    #[test]
    fn bf16_pair_products_are_the_sums_of_the_products() {
        if !bf16_dot_instructions() {
            // This CPU cannot run them: they must refuse, not compute something else.
            let run = || bf16_dot_products(&[0], 1, 1, 1, &[0], (0, 1), &mut [0.0], 1);
            assert!(std::panic::catch_unwind(run).is_err(), "ran without AVX512-BF16");
            eprintln!("this CPU has no AVX512-BF16: checked only that the pair products refuse to run");
            return;
        }
        let bits = |i: usize| half::bf16::from_f32(((i * 7919 % 211) as f32 - 105.0) / 37.0).to_bits();
        let value = |b: u16| f32::from_bits((b as u32) << 16) as f64;
        // Inner sizes around the 32-element register and past a block of the shared dimension
        // (and none); rows for the streaming kernel and for the tiles (last tiles of 1 to 4
        // rows), columns that fill no, one and several tiles; `a`'s rows and `out`'s rows
        // further apart than their lengths.
        for (rows, k, n) in [
            (1, 1, 1),
            (5, 31, 9),
            (4, 32, 8),
            (9, 33, 17),
            (3, 100, 30),
            (21, 70, 19),
            (19, 40, 11),
            (20, 65, 7),
            (3, 2100, 5),
            (18, 2100, 9),
            (2, 0, 3),
        ] {
            let (a_stride, out_stride) = (k + 3, n + 5);
            let a: Vec<u16> = (0..rows * a_stride).map(bits).collect();
            let bt: Vec<u16> = (0..n * k).map(|i| bits(i + 13)).collect();
            for cols in [(0, n), (n / 3, n)] {
                let mut out = vec![f32::NAN; rows * out_stride];
                bf16_dot_products(&a, a_stride, rows, k, &bt, cols, &mut out, out_stride);
                for r in 0..rows {
                    for c in cols.0..cols.1 {
                        let terms = (0..k).map(|i| value(a[r * a_stride + i]) * value(bt[c * k + i]));
                        let (sum, size) = terms.fold((0.0, 0.0), |(s, z), t| (s + t, z + t.abs()));
                        let got = out[r * out_stride + c - cols.0] as f64;
                        assert!((got - sum).abs() <= 1e-6 * size, "{rows}x{k}x{n} [{r}, {c}]: {got} vs {sum}");
                    }
                    // Nothing written past a row's columns.
                    assert!(out[r * out_stride + cols.1 - cols.0..(r + 1) * out_stride].iter().all(|v| v.is_nan()));
                }
            }
        }
    }

    #[test]
    fn transposes_move_every_element_once_at_every_size_and_column_range() {
        for (k, n) in [(0, 5), (1, 1), (7, 9), (8, 8), (16, 24), (19, 33), (64, 40)] {
            let w: Vec<u16> = (0..k * n).map(|i| i as u16).collect();
            for cols in [(0, n), (n / 3, n), (1.min(n), (n / 2).max(1.min(n)))] {
                let width = cols.1 - cols.0;
                let mut t = vec![u16::MAX; width * k + 3];
                transpose_u16(&w, k, n, cols, &mut t);
                for c in cols.0..cols.1 {
                    for i in 0..k {
                        assert_eq!(t[(c - cols.0) * k + i], w[i * n + c], "{k}×{n}, columns {cols:?}: ({i}, {c})");
                    }
                }
                assert!(t[width * k..].iter().all(|&v| v == u16::MAX), "{k}×{n}: written past the columns");
            }
        }
    }

    #[test]
    fn bf16_rounding_is_halfs() {
        // Ties both ways, the largest finite values, infinities, NaNs, subnormals, and a
        // spread of everything else.
        let mut values: Vec<f32> =
            [0x3f80_8000u32, 0x3f81_8000, 0x3f80_8001, 0x7f7f_ffff, 0xff7f_ffff, 0x7f80_0000, 0xff80_0000]
                .into_iter()
                .chain([0x7fc0_0000, 0x7f80_0001, 0xffff_ffff, 0x0000_8000, 0x8001_8000, 0x0000_0001, 0])
                .map(f32::from_bits)
                .collect();
        values.extend((0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
        let mut bits = vec![0u16; values.len()];
        bf16_round_bits(&values, &mut bits);
        let mut rounded = values.clone();
        bf16_round(&mut rounded);
        for ((v, b), r) in values.iter().zip(&bits).zip(&rounded) {
            let want = half::bf16::from_f32(*v);
            assert_eq!(*b, want.to_bits(), "{v:e} ({:#x})", v.to_bits());
            assert_eq!(r.to_bits(), want.to_f32().to_bits(), "{v:e} ({:#x})", v.to_bits());
        }
    }

    /// `Σ_i a(r, i)·b(i, c)` as [`f32_panel_products_to`] sums it, an FMA chain in the order of
    /// `i` in equal blocks of at most 512, each block's sum added to what came before (`start`).
    fn panel_sum(start: Option<f32>, shared: usize, term: impl Fn(usize) -> (f32, f32)) -> f32 {
        let block = shared.div_ceil(shared.div_ceil(512).max(1)).max(1);
        let sums = (0..shared).step_by(block).map(|first| {
            (first..(first + block).min(shared)).fold(0f32, |s, i| {
                let (x, w) = term(i);
                x.mul_add(w, s)
            })
        });
        sums.fold(start, |total, s| Some(total.map_or(s, |t| t + s))).unwrap_or(0.0)
    }

    #[test]
    fn f32_panel_products_add_or_write_their_block_and_nothing_between() {
        if !f32_panel_instructions() {
            eprintln!("this CPU has no AVX2 (or HACPO_CPU_KERNELS=baseline): the f32 panel products do not run");
            return;
        }
        let value = |i: usize| ((i * 37 % 23) as f32 - 11.0) / 8.0 + (i % 7) as f32 * 1e-3;
        // Partial tiles, panels and half panels (AVX2's tiles: a last one of 12 columns at 60),
        // two and three blocks of the shared dimension, nothing to sum. The sums' bits are the
        // instruction sets' own order's, so AVX-512 and AVX2 (`HACPO_CPU_KERNELS=avx2`) agree to
        // the bit.
        let shapes =
            [(9, 1030, 50), (3, 5, 97), (8, 0, 20), (1, 1, 1), (5, 1100, 24), (13, 7, 71), (6, 9, 60), (4, 3, 30)];
        for (rows, shared, cols) in shapes {
            // `a` row-major and transposed; `b` in place with rows `cols` and `cols + 5` apart,
            // and packed.
            let a: Vec<f32> = (0..rows * shared).map(value).collect();
            let wide = cols + 5;
            let b: Vec<f32> = (0..shared * wide).map(|i| value(i + 7)).collect();
            let b_at = |i: usize, c: usize, row: usize| b[i * row + c];
            let mut packed = vec![f32::NAN; cols.div_ceil(PANEL_COLS) * PANEL_COLS * shared];
            pack_f32_panels(&b, (wide, 1), (shared, cols), (0, cols.div_ceil(PANEL_COLS)), &mut packed);
            let stride = cols + 3;
            let operands = [
                (&b[..], Panels::in_place(cols), cols),
                (&b[..], Panels::in_place(wide), wide),
                (&packed[..], Panels::packed(shared), wide),
            ];
            for ((operand, panels, row), a_steps) in
                operands.into_iter().flat_map(|o| [(o, (shared, 1)), (o, (1, rows))])
            {
                for add in [false, true] {
                    let mut out = vec![0.5f32; rows * stride];
                    // SAFETY: `out` holds `rows` rows `stride` apart, initialised.
                    unsafe {
                        let b = (operand, panels);
                        f32_panel_products_to(&a, a_steps, rows, shared, b, cols, out.as_mut_ptr(), stride, add)
                    };
                    for (r, out_row) in out.chunks(stride).enumerate() {
                        let what = format!("{rows}x{shared}x{cols}, {panels:?}, a {a_steps:?}, add {add}, row {r}");
                        assert!(out_row[cols..].iter().all(|&x| x == 0.5), "{what}: wrote between the rows");
                        for (c, &got) in out_row[..cols].iter().enumerate() {
                            let term = |i: usize| (a[r * a_steps.0 + i * a_steps.1], b_at(i, c, row));
                            let want = panel_sum(add.then_some(0.5), shared, term);
                            assert_eq!(got.to_bits(), want.to_bits(), "{what}, column {c}: {got} against {want}");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod capped_tests {
    use super::{LEVEL_VARIABLE, Level, detected_level};

    /// A CPU with AVX-512 (CI's) would never run the AVX2 or baseline kernels, which a CPU
    /// without it runs: this test binary runs the kernels' tests, and those of what picks them
    /// (the products, the packed rollout copy, the memory plan's count of it), again at each
    /// level below this CPU's.
    #[test]
    fn the_kernels_tests_pass_at_each_level_below_this_cpus() {
        // The children skip this test; should a rename defeat `--skip`, they still start none.
        if std::env::var_os(LEVEL_VARIABLE).is_some() {
            return;
        }
        let lower = [Level::Baseline, Level::Avx2].into_iter().filter(|&l| l < detected_level());
        for level in lower {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--test-threads=2", "--skip", "capped_tests", "backend::", "model::precision", "memory_plan"])
                .env(LEVEL_VARIABLE, level.name())
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let what =
                format!("{LEVEL_VARIABLE}={}:\n{stdout}\n{}", level.name(), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{what}");
            let passed =
                stdout.lines().find_map(|l| l.strip_prefix("test result: ok. ")?.split(' ').next()?.parse().ok());
            assert!(passed.is_some_and(|n: usize| n > 40), "{what}");
        }
    }
}
