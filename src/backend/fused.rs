//! Element-wise parts of the transformer fused into one pass each on the CPU backend, with
//! their backward passes as custom autodiff ops: SwiGLU's `silu(gate) ∘ up`, RMSNorm and RoPE.
//!
//! Through burn's generic ops, RMSNorm is six passes over the activations (square, mean, add,
//! sqrt, reciprocal, two products) and SiLU calls libm's `expf` per element; together they
//! were a fifth of a prefill. RoPE was a copy, two slices, a concatenation, two products and
//! a sum, each on one thread, and as many again backward. Here each is one pass of a
//! [`kernels`] kernel over the threads. On every other backend (CUDA, wgpu) the generic ops
//! run, and tests compare the two.
//!
//! The helpers at the top say which CPU backend `B` is and read its primitives;
//! [`super::attention`] and [`super::flex_fast`] use them too.

use std::any::TypeId;
use std::sync::Arc;

use burn::tensor::activation::silu;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use super::parallel_fill::{filled_in_chunks, mapped_in_chunks};
use super::primitive::{primitive, tensor};
use super::{Cpu, CpuAutodiff, flex_fast, kernels};
use crate::dtype::{cast_to, f32_weight};

// --- which CPU backend, and its primitives -------------------------------------------------

/// The float primitive of the CPU autodiff backend (a graph node around a [`FlexTensor`]).
pub(crate) type AdTensor = burn::tensor::ops::FloatTensor<CpuAutodiff>;

/// Which of the CPU backends `B` is, when the fused paths apply to f32 tensors of these
/// dtypes; `None` sends the caller to the generic ops.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CpuBackend {
    Plain,
    Autodiff,
}

pub(crate) fn cpu_backend<B: Backend>(dtypes: &[DType]) -> Option<CpuBackend> {
    if !flex_fast::enabled() || dtypes.iter().any(|&d| d != DType::F32) {
        return None;
    }
    if TypeId::of::<B>() == TypeId::of::<Cpu>() {
        Some(CpuBackend::Plain)
    } else if TypeId::of::<B>() == TypeId::of::<CpuAutodiff>() {
        Some(CpuBackend::Autodiff)
    } else {
        None
    }
}

/// The CPU tensor behind `t`; only once [`cpu_backend`] said `Plain`.
pub(crate) fn flex<B: Backend, const D: usize>(t: Tensor<B, D>) -> FlexTensor {
    primitive(t)
}

/// The autodiff tensor behind `t`; only once [`cpu_backend`] said `Autodiff`.
pub(crate) fn ad<B: Backend, const D: usize>(t: Tensor<B, D>) -> AdTensor {
    primitive(t)
}

/// `t` with its elements in row-major order (a copy only when `t` is a strided view); read
/// them with [`elems`]. An f32 view whose rows (its last dimension) are contiguous is copied
/// row by row over the threads: burn's copy walks such a view element by element on one
/// thread (the projections' views that RoPE and attention read, their gradients).
pub(crate) fn contiguous(t: &FlexTensor) -> FlexTensor {
    let layout = t.layout();
    let (shape, strides) = (layout.shape().to_vec(), layout.strides().to_vec());
    let rank = shape.len();
    let rows_contiguous = rank >= 2 && strides[rank - 1] == 1 && strides.iter().all(|&s| s >= 0);
    if t.dtype() != DType::F32 || t.is_contiguous() || !rows_contiguous || layout.num_elements() == 0 {
        return t.to_contiguous();
    }
    let all = &t.storage::<f32>()[layout.start_offset()..];
    let width = shape[rank - 1];
    let row_start = |mut row: usize| {
        let mut at = 0;
        for dim in (0..rank - 1).rev() {
            at += row % shape[dim] * strides[dim] as usize;
            row /= shape[dim];
        }
        at
    };
    let rows_per_task = (TASK / width).max(1);
    let data = filled_in_chunks(layout.num_elements(), rows_per_task * width, |task, out| {
        for (i, row) in out.chunks_exact_mut(width).enumerate() {
            row.copy_from_slice(&all[row_start(task * rows_per_task + i)..][..width]);
        }
    });
    FlexTensor::from_data(TensorData::new(data, shape))
}

/// `t` with its elements laid out in row-major order on the CPU backends ([`contiguous`]'s copy
/// over the threads where it is a strided view), the same tensor to autodiff: only where its
/// values sit in memory changes. For ops that copy a strided view element by element on one
/// thread before reading it (burn-flex's `slice_assign`); other backends get `t` back.
pub(crate) fn in_row_major_order<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    match cpu_backend::<B>(&[t.dtype()]) {
        Some(CpuBackend::Plain) => tensor(contiguous(&flex(t))),
        Some(CpuBackend::Autodiff) => {
            let mut t = ad(t);
            t.primitive = contiguous(&t.primitive);
            tensor(t)
        }
        None => t,
    }
}

/// The f32 elements of a contiguous `t` (from [`contiguous`]).
pub(crate) fn elems(t: &FlexTensor) -> &[f32] {
    &t.storage::<f32>()[t.layout().start_offset()..][..t.layout().num_elements()]
}

fn new_like(t: &FlexTensor, data: Vec<f32>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, t.layout().shape().to_vec()))
}

/// Elements per rayon task of the element-wise kernels.
const TASK: usize = 1 << 14;

/// `t` as a uniquely owned contiguous f32 buffer that may be written in place (a copy only
/// when it is shared or strided).
fn owned(t: FlexTensor) -> FlexTensor {
    let n = t.layout().num_elements();
    if t.is_unique() && t.layout().contiguous_offsets() == Some((0, n)) {
        t
    } else {
        FlexTensor::from_data(t.to_contiguous().into_data())
    }
}

// --- AdamW -------------------------------------------------------------------------------

/// One AdamW update of a parameter `p` with gradient `g` and moments `m`, `v` in a single
/// pass on the CPU backend (the tensor version is a dozen passes, each allocating); `None` on
/// other backends, whose callers run the tensor ops.
pub fn adamw<B: Backend, const D: usize>(
    p: Tensor<B, D>,
    g: Tensor<B, D>,
    m: Tensor<B, D>,
    v: Tensor<B, D>,
    c: kernels::AdamWStep,
) -> Result<[Tensor<B, D>; 3], [Tensor<B, D>; 4]> {
    let same_shape = [g.dims(), m.dims(), v.dims()].iter().all(|d| *d == p.dims());
    assert!(
        same_shape,
        "AdamW: parameter {:?}, gradient {:?}, moments {:?} {:?}",
        p.dims(),
        g.dims(),
        m.dims(),
        v.dims()
    );
    if cpu_backend::<B>(&[p.dtype(), g.dtype(), m.dtype(), v.dtype()]) != Some(CpuBackend::Plain) {
        return Err([p, g, m, v]);
    }
    let (mut p, g, mut m, mut v) = (owned(flex(p)), contiguous(&flex(g)), owned(flex(m)), owned(flex(v)));
    let n = p.layout().num_elements();
    let g_data = elems(&g);
    let (pd, md, vd) = (p.storage_mut::<f32>(), m.storage_mut::<f32>(), v.storage_mut::<f32>());
    pd[..n]
        .par_chunks_mut(TASK)
        .zip(g_data.par_chunks(TASK))
        .zip(md[..n].par_chunks_mut(TASK).zip(vd[..n].par_chunks_mut(TASK)))
        .for_each(|((p, g), (m, v))| kernels::adamw(p, g, m, v, c));
    Ok([tensor(p), tensor(m), tensor(v)])
}

// --- SwiGLU ------------------------------------------------------------------------------

/// `silu(gate) ∘ up` (same shapes).
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    match cpu_backend::<B>(&[gate.dtype(), up.dtype()]) {
        Some(CpuBackend::Plain) => tensor::<B, D, _>(swiglu_forward(&flex(gate), &flex(up))),
        Some(CpuBackend::Autodiff) => {
            let (g, u) = (ad(gate), ad(up));
            let out = swiglu_forward(&g.primitive, &u.primitive);
            let out =
                match SwiGlu.prepare::<NoCheckpointing>([g.node.clone(), u.node.clone()]).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => prep.finish((g.primitive, u.primitive), out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                };
            tensor::<B, D, _>(out)
        }
        None => {
            #[cfg(any(feature = "cuda", feature = "wgpu"))]
            let (gate, up) = match super::cube_fused::swiglu(gate, up) {
                Ok(out) => return out,
                Err(back) => back,
            };
            // The GPU's products may be in half precision (see `backend::gpu_kernels`).
            silu(f32_weight(gate)) * f32_weight(up)
        }
    }
}

fn swiglu_forward(gate: &FlexTensor, up: &FlexTensor) -> FlexTensor {
    let (g, u) = (contiguous(gate), contiguous(up));
    let (g_data, u_data) = (elems(&g), elems(&u));
    let n = g_data.len();
    let mut out = vec![0f32; n];
    if n <= TASK {
        // One task: the calling thread, not a hand-over to the pool (decoding at batch 1).
        kernels::silu_mul(g_data, u_data, &mut out);
    } else {
        out.par_chunks_mut(TASK)
            .zip(g_data.par_chunks(TASK).zip(u_data.par_chunks(TASK)))
            .for_each(|(o, (g, u))| kernels::silu_mul(g, u, o));
    }
    new_like(&g, out)
}

#[derive(Debug)]
struct SwiGlu;

impl Backward<Cpu, 2> for SwiGlu {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (gate, up) = ops.state;
        let dy = contiguous(&grads.consume::<Cpu>(&ops.node));
        let (g, u) = (contiguous(&gate), contiguous(&up));
        // Copied over the threads (a `to_vec` ran on one thread, the other core idle).
        let copy = |src: &[f32]| mapped_in_chunks(src, TASK, |src, part| part.copy_from_slice(src));
        let (mut dg, mut du) = (copy(elems(&g)), copy(elems(&u)));
        let dy_data = elems(&dy);
        dg.par_chunks_mut(TASK)
            .zip(du.par_chunks_mut(TASK).zip(dy_data.par_chunks(TASK)))
            .for_each(|(dg, (du, dy))| kernels::silu_mul_backward(dy, dg, du));
        let [node_gate, node_up] = ops.parents;
        if let Some(node) = node_gate {
            grads.register::<Cpu>(node.id, new_like(&g, dg));
        }
        if let Some(node) = node_up {
            grads.register::<Cpu>(node.id, new_like(&u, du));
        }
    }
}

// --- RMSNorm -----------------------------------------------------------------------------

/// `x / sqrt(mean(x²) + eps) ∘ w` over the last dimension of `x`.
pub fn rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, weight: Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    match cpu_backend::<B>(&[x.dtype(), weight.dtype()]) {
        Some(CpuBackend::Plain) => tensor::<B, D, _>(rms_norm_forward(&flex(x), &flex(weight), eps as f32).0),
        Some(CpuBackend::Autodiff) => {
            let (x, w) = (ad(x), ad(weight));
            let (out, r) = rms_norm_forward(&x.primitive, &w.primitive, eps as f32);
            let out =
                match RmsNormOp.prepare::<NoCheckpointing>([x.node.clone(), w.node.clone()]).compute_bound().stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish((x.primitive, w.primitive, Arc::new(r)), out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                };
            tensor::<B, D, _>(out)
        }
        None => {
            #[cfg(any(feature = "cuda", feature = "wgpu"))]
            let (x, weight) = match super::cube_fused::rms_norm(x, weight, eps) {
                Ok(out) => return out,
                Err(back) => back,
            };
            // A weight read as stored by the GPU kernels (see `model::transformer::RmsNorm`).
            let weight = cast_to(weight, x.dtype().into());
            let var = x.clone().powi_scalar(2).mean_dim(D - 1);
            let x = x * (var + eps).sqrt().recip();
            let mut shape = [1usize; D];
            shape[D - 1] = weight.dims()[0];
            x * weight.reshape(shape)
        }
    }
}

/// `x + delta` and the RMSNorm of that sum (the residual stream and the next layer's input):
/// one kernel on the plain GPU backends, the add and [`rms_norm`] elsewhere. `delta` (a
/// product's output) and `weight` may be in half precision where the GPU kernels run. The norm
/// comes in `out_dtype` (`x`'s if `None`).
pub fn add_rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    delta: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
    out_dtype: Option<DType>,
) -> (Tensor<B, D>, Tensor<B, D>) {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let (x, delta, weight) = match super::cube_fused::add_rms_norm(x, delta, weight, eps, out_dtype) {
        Ok(out) => return out,
        Err(back) => back,
    };
    let dtype = x.dtype().into();
    let sum = x + cast_to(delta, dtype);
    let normed = rms_norm(sum.clone(), cast_to(weight, dtype), eps);
    (sum, cast_to(normed, out_dtype.map_or(dtype, Into::into)))
}

/// Rows per rayon task for a row length of `n`.
fn rows_per_task(n: usize) -> usize {
    (TASK / n.max(1)).max(1)
}

/// The normalised rows and each row's `1 / sqrt(mean(x²) + eps)`.
fn rms_norm_forward(x: &FlexTensor, w: &FlexTensor, eps: f32) -> (FlexTensor, Vec<f32>) {
    let (x, w) = (contiguous(x), contiguous(w));
    let (x_data, w_data) = (elems(&x), elems(&w));
    let (n, total) = (w_data.len(), x_data.len());
    let mut out = vec![0f32; total];
    let mut r = vec![0f32; total / n.max(1)];
    let per = rows_per_task(n);
    let rows = |(o, (x, r)): (&mut [f32], (&[f32], &mut [f32]))| {
        for ((o, x), r) in o.chunks_mut(n).zip(x.chunks(n)).zip(r.iter_mut()) {
            *r = kernels::rms_norm(x, w_data, eps, o);
        }
    };
    if total <= per * n {
        rows((&mut out, (x_data, &mut r)));
    } else {
        out.par_chunks_mut(per * n).zip(x_data.par_chunks(per * n).zip(r.par_chunks_mut(per))).for_each(rows);
    }
    (new_like(&x, out), r)
}

#[derive(Debug)]
struct RmsNormOp;

impl Backward<Cpu, 2> for RmsNormOp {
    /// x, the weight, and each row's `1 / sqrt(mean(x²) + eps)`.
    type State = (FlexTensor, FlexTensor, Arc<Vec<f32>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, w, r) = ops.state;
        let dy = contiguous(&grads.consume::<Cpu>(&ops.node));
        let (x, w) = (contiguous(&x), contiguous(&w));
        let (x_data, w_data) = (elems(&x), elems(&w));
        let n = w_data.len();
        let mut dx = elems(&dy).to_vec();
        let per = rows_per_task(n);
        // One partial weight gradient per fixed chunk of rows, added up in chunk order: the
        // same bits in every run, whichever thread ran which chunk.
        let partials: Vec<Vec<f32>> = dx
            .par_chunks_mut(per * n)
            .zip(x_data.par_chunks(per * n).zip(r.par_chunks(per)))
            .map(|(dx, (x, r))| {
                let mut dw = vec![0f32; n];
                for ((dx, x), &r) in dx.chunks_mut(n).zip(x.chunks(n)).zip(r) {
                    kernels::rms_norm_backward(dx, x, w_data, r, &mut dw);
                }
                dw
            })
            .collect();
        let mut dw = vec![0f32; n];
        for partial in &partials {
            dw.iter_mut().zip(partial).for_each(|(a, b)| *a += b);
        }
        let [node_x, node_w] = ops.parents;
        if let Some(node) = node_x {
            grads.register::<Cpu>(node.id, new_like(&x, dx));
        }
        if let Some(node) = node_w {
            grads.register::<Cpu>(node.id, new_like(&w, dw));
        }
    }
}

// --- RoPE --------------------------------------------------------------------------------

/// `x ∘ cos + rotate_half(x) ∘ sin` for `x: [b, t, h, d]` and tables `[1 or b, t·h·d]` (`sin`
/// with rotate-half's sign folded in, [`crate::model::layout::RopeTables`]), the same numbers as
/// burn's ops give, on the CPU backend; `x` back on other backends or shapes.
pub fn rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Result<Tensor<B, 4>, Tensor<B, 4>> {
    let [b, t, h, d] = x.dims();
    let [rows, per] = cos.dims();
    // Tables that want a gradient (never the model's: built from data) take burn's ops.
    let constant = !cos.is_require_grad() && !sin.is_require_grad();
    let shapes =
        per == t * h * d && (rows == 1 || rows == b) && d > 0 && d.is_multiple_of(2) && sin.dims() == cos.dims();
    let fits = shapes && constant;
    match cpu_backend::<B>(&[x.dtype(), cos.dtype(), sin.dtype()]).filter(|_| fits) {
        Some(CpuBackend::Plain) => {
            let (cos, sin) = (flex(cos.clone()), flex(sin.clone()));
            Ok(tensor::<B, 4, _>(rope_pass(&flex(x), &cos, &sin, d, false)))
        }
        Some(CpuBackend::Autodiff) => {
            let (x, cos, sin) = (ad(x), ad(cos.clone()).primitive, ad(sin.clone()).primitive);
            let out = rope_pass(&x.primitive, &cos, &sin, d, false);
            // The tables are constants: only x has a gradient.
            let out = match Rope.prepare::<NoCheckpointing>([x.node.clone()]).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish((cos, sin, d), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            };
            Ok(tensor::<B, 4, _>(out))
        }
        None => Err(x),
    }
}

/// [`kernels::rope`] (or, `backward`, its gradient) over `x`'s heads of `d` elements, in
/// parallel tasks of whole heads, each reading the tables where its elements fall in them (one
/// row of tables repeats for every row of `x`).
fn rope_pass(x: &FlexTensor, cos: &FlexTensor, sin: &FlexTensor, d: usize, backward: bool) -> FlexTensor {
    let (x, cos, sin) = (contiguous(x), contiguous(cos), contiguous(sin));
    let (xs, cs, ss) = (elems(&x), elems(&cos), elems(&sin));
    let (period, chunk) = (cs.len(), (TASK / d).max(1) * d);
    let out = filled_in_chunks(xs.len(), chunk, |task, out| {
        let mut at = 0;
        while at < out.len() {
            let (g, within) = (task * chunk + at, (task * chunk + at) % period);
            let run = (period - within).min(out.len() - at);
            let (c, s) = (&cs[within..][..run], &ss[within..][..run]);
            kernels::rope(&xs[g..][..run], c, s, d, backward, &mut out[at..][..run]);
            at += run;
        }
    });
    new_like(&x, out)
}

#[derive(Debug)]
struct Rope;

impl Backward<Cpu, 1> for Rope {
    /// The tables and the head size.
    type State = (FlexTensor, FlexTensor, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (cos, sin, d) = &ops.state;
        let dy = grads.consume::<Cpu>(&ops.node);
        let [parent] = ops.parents;
        if let Some(node) = parent {
            grads.register::<Cpu>(node.id, rope_pass(&dy, cos, sin, *d, true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::flex_fast::without_fast_paths;
    use burn::backend::Autodiff;
    use burn::tensor::Distribution;

    type Ad = Autodiff<Cpu>;

    fn max_diff<const D: usize>(a: Tensor<Cpu, D>, b: Tensor<Cpu, D>) -> f32 {
        (a - b).abs().max().into_scalar()
    }

    fn random<B: Backend, const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
        Tensor::random(shape, Distribution::Uniform(-3.0, 3.0), &Default::default())
    }

    #[test]
    fn strided_views_are_copied_in_row_major_order() {
        let x = random::<Cpu, 4>([3, 5, 70, 64]);
        // Views with contiguous rows, copied row by row (a broadcast row among them), then
        // views burn copies: a non-unit last stride, an empty one.
        let by_rows = [
            x.clone().swap_dims(1, 2),
            x.clone().slice([0..3, 1..4, 2..70, 0..64]).swap_dims(0, 2),
            x.clone().slice([0..2, 0..5, 0..70, 8..40]),
            random::<Cpu, 4>([1, 1, 1, 64]).expand([3, 5, 7, 64]),
        ];
        let views = by_rows
            .iter()
            .map(|v| (v.clone(), true))
            .chain([(x.clone().swap_dims(2, 3), false), (x.clone().slice([1..2, 0..5, 0..0, 0..64]), false)]);
        // And matrices: columns sliced (rows contiguous, several tasks), a transpose (not).
        let matrices = [
            (random::<Cpu, 2>([300, 90]).slice([0..300, 10..80]), true),
            (random::<Cpu, 2>([90, 300]).transpose(), false),
        ];
        let views = views.map(|(v, rows)| (flex(v), rows)).chain(matrices.map(|(m, rows)| (flex(m), rows)));
        for (i, (t, rows)) in views.enumerate() {
            let last = t.layout().strides()[t.layout().shape().len() - 1];
            let strided = !t.is_contiguous() && last == 1 && t.layout().num_elements() > 0;
            assert_eq!(strided, rows, "view {i}: a view for the path it is meant to test");
            let (got, want) = (contiguous(&t), t.to_contiguous());
            assert_eq!(got.layout().shape(), want.layout().shape(), "view {i}");
            assert_eq!(elems(&got), elems(&want), "view {i}");
        }
    }

    #[test]
    fn swiglu_matches_the_generic_ops_forward_and_backward() {
        // A strided view as the gate, as a projection's output may be.
        let gate = random::<Cpu, 3>([3, 40, 7]).swap_dims(1, 2);
        let up = random::<Cpu, 3>([3, 7, 40]);
        let fused = swiglu(gate.clone(), up.clone());
        let reference = without_fast_paths(|| swiglu(gate.clone(), up.clone()));
        assert!(max_diff(fused, reference) < 1e-5);

        let weights = random::<Ad, 3>([3, 7, 40]);
        let grads_of = |fast: bool| {
            let g = Tensor::<Ad, 3>::from_inner(gate.clone()).require_grad();
            let u = Tensor::<Ad, 3>::from_inner(up.clone()).require_grad();
            let run = || (swiglu(g.clone(), u.clone()) * weights.clone()).sum();
            let grads = if fast { run() } else { without_fast_paths(run) }.backward();
            [g.grad(&grads).unwrap(), u.grad(&grads).unwrap()]
        };
        for (a, b) in grads_of(true).into_iter().zip(grads_of(false)) {
            let err = max_diff(a, b);
            assert!(err < 1e-4, "gradient differs by {err}");
        }
    }

    /// RoPE through burn's ops, as the model ran it before the fused op (the reference).
    fn generic_rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Tensor<B, 4> {
        let [b, t, h, d] = x.dims();
        let (n, half) = (b * t * h, d / 2);
        let pairs = x.clone().reshape([n, 2, half]);
        let swapped =
            Tensor::cat(vec![pairs.clone().slice([0..n, 1..2, 0..half]), pairs.slice([0..n, 0..1, 0..half])], 1);
        let view = [b, t * h * d];
        (x.reshape(view) * cos.clone() + swapped.reshape(view) * sin.clone()).reshape([b, t, h, d])
    }

    #[test]
    fn rope_matches_the_generic_ops_forward_and_backward_bit_for_bit() {
        // x a strided view (as the projections' may be), tables shared by every row or one row
        // each, one head of two elements, and more elements than one task (tasks that start
        // partway into a shared table).
        let shapes =
            [([2, 5, 3, 8], 1), ([3, 4, 2, 6], 3), ([1, 1, 1, 2], 1), ([2, 70, 4, 64], 2), ([2, 70, 4, 64], 1)];
        for ([b, t, h, d], rows) in shapes {
            let what = format!("{b}x{t}x{h}x{d}, {rows} rows of tables");
            let x = random::<Cpu, 4>([b, h, t, d]).swap_dims(1, 2);
            let (cos, sin) = (random::<Cpu, 2>([rows, t * h * d]), random::<Cpu, 2>([rows, t * h * d]));
            let fused = rope(x.clone(), &cos, &sin).unwrap_or_else(|_| panic!("{what}: the CPU path"));
            assert_eq!(fused.into_data(), generic_rope(x.clone(), &cos, &sin).into_data(), "{what}");

            let weights = random::<Ad, 4>([b, t, h, d]);
            let (cos, sin) = (Tensor::<Ad, 2>::from_inner(cos), Tensor::<Ad, 2>::from_inner(sin));
            let grad_of = |fast: bool| {
                let xs = Tensor::<Ad, 4>::from_inner(x.clone()).require_grad();
                let y = match fast {
                    true => rope(xs.clone(), &cos, &sin).unwrap_or_else(|_| panic!("{what}: the CPU path")),
                    false => generic_rope(xs.clone(), &cos, &sin),
                };
                xs.grad(&(y * weights.clone()).sum().backward()).unwrap()
            };
            assert_eq!(grad_of(true).into_data(), grad_of(false).into_data(), "{what}: the gradient");
        }
    }

    #[test]
    fn rms_norm_matches_the_generic_ops_forward_and_backward() {
        let x = random::<Cpu, 3>([2, 9, 33]);
        let w = random::<Cpu, 1>([33]);
        let fused = rms_norm(x.clone(), w.clone(), 1e-6);
        let reference = without_fast_paths(|| rms_norm(x.clone(), w.clone(), 1e-6));
        assert!(max_diff(fused, reference) < 1e-5);

        let weights = random::<Ad, 3>([2, 9, 33]);
        let grads_of = |fast: bool| {
            let xs = Tensor::<Ad, 3>::from_inner(x.clone()).require_grad();
            let ws = Tensor::<Ad, 1>::from_inner(w.clone()).require_grad();
            let run = || (rms_norm(xs.clone(), ws.clone(), 1e-6) * weights.clone()).sum();
            let grads = if fast { run() } else { without_fast_paths(run) }.backward();
            (xs.grad(&grads).unwrap(), ws.grad(&grads).unwrap())
        };
        let ((dx, dw), (rx, rw)) = (grads_of(true), grads_of(false));
        let (ex, ew) = (max_diff(dx, rx), max_diff(dw, rw));
        assert!(ex < 1e-4 && ew < 1e-4, "dx differs by {ex}, dw by {ew}");
    }
}
