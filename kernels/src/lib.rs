//! Slice kernels of the fused CPU ops, compiled for AVX-512 and AVX2 and picked at run time.
//!
//! The crate builds for baseline x86-64 (SSE2), so a plain loop over `f32`s runs 4 lanes
//! wide. [`simd_kernel!`] compiles a kernel's body three times (AVX-512, AVX2+FMA, baseline)
//! and calls the best one the CPU has, once per slice, not per element. Reductions keep
//! [`LANES`] partial sums so that the compiler may vectorise them (a single running `f32` sum
//! has a fixed order it must keep).
//!
//! They are a crate of their own so that they are always compiled with full optimisation:
//! hacpo's own crate builds at `opt-level = 1` for tests, where LLVM does not vectorise loops,
//! and the fused CPU ops spend their time in these loops (a search training run in the test
//! build took 76 s, against release's 57 s, while they were inside hacpo). Their tests are
//! hacpo's (`src/backend/kernels.rs`, `src/math.rs`): `cargo test` runs the root crate's.

use std::sync::OnceLock;

/// `$tile::<R>($args…)` for the `R` of `$rows` rows (1 to 8, or 1 to 4 after `at most 4:`,
/// with more const parameters after `R` in `<…>`): the panel kernels' last tile of a panel has
/// fewer rows than a whole one, and a tile's row count sizes its registers.
macro_rules! tile_of_rows {
    ($rows:expr, $tile:ident $(<$($g:tt),*>)? ($($arg:expr),* $(,)?)) => {
        match $rows {
            1 => $tile::<1 $($(, $g)*)?>($($arg),*),
            2 => $tile::<2 $($(, $g)*)?>($($arg),*),
            3 => $tile::<3 $($(, $g)*)?>($($arg),*),
            4 => $tile::<4 $($(, $g)*)?>($($arg),*),
            5 => $tile::<5 $($(, $g)*)?>($($arg),*),
            6 => $tile::<6 $($(, $g)*)?>($($arg),*),
            7 => $tile::<7 $($(, $g)*)?>($($arg),*),
            _ => $tile::<8 $($(, $g)*)?>($($arg),*),
        }
    };
    (at most 4: $rows:expr, $tile:ident $(<$($g:tt),*>)? ($($arg:expr),* $(,)?)) => {
        match $rows {
            1 => $tile::<1 $($(, $g)*)?>($($arg),*),
            2 => $tile::<2 $($(, $g)*)?>($($arg),*),
            3 => $tile::<3 $($(, $g)*)?>($($arg),*),
            _ => $tile::<4 $($(, $g)*)?>($($arg),*),
        }
    };
}

mod bf16_dot;
mod bf16_panel;
mod f32_panel;
mod transpose;
pub use bf16_dot::{bf16_dot_instructions, bf16_dot_products};
pub use bf16_panel::{PANEL_COLS, bf16_panel_products, bf16_panel_products_to, pack_panels, packed_len, pair_rows};
pub use f32_panel::{Panels, f32_panel_instructions, f32_panel_products_to, pack_f32_panels};
pub use transpose::transpose_u16;

/// `exp(x)` for f32, branch-free so loops over slices auto-vectorise (libm's `expf` does not,
/// and it was 9% of a training step). Cody–Waite range reduction and a degree-7 polynomial:
/// relative error below 2e-7 on [-87, 88]; inputs below −87.3 give 0 like `expf`'s underflow,
/// above 88.37 +∞ (`expf` overflows above 88.72).
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let underflow = x < -87.3;
    let x = x.clamp(-87.3, 88.7);
    // Round to nearest with the 1.5·2²³ trick: `f32::round` is a libm call on baseline
    // x86-64 and would stop the loop from vectorising.
    const ROUND: f32 = 12_582_912.0;
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // e^r on |r| ≤ ln2/2 (the degree-7 Taylor remainder is below 1e-8 there).
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // n ∈ [−126, 128] sits in the low bits of `shifted` (1.5·2²³ + n, whose unit in the last
    // place is 1): read it from there. `n as i32` saturates, and that check, lane by lane,
    // kept every loop calling this from vectorising (it was 5% of a prefill on AVX2). The
    // adds wrap: a checked add (debug builds) would stop the vectorising too.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let scale = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    if underflow { 0.0 } else { p * scale }
}

/// Partial sums per reduction: one AVX-512 register of f32.
const LANES: usize = 16;

/// The instruction sets hacpo's own CPU kernels are compiled for, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// x86-64's baseline (SSE2), or another architecture: plain loops the compiler vectorises.
    Baseline,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512F (with AVX2 and FMA); AVX512-BF16 where the CPU has it too.
    Avx512,
}

/// The variable that caps [`level`] below what the CPU has: `avx2` or `baseline` runs the
/// kernels a CPU without AVX-512 (or without AVX2) runs, on this one. It does not reach burn's
/// or `gemm`'s own kernels, which pick theirs at build and run time.
pub const LEVEL_VARIABLE: &str = "HACPO_CPU_KERNELS";

impl Level {
    /// The value [`LEVEL_VARIABLE`] takes for this level.
    pub fn name(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// The level a value of [`LEVEL_VARIABLE`] names (any case, spaces around ignored).
    pub fn parse(value: &str) -> Option<Level> {
        let value = value.trim().to_ascii_lowercase();
        [Level::Baseline, Level::Avx2, Level::Avx512].into_iter().find(|l| l.name() == value)
    }
}

/// The best level this CPU has, whatever [`LEVEL_VARIABLE`] says.
pub fn detected_level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let has_avx2 = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
        if has_avx2 && std::arch::is_x86_feature_detected!("avx512f") {
            return Level::Avx512;
        }
        if has_avx2 {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// The level the kernels run at: [`detected_level`], capped by [`LEVEL_VARIABLE`] where it
/// names a lower one (a value it does not name caps nothing; hacpo's command line refuses it
/// before any kernel runs).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = std::env::var(LEVEL_VARIABLE).ok().and_then(|v| Level::parse(&v));
        detected_level().min(cap.unwrap_or(Level::Avx512))
    })
}

/// `pub fn name(args) -> ret { body }`, with the body compiled per instruction set.
macro_rules! simd_kernel {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                match level() {
                    // SAFETY: `level` saw these instruction sets on this CPU.
                    Level::Avx512 => return unsafe { avx512($($arg),*) },
                    Level::Avx2 => return unsafe { avx2($($arg),*) },
                    Level::Baseline => {}
                }
            }
            body($($arg),*)
        }
    };
}

mod few_queries;
pub use few_queries::{query_key_scores, query_key_scores_bf16, weighted_values, weighted_values_bf16};

#[inline(always)]
fn max_of(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    rest.iter().chain(&acc).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

#[inline(always)]
fn dot_of(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + rest
}

simd_kernel! {
    /// `row ← softmax(row)`; a row whose every entry is −∞ becomes zeros.
    pub fn softmax(row: &mut [f32]) {
        let max = max_of(row);
        if max == f32::NEG_INFINITY {
            row.fill(0.0);
            return;
        }
        let mut acc = [0f32; LANES];
        let mut chunks = row.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for i in 0..LANES {
                c[i] = fast_exp(c[i] - max);
                acc[i] += c[i];
            }
        }
        let mut sum: f32 = acc.iter().sum();
        for x in chunks.into_remainder() {
            *x = fast_exp(*x - max);
            sum += *x;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|x| *x *= inv);
    }
}

simd_kernel! {
    /// `row += bias` element-wise.
    pub fn add_into(row: &mut [f32], bias: &[f32]) {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    }
}

simd_kernel! {
    /// The softmax backward of one row in place: `ds ← p ∘ (ds − Σ p ∘ ds)`.
    pub fn softmax_backward(ds: &mut [f32], p: &[f32]) {
        let delta = dot_of(ds, p);
        ds.iter_mut().zip(p).for_each(|(x, p)| *x = p * (*x - delta));
    }
}

simd_kernel! {
    /// `log Σ exp(row · scale)` for `scale > 0`.
    pub fn scaled_logsumexp(row: &[f32], scale: f32) -> f32 {
        let max = max_of(row) * scale;
        let mut acc = [0f32; LANES];
        let chunks = row.chunks_exact(LANES);
        let rest: f32 = chunks.remainder().iter().map(|&x| fast_exp(x * scale - max)).sum();
        for c in chunks {
            for i in 0..LANES {
                acc[i] += fast_exp(c[i] * scale - max);
            }
        }
        max + (acc.iter().sum::<f32>() + rest).ln()
    }
}

simd_kernel! {
    /// `row ← −g · softmax(row · scale)` given the row's [`scaled_logsumexp`] `lse`: the
    /// log-softmax gradient before the target's `+g`.
    pub fn neg_scaled_softmax(row: &mut [f32], scale: f32, lse: f32, g: f32) {
        for x in row.iter_mut() {
            *x = -g * fast_exp(*x * scale - lse);
        }
    }
}

/// One AdamW update's constants, each already in f32 as burn's scalar ops would use it.
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    /// `1 − lr·weight_decay`
    pub decay: f32,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    /// `sqrt(1 − β₂ᵗ)`
    pub sqrt_bc2: f32,
    pub eps: f32,
    /// `lr / (1 − β₁ᵗ)`
    pub step: f32,
}

simd_kernel! {
    /// AdamW in place, in the same f32 operations and order as the trainer's tensor version
    /// (`src/train/optim.rs`), so both give the same bits: decay, moments, then the step.
    pub fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: AdamWStep) {
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let decayed = *p * c.decay;
            *m = *m * c.beta1 + g * c.one_minus_beta1;
            *v = *v * c.beta2 + (g * g) * c.one_minus_beta2;
            let denom = v.sqrt() / c.sqrt_bc2 + c.eps;
            *p = decayed - (*m / denom) * c.step;
        }
    }
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + fast_exp(-x))
}

simd_kernel! {
    /// SwiGLU's gate: `out = silu(gate) ∘ up` with `silu(x) = x σ(x)`.
    pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g * sigmoid(g) * u;
        }
    }
}

simd_kernel! {
    /// Gradients of [`silu_mul`] for the output gradient `dy`, written over `gate` and `up`:
    /// `d gate = dy ∘ up ∘ σ(g)(1 + g(1 − σ(g)))`, `d up = dy ∘ silu(g)`.
    pub fn silu_mul_backward(dy: &[f32], gate: &mut [f32], up: &mut [f32]) {
        for ((&d, g), u) in dy.iter().zip(gate.iter_mut()).zip(up.iter_mut()) {
            let s = sigmoid(*g);
            let dg = d * *u * s * (1.0 + *g * (1.0 - s));
            *u = d * *g * s;
            *g = dg;
        }
    }
}

simd_kernel! {
    /// RMSNorm of one row: `out = x / sqrt(mean(x²) + eps) ∘ w`; returns `1 / sqrt(mean(x²) + eps)`.
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) -> f32 {
        let r = 1.0 / (dot_of(x, x) / x.len() as f32 + eps).sqrt();
        for ((o, &x), &w) in out.iter_mut().zip(x).zip(w) {
            *o = x * r * w;
        }
        r
    }
}

simd_kernel! {
    /// RMSNorm's backward for one row with `r` from [`rms_norm`]: writes `dx` over `dy` and adds
    /// the row's share of the weight gradient, `dy ∘ x r`, to `dw`.
    pub fn rms_norm_backward(dy: &mut [f32], x: &[f32], w: &[f32], r: f32, dw: &mut [f32]) {
        let n = x.len() as f32;
        let mut acc = [0f32; LANES];
        let (mut cd, mut cx, mut cw) = (dy.chunks_exact(LANES), x.chunks_exact(LANES), w.chunks_exact(LANES));
        let mut rest = 0f32;
        for ((d, x), w) in (&mut cd).zip(&mut cx).zip(&mut cw) {
            for i in 0..LANES {
                acc[i] += d[i] * w[i] * x[i];
            }
        }
        for ((d, x), w) in cd.remainder().iter().zip(cx.remainder()).zip(cw.remainder()) {
            rest += d * w * x;
        }
        // d(x r)/dx applied to g = dy ∘ w: r (g − x r² mean(g ∘ x)).
        let mean = (acc.iter().sum::<f32>() + rest) / n;
        let c = r * r * mean;
        for (((d, &x), &w), dw) in dy.iter_mut().zip(x).zip(w).zip(dw.iter_mut()) {
            *dw += *d * x * r;
            *d = r * (*d * w - x * c);
        }
    }
}

// --- bf16 weights ----------------------------------------------------------------------------

/// A bf16 number (its bits) as f32: exact, bf16 being f32's upper half.
#[inline(always)]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `v` rounded to the nearest bf16 number, ties to even, as its bits; NaN stays NaN (quieted).
/// The same bits as `half::bf16::from_f32`, without its branches, so loops vectorise.
#[inline(always)]
fn bf16_bits_of(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let nan = (x & 0x7fff_ffff) > 0x7f80_0000;
    (if nan { (x >> 16) | 0x40 } else { rounded }) as u16
}

simd_kernel! {
    /// `bits[i]` = `values[i]` rounded to bf16 (ties to even), as bits.
    pub fn bf16_round_bits(values: &[f32], bits: &mut [u16]) {
        assert_eq!(values.len(), bits.len(), "one bf16 per value");
        for (b, &v) in bits.iter_mut().zip(values) {
            *b = bf16_bits_of(v);
        }
    }
}

simd_kernel! {
    /// Each value rounded to bf16 (ties to even), kept in f32.
    pub fn bf16_round(values: &mut [f32]) {
        for v in values.iter_mut() {
            *v = bf16_to_f32(bf16_bits_of(*v));
        }
    }
}

/// Columns of a [`bf16_matmul_rows`] tile: two AVX2 registers, one AVX-512 register.
const TILE_COLS: usize = 16;

/// `out[r][c] = Σ_i x[r][i] · w[i][c]` for `R` rows and `TILE_COLS` columns, the weights read
/// once as bf16 and widened in registers.
#[inline(always)]
fn bf16_tile<const R: usize>(x: &[f32], k: usize, w: &[u16], n: usize, col: usize) -> [[f32; TILE_COLS]; R] {
    let mut acc = [[0f32; TILE_COLS]; R];
    for i in 0..k {
        let row: &[u16; TILE_COLS] = w[i * n + col..i * n + col + TILE_COLS].try_into().expect("a full tile");
        let mut wf = [0f32; TILE_COLS];
        for c in 0..TILE_COLS {
            wf[c] = bf16_to_f32(row[c]);
        }
        for r in 0..R {
            let xv = x[r * k + i];
            for c in 0..TILE_COLS {
                acc[r][c] = xv.mul_add(wf[c], acc[r][c]);
            }
        }
    }
    acc
}

/// Rows `x` (`rows × k`, row-major) times the columns `cols` of the bf16 matrix `w` (`k × n`,
/// row-major): `out` is `rows × cols.len()`, row-major. Every weight is read from memory once
/// per four rows at half f32's bytes, which is what decoding waits on.
#[inline(always)]
fn bf16_matmul_rows_body(x: &[f32], rows: usize, k: usize, w: &[u16], n: usize, cols: (usize, usize), out: &mut [f32]) {
    let (first, end) = cols;
    let width = end - first;
    let mut col = first;
    while col + TILE_COLS <= end {
        let mut r = 0;
        while r < rows {
            let x = &x[r * k..];
            let at = r * width + col - first;
            macro_rules! tile {
                ($n:literal) => {{
                    for (j, acc) in bf16_tile::<$n>(x, k, w, n, col).iter().enumerate() {
                        out[at + j * width..at + j * width + TILE_COLS].copy_from_slice(acc);
                    }
                    r += $n;
                }};
            }
            match rows - r {
                1 => tile!(1),
                2 => tile!(2),
                3 => tile!(3),
                _ => tile!(4),
            }
        }
        col += TILE_COLS;
    }
    // The last columns, fewer than a tile.
    for r in 0..rows {
        for c in col..end {
            let mut s = 0f32;
            for i in 0..k {
                s = x[r * k + i].mul_add(bf16_to_f32(w[i * n + c]), s);
            }
            out[r * width + c - first] = s;
        }
    }
}

simd_kernel! {
    /// `out = x · w[:, cols]` for rows `x` (`rows × k`, row-major) and a bf16 matrix `w`
    /// (`k × n`, row-major, as its bits), `out` being `rows × (cols.1 − cols.0)` row-major; the
    /// products are accumulated in f32.
    pub fn bf16_matmul_rows(x: &[f32], rows: usize, k: usize, w: &[u16], n: usize, cols: (usize, usize), out: &mut [f32]) {
        assert!(x.len() >= rows * k && w.len() >= k * n && cols.0 <= cols.1 && cols.1 <= n);
        assert!(out.len() >= rows * (cols.1 - cols.0));
        bf16_matmul_rows_body(x, rows, k, w, n, cols, out)
    }
}

simd_kernel! {
    /// `out[r·n + c] += Σ_i x[r·k + i] · w[i·n + c]` over the rows `i ∈ inner.0..inner.1` of
    /// `w` (`k × n`, row-major), for the `rows` rows of `x` (`rows × k`, row-major) and every
    /// column `c < n`: a few rows' product with a slice of the shared dimension, reading that
    /// slice of `w` once, in the order it is stored.
    pub fn f32_rows_accumulate(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize, inner: (usize, usize), out: &mut [f32]) {
        assert!(x.len() >= rows * k && inner.0 <= inner.1 && inner.1 <= k && w.len() >= k * n);
        assert!(out.len() >= rows * n);
        for i in inner.0..inner.1 {
            let w_row = &w[i * n..(i + 1) * n];
            for r in 0..rows {
                let a = x[r * k + i];
                for (o, &v) in out[r * n..(r + 1) * n].iter_mut().zip(w_row) {
                    *o = a.mul_add(v, *o);
                }
            }
        }
    }
}

simd_kernel! {
    /// RoPE on whole heads of `d` elements (`x`, the tables and `out` of one length, a
    /// multiple of `d`): `out[i] = x[i]·cos[i] + x[j]·sin[i]`, `j` the element half a head away
    /// (`sin` holds rotate-half's sign). With `backward`, its gradient with respect to the input
    /// for the output's gradient `x`: `out[i] = x[i]·cos[i] + x[j]·sin[j]`. Each product is
    /// rounded, then the two summed, as burn's ops do.
    pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], d: usize, backward: bool, out: &mut [f32]) {
        let half = d / 2;
        let heads = x.chunks_exact(d).zip(cos.chunks_exact(d)).zip(sin.chunks_exact(d)).zip(out.chunks_exact_mut(d));
        for (((x, c), s), o) in heads {
            let ((lo, hi), (c_lo, c_hi), (s_lo, s_hi)) = (x.split_at(half), c.split_at(half), s.split_at(half));
            // The other half's term takes this element's sin forward, its own backward.
            let (s_lo, s_hi) = if backward { (s_hi, s_lo) } else { (s_lo, s_hi) };
            let (o_lo, o_hi) = o.split_at_mut(half);
            for i in 0..half {
                o_lo[i] = lo[i] * c_lo[i] + hi[i] * s_lo[i];
                o_hi[i] = hi[i] * c_hi[i] + lo[i] * s_hi[i];
            }
        }
    }
}

/// `Σ_i x[i] · w[i]` over a bf16 row, with [`LANES`] partial sums.
#[inline(always)]
fn bf16_dot(x: &[f32], w: &[u16]) -> f32 {
    let mut acc = [0f32; LANES];
    let (cx, cw) = (x.chunks_exact(LANES), w.chunks_exact(LANES));
    let rest: f32 = cx.remainder().iter().zip(cw.remainder()).map(|(&a, &b)| a * bf16_to_f32(b)).sum();
    for (a, b) in cx.zip(cw) {
        for l in 0..LANES {
            acc[l] = a[l].mul_add(bf16_to_f32(b[l]), acc[l]);
        }
    }
    acc.iter().sum::<f32>() + rest
}

simd_kernel! {
    /// `out = x · w[cols, :]ᵀ` for rows `x` (`rows × k`, row-major) and a bf16 matrix `w`
    /// (`n × k`, row-major, as its bits: an LM head read through its embedding, or the rollout
    /// copy's weights), `out` being `rows × (cols.1 − cols.0)` row-major; the products are
    /// accumulated in f32. Each column's weights are read once, as one contiguous run.
    pub fn bf16_matmul_cols(x: &[f32], rows: usize, k: usize, w: &[u16], cols: (usize, usize), out: &mut [f32]) {
        let width = cols.1 - cols.0;
        assert!(x.len() >= rows * k && w.len() >= cols.1 * k && out.len() >= rows * width);
        for c in cols.0..cols.1 {
            let wrow = &w[c * k..(c + 1) * k];
            for r in 0..rows {
                out[r * width + c - cols.0] = bf16_dot(&x[r * k..(r + 1) * k], wrow);
            }
        }
    }
}
