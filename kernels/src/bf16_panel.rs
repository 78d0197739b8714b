//! Products of bf16 matrices through AVX512-BF16's `vdpbf16ps`, the second operand packed in
//! panels: each output row's sums stay in registers across 48 columns, so no sum is ever
//! reduced across a register's lanes.
//!
//! `vdpbf16ps` adds, in each of 16 f32 lanes, the products of one pair of bf16 numbers from
//! each operand. Here a lane is an output column: the second operand is packed so that a
//! 64-byte load holds, for 16 columns, the pair of elements `2p, 2p + 1` of the shared
//! dimension ([`pack_panels`]'s layout), and the first operand's pair `2p, 2p + 1` of a row is
//! one 32-bit word, broadcast to every lane. A tile of 8 rows × 48 columns keeps 24 registers
//! of sums; each step of the shared dimension loads 3 registers of the panel and 8 words of
//! the rows for 24 instructions. [`super::bf16_dot`]'s tiles instead reduce each output's 16
//! partial sums at the end, which costs about as much as 3 steps of the shared dimension per
//! tile and makes short shared dimensions (192, 341) slow.

/// Columns of a panel: three registers of 16 f32 sums.
pub const PANEL_COLS: usize = 48;

/// Words (`u32`) a panel-packed operand of `pairs` pairs of rows and `cols` columns takes:
/// whole panels of [`PANEL_COLS`] columns, the last one padded with zeros.
pub fn packed_len(pairs: usize, cols: usize) -> usize {
    cols.div_ceil(PANEL_COLS) * PANEL_COLS * pairs
}

/// `out[r·out_stride + c] (+)= Σ_p Σ_{h∈0,1} a_h(r, p) · b_h(p, c)` for rows `r < rows` and
/// columns `c < cols`, where
/// - `a(r, p)` is the word `a[r·a_row + p·a_pair]`, two bf16 numbers (the low half first);
/// - `b` is packed in panels ([`packed_len`]): the word for pair `p` and column `c` sits at
///   `(c / 48)·48·pairs + p·48 + c % 48`.
///
/// Written when `add` is false, added to `out` when true; with `round`, what is stored is
/// rounded to the nearest bf16 (ties to even, kept in f32) on its way out of the registers.
/// Products are exact in f32 and the sums are f32 sums in the order of `p`; subnormal inputs
/// and results count as zero (the instructions' fixed DAZ/FTZ).
///
/// # Panics
/// On a CPU without the instructions ([`super::bf16_dot_instructions`]), or when a slice is
/// shorter than the shapes say.
#[allow(clippy::too_many_arguments)]
pub fn bf16_panel_products(
    a: &[u32],
    (a_row, a_pair): (usize, usize),
    rows: usize,
    pairs: usize,
    b: &[u32],
    cols: usize,
    out: &mut [f32],
    out_stride: usize,
    add: bool,
    round: bool,
) {
    assert!(super::bf16_dot_instructions(), "bf16_panel_products needs AVX512-BF16; ask bf16_dot_instructions first");
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(out_stride >= cols && out.len() >= (rows - 1) * out_stride + cols, "out is shorter than rows × columns");
    // SAFETY: `out` holds every element written (asserted above), and the borrow is exclusive.
    unsafe { bf16_panel_products_to(a, (a_row, a_pair), rows, pairs, b, cols, out.as_mut_ptr(), out_stride, add, round) }
}

/// [`bf16_panel_products`] storing through a pointer: for tasks that each write their own
/// columns of one row-major output, which safe slices cannot split between them.
///
/// # Safety
/// `out` must be valid for reads and writes of `out[r·out_stride + c]` for `r < rows` and
/// `c < cols`, with `out_stride ≥ cols`, must not overlap `a` or `b`, and nothing else may
/// access those elements during the call. They may be uninitialised when `add` is false (then
/// they are only written), not when it is true. Elements between them are not touched.
///
/// # Panics
/// As [`bf16_panel_products`], for `a` and `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn bf16_panel_products_to(
    a: &[u32],
    (a_row, a_pair): (usize, usize),
    rows: usize,
    pairs: usize,
    b: &[u32],
    cols: usize,
    out: *mut f32,
    out_stride: usize,
    add: bool,
    round: bool,
) {
    assert!(super::bf16_dot_instructions(), "bf16_panel_products needs AVX512-BF16; ask bf16_dot_instructions first");
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(out_stride >= cols, "out's rows are at least cols apart");
    if pairs == 0 {
        if !add {
            // SAFETY: the caller's contract covers these elements (written, never read).
            (0..rows).for_each(|r| unsafe { std::ptr::write_bytes(out.add(r * out_stride), 0, cols) });
        }
        return;
    }
    let last = (rows - 1) * a_row + (pairs - 1) * a_pair;
    assert!(a.len() > last, "a is shorter than its rows and pairs");
    assert!(b.len() >= packed_len(pairs, cols), "b is shorter than its packed panels");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the instructions are there, every index read is inside the slices (asserted
    // above), and what is stored is the caller's (the last panel's columns past `cols` are
    // stored with a mask).
    unsafe {
        x86::products(a, (a_row, a_pair), rows, pairs, b, cols, out, out_stride, (add, round))
    }
}

/// Packs panels `panels.0..panels.1` of the operand whose element `(i, c)` (`i` along the
/// shared dimension, `i < shared`; `c < cols`) is the bf16 `src[i·strides.0 + c·strides.1]`
/// into `out` (those panels' words, [`packed_len`]'s layout), zeros past `shared` and `cols`.
///
/// # Panics
/// When `out` does not hold the panels, or an element is outside `src`.
pub fn pack_panels(
    src: &[u16],
    strides: (usize, usize),
    (shared, cols): (usize, usize),
    panels: (usize, usize),
    out: &mut [u32],
) {
    let pairs = shared.div_ceil(2);
    assert_eq!(out.len(), (panels.1 - panels.0) * PANEL_COLS * pairs, "out holds the panels");
    if pairs == 0 {
        return;
    }
    if cols > 0 {
        assert!(src.len() > (shared - 1) * strides.0 + (cols - 1) * strides.1, "src holds the operand");
    }
    let get = |i: usize, c: usize| if i < shared { src[i * strides.0 + c * strides.1] as u32 } else { 0 };
    for (panel, out) in (panels.0..panels.1).zip(out.chunks_exact_mut(PANEL_COLS * pairs)) {
        let first = panel * PANEL_COLS;
        let width = cols.saturating_sub(first).min(PANEL_COLS);
        for (p, words) in out.chunks_exact_mut(PANEL_COLS).enumerate() {
            let (lo, hi) = (2 * p, 2 * p + 1);
            if strides.1 == 1 && hi < shared {
                // Columns along memory: two runs of a row pair, interleaved (vectorises).
                let (lo, hi) = (&src[lo * strides.0 + first..][..width], &src[hi * strides.0 + first..][..width]);
                for (word, (&l, &h)) in words.iter_mut().zip(lo.iter().zip(hi)) {
                    *word = l as u32 | (h as u32) << 16;
                }
            } else if strides.0 == 1 && hi < shared {
                // Each pair along memory (a transposed view): one column after the other.
                for (j, word) in words[..width].iter_mut().enumerate() {
                    let at = (first + j) * strides.1 + lo;
                    *word = src[at] as u32 | (src[at + 1] as u32) << 16;
                }
            } else {
                for (j, word) in words[..width].iter_mut().enumerate() {
                    *word = get(lo, first + j) | (get(hi, first + j) << 16);
                }
            }
            words[width..].fill(0);
        }
    }
}

/// The rows `2p, 2p + 1` of a bf16 matrix (`rows` × `cols`, rows `stride` apart) interleaved,
/// for `p` in `pairs.0..pairs.1`: `out[(p − pairs.0)·cols + c]` holds elements `(2p, c)` (low
/// half) and `(2p + 1, c)`, zero past the last row. The panel products read a product's sum
/// over rows (a weight's gradient, `xᵀ · dy`) from `x` laid out so.
///
/// # Panics
/// When a slice is shorter than the shapes say.
pub fn pair_rows(src: &[u16], stride: usize, (rows, cols): (usize, usize), pairs: (usize, usize), out: &mut [u32]) {
    assert_eq!(out.len(), (pairs.1 - pairs.0) * cols, "out holds the pairs");
    for (p, out) in (pairs.0..pairs.1).zip(out.chunks_exact_mut(cols.max(1))) {
        let row = |r: usize| (r < rows).then(|| &src[r * stride..][..cols]);
        match (row(2 * p), row(2 * p + 1)) {
            (Some(lo), Some(hi)) => out.iter_mut().zip(lo.iter().zip(hi)).for_each(|(w, (&l, &h))| {
                *w = l as u32 | (h as u32) << 16;
            }),
            (Some(lo), None) => out.iter_mut().zip(lo).for_each(|(w, &l)| *w = l as u32),
            _ => out.fill(0),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PANEL_COLS;
    use std::arch::x86_64::*;

    /// Rows of a tile.
    const TILE_ROWS: usize = 8;
    /// Pairs at most per block of the shared dimension, the blocks equal: a panel's block (up to
    /// 96 KiB) and a task's rows (up to 256 KiB) stay in L2 while every tile of the task reads
    /// them, and a shared dimension of up to 1,024 elements takes one block, its sums written
    /// once (more, as 1,536 in two blocks of 768, adds the later blocks to the output).
    const PAIR_BLOCK: usize = 512;

    #[inline(always)]
    unsafe fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 64 bytes of plain bits.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// One tile: `R` rows from `a` against one panel's block `b` (`pairs` × 48 words), into
    /// `out` (the first `width` ≤ 48 columns).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize>(
        a: *const u32,
        (a_row, a_pair): (usize, usize),
        (b, ahead): (*const u32, *const u32),
        pairs: usize,
        out: *mut f32,
        out_stride: usize,
        width: usize,
        (add, round): (bool, bool),
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 3]; R];
            for p in 0..pairs {
                let panel = b.add(p * PANEL_COLS);
                // The next panel's three lines of this pair on their way to the cache: the
                // hardware's prefetcher stops streaming ahead once the tiles after the first
                // read this panel again, and the next one then comes from memory tile-first.
                let next = ahead.add(p * PANEL_COLS) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(next);
                _mm_prefetch::<_MM_HINT_T0>(next.add(64));
                _mm_prefetch::<_MM_HINT_T0>(next.add(128));
                let w = [
                    bh(_mm512_loadu_si512(panel as *const _)),
                    bh(_mm512_loadu_si512(panel.add(16) as *const _)),
                    bh(_mm512_loadu_si512(panel.add(32) as *const _)),
                ];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = bh(_mm512_set1_epi32(*a.add(r * a_row + p * a_pair) as i32));
                    for (acc, w) in acc.iter_mut().zip(w) {
                        *acc = _mm512_dpbf16_ps(*acc, x, w);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let o = out.add(r * out_stride);
                for (j, &acc) in acc.iter().enumerate() {
                    let left = width.saturating_sub(16 * j).min(16);
                    if left == 0 {
                        break;
                    }
                    let mask = if left == 16 { !0 } else { ((1u32 << left) - 1) as __mmask16 };
                    let o = o.add(16 * j);
                    let v = if add { _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), acc) } else { acc };
                    // `vcvtneps2bf16` rounds to nearest even (NaN stays NaN), then back to f32.
                    let v = if round {
                        let bits = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v));
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
                    } else {
                        v
                    };
                    _mm512_mask_storeu_ps(o, mask, v);
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn products(
        a: &[u32],
        (a_row, a_pair): (usize, usize),
        rows: usize,
        pairs: usize,
        b: &[u32],
        cols: usize,
        out: *mut f32,
        out_stride: usize,
        (add, round): (bool, bool),
    ) {
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let block = pairs.div_ceil(pairs.div_ceil(PAIR_BLOCK));
        for first in (0..pairs).step_by(block) {
            let len = (pairs - first).min(block);
            // Earlier blocks' sums added, the last block's rounded.
            let store = (add || first > 0, round && first + len == pairs);
            let panels = cols.div_ceil(PANEL_COLS);
            for panel in 0..panels {
                let c = panel * PANEL_COLS;
                let width = (cols - c).min(PANEL_COLS);
                // SAFETY: inside the panels (the caller's asserts), the next one's too if any.
                let b = unsafe { b.add(c * pairs + first * PANEL_COLS) };
                let next = if panel + 1 < panels { unsafe { b.add(PANEL_COLS * pairs) } } else { b };
                let mut r = 0;
                while r < rows {
                    let rr = (rows - r).min(TILE_ROWS);
                    // SAFETY: rows r..r + rr, pairs first..first + len, columns c..c + width
                    // are inside (the caller's asserts).
                    unsafe {
                        let a = a.add(r * a_row + first * a_pair);
                        let out = out.add(r * out_stride + c);
                        let s = (a_row, a_pair);
                        // The first of several tiles reads this panel from memory, streamed by
                        // the hardware; the next one's prefetches would slow it down.
                        let ahead = if r == 0 && rows > TILE_ROWS { b } else { next };
                        tile_of_rows!(rr, tile(a, s, (b, ahead), len, out, out_stride, width, store))
                    }
                    r += rr;
                }
            }
        }
    }
}
