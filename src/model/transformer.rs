//! The decoder-only transformer shared by Llama-3.x, Qwen2/2.5 and Qwen3.
//!
//! The three families are one architecture with switches, so they share this file instead of
//! three near-copies (a bug fixed in one copy would survive in the others):
//!
//! | switch           | Llama-3.x              | Qwen2/2.5        | Qwen3                |
//! |------------------|------------------------|------------------|----------------------|
//! | q/k/v bias       | `attention_bias`       | always           | `attention_bias`     |
//! | q/k RMSNorm      | –                      | –                | per head, before RoPE|
//! | RoPE scaling     | `llama3` (3.1+)        | –                | –                    |
//! | tied embeddings  | 3.2 1B/3B              | small sizes      | small sizes          |
//! | `head_dim`       | hidden/heads           | hidden/heads     | explicit             |
//!
//! Reading order follows the architecture diagram: linear → RMSNorm → attention → MLP →
//! decoder layer → model. Struct and field names mirror HF module names, so
//! `model.layers.3.self_attn.q_proj.weight` is `layers[3].self_attn.q_proj.weight`.
//! Linear weights are stored transposed, `[in, out]`: the gemm kernels run 2–3× faster at
//! rollout batch sizes (M = 64) with a row-major right-hand side (measured with burn-flex
//! 0.21). Loading and saving transpose to and from HF's `[out, in]`.
//!
//! Invariant: the residual stream, norms and softmaxes run in f32 on whatever backend `B` is;
//! weights stored in bf16/f16 are cast where they are used, and the matmuls run in the
//! model's compute dtype (f32 unless `algo.compute_dtype` says otherwise; see
//! [`super::precision`]) with f32 results, except on the GPU backends where hacpo's kernels
//! read half precision as stored ([`crate::backend::gpu_kernels`]): there a product's result
//! stays in its dtype (the same values, one launch less each way). The forward pass never
//! materialises `[batch, seq, vocab]` logits (see [`CausalLm::logits`] and `generate::score`).

use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::{DType, Int, Tensor, backend::Backend};

use super::config::ModelConfig;
use super::kv_cache::KvCache;
use super::layout::{Heads, Layout, LayoutTensors, RopeTables};
use super::lora::LoraAdapter;
use super::rope::Rope;
use crate::backend::attention::swap_middle;
use crate::backend::fused::CpuBackend;
use crate::backend::packed_attention::{self, PackedSeq};
use crate::backend::packed_weight::{self, PackedWeight};
use crate::backend::{cast, gpu_kernels, keeps_half};
use crate::dtype::{ComputeDtype, f32_weight};

/// `y = x W + b` with `W` stored as `[in, out]` (the transpose of HF's `[out, in]`), plus a
/// LoRA update when an adapter is attached (see [`super::lora`]).
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
    pub lora: Option<LoraAdapter<B>>,
    /// The weight packed for the CPU's panel products, in a rollout copy on a CPU that has them
    /// in its compute dtype (bf16 with AVX512-BF16, f32 with AVX-512:
    /// [`super::precision::rollout_copy`]) and what keeps its weights (a bf16 LoRA policy's
    /// reference: the copy without adapters); `None` elsewhere. It serves only the weight it
    /// was packed from.
    #[module(skip)]
    pub packed: Option<Arc<PackedWeight>>,
}

impl<B: Backend> Linear<B> {
    /// The product runs in `compute`; the adapter and the bias are added in f32. The result is
    /// in f32, except where hacpo's GPU kernels read what the product gives as it is
    /// ([`gpu_kernels`]): a half-precision product without adapter or bias stays in it (the
    /// same values, without two launches to widen and round it back).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, compute: ComputeDtype) -> Tensor<B, D> {
        let y = self.unbiased(x, compute);
        self.add_bias(y, compute)
    }

    /// [`Self::forward`] without the bias (for a kernel that adds it on its way: see
    /// [`Attention::project`]): a half-precision product without adapter stays in its dtype
    /// where hacpo's GPU kernels read it ([`gpu_kernels`]), else f32.
    pub fn unbiased<const D: usize>(&self, x: Tensor<B, D>, compute: ComputeDtype) -> Tensor<B, D> {
        let dims = x.dims();
        let rows: usize = dims[..D - 1].iter().product();
        // One 2-D GEMM for the whole batch: burn's batched linear backward would run one
        // GEMM per batch row and sum them.
        let x2: Tensor<B, 2> = x.reshape([rows, dims[D - 1]]);
        let mut out = dims;
        out[D - 1] = self.weight.dims()[1];
        if self.lora.is_none() && keeps_half::<B>(compute) {
            return compute.product(x2, self.weight.val()).reshape(out);
        }
        let packed = self.packed.as_deref();
        let mut y = packed_weight::product_with(compute, x2.clone(), self.weight.val(), packed);
        if let Some(adapter) = &self.lora {
            // In f32 whatever the input: a half-precision one comes from a GPU kernel.
            y = y + adapter.forward(f32_weight(x2));
        }
        y.reshape(out)
    }

    /// `y` (an [`Self::unbiased`] output) plus the bias, in f32; `y` as it is without one.
    pub fn add_bias<const D: usize>(&self, y: Tensor<B, D>, compute: ComputeDtype) -> Tensor<B, D> {
        match &self.bias {
            Some(b) => {
                let mut shape = [1; D];
                shape[D - 1] = b.dims()[0];
                f32_weight(y) + cast::rounded(compute, b.val()).reshape(shape)
            }
            None => y,
        }
    }

    /// The bias as the forward reads it (rounded to `compute`), stored as rounded: for a kernel
    /// that widens it.
    pub fn rounded_bias(&self, compute: ComputeDtype) -> Option<Tensor<B, 1>> {
        self.bias.as_ref().map(|b| cast::cast(b.val(), compute.burn()))
    }
}

/// The dtype a norm before `linears` writes: `compute`'s, which each product would round its
/// input to, where they all would (adapters read it in f32); `None` keeps f32.
fn input_dtype<B: Backend>(linears: &[&Linear<B>], compute: ComputeDtype) -> Option<DType> {
    let all_plain = linears.iter().all(|l| l.lora.is_none());
    (keeps_half::<B>(compute) && all_plain).then(|| compute.burn().into())
}

/// `x / sqrt(mean(x²) + eps) * w` over the last dimension.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, compute: ComputeDtype) -> Tensor<B, D> {
        crate::backend::fused::rms_norm(x, self.weight(compute), self.eps)
    }

    /// The weight rounded to `compute`, in f32 except where hacpo's GPU kernels read it as
    /// stored.
    fn weight(&self, compute: ComputeDtype) -> Tensor<B, 1> {
        let w = cast::cast(self.weight.val(), compute.burn());
        if gpu_kernels::<B>() { w } else { f32_weight(w) }
    }

    /// `x + delta` (a residual add) and this norm of it, in `out` (f32 if `None`).
    pub fn after_add<const D: usize>(
        &self,
        x: Tensor<B, D>,
        delta: Tensor<B, D>,
        compute: ComputeDtype,
        out: Option<DType>,
    ) -> (Tensor<B, D>, Tensor<B, D>) {
        crate::backend::fused::add_rms_norm(x, delta, self.weight(compute), self.eps, out)
    }
}

/// Multi-head attention with grouped key/value heads.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl<B: Backend> Attention<B> {
    /// The query, key and value projections of tokens in rows (`[n, hidden]`): `[n, heads ·
    /// head_dim]`, `[n, kv_heads · head_dim]` twice, without their biases, which
    /// [`Self::attend`] adds (on a GPU, in the kernel that takes them to the attention: three
    /// launches a layer fewer in f32, nine in half precision, for Qwen2's biased projections).
    pub fn project(&self, x: Tensor<B, 2>, compute: ComputeDtype) -> [Tensor<B, 2>; 3] {
        [
            self.q_proj.unbiased(x.clone(), compute),
            self.k_proj.unbiased(x.clone(), compute),
            self.v_proj.unbiased(x, compute),
        ]
    }

    /// The attention of `b` sequences of `t` slots from their projections (rows `b · t`, as
    /// [`Self::project`] returns them), before the output projection: `[b, t, heads · head_dim]`.
    pub fn attend(
        &self,
        [q, k, v]: [Tensor<B, 2>; 3],
        [b, t]: [usize; 2],
        layout: &LayoutTensors<B>,
        cache: Option<(&mut KvCache<B>, usize, usize)>,
    ) -> Tensor<B, 3> {
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        let ([q, k, v], cache) = match self.attend_on_gpu([q, k, v], [b, t], layout, cache) {
            Ok(out) => return out,
            Err(back) => back,
        };
        let c = layout.compute;
        let [q, k, v] = self.heads([q, k, v], [b, t], [&layout.query, &layout.key], c);

        let (k, v, shared) = match cache {
            // Cached in the attention's dtype: a bf16 cache is half the bytes to hold and read
            // (f32 on the CPU where scoring or training reads it: see `KvCache::dtype`).
            Some((cache, layer, start)) => {
                let dtype = cache.dtype(c).burn();
                let (k, v) = cache.append(layer, start, cast::cast(k, dtype), cast::cast(v, dtype));
                (k, v, cache.shared_keys())
            }
            None => (k, v, None),
        };
        let bias = layout.bias.as_ref();
        crate::backend::attention::attention_read_as(q, k, v, bias, c, self.output_read_as(c), shared)
    }

    /// [`Self::attend`] over packed sequences on a CPU backend (`on`,
    /// [`packed_attention::backend`]): the projections' rows `[tokens, ·]` as
    /// [`Self::project`] returns them, each token's RoPE position in `tables`; `[tokens, heads
    /// · head_dim]`.
    pub(crate) fn attend_packed(
        &self,
        [q, k, v]: [Tensor<B, 2>; 3],
        tables: &[RopeTables<B>; 2],
        seqs: &Arc<[PackedSeq]>,
        (on, c): (CpuBackend, ComputeDtype),
    ) -> Tensor<B, 2> {
        let n = q.dims()[0];
        let [q, k, v] = self.heads([q, k, v], [1, n], [&tables[0], &tables[1]], c);
        packed_attention::attention(q, k, v, seqs, on)
    }

    /// The projections' rows of `b` sequences of `t` slots as the attention reads them, each a
    /// head-major view of the token-major rows: biases added, in f32, q and k normed (Qwen3)
    /// and rotated by `query` and `key`.
    fn heads(
        &self,
        [q, k, v]: [Tensor<B, 2>; 3],
        [b, t]: [usize; 2],
        [query, key]: [&RopeTables<B>; 2],
        c: ComputeDtype,
    ) -> [Tensor<B, 4>; 3] {
        // The GPU's products may be in half precision (see `Linear::forward`).
        let [q, k, v] =
            [(&self.q_proj, q), (&self.k_proj, k), (&self.v_proj, v)].map(|(l, y)| f32_weight(l.add_bias(y, c)));
        let (h, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let mut q = q.reshape([b, t, h, hd]);
        let mut k = k.reshape([b, t, kvh, hd]);
        let v = swap_middle(v.reshape([b, t, kvh, hd]));
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(q, c);
            k = kn.forward(k, c);
        }
        // RoPE in the projections' own contiguous layout; q also takes the 1/sqrt(d) scale.
        [swap_middle(apply_rope(q, query)), swap_middle(apply_rope(k, key)), v]
    }

    /// The dtype `o_proj` rounds the attention's output to, where a kernel may write it so.
    fn output_read_as(&self, compute: ComputeDtype) -> Option<DType> {
        input_dtype(&[&self.o_proj], compute)
    }

    /// [`Self::attend`] with the queries' and the keys' norms and RoPE, and the KV cache's
    /// writes, in one GPU kernel for each side (up to ten launches instead of two); the
    /// operands back where that kernel does not run.
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    #[allow(clippy::type_complexity)]
    fn attend_on_gpu<'c>(
        &self,
        [q, k, v]: [Tensor<B, 2>; 3],
        [b, t]: [usize; 2],
        layout: &LayoutTensors<B>,
        cache: Option<(&'c mut KvCache<B>, usize, usize)>,
    ) -> Result<Tensor<B, 3>, ([Tensor<B, 2>; 3], Option<(&'c mut KvCache<B>, usize, usize)>)> {
        use crate::backend::cube_fused::{Dest, Heads, heads};
        if !gpu_kernels::<B>() {
            return Err(([q, k, v], cache));
        }
        let (h, kvh, hd, c) = (self.num_heads, self.num_kv_heads, self.head_dim, layout.compute);
        // The norms' stored weights for the check; rounded as the forward reads them after it.
        let [q_norm, k_norm] = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => [Some((qn.weight.val(), qn.eps)), Some((kn.weight.val(), kn.eps))],
            _ => [None, None],
        };
        let [q_bias, k_bias, v_bias] = [&self.q_proj, &self.k_proj, &self.v_proj].map(|l| l.rounded_bias(c));
        let (q_rope, k_rope) = (&layout.query, &layout.key);
        let queries =
            Heads { x: q, dims: [b, t, h, hd], bias: q_bias, norm: q_norm, cos: &q_rope.cos, sin: &q_rope.sin };
        let keys =
            Heads { x: k, dims: [b, t, kvh, hd], bias: k_bias, norm: k_norm, cos: &k_rope.cos, sin: &k_rope.sin };
        let into = cache.as_ref().map(|(cache, layer, start)| [cache.capacity_for(*layer, start + t), *start]);
        if !(queries.fit(None, None) && keys.fit(Some((&v, v_bias.as_ref())), into)) {
            return Err(([queries.x, keys.x, v], cache));
        }
        // Rounded to the compute dtype and read as stored: the kernel widens them.
        fn rounded<B: Backend>(heads: Heads<'_, B>, c: ComputeDtype) -> Heads<'_, B> {
            Heads { norm: heads.norm.map(|(w, eps)| (c.cast(w), eps)), ..heads }
        }
        // In the attention's dtype, which its products would round them to.
        let attention_dtype = c.attention().burn().into();
        let (q, _) = heads(rounded(queries, c), None, Dest::New(attention_dtype));
        let (k, v) = match cache {
            Some((cache, layer, start)) => {
                let dtype = cache.dtype(c).burn().into();
                cache.write(layer, start, [b, kvh, t, hd], (&v.device(), dtype), |k_buffer, v_buffer| {
                    let values = Some((v, v_bias));
                    let (k, v) = heads(rounded(keys, c), values, Dest::Cache([k_buffer, v_buffer], start));
                    (k, v.expect("values written"))
                })
            }
            None => {
                let (k, v) = heads(rounded(keys, c), Some((v, v_bias)), Dest::New(attention_dtype));
                (k, v.expect("values written"))
            }
        };
        // Sharing keys between rows is the CPU's decoding's: the GPU's kernel reads every row's.
        let bias = layout.bias.as_ref();
        Ok(crate::backend::attention::attention_read_as(q, k, v, bias, c, self.output_read_as(c), None))
    }
}

/// HF `apply_rotary_pos_emb` on `x: [batch, t, heads, head_dim]`:
/// `x·cos + rotate_half(x)·sin` with `rotate_half(x) = [−x₂, x₁]` per head. The sign lives in
/// the table (see [`RopeTables`]), so here `rotate_half` is a swap of the two halves.
fn apply_rope<B: Backend>(x: Tensor<B, 4>, tables: &RopeTables<B>) -> Tensor<B, 4> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let x = match crate::backend::cube_fused::rope(x, &tables.cos, &tables.sin) {
        Ok(out) => return out,
        Err(x) => x,
    };
    let x = match crate::backend::fused::rope(x, &tables.cos, &tables.sin) {
        Ok(out) => return out,
        Err(x) => x,
    };
    let [b, t, h, d] = x.dims();
    let (n, half) = (b * t * h, d / 2);
    let pairs = x.clone().reshape([n, 2, half]);
    let swapped = Tensor::cat(vec![pairs.clone().slice([0..n, 1..2, 0..half]), pairs.slice([0..n, 0..1, 0..half])], 1);
    // Tables are [1 or batch, t*h*d]: one shared row or exactly this shape.
    let view = [b, t * h * d];
    (x.reshape(view) * tables.cos.clone() + swapped.reshape(view) * tables.sin.clone()).reshape([b, t, h, d])
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>, compute: ComputeDtype) -> Tensor<B, D> {
        let [gate, up] = [self.gate_proj.forward(x.clone(), compute), self.up_proj.forward(x, compute)];
        // An adapter on `down` reads its input in f32: the SwiGLU of half-precision products
        // would come rounded.
        let [gate, up] = match self.down_proj.lora.is_some() {
            true => [gate, up].map(f32_weight),
            false => [gate, up],
        };
        let gated = crate::backend::fused::swiglu(gate, up);
        self.down_proj.forward(gated, compute)
    }
}

/// Pre-norm residual block.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    /// The layer over `x` (`[b, t, hidden]`) plus `pending` (the previous layer's MLP output,
    /// not yet added); returns the residual and this layer's MLP output, for the next layer
    /// to add likewise.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        pending: Option<Tensor<B, 3>>,
        layout: &LayoutTensors<B>,
        cache: Option<(&mut KvCache<B>, usize, usize)>,
    ) -> [Tensor<B, 3>; 2] {
        let [b, t, d] = x.dims();
        let flat = |x: Tensor<B, 3>| x.reshape([b * t, d]);
        let out = self.forward_packed_parts(flat(x), pending.map(flat), layout.compute, |attention, projected| {
            let out = attention.attend(projected, [b, t], layout, cache);
            let width = out.dims()[2];
            out.reshape([b * t, width])
        });
        out.map(|y| y.reshape([b, t, d]))
    }

    /// The layer over tokens in rows (`[n, hidden]`, several passes' tokens packed): all but
    /// the attention works token by token, so each weight multiplies every pass's tokens at
    /// once (a bf16 weight rounded, or a stored one widened, once); `attend` runs the attention
    /// of each pass from the packed projections ([`Attention::project`]) and returns its
    /// outputs packed the same way (`[n, heads · head_dim]`).
    pub fn forward_packed(
        &self,
        x: Tensor<B, 2>,
        compute: ComputeDtype,
        attend: impl FnOnce(&Attention<B>, [Tensor<B, 2>; 3]) -> Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        let [h, mlp] = self.forward_packed_parts(x, None, compute, attend);
        h + f32_weight(mlp)
    }

    /// [`Self::forward_packed`] on `x + pending` (the residual add and this layer's first norm
    /// in one GPU kernel), returning the residual and the MLP's output apart.
    fn forward_packed_parts(
        &self,
        x: Tensor<B, 2>,
        pending: Option<Tensor<B, 2>>,
        compute: ComputeDtype,
        attend: impl FnOnce(&Attention<B>, [Tensor<B, 2>; 3]) -> Tensor<B, 2>,
    ) -> [Tensor<B, 2>; 2] {
        let a = &self.self_attn;
        let to_attention = input_dtype(&[&a.q_proj, &a.k_proj, &a.v_proj], compute);
        let (x, normed) = match pending {
            Some(pending) => self.input_layernorm.after_add(x, pending, compute, to_attention),
            None => {
                let normed = self.input_layernorm.forward(x.clone(), compute);
                let normed = match to_attention {
                    Some(dtype) => normed.cast(dtype),
                    None => normed,
                };
                (x, normed)
            }
        };
        let projected = a.project(normed, compute);
        let attended = a.o_proj.forward(attend(a, projected), compute);
        let to_mlp = input_dtype(&[&self.mlp.gate_proj, &self.mlp.up_proj], compute);
        let (h, normed) = self.post_attention_layernorm.after_add(x, attended, compute, to_mlp);
        [h, self.mlp.forward(normed, compute)]
    }
}

/// A causal language model: embeddings, decoder layers, final norm, LM head.
#[derive(Module, Debug)]
pub struct CausalLm<B: Backend> {
    /// `[vocab, hidden]`
    pub embed_tokens: Param<Tensor<B, 2>>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Param<Tensor<B, 2>>>,
    /// The LM head as [`Self::logits`] reads it (`[hidden, vocab]`), packed as
    /// [`Linear::packed`] is, in the rollout copy.
    #[module(skip)]
    pub lm_head_packed: Option<Arc<PackedWeight>>,
    #[module(skip)]
    pub config: ModelConfig,
    /// The matmuls' dtype (`algo.compute_dtype`; set with [`super::precision::set_compute`]).
    #[module(skip)]
    pub compute: ComputeDtype,
}

impl<B: Backend> CausalLm<B> {
    /// Final hidden states `[batch, t, hidden]` (after the last RMSNorm) for token ids
    /// `[batch, t]` placed as `layout` says. With a cache, keys/values are appended at
    /// `layout.start` and the cache advances by `t`.
    pub fn forward_hidden(
        &self,
        ids: Tensor<B, 2, Int>,
        layout: &LayoutTensors<B>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let t = ids.dims()[1];
        let start = cache.as_ref().map_or(0, |c| c.len());
        let mut x = self.embed(ids);
        // Each layer's MLP output is added by the next layer's first norm (and the last one's
        // by the final norm): one kernel for the add and the norm on a GPU.
        let mut pending = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let c = cache.as_deref_mut().map(|c| (c, i, start));
            let [h, mlp] = layer.forward(x, pending, layout, c);
            (x, pending) = (h, Some(mlp));
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        match pending {
            Some(pending) => self.norm.after_add(x, pending, self.compute, None).1,
            None => self.norm.forward(x, self.compute),
        }
    }

    /// The embeddings `[batch, t, hidden]` of token ids `[batch, t]`, in f32. The rows are
    /// looked up first and then rounded (the same values as rounding the table, without
    /// casting all of it).
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        cast::rounded(self.compute, burn::tensor::module::embedding(self.embed_tokens.val(), ids))
    }

    /// The device the weights live on.
    pub fn device(&self) -> B::Device {
        self.embed_tokens.val().device()
    }

    /// RoPE tables and attention mask for `layout`, on the model's device.
    pub fn layout_tensors(&self, layout: &Layout) -> LayoutTensors<B> {
        let (rope, heads) = (Rope::new(&self.config), self.head_geometry());
        LayoutTensors { compute: self.compute, ..LayoutTensors::new(layout, &rope, heads, &self.device()) }
    }

    fn head_geometry(&self) -> Heads {
        let c = &self.config;
        Heads { query: c.num_attention_heads, key_value: c.num_key_value_heads, dim: c.head_dim }
    }

    /// RoPE tables (query's, key's) for packed tokens at `positions`, one row.
    pub fn rope_tables(&self, positions: &[usize]) -> [RopeTables<B>; 2] {
        super::layout::rope_tables(positions, 1, &Rope::new(&self.config), self.head_geometry(), &self.device())
    }

    /// The output projection `[vocab, hidden]` (the embedding matrix when tied), in the
    /// compute dtype: the log-prob op multiplies in the weight's dtype.
    pub fn lm_head_weight(&self) -> Tensor<B, 2> {
        let weight = match &self.lm_head {
            Some(w) => w.val(),
            None => self.embed_tokens.val(),
        };
        cast::cast(weight, self.compute.burn())
    }

    /// Logits `[n, vocab]` for hidden states `[n, hidden]`. Callers select the rows they need
    /// first: full-sequence logits for a 152k vocabulary would not fit in memory.
    pub fn logits(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        let packed = self.lm_head_packed.as_deref();
        packed_weight::product_with(self.compute, hidden, self.lm_head_weight().transpose(), packed)
    }
}
