//! Decoding's attention for one (sequence, KV head): a few query rows (the group's heads, one
//! query each) against every key and value, read in place.
//!
//! A GEMM library packs its operands first. With three or four query rows that packing is
//! most of the work: the keys, read transposed, were copied element by element (15% of a
//! decoding step at 100-token prompts). Here each key and each value row is read once, in the
//! order it is stored, for all the rows at once. Keys and values may be f32 or bf16 (a
//! sampling cache in half precision: half the bytes that decoding's attention waits on),
//! widened in registers; queries, weights and sums are f32.

use crate::{LANES, Level, bf16_to_f32, level};

/// Runs `$body` for each tile of up to four of `rows` rows in turn: `$r` is the tile's first
/// row and `$tile` a constant, its number of rows (the kernels' const generic row counts).
macro_rules! in_row_tiles {
    ($rows:expr, |$r:ident, $tile:ident| $body:expr) => {{
        let rows = $rows;
        let mut $r = 0;
        while $r < rows {
            $r += match rows - $r {
                1 => { const $tile: usize = 1; $body; $tile }
                2 => { const $tile: usize = 2; $body; $tile }
                3 => { const $tile: usize = 3; $body; $tile }
                _ => { const $tile: usize = 4; $body; $tile }
            };
        }
    }};
}

/// A key or value element: f32, or bf16 as its bits.
pub trait KvElement: Copy {
    const BF16: bool;
    fn f32(self) -> f32;
}

impl KvElement for f32 {
    const BF16: bool = false;
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl KvElement for u16 {
    const BF16: bool = true;
    #[inline(always)]
    fn f32(self) -> f32 {
        bf16_to_f32(self)
    }
}

/// The sum of `acc`'s lanes, pairwise (a vector shuffle and add per level).
#[inline(always)]
fn lanes_sum(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// [`query_key_scores`] for `R` rows.
#[inline(always)]
fn scores_tile<const R: usize, E: KvElement>(q: &[f32], q_stride: usize, k: &[E], kv: (usize, usize), d: usize, out: (&mut [f32], usize)) {
    let ((keys, k_stride), (out, out_stride)) = (kv, out);
    let whole = d - d % LANES;
    for j in 0..keys {
        let key = &k[j * k_stride..j * k_stride + d];
        let mut acc = [[0f32; LANES]; R];
        for c in (0..whole).step_by(LANES) {
            let kc: [f32; LANES] = std::array::from_fn(|l| key[c + l].f32());
            for (r, acc) in acc.iter_mut().enumerate() {
                let qc: &[f32; LANES] = q[r * q_stride + c..][..LANES].try_into().expect("a whole chunk");
                for l in 0..LANES {
                    acc[l] = qc[l].mul_add(kc[l], acc[l]);
                }
            }
        }
        for (r, acc) in acc.into_iter().enumerate() {
            let rest: f32 = (whole..d).map(|i| q[r * q_stride + i] * key[i].f32()).sum();
            out[r * out_stride + j] = lanes_sum(acc) + rest;
        }
    }
}

/// [`query_key_scores`] for keys of either element type.
#[inline(always)]
fn scores_body<E: KvElement>(q: &[f32], q_stride: usize, rows: usize, k: &[E], kv: (usize, usize), d: usize, out: (&mut [f32], usize)) {
    let ((keys, k_stride), (out, out_stride)) = (kv, out);
    assert!(rows == 0 || q.len() >= (rows - 1) * q_stride + d);
    assert!(keys == 0 || k.len() >= (keys - 1) * k_stride + d);
    assert!(rows == 0 || (out_stride >= keys && out.len() >= (rows - 1) * out_stride + keys));
    #[cfg(target_arch = "x86_64")]
    if d % LANES == 0 && level() == Level::Avx512 {
        // SAFETY: AVX-512 is there, and the asserts above bound every row the kernel reads
        // and writes.
        unsafe { x86::scores(q, q_stride, rows, k, kv, d, (out, out_stride)) };
        return;
    }
    in_row_tiles!(rows, |r, R| {
        scores_tile::<R, E>(&q[r * q_stride..], q_stride, k, kv, d, (&mut out[r * out_stride..], out_stride))
    });
}

simd_kernel! {
    /// `out.0[r·out.1 + j] = q_r · k_j` for the `rows` rows `q_r = q[r·q_stride..][..d]` and
    /// the keys `k_j = k[j·k_stride..][..d]`, `kv = (keys, k_stride)`. Keys split at a multiple
    /// of four into two calls give the bits of one call.
    pub fn query_key_scores(q: &[f32], q_stride: usize, rows: usize, k: &[f32], kv: (usize, usize), d: usize, out: (&mut [f32], usize)) {
        scores_body(q, q_stride, rows, k, kv, d, out)
    }
}

simd_kernel! {
    /// [`query_key_scores`] for bf16 keys (their bits).
    pub fn query_key_scores_bf16(q: &[f32], q_stride: usize, rows: usize, k: &[u16], kv: (usize, usize), d: usize, out: (&mut [f32], usize)) {
        scores_body(q, q_stride, rows, k, kv, d, out)
    }
}

/// [`weighted_values`] for `R` rows.
#[inline(always)]
fn values_tile<const R: usize, E: KvElement>(p: (&[f32], usize), v: (&[E], (usize, usize)), d: usize, out: (&mut [f32], usize), accumulate: bool) {
    let ((p, p_stride), (v, (keys, v_stride)), (out, out_stride)) = (p, v, out);
    let whole = d - d % LANES;
    // One lane-wide column strip at a time, its sums in registers.
    for c in (0..whole).step_by(LANES) {
        let mut acc = [[0f32; LANES]; R];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc.copy_from_slice(&out[r * out_stride + c..][..LANES]);
            }
        }
        for j in 0..keys {
            let vc: [f32; LANES] = std::array::from_fn(|l| v[j * v_stride + c + l].f32());
            for (r, acc) in acc.iter_mut().enumerate() {
                let pj = p[r * p_stride + j];
                for l in 0..LANES {
                    acc[l] = pj.mul_add(vc[l], acc[l]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            out[r * out_stride + c..][..LANES].copy_from_slice(acc);
        }
    }
    for r in 0..R {
        for i in whole..d {
            let terms = (0..keys).map(|j| p[r * p_stride + j] * v[j * v_stride + i].f32());
            let at = r * out_stride + i;
            out[at] = if accumulate { terms.fold(out[at], |sum, x| sum + x) } else { terms.sum() };
        }
    }
}

/// [`weighted_values`] for values of either element type.
#[inline(always)]
fn values_body<E: KvElement>(p: (&[f32], usize), rows: usize, v: (&[E], (usize, usize)), d: usize, out: (&mut [f32], usize), accumulate: bool) {
    let ((p, p_stride), (v, (keys, v_stride)), (out, out_stride)) = (p, v, out);
    assert!(rows == 0 || (p_stride >= keys && p.len() >= (rows - 1) * p_stride + keys));
    assert!(keys == 0 || v.len() >= (keys - 1) * v_stride + d);
    assert!(rows == 0 || out.len() >= (rows - 1) * out_stride + d);
    #[cfg(target_arch = "x86_64")]
    if d % LANES == 0 && level() == Level::Avx512 {
        // SAFETY: as in `scores_body`.
        unsafe { x86::values((p, p_stride), rows, (v, (keys, v_stride)), d, (out, out_stride), accumulate) };
        return;
    }
    in_row_tiles!(rows, |r, R| {
        let (p, out) = ((&p[r * p_stride..], p_stride), (&mut out[r * out_stride..], out_stride));
        values_tile::<R, E>(p, (v, (keys, v_stride)), d, out, accumulate)
    });
}

simd_kernel! {
    /// `out.0[r·out.1..][..d] (+)= Σ_j p.0[r·p.1 + j] · v_j` for the `rows` rows of weights
    /// and the values `v_j = v.0[j·v_stride..][..d]`, `v.1 = (keys, v_stride)`; with
    /// `accumulate`, the sums go on from `out`'s, so that keys split into two calls give the
    /// bits of one.
    pub fn weighted_values(p: (&[f32], usize), rows: usize, v: (&[f32], (usize, usize)), d: usize, out: (&mut [f32], usize), accumulate: bool) {
        values_body(p, rows, v, d, out, accumulate)
    }
}

simd_kernel! {
    /// [`weighted_values`] for bf16 values (their bits).
    pub fn weighted_values_bf16(p: (&[f32], usize), rows: usize, v: (&[u16], (usize, usize)), d: usize, out: (&mut [f32], usize), accumulate: bool) {
        values_body(p, rows, v, d, out, accumulate)
    }
}

/// The AVX-512 kernels, for heads of whole 16-lane strips: LLVM's own vectorising of the
/// loops above kept the sums on the stack (and took 128-bit registers for the scores), slower
/// than the GEMM they replace.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::KvElement;

    /// 16 elements from `p`, as f32 (bf16 widened: its bits are an f32's upper half).
    #[inline(always)]
    unsafe fn load16<E: KvElement>(p: *const E) -> __m512 {
        unsafe {
            if E::BF16 {
                let bits = _mm256_loadu_si256(p as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16))
            } else {
                _mm512_loadu_ps(p as *const f32)
            }
        }
    }

    /// The lane sums of `a`, `b`, `c`, `d`, in that order: three rounds of shuffles and adds
    /// for four sums, where reducing each register alone takes four rounds for one.
    #[inline(always)]
    unsafe fn sums_of_four([a, b, c, d]: [__m512; 4]) -> __m128 {
        unsafe {
            // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], the same for c and d; then pairs of
            // those: [a, b, c, d] partial sums in each lane; then the four lanes added.
            let ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
            let cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
            let (ab, cd) = (_mm512_castps_pd(ab), _mm512_castps_pd(cd));
            let lanes = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)),
            );
            let high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1));
            let halves = _mm256_add_ps(_mm512_castps512_ps256(lanes), high);
            _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1))
        }
    }

    /// [`super::query_key_scores`] for `R` rows from `q` (AVX-512, `d` a multiple of 16): four
    /// keys at a time, each loaded piece of a key serving every row.
    #[inline(always)]
    unsafe fn scores_tile<const R: usize, E: KvElement>(q: *const f32, q_stride: usize, k: *const E, kv: (usize, usize), d: usize, out: (*mut f32, usize)) {
        let ((keys, k_stride), (out, out_stride)) = (kv, out);
        unsafe {
            let mut j = 0;
            while j + 4 <= keys {
                let mut acc = [[_mm512_setzero_ps(); 4]; R];
                for c in (0..d).step_by(16) {
                    let kc: [__m512; 4] = std::array::from_fn(|i| load16(k.add((j + i) * k_stride + c)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let qc = _mm512_loadu_ps(q.add(r * q_stride + c));
                        for (acc, &kc) in acc.iter_mut().zip(&kc) {
                            *acc = _mm512_fmadd_ps(qc, kc, *acc);
                        }
                    }
                }
                for (r, acc) in acc.into_iter().enumerate() {
                    _mm_storeu_ps(out.add(r * out_stride + j), sums_of_four(acc));
                }
                j += 4;
            }
            for j in j..keys {
                let key = k.add(j * k_stride);
                let mut acc = [_mm512_setzero_ps(); R];
                for c in (0..d).step_by(16) {
                    let kc = load16(key.add(c));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(r * q_stride + c)), kc, *acc);
                    }
                }
                for (r, acc) in acc.into_iter().enumerate() {
                    *out.add(r * out_stride + j) = _mm512_reduce_add_ps(acc);
                }
            }
        }
    }

    /// SAFETY: AVX-512F is there; the slices hold every row the shapes say.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores<E: KvElement>(q: &[f32], q_stride: usize, rows: usize, k: &[E], kv: (usize, usize), d: usize, out: (&mut [f32], usize)) {
        let (q, k, (out, out_stride)) = (q.as_ptr(), k.as_ptr(), (out.0.as_mut_ptr(), out.1));
        // SAFETY: forwarded from the caller: each tile's rows are within the slices.
        in_row_tiles!(rows, |r, R| unsafe {
            scores_tile::<R, E>(q.add(r * q_stride), q_stride, k, kv, d, (out.add(r * out_stride), out_stride))
        });
    }

    /// Where a tile's values go: `(out, out_stride)`, and whether its sums go on from what
    /// `out` holds.
    #[derive(Clone, Copy)]
    struct Dest {
        out: *mut f32,
        stride: usize,
        accumulate: bool,
    }

    /// [`super::weighted_values`] for `R` rows and a strip of `S` × 16 columns from `c`; the
    /// weights `p = (pointer, row stride)`, the values `kv = (keys, v_stride)`.
    #[inline(always)]
    unsafe fn values_strip<const R: usize, const S: usize, E: KvElement>(
        p: (*const f32, usize),
        kv: (usize, usize),
        v: *const E,
        c: usize,
        dest: Dest,
    ) {
        let ((p, p_stride), (keys, v_stride)) = (p, kv);
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); S]; R];
            if dest.accumulate {
                for (r, acc) in acc.iter_mut().enumerate() {
                    for (s, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_loadu_ps(dest.out.add(r * dest.stride + c + 16 * s));
                    }
                }
            }
            for j in 0..keys {
                let row = v.add(j * v_stride + c);
                let mut vs = [_mm512_setzero_ps(); S];
                for (s, vs) in vs.iter_mut().enumerate() {
                    *vs = load16(row.add(16 * s));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let pj = _mm512_set1_ps(*p.add(r * p_stride + j));
                    for (acc, &vs) in acc.iter_mut().zip(&vs) {
                        *acc = _mm512_fmadd_ps(pj, vs, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (s, &acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(dest.out.add(r * dest.stride + c + 16 * s), acc);
                }
            }
        }
    }

    /// [`values_strip`] over every strip of `d` columns: four registers a row where they fit
    /// (a 64- or 128-wide head: 16 sums in registers for four rows), one where they do not.
    #[inline(always)]
    unsafe fn values_tile<const R: usize, E: KvElement>(p: (*const f32, usize), kv: (usize, usize), v: *const E, d: usize, dest: Dest) {
        let mut c = 0;
        unsafe {
            while c + 64 <= d {
                values_strip::<R, 4, E>(p, kv, v, c, dest);
                c += 64;
            }
            while c < d {
                values_strip::<R, 1, E>(p, kv, v, c, dest);
                c += 16;
            }
        }
    }

    /// SAFETY: AVX-512F is there; the slices hold every row the shapes say.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn values<E: KvElement>(p: (&[f32], usize), rows: usize, v: (&[E], (usize, usize)), d: usize, out: (&mut [f32], usize), accumulate: bool) {
        let ((p, p_stride), (v, kv), (out, stride)) = ((p.0.as_ptr(), p.1), (v.0.as_ptr(), v.1), (out.0.as_mut_ptr(), out.1));
        // SAFETY: forwarded from the caller: each tile's rows are within the slices.
        in_row_tiles!(rows, |r, R| unsafe {
            let dest = Dest { out: out.add(r * stride), stride, accumulate };
            values_tile::<R, E>((p.add(r * p_stride), p_stride), kv, v, d, dest)
        });
    }
}
