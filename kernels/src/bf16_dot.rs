//! Products of bf16 matrices through AVX512-BF16's `vdpbf16ps`, which multiplies 32 pairs of
//! bf16 numbers and adds each pair's two products to one of 16 f32 sums in one instruction:
//! twice the multiply-adds of an f32 FMA, at half the bytes read.
//!
//! The kernel serves the products whose operands are read as they are stored: `a · btᵀ` with
//! both operands' rows running along the shared dimension (a linear layer's inputs times its
//! weights stored `[out, in]`, the LM head read through its embedding). Each output is a
//! register of 16 partial sums over its two rows, reduced at the end. Up to 16 rows
//! (decoding), four rows at a time read the weights one column after the other, one
//! sequential stream; more rows (a prefill) take tiles of up to 4 rows × 8 columns, up to 24
//! sums in registers, each loaded piece of `a` and `bt` serving several of them. Nothing is
//! packed or copied: measured on a 2-core AMD EPYC (Zen 4), the tiles ran 1.6–2.3× the f32
//! GEMM's speed from 32 to 1,024 rows. Training packs its operands once per product and
//! takes [`super::bf16_panel`]'s kernel, whose sums need no reduction at the end (on a Zen 5
//! 1.3–1.9× these tiles' speed, more where the shared dimension is short).
//!
//! Rounding: products of bf16 numbers are exact in f32; the sums are f32 sums in another
//! order than an FMA loop's, and subnormal inputs and results count as zero (the
//! instruction's fixed DAZ/FTZ), as in every library that uses it.

/// Whether this CPU has `vdpbf16ps` (AVX512-BF16, with AVX512-BW for the masked loads of a
/// row's last elements), and [`super::level`] is not capped below AVX-512:
/// [`bf16_dot_products`] runs only where it is.
pub fn bf16_dot_instructions() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            super::level() == super::Level::Avx512
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// `out[r·out_stride + c − cols.0] = Σ_i a[r·a_stride + i] · bt[c·k + i]` for the rows
/// `r < rows` of `a` and the columns `c ∈ cols.0..cols.1`, that is the rows of `bt`
/// (`a`: bf16 bits, `rows × k` with rows `a_stride` apart; `bt`: bf16 bits, `n × k`
/// row-major); the products accumulated in f32.
///
/// # Panics
/// On a CPU without the instructions ([`bf16_dot_instructions`]), or when a slice is shorter
/// than the shapes say.
#[allow(clippy::too_many_arguments)]
pub fn bf16_dot_products(
    a: &[u16],
    a_stride: usize,
    rows: usize,
    k: usize,
    bt: &[u16],
    cols: (usize, usize),
    out: &mut [f32],
    out_stride: usize,
) {
    assert!(bf16_dot_instructions(), "bf16_dot_products needs AVX512-BF16; ask bf16_dot_instructions first");
    let width = cols.1.saturating_sub(cols.0);
    if rows == 0 || width == 0 {
        return;
    }
    assert!(a_stride >= k && a.len() >= (rows - 1) * a_stride + k, "a is shorter than rows × k");
    assert!(bt.len() >= cols.1 * k, "bt is shorter than its columns × k");
    assert!(out_stride >= width && out.len() >= (rows - 1) * out_stride + width, "out is shorter than rows × columns");
    if k == 0 {
        out.chunks_mut(out_stride).take(rows).for_each(|row| row[..width].fill(0.0));
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the instructions are there (asserted above) and every index the tiles read or
    // write is inside the slices (asserted above: rows < `rows`, columns < `cols.1`, elements
    // < `k`, the last 32 elements of a row read with a mask).
    unsafe {
        x86::products(a, a_stride, rows, k, bt, cols, out, out_stride)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows per tile, and the columns of a tile by how many rows it has: about 16 to 24 sums
    /// in registers, and never fewer than 8 independent ones (the instruction's latency).
    const TILE_ROWS: usize = 4;
    /// Elements of the shared dimension per block: 256 columns' worth (a caller's task) is
    /// 512 KiB, within L2.
    const K_BLOCK: usize = 1024;
    /// Rows up to which [`stream`] runs (four rows at a time) instead of the tiles: measured
    /// on the EPYC above, streaming was faster up to 8 rows, the tiles from 32.
    const STREAM_ROWS: usize = 16;
    const fn tile_cols(rows: usize) -> usize {
        match rows {
            1 | 2 => 8,
            3 => 6,
            _ => 4,
        }
    }

    #[inline(always)]
    unsafe fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// One tile: `R` rows of `a` from `a`, `C` rows of `bt` from `bt`, into `out` (rows
    /// `out_stride` apart).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // indices into two arrays at once
    unsafe fn tile<const R: usize, const C: usize>(
        a: *const u16,
        a_stride: usize,
        (bt, bt_stride): (*const u16, usize),
        k: usize,
        out: *mut f32,
        out_stride: usize,
        add: bool,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            let mut i = 0;
            while i + 32 <= k {
                let mut b = [bh(_mm512_setzero_si512()); C];
                for c in 0..C {
                    b[c] = bh(_mm512_loadu_si512(bt.add(c * bt_stride + i) as *const _));
                }
                for r in 0..R {
                    let x = bh(_mm512_loadu_si512(a.add(r * a_stride + i) as *const _));
                    for c in 0..C {
                        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, b[c]);
                    }
                }
                i += 32;
            }
            if i < k {
                // The row's last elements, the rest of the register zero.
                let mask = ((1u64 << (k - i)) - 1) as __mmask32;
                let mut b = [bh(_mm512_setzero_si512()); C];
                for c in 0..C {
                    b[c] = bh(_mm512_maskz_loadu_epi16(mask, bt.add(c * bt_stride + i) as *const i16));
                }
                for r in 0..R {
                    let x = bh(_mm512_maskz_loadu_epi16(mask, a.add(r * a_stride + i) as *const i16));
                    for c in 0..C {
                        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, b[c]);
                    }
                }
            }
            if R == 4 && C == 4 {
                // The full tile's 16 sums reduced together (a third of the instructions of 16
                // reductions one by one), row r's four in lane r.
                let sums = sums_of_16(std::array::from_fn(|j| acc[j / 4][j % 4]));
                let rows = [
                    _mm512_extractf32x4_ps::<0>(sums),
                    _mm512_extractf32x4_ps::<1>(sums),
                    _mm512_extractf32x4_ps::<2>(sums),
                    _mm512_extractf32x4_ps::<3>(sums),
                ];
                for (r, row) in rows.into_iter().enumerate() {
                    let o = out.add(r * out_stride);
                    _mm_storeu_ps(o, if add { _mm_add_ps(_mm_loadu_ps(o), row) } else { row });
                }
                return;
            }
            for (r, acc) in acc.iter().enumerate() {
                for (c, acc) in acc.iter().enumerate() {
                    let o = out.add(r * out_stride + c);
                    *o = if add { *o } else { 0.0 } + _mm512_reduce_add_ps(*acc);
                }
            }
        }
    }

    /// The sums of 16 registers' lanes, register j's in lane j: pairs added after interleaving
    /// them, then quadruples, then 128-bit lanes twice (45 instructions).
    #[inline(always)]
    unsafe fn sums_of_16(v: [__m512; 16]) -> __m512 {
        unsafe {
            // Per 128-bit lane: [v0 of its 0+2, v1 of 0+2, v0 of 1+3, v1 of 1+3].
            let pairs: [__m512; 8] = std::array::from_fn(|j| {
                _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]))
            });
            // Per 128-bit lane: the lane's sums of v(4j) .. v(4j + 3).
            let quads: [__m512; 4] = std::array::from_fn(|j| {
                let (a, b) = (pairs[2 * j], pairs[2 * j + 1]);
                _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(a, b), _mm512_shuffle_ps::<0b11_10_11_10>(a, b))
            });
            let halves = |a: __m512, b: __m512| {
                _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b))
            };
            let (low, high) = (halves(quads[0], quads[1]), halves(quads[2], quads[3]));
            halves(low, high)
        }
    }

    /// `R` rows (one or two) against the columns `cols`, one column after the other: the
    /// weights are then read as one sequential stream, which is what a few rows wait on
    /// (tiles of several columns read several streams at once, and decoding one row ran at
    /// half this speed). Two sums per output hide the instruction's latency.
    #[inline(always)]
    unsafe fn stream<const R: usize>(
        a: *const u16,
        a_stride: usize,
        (bt, bt_stride): (*const u16, usize),
        k: usize,
        cols: usize,
        out: *mut f32,
        out_stride: usize,
        add: bool,
    ) {
        unsafe {
            for c in 0..cols {
                let w = bt.add(c * bt_stride);
                let mut acc = [[_mm512_setzero_ps(); 2]; R];
                let mut i = 0;
                while i + 64 <= k {
                    let (w0, w1) = (
                        bh(_mm512_loadu_si512(w.add(i) as *const _)),
                        bh(_mm512_loadu_si512(w.add(i + 32) as *const _)),
                    );
                    for r in 0..R {
                        let x = a.add(r * a_stride + i);
                        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], bh(_mm512_loadu_si512(x as *const _)), w0);
                        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], bh(_mm512_loadu_si512(x.add(32) as *const _)), w1);
                    }
                    i += 64;
                }
                while i < k {
                    let mask = if k - i >= 32 { !0 } else { ((1u64 << (k - i)) - 1) as __mmask32 };
                    let w0 = bh(_mm512_maskz_loadu_epi16(mask, w.add(i) as *const i16));
                    for r in 0..R {
                        let x = bh(_mm512_maskz_loadu_epi16(mask, a.add(r * a_stride + i) as *const i16));
                        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
                    }
                    i += 32;
                }
                for r in 0..R {
                    let o = out.add(r * out_stride + c);
                    *o = if add { *o } else { 0.0 } + _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn products(
        a: &[u16],
        a_stride: usize,
        rows: usize,
        k: usize,
        bt: &[u16],
        cols: (usize, usize),
        out: &mut [f32],
        out_stride: usize,
    ) {
        // The shared dimension in blocks (an LM head's gradient sums over the vocabulary): a
        // block of a task's columns stays in L2 while each group of rows reads it.
        for first in (0..k).step_by(K_BLOCK) {
            let len = (k - first).min(K_BLOCK);
            // SAFETY: elements first..first + len of every row are inside (the caller's asserts).
            let (a, bt) = unsafe { (a.as_ptr().add(first), (bt.as_ptr().add(cols.0 * k + first), k)) };
            // SAFETY: as for this block.
            unsafe { block(a, a_stride, rows, bt, len, cols.1 - cols.0, out.as_mut_ptr(), out_stride, first > 0) };
        }
    }

    /// [`products`] over one block of the shared dimension: `len` elements of each row from
    /// `a` and `bt`, added to `out` when `add`, else written.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        a: *const u16,
        a_stride: usize,
        rows: usize,
        bt: (*const u16, usize),
        len: usize,
        width: usize,
        out: *mut f32,
        out_stride: usize,
        add: bool,
    ) {
        if rows <= STREAM_ROWS {
            for r in (0..rows).step_by(TILE_ROWS) {
                // SAFETY: rows r..r + 4 (or fewer) and the columns are inside (the caller's
                // asserts).
                unsafe {
                    let (a, out) = (a.add(r * a_stride), out.add(r * out_stride));
                    match rows - r {
                        1 => stream::<1>(a, a_stride, bt, len, width, out, out_stride, add),
                        2 => stream::<2>(a, a_stride, bt, len, width, out, out_stride, add),
                        3 => stream::<3>(a, a_stride, bt, len, width, out, out_stride, add),
                        _ => stream::<4>(a, a_stride, bt, len, width, out, out_stride, add),
                    }
                }
            }
            return;
        }
        // Rows outside, columns inside: a tile's rows of `a` stay in L1 while the columns'
        // weights stream through, from L2 when the caller keeps a task's columns few.
        let mut r = 0;
        while r < rows {
            let rr = (rows - r).min(TILE_ROWS);
            let mut c = 0;
            while c < width {
                let cc = (width - c).min(tile_cols(rr));
                // SAFETY: rows r..r + rr and columns c..c + cc are inside (the caller's asserts).
                unsafe {
                    let (a, bt) = (a.add(r * a_stride), (bt.0.add(c * bt.1), bt.1));
                    let out = out.add(r * out_stride + c);
                    macro_rules! tile {
                        ($r:literal, $c:literal) => {
                            tile::<$r, $c>(a, a_stride, bt, len, out, out_stride, add)
                        };
                    }
                    macro_rules! by_cols {
                        ($r:literal) => {
                            match cc {
                                1 => tile!($r, 1),
                                2 => tile!($r, 2),
                                3 => tile!($r, 3),
                                4 => tile!($r, 4),
                                5 => tile!($r, 5),
                                6 => tile!($r, 6),
                                7 => tile!($r, 7),
                                _ => tile!($r, 8),
                            }
                        };
                    }
                    match rr {
                        1 => by_cols!(1),
                        2 => by_cols!(2),
                        3 => by_cols!(3),
                        _ => by_cols!(4),
                    }
                }
                c += cc;
            }
            r += rr;
        }
    }
}
