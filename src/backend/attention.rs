//! Causal attention with grouped key/value heads, fused on the CPU backend (forward and
//! backward), one GPU kernel for decoding's few queries on the plain GPU backends
//! ([`super::cube_fused::attention`]), generic burn ops everywhere else.
//!
//! The generic path (`q kᵀ`, `+ bias`, softmax, `· v`) writes the `[batch, heads, t, keys]`
//! scores four times over, and copies q and the output between the projections' token-major
//! layout and the head-major one the batched matmul wants. On the CPU backend each
//! (batch row, KV head) block here runs two GEMMs per block of queries directly on the
//! strided views, the softmax in between (one [`kernels::softmax`] pass), skips the keys after a query
//! block's last slot (they are masked for every layout this project builds: see
//! [`crate::model::layout`]), and writes the output token-major, ready for `o_proj`. Blocks
//! run on rayon threads. Inference keeps one query block's scores at a time, so a prefill of
//! long prompts no longer holds `[batch, heads, t, t]` floats. Decoding's single query runs
//! the group's heads through [`kernels::query_key_scores`] and [`kernels::weighted_values`]
//! instead of the GEMMs, which read each key and value row once where it is stored, f32 or
//! bf16 (a sampling cache: [`crate::model::KvCache::for_sampling`]). Rows that are samples
//! of one prompt hold copies of its keys and values ([`SharedKeys`]): each reads the prompt's
//! from the first such row, and the rows run KV head by KV head, so that a group's copies come
//! from the caches instead of memory.
//!
//! Training on the CPU backend (`Autodiff<Cpu>`) runs the same forward as a custom autodiff
//! op that keeps the probabilities (as the generic graph does) and returns dq, dk, dv from
//! four GEMMs per query block: `dP = dO vᵀ`, `dS = P ∘ (dP − rowsum(P ∘ dP))`, `dq = dS k`,
//! `dk = dSᵀ q`, `dv = Pᵀ dO`.

use burn::tensor::activation::softmax;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::Cpu;
use super::fused::{AdTensor, CpuBackend, ad, contiguous, cpu_backend, elems, flex};
use super::kernels;
use super::primitive::tensor;
use crate::dtype::ComputeDtype;

/// Queries per GEMM block: the block's scores (`QUERY_BLOCK × keys` floats) stay in cache,
/// and keys after the block's last query are skipped.
const QUERY_BLOCK: usize = 64;

/// The dtype of a KV cache that scoring or training reads: the attention's
/// ([`ComputeDtype::attention`]), except on the CPU backends, where it is f32: the fused
/// training kernels read f32, and a scoring pass (the old policy's log-probs) must read the
/// keys the update's pass reads, for the first update's ratios to be one. Sampling's cache
/// takes the attention's dtype everywhere ([`crate::model::KvCache::for_sampling`]).
pub fn cache_dtype<B: Backend>(compute: ComputeDtype) -> crate::dtype::Dtype {
    if cpu_backend::<B>(&[]).is_some() { crate::dtype::Dtype::F32 } else { compute.attention() }
}

/// Multiply-adds below which inference runs its blocks on the calling thread.
pub(super) const PARALLEL_WORK: usize = 1 << 18;

/// Rows of a KV cache whose first `slots` keys and values are copies of another row's (the
/// samples of one prompt, fanned out from its prefill): `source[r]` is the row that row `r`
/// may read them from, `r` itself for the first of its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedKeys {
    pub(crate) slots: usize,
    /// Built by [`Self::grouped`], so that `source[r] <= r`.
    pub(crate) source: Vec<usize>,
}

impl SharedKeys {
    /// Rows `rows` of the rows `self` describes (a row may repeat), or `None` when none of them
    /// shares with another.
    pub fn rows(&self, rows: &[usize]) -> Option<SharedKeys> {
        Self::grouped(self.slots, rows.iter().map(|&r| self.source[r]))
    }

    /// Rows whose first `slots` slots are alike when their `groups` are, or `None` when no two
    /// are.
    pub fn grouped(slots: usize, groups: impl Iterator<Item = usize>) -> Option<SharedKeys> {
        let mut first: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        let source: Vec<usize> = groups.enumerate().map(|(row, group)| *first.entry(group).or_insert(row)).collect();
        let shares = source.iter().enumerate().any(|(row, &from)| from != row);
        (shares && slots > 0).then_some(SharedKeys { slots, source })
    }

    /// The row that row `row` of a decoding pass over `keys` keys reads its first keys from,
    /// and how many: whole blocks of four ([`kernels::query_key_scores`] scores four keys at a
    /// time, so the split keeps every score's bits); `None` for a group's first row.
    fn read_from(&self, row: usize, keys: usize) -> Option<(usize, usize)> {
        let split = self.slots.min(keys) / 4 * 4;
        self.source.get(row).filter(|&&from| from != row && split > 0).map(|&from| (from, split))
    }
}

/// `softmax(q kᵀ + bias) v` for `q: [batch, heads, t, head_dim]` (already scaled) and
/// `k, v: [batch, kv_heads, keys, head_dim]`, query head `i` reading KV head
/// `i / (heads / kv_heads)` (HF's order). `bias` is [`crate::model::LayoutTensors::bias`]:
/// `[1, t·keys]` shared by every row and head, or `[batch, heads·t·keys]`. Returns
/// `[batch, t, heads·head_dim]`.
///
/// The generic path multiplies in [`ComputeDtype::attention`] (softmax in f32); the CPU path
/// computes in f32, reading f32 keys and values or, for inference, a bf16 cache's widened
/// ([`cache_dtype`]); the GPU kernel (up to
/// [`super::cube_fused::FEW_QUERIES`] queries a sequence) computes in f32 and returns the
/// generic path's dtype.
///
/// Precondition of the CPU path: the query at slot `keys − t + i` sees no later key (true of
/// every layout in [`crate::model::layout`]).
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<&Tensor<B, 2>>,
    compute: ComputeDtype,
) -> Tensor<B, 3> {
    attention_read_as(q, k, v, bias, compute, None, None)
}

/// [`attention`] in `reads`, for a reader that rounds the output to it first (the output
/// projection's product in half precision): the GPU kernel writes that dtype, one launch
/// fewer; the other paths cast to it, the launch the reader's cast would have been. Every
/// path gives the same dtype, so that passes of different lengths (some through the kernel,
/// some not) join into one tensor. `shared` says which rows hold copies of another's first keys
/// and values; the CPU's decoding reads them from there, to the same bits.
pub fn attention_read_as<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<&Tensor<B, 2>>,
    compute: ComputeDtype,
    reads: Option<burn::tensor::DType>,
    shared: Option<&SharedKeys>,
) -> Tensor<B, 3> {
    let [b, h, t, d] = q.dims();
    let [kb, kvh, keys, kd] = k.dims();
    assert!(
        kb == b && kd == d && v.dims() == k.dims() && kvh > 0 && h % kvh == 0 && t <= keys,
        "attention: q {:?}, k {:?}, v {:?} do not fit together",
        q.dims(),
        k.dims(),
        v.dims()
    );
    if let Some(x) = bias {
        let tile = t * keys;
        let [rows, n] = x.dims();
        assert!(
            (rows == 1 && n == tile) || (rows == b && n == h * tile),
            "attention: bias {:?} for q {:?}",
            x.dims(),
            q.dims()
        );
    }
    // The fused path's key skipping needs the layout's mask whenever several queries run; an
    // empty pass has nothing to fuse.
    let fusable = t > 0 && (bias.is_some() || t == 1);
    let backend = if fusable { fused_backend::<B>(q.dtype(), k.dtype(), v.dtype()) } else { None };
    let out = match backend {
        Some(CpuBackend::Plain) => {
            let bias = bias.map(|x| flex(x.clone()));
            let out = forward(&flex(q), &flex(k), &flex(v), bias.as_ref(), None, shared);
            tensor::<B, 3, _>(out.reshape([b, t, h * d].into()))
        }
        Some(CpuBackend::Autodiff) => {
            let bias = bias.map(|x| ad(x.clone()).primitive);
            tensor::<B, 3, _>(autodiff_forward(ad(q), ad(k), ad(v), bias))
        }
        None => {
            // A few queries (decoding) on the GPU: scores, softmax and values in one kernel.
            #[cfg(any(feature = "cuda", feature = "wgpu"))]
            let [q, k, v] =
                match super::cube_fused::attention(q, k, v, bias, reads.unwrap_or(output_dtype::<B>(compute))) {
                    Ok(out) => return out,
                    Err(back) => back,
                };
            generic(q, k, v, bias, compute.attention())
        }
    };
    match reads {
        Some(dtype) => crate::dtype::cast_to(out, dtype.into()),
        None => out,
    }
}

/// Which fused CPU path reads these dtypes, if any: f32 throughout, or for inference f32
/// queries over a bf16 cache (sampling's, [`crate::model::KvCache::for_sampling`]).
fn fused_backend<B: Backend>(q: DType, k: DType, v: DType) -> Option<CpuBackend> {
    match cpu_backend::<B>(&[q]) {
        Some(CpuBackend::Plain) if k == v && matches!(k, DType::F32 | DType::BF16) => Some(CpuBackend::Plain),
        Some(CpuBackend::Autodiff) if k == DType::F32 && v == DType::F32 => Some(CpuBackend::Autodiff),
        _ => None,
    }
}

/// The dtype of [`generic`]'s output: the attention's where its products keep half precision,
/// else f32.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn output_dtype<B: Backend>(compute: ComputeDtype) -> burn::tensor::DType {
    let attention = compute.attention();
    if super::keeps_half::<B>(attention) { attention.burn().into() } else { burn::tensor::DType::F32 }
}

/// The same maths in burn ops, for every other backend (and the tests' reference).
fn generic<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<&Tensor<B, 2>>,
    compute: ComputeDtype,
) -> Tensor<B, 3> {
    let [b, h, t, d] = q.dims();
    let (kvh, s) = (k.dims()[1], k.dims()[2]);
    let group = h / kvh;
    // Where hacpo's GPU kernels read half precision as stored (the softmax, and the output
    // projection's product), a half-precision product's result stays in its dtype: the same
    // values, without a launch to widen it and one to round it back.
    let keep = super::keeps_half::<B>(compute);
    let product = |a: Tensor<B, 4>, b: Tensor<B, 4>| match keep {
        true => compute.product(a, b),
        false => compute.matmul(a, b),
    };
    // GQA without repeating K/V: the `group` query heads that share a KV head become extra
    // query rows, [b, kvh, group*t, d] (HF head order is kv-major).
    let q = q.reshape([b, kvh, group * t, d]);
    let scores = product(q, k.transpose()); // [b, kvh, group*t, s]
    let probs = probabilities(scores, bias, [b, h, t, s]);
    swap_middle(product(probs, v).reshape([b, h, t, d])).reshape([b, t, h * d])
}

/// `x.swap_dims(1, 2)`, as a reshape when either dimension has one element (decoding's one
/// slot): the same elements in the same order, where burn's GPU backends would copy the
/// swapped view before the next reshape or product (two launches a layer per decoding step).
pub fn swap_middle<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [a, m, n, z] = x.dims();
    if m == 1 || n == 1 { x.reshape([a, n, m, z]) } else { x.swap_dims(1, 2) }
}

/// `softmax(scores + bias)` over the keys, for scores `[b, kv_heads, group·t, s]` of `h` query
/// heads: one kernel on the plain GPU backends (probabilities in the scores' dtype), burn's
/// ops in f32 elsewhere.
fn probabilities<B: Backend>(
    scores: Tensor<B, 4>,
    bias: Option<&Tensor<B, 2>>,
    [b, h, t, s]: [usize; 4],
) -> Tensor<B, 4> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let scores = match super::cube_fused::softmax(scores, bias) {
        Ok(probs) => return probs,
        Err(back) => back,
    };
    let scores = crate::dtype::f32_weight(scores);
    let shape = scores.dims();
    let scores = match bias {
        // Viewed so that the bias is one shared row, or exactly the scores' shape.
        Some(bias) => {
            let view = if bias.dims()[1] == t * s { [b * h, t * s] } else { [b, h * t * s] };
            (scores.reshape(view) + bias.clone()).reshape(shape)
        }
        None => scores,
    };
    softmax(scores, 3)
}

// --- the kernels ---------------------------------------------------------------------------

/// A 4-D f32 or bf16 view `[batch, heads, seq, dim]` with unit stride along `dim`.
pub(super) struct View {
    tensor: FlexTensor,
    /// Element strides of batch, heads, seq.
    pub(super) strides: [usize; 3],
    /// bf16 (a sampling cache's keys or values), read as bits.
    half: bool,
}

impl View {
    pub(super) fn of(t: &FlexTensor) -> View {
        let unit = t.layout().strides()[3] == 1 && t.layout().strides().iter().all(|&s| s >= 0);
        let tensor = if unit { t.clone() } else { t.to_contiguous() };
        let s = tensor.layout().strides();
        let strides = [s[0] as usize, s[1] as usize, s[2] as usize];
        let half = tensor.dtype() == DType::BF16;
        View { tensor, strides, half }
    }

    pub(super) fn ptr(&self) -> *const f32 {
        let data: &[f32] = self.tensor.storage();
        data[self.tensor.layout().start_offset()..].as_ptr()
    }

    fn bits(&self) -> *const u16 {
        let data: &[u16] = bytemuck::cast_slice(self.tensor.storage::<half::bf16>());
        data[self.tensor.layout().start_offset()..].as_ptr()
    }
}

/// Shapes of one call: `heads` query heads of `t` queries, `kv_heads` of `keys` keys.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    pub(super) batch: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) t: usize,
    pub(super) keys: usize,
    pub(super) dim: usize,
}

impl Dims {
    fn of(q: &FlexTensor, k: &FlexTensor) -> Dims {
        let (qs, ks) = (q.layout().shape(), k.layout().shape());
        Dims { batch: qs[0], heads: qs[1], kv_heads: ks[1], t: qs[2], keys: ks[2], dim: qs[3] }
    }

    pub(super) fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Rows of one block's probabilities: `group·t`, head-major.
    pub(super) fn block_rows(&self) -> usize {
        self.group() * self.t
    }

    /// The query segments of one (batch row, KV head) block.
    pub(super) fn segments(&self) -> Vec<Segment> {
        if self.t == 1 {
            // Decoding: the group's heads are the rows of one segment (the few-query kernels').
            return vec![Segment { head: 0, first: 0, rows: self.group(), by_head: true, keys: self.keys }];
        }
        let mut out = Vec::new();
        for head in 0..self.group() {
            for first in (0..self.t).step_by(QUERY_BLOCK) {
                let rows = QUERY_BLOCK.min(self.t - first);
                let keys = self.keys.min(self.keys - self.t + first + rows);
                out.push(Segment { head, first, rows, by_head: false, keys });
            }
        }
        out
    }
}

/// Floats of one segment's scores: its rows × `keys`, for the largest segment.
pub(super) fn scratch_len(segments: &[Segment], keys: usize) -> usize {
    segments.iter().map(|s| s.rows).max().unwrap_or(0) * keys
}

/// Consecutive rows of a block's probabilities: `rows` queries of one head from position
/// `first`, or (`by_head`, when t = 1) one query of `rows` heads from head `head`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    /// Query head within the group.
    pub(super) head: usize,
    pub(super) first: usize,
    pub(super) rows: usize,
    pub(super) by_head: bool,
    /// Keys that any of these rows may see.
    pub(super) keys: usize,
}

impl Segment {
    /// Row within the block's `[group·t, keys]` probabilities.
    pub(super) fn block_row(&self, t: usize) -> usize {
        self.head * t + self.first
    }
}

/// The additive mask: per (batch row, head) a `[t, keys]` tile, with zero strides where it is
/// shared.
struct Bias {
    tensor: FlexTensor,
    batch_stride: usize,
    head_stride: usize,
}

impl Bias {
    fn of(bias: &FlexTensor, dims: &Dims) -> Bias {
        let tensor = contiguous(bias);
        let tile = dims.t * dims.keys;
        // `[1, t·keys]` is one mask for every row and head; `[batch, heads·t·keys]` has one per
        // row and head (with one head and one row the two coincide).
        let shape = tensor.layout().shape();
        let shared = shape[0] == 1 && shape[1] == tile;
        let (batch_stride, head_stride) = if shared { (0, 0) } else { (dims.heads * tile, tile) };
        Bias { tensor, batch_stride, head_stride }
    }

    fn data(&self) -> &[f32] {
        elems(&self.tensor)
    }
}

/// A raw pointer that rayon blocks may share: every block writes elements no other touches.
#[derive(Clone, Copy)]
pub(super) struct SharedMut(pub(super) *mut f32);
// SAFETY: used only for outputs whose (batch row or packed sequence, head) parts are written by
// one block each.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// Through a method, so that closures capture the whole (Sync) wrapper.
    pub(super) fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// A matrix operand: pointer, row stride, column stride (elements).
pub(super) type Mat = (*const f32, usize, usize);

/// `dst (+)= lhs · rhs` with `dst: m×n`, `lhs: m×k`, `rhs: k×n`, all strided.
///
/// SAFETY: the caller guarantees every operand is valid for its shape and strides and that
/// `dst` is not read or written by anyone else meanwhile.
pub(super) unsafe fn matmul_into(
    m: usize,
    n: usize,
    k: usize,
    dst: (*mut f32, usize, usize),
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: within dst's shape, by the caller's guarantee.
                    unsafe { *dst.0.add(i * dst.1 + j * dst.2) = 0.0 };
                }
            }
        }
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0,
            dst.2 as isize,
            dst.1 as isize,
            accumulate,
            lhs.0,
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0,
            rhs.2 as isize,
            rhs.1 as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `rows` rows of `cols` elements from `ptr`, `stride` elements apart, as one slice.
///
/// SAFETY: the caller guarantees the rows are valid for reads.
unsafe fn rows_of<'a, T>(ptr: *const T, stride: usize, rows: usize, cols: usize) -> &'a [T] {
    let len = if rows == 0 { 0 } else { (rows - 1) * stride + cols };
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// [`rows_of`] for an output, `stride` elements between its rows.
///
/// SAFETY: the caller guarantees the rows are valid and that nobody else reads or writes the
/// slice's elements meanwhile (those between the rows included).
unsafe fn rows_of_mut<'a>(ptr: *mut f32, stride: usize, rows: usize, cols: usize) -> &'a mut [f32] {
    let len = if rows == 0 { 0 } else { (rows - 1) * stride + cols };
    // SAFETY: forwarded from the caller.
    unsafe { std::slice::from_raw_parts_mut(ptr, len) }
}

/// Pointers and strides of a segment's operands within block `(batch, kv)`.
struct SegmentPtrs {
    q: Mat,
    /// Offset of the segment's first row in `[batch, t, heads, dim]` outputs, and its row
    /// stride there.
    out: (usize, usize),
    /// Offset of the first row's bias and the bias row stride, if any.
    bias: Option<(usize, usize)>,
}

fn segment_ptrs(dims: &Dims, q: &View, bias: Option<&Bias>, batch: usize, kv: usize, seg: &Segment) -> SegmentPtrs {
    let head = kv * dims.group() + seg.head;
    let [qb, qh, qt] = q.strides;
    let q_row = if seg.by_head { qh } else { qt };
    // SAFETY (of the `add`): the offset is an element of q's view.
    let q_ptr = unsafe { q.ptr().add(batch * qb + head * qh + seg.first * qt) };
    let hd = dims.heads * dims.dim;
    let out = (batch * dims.t * hd + seg.first * hd + head * dims.dim, if seg.by_head { dims.dim } else { hd });
    let bias = bias.map(|x| {
        let first = batch * x.batch_stride + head * x.head_stride + seg.first * dims.keys;
        (first, if seg.by_head { x.head_stride } else { dims.keys })
    });
    SegmentPtrs { q: (q_ptr, q_row, 1), out, bias }
}

fn kv_ptr(view: &View, batch: usize, kv: usize) -> Mat {
    let [sb, sh, ss] = view.strides;
    // SAFETY (of the `add`): the start of a block of the view.
    (unsafe { view.ptr().add(batch * sb + kv * sh) }, ss, 1)
}

/// A block's keys and values as its segments read them: f32 rows (a row of `dim` elements
/// every `.1`), or bf16 rows (their bits, a row every `.1`), which only the few-query kernels
/// read ([`block_kv`] widens them for the GEMMs).
#[derive(Clone, Copy)]
pub(super) enum BlockKv {
    F32(Mat, Mat),
    Bf16((*const u16, usize), (*const u16, usize)),
}

/// Block `(batch, kv)`'s keys and values, in place; bf16 ones for a pass of several queries
/// widened into `wide` (once for all the block's GEMMs: decoding's single query reads them as
/// they are).
fn block_kv(k: &View, v: &View, (batch, kv): (usize, usize), dims: &Dims, wide: &mut Vec<f32>) -> BlockKv {
    if !k.half {
        return BlockKv::F32(kv_ptr(k, batch, kv), kv_ptr(v, batch, kv));
    }
    let bits = |view: &View| {
        let [sb, sh, ss] = view.strides;
        // SAFETY (of the `add`): the start of a block of the view.
        (unsafe { view.bits().add(batch * sb + kv * sh) }, ss)
    };
    let (kb, vb) = (bits(k), bits(v));
    if dims.t == 1 {
        return BlockKv::Bf16(kb, vb);
    }
    let (keys, d) = (dims.keys, dims.dim);
    wide.resize(2 * keys * d, 0.0);
    let (wk, wv) = wide.split_at_mut(keys * d);
    for ((src, stride), dst) in [(kb, &mut *wk), (vb, &mut *wv)] {
        for (j, row) in dst.chunks_exact_mut(d).enumerate() {
            // SAFETY: key `j`'s row of the block, within the view.
            let bits = unsafe { rows_of(src.add(j * stride), 0, 1, d) };
            row.iter_mut().zip(bits).for_each(|(x, &b)| *x = f32::from_bits((b as u32) << 16));
        }
    }
    BlockKv::F32((wk.as_ptr(), d, 1), (wv.as_ptr(), d, 1))
}

/// Where a block reads its keys and values: its own rows, and for decoding's rows that share
/// a prompt's keys, the first `.1` keys from the row that holds them first ([`SharedKeys`]).
#[derive(Clone, Copy)]
pub(super) struct Reads {
    pub(super) own: BlockKv,
    pub(super) shared: Option<(BlockKv, usize)>,
}

impl Reads {
    /// `(keys and values, first key, end)` of each part of the `keys` keys, in order.
    fn parts(&self, keys: usize) -> impl Iterator<Item = (BlockKv, usize, usize)> {
        let split = self.shared.map_or(0, |(_, split)| split);
        let shared = self.shared.map(|(kv, split)| (kv, 0, split));
        shared.into_iter().chain(std::iter::once((self.own, split, keys)))
    }
}

/// Rows `first..end` of a block's keys or values from `(pointer, row stride)`, `d` wide.
///
/// SAFETY: the caller guarantees those rows are within a live view.
unsafe fn kv_rows<'a, T>((ptr, stride): (*const T, usize), first: usize, end: usize, d: usize) -> &'a [T] {
    // SAFETY: forwarded from the caller.
    unsafe { rows_of(ptr.wrapping_add(first * stride), stride, end - first, d) }
}

/// One segment's scores `p = q kᵀ` (its rows `keys` apart): decoding's few queries (a row
/// per head of the group) read the keys as stored, part by part ([`Reads::parts`]); longer
/// passes take the GEMM.
pub(super) fn segment_scores(dims: &Dims, seg: &Segment, q: Mat, reads: Reads, p: &mut [f32]) {
    let (d, keys) = (dims.dim, dims.keys);
    if !seg.by_head {
        let BlockKv::F32(kp, _) = reads.own else { unreachable!("bf16 keys are widened for several queries") };
        assert!(reads.shared.is_none(), "only decoding reads another row's keys");
        // SAFETY: q and the keys are live views of the shapes in `dims`, `p` is this block's.
        unsafe { matmul_into(seg.rows, seg.keys, d, (p.as_mut_ptr(), keys, 1), false, q, (kp.0, 1, kp.1)) };
        return;
    }
    debug_assert_eq!(seg.keys, keys, "a decoding segment sees every key");
    // SAFETY: q is a live view of the shapes in `dims`.
    let qs = unsafe { rows_of(q.0, q.1, seg.rows, d) };
    for (kv, first, end) in reads.parts(keys) {
        let out = (&mut p[first..], keys);
        // SAFETY (of each `kv_rows`): keys `first..end` of a block of a live view.
        match kv {
            BlockKv::F32(kp, _) => {
                let ks = unsafe { kv_rows((kp.0, kp.1), first, end, d) };
                kernels::query_key_scores(qs, q.1, seg.rows, ks, (end - first, kp.1), d, out);
            }
            BlockKv::Bf16(kb, _) => {
                let ks = unsafe { kv_rows(kb, first, end, d) };
                kernels::query_key_scores_bf16(qs, q.1, seg.rows, ks, (end - first, kb.1), d, out);
            }
        }
    }
}

/// One segment's output `p v` into its rows from `out` (`stride` apart), as [`segment_scores`].
///
/// SAFETY: the caller guarantees the segment's output rows are valid, and that nobody else
/// reads or writes them (or, for decoding's rows, the elements between them) meanwhile.
pub(super) unsafe fn segment_values(
    dims: &Dims,
    seg: &Segment,
    p: &[f32],
    reads: Reads,
    (out, stride): (*mut f32, usize),
) {
    let (d, keys) = (dims.dim, dims.keys);
    if !seg.by_head {
        let BlockKv::F32(_, vp) = reads.own else { unreachable!("bf16 values are widened for several queries") };
        // SAFETY: the values are a live view of the shapes in `dims`; `out` is forwarded from
        // the caller.
        unsafe { matmul_into(seg.rows, d, seg.keys, (out, stride, 1), false, (p.as_ptr(), keys, 1), vp) };
        return;
    }
    // SAFETY: forwarded from the caller.
    let o = unsafe { rows_of_mut(out, stride, seg.rows, d) };
    for (kv, first, end) in reads.parts(keys) {
        // The later part's sums go on from the earlier's, in the order of one call.
        let (weights, accumulate) = ((&p[first..], keys), first > 0);
        // SAFETY (of each `kv_rows`): values `first..end` of a block of a live view.
        match kv {
            BlockKv::F32(_, vp) => {
                let vs = (unsafe { kv_rows((vp.0, vp.1), first, end, d) }, (end - first, vp.1));
                kernels::weighted_values(weights, seg.rows, vs, d, (&mut *o, stride), accumulate);
            }
            BlockKv::Bf16(_, vb) => {
                let vs = (unsafe { kv_rows(vb, first, end, d) }, (end - first, vb.1));
                kernels::weighted_values_bf16(weights, seg.rows, vs, d, (&mut *o, stride), accumulate);
            }
        }
    }
}

/// The forward pass: `[batch, t, heads, dim]`, and the probabilities `[batch, kv_heads,
/// group·t, keys]` (zero where masked or skipped) when `keep` is given. Decoding reads the keys
/// rows share from the row `shared` names.
fn forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    bias: Option<&FlexTensor>,
    keep: Option<&mut Vec<f32>>,
    shared: Option<&SharedKeys>,
) -> FlexTensor {
    let dims = Dims::of(q, k);
    // Another row's keys are read only from rows of this batch.
    let rows_of_this_batch = |shared: &&SharedKeys| {
        shared.source.len() == dims.batch && shared.source.iter().enumerate().all(|(row, &from)| from <= row)
    };
    let shared = shared.filter(|shared| dims.t == 1 && keep.is_none() && rows_of_this_batch(shared));
    let (q, k, v) = (View::of(q), View::of(k), View::of(v));
    let bias = bias.map(|x| Bias::of(x, &dims));
    let segments = dims.segments();
    let (rows, keys, d) = (dims.block_rows(), dims.keys, dims.dim);
    let mut out = vec![0f32; dims.batch * dims.t * dims.heads * d];
    let out_ptr = SharedMut(out.as_mut_ptr());
    let blocks = dims.batch * dims.kv_heads;

    let run_block = |block: usize, probs: &mut [f32], wide: &mut Vec<f32>, keep: bool| {
        // Rows that share keys run KV head by KV head, so that a group's rows read the same
        // keys one after another.
        let (batch, kv) = match shared {
            Some(_) => (block % dims.batch, block / dims.batch),
            None => (block / dims.kv_heads, block % dims.kv_heads),
        };
        let own = block_kv(&k, &v, (batch, kv), &dims, wide);
        let from = shared.and_then(|shared| shared.read_from(batch, keys));
        let reads = Reads { own, shared: from.map(|(row, split)| (block_kv(&k, &v, (row, kv), &dims, wide), split)) };
        for seg in &segments {
            let at = if keep { seg.block_row(dims.t) * keys } else { 0 };
            let p = &mut probs[at..at + seg.rows * keys];
            let ptrs = segment_ptrs(&dims, &q, bias.as_ref(), batch, kv, seg);
            segment_scores(&dims, seg, ptrs.q, reads, p);
            for (i, row) in p.chunks_mut(keys).enumerate() {
                let row = &mut row[..seg.keys];
                if let Some((first, stride)) = ptrs.bias {
                    let b = &bias.as_ref().expect("bias offsets imply a bias").data()[first + i * stride..];
                    kernels::add_into(row, &b[..row.len()]);
                }
                kernels::softmax(row);
            }
            // SAFETY: this segment's output rows (one head's queries, or one query's heads of
            // the group, side by side) belong to this block alone; `out` outlives the loop.
            unsafe { segment_values(&dims, seg, p, reads, (out_ptr.at(ptrs.out.0), ptrs.out.1)) };
        }
    };

    // Waking the pool costs more than a decoding step's attention at batch 1.
    let parallel = dims.batch * dims.heads * dims.t * keys * d >= PARALLEL_WORK;
    match keep {
        Some(probs) => {
            *probs = vec![0f32; blocks * rows * keys];
            assert!(!k.half, "training reads f32 keys and values");
            (probs.par_chunks_mut(rows * keys).enumerate())
                .for_each(|(block, p)| run_block(block, p, &mut Vec::new(), true));
        }
        None => {
            let scratch = scratch_len(&segments, keys);
            if parallel {
                (0..blocks).into_par_iter().for_each_init(
                    || (vec![0f32; scratch], Vec::new()),
                    |(p, wide), block| run_block(block, p, wide, false),
                );
            } else {
                let (mut p, mut wide) = (vec![0f32; scratch], Vec::new());
                (0..blocks).for_each(|block| run_block(block, &mut p, &mut wide, false));
            }
        }
    }
    FlexTensor::from_data(TensorData::new(out, [dims.batch, dims.t, dims.heads, d]))
}

/// Gradients of q (`[batch, heads, t, dim]`, a view of token-major memory), k and v
/// (`[batch, kv_heads, keys, dim]`) for the output gradient `grad: [batch, t, heads·dim]`.
fn backward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    probs: &[f32],
    grad: &FlexTensor,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let dims = Dims::of(q, k);
    let (q, k, v) = (View::of(q), View::of(k), View::of(v));
    let grad = contiguous(grad);
    let go = elems(&grad);
    let segments = dims.segments();
    let (rows, keys, d) = (dims.block_rows(), dims.keys, dims.dim);
    let mut dq = vec![0f32; dims.batch * dims.t * dims.heads * d];
    let dq_ptr = SharedMut(dq.as_mut_ptr());
    let mut dk = vec![0f32; dims.batch * dims.kv_heads * keys * d];
    let mut dv = vec![0f32; dk.len()];
    let scratch = scratch_len(&segments, keys);

    dk.par_chunks_mut(keys * d)
        .zip(dv.par_chunks_mut(keys * d))
        .zip(probs.par_chunks(rows * keys))
        .enumerate()
        .for_each_init(
            || vec![0f32; scratch],
            |ds, (block, ((dk, dv), p_block))| {
                let (batch, kv) = (block / dims.kv_heads, block % dims.kv_heads);
                let (kp, vp) = (kv_ptr(&k, batch, kv), kv_ptr(&v, batch, kv));
                for seg in &segments {
                    let p = &p_block[seg.block_row(dims.t) * keys..][..seg.rows * keys];
                    let ptrs = segment_ptrs(&dims, &q, None, batch, kv, seg);
                    let g: Mat = (go[ptrs.out.0..].as_ptr(), ptrs.out.1, 1);
                    let grads = (dq_ptr.at(ptrs.out.0), &mut *dk, &mut *dv);
                    // SAFETY: every operand is a live buffer of the shapes in `dims`; dk, dv and ds
                    // are this block's own, and the dq rows of this segment are written only here.
                    unsafe { segment_backward(seg, [keys, d], (p, g, ptrs.q), (kp, vp), grads, ds) };
                }
            },
        );
    let dq = FlexTensor::from_data(TensorData::new(dq, [dims.batch, dims.t, dims.heads, d])).transpose(1, 2);
    let kv_shape = [dims.batch, dims.kv_heads, keys, d];
    (dq, FlexTensor::from_data(TensorData::new(dk, kv_shape)), FlexTensor::from_data(TensorData::new(dv, kv_shape)))
}

/// One segment's share of a block's backward pass: `dP = dO vᵀ`, `dS = P ∘ (dP − rowsum(P ∘
/// dP))`, then `dv += Pᵀ dO`, `dq = dS k` into its rows (`dq`, `g`'s row stride apart) and `dk
/// += dSᵀ q`. `p` holds its probabilities and `ds` room for its `dS`, rows `keys` apart; `g`
/// its output gradient's rows, `q` its queries'; `dk` and `dv` are `[keys, dim]`.
///
/// SAFETY: the caller guarantees every operand is valid for the segment's shapes, and that
/// nobody else reads or writes the segment's dq rows, `dk`, `dv` or `ds` meanwhile.
pub(super) unsafe fn segment_backward(
    seg: &Segment,
    [keys, d]: [usize; 2],
    (p, g, q): (&[f32], Mat, Mat),
    (kp, vp): (Mat, Mat),
    (dq, dk, dv): (*mut f32, &mut [f32], &mut [f32]),
    ds: &mut [f32],
) {
    let ds = &mut ds[..seg.rows * keys];
    // SAFETY: forwarded from the caller.
    unsafe {
        matmul_into(seg.rows, seg.keys, d, (ds.as_mut_ptr(), keys, 1), false, g, (vp.0, 1, vp.1));
        for (dsr, pr) in ds.chunks_mut(keys).zip(p.chunks(keys)) {
            kernels::softmax_backward(&mut dsr[..seg.keys], &pr[..seg.keys]);
        }
        matmul_into(seg.keys, d, seg.rows, (dv.as_mut_ptr(), d, 1), true, (p.as_ptr(), 1, keys), g);
        matmul_into(seg.rows, d, seg.keys, (dq, g.1, 1), false, (ds.as_ptr(), keys, 1), kp);
        matmul_into(seg.keys, d, seg.rows, (dk.as_mut_ptr(), d, 1), true, (ds.as_ptr(), 1, keys), q);
    }
}

// --- the autodiff op -----------------------------------------------------------------------

#[derive(Debug)]
struct FusedAttention;

/// Saved for the backward pass: q, k, v and the probabilities.
type Saved = (FlexTensor, FlexTensor, FlexTensor, std::sync::Arc<Vec<f32>>);

impl Backward<Cpu, 3> for FusedAttention {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (q, k, v, probs) = ops.state;
        let grad = grads.consume::<Cpu>(&ops.node);
        let (dq, dk, dv) = backward(&q, &k, &v, &probs, &grad);
        for (node, g) in ops.parents.into_iter().zip([dq, dk, dv]) {
            if let Some(node) = node {
                grads.register::<Cpu>(node.id, g);
            }
        }
    }
}

fn autodiff_forward(q: AdTensor, k: AdTensor, v: AdTensor, bias: Option<FlexTensor>) -> AdTensor {
    let [b, h, t, d] = {
        let s = q.primitive.layout().shape();
        [s[0], s[1], s[2], s[3]]
    };
    let prep = FusedAttention.prepare::<NoCheckpointing>([q.node.clone(), k.node.clone(), v.node.clone()]);
    match prep.compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let mut probs = Vec::new();
            let out = forward(&q.primitive, &k.primitive, &v.primitive, bias.as_ref(), Some(&mut probs), None);
            let saved = (q.primitive, k.primitive, v.primitive, std::sync::Arc::new(probs));
            prep.finish(saved, out.reshape([b, t, h * d].into()))
        }
        OpsKind::UnTracked(prep) => {
            let out = forward(&q.primitive, &k.primitive, &v.primitive, bias.as_ref(), None, None);
            prep.finish(out.reshape([b, t, h * d].into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::flex_fast::without_fast_paths;
    use crate::model::layout::{Heads, Layout, LayoutTensors, Pad};
    use crate::model::{ModelConfig, Rope};
    use burn::backend::Autodiff;
    use burn::tensor::Distribution;

    type Ad = Autodiff<Cpu>;
    const F32: ComputeDtype = ComputeDtype::F32;

    fn config(heads: usize, kv: usize, dim: usize) -> ModelConfig {
        let v = serde_json::json!({
            "model_type": "llama", "vocab_size": 16, "hidden_size": heads * dim, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512
        });
        ModelConfig::from_json(&v, "test").unwrap()
    }

    /// q in the model's token-major memory viewed head-major, k/v head-major, and the bias.
    fn inputs<B: Backend>(layout: &Layout, heads: usize, kv: usize, dim: usize) -> [Tensor<B, 4>; 3] {
        let dev = Default::default();
        let (b, t, s) = (layout.batch(), layout.len, layout.keys());
        let u = Distribution::Uniform(-1.0, 1.0);
        let q = Tensor::<B, 4>::random([b, t, heads, dim], u, &dev).swap_dims(1, 2);
        let k = Tensor::<B, 4>::random([b, s, kv, dim], u, &dev).swap_dims(1, 2);
        let v = Tensor::<B, 4>::random([b, kv, s, dim], u, &dev);
        [q, k, v]
    }

    fn bias<B: Backend>(layout: &Layout, heads: usize, kv: usize, dim: usize) -> Option<Tensor<B, 2>> {
        let c = config(heads, kv, dim);
        let h = Heads { query: heads, key_value: kv, dim };
        LayoutTensors::<B>::new(layout, &Rope::new(&c), h, &Default::default()).bias
    }

    fn close(a: Tensor<Cpu, 3>, b: Tensor<Cpu, 3>) -> f32 {
        (a - b).abs().max().into_scalar()
    }

    fn layouts() -> Vec<(Layout, usize, usize, usize)> {
        vec![
            (Layout::dense(2, 70), 4, 2, 8),                  // two query blocks, GQA
            (Layout::dense(3, 200), 8, 8, 16),                // four query blocks
            (Layout::left_padded(&[0, 3, 5], 0, 9), 6, 2, 4), // padded prefill
            (Layout::left_padded(&[0, 2], 7, 1), 4, 1, 8),    // decode, padded
            (Layout::left_padded(&[0; 3], 5, 1), 3, 3, 4),    // decode without a bias
            (Layout::left_padded(&[1, 0], 4, 3), 2, 1, 4),    // chunk after a cache
            (Layout::left_padded(&[0, 3], 0, 6), 1, 1, 4),    // one head, padded
            (Layout::left_padded(&[0, 3], 6, 1), 1, 1, 4),    // one head, decode
            // A shared beginning, then each row's pad and the rest of its prompt, and decoding.
            (
                Layout {
                    pads: vec![Pad { at: 3, len: 2 }, Pad { at: 3, len: 0 }, Pad { at: 1, len: 4 }],
                    start: 3,
                    len: 4,
                },
                4,
                2,
                4,
            ),
            (Layout { pads: vec![Pad { at: 3, len: 2 }, Pad { at: 1, len: 4 }], start: 7, len: 1 }, 2, 1, 4),
            // Decoding with whole lane-wide strips of the head (and a part strip), and groups of
            // one to seven heads: every tile of the few-query kernels.
            (Layout::left_padded(&[0, 5, 2], 40, 1), 14, 2, 24), // groups of 7: tiles of 4 and 3
            (Layout::left_padded(&[0, 1], 33, 1), 9, 3, 64),     // SmolLM2's heads
            (Layout::left_padded(&[0; 2], 20, 1), 10, 2, 16),    // groups of 5: 4 and 1
            (Layout::left_padded(&[2, 0], 17, 1), 4, 2, 32),     // groups of 2
        ]
    }

    #[test]
    fn the_fused_forward_matches_the_generic_ops() {
        for (layout, heads, kv, dim) in layouts() {
            let [q, k, v] = inputs::<Cpu>(&layout, heads, kv, dim);
            let bias = bias::<Cpu>(&layout, heads, kv, dim);
            let fused = attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), F32);
            let reference = without_fast_paths(|| attention(q, k, v, bias.as_ref(), F32));
            let err = close(fused, reference);
            assert!(err < 1e-5, "{layout:?}: max error {err}");
        }
    }

    /// A sampling cache's bf16 keys and values: read as stored by decoding's kernels, widened
    /// for a longer pass's GEMMs; either way the generic ops' result on the same numbers.
    #[test]
    fn the_fused_forward_reads_a_bf16_cache_as_the_generic_ops_do() {
        for (layout, heads, kv, dim) in layouts() {
            let [q, k, v] = inputs::<Cpu>(&layout, heads, kv, dim);
            let [k, v] = [k, v].map(|x| x.cast(burn::tensor::DType::BF16));
            assert_eq!(fused_backend::<Cpu>(q.dtype(), k.dtype(), v.dtype()), Some(CpuBackend::Plain));
            let bias = bias::<Cpu>(&layout, heads, kv, dim);
            let fused = attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), F32);
            let reference = without_fast_paths(|| attention(q, k, v, bias.as_ref(), F32));
            let err = close(fused, reference);
            assert!(err < 1e-5, "{layout:?}: max error {err}");
        }
        // Training never reads one.
        let bf16 = burn::tensor::DType::BF16;
        assert_eq!(fused_backend::<Ad>(burn::tensor::DType::F32, bf16, bf16), None);
    }

    /// Decoding rows that are samples of one prompt read its keys and values from the group's
    /// first row: the same bits as reading their own copies. Each later row's copy of the
    /// shared slots (in whole fours: see `SharedKeys::read_from`) is overwritten with other
    /// numbers, so that a row reading its own would give other results.
    #[test]
    fn decoding_reads_the_keys_rows_share_from_their_groups_first_row_to_the_same_bits() {
        let (dev, u) = (Default::default(), Distribution::Uniform(-1.0, 1.0));
        let groups = [0, 0, 1, 0, 1, 2, 2];
        let b = groups.len();
        // The last shape is enough work to run its blocks over the threads.
        for (heads, kv, dim, prompt, keys) in
            [(9, 3, 64, 13, 30), (4, 2, 24, 8, 11), (6, 2, 16, 3, 9), (2, 1, 16, 20, 21), (9, 3, 64, 401, 600)]
        {
            let shared = SharedKeys::grouped(prompt, groups.iter().copied()).expect("rows share");
            let layout = Layout::left_padded(&groups.map(|g| [0, 2, 1][g]), keys - 1, 1);
            let q = Tensor::<Cpu, 4>::random([b, 1, heads, dim], u, &dev).swap_dims(1, 2);
            let bias = bias::<Cpu>(&layout, heads, kv, dim);
            let kv_of = |prompts: Tensor<Cpu, 4>, own: Tensor<Cpu, 4>| {
                let idx = Tensor::<Cpu, 1, burn::tensor::Int>::from_data(groups.map(|g| g as i64), &dev);
                let copies = prompts.select(0, idx).slice([0..b, 0..kv, 0..prompt, 0..dim]);
                let wrong = Tensor::<Cpu, 4>::random([b, kv, prompt / 4 * 4, dim], u, &dev);
                let read: Vec<_> = (0..b)
                    .map(|r| {
                        let row = copies.clone().slice([r..r + 1, 0..kv, 0..prompt, 0..dim]);
                        if shared.source[r] == r {
                            return row;
                        }
                        let rest = row.slice([0..1, 0..kv, prompt / 4 * 4..prompt, 0..dim]);
                        Tensor::cat(vec![wrong.clone().slice([r..r + 1, 0..kv, 0..prompt / 4 * 4, 0..dim]), rest], 2)
                    })
                    .collect();
                let own = own.slice([0..b, 0..kv, prompt..keys, 0..dim]);
                [Tensor::cat(vec![copies, own.clone()], 2), Tensor::cat(vec![Tensor::cat(read, 0), own], 2)]
            };
            let [k, k_read] =
                kv_of(Tensor::random([3, kv, keys, dim], u, &dev), Tensor::random([b, kv, keys, dim], u, &dev));
            let [v, v_read] =
                kv_of(Tensor::random([3, kv, keys, dim], u, &dev), Tensor::random([b, kv, keys, dim], u, &dev));
            for dtype in [burn::tensor::DType::F32, burn::tensor::DType::BF16] {
                let [k, v, k_read, v_read] = [&k, &v, &k_read, &v_read].map(|x| x.clone().cast(dtype));
                let run = |k: Tensor<Cpu, 4>, v: Tensor<Cpu, 4>, shared: Option<&SharedKeys>| {
                    let out = attention_read_as(q.clone(), k, v, bias.as_ref(), F32, None, shared);
                    out.into_data().to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let own = run(k, v, None);
                let read = run(k_read.clone(), v_read.clone(), Some(&shared));
                assert_eq!(read, own, "{heads} heads, {kv} KV heads of {dim}, {dtype:?}");
                if prompt >= 4 {
                    assert_ne!(run(k_read, v_read, None), own, "the later rows' copies differ");
                }
            }
        }
    }

    #[test]
    fn the_fused_backward_matches_autodiff_of_the_generic_ops() {
        for (layout, heads, kv, dim) in layouts() {
            let [q, k, v] = inputs::<Ad>(&layout, heads, kv, dim);
            let bias = bias::<Ad>(&layout, heads, kv, dim);
            let weights = Tensor::<Ad, 3>::random(
                [layout.batch(), layout.len, heads * dim],
                Distribution::Uniform(-1.0, 1.0),
                &Default::default(),
            );
            let grads_of = |fast: bool| {
                let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
                let run = || (attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), F32) * weights.clone()).sum();
                let loss = if fast { run() } else { without_fast_paths(run) };
                let g = loss.backward();
                [q.grad(&g).unwrap(), k.grad(&g).unwrap(), v.grad(&g).unwrap()]
            };
            let (fused, reference) = (grads_of(true), grads_of(false));
            for (name, (a, b)) in ["q", "k", "v"].iter().zip(fused.into_iter().zip(reference)) {
                let err: f32 = (a - b).abs().max().into_scalar();
                assert!(err < 1e-5, "{layout:?}: d{name} max error {err}");
            }
        }
    }
}
