//! What a training micro-batch keeps for its backward pass, by the kernels that run it.
//!
//! burn's generic ops (CUDA, wgpu) keep every intermediate a layer's backward reads: the
//! RMSNorms' inputs and outputs, q, k, v before and after RoPE, SwiGLU's gate, sigmoid, SiLU,
//! up and product, and the attention's exp and probabilities, each with a gradient of its size
//! during the backward pass. The CPU backend's fused kernels keep less ([`crate::backend::fused`],
//! [`crate::backend::attention`]): a norm keeps its input, SwiGLU its two inputs, the attention
//! q, k, v and one copy of its probabilities, each matmul its input; RoPE's products keep only
//! the tables.
//!
//! Measured on the CPU (`hacpo bench --train-batch B --train-len T`, peak RSS, 2 threads, a
//! 2-core AMD EPYC Zen 4): SmolLM2-135M at B × T = 8 × 128, 8 × 256, 8 × 512, 16 × 256,
//! 4 × 1024, 2 × 2048 held 3.49, 5.04, 9.73, 8.53, 11.9, 17.0 GB, where the generic estimate
//! said 6.06, 10.4, 20.7, 18.3, 25.5, 35.0 GB. The tensors counted here for the fused kernels
//! come to 0.9–1.1 of what those steps held above their weights, gradients and moments (the
//! allocator keeps freed blocks for reuse, each thread its own); 1.3 times them plans 12–20%
//! above every measurement.

use super::{F32W, Workload};
use crate::backend::DeviceSpec;
use crate::dtype::ComputeDtype;
use crate::generate::score::CHUNK_ELEMENTS;
use crate::model::ModelConfig;
use crate::model::lora::{LoraConfig, PROJECTIONS};

/// Which kernels run a policy's passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// The CPU backend's fused kernels (f32 activations whatever the matmuls' dtype: a bf16
    /// product returns f32).
    CpuFused,
    /// burn's generic ops: CUDA and wgpu.
    Generic,
}

impl Kernels {
    pub fn on(device: DeviceSpec) -> Kernels {
        match device {
            DeviceSpec::Cpu => Kernels::CpuFused,
            DeviceSpec::Cuda(_) | DeviceSpec::Wgpu => Kernels::Generic,
        }
    }

    /// Whether the prefill holds its attention scores for every query at once (the fused
    /// attention holds one block of queries per thread).
    pub fn prefill_holds_scores(self) -> bool {
        self == Kernels::Generic
    }

    /// Whether the allocator keeps the rollout's freed memory through the update: on the CPU,
    /// mimalloc keeps freed memory for reuse (`alloc.rs`), and the update, on another thread
    /// with tensors of other sizes, reuses little of it. SmolLM2-135M's GRPO step held
    /// 0.3–0.5 GB less with mimalloc returning freed memory at once (its update then ran about
    /// 50% slower), where its rollout plans 0.58 GB. GPU pools are per lane, and a policy's
    /// rollout and update share one.
    pub fn keeps_freed_rollout(self) -> bool {
        self == Kernels::CpuFused
    }

    /// Whether a rollout copy computing in `compute` keeps its weights packed for the panel
    /// products as well (`model::precision::rollout_copy`): the CPU's kernels, where the plain
    /// CPU backend packs (bf16 on a CPU with AVX512-BF16, f32 on a CPU with AVX-512).
    pub fn packs_rollout_copy(self, compute: ComputeDtype) -> bool {
        self == Kernels::CpuFused && crate::backend::packed_weight::packs::<crate::backend::Cpu>(compute)
    }

    /// `floats` as the process holds them, in bytes: on the CPU 3/10 more, for the allocator's
    /// share and a margin (see the module docs).
    fn bytes(self, floats: u128) -> u128 {
        match self {
            Kernels::CpuFused => floats * F32W * 13 / 10,
            Kernels::Generic => floats * F32W,
        }
    }
}

/// Floats a layer keeps for the backward pass.
struct Kept {
    /// For each token it runs.
    token: u128,
    /// For each query-key pair of its attention.
    pair: u128,
    /// For each prompt slot fanned out to a response (a response's copy of its prompt's keys
    /// and values).
    fanned: u128,
}

impl Kept {
    fn of(m: &ModelConfig, lora: Option<&LoraConfig>, kernels: Kernels) -> Kept {
        let (d, f) = (m.hidden_size as u128, m.intermediate_size as u128);
        let (q, kv) = ((m.num_attention_heads * m.head_dim) as u128, (m.num_key_value_heads * m.head_dim) as u128);
        let heads = m.num_attention_heads as u128;
        // An adapter keeps its input's product with A (rank floats) for the product with B.
        let adapters = lora.map_or(0, |l| (l.rank * PROJECTIONS.iter().filter(|p| l.targets(p)).count()) as u128);
        match kernels {
            // See the module docs; Qwen3's q/k norms add their inputs and outputs. Twice all of
            // it: each has a gradient of its size during the backward pass.
            Kernels::Generic => {
                let qk_norm = if m.qk_norm { 2 * (q + kv) } else { 0 };
                Kept {
                    token: 2 * (4 * d + 5 * q + 5 * kv + qk_norm + 5 * f) + adapters,
                    pair: 2 * heads,
                    fanned: 4 * kv,
                }
            }
            // The norms' inputs and outputs (the outputs as the projections' inputs: 4d), q
            // after RoPE, k and v (the attention's), its output (o_proj's input), SwiGLU's gate,
            // up and product (down_proj's input); Qwen3's q/k norms keep their inputs.
            Kernels::CpuFused => {
                let qk_norm = if m.qk_norm { q + kv } else { 0 };
                Kept { token: 4 * d + 2 * q + 2 * kv + 3 * f + qk_norm + adapters, pair: heads, fanned: 2 * kv }
            }
        }
    }
}

/// What one training micro-batch runs, each group's prompt once ([`super::SharedPrompts`]):
/// its prompts' passes, then every response over its prompt's keys and values; under a token
/// budget, at most the budget.
pub(super) struct TrainPass {
    /// Tokens that run through the layers.
    pub tokens: u128,
    /// Query-key pairs of the attention, at most `t` for each token.
    pub query_keys: u128,
    /// Prompt slots fanned out to the responses (each response's copy of its prompt's keys
    /// and values, and their gradients).
    pub fanned_out: u128,
}

impl TrainPass {
    pub fn of(w: &Workload) -> Self {
        let (t, seqs) = (w.train_len as u128, w.micro_batch as u128);
        if w.micro_tokens > 0 {
            // The budget bounds tokens and fanned-out slots together, and a fanned-out slot
            // (a key and a value, and their gradients) keeps less than a token does: all of it
            // tokens is the most. A sequence above the budget runs alone.
            let tokens = (w.micro_tokens as u128).max(t);
            return TrainPass { tokens, query_keys: tokens * t, fanned_out: 0 };
        }
        let prompts = w.shared.prompts_among(w.micro_batch) as u128;
        if prompts >= seqs {
            return TrainPass { tokens: seqs * t, query_keys: seqs * t * t, fanned_out: 0 };
        }
        let prompt = (w.shared.prompt as u128).min(t);
        let tokens = prompts * prompt + seqs * (t - prompt);
        // Each query sees at most `t` keys, however the passes split its sequence (prompts
        // that begin alike may share only their beginning, their rests run with the responses).
        TrainPass { tokens, query_keys: tokens * t, fanned_out: seqs * prompt }
    }
}

/// Bytes of the update's activations: what a micro-batch's backward pass keeps (with gradient
/// checkpointing, every layer's input and one layer's worth while it is recomputed), and the
/// largest transient buffers. Half-precision weight copies are the caller's.
pub(super) fn update(m: &ModelConfig, w: &Workload, lora: Option<&LoraConfig>, kernels: Kernels) -> u128 {
    let kept = Kept::of(m, lora, kernels);
    let pass = TrainPass::of(w);
    let (d, q, kv) = (
        m.hidden_size as u128,
        (m.num_attention_heads * m.head_dim) as u128,
        (m.num_key_value_heads * m.head_dim) as u128,
    );
    let (heads, layers, vocab) = (m.num_attention_heads as u128, m.num_hidden_layers as u128, m.vocab_size as u128);
    let per_layer = pass.tokens * kept.token + pass.query_keys * kept.pair + pass.fanned_out * kept.fanned;
    let held = if w.checkpointing { pass.tokens * layers * d + per_layer } else { layers * per_layer };
    let logits = logits_chunk(pass.tokens, vocab);
    let transient = match kernels {
        // One layer at a time: scores, masked scores and their gradient; the embedding and
        // final norm.
        Kernels::Generic => 3 * heads * pass.query_keys + pass.tokens * 3 * d,
        // One layer's gradients while its backward pass runs; the padded rows' attention mask
        // (one per pass, each head's copy); the embedding, final norm and RoPE's tables.
        Kernels::CpuFused => {
            pass.tokens * kept.token + heads * pass.query_keys + pass.tokens * (3 * d + 2 * q + 2 * kv)
        }
    };
    kernels.bytes(held + transient + logits)
}

/// Floats of the log-prob op's logits chunk over `tokens` rows, with its softmax and gradient
/// (score.rs: at most `CHUNK_ELEMENTS` logits at a time).
pub(super) fn logits_chunk(tokens: u128, vocab: u128) -> u128 {
    let chunk_rows = (CHUNK_ELEMENTS as u128 / vocab.max(1)).max(1);
    3 * tokens.min(chunk_rows) * vocab
}

/// Bytes of a value model's activations during its update: its trunk over the update's
/// tokens (each prompt counted per sequence), without checkpointing and without the log-prob
/// op's logits (`trainer::update`).
pub(super) fn value_model(m: &ModelConfig, w: &Workload, kernels: Kernels) -> u128 {
    let kept = Kept::of(m, None, kernels);
    let pass = TrainPass::of(w);
    let t = w.train_len as u128;
    let tokens = if w.micro_tokens > 0 { pass.tokens } else { w.micro_batch as u128 * t };
    kernels.bytes(tokens * m.num_hidden_layers as u128 * (kept.token + kept.pair * t))
}
