//! RMSNorm, SwiGLU, RoPE, the attention's softmax and decoding's whole attention as one kernel
//! each on burn's GPU backends (CUDA, wgpu), for inference: sampling, scoring, held-out passes.
//!
//! Through burn's generic ops a decoding step launched about 68 kernels per Qwen3 layer
//! (lavapipe's execution log): RMSNorm is seven (square, mean, add, sqrt, reciprocal, two
//! products) and a Qwen3 layer has four of them, SiLU is six (burn's sigmoid goes through a
//! log), RoPE five per tensor, the softmax five. Decoding a few sequences is bound by those
//! launches rather than by arithmetic, on any GPU: each costs its launch and a round trip of the
//! activations through memory. Here each is one launch, with f32 arithmetic inside whatever the
//! tensors' dtype, and two more kernels merge neighbours: the residual add with the RMSNorm
//! after it ([`add_rms_norm`]), and the queries' or the keys' whole way from the projection to
//! the attention ([`heads`]: Qwen2's projection biases, Qwen3's per-head norm, RoPE, the
//! head-major layout, and for the keys the KV cache's writes of keys and values, in the cache's
//! dtype). With a few queries a sequence (decoding), the scores, their softmax and the values'
//! product are one kernel too ([`attention`]). A decoding step then launches 13 kernels per
//! layer: seven products (q, k, v, o, gate, up, down), two residual adds with their norms, the
//! two heads, the attention and SwiGLU.
//!
//! Inference takes these paths on the plain GPU backends. Under autodiff (training's passes)
//! RMSNorm and SwiGLU run as autodiff ops with backward kernels of their own, the rest as
//! burn's generic ops; a build with burn's `fusion` feature (whose tensors are not these) and
//! a test with the fast paths off ([`super::flex_fast::without_fast_paths`]) run the generic
//! ops throughout, which is how the tests compare the two on the same device. With gradient
//! checkpointing, the graph-free forward pass that keeps each layer's input runs the inference
//! kernels, and the recomputation the autodiff ones and burn's ops (in f32 they agree to about
//! 1e-6).

use std::any::TypeId;
use std::sync::OnceLock;

use burn::tensor::{DType, Tensor, TensorMetadata, backend::Backend};
use burn_autodiff::NodeId;
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::NoCheckpointing};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::ComputeClient;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::primitive::{primitive, tensor};

// --- the kernels -------------------------------------------------------------------------------

mod kernels {
    use cubecl::prelude::*;

    /// The sum (or, with `take_max`, the maximum) over a cube's units of `value`, which every
    /// unit gets: a tree over shared memory, whose `block` units (a power of two) all call this.
    #[cube]
    fn cube_reduce(value: f32, #[comptime] block: u32, #[comptime] take_max: bool) -> f32 {
        let mut shared = SharedMemory::<f32>::new(block as usize);
        let unit = UNIT_POS_X as usize;
        shared[unit] = value;
        sync_cube();
        // From the launch's cube size (= block): a comptime value cannot be a loop variable.
        let mut stride = (CUBE_DIM_X / 2) as usize;
        while stride > 0 {
            if unit < stride {
                let (a, b) = (shared[unit], shared[unit + stride]);
                if take_max {
                    shared[unit] = f32::max(a, b);
                } else {
                    shared[unit] = a + b;
                }
            }
            sync_cube();
            stride /= 2;
        }
        let total = shared[0];
        // Every unit has read the total before the memory is written again: by the next call,
        // or by another shared array that CUDA's compiler placed in the same space.
        sync_cube();
        total
    }

    /// `1 / sqrt(mean(x²) + eps)` over the `n` elements of `x` from `from` (each plus its
    /// element of `bias` from `bias_from`, when `biased`), which every unit of the cube (all
    /// calling this) gets.
    #[cube]
    fn rms_scale<F: Float, B: Float>(
        x: &Tensor<F>,
        from: usize,
        n: usize,
        eps: f32,
        bias: &Tensor<B>,
        bias_from: usize,
        #[comptime] biased: bool,
        #[comptime] block: u32,
    ) -> f32 {
        let mut squares = f32::new(0.0);
        let mut i = UNIT_POS_X as usize;
        while i < n {
            let v = plus_bias(x, from + i, bias, bias_from + i, biased);
            squares += v * v;
            i += block as usize;
        }
        let total = cube_reduce(squares, block, false);
        f32::new(1.0) / f32::sqrt(total / f32::cast_from(n) + eps)
    }

    /// `x[i]` plus `bias[j]` when `biased`, in f32.
    #[cube]
    fn plus_bias<F: Float, B: Float>(
        x: &Tensor<F>,
        i: usize,
        bias: &Tensor<B>,
        j: usize,
        #[comptime] biased: bool,
    ) -> f32 {
        let mut v = f32::cast_from(x[i]);
        if biased {
            v += f32::cast_from(bias[j]);
        }
        v
    }

    /// The row this cube works on (rows are spread over x and y: x alone is limited to 65,535).
    #[cube]
    fn cube_row() -> usize {
        (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
    }

    /// `x / sqrt(mean(x²) + eps) ∘ w` for each row of `n` elements: a cube per row.
    #[cube(launch)]
    pub(super) fn rms_norm_kernel<F: Float, W: Float>(
        x: &Tensor<F>,
        w: &Tensor<W>,
        out: &mut Tensor<F>,
        rows: u32,
        n: u32,
        row_stride: u32,
        eps: f32,
        #[comptime] block: u32,
        #[define(F, W)] _dtypes: [StorageType; 2],
    ) {
        let row = cube_row();
        if row >= rows as usize {
            terminate!();
        }
        let n = n as usize;
        let (from, to) = (row * row_stride as usize, row * n);
        let scale = rms_scale(x, from, n, eps, x, 0, false, block);
        let mut i = UNIT_POS_X as usize;
        while i < n {
            out[to + i] = F::cast_from(f32::cast_from(x[from + i]) * scale * f32::cast_from(w[i]));
            i += block as usize;
        }
    }

    /// The gradients of [`rms_norm_kernel`] for the output's gradient `dy` (contiguous rows of
    /// `n`, a cube per row): `dx = r (dy ∘ w − x r² mean(dy ∘ w ∘ x))` with `r = 1 /
    /// sqrt(mean(x²) + eps)`, and `dy ∘ x r` per row in `dw_rows`, whose sum over the rows is
    /// the weight's gradient.
    #[cube(launch)]
    pub(super) fn rms_norm_backward_kernel<F: Float, W: Float>(
        x: &Tensor<F>,
        w: &Tensor<W>,
        dy: &Tensor<F>,
        dx: &mut Tensor<F>,
        dw_rows: &mut Tensor<F>,
        rows: u32,
        n: u32,
        eps: f32,
        #[comptime] block: u32,
        #[define(F, W)] _dtypes: [StorageType; 2],
    ) {
        let row = cube_row();
        if row >= rows as usize {
            terminate!();
        }
        let n = n as usize;
        let from = row * n;
        let r = rms_scale(x, from, n, eps, x, 0, false, block);
        let mut part = f32::new(0.0);
        let mut i = UNIT_POS_X as usize;
        while i < n {
            part += f32::cast_from(dy[from + i]) * f32::cast_from(w[i]) * f32::cast_from(x[from + i]);
            i += block as usize;
        }
        let c = r * r * cube_reduce(part, block, false) / f32::cast_from(n);
        let mut i = UNIT_POS_X as usize;
        while i < n {
            let (d, e) = (f32::cast_from(dy[from + i]), f32::cast_from(x[from + i]));
            dw_rows[from + i] = F::cast_from(d * e * r);
            dx[from + i] = F::cast_from(r * (d * f32::cast_from(w[i]) - e * c));
            i += block as usize;
        }
    }

    /// `silu(gate) ∘ up`, element by element.
    #[cube(launch)]
    pub(super) fn swiglu_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        out: &mut Tensor<F>,
        #[define(F)] _dtype: StorageType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= out.len() {
            terminate!();
        }
        let g = f32::cast_from(gate[i]);
        let silu = g / (f32::new(1.0) + f32::exp(-g));
        out[i] = F::cast_from(silu * f32::cast_from(up[i]));
    }

    /// The gradients of `silu(gate) ∘ up` for the output's gradient `dy`: `dy ∘ up ∘ silu'(gate)`
    /// and `dy ∘ silu(gate)`, where `silu'(g) = σ(g) (1 + g (1 − σ(g)))`.
    #[cube(launch)]
    pub(super) fn swiglu_backward_kernel<F: Float, G: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        dy: &Tensor<G>,
        d_gate: &mut Tensor<F>,
        d_up: &mut Tensor<F>,
        #[define(F, G)] _dtypes: [StorageType; 2],
    ) {
        let i = ABSOLUTE_POS;
        if i >= d_gate.len() {
            terminate!();
        }
        let (g, dy) = (f32::cast_from(gate[i]), f32::cast_from(dy[i]));
        let s = f32::new(1.0) / (f32::new(1.0) + f32::exp(-g));
        d_gate[i] = F::cast_from(dy * f32::cast_from(up[i]) * s * (f32::new(1.0) + g * (f32::new(1.0) - s)));
        d_up[i] = F::cast_from(dy * g * s);
    }

    /// `x·cos + swap(x)·sin`, where `swap` exchanges the two halves of each head's `d` elements and
    /// the tables hold `period` elements (one sequence's, repeated over the batch, or all of them).
    #[cube(launch)]
    pub(super) fn rope_kernel<F: Float, T: Float>(
        x: &Tensor<F>,
        cos: &Tensor<T>,
        sin: &Tensor<T>,
        out: &mut Tensor<F>,
        d: u32,
        period: u32,
        #[define(F, T)] _dtypes: [StorageType; 2],
    ) {
        let i = ABSOLUTE_POS;
        if i >= out.len() {
            terminate!();
        }
        let (d, half) = (d as usize, (d / 2) as usize);
        let partner = if i % d < half { i + half } else { i - half };
        let t = i % period as usize;
        let v = f32::cast_from(x[i]) * f32::cast_from(cos[t]) + f32::cast_from(x[partner]) * f32::cast_from(sin[t]);
        out[i] = F::cast_from(v);
    }

    /// `x + delta` (rows of `n`, `x_stride` and `delta_stride` apart), written contiguous to
    /// `sum`, and its RMSNorm (`w`, `eps`) to `out` (in the dtype of the products that read
    /// it): the residual add and the next norm in one pass. A cube per row.
    #[cube(launch)]
    pub(super) fn add_rms_norm_kernel<F: Float, D: Float, W: Float, O: Float>(
        x: &Tensor<F>,
        delta: &Tensor<D>,
        w: &Tensor<W>,
        sum: &mut Tensor<F>,
        out: &mut Tensor<O>,
        rows: u32,
        n: u32,
        x_stride: u32,
        delta_stride: u32,
        eps: f32,
        #[comptime] block: u32,
        #[define(F, D, W, O)] _dtypes: [StorageType; 4],
    ) {
        let row = cube_row();
        if row >= rows as usize {
            terminate!();
        }
        let n = n as usize;
        let (a, b, to) = (row * x_stride as usize, row * delta_stride as usize, row * n);
        let mut squares = f32::new(0.0);
        let mut i = UNIT_POS_X as usize;
        while i < n {
            // Rounded to F first, as the separate add would store it.
            let v = F::cast_from(f32::cast_from(x[a + i]) + f32::cast_from(delta[b + i]));
            sum[to + i] = v;
            let v = f32::cast_from(v);
            squares += v * v;
            i += block as usize;
        }
        let total = cube_reduce(squares, block, false);
        let scale = f32::new(1.0) / f32::sqrt(total / f32::cast_from(n) + eps);
        let mut i = UNIT_POS_X as usize;
        while i < n {
            out[to + i] = O::cast_from(f32::cast_from(sum[to + i]) * scale * f32::cast_from(w[i]));
            i += block as usize;
        }
    }

    /// Where [`heads_kernel`] reads and writes.
    #[derive(CubeLaunch, CubeType)]
    pub(super) struct HeadsAt {
        /// Tokens per sequence, heads per token, elements per head.
        pub(super) t: u32,
        pub(super) heads: u32,
        pub(super) d: u32,
        /// Distance between tokens in `x` and in `v`.
        pub(super) x_stride: u32,
        pub(super) v_stride: u32,
        /// The destinations' slots per row and head, and the first slot written.
        pub(super) cap: u32,
        pub(super) start: u32,
        /// Elements of the RoPE tables (one sequence's, or the batch's).
        pub(super) period: u32,
    }

    /// The heads of `x` (tokens of `heads · d`, sequence-major: `[b, t, heads, d]`), each
    /// plus its projection's bias (`x_bias`, with `x_biased`), normalised (with `norm`: RMSNorm
    /// by `w`, `eps`) and rotated (RoPE, the tables as in [`rope_kernel`]), written head-major
    /// into `out` (`[b, heads, cap, d]`) from slot `start`; with `with_v`, the heads of `v`
    /// (plus `v_bias`, with `v_biased`) copied alike into `v_out`. A cube per head of a token:
    /// the queries' or the keys' whole path from the projection to the attention (and the KV
    /// cache) in one launch instead of up to six (nine with biases in half precision).
    #[cube(launch)]
    pub(super) fn heads_kernel<F: Float, V: Float, B: Float, W: Float, T: Float, C: Float>(
        x: &Tensor<F>,
        v: &Tensor<V>,
        x_bias: &Tensor<B>,
        v_bias: &Tensor<B>,
        w: &Tensor<W>,
        cos: &Tensor<T>,
        sin: &Tensor<T>,
        out: &mut Tensor<C>,
        v_out: &mut Tensor<C>,
        rows: u32,
        at: HeadsAt,
        eps: f32,
        #[comptime] block: u32,
        #[comptime] norm: bool,
        #[comptime] with_v: bool,
        #[comptime] x_biased: bool,
        #[comptime] v_biased: bool,
        #[define(F, V, B, W, T, C)] _dtypes: [StorageType; 6],
    ) {
        let row = cube_row();
        if row >= rows as usize {
            terminate!();
        }
        let (d, heads, t) = (at.d as usize, at.heads as usize, at.t as usize);
        let half = d / 2;
        let (head, token) = (row % heads, row / heads);
        let (seq, slot) = (token / t, token % t);
        let from = token * at.x_stride as usize + head * d;
        let to = ((seq * heads + head) * at.cap as usize + at.start as usize + slot) * d;
        // The tables run over the tokens' elements in `[b, t, heads, d]` order.
        let table = row * d;
        // The biases' elements of this head.
        let bias_from = head * d;
        let mut scale = f32::new(1.0);
        if norm {
            scale = rms_scale(x, from, d, eps, x_bias, bias_from, x_biased, block);
        }
        let mut i = UNIT_POS_X as usize;
        while i < d {
            let partner = if i < half { i + half } else { i - half };
            // In f32 throughout, as the model's f32 path (which widens a half-precision
            // product first) computes them.
            let mut e = plus_bias(x, from + i, x_bias, bias_from + i, x_biased) * scale;
            let mut p = plus_bias(x, from + partner, x_bias, bias_from + partner, x_biased) * scale;
            if norm {
                e *= f32::cast_from(w[i]);
                p *= f32::cast_from(w[partner]);
            }
            let k = (table + i) % at.period as usize;
            out[to + i] = C::cast_from(e * f32::cast_from(cos[k]) + p * f32::cast_from(sin[k]));
            if with_v {
                let from_v = token * at.v_stride as usize + head * d;
                v_out[to + i] = C::cast_from(plus_bias(v, from_v + i, v_bias, bias_from + i, v_biased));
            }
            i += block as usize;
        }
    }

    /// `softmax(scores + bias)` over rows of `n`, `row_stride` apart in the scores (a pitched
    /// tensor's), written contiguous: a cube per row. The bias holds `bias_period` logical
    /// elements (0: none, `bias` unread) in rows of `bias_per`, `bias_stride` apart, repeated
    /// over the scores.
    #[cube(launch)]
    pub(super) fn softmax_kernel<F: Float, T: Float>(
        scores: &Tensor<F>,
        bias: &Tensor<T>,
        out: &mut Tensor<F>,
        rows: u32,
        n: u32,
        row_stride: u32,
        bias_period: u32,
        bias_per: u32,
        bias_stride: u32,
        #[comptime] block: u32,
        #[define(F, T)] _dtypes: [StorageType; 2],
    ) {
        let row = cube_row();
        if row >= rows as usize {
            terminate!();
        }
        let n = n as usize;
        let (from, to) = (row * row_stride as usize, row * n);
        let bias_at = BiasAt { period: bias_period, per: bias_per, stride: bias_stride };
        let unit = UNIT_POS_X as usize;
        // Every unit starts from a real element (n ≥ 1): WGSL has no −∞ literal.
        let mut top = biased(scores, bias, bias_at, from, to, unit % n);
        let mut i = unit + block as usize;
        while i < n {
            top = f32::max(top, biased(scores, bias, bias_at, from, to, i));
            i += block as usize;
        }
        let top = cube_reduce(top, block, true);
        let mut sum = f32::new(0.0);
        let mut i = unit;
        while i < n {
            sum += f32::exp(biased(scores, bias, bias_at, from, to, i) - top);
            i += block as usize;
        }
        let inv = f32::new(1.0) / cube_reduce(sum, block, false);
        let mut i = unit;
        while i < n {
            out[to + i] = F::cast_from(f32::exp(biased(scores, bias, bias_at, from, to, i) - top) * inv);
            i += block as usize;
        }
    }

    /// Where the bias's elements are (see [`softmax_kernel`]).
    #[derive(CubeType, Clone, Copy)]
    struct BiasAt {
        period: u32,
        per: u32,
        stride: u32,
    }

    /// Element `i` of the row at `from` in the scores (`to` in logical order) plus its bias, in
    /// f32.
    #[cube]
    fn biased<F: Float, T: Float>(
        scores: &Tensor<F>,
        bias: &Tensor<T>,
        at: BiasAt,
        from: usize,
        to: usize,
        i: usize,
    ) -> f32 {
        f32::cast_from(scores[from + i]) + bias_of(bias, at, to + i)
    }

    /// The bias of the scores' element `i` (in logical order), in f32; zero without a bias.
    #[cube]
    fn bias_of<T: Float>(bias: &Tensor<T>, at: BiasAt, i: usize) -> f32 {
        let mut b = f32::new(0.0);
        if at.period > 0 {
            let j = i % at.period as usize;
            let per = at.per as usize;
            b = f32::cast_from(bias[(j / per) * at.stride as usize + j % per]);
        }
        b
    }

    /// Where [`attend_kernel`] reads and writes.
    #[derive(CubeLaunch, CubeType)]
    pub(super) struct AttendAt {
        /// Query heads, query heads per KV head, queries per sequence, keys, elements per head.
        pub(super) heads: u32,
        pub(super) group: u32,
        pub(super) t: u32,
        pub(super) keys: u32,
        pub(super) d: u32,
        /// Distance between query rows.
        pub(super) q_stride: u32,
        /// Distances between sequences, KV heads and slots in the keys and in the values.
        pub(super) k_batch: u32,
        pub(super) k_head: u32,
        pub(super) k_slot: u32,
        pub(super) v_batch: u32,
        pub(super) v_head: u32,
        pub(super) v_slot: u32,
        /// The bias, as [`softmax_kernel`] reads it (period 0: none).
        pub(super) bias_period: u32,
        pub(super) bias_per: u32,
        pub(super) bias_stride: u32,
    }

    /// `softmax(q kᵀ + bias) v` for each query row of `q` (`[b, heads, t, d]`, rows `q_stride`
    /// apart), query head `i` reading KV head `i / group`, written token-major (`[b, t, heads ·
    /// d]`): a cube per query row, the keys in tiles of `block` (one a unit: its score; then one
    /// element of the output a unit, over the tile's probabilities), with the running maximum
    /// and sum of an online softmax. The scores, the softmax and the values' product of a
    /// decoding step in one launch instead of three. Needs `d ≤ block`.
    #[cube(launch)]
    pub(super) fn attend_kernel<Q: Float, K: Float, V: Float, B: Float, O: Float>(
        q: &Tensor<Q>,
        k: &Tensor<K>,
        v: &Tensor<V>,
        bias: &Tensor<B>,
        out: &mut Tensor<O>,
        rows: u32,
        at: AttendAt,
        #[comptime] block: u32,
        #[define(Q, K, V, B, O)] _dtypes: [StorageType; 5],
    ) {
        let row = cube_row();
        if row >= rows as usize {
            terminate!();
        }
        let (heads, t, keys, d) = (at.heads as usize, at.t as usize, at.keys as usize, at.d as usize);
        let (seq, head, query) = (row / (heads * t), (row / t) % heads, row % t);
        let kv = head / at.group as usize;
        let k_from = seq * at.k_batch as usize + kv * at.k_head as usize;
        let v_from = seq * at.v_batch as usize + kv * at.v_head as usize;
        let (k_slot, v_slot) = (at.k_slot as usize, at.v_slot as usize);
        let bias_at = BiasAt { period: at.bias_period, per: at.bias_per, stride: at.bias_stride };
        let unit = UNIT_POS_X as usize;
        let mut q_row = SharedMemory::<f32>::new(block as usize);
        if unit < d {
            q_row[unit] = f32::cast_from(q[row * at.q_stride as usize + unit]);
        }
        let mut probs = SharedMemory::<f32>::new(block as usize);
        sync_cube();
        // "Nothing yet": finite, as WGSL has no −∞ literal; a masked key's −∞ stays below it,
        // so a tile of masked keys adds zeros rather than NaN.
        let nothing = f32::new(-3.0e38);
        let (mut top, mut sum, mut acc) = (nothing, f32::new(0.0), f32::new(0.0));
        let mut first = 0usize;
        while first < keys {
            let key = first + unit;
            let mut score = nothing;
            if key < keys {
                let mut dot = f32::new(0.0);
                let mut e = 0usize;
                while e < d {
                    dot += q_row[e] * f32::cast_from(k[k_from + key * k_slot + e]);
                    e += 1;
                }
                // The scores' logical order, `[b, heads, t, keys]`, is the bias's.
                score = dot + bias_of(bias, bias_at, row * keys + key);
            }
            let new_top = f32::max(top, cube_reduce(score, block, true));
            let mut p = f32::new(0.0);
            if key < keys {
                p = f32::exp(score - new_top);
            }
            let rescale = f32::exp(top - new_top);
            probs[unit] = p;
            sync_cube();
            sum = sum * rescale + p;
            if unit < d {
                let mut n = keys - first;
                if n > block as usize {
                    n = block as usize;
                }
                let mut total = acc * rescale;
                let mut j = 0usize;
                while j < n {
                    total += probs[j] * f32::cast_from(v[v_from + (first + j) * v_slot + unit]);
                    j += 1;
                }
                acc = total;
            }
            // Every unit has read the tile's probabilities before the next tile writes them, or
            // the next reduction's shared memory (CUDA's compiler may place both in one space).
            sync_cube();
            top = new_top;
            first += block as usize;
        }
        let sum = cube_reduce(sum, block, false);
        if unit < d {
            let (seq_query, hd) = (seq * t + query, heads * d);
            out[seq_query * hd + head * d + unit] = O::cast_from(acc / sum);
        }
    }
}

// --- launching them on burn's tensors ----------------------------------------------------------

/// The launch of a row kernel over `rows` rows of `n`: a cube per row (spread over x and y when
/// there are more rows than x holds), and its units, which the kernel's shared memory is sized
/// for (`block`, passed to it): a power of two from 32 (a warp) to 256, about four elements of a
/// row each. Fewer units mean fewer steps in the tree and cheaper barriers (on lavapipe, which
/// runs a cube's units on one CPU thread, a prefill's softmax took 180 ms with a unit per key).
fn row_launch(rows: usize, n: usize) -> (CubeCount, CubeDim, u32) {
    let block = (n.next_power_of_two() / 4).clamp(32, 256) as u32;
    (row_grid(rows), CubeDim::new_1d(block), block)
}

/// A cube per row, spread over x and y when there are more rows than x holds.
fn row_grid(rows: usize) -> CubeCount {
    let x = rows.clamp(1, 65_535);
    CubeCount::Static(x as u32, rows.div_ceil(x) as u32, 1)
}

/// The launch of an element-wise kernel over `units` elements.
fn element_launch<R: CubeRuntime>(client: &ComputeClient<R>, units: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new(client, units);
    (calculate_cube_count_elemwise(client, units, cube_dim), cube_dim)
}

/// `t` as rows of its last dimension and the distance between them. Rows stored apart, each
/// contiguous and at one distance (CUDA's allocator pads rows to 512 bytes: a matmul's scores of
/// 300 keys, an attention mask; a view of the first columns), are read where they are; any
/// other layout is copied contiguous first.
fn in_rows<R: CubeRuntime>(t: CubeTensor<R>) -> (CubeTensor<R>, usize) {
    let (shape, strides) = (t.meta.shape().to_vec(), t.meta.strides().to_vec());
    let n = shape.last().copied().unwrap_or(1);
    let rows = t.meta.num_elements() / n.max(1);
    match row_stride(&shape, &strides) {
        // Rows far apart (a view of a few columns of a wide tensor) must stay within the
        // kernels' 32-bit indices; CUDA's padding (under 512 bytes a row) is what
        // `addressable` allows for.
        Some(stride) if rows.saturating_mul(stride).saturating_add(n) <= u32::MAX as usize && small_buffer(&t) => {
            (t, stride)
        }
        _ => (into_contiguous(t), n),
    }
}

/// Whether the buffer `t` is a view of has at most `u32::MAX` elements: the kernels' bounds
/// checks compare indices with its length, which cubecl passes as a u32.
fn small_buffer<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    t.handle.size_in_used() / t.dtype.size() as u64 <= u32::MAX as u64
}

/// The distance between the rows of a tensor whose rows (last dimension) are contiguous and
/// evenly spaced in row-major order; `None` for any other layout.
fn row_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let rank = shape.len();
    if rank == 0 || strides[rank - 1] != 1 && shape[rank - 1] > 1 {
        return None;
    }
    if rank == 1 {
        return Some(shape[0]);
    }
    let stride = strides[rank - 2];
    let even = (0..rank - 2).all(|i| strides[i] == shape[i + 1] * strides[i + 1]);
    (stride >= shape[rank - 1] && even).then_some(stride)
}

/// A contiguous output of `t`'s shape and dtype (CUDA's usual allocation would pad its rows).
fn output_like<R: CubeRuntime>(t: &CubeTensor<R>) -> CubeTensor<R> {
    empty_device_contiguous_dtype(t.client.clone(), t.device.clone(), t.shape(), t.dtype)
}

/// Whether 32-bit indices reach every element of a tensor of `elements` in `rows` rows, each
/// padded by up to 512 bytes (the kernels index with `u32`; larger tensors take burn's ops).
fn addressable(elements: usize, rows: usize) -> bool {
    elements.saturating_add(rows.saturating_mul(256)) <= u32::MAX as usize
}

fn float(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

fn rms_norm_cube<R: CubeRuntime>(x: CubeTensor<R>, w: CubeTensor<R>, eps: f32) -> CubeTensor<R> {
    let ((x, row_stride), w) = (in_rows(x), into_contiguous(w));
    let n = w.meta.num_elements();
    let rows = x.meta.num_elements() / n;
    let out = output_like(&x);
    let (cubes, cube_dim, block) = row_launch(rows, n);
    let (client, dtypes) = (x.client.clone(), [x.dtype.into(), w.dtype.into()]);
    kernels::rms_norm_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        x.into_tensor_arg(),
        w.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        n as u32,
        row_stride as u32,
        eps,
        block,
        dtypes,
    );
    out
}

/// The gradients of [`rms_norm_cube`]'s operands for its output's gradient `dy`.
fn rms_norm_backward_cube<R: Aliased>(
    x: CubeTensor<R>,
    w: CubeTensor<R>,
    dy: CubeTensor<R>,
    eps: f32,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (x, w, dy) = (into_contiguous(x), into_contiguous(w), into_contiguous(dy));
    let n = w.meta.num_elements();
    let rows = x.meta.num_elements() / n;
    let (dx, dw_rows) = (output_like(&x), output_like(&x));
    let (cubes, cube_dim, block) = row_launch(rows, n);
    let (client, dtypes) = (x.client.clone(), [x.dtype.into(), w.dtype.into()]);
    kernels::rms_norm_backward_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        x.into_tensor_arg(),
        w.into_tensor_arg(),
        dy.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        dw_rows.clone().into_tensor_arg(),
        rows as u32,
        n as u32,
        eps,
        block,
        dtypes,
    );
    // The weight's gradient: the rows' parts summed by burn's reduction.
    let dw_rows = tensor::<Cube<R>, 2, CubeTensor<R>>(dw_rows).reshape([rows, n]);
    (dx, primitive(dw_rows.sum_dim(0).reshape([n])))
}

fn swiglu_cube<R: CubeRuntime>(gate: CubeTensor<R>, up: CubeTensor<R>) -> CubeTensor<R> {
    let (gate, up) = (into_contiguous(gate), into_contiguous(up));
    let out = output_like(&gate);
    let units = out.meta.num_elements();
    let (client, dtype) = (gate.client.clone(), gate.dtype);
    let (cubes, cube_dim) = element_launch(&client, units);
    kernels::swiglu_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        gate.into_tensor_arg(),
        up.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        dtype.into(),
    );
    out
}

/// The gradients of [`swiglu_cube`]'s operands for its output's gradient `dy`.
fn swiglu_backward_cube<R: CubeRuntime>(
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
    dy: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (gate, up, dy) = (into_contiguous(gate), into_contiguous(up), into_contiguous(dy));
    let (d_gate, d_up) = (output_like(&gate), output_like(&gate));
    let units = gate.meta.num_elements();
    let (client, dtypes) = (gate.client.clone(), [gate.dtype.into(), dy.dtype.into()]);
    let (cubes, cube_dim) = element_launch(&client, units);
    kernels::swiglu_backward_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        gate.into_tensor_arg(),
        up.into_tensor_arg(),
        dy.into_tensor_arg(),
        d_gate.clone().into_tensor_arg(),
        d_up.clone().into_tensor_arg(),
        dtypes,
    );
    (d_gate, d_up)
}

fn rope_cube<R: CubeRuntime>(x: CubeTensor<R>, cos: CubeTensor<R>, sin: CubeTensor<R>, d: usize) -> CubeTensor<R> {
    let (x, cos, sin) = (into_contiguous(x), into_contiguous(cos), into_contiguous(sin));
    let out = output_like(&x);
    let units = out.meta.num_elements();
    let period = cos.meta.num_elements();
    let (client, dtypes) = (x.client.clone(), [x.dtype.into(), cos.dtype.into()]);
    let (cubes, cube_dim) = element_launch(&client, units);
    kernels::rope_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        x.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        d as u32,
        period as u32,
        dtypes,
    );
    out
}

fn add_rms_norm_cube<R: CubeRuntime>(
    x: CubeTensor<R>,
    delta: CubeTensor<R>,
    w: CubeTensor<R>,
    eps: f32,
    out_dtype: DType,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let ((x, x_stride), (delta, delta_stride), w) = (in_rows(x), in_rows(delta), into_contiguous(w));
    let n = w.meta.num_elements();
    let rows = x.meta.num_elements() / n;
    let sum = output_like(&x);
    let out = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), x.shape(), out_dtype);
    let (cubes, cube_dim, block) = row_launch(rows, n);
    let dtypes = [x.dtype.into(), delta.dtype.into(), w.dtype.into(), out_dtype.into()];
    let client = x.client.clone();
    kernels::add_rms_norm_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        x.into_tensor_arg(),
        delta.into_tensor_arg(),
        w.into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        n as u32,
        x_stride as u32,
        delta_stride as u32,
        eps,
        block,
        dtypes,
    );
    (sum, out)
}

/// `t` where a kernel may write into it: itself when nothing else holds its buffer and it is
/// contiguous, else a contiguous copy (burn's `copy` would keep CUDA's padded rows).
fn writable<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.is_contiguous() && t.can_mut() {
        return t;
    }
    let (client, device, dtype) = (t.client.clone(), t.device.clone(), t.dtype);
    let copy = cubecl::std::tensor::into_contiguous(&client, t.binding(), dtype.into());
    CubeTensor::new(client, copy.handle, *copy.metadata, device, dtype)
}

/// [`heads_cube`]'s operands.
struct HeadsJob<R: CubeRuntime> {
    /// `[b·t, heads·d]` rows, perhaps apart, and the bias (`[heads·d]`) to add.
    x: CubeTensor<R>,
    x_bias: Option<CubeTensor<R>>,
    v: Option<ValuesJob<R>>,
    norm: Option<(CubeTensor<R>, f32)>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    /// `[b, heads, cap, d]`
    dest: CubeTensor<R>,
    start: usize,
    t: usize,
}

/// Values to copy beside [`HeadsJob::x`], their bias (of `x_bias`'s dtype), and their
/// destination.
struct ValuesJob<R: CubeRuntime> {
    v: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
    dest: CubeTensor<R>,
}

fn heads_cube<R: CubeRuntime>(job: HeadsJob<R>) -> (CubeTensor<R>, Option<CubeTensor<R>>) {
    let [_, heads, cap, d] = job.dest.meta.shape().to_vec()[..] else { unreachable!("a 4-D destination") };
    let (x, x_stride) = in_rows(job.x);
    let rows = x.meta.num_elements() / d;
    let dest = writable(job.dest);
    let (cos, sin) = (into_contiguous(job.cos), into_contiguous(job.sin));
    let period = cos.meta.num_elements();
    let ((v, v_stride), v_bias, v_dest) = match job.v {
        Some(ValuesJob { v, bias, dest }) => (in_rows(v), bias.map(into_contiguous), Some(writable(dest))),
        // Unread: `x` and `dest` stand in.
        None => ((x.clone(), x_stride), None, None),
    };
    let x_bias = job.x_bias.map(into_contiguous);
    let biased = [x_bias.is_some(), v_bias.is_some()];
    // An unread bias's stand-in: the other bias, else `x` (the two share a dtype).
    let stand_in = x_bias.clone().or_else(|| v_bias.clone()).unwrap_or_else(|| x.clone());
    let (x_bias, v_bias) = (x_bias.unwrap_or_else(|| stand_in.clone()), v_bias.unwrap_or(stand_in));
    let with_norm = job.norm.is_some();
    let (w, eps) = match job.norm {
        Some((w, eps)) => (into_contiguous(w), eps),
        None => (x.clone(), 0.0),
    };
    let (cubes, cube_dim, block) = row_launch(rows, d);
    let client = x.client.clone();
    let dtypes = [x.dtype, v.dtype, x_bias.dtype, w.dtype, cos.dtype, dest.dtype].map(Into::into);
    let at = kernels::HeadsAtLaunch::new(
        job.t as u32,
        heads as u32,
        d as u32,
        x_stride as u32,
        v_stride as u32,
        cap as u32,
        job.start as u32,
        period as u32,
    );
    let with_v = v_dest.is_some();
    // Unwritten without values, but a buffer of its own: wgpu refuses a buffer bound twice
    // for writing.
    let v_out = v_dest
        .clone()
        .unwrap_or_else(|| empty_device_contiguous_dtype(client.clone(), dest.device.clone(), [1].into(), dest.dtype));
    kernels::heads_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        x.into_tensor_arg(),
        v.into_tensor_arg(),
        x_bias.into_tensor_arg(),
        v_bias.into_tensor_arg(),
        w.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        dest.clone().into_tensor_arg(),
        v_out.into_tensor_arg(),
        rows as u32,
        at,
        eps,
        block,
        with_norm,
        with_v,
        biased[0],
        biased[1],
        dtypes,
    );
    (dest, v_dest)
}

/// The bias as the softmax and attention kernels read it, with its period, row length and row
/// stride (`[0, 1, 1]` without one, when `stand_in` is passed unread in its place).
fn bias_rows<R: CubeRuntime>(bias: Option<CubeTensor<R>>, stand_in: &CubeTensor<R>) -> (CubeTensor<R>, [usize; 3]) {
    match bias {
        Some(b) => {
            let per = b.meta.shape()[b.meta.shape().len() - 1];
            let (b, stride) = in_rows(b);
            let period = b.meta.num_elements();
            (b, [period, per, stride])
        }
        None => (stand_in.clone(), [0, 1, 1]),
    }
}

fn softmax_cube<R: CubeRuntime>(scores: CubeTensor<R>, bias: Option<CubeTensor<R>>, n: usize) -> CubeTensor<R> {
    let (scores, row_stride) = in_rows(scores);
    let rows = scores.meta.num_elements() / n;
    let (bias, [period, per, stride]) = bias_rows(bias, &scores);
    let out = output_like(&scores);
    let (cubes, cube_dim, block) = row_launch(rows, n);
    let (client, dtypes) = (scores.client.clone(), [scores.dtype.into(), bias.dtype.into()]);
    kernels::softmax_kernel::launch::<R>(
        &client,
        cubes,
        cube_dim,
        scores.into_tensor_arg(),
        bias.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        n as u32,
        row_stride as u32,
        period as u32,
        per as u32,
        stride as u32,
        block,
        dtypes,
    );
    out
}

/// A `[b, heads, slots, d]` tensor read where it is (a KV cache's first slots) when its last
/// dimension is contiguous and it and the buffer it views stay within 32-bit indices, else a
/// contiguous copy; and its distances between sequences, heads and slots.
fn in_slots<R: CubeRuntime>(t: CubeTensor<R>) -> (CubeTensor<R>, [usize; 3]) {
    let (shape, s) = (t.meta.shape().to_vec(), t.meta.strides().to_vec());
    let unit = s[3] == 1 || shape[3] == 1;
    // The largest element index of the view, plus one.
    let span = (shape[0] - 1) * s[0] + (shape[1] - 1) * s[1] + (shape[2] - 1) * s[2] + shape[3];
    let t = if unit && span <= u32::MAX as usize && small_buffer(&t) { t } else { into_contiguous(t) };
    let s = t.meta.strides().to_vec();
    (t, [s[0], s[1], s[2]])
}

/// Units of the attention kernel's cubes: one an element of a head (`d`, at most 256), and
/// keys in tiles as many.
fn attend_block(d: usize) -> usize {
    d.next_power_of_two().max(32)
}

fn attend_cube<R: CubeRuntime>(
    [q, k, v]: [CubeTensor<R>; 3],
    bias: Option<CubeTensor<R>>,
    out_dtype: DType,
) -> CubeTensor<R> {
    let [b, h, t, d] = q.meta.shape().to_vec()[..] else { unreachable!("4-D queries") };
    let [_, kvh, keys, _] = k.meta.shape().to_vec()[..] else { unreachable!("4-D keys") };
    let ((q, q_stride), (k, [kb, kh, ks]), (v, [vb, vh, vs])) = (in_rows(q), in_slots(k), in_slots(v));
    let (bias, [period, per, stride]) = bias_rows(bias, &q);
    let out = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), [b, t, h * d].into(), out_dtype);
    let rows = b * h * t;
    let block = attend_block(d);
    let at = kernels::AttendAtLaunch::new(
        h as u32,
        (h / kvh) as u32,
        t as u32,
        keys as u32,
        d as u32,
        q_stride as u32,
        kb as u32,
        kh as u32,
        ks as u32,
        vb as u32,
        vh as u32,
        vs as u32,
        period as u32,
        per as u32,
        stride as u32,
    );
    let client = q.client.clone();
    let dtypes = [q.dtype.into(), k.dtype.into(), v.dtype.into(), bias.dtype.into(), out_dtype.into()];
    kernels::attend_kernel::launch::<R>(
        &client,
        row_grid(rows),
        CubeDim::new_1d(block as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        bias.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        at,
        block as u32,
        dtypes,
    );
    out
}

// --- training: the kernels as autodiff ops ------------------------------------------------------

/// burn's plain GPU backend on runtime `R`, as `burn::backend::{Cuda, Wgpu}` name it.
type Cube<R> = burn_cubecl::CubeBackend<R, f32, i32, <R as Aliased>::Bool>;

/// A runtime with the bool element of burn's backend alias for it: `Cuda`'s bools are `u8`,
/// `Wgpu`'s `u32`. Autodiff's tensors name the whole backend, so an op registered for the other
/// bool type would never be taken (the kernels' own tensors do not name it).
trait Aliased: CubeRuntime {
    type Bool: burn_cubecl::BoolElement;
}

#[cfg(feature = "wgpu")]
impl Aliased for cubecl::wgpu::WgpuRuntime {
    type Bool = u32;
}

#[cfg(feature = "cuda")]
impl Aliased for cubecl::cuda::CudaRuntime {
    type Bool = u8;
}

/// The float primitive of `Autodiff<Cube<R>>`: a graph node around a [`CubeTensor`].
type Tracked<R> = burn::tensor::ops::FloatTensor<burn_autodiff::Autodiff<Cube<R>>>;

/// SwiGLU as one autodiff op: one kernel forward, one backward (burn's graph runs about eight
/// launches each way, each a pass over the MLP's widest activations).
#[derive(Debug)]
struct SwiGluOp;

impl<R: Aliased> Backward<Cube<R>, 2> for SwiGluOp {
    /// The gate and the up projection.
    type State = (CubeTensor<R>, CubeTensor<R>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (gate, up) = ops.state;
        let dy = grads.consume::<Cube<R>>(&ops.node);
        let (d_gate, d_up) = swiglu_backward_cube::<R>(gate, up, dy);
        register_both::<R>(grads, ops.parents.map(|p| p.map(|node| node.id)), [d_gate, d_up]);
    }
}

/// RMSNorm as one autodiff op: one kernel forward, one and a sum over rows backward (burn's
/// graph runs seven launches forward and about twice as many backward).
#[derive(Debug)]
struct RmsNormOp;

impl<R: Aliased> Backward<Cube<R>, 2> for RmsNormOp {
    /// The input, the weight and `eps`.
    type State = (CubeTensor<R>, CubeTensor<R>, f32);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, w, eps) = ops.state;
        let dy = grads.consume::<Cube<R>>(&ops.node);
        let (dx, dw) = rms_norm_backward_cube::<R>(x, w, dy, eps);
        register_both::<R>(grads, ops.parents.map(|p| p.map(|node| node.id)), [dx, dw]);
    }
}

/// Hands a two-operand op's gradients to those of its parents that track one.
fn register_both<R: Aliased>(grads: &mut Gradients, parents: [Option<NodeId>; 2], ds: [CubeTensor<R>; 2]) {
    for (parent, d) in parents.into_iter().zip(ds) {
        if let Some(id) = parent {
            grads.register::<Cube<R>>(id, d);
        }
    }
}

fn rms_norm_tracked<R: Aliased>(x: Tracked<R>, w: Tracked<R>, eps: f32) -> Tracked<R> {
    let out = rms_norm_cube::<R>(x.primitive.clone(), w.primitive.clone(), eps);
    match RmsNormOp.prepare::<NoCheckpointing>([x.node.clone(), w.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((x.primitive, w.primitive, eps), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

fn swiglu_tracked<R: Aliased>(gate: Tracked<R>, up: Tracked<R>) -> Tracked<R> {
    let out = swiglu_cube::<R>(gate.primitive.clone(), up.primitive.clone());
    match SwiGluOp.prepare::<NoCheckpointing>([gate.node.clone(), up.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((gate.primitive, up.primitive), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

// --- which backend, and the entry points -------------------------------------------------------

/// Whether `B`'s float tensors are `CubeTensor<R>` (the plain GPU backend on runtime `R`), the
/// fast paths are on and the kernels are not switched off.
fn is<B: Backend, R: CubeRuntime>() -> bool {
    has_primitive::<B, CubeTensor<R>>()
}

/// Whether `B`'s float tensors are `P` (the plain GPU backend's [`CubeTensor`], or `Autodiff`'s
/// [`Tracked`] one for training), the fast paths on and the kernels not switched off.
fn has_primitive<B: Backend, P: 'static>() -> bool {
    super::flex_fast::enabled() && TypeId::of::<B::FloatTensorPrimitive>() == TypeId::of::<P>() && switched_on()
}

/// `HACPO_GPU_KERNELS=off` runs burn's generic ops instead: to compare the two in one build, or
/// to rule these kernels out on a GPU where something looks wrong.
fn switched_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let value = std::env::var("HACPO_GPU_KERNELS").ok();
        let on = match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("" | "on" | "1" | "true" | "yes") => true,
            Some("off" | "0" | "false" | "no") => false,
            Some(other) => {
                tracing::warn!("HACPO_GPU_KERNELS={other:?} is neither on nor off; hacpo's GPU kernels stay on");
                true
            }
        };
        match on {
            true => tracing::info!(
                "GPU: hacpo's RMSNorm, SwiGLU, RoPE, KV-cache, softmax and attention kernels (HACPO_GPU_KERNELS=off: burn's ops)"
            ),
            false => tracing::info!("GPU: burn's generic ops instead of hacpo's kernels (HACPO_GPU_KERNELS=off)"),
        }
        on
    })
}

/// Runs `$body` with `$r` the runtime of the GPU backend `$b` is, returning its tensor from the
/// enclosing function; falls through when `$b` is none of them. With `Tracked;` first, the same
/// for `Autodiff` over those backends (training's passes).
macro_rules! on_cube {
    ($b:ty, $r:ident => $body:expr) => {
        on_cube!(CubeTensor; $b, $r => $body)
    };
    ($primitive:ident; $b:ty, $r:ident => $body:expr) => {
        #[cfg(feature = "wgpu")]
        {
            type $r = cubecl::wgpu::WgpuRuntime;
            if has_primitive::<$b, $primitive<$r>>() {
                return Ok($body);
            }
        }
        #[cfg(feature = "cuda")]
        {
            type $r = cubecl::cuda::CudaRuntime;
            if has_primitive::<$b, $primitive<$r>>() {
                return Ok($body);
            }
        }
    };
}

/// RMSNorm over the last dimension of `x` (`weight` as long); the operands back on other
/// backends or dtypes.
#[allow(clippy::type_complexity)]
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, 1>)> {
    let (n, total) = (weight.dims()[0], x.shape().num_elements());
    let fits = float(x.dtype()) && float(weight.dtype()) && x.dims()[D - 1] == n;
    if fits && total > 0 && addressable(total, total / n) {
        on_cube!(B, R => tensor::<B, D, CubeTensor<R>>(rms_norm_cube::<R>(primitive(x), primitive(weight), eps as f32)));
        // Training's norms run in f32, the weight cast to it in the graph (as the generic ops
        // cast it), so that its gradient reaches a weight stored in another dtype.
        if x.dtype() == DType::F32 {
            let weight = crate::dtype::cast_to(weight, burn::tensor::FloatDType::F32);
            on_cube!(Tracked; B, R => {
                let (x, w) = (primitive(x), primitive(weight));
                tensor::<B, D, Tracked<R>>(rms_norm_tracked::<R>(x, w, eps as f32))
            });
            return Err((x, weight));
        }
    }
    Err((x, weight))
}

/// `silu(gate) ∘ up` (same shapes and dtype), with its gradient under autodiff; the operands
/// back otherwise.
#[allow(clippy::type_complexity)]
pub fn swiglu<B: Backend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    let fits = gate.dims() == up.dims() && gate.dtype() == up.dtype() && float(gate.dtype());
    if fits && addressable(gate.shape().num_elements(), 0) {
        on_cube!(B, R => tensor::<B, D, CubeTensor<R>>(swiglu_cube::<R>(primitive(gate), primitive(up))));
        // Training's products are f32, as the generic ops' result would be.
        if gate.dtype() == DType::F32 {
            on_cube!(Tracked; B, R => tensor::<B, D, Tracked<R>>(swiglu_tracked::<R>(primitive(gate), primitive(up))));
        }
    }
    Err((gate, up))
}

/// RoPE on `x: [b, t, h, d]` with tables of `[1 or b, t·h·d]` (see `model::transformer`); `x`
/// back otherwise.
pub fn rope<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Result<Tensor<B, 4>, Tensor<B, 4>> {
    let [b, t, h, d] = x.dims();
    let [rows, per] = cos.dims();
    let fits = float(x.dtype())
        && float(cos.dtype())
        && cos.dtype() == sin.dtype()
        && sin.dims() == cos.dims()
        && per == t * h * d
        && (rows == 1 || rows == b)
        && d % 2 == 0;
    if fits && b * per > 0 && addressable(b * per, 0) {
        on_cube!(B, R => tensor::<B, 4, CubeTensor<R>>(rope_cube::<R>(primitive(x), primitive(cos.clone()), primitive(sin.clone()), d)));
    }
    Err(x)
}

/// Whether the kernels read `bias` (if any) over scores of `total` elements in rows of `n`: a
/// float tensor of whole rows that repeats over the scores, within 32-bit indices.
fn bias_repeats<B: Backend>(bias: Option<&Tensor<B, 2>>, n: usize, total: usize) -> bool {
    bias.is_none_or(|b| {
        let period = b.shape().num_elements();
        float(b.dtype())
            && period > 0
            && period.is_multiple_of(n)
            && total.is_multiple_of(period)
            && addressable(period, b.dims()[0])
    })
}

/// `softmax(scores + bias)` over the last dimension, `bias` (any float dtype) holding a whole
/// number of rows that repeat over the scores; `scores` back otherwise.
pub fn softmax<B: Backend, const D: usize>(
    scores: Tensor<B, D>,
    bias: Option<&Tensor<B, 2>>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    let n = scores.dims()[D - 1];
    let total = scores.shape().num_elements();
    if float(scores.dtype()) && bias_repeats(bias, n, total) && n > 0 && total > 0 && addressable(total, total / n) {
        on_cube!(B, R => tensor::<B, D, CubeTensor<R>>(softmax_cube::<R>(primitive(scores), bias.map(|b| primitive(b.clone())), n)));
    }
    Err(scores)
}

/// Queries per sequence up to which [`attention`] runs as one kernel: decoding's one, or a
/// few. Each query's cube reads all of its head's keys and values, which a prefill's products
/// read once for a tile of queries.
pub const FEW_QUERIES: usize = 8;

/// `softmax(q kᵀ + bias) v` as [`crate::backend::attention::attention`] takes its operands
/// (`q: [b, heads, t, d]` scaled, `k, v: [b, kv_heads, keys, d]`, the bias `[1, t·keys]` or
/// `[b, heads·t·keys]`), in one launch for up to [`FEW_QUERIES`] queries a sequence: `[b, t,
/// heads·d]` in `out_dtype`, computed in f32. The operands back otherwise.
#[allow(clippy::type_complexity)]
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<&Tensor<B, 2>>,
    out_dtype: DType,
) -> Result<Tensor<B, 3>, [Tensor<B, 4>; 3]> {
    let [b, h, t, d] = q.dims();
    let [_, kvh, keys, _] = k.dims();
    let scores = b * h * t * keys;
    let bias_fits = bias_repeats(bias, keys, scores);
    let dtypes = [q.dtype(), k.dtype(), v.dtype(), out_dtype].into_iter().all(float);
    let fits = (1..=FEW_QUERIES).contains(&t) && (1..=256).contains(&d) && keys > 0 && b > 0 && h % kvh == 0;
    let sizes = [scores, b * t * h * d, b * kvh * keys * d];
    if fits && dtypes && bias_fits && sizes.iter().all(|&n| addressable(n, b * h * t)) {
        on_cube!(B, R => {
            let [q, k, v] = [q, k, v].map(primitive::<B, 4, CubeTensor<R>>);
            let out = attend_cube::<R>([q, k, v], bias.map(|x| primitive(x.clone())), out_dtype);
            tensor::<B, 3, CubeTensor<R>>(out)
        });
    }
    Err([q, k, v])
}

/// Whether `B` is one of the plain GPU backends these kernels run on (and they are on).
pub fn on_gpu<B: Backend>() -> bool {
    #[cfg(feature = "wgpu")]
    if is::<B, cubecl::wgpu::WgpuRuntime>() {
        return true;
    }
    #[cfg(feature = "cuda")]
    if is::<B, cubecl::cuda::CudaRuntime>() {
        return true;
    }
    false
}

/// `x + delta` and its RMSNorm by `weight` over the last dimension (as [`rms_norm`], in one
/// pass; the norm in `out_dtype`, `x`'s if `None`); the operands back on other backends or
/// dtypes.
#[allow(clippy::type_complexity)]
pub fn add_rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    delta: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
    out_dtype: Option<DType>,
) -> Result<(Tensor<B, D>, Tensor<B, D>), (Tensor<B, D>, Tensor<B, D>, Tensor<B, 1>)> {
    let out_dtype = out_dtype.unwrap_or(x.dtype());
    let (n, total) = (weight.dims()[0], x.shape().num_elements());
    let fits = x.dims() == delta.dims()
        && float(x.dtype())
        && float(delta.dtype())
        && float(weight.dtype())
        && float(out_dtype)
        && x.dims()[D - 1] == n;
    if fits && total > 0 && addressable(total, total / n) {
        on_cube!(B, R => {
            let (x, delta, w) = (primitive(x), primitive(delta), primitive(weight));
            let (sum, out) = add_rms_norm_cube::<R>(x, delta, w, eps as f32, out_dtype);
            (tensor::<B, D, CubeTensor<R>>(sum), tensor::<B, D, CubeTensor<R>>(out))
        });
    }
    Err((x, delta, weight))
}

/// The heads of a projection, for [`heads`]: `[b·t, heads·d]` rows (`x`), `[b, t, heads, d]`
/// (`dims`), plus the projection's `bias` (`[heads·d]`) if given, RMSNorm'd by `norm` if given,
/// then rotated by RoPE tables `[1 or b, t·heads·d]` (`cos`, and `sin` with the sign folded
/// in; see `model::layout`).
pub struct Heads<'a, B: Backend> {
    pub x: Tensor<B, 2>,
    pub dims: [usize; 4],
    pub bias: Option<Tensor<B, 1>>,
    pub norm: Option<(Tensor<B, 1>, f64)>,
    pub cos: &'a Tensor<B, 2>,
    pub sin: &'a Tensor<B, 2>,
}

impl<B: Backend> Heads<'_, B> {
    /// Whether [`heads`] runs them here, with `values` beside them (same shape, with their
    /// bias if given) and into buffers of `cap` slots from slot `start` (`into`; otherwise new
    /// ones).
    pub fn fit(&self, values: Option<(&Tensor<B, 2>, Option<&Tensor<B, 1>>)>, into: Option<[usize; 2]>) -> bool {
        let [b, t, heads, d] = self.dims;
        let [rows, per] = self.cos.dims();
        let tables = float(self.cos.dtype())
            && self.cos.dtype() == self.sin.dtype()
            && self.sin.dims() == self.cos.dims()
            && per == t * heads * d
            && (rows == 1 || rows == b);
        let bias_fits = |bias: Option<&Tensor<B, 1>>| bias.is_none_or(|x| float(x.dtype()) && x.dims() == [heads * d]);
        let source = float(self.x.dtype())
            && self.x.dims() == [b * t, heads * d]
            && bias_fits(self.bias.as_ref())
            && values.is_none_or(|(v, bias)| v.dims() == self.x.dims() && float(v.dtype()) && bias_fits(bias))
            && self.norm.as_ref().is_none_or(|(w, _)| float(w.dtype()) && w.dims() == [d]);
        let dest = into.is_none_or(|[cap, start]| start + t <= cap && addressable(b * heads * cap * d, 0));
        let total = b * t * heads * d;
        on_gpu::<B>() && tables && source && dest && d % 2 == 0 && total > 0 && addressable(total, b * t)
    }
}

/// Where [`heads`] writes: new buffers `[b, heads, t, d]` of a dtype, or the two buffers
/// `[b, heads, cap, d]` of a KV cache from a slot.
pub enum Dest<B: Backend> {
    New(DType),
    Cache([Tensor<B, 4>; 2], usize),
}

/// The heads of `heads` biased, normalised and rotated in one launch, written head-major (see
/// [`Dest`]), with `values`' heads (plus their bias) copied beside them (into the second
/// buffer): the path from the projections to the attention, and the KV cache's write. Returns
/// the written buffers. Only where [`Heads::fit`] said so.
#[allow(clippy::type_complexity)]
pub fn heads<B: Backend>(
    heads: Heads<'_, B>,
    values: Option<(Tensor<B, 2>, Option<Tensor<B, 1>>)>,
    into: Dest<B>,
) -> (Tensor<B, 4>, Option<Tensor<B, 4>>) {
    // The kernel reads both biases in one dtype (they are rounded alike: this is a safeguard).
    let values = values.map(|(v, bias)| match (&heads.bias, bias) {
        (Some(x), Some(bias)) if bias.dtype() != x.dtype() => (v, Some(bias.cast(x.dtype()))),
        (_, bias) => (v, bias),
    });
    let run = || -> Result<_, ()> {
        on_cube!(B, R => {
            let [b, t, h, d] = heads.dims;
            let x = primitive::<B, 2, CubeTensor<R>>(heads.x);
            let (dest, v, start) = match into {
                Dest::Cache([k, v_dest], start) => {
                    let dest = primitive(v_dest);
                    (primitive(k), values.map(|(v, bias)| ValuesJob { v: primitive(v), bias: bias.map(primitive), dest }), start)
                }
                Dest::New(dtype) => {
                    let fresh = || {
                        empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [b, h, t, d].into(), dtype)
                    };
                    let job = |(v, bias): (Tensor<B, 2>, Option<Tensor<B, 1>>)| ValuesJob {
                        v: primitive(v),
                        bias: bias.map(primitive),
                        dest: fresh(),
                    };
                    (fresh(), values.map(job), 0)
                }
            };
            let job = HeadsJob {
                x,
                x_bias: heads.bias.map(primitive),
                v,
                norm: heads.norm.map(|(w, eps)| (primitive(w), eps as f32)),
                cos: primitive(heads.cos.clone()),
                sin: primitive(heads.sin.clone()),
                dest,
                start,
                t,
            };
            let (k, v) = heads_cube::<R>(job);
            (tensor::<B, 4, CubeTensor<R>>(k), v.map(tensor::<B, 4, CubeTensor<R>>))
        });
        Err(())
    };
    run().expect("heads on a GPU backend that Heads::fit accepted")
}

#[cfg(test)]
mod tests {
    use super::row_stride;

    /// Training's ops are taken by the float primitive's type, which names the whole backend:
    /// that of `Autodiff` over burn's own aliases (CUDA's bools are u8, wgpu's u32) must be the
    /// one they are registered for. With u32 for both, CUDA trained with burn's graph unseen.
    /// (A build with burn's `fusion` wraps the aliases, and keeps burn's ops by design.)
    #[test]
    fn the_autodiff_ops_are_registered_for_burns_backend_aliases() {
        use std::any::TypeId;
        fn check<B: burn::tensor::backend::Backend, R: super::Aliased>() {
            type Primitive<B> = burn::tensor::ops::FloatTensor<burn::backend::Autodiff<B>>;
            if TypeId::of::<B::FloatTensorPrimitive>() == TypeId::of::<super::CubeTensor<R>>() {
                assert_eq!(TypeId::of::<Primitive<B>>(), TypeId::of::<super::Tracked<R>>());
            }
        }
        #[cfg(feature = "wgpu")]
        check::<crate::backend::Wgpu, cubecl::wgpu::WgpuRuntime>();
        #[cfg(feature = "cuda")]
        check::<crate::backend::Cuda, cubecl::cuda::CudaRuntime>();
    }

    #[test]
    fn rows_are_read_in_place_only_when_evenly_spaced_and_contiguous() {
        assert_eq!(row_stride(&[2, 3, 5], &[15, 5, 1]), Some(5)); // contiguous
        assert_eq!(row_stride(&[2, 3, 5], &[24, 8, 1]), Some(8)); // padded to 8
        assert_eq!(row_stride(&[7], &[1]), Some(7));
        assert_eq!(row_stride(&[2, 3, 5], &[24, 7, 1]), None); // leading dims not even
        assert_eq!(row_stride(&[3, 5], &[1, 3]), None); // transposed
        assert_eq!(row_stride(&[3, 5], &[4, 1]), None); // rows overlap
        assert_eq!(row_stride(&[3, 1], &[1, 7]), Some(1)); // one column, any stride
    }
}
