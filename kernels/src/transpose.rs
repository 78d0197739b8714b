//! Transposes of 16-bit matrices (bf16 bits) in 8 × 8 blocks of SSE2 interleaves: a bf16
//! product's backward transposes its inputs and incoming gradient, and element by element
//! those transposes took a tenth of a bf16 train step (each store to another cache line).

/// `t[(c − cols.0)·k + i] = w[i·n + c]` for `i < k` and the columns `c ∈ cols.0..cols.1` of
/// `w` (`k × n` row-major): those columns of `w` as rows of `t`.
///
/// # Panics
/// When a slice is shorter than the shapes say.
pub fn transpose_u16(w: &[u16], k: usize, n: usize, cols: (usize, usize), t: &mut [u16]) {
    let width = cols.1.saturating_sub(cols.0);
    assert!(cols.1 <= n && w.len() >= k * n, "w is shorter than k × n");
    assert!(t.len() >= width * k, "t is shorter than its columns × k");
    // Whole blocks through SSE2 (x86-64's baseline), the rest one element at a time.
    let (full_rows, full_cols) =
        if cfg!(target_arch = "x86_64") { (k / 8 * 8, cols.0 + width / 8 * 8) } else { (0, cols.0) };
    #[cfg(target_arch = "x86_64")]
    for i in (0..full_rows).step_by(8) {
        for c in (cols.0..full_cols).step_by(8) {
            // SAFETY: rows i..i + 8 and columns c..c + 8 of `w`, and rows c − cols.0 .. + 8
            // and columns i..i + 8 of `t`, are inside (asserted above).
            unsafe { x86::block(w.as_ptr().add(i * n + c), n, t.as_mut_ptr().add((c - cols.0) * k + i), k) };
        }
    }
    for c in cols.0..cols.1 {
        let row = &mut t[(c - cols.0) * k..][..k];
        let first = if c < full_cols { full_rows } else { 0 };
        for (i, v) in row.iter_mut().enumerate().skip(first) {
            *v = w[i * n + c];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One 8 × 8 block from `w` (rows `w_stride` apart) to `t` (rows `t_stride` apart),
    /// transposed: pairs of rows interleaved by 16, 32 and 64 bits (24 instructions).
    #[inline(always)]
    pub(super) unsafe fn block(w: *const u16, w_stride: usize, t: *mut u16, t_stride: usize) {
        unsafe {
            let r: [__m128i; 8] = std::array::from_fn(|j| _mm_loadu_si128(w.add(j * w_stride) as *const __m128i));
            let a: [__m128i; 8] = std::array::from_fn(|j| {
                let (x, y) = (r[j / 2 * 2], r[j / 2 * 2 + 1]);
                if j % 2 == 0 { _mm_unpacklo_epi16(x, y) } else { _mm_unpackhi_epi16(x, y) }
            });
            // b[j]: columns 2(j mod 4) and 2(j mod 4) + 1 of rows 0–3 (j < 4), of rows 4–7 (j ≥ 4).
            let b: [__m128i; 8] = std::array::from_fn(|j| {
                let (x, y) = (a[j / 4 * 4 + j % 4 / 2], a[j / 4 * 4 + j % 4 / 2 + 2]);
                if j % 2 == 0 { _mm_unpacklo_epi32(x, y) } else { _mm_unpackhi_epi32(x, y) }
            });
            for j in 0..8 {
                let (x, y) = (b[j / 2], b[j / 2 + 4]);
                let column = if j % 2 == 0 { _mm_unpacklo_epi64(x, y) } else { _mm_unpackhi_epi64(x, y) };
                _mm_storeu_si128(t.add(j * t_stride) as *mut __m128i, column);
            }
        }
    }
}
