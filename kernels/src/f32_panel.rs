//! Products of f32 matrices through FMAs, the second operand read in panels of 48 columns: a
//! tile of rows × columns keeps its sums in registers across the whole shared dimension, and
//! each step of it loads the panel's registers once and broadcasts one element of each row
//! against them. With AVX-512 a tile is 8 rows × the whole panel (24 registers of 16 sums),
//! the bf16 panels' tiles (`bf16_panel.rs`) with one f32 a lane instead of a pair of bf16
//! numbers; with AVX2, 4 rows × half a panel (12 registers of 8 sums, of AVX2's 16).
//!
//! The panel is read where it lies, as long as each of its rows is 48 consecutive floats: a
//! row-major matrix in place (a weight `[k, n]`), or a copy packed by [`pack_f32_panels`] from
//! any other layout (a transposed weight), which decoding keeps for every step. Measured on one
//! core of an AMD EPYC Zen 5 at decoding's shapes (32–64 rows by SmolLM2-135M's weights):
//! with AVX-512, 250–285 GFLOP/s with the weights in cache, `gemm`'s AVX-512 kernels' speed;
//! with 40 weights read from memory in turn, 216–248 from packed panels and 151–193 from
//! weights in place. With AVX2 from packed panels read from memory, 111–119 GFLOP/s at 32–64
//! rows against `gemm`'s AVX2 kernels' 70–100 (which pack each weight again), 70 against 32 at
//! 8 rows, and 87 against 33 for the LM head (49,152 columns).

use super::PANEL_COLS;

/// Whether the CPU has the instructions of [`f32_panel_products_to`] (AVX-512F, or AVX2 and
/// FMA), as far as [`super::level`] allows.
pub fn f32_panel_instructions() -> bool {
    super::level() >= super::Level::Avx2
}

/// Where the panels of a product's second operand `b` (`shared × cols`) lie: element `(i, c)`
/// at `(c / 48)·panel + i·row + c % 48` of its slice.
#[derive(Clone, Copy, Debug)]
pub struct Panels {
    /// Elements from one step of the shared dimension to the next within a panel.
    pub row: usize,
    /// Elements from one panel to the next.
    pub panel: usize,
}

impl Panels {
    /// A row-major `[shared, cols]` matrix whose rows are `row` elements apart, read in place.
    pub fn in_place(row: usize) -> Self {
        Panels { row, panel: PANEL_COLS }
    }

    /// The layout [`pack_f32_panels`] writes for a shared dimension of `shared` elements.
    pub fn packed(shared: usize) -> Self {
        Panels { row: PANEL_COLS, panel: PANEL_COLS * shared }
    }
}

/// `out[r·out_stride + c] (+)= Σ_i a(r, i) · b(i, c)` for rows `r < rows` and columns `c <
/// cols`, where `a(r, i)` is `a[r·a_row + i·a_shared]` and `b(i, c)` lies as `panels` says;
/// written when `add` is false, added to `out` when true. The sums are f32 FMAs in the order
/// of `i`, in blocks of at most 512 (a longer shared dimension in equal blocks, each later
/// block's sums added to the earlier ones'): the same bits with AVX-512 and with AVX2.
///
/// # Safety
/// `out` must be valid for reads and writes of `out[r·out_stride + c]` for `r < rows` and
/// `c < cols`, with `out_stride ≥ cols`, must not overlap `a` or `b`, and nothing else may
/// access those elements during the call. They may be uninitialised when `add` is false (then
/// they are only written), not when it is true. Elements between them are not touched.
///
/// # Panics
/// On a CPU without the instructions ([`f32_panel_instructions`]), or when `a` or `b` is
/// shorter than the shapes say.
#[allow(clippy::too_many_arguments)]
pub unsafe fn f32_panel_products_to(
    a: &[f32],
    (a_row, a_shared): (usize, usize),
    rows: usize,
    shared: usize,
    (b, panels): (&[f32], Panels),
    cols: usize,
    out: *mut f32,
    out_stride: usize,
    add: bool,
) {
    assert!(f32_panel_instructions(), "f32_panel_products needs AVX2; ask f32_panel_instructions first");
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(out_stride >= cols, "out's rows are at least cols apart");
    assert!(cols <= PANEL_COLS || panels.panel >= PANEL_COLS, "panels do not overlap");
    if shared == 0 {
        if !add {
            // SAFETY: the caller's contract covers these elements (written, never read).
            (0..rows).for_each(|r| unsafe { std::ptr::write_bytes(out.add(r * out_stride), 0, cols) });
        }
        return;
    }
    let inside = |len: usize, terms: [(usize, usize); 3]| {
        // Checked: strides so large that the offset overflows must fail the assert, not wrap.
        let last = terms.iter().try_fold(0usize, |sum, &(n, stride)| sum.checked_add(n.checked_mul(stride)?));
        last.is_some_and(|last| len > last)
    };
    assert!(inside(a.len(), [(rows - 1, a_row), (shared - 1, a_shared), (0, 0)]), "a is shorter than its rows");
    let b_terms = [((cols - 1) / PANEL_COLS, panels.panel), (shared - 1, panels.row), ((cols - 1) % PANEL_COLS, 1)];
    assert!(inside(b.len(), b_terms), "b is shorter than its panels");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the instructions are there (`level`), and every element read is inside the
    // slices: the kernels load a panel's columns past `cols` with a mask, and prefetches never
    // fault.
    unsafe {
        let args = (a, (a_row, a_shared), rows, shared, (b, panels), cols, out, out_stride, add);
        match super::level() {
            super::Level::Avx512 => x86::products_avx512(args),
            _ => x86::products_avx2(args),
        }
    }
}

/// Packs panels `panels.0..panels.1` of the operand whose element `(i, c)` (`i < shared`, `c <
/// cols`) is `src[i·strides.0 + c·strides.1]` into `out`, in [`Panels::packed`]'s layout, zeros
/// past `cols`: for an operand whose rows are not consecutive floats (a transposed weight).
///
/// # Panics
/// When `out` does not hold the panels, or an element is outside `src`.
pub fn pack_f32_panels(
    src: &[f32],
    strides: (usize, usize),
    (shared, cols): (usize, usize),
    panels: (usize, usize),
    out: &mut [f32],
) {
    assert_eq!(out.len(), (panels.1 - panels.0) * PANEL_COLS * shared, "out holds the panels");
    if shared == 0 {
        return;
    }
    if cols > 0 {
        assert!(src.len() > (shared - 1) * strides.0 + (cols - 1) * strides.1, "src holds the operand");
    }
    for (panel, out) in (panels.0..panels.1).zip(out.chunks_exact_mut(PANEL_COLS * shared)) {
        let first = panel * PANEL_COLS;
        let width = cols.saturating_sub(first).min(PANEL_COLS);
        if strides.1 == 1 && width > 0 {
            for (i, row) in out.chunks_exact_mut(PANEL_COLS).enumerate() {
                row[..width].copy_from_slice(&src[i * strides.0 + first..][..width]);
                row[width..].fill(0.0);
            }
            continue;
        }
        // Blocks of 16 steps × 48 columns, each column's 16 read along memory when the operand
        // is transposed (a weight `[n, k]` read as `[k, n]`), written into 3 KiB of `out`.
        for i0 in (0..shared).step_by(16) {
            let steps = (shared - i0).min(16);
            let block = &mut out[i0 * PANEL_COLS..][..steps * PANEL_COLS];
            for j in 0..PANEL_COLS {
                if j >= width {
                    block.iter_mut().skip(j).step_by(PANEL_COLS).for_each(|o| *o = 0.0);
                    continue;
                }
                let at = i0 * strides.0 + (first + j) * strides.1;
                for t in 0..steps {
                    block[t * PANEL_COLS + j] = src[at + t * strides.0];
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{PANEL_COLS, Panels};
    use std::arch::x86_64::*;

    /// [`super::f32_panel_products_to`]'s arguments.
    pub(super) type Args<'a> =
        (&'a [f32], (usize, usize), usize, usize, (&'a [f32], Panels), usize, *mut f32, usize, bool);

    /// Steps of the shared dimension at most per block, the blocks equal: a panel's block (96
    /// KiB) and a task's rows stay in L2 while every tile of the task reads them.
    const SHARED_BLOCK: usize = 512;
    /// Steps of the shared dimension a first tile prefetches ahead of those it multiplies.
    const AHEAD: usize = 12;

    /// What one tile multiplies: its rows of `a` against `width` columns of a panel's block
    /// at `b`, into `out`.
    #[derive(Clone, Copy)]
    struct Tile {
        /// The tile's first row, and the elements from one row (and one step) to the next.
        a: *const f32,
        a_steps: (usize, usize),
        /// The block's first step, the lines prefetched the same way (at `b`: `AHEAD` steps
        /// ahead) and the elements from one step to the next.
        b: *const f32,
        ahead: *const f32,
        row: usize,
        /// Steps of the shared dimension.
        shared: usize,
        out: *mut f32,
        out_stride: usize,
        /// Columns, at most a tile's.
        width: usize,
        /// Whether the sums are added to `out` rather than written.
        add: bool,
    }

    /// One instruction set's tiles, which [`products`] runs over a product's blocks, panels
    /// and rows.
    trait Tiles {
        /// Columns of a tile; a panel holds `PANEL_COLS / COLS` tiles side by side.
        const COLS: usize;
        /// Rows of a whole tile.
        const ROWS: usize;
        /// One tile of `rows` (≤ `ROWS`) rows.
        unsafe fn tile(rows: usize, tile: Tile);
    }

    /// The line of a panel's step `i` to prefetch: `ahead`'s (the next panel's, or later tiles'
    /// lines), or this block's own `AHEAD` steps on where `ahead` is the block. The hardware
    /// stops streaming a panel once later tiles reread it, and does not follow a panel read in
    /// place (48 floats a row, rows apart). Wrapping: a prefetch past the end never faults.
    #[inline(always)]
    fn next_line(b: *const f32, ahead: *const f32, i: usize, row: usize) -> *const i8 {
        let next = if ahead == b { b.wrapping_add((i + AHEAD) * row) } else { ahead.wrapping_add(i * row) };
        next as *const i8
    }

    struct Avx512;

    impl Tiles for Avx512 {
        const COLS: usize = PANEL_COLS;
        const ROWS: usize = 8;

        #[inline(always)]
        unsafe fn tile(rows: usize, tile: Tile) {
            unsafe { tile_of_rows!(rows, tile_512(tile, masks_512(tile.width))) }
        }
    }

    /// The lanes of a panel's three AVX-512 registers inside its first `width` columns.
    fn masks_512(width: usize) -> [__mmask16; 3] {
        std::array::from_fn(|j| {
            let left = width.saturating_sub(16 * j).min(16);
            if left == 16 { !0 } else { ((1u32 << left) - 1) as __mmask16 }
        })
    }

    #[inline(always)]
    unsafe fn tile_512<const R: usize>(tile: Tile, masks: [__mmask16; 3]) {
        let Tile { a, a_steps: (a_row, a_shared), b, ahead, row, shared, out, out_stride, add, .. } = tile;
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 3]; R];
            for i in 0..shared {
                // Wrapping: a last panel read in place may end before its third register, whose
                // lanes past the end the mask leaves unread.
                let panel = b.wrapping_add(i * row);
                let next = next_line(b, ahead, i, row);
                _mm_prefetch::<_MM_HINT_T0>(next);
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(128));
                // Written out rather than `array::from_fn`: a closure has no target features of
                // its own, and these must run inlined in the `target_feature` body.
                let w = [
                    _mm512_maskz_loadu_ps(masks[0], panel),
                    _mm512_maskz_loadu_ps(masks[1], panel.wrapping_add(16)),
                    _mm512_maskz_loadu_ps(masks[2], panel.wrapping_add(32)),
                ];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*a.add(r * a_row + i * a_shared));
                    for (acc, w) in acc.iter_mut().zip(w) {
                        *acc = _mm512_fmadd_ps(x, w, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let o = out.add(r * out_stride);
                for ((j, &acc), mask) in acc.iter().enumerate().zip(masks) {
                    if mask == 0 {
                        break;
                    }
                    let o = o.add(16 * j);
                    let v = if add { _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), acc) } else { acc };
                    _mm512_mask_storeu_ps(o, mask, v);
                }
            }
        }
    }

    /// Half a panel a tile: 4 rows × 24 columns keep 12 of AVX2's 16 registers for sums, 3 for
    /// the panel and one for the broadcast. Measured against 6 rows × 16 columns (`gemm`'s
    /// shape), it reads each row's element once per 24 columns instead of 16: 111–119 against
    /// 104–118 GFLOP/s from packed panels in memory, 70 against 55 at 8 rows.
    struct Avx2;

    impl Tiles for Avx2 {
        const COLS: usize = PANEL_COLS / 2;
        const ROWS: usize = 4;

        #[inline(always)]
        unsafe fn tile(rows: usize, tile: Tile) {
            // A whole tile loads without masks: AVX2's masked loads cost more than plain ones.
            unsafe {
                if tile.width == Self::COLS {
                    tile_of_rows!(at most 4: rows, tile_256<true>(tile))
                } else {
                    tile_of_rows!(at most 4: rows, tile_256<false>(tile))
                }
            }
        }
    }

    /// The lanes of a half panel's three AVX2 registers inside its first `width` columns, all
    /// bits set in a lane that is.
    #[inline(always)]
    unsafe fn masks_256(width: usize) -> [__m256i; 3] {
        unsafe {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let width = width as i32;
            [
                _mm256_cmpgt_epi32(_mm256_set1_epi32(width), lanes),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(width - 8), lanes),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(width - 16), lanes),
            ]
        }
    }

    #[inline(always)]
    unsafe fn tile_256<const R: usize, const WHOLE: bool>(tile: Tile) {
        let Tile { a, a_steps: (a_row, a_shared), b, ahead, row, shared, out, out_stride, width, add } = tile;
        unsafe {
            let masks = masks_256(width);
            let mut acc = [[_mm256_setzero_ps(); 3]; R];
            for i in 0..shared {
                let panel = b.wrapping_add(i * row);
                // 96 bytes: two lines, or three where they straddle both ends of one.
                let next = next_line(b, ahead, i, row);
                _mm_prefetch::<_MM_HINT_T0>(next);
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(95));
                let (p1, p2) = (panel.wrapping_add(8), panel.wrapping_add(16));
                let w = if WHOLE {
                    [_mm256_loadu_ps(panel), _mm256_loadu_ps(p1), _mm256_loadu_ps(p2)]
                } else {
                    [
                        _mm256_maskload_ps(panel, masks[0]),
                        _mm256_maskload_ps(p1, masks[1]),
                        _mm256_maskload_ps(p2, masks[2]),
                    ]
                };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*a.add(r * a_row + i * a_shared));
                    for (acc, w) in acc.iter_mut().zip(w) {
                        *acc = _mm256_fmadd_ps(x, w, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let o = out.add(r * out_stride);
                for (j, (&acc, mask)) in acc.iter().zip(masks).enumerate().take(width.div_ceil(8)) {
                    let o = o.add(8 * j);
                    if WHOLE {
                        _mm256_storeu_ps(o, if add { _mm256_add_ps(_mm256_loadu_ps(o), acc) } else { acc });
                    } else {
                        let v = if add { _mm256_add_ps(_mm256_maskload_ps(o, mask), acc) } else { acc };
                        _mm256_maskstore_ps(o, mask, v);
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn products_avx512(args: Args) {
        unsafe { products::<Avx512>(args) }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn products_avx2(args: Args) {
        unsafe { products::<Avx2>(args) }
    }

    /// The product over blocks of the shared dimension, panels, tiles across a panel and tiles
    /// of rows, in that order.
    #[inline(always)]
    unsafe fn products<T: Tiles>(
        (a, (a_row, a_shared), rows, shared, (b, panels), cols, out, out_stride, add): Args,
    ) {
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let block = shared.div_ceil(shared.div_ceil(SHARED_BLOCK));
        let count = cols.div_ceil(PANEL_COLS);
        for first in (0..shared).step_by(block) {
            let len = (shared - first).min(block);
            // Earlier blocks' sums added.
            let add = add || first > 0;
            for panel in 0..count {
                // SAFETY: inside `b` (the caller's asserts): this panel's block. The next
                // panel's is only prefetched.
                let b = unsafe { b.add(panel * panels.panel + first * panels.row) };
                let next = if panel + 1 < count { b.wrapping_add(panels.panel) } else { b };
                for across in (0..PANEL_COLS).step_by(T::COLS) {
                    let c = panel * PANEL_COLS + across;
                    if c >= cols {
                        break;
                    }
                    // SAFETY: column `c` of this panel is inside `b`, as above.
                    let (b, next) = (unsafe { b.add(across) }, next.wrapping_add(across));
                    let mut r = 0;
                    while r < rows {
                        let rr = (rows - r).min(T::ROWS);
                        // The first of several tiles reads this panel from memory and
                        // prefetches ahead in it (`ahead == b`): the next panel's prefetches
                        // would slow it. So does a lone tile of a panel read in place, which the
                        // hardware streams only when packed.
                        let first_read = if rows > T::ROWS { r == 0 } else { panels.row != PANEL_COLS };
                        let ahead = if first_read { b } else { next };
                        // SAFETY: rows r..r + rr, steps first..first + len, columns c..c + width
                        // (masked past `cols`) are inside (the caller's asserts).
                        unsafe {
                            let a = a.add(r * a_row + first * a_shared);
                            let out = out.add(r * out_stride + c);
                            let width = (cols - c).min(T::COLS);
                            let (a_steps, row, shared) = ((a_row, a_shared), panels.row, len);
                            let tile = Tile { a, a_steps, b, ahead, row, shared, out, out_stride, width, add };
                            T::tile(rr, tile);
                        }
                        r += rr;
                    }
                }
            }
        }
    }
}
