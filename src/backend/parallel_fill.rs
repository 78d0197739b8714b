//! New buffers written over the threads, each part zeroed by the task that writes it.
//!
//! `vec![0; len]` zeroes the whole buffer on the calling thread before any task starts, the
//! other cores idle: in a bf16 train step of SmolLM2-135M the zeroing of the products' outputs
//! and packed operands was the largest piece of one-thread work. Here each task zeroes its own
//! part right before writing it, in parallel and while the part is in its cache. Where the
//! tasks' kernel writes every element anyway (the panel products), [`written`] skips the
//! zeroing: measured at 4% of a bf16 update of SmolLM2-135M.

use std::mem::MaybeUninit;

use rayon::prelude::*;

/// A vector of parts of the lengths `parts` (in order), part `i` written by `fill(i, part)`
/// over the threads, zeroed before `fill` sees it.
pub(super) fn filled<T, F>(parts: &[usize], fill: F) -> Vec<T>
where
    T: Copy + bytemuck::Zeroable + Send + Sync,
    F: Fn(usize, &mut [T]) + Sync,
{
    let len = parts.iter().sum();
    let mut out = Vec::with_capacity(len);
    let mut pieces = Vec::with_capacity(parts.len());
    let mut rest = &mut out.spare_capacity_mut()[..len];
    for &n in parts {
        let (piece, tail) = rest.split_at_mut(n);
        pieces.push(piece);
        rest = tail;
    }
    let run = |(i, piece): (usize, &mut [MaybeUninit<T>])| {
        piece.fill(MaybeUninit::new(T::zeroed()));
        // SAFETY: every element of the piece was initialised on the line above.
        let piece = unsafe { &mut *(piece as *mut [MaybeUninit<T>] as *mut [T]) };
        fill(i, piece);
    };
    if pieces.len() <= 1 {
        // One part: on the calling thread, not a hand-over to the pool (decoding one sequence).
        pieces.into_iter().enumerate().for_each(run);
    } else {
        pieces.into_par_iter().enumerate().for_each(run);
    }
    // SAFETY: the pieces cover the first `len` elements, and each was initialised.
    unsafe { out.set_len(len) };
    out
}

/// [`filled`] in parts of `chunk` elements (the last one shorter) covering `len`.
pub(super) fn filled_in_chunks<T, F>(len: usize, chunk: usize, fill: F) -> Vec<T>
where
    T: Copy + bytemuck::Zeroable + Send + Sync,
    F: Fn(usize, &mut [T]) + Sync,
{
    let chunk = chunk.max(1);
    let parts: Vec<usize> = (0..len).step_by(chunk).map(|start| chunk.min(len - start)).collect();
    filled(&parts, fill)
}

/// A vector as long as `src`, its chunk `i` of `chunk` elements written by `fill(src's chunk i,
/// chunk i)` over the threads (zeroed first, as [`filled`]).
pub(super) fn mapped_in_chunks<S, T, F>(src: &[S], chunk: usize, fill: F) -> Vec<T>
where
    S: Sync,
    T: Copy + bytemuck::Zeroable + Send + Sync,
    F: Fn(&[S], &mut [T]) + Sync,
{
    let chunk = chunk.max(1);
    filled_in_chunks(src.len(), chunk, |i, out| fill(&src[i * chunk..][..out.len()], out))
}

/// A vector of `len` elements written by `count` tasks over the threads, never zeroed:
/// `write(task, start)` gets the buffer's first element and writes its own elements through it
/// (blocks of rows and columns of one row-major matrix, which slices cannot split between
/// tasks). One task runs on the calling thread.
///
/// # Safety
/// The tasks together must write each of the `len` elements exactly once, touch nothing outside
/// them, and read none before writing it.
pub(super) unsafe fn written<T, F>(len: usize, count: usize, write: F) -> Vec<T>
where
    T: Copy + Send + Sync,
    F: Fn(usize, *mut T) + Sync,
{
    let mut out: Vec<T> = Vec::with_capacity(len);
    let start = Start(out.spare_capacity_mut().as_mut_ptr().cast());
    match count {
        0 => {}
        1 => write(0, start.get()),
        _ => (0..count).into_par_iter().for_each(|task| write(task, start.get())),
    }
    // SAFETY: the caller's tasks wrote every one of the `len` elements.
    unsafe { out.set_len(len) };
    out
}

/// The buffer's first element, shared by the tasks of [`written`].
struct Start<T>(*mut T);
// SAFETY: the tasks write disjoint elements through it ([`written`]'s contract).
unsafe impl<T: Send> Send for Start<T> {}
unsafe impl<T: Send> Sync for Start<T> {}

impl<T> Start<T> {
    /// A method, so that closures capture the whole wrapper rather than its pointer.
    fn get(&self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_is_zeroed_then_written_in_place() {
        // Memory just freed with other values in it, which the allocator may hand out again.
        for parts in [&[3, 0, 5, 1][..], &[9]] {
            drop(std::hint::black_box(vec![7u32; 9]));
            let out: Vec<u32> =
                filled(parts, |i, part| assert!(part.iter().all(|&x| x == 0), "part {i} starts zeroed"));
            assert_eq!(out, [0; 9]);
        }
        let out: Vec<u32> = filled(&[3, 0, 5, 1], |i, part| {
            assert!(part.iter().all(|&x| x == 0), "part {i} starts zeroed");
            part.iter_mut().enumerate().step_by(2).for_each(|(j, x)| *x = (10 * i + j) as u32 + 1);
        });
        assert_eq!(out, [1, 0, 3, 21, 0, 23, 0, 25, 31]);
        let out: Vec<f32> = filled_in_chunks(10, 4, |i, part| part.fill(i as f32));
        assert_eq!(out, [0., 0., 0., 0., 1., 1., 1., 1., 2., 2.]);
        assert!(filled_in_chunks::<f32, _>(0, 4, |_, _| unreachable!()).is_empty());
        // One part: on the calling thread.
        let caller = std::thread::current().id();
        let out: Vec<u16> = filled_in_chunks(5, 8, |_, part| {
            assert_eq!(std::thread::current().id(), caller);
            part.fill(3);
        });
        assert_eq!(out, [3; 5]);
        let out: Vec<u32> = mapped_in_chunks(&[1u16, 2, 3, 4, 5], 2, |src, out| {
            out.iter_mut().zip(src).for_each(|(o, &s)| *o = 10 * s as u32 + src.len() as u32);
        });
        assert_eq!(out, [12, 22, 32, 42, 51]);
    }

    #[test]
    fn written_buffers_hold_what_each_task_wrote() {
        // Three tasks, each writing every third element of 10.
        // SAFETY: task t writes elements t, t + 3, … below 10, each once.
        let out: Vec<u32> = unsafe {
            written(10, 3, |task, start: *mut u32| {
                (task..10).step_by(3).for_each(|i| *start.add(i) = 100 * task as u32 + i as u32)
            })
        };
        assert_eq!(out, [0, 101, 202, 3, 104, 205, 6, 107, 208, 9]);
        let caller = std::thread::current().id();
        // SAFETY: the one task writes both elements.
        let out: Vec<f32> = unsafe {
            written(2, 1, |_, start: *mut f32| {
                assert_eq!(std::thread::current().id(), caller, "one task runs on the calling thread");
                (0..2).for_each(|i| *start.add(i) = 0.5);
            })
        };
        assert_eq!(out, [0.5, 0.5]);
        // SAFETY: nothing to write.
        assert!(unsafe { written::<u8, _>(0, 0, |_, _| unreachable!()) }.is_empty());
    }
}
