//! Products of f32 matrices through AVX-512 FMAs, the second operand read in panels of 48
//! columns: a tile of 8 output rows × 48 columns keeps its 24 registers of sums across the
//! whole shared dimension, and each step of it loads 3 registers of the panel and broadcasts 8
//! elements of the rows for 24 FMAs: the bf16 panels' tiles (`bf16_panel.rs`), one f32 a lane
//! instead of a pair of bf16 numbers.
//!
//! The panel is read where it lies, as long as each of its rows is 48 consecutive floats: a
//! row-major matrix in place (a weight `[k, n]`), or a copy packed by [`pack_f32_panels`] from
//! any other layout (a transposed weight), which decoding keeps for every step. Measured on one
//! core of an AMD EPYC Zen 5 at decoding's shapes (32–64 rows by SmolLM2-135M's weights):
//! 250–285 GFLOP/s with the weights in cache, `gemm`'s AVX-512 kernels' speed; with 40 weights
//! read from memory in turn, 216–248 from packed panels and 151–193 from weights in place.

use super::PANEL_COLS;

/// Whether the CPU has the instructions of [`f32_panel_products_to`] (AVX-512F).
pub fn f32_panel_instructions() -> bool {
    super::level() == super::Level::Avx512
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
/// block's sums added to the earlier ones').
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
    assert!(f32_panel_instructions(), "f32_panel_products needs AVX-512; ask f32_panel_instructions first");
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
    assert!(a.len() > (rows - 1) * a_row + (shared - 1) * a_shared, "a is shorter than its rows");
    let last = (cols - 1) / PANEL_COLS * panels.panel + (shared - 1) * panels.row + (cols - 1) % PANEL_COLS;
    assert!(b.len() > last, "b is shorter than its panels");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the instructions are there, and every element read is inside the slices: the
    // kernel loads a panel's columns past `cols` with a mask, and prefetches stay inside `b`.
    unsafe {
        x86::products(a, (a_row, a_shared), rows, shared, (b, panels), cols, out, out_stride, add)
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

    /// Rows of a tile.
    const TILE_ROWS: usize = 8;
    /// Steps of the shared dimension at most per block, the blocks equal: a panel's block (96
    /// KiB) and a task's rows stay in L2 while every tile of the task reads them.
    const SHARED_BLOCK: usize = 512;
    /// Steps of the shared dimension a first tile prefetches ahead of those it multiplies.
    const AHEAD: usize = 12;

    /// The lanes of a panel's three registers inside its first `width` columns.
    fn masks(width: usize) -> [__mmask16; 3] {
        std::array::from_fn(|j| {
            let left = width.saturating_sub(16 * j).min(16);
            if left == 16 { !0 } else { ((1u32 << left) - 1) as __mmask16 }
        })
    }

    /// One tile: `R` rows from `a` against one panel's block `b` (`shared` steps, `row` apart),
    /// into `out` (the columns `masks` keeps). `ahead` is prefetched the same way.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize>(
        a: *const f32,
        (a_row, a_shared): (usize, usize),
        (b, ahead, row): (*const f32, *const f32, usize),
        shared: usize,
        out: *mut f32,
        out_stride: usize,
        masks: [__mmask16; 3],
        add: bool,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 3]; R];
            for i in 0..shared {
                // Wrapping: a last panel read in place may end before its third register, whose
                // lanes past the end the mask leaves unread (and a prefetch never faults).
                let panel = b.wrapping_add(i * row);
                // The next panel's lines of this step on their way to the cache, as the bf16
                // panels do (the prefetcher stops streaming once later tiles reread a panel);
                // the first tile, reading this panel from memory, takes its lines 12 steps
                // ahead (the hardware does not follow a panel read in place, 48 floats a row).
                let next = if ahead == b { b.wrapping_add((i + AHEAD) * row) } else { ahead.wrapping_add(i * row) };
                let next = next as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(next);
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(128));
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

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn products(
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
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let block = shared.div_ceil(shared.div_ceil(SHARED_BLOCK));
        let count = cols.div_ceil(PANEL_COLS);
        for first in (0..shared).step_by(block) {
            let len = (shared - first).min(block);
            // Earlier blocks' sums added.
            let add = add || first > 0;
            for panel in 0..count {
                let c = panel * PANEL_COLS;
                let masks = masks((cols - c).min(PANEL_COLS));
                // SAFETY: inside `b` (the caller's asserts): this panel's block, and the next
                // panel's when there is one (a full panel before it, so its first lines are).
                let b = unsafe { b.add(panel * panels.panel + first * panels.row) };
                let next = if panel + 1 < count { unsafe { b.add(panels.panel) } } else { b };
                let mut r = 0;
                while r < rows {
                    let rr = (rows - r).min(TILE_ROWS);
                    // SAFETY: rows r..r + rr, steps first..first + len, columns c..c + 48
                    // (masked past `cols`) are inside (the caller's asserts).
                    unsafe {
                        let a = a.add(r * a_row + first * a_shared);
                        let out = out.add(r * out_stride + c);
                        let s = (a_row, a_shared);
                        // The first of several tiles reads this panel from memory and prefetches
                        // ahead in it (`ahead == b`): the next panel's prefetches would slow it.
                        // So does a lone tile of a panel read in place, which the hardware
                        // streams only when packed.
                        let first_read = if rows > TILE_ROWS { r == 0 } else { panels.row != PANEL_COLS };
                        let ahead = if first_read { b } else { next };
                        let b = (b, ahead, panels.row);
                        tile_of_rows!(rr, tile(a, s, b, len, out, out_stride, masks, add))
                    }
                    r += rr;
                }
            }
        }
    }
}
