//! How the panel kernels' products (`hacpo_kernels::bf16_panel_products_to`,
//! `f32_panel_products_to`) split a `rows × cols` output over the threads: each task writes a
//! block of rows and columns straight into one buffer, never zeroed ([`written`]).
//!
//! - [`by_rows`] (a prefill, training): tasks of whole 8-row tiles, every task reading all of
//!   the second operand's panels, which the tiles after the first read again from L2.
//! - [`by_panels`] (decoding): tasks of panels, each panel read from memory by one task only;
//!   decoding reads the whole model per token.

use super::parallel_fill::written;

/// Rows up to which the panel products split by panels (decoding's products, the bf16 rollout
/// copy's and the f32 panel products').
pub(super) const PANEL_ROWS: usize = 256;

/// Columns of a panel (both kernels').
const PANEL_COLS: usize = hacpo_kernels::PANEL_COLS;

/// A task's block of the output: rows `top..bottom`, columns `first..end`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub top: usize,
    pub bottom: usize,
    pub first: usize,
    pub end: usize,
}

/// The output written by `write(block, start)` over the threads, `start` the buffer's first
/// element: tasks of whole 8-row tiles, as equal as tiles allow and a multiple of the threads
/// in number (341 rows in tasks of 48 left one thread a sixth of the work to do alone), of at
/// most 16 tiles so that a task's rows stay in L2.
///
/// # Safety
/// `write` must write every element of its block (row-major, `cols` a row) and nothing else.
pub(super) unsafe fn by_rows<F>(rows: usize, cols: usize, write: F) -> Vec<f32>
where
    F: Fn(Block, *mut f32) + Sync,
{
    let (threads, tiles) = (rayon::current_num_threads(), rows.div_ceil(8));
    let count = (4 * threads).max(tiles.div_ceil(16)).next_multiple_of(threads).min(tiles);
    let top = |task: usize| (8 * (task * tiles / count)).min(rows);
    let task = |t: usize, start: *mut f32| write(Block { top: top(t), bottom: top(t + 1), first: 0, end: cols }, start);
    // SAFETY: the tasks' rows are disjoint and cover `0..rows`, every column of each.
    unsafe { written(rows * cols, if cols == 0 { 0 } else { count }, task) }
}

/// The output written by `write(block, start)` over the threads, the threads splitting the
/// panels: tasks of at most [`TASK_PANELS`] panels, at least two a thread where there are
/// enough panels (so that one late task does not leave the other threads idle). Where the
/// panels are fewer than that (a narrow GQA projection), the rows are split too, in whole
/// tiles of 8.
///
/// # Safety
/// As [`by_rows`].
pub(super) unsafe fn by_panels<F>(rows: usize, cols: usize, write: F) -> Vec<f32>
where
    F: Fn(Block, *mut f32) + Sync,
{
    /// Panels per task at most: 8 × 48 columns of a 576-wide model's weights are 430 KiB in
    /// bf16, in L2 while each of the task's row tiles reads them.
    const TASK_PANELS: usize = 8;
    let (threads, panels) = (rayon::current_num_threads(), cols.div_ceil(PANEL_COLS));
    let wanted = (threads * panels.div_ceil(threads * TASK_PANELS)).max(2 * threads);
    let (tiles, by_columns) = (rows.div_ceil(8), wanted.min(panels));
    let by_rows = wanted.div_ceil(by_columns.max(1)).min(tiles);
    let task = |t: usize, start: *mut f32| {
        let (c, r) = (t % by_columns, t / by_columns);
        let block = Block {
            top: (8 * (r * tiles / by_rows)).min(rows),
            bottom: (8 * ((r + 1) * tiles / by_rows)).min(rows),
            first: PANEL_COLS * (c * panels / by_columns),
            end: (PANEL_COLS * ((c + 1) * panels / by_columns)).min(cols),
        };
        write(block, start)
    };
    // SAFETY: the tasks' blocks are disjoint and together cover every row and column.
    unsafe { written(rows * cols, by_columns * by_rows, task) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_blocks_cover_the_output_once() {
        for (rows, cols) in [(1, 1), (3, 47), (8, 48), (9, 49), (32, 576), (33, 192), (256, 1536), (300, 97), (1000, 5)]
        {
            for panels in [false, true] {
                let seen: Vec<AtomicU32> = (0..rows * cols).map(|_| 0.into()).collect();
                let write = |b: Block, start: *mut f32| {
                    assert!(b.top <= b.bottom && b.bottom <= rows && b.first <= b.end && b.end <= cols);
                    for r in b.top..b.bottom {
                        for c in b.first..b.end {
                            seen[r * cols + c].fetch_add(1, Ordering::Relaxed);
                            // SAFETY: inside the buffer; each element once (checked below).
                            unsafe { *start.add(r * cols + c) = (r * cols + c) as f32 };
                        }
                    }
                };
                // SAFETY: `write` writes its block; the counts below check that the blocks
                // cover the buffer once (a failure there would have read uninitialised memory
                // only in this test's assertion on `out`, which runs after it).
                let out = unsafe { if panels { by_panels(rows, cols, write) } else { by_rows(rows, cols, write) } };
                let what = format!("{rows}x{cols}, by panels {panels}");
                assert!(seen.iter().all(|n| n.load(Ordering::Relaxed) == 1), "{what}: each element once");
                assert!(out.iter().enumerate().all(|(i, &x)| x == i as f32), "{what}: as written");
            }
        }
    }
}
