//! Causal attention over packed sequences on the CPU backends: a training or scoring
//! micro-batch's tokens, each sequence's after the one before, padding left out
//! ([`crate::generate::shared_prompt`]). A sequence may continue other tokens (a response's
//! rest after its group's shared prompt): its queries see those keys first, then its own
//! causally. One op runs every sequence of a layer, forward and (on `Autodiff<Cpu>`)
//! backward, on the projections' packed rows: no KV cache of the prompt's copies, no pass's
//! slice of the projections and no full-size gradient per pass for autodiff to sum.
//!
//! Each (sequence, KV head) block runs [`super::attention`]'s segments and GEMMs; a sequence
//! that continues a prompt reads the prompt's keys and values and its own copied side by side
//! (`keys · dim` floats each, against its products' `group · len · keys · dim` multiply-adds).
//! The causal mask is set in the scores themselves, not read from a bias tensor. The other
//! backends run the passes one by one.

use std::sync::Arc;

use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::Cpu;
use super::attention::{
    BlockKv, Dims, Mat, PARALLEL_WORK, Reads, SharedMut, View, scratch_len, segment_backward, segment_scores,
    segment_values,
};
use super::fused::{AdTensor, CpuBackend, ad, contiguous, cpu_backend, elems, flex};
use super::kernels;
use super::primitive::tensor;

/// One sequence of packed tokens: its own, `first..first + len`, which see the keys of the
/// `prefix_len` tokens from `prefix` (those it continues; none when 0) and, causally, each
/// other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedSeq {
    pub first: usize,
    pub len: usize,
    pub prefix: usize,
    pub prefix_len: usize,
}

impl PackedSeq {
    /// The packed tokens whose keys it reads, in order: its prefix's, then its own.
    fn key_tokens(&self) -> impl Iterator<Item = usize> {
        (self.prefix..self.prefix + self.prefix_len).chain(self.first..self.first + self.len)
    }
}

/// Which CPU backend runs the packed op for `B`, if one does.
pub(crate) fn backend<B: Backend>() -> Option<CpuBackend> {
    cpu_backend::<B>(&[DType::F32])
}

/// The attention of the packed sequences `seqs`: q `[1, heads, tokens, dim]` (a view of the
/// projections' token-major rows), k and v `[1, kv_heads, tokens, dim]`, f32, on the backend
/// [`backend`] names (`on`). Returns `[tokens, heads · dim]`, token-major, for `o_proj`; rows
/// of tokens in no sequence are zero.
pub(crate) fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    seqs: &Arc<[PackedSeq]>,
    on: CpuBackend,
) -> Tensor<B, 2> {
    let [_, h, t, d] = q.dims();
    let [kb, kvh, kt, kd] = k.dims();
    // `kvh > 0` before the remainder.
    assert!(
        q.dims()[0] == 1 && kb == 1 && k.dims() == v.dims() && kt == t && kd == d && kvh > 0 && h % kvh == 0,
        "packed attention: q {:?}, k {:?}, v {:?} do not fit together",
        q.dims(),
        k.dims(),
        v.dims()
    );
    assert!(seqs.iter().all(|s| s.first + s.len <= t && s.prefix + s.prefix_len <= t), "a sequence past the tokens");
    // Each block writes its sequence's own rows of the output and of dq unsynchronised.
    assert!(seqs.windows(2).all(|w| w[0].first + w[0].len <= w[1].first), "sequences overlap or are out of order");
    match on {
        CpuBackend::Plain => tensor::<B, 2, _>(forward(&flex(q), &flex(k), &flex(v), seqs, None)),
        CpuBackend::Autodiff => tensor::<B, 2, _>(autodiff_forward(ad(q), ad(k), ad(v), seqs.clone())),
    }
}

/// One (sequence, KV head) block: its shapes, and where its probabilities start among those
/// the forward pass keeps.
struct Block {
    seq: PackedSeq,
    kv: usize,
    dims: Dims,
    probs: usize,
}

impl Block {
    /// How many probabilities the forward pass keeps for it.
    fn kept(&self) -> usize {
        self.dims.block_rows() * self.dims.keys
    }

    /// Floats of its largest segment's scores.
    fn scratch(&self) -> usize {
        scratch_len(&self.dims.segments(), self.dims.keys)
    }
}

/// The blocks of `seqs` over `kv_heads`, sequence by sequence, and how many probabilities they
/// keep together.
fn blocks(seqs: &[PackedSeq], [heads, kv_heads, dim]: [usize; 3]) -> (Vec<Block>, usize) {
    let mut out = Vec::with_capacity(seqs.len() * kv_heads);
    let mut probs = 0;
    for seq in seqs.iter().filter(|s| s.len > 0) {
        let keys = seq.prefix_len + seq.len;
        let dims = Dims { batch: 1, heads, kv_heads, t: seq.len, keys, dim };
        for kv in 0..kv_heads {
            let block = Block { seq: *seq, kv, dims, probs };
            probs += block.kept();
            out.push(block);
        }
    }
    (out, probs)
}

/// The shapes `[heads, kv_heads, dim]` and the token count of q `[1, heads, tokens, dim]` and
/// k `[1, kv_heads, tokens, dim]`.
fn shapes(q: &FlexTensor, k: &FlexTensor) -> ([usize; 3], usize) {
    let (qs, ks) = (q.layout().shape(), k.layout().shape());
    ([qs[1], ks[1], qs[3]], qs[2])
}

/// A block's keys and values as rows `dim` apart: the sequence's own in place, or, when it
/// continues a prefix, the prefix's and its own copied side by side into `wide`.
fn block_kv(k: &View, v: &View, block: &Block, wide: &mut Vec<f32>) -> (Mat, Mat) {
    let (seq, d) = (&block.seq, block.dims.dim);
    // SAFETY (of the `add`): row `token` of KV head `block.kv`, within the view.
    let at =
        |view: &View, token: usize| unsafe { view.ptr().add(block.kv * view.strides[1] + token * view.strides[2]) };
    if seq.prefix_len == 0 {
        return ((at(k, seq.first), k.strides[2], 1), (at(v, seq.first), v.strides[2], 1));
    }
    let keys = block.dims.keys;
    wide.resize(2 * keys * d, 0.0);
    let (wk, wv) = wide.split_at_mut(keys * d);
    for (view, dst) in [(k, &mut *wk), (v, &mut *wv)] {
        for (row, token) in dst.chunks_exact_mut(d).zip(seq.key_tokens()) {
            // SAFETY: `d` elements of a live row.
            row.copy_from_slice(unsafe { std::slice::from_raw_parts(at(view, token), d) });
        }
    }
    ((wk.as_ptr(), d, 1), (wv.as_ptr(), d, 1))
}

/// Where one segment of a block reads its queries (pointer, row stride) and writes its output
/// rows (offset in `[tokens, heads · dim]`, row stride).
fn segment_rows(q: &View, block: &Block, seg: &super::attention::Segment) -> (Mat, (usize, usize)) {
    let (dims, width) = (&block.dims, block.dims.heads * block.dims.dim);
    let head = block.kv * dims.group() + seg.head;
    let token = block.seq.first + seg.first;
    let [_, qh, qt] = q.strides;
    // SAFETY (of the `add`): the segment's first query, within q's view.
    let q_ptr = unsafe { q.ptr().add(head * qh + token * qt) };
    let (q_row, out_row) = if seg.by_head { (qh, dims.dim) } else { (qt, width) };
    ((q_ptr, q_row, 1), (token * width + head * dims.dim, out_row))
}

/// Scores `p` (`seg.rows` rows, `keys` apart) turned into probabilities: each row's keys after
/// its query masked (a single query sees them all), then a softmax over the keys the segment
/// sees.
fn probabilities(block: &Block, seg: &super::attention::Segment, p: &mut [f32]) {
    for (i, row) in p.chunks_mut(block.dims.keys).enumerate() {
        let row = &mut row[..seg.keys];
        if !seg.by_head {
            row[block.seq.prefix_len + seg.first + i + 1..].fill(f32::NEG_INFINITY);
        }
        kernels::softmax(row);
    }
}

/// The forward pass: `[tokens, heads · dim]`, and the probabilities of every block (zero where
/// masked or skipped) when `keep` is given.
fn forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    seqs: &[PackedSeq],
    keep: Option<&mut Vec<f32>>,
) -> FlexTensor {
    let (shape, tokens) = shapes(q, k);
    let (q, k, v) = (View::of(q), View::of(k), View::of(v));
    let (blocks, kept) = blocks(seqs, shape);
    let width = shape[0] * shape[2];
    let mut out = vec![0f32; tokens * width];
    let out_ptr = SharedMut(out.as_mut_ptr());

    let run_block = |block: &Block, probs: &mut [f32], wide: &mut Vec<f32>, keep: bool| {
        let (kp, vp) = block_kv(&k, &v, block, wide);
        block_forward(block, (&q, kp, vp), probs, keep, out_ptr);
    };

    match keep {
        Some(probs) => {
            *probs = vec![0f32; kept];
            let parts = split_probs(probs, &blocks);
            (blocks.par_iter().zip(parts)).for_each_init(Vec::new, |wide, (block, p)| run_block(block, p, wide, true));
        }
        None => {
            let scratch = blocks.iter().map(Block::scratch).max().unwrap_or(0);
            let work: usize = blocks.iter().map(|b| b.kept() * b.dims.dim).sum();
            let init = || (vec![0f32; scratch], Vec::new());
            if work >= PARALLEL_WORK {
                blocks.par_iter().for_each_init(init, |(p, wide), block| run_block(block, p, wide, false));
            } else {
                let (mut p, mut wide) = init();
                blocks.iter().for_each(|block| run_block(block, &mut p, &mut wide, false));
            }
        }
    }
    FlexTensor::from_data(TensorData::new(out, [tokens, width]))
}

/// One block's forward pass: its output rows written into `out` (`[tokens, heads · dim]`), its
/// probabilities into `probs` (all of them when `keep`, else one segment's at a time).
fn block_forward(block: &Block, (q, kp, vp): (&View, Mat, Mat), probs: &mut [f32], keep: bool, out: SharedMut) {
    let reads = Reads { own: BlockKv::F32(kp, vp), shared: None };
    let keys = block.dims.keys;
    for seg in &block.dims.segments() {
        let at = if keep { seg.block_row(block.dims.t) * keys } else { 0 };
        let p = &mut probs[at..at + seg.rows * keys];
        let (q_rows, (out_at, out_row)) = segment_rows(q, block, seg);
        segment_scores(&block.dims, seg, q_rows, reads, p);
        probabilities(block, seg, p);
        // SAFETY: the segment's output rows (one head's queries of this sequence, or its one
        // query's heads of the group) belong to this block alone; `out` outlives the call.
        unsafe { segment_values(&block.dims, seg, p, reads, (out.at(out_at), out_row)) };
    }
}

/// The blocks' parts of the kept probabilities, in block order.
fn split_probs<'a>(mut probs: &'a mut [f32], blocks: &[Block]) -> Vec<&'a mut [f32]> {
    let mut parts = Vec::with_capacity(blocks.len());
    for block in blocks {
        let (part, rest) = std::mem::take(&mut probs).split_at_mut(block.kept());
        parts.push(part);
        probs = rest;
    }
    parts
}

/// Gradients of q (`[1, heads, tokens, dim]`, a view of token-major memory), k and v (`[1,
/// kv_heads, tokens, dim]`, the same) for the output gradient `grad: [tokens, heads · dim]`.
/// Each block's key and value gradients are summed into the packed ones in block order: a
/// prefix's keys get every sequence's that continues it.
fn backward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    probs: &[f32],
    seqs: &[PackedSeq],
    grad: &FlexTensor,
) -> [FlexTensor; 3] {
    let (shape, tokens) = shapes(q, k);
    let [heads, kv_heads, d] = shape;
    let (q, k, v) = (View::of(q), View::of(k), View::of(v));
    let grad = contiguous(grad);
    let go = elems(&grad);
    let (blocks, _) = blocks(seqs, shape);
    let mut dq = vec![0f32; tokens * heads * d];
    let dq_ptr = SharedMut(dq.as_mut_ptr());
    let scratch = blocks.iter().map(Block::scratch).max().unwrap_or(0);

    let per_block: Vec<(Vec<f32>, Vec<f32>)> = blocks
        .par_iter()
        .map_init(
            || (vec![0f32; scratch], Vec::new()),
            |(ds, wide), block| {
                let (kp, vp) = block_kv(&k, &v, block, wide);
                let p_block = &probs[block.probs..block.probs + block.kept()];
                block_backward(block, (&q, kp, vp), p_block, (go, dq_ptr), ds)
            },
        )
        .collect();

    let mut dk = vec![0f32; tokens * kv_heads * d];
    let mut dv = vec![0f32; dk.len()];
    for (block, (bk, bv)) in blocks.iter().zip(per_block) {
        for ((token, rk), rv) in block.seq.key_tokens().zip(bk.chunks_exact(d)).zip(bv.chunks_exact(d)) {
            let at = (token * kv_heads + block.kv) * d;
            kernels::add_into(&mut dk[at..at + d], rk);
            kernels::add_into(&mut dv[at..at + d], rv);
        }
    }
    let token_major =
        |x: Vec<f32>, h: usize| FlexTensor::from_data(TensorData::new(x, [1, tokens, h, d])).transpose(1, 2);
    [token_major(dq, heads), token_major(dk, kv_heads), token_major(dv, kv_heads)]
}

/// One block's backward pass: its queries' gradient rows written into `dq`, and its keys' and
/// values' gradients (`[keys, dim]` each, the prefix's rows first) returned.
fn block_backward(
    block: &Block,
    (q, kp, vp): (&View, Mat, Mat),
    p_block: &[f32],
    (go, dq): (&[f32], SharedMut),
    ds: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
    let (keys, d) = (block.dims.keys, block.dims.dim);
    let mut dk = vec![0f32; keys * d];
    let mut dv = vec![0f32; keys * d];
    for seg in &block.dims.segments() {
        let p = &p_block[seg.block_row(block.dims.t) * keys..][..seg.rows * keys];
        let (q_rows, (at, row)) = segment_rows(q, block, seg);
        let g: Mat = (go[at..].as_ptr(), row, 1);
        // SAFETY: every operand is a live buffer of the block's shapes; dk, dv and ds are this
        // block's own, and the dq rows of this segment are written only here.
        unsafe { segment_backward(seg, [keys, d], (p, g, q_rows), (kp, vp), (dq.at(at), &mut dk, &mut dv), ds) };
    }
    (dk, dv)
}

// --- the autodiff op -----------------------------------------------------------------------

#[derive(Debug)]
struct PackedAttention;

/// Saved for the backward pass: q, k, v, the probabilities and the sequences.
type Saved = (FlexTensor, FlexTensor, FlexTensor, Arc<Vec<f32>>, Arc<[PackedSeq]>);

impl Backward<Cpu, 3> for PackedAttention {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (q, k, v, probs, seqs) = ops.state;
        let grad = grads.consume::<Cpu>(&ops.node);
        let gradients = backward(&q, &k, &v, &probs, &seqs, &grad);
        for (node, g) in ops.parents.into_iter().zip(gradients) {
            if let Some(node) = node {
                grads.register::<Cpu>(node.id, g);
            }
        }
    }
}

fn autodiff_forward(q: AdTensor, k: AdTensor, v: AdTensor, seqs: Arc<[PackedSeq]>) -> AdTensor {
    let prep = PackedAttention.prepare::<NoCheckpointing>([q.node.clone(), k.node.clone(), v.node.clone()]);
    match prep.compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let mut probs = Vec::new();
            let out = forward(&q.primitive, &k.primitive, &v.primitive, &seqs, Some(&mut probs));
            prep.finish((q.primitive, k.primitive, v.primitive, Arc::new(probs), seqs), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&q.primitive, &k.primitive, &v.primitive, &seqs, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::attention::attention as pass_attention;
    use crate::backend::flex_fast::without_fast_paths;
    use crate::dtype::ComputeDtype;
    use crate::model::layout::{Heads, Layout, LayoutTensors};
    use crate::model::{ModelConfig, Rope};
    use burn::backend::Autodiff;
    use burn::prelude::ElementConversion;
    use burn::tensor::Distribution;

    type Ad = Autodiff<Cpu>;

    fn rope(heads: usize, kv: usize, dim: usize) -> Rope {
        let v = serde_json::json!({
            "model_type": "llama", "vocab_size": 16, "hidden_size": heads * dim, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512
        });
        Rope::new(&ModelConfig::from_json(&v, "test").unwrap())
    }

    /// A prompt continued by three rows (of one token, three, and 70: two query blocks), a
    /// sequence of its own over two query blocks, and one of a single token; tokens packed in
    /// that order except the standalone sequence first, so that no sequence starts at 0 but one.
    fn seqs() -> (Vec<PackedSeq>, usize) {
        let (standalone, prompt) = (PackedSeq { first: 0, len: 66, prefix: 0, prefix_len: 0 }, 66);
        let p = PackedSeq { first: prompt, len: 5, prefix: 0, prefix_len: 0 };
        let row = |first, len| PackedSeq { first, len, prefix: prompt, prefix_len: 5 };
        let (a, b, c) = (row(71, 1), row(72, 3), row(75, 70));
        let single = PackedSeq { first: 145, len: 1, prefix: 0, prefix_len: 0 };
        (vec![standalone, p, a, b, c, single], 146)
    }

    /// Each sequence alone through the pass-by-pass attention (its prefix's keys, then its
    /// own, with the layout's mask), its output rows in packed order.
    fn by_sequence<B: Backend>(
        q: &Tensor<B, 4>,
        k: &Tensor<B, 4>,
        v: &Tensor<B, 4>,
        seqs: &[PackedSeq],
    ) -> Tensor<B, 2> {
        let [_, heads, tokens, dim] = q.dims();
        let kv = k.dims()[1];
        let rows = |x: &Tensor<B, 4>, h: usize, at: usize, n: usize| x.clone().slice([0..1, 0..h, at..at + n, 0..dim]);
        let mut out = Vec::new();
        for s in seqs {
            let keys = |x: &Tensor<B, 4>| {
                Tensor::cat(vec![rows(x, kv, s.prefix, s.prefix_len), rows(x, kv, s.first, s.len)], 2)
            };
            let layout = Layout { start: s.prefix_len, ..Layout::dense(1, s.len) };
            let heads_of = Heads { query: heads, key_value: kv, dim };
            let bias = LayoutTensors::<B>::new(&layout, &rope(heads, kv, dim), heads_of, &q.device()).bias;
            let y = pass_attention(rows(q, heads, s.first, s.len), keys(k), keys(v), bias.as_ref(), ComputeDtype::F32);
            out.push(y.reshape([s.len, heads * dim]));
        }
        let out = Tensor::cat(out, 0);
        assert_eq!(out.dims()[0], tokens, "the test's sequences cover the tokens in order");
        out
    }

    fn inputs<B: Backend>(tokens: usize, heads: usize, kv: usize, dim: usize) -> [Tensor<B, 4>; 3] {
        let (dev, u) = (Default::default(), Distribution::Uniform(-1.0, 1.0));
        // The projections' token-major rows, viewed head-major.
        let x = |h: usize| Tensor::<B, 4>::random([1, tokens, h, dim], u, &dev).swap_dims(1, 2);
        [x(heads), x(kv), x(kv)]
    }

    fn max_error<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
        (a - b).abs().max().into_scalar().elem()
    }

    #[test]
    fn packed_sequences_attend_as_each_alone_over_its_prefix() {
        let (seqs, tokens) = seqs();
        let seqs: Arc<[PackedSeq]> = seqs.into();
        for (heads, kv, dim) in [(4, 2, 8), (3, 3, 16), (9, 3, 64)] {
            let [q, k, v] = inputs::<Cpu>(tokens, heads, kv, dim);
            let on = backend::<Cpu>().expect("the CPU backend");
            let packed = attention(q.clone(), k.clone(), v.clone(), &seqs, on);
            let alone = by_sequence(&q, &k, &v, &seqs);
            let reference = without_fast_paths(|| by_sequence(&q, &k, &v, &seqs));
            // The same kernels on the same numbers, the mask set in place of a bias added.
            let bits = |t: Tensor<Cpu, 2>| {
                t.into_data().to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(bits(packed.clone()), bits(alone), "{heads} heads, {kv} KV heads of {dim}");
            // The autodiff op's forward (which keeps the probabilities) writes the same output.
            let [tq, tk, tv] = [&q, &k, &v].map(|x| Tensor::<Ad, 4>::from_inner(x.clone()).require_grad());
            let tracked = attention(tq, tk, tv, &seqs, backend::<Ad>().expect("autodiff on the CPU"));
            assert_eq!(bits(tracked.inner()), bits(packed.clone()), "tracked, {heads} heads, {kv} KV heads of {dim}");
            let err = max_error(packed, reference);
            assert!(err < 1e-5, "{heads} heads, {kv} KV heads of {dim}: max error {err} against burn's ops");
        }
    }

    #[test]
    fn packed_gradients_match_autodiff_of_each_sequence_alone() {
        let (seqs, tokens) = seqs();
        let seqs: Arc<[PackedSeq]> = seqs.into();
        for (heads, kv, dim) in [(4, 2, 8), (9, 3, 64)] {
            let [q, k, v] = inputs::<Ad>(tokens, heads, kv, dim);
            let weights =
                Tensor::<Ad, 2>::random([tokens, heads * dim], Distribution::Uniform(-1.0, 1.0), &Default::default());
            let grads_of = |packed: bool| {
                let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
                let out = match packed {
                    true => {
                        attention(q.clone(), k.clone(), v.clone(), &seqs, backend::<Ad>().expect("autodiff on the CPU"))
                    }
                    false => without_fast_paths(|| by_sequence(&q, &k, &v, &seqs)),
                };
                let g = (out * weights.clone()).sum().backward();
                [q.grad(&g).unwrap(), k.grad(&g).unwrap(), v.grad(&g).unwrap()]
            };
            let (packed, reference) = (grads_of(true), grads_of(false));
            for (name, (a, b)) in ["q", "k", "v"].iter().zip(packed.into_iter().zip(reference)) {
                let err = max_error(a, b);
                assert!(err < 1e-5, "{heads} heads, {kv} KV heads of {dim}: d{name} max error {err}");
            }
        }
    }
}
