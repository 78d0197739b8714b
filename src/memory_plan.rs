//! The memory plan: what each policy will hold on its device, estimated from the model's
//! shape and the run's settings before a single weight loads, and whether that fits.
//!
//! Users of RL trainers most often learn that a run does not fit when it runs out of memory
//! an hour in; this says so up front (`hacpo train` prints it, `--dry-run` prints only it) and
//! names the setting that would make it fit. The shapes come from the model's `config.json`,
//! from the zoo entry's copy of it (so no download is needed), or from a tiny agent's spec.
//!
//! The estimate follows what the implementation keeps, not an ideal trainer: f32 weights,
//! gradients and AdamW moments (the only precision so far), a full second copy as the KL
//! reference (with LoRA: gradients and moments of the adapters only, and the base itself as
//! the reference), the sum of a mini-batch's earlier micro-batches' gradients beside each
//! pass's own, activations as the kernels that run the pass keep them ([`activations`]: the
//! CPU's fused kernels or burn's generic ops, no flash attention on either), a group's prompt
//! run once by the prefill and the update (the exchange's GRPO groups), and a KV cache that
//! grows by doubling up to the prompt plus every new token. Sequences are counted at their
//! budgets (`max_prompt_tokens`, `max_new_tokens`), which real prompts rarely fill. Rollout and
//! update do not overlap: the KV cache is freed before the update allocates its activations
//! and gradients, so the peak is the persistent state plus the largest phase: rollout, a
//! backward pass, or AdamW's update (which replaces the weights one at a time). On the CPU,
//! though, the allocator keeps the rollout's freed memory, which the update reuses little
//! of, so there the backward pass counts it too. An
//! offloaded policy (`[[agents]] offload`) keeps only its weights on the device for the run;
//! its reference, moments and summed gradients are in host memory, and the device holds, one
//! phase at a time, a backward pass's gradients, the reference for scoring, or one
//! parameter's update.

use std::fmt;
use std::path::Path;

use crate::backend::DeviceSpec;
use crate::config::TrainConfig;
use crate::dtype::{ComputeDtype, FrozenDtype};
use crate::error::{Error, Result};
use crate::model::ModelConfig;
use crate::model::lora::LoraConfig;
use crate::workload::WorkloadKind;

mod activations;

pub use activations::Kernels;
use activations::TrainPass;

/// Bytes of an f32: master weights, gradients, moments, logits, and activations (an upper bound).
const F32: u64 = 4;
/// The same in the footprint's wide arithmetic.
const F32W: u128 = F32 as u128;

/// The bytes one policy needs, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Footprint {
    /// The trainable weights (also what rollout and scoring read).
    pub weights: u64,
    /// The frozen KL reference (a second copy; none when `algo.kl_coef = 0`).
    pub reference: u64,
    /// One gradient per weight, alive during an update.
    pub gradients: u64,
    /// The gradients summed over a mini-batch's earlier micro-batches, beside each backward
    /// pass's own (gradient accumulation; none when one micro-batch holds the mini-batch; in
    /// host memory when offloaded).
    pub summed: u64,
    /// AdamW's two moments per weight.
    pub optimizer: u64,
    /// What the backward pass of one micro-batch keeps, plus the largest transient buffers;
    /// on the CPU also the rollout's memory, which the allocator keeps for reuse.
    pub activations: u64,
    /// The KV cache and sampling logits of one rollout batch.
    pub rollout: u64,
    /// An actor-critic algorithm's value model of its own: its trained weights and their
    /// moments (held for the run; with LoRA its adapters, the base being shared) …
    pub critic: u64,
    /// … and its gradients and activations during an update.
    pub critic_update: u64,
    /// The reference, moments and summed gradients wait in host memory (`[[agents]] offload`);
    /// the three fields below are what the device then holds of them.
    pub offloaded: bool,
    /// Offloaded: the gradients one backward pass leaves on the device while they are copied
    /// out. All of them without gradient checkpointing; with it, the head's and one layer's.
    pub pass_gradients: u64,
    /// AdamW's update, one parameter at a time, each old weight dropped as its new one is
    /// made: the largest parameter's new weight, gradient, moments and the tensor ops'
    /// temporaries (resident, beside every gradient; offloaded, copied in), and a value model's
    /// gradients, which wait for their own update.
    pub step: u64,
    /// Offloaded: the scoring stage's graph-free forward pass of one micro-batch, beside the
    /// reference copied in for it.
    pub scoring: u64,
}

impl Footprint {
    /// The micro-batches' gradient sum on the device (in host memory when offloaded).
    pub fn summed_on_device(&self) -> u64 {
        if self.offloaded { 0 } else { self.summed }
    }

    /// Held on the device for the whole run.
    pub fn persistent(&self) -> u64 {
        match self.offloaded {
            true => self.weights.saturating_add(self.critic),
            false => {
                self.weights.saturating_add(self.reference).saturating_add(self.optimizer).saturating_add(self.critic)
            }
        }
    }

    /// What the device holds at some point whatever the batch sizes: the persistent state and
    /// the gradients (offloaded: the reference or the update of the largest parameter).
    pub fn state(&self) -> u64 {
        match self.offloaded {
            true => self.persistent().saturating_add(self.reference.max(self.step)),
            false => self.persistent().saturating_add(self.gradients),
        }
    }

    /// The peak: the persistent state plus the largest phase (see the module docs).
    pub fn peak(&self) -> u64 {
        let gradients = match self.offloaded {
            true => self.pass_gradients,
            false => self.gradients.saturating_add(self.summed_on_device()),
        };
        let update = gradients.saturating_add(self.activations).saturating_add(self.critic_update);
        let phase = match self.offloaded {
            true => update.max(self.rollout).max(self.step).max(self.reference.saturating_add(self.scoring)),
            false => update.max(self.rollout).max(self.gradients.saturating_add(self.step)),
        };
        self.persistent().saturating_add(phase)
    }

    /// What waits in host memory (offloaded).
    pub fn host(&self) -> u64 {
        match self.offloaded {
            true => self.reference.saturating_add(self.gradients).saturating_add(self.optimizer),
            false => 0,
        }
    }

    /// This footprint with the reference, moments and summed gradients in host memory.
    pub fn offloaded(self) -> Footprint {
        Footprint { offloaded: true, ..self }
    }
}

/// Sequences that share one prompt, which the prefill and the update run once for all of them
/// ([`crate::generate::shared_prompt`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedPrompts {
    /// Sequences per prompt, in unbroken runs of whole groups (a GRPO group:
    /// [`Workload::group_size`]); 1 counts every sequence's prompt.
    pub group: usize,
    /// Runs of groups one micro-batch may join (a learner's own samples, then another
    /// policy's), each of which may begin and end in the middle of a group.
    pub runs: usize,
    /// The prompt's share of `train_len`: its longest prompt.
    pub prompt: usize,
}

impl SharedPrompts {
    /// Every sequence's prompt counted.
    pub const NONE: SharedPrompts = SharedPrompts { group: 1, runs: 1, prompt: 0 };

    /// The most distinct prompts among `sequences` consecutive training sequences: a window
    /// over runs of `group` touches at most `⌈(n − 1) / group⌉ + 1` groups, and `runs` windows
    /// of `n` sequences in all at most `⌈(n − runs) / group⌉ + 2·runs − 1`.
    pub fn prompts_among(&self, sequences: usize) -> usize {
        if self.group <= 1 {
            return sequences;
        }
        let bound = sequences.saturating_sub(self.runs).div_ceil(self.group) + 2 * self.runs - 1;
        bound.min(sequences)
    }
}

/// The run settings the footprint depends on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Workload {
    /// Sequences per forward/backward pass (`algo.micro_batch_sequences`) …
    pub micro_batch: usize,
    /// … unless a token budget cuts them (`algo.micro_batch_tokens`; 0: none).
    pub micro_tokens: usize,
    /// The longest training sequence: prompt (own or another policy's, re-rendered) + response.
    pub train_len: usize,
    /// How the sequences share prompts.
    pub shared: SharedPrompts,
    /// Sequences sampled per prompt: `algo.group_size` as the algorithm shapes it (GSPO×2
    /// samples twice the group).
    pub group_size: usize,
    /// Sequences sampled together (`rollout.batch_prompts × group_size`).
    pub rollout_sequences: usize,
    pub rollout_prompt: usize,
    pub rollout_new: usize,
    /// The most prompt tokens one prefill pass runs ([`crate::generate::PREFILL_TOKEN_BUDGET`]).
    pub prefill_budget: usize,
    /// A KL reference is loaded.
    pub reference: bool,
    /// Layers are recomputed in the backward pass (`algo.gradient_checkpointing`).
    pub checkpointing: bool,
    /// The matmuls' dtype (`algo.compute_dtype`).
    pub compute: ComputeDtype,
    /// The algorithm trains a value model of its own beside the policy (MAPPO's default critic).
    pub value_model: bool,
    /// Sequences of one optimizer update (a learner's mini-batch) where the plan knows them
    /// (the exchange's groups); 0 where it does not.
    pub minibatch: usize,
}

impl Workload {
    pub fn of(cfg: &TrainConfig) -> Result<Self> {
        let r = &cfg.rollout;
        // A delegation conversation is one sequence of every turn (workload.delegate.max_tokens),
        // each turn generated after the turns before it.
        let kind = cfg.workload.kind;
        // (prompt, response) of the longest own training sequence.
        let own = match kind {
            WorkloadKind::Delegate => {
                let max = cfg.workload.delegate.max_tokens;
                (max.saturating_sub(r.max_new_tokens), r.max_new_tokens.min(max))
            }
            _ => (r.max_prompt_tokens, r.max_new_tokens),
        };
        let rollout_prompt = own.0;
        // Another policy's samples, when the algorithm shares them: its prompt re-rendered in
        // this template, its response re-tokenised (rarely more than twice as many tokens;
        // `max_response_tokens` caps it).
        let algorithm = crate::rl::registry::build::<crate::backend::Cpu>(&cfg.algo.name, &cfg.algo.settings())?;
        let micro_tokens = cfg.algo.micro_batch_tokens;
        let shape = algorithm.shape(cfg.requested_shape())?;
        let group_size = shape.group_size.max(1);
        let shares = cfg.policies.len() > 1 && algorithm.routing() == crate::rl::algorithm::Routing::Shared;
        let cross = (r.cross_max_prompt_tokens, r.max_response_tokens.min(2 * r.max_new_tokens));
        let (prompt, response) = if shares { (own.0.max(cross.0), own.1.max(cross.1)) } else { own };
        // A sequence longer than the budget runs alone, over it, and memory would no longer be
        // the budget's (a budget that small is most likely a number of sequences).
        if micro_tokens > 0 && micro_tokens < prompt + response {
            return Err(Error::config(
                "training config",
                format!(
                    "algo.micro_batch_tokens: {micro_tokens} is below this run's longest sequence (up to {} tokens: {prompt} of prompt and {response} of response); set {} or more, or 0 to cut micro-batches by algo.micro_batch_sequences",
                    prompt + response,
                    prompt + response
                ),
            ));
        }
        // The exchange's samples come in whole groups of one prompt, a policy's groups one
        // after another, and a learner's mini-batch takes its own, then the others'
        // (`trainer::routing`); the other workloads' prompts are counted one per sequence.
        let shared = match kind {
            WorkloadKind::Exchange => SharedPrompts { group: group_size, runs: if shares { 2 } else { 1 }, prompt },
            _ => SharedPrompts { prompt, ..SharedPrompts::NONE },
        };
        Ok(Workload {
            micro_batch: cfg.algo.micro_batch_sequences.max(1),
            micro_tokens,
            train_len: prompt + response,
            shared,
            group_size,
            rollout_sequences: r.batch_prompts.max(1) * group_size,
            rollout_prompt,
            rollout_new: r.max_new_tokens,
            prefill_budget: crate::generate::PREFILL_TOKEN_BUDGET,
            reference: cfg.algo.kl_coef > 0.0,
            checkpointing: cfg.algo.gradient_checkpointing,
            compute: cfg.algo.compute_dtype,
            value_model: algorithm.value_model().is_some_and(|v| v.own_trunk),
            minibatch: match kind {
                WorkloadKind::Exchange => shape.minibatch_prompts * group_size,
                _ => 0,
            },
        })
    }
}

impl Workload {
    /// Whether a mini-batch takes more than one micro-batch, whose gradients are summed. Under
    /// a token budget, whose cut follows the lengths, and where the mini-batch is unknown: yes.
    fn accumulates(&self) -> bool {
        self.micro_tokens > 0 || self.minibatch == 0 || self.micro_batch < self.minibatch
    }

    /// The leanest settings that keep the update: micro-batches of one sequence (a budget of
    /// one sequence's tokens), recomputation, one prompt per rollout batch.
    fn leanest(self) -> Workload {
        Workload { checkpointing: true, rollout_sequences: self.group_size, ..self.with_micro(self.one_sequence()) }
    }

    /// The bound of a micro-batch of one sequence, of [`Self::micro`]'s kind: 1, or the
    /// longest sequence's tokens.
    fn one_sequence(&self) -> usize {
        match self.micro_tokens {
            0 => 1,
            _ => self.train_len.max(1),
        }
    }

    /// The leanest micro-batch's bound, in words.
    fn leanest_micro_batch(&self) -> String {
        match self.micro_tokens {
            0 => "micro-batch 1".into(),
            _ => format!("a token budget of one sequence ({} tokens)", self.one_sequence()),
        }
    }

    /// The micro-batch's bound as a setting: the token budget if one is set, else sequences.
    fn micro(&self) -> (&'static str, usize) {
        match self.micro_tokens {
            0 => ("algo.micro_batch_sequences", self.micro_batch),
            budget => ("algo.micro_batch_tokens", budget),
        }
    }

    /// This workload with its micro-batch's bound (of [`Self::micro`]'s kind) at `n`.
    fn with_micro(self, n: usize) -> Workload {
        match self.micro_tokens {
            0 => Workload { micro_batch: n, ..self },
            _ => Workload { micro_tokens: n, ..self },
        }
    }

    /// The micro-batch bounds to try, largest first, down to one sequence: halvings of a
    /// number of sequences; a budget by eighths (so the one chosen is about an eighth of the
    /// largest that fits at most), in multiples of 64 tokens, and one sequence's tokens last.
    fn smaller_micro_batches(&self) -> Vec<usize> {
        let (_, from) = self.micro();
        if self.micro_tokens == 0 {
            return std::iter::successors(Some(from), |&m| (m > 1).then_some(m / 2)).collect();
        }
        let least = self.one_sequence();
        let mut out: Vec<usize> =
            std::iter::successors(Some(from), |&b| Some((b - b / 8) / 64 * 64).filter(|&next| next > least)).collect();
        if out.last().is_some_and(|&b| b > least) {
            out.push(least);
        }
        out
    }
}

/// The estimate for a model of shape `m` running `w` with `kernels`, fully fine-tuned or with
/// `lora` adapters (the base frozen: gradients and moments for the adapters only, the base is
/// the reference).
pub fn footprint(
    m: &ModelConfig,
    w: &Workload,
    lora: Option<&LoraConfig>,
    frozen: FrozenDtype,
    kernels: Kernels,
) -> Footprint {
    let params = m.num_parameters() as u128;
    let adapter = lora.map_or(0, |l| crate::model::lora::adapter_parameters(m, l) as u128) * F32W;
    // A LoRA base is frozen, stored as `frozen`; so is a full fine-tune's reference.
    let weights = params * if lora.is_some() { frozen.bytes() as u128 } else { F32W } + adapter;
    // What the optimizer updates.
    let trained = if lora.is_some() { adapter } else { weights };
    let (d, f) = (m.hidden_size as u128, m.intermediate_size as u128);
    let (q, kv) = ((m.num_attention_heads * m.head_dim) as u128, (m.num_key_value_heads * m.head_dim) as u128);
    let heads = m.num_attention_heads as u128;
    let (layers, vocab) = (m.num_hidden_layers as u128, m.vocab_size as u128);
    let pass = TrainPass::of(w);
    // In half precision the matmuls' saved inputs are half the bytes; the estimate keeps f32
    // (an upper bound). What it adds: the weights' copies in the compute dtype, which sampling
    // reads (`precision::rollout_copy`) and the update's matmuls make and keep for the backward
    // pass; none for a base already stored in that dtype. A LoRA base stored in bf16 under f32
    // matmuls is cast to f32 too. The update casts each weight once a micro-batch (`Passes`
    // packs every pass's tokens for the matmuls); with checkpointing, one layer's at a time.
    let base_in_compute_dtype = lora.is_some() && frozen == w.compute;
    let copy = params * w.compute.bytes() as u128;
    let rollout_copy = if w.compute.is_f32() || base_in_compute_dtype { 0 } else { copy };
    // A rollout copy on a CPU whose panel products run in its dtype keeps its weights packed
    // too, beside them (an f32 one beside the weights it shares with the policy). The f32
    // copy's buffers, of the weights' sizes, go to the update's gradients once it is dropped:
    // SmolLM2-135M's f32 GRPO step peaked 0.11 GB higher with its 0.54 GB packed.
    let packed = if kernels.packs_rollout_copy(w.compute) { copy } else { 0 };
    let reused = if w.compute.is_f32() { packed } else { 0 };
    let rollout_copy = rollout_copy + packed;
    let update_copy = match base_in_compute_dtype || (lora.is_none() && w.compute.is_f32()) {
        true => 0,
        false if w.checkpointing => copy.div_ceil(layers.max(1)),
        false => copy,
    };
    let activations = activations::update(m, w, lora, kernels) + update_copy;

    // The cache starts at the prompt plus up to `FIRST_NEW_SLOTS` new tokens and doubles up to
    // the prompt plus every new token (kv_cache.rs); growing copies the old buffer into the
    // larger one, both counted (a caching allocator may keep the old one for smaller requests).
    let need = w.rollout_prompt as u128 + w.rollout_new as u128;
    let reserve = w.rollout_prompt as u128 + w.rollout_new.min(crate::generate::FIRST_NEW_SLOTS) as u128;
    // The buffer it grows from is the reserve or at most half the limit (`KvCache::append`),
    // whatever the real prompt's length below the budget.
    let grown = if need > reserve { need + reserve.max(need / 2) } else { need.max(reserve) };
    let rollout_seqs = w.rollout_sequences as u128;
    // Stored in the attention's dtype (bf16 with bf16 compute).
    let kv_cache = 2 * layers * rollout_seqs * kv * grown * w.compute.attention().bytes() as u128;
    // Logits and sampling probabilities of one decoding step, and one pass of the prefill.
    let sampling = 2 * rollout_seqs * vocab * F32W;
    let prefill_tokens = prefill_tokens(w);
    // The fused attention holds one block of queries' scores, but a prefill of padded rows
    // has an attention mask of the scores' size (one copy of the two).
    let scores =
        prefill_scores(m, prefill_tokens, w.rollout_prompt) / if kernels.prefill_holds_scores() { 1 } else { 2 };
    let prefill = scores + prefill_tokens * (4 * d + 2 * q + 2 * kv + 3 * f) * F32W;
    let rollout = kv_cache + sampling + prefill + rollout_copy;
    let retained = if kernels.keeps_freed_rollout() { rollout - reused } else { 0 };
    // Offloaded, with checkpointing: the head's pass leaves the LM head's gradient (the tied
    // embedding's) alive while each layer's pass, then the embedding's (vocab × d, tied or
    // not), adds its own.
    let layer_params = (m.num_parameters() as u128)
        .saturating_sub(vocab * d * if m.tie_word_embeddings { 1 } else { 2 })
        / layers.max(1);
    let head_or_layer = layer_params.max(vocab * d);
    // The largest parameter: an embedding or LM head, or a layer's largest projection.
    let largest = (vocab * d).max(f * d).max(q * d);
    // Sizes no device has saturate rather than wrap around (the settings bound the inputs).
    let clamp = |bytes: u128| u64::try_from(bytes).unwrap_or(u64::MAX);
    Footprint {
        weights: clamp(weights),
        // With half-precision compute the reference is stored as the forward reads it.
        reference: clamp(if w.reference && lora.is_none() {
            params * (frozen.bytes() as u128).min(w.compute.bytes() as u128)
        } else {
            0
        }),
        gradients: clamp(trained),
        // With checkpointing a pass holds only the head's and one layer's gradients at a time
        // beside the sum, but SmolLM2-135M's GRPO step with checkpointing held within 6% of a
        // plan that counted only those: the whole copy stays, as a margin.
        summed: clamp(if w.accumulates() { trained } else { 0 }),
        optimizer: clamp(2 * trained),
        activations: clamp(activations + retained),
        rollout: clamp(rollout),
        // The value model reads the same sequences without a checkpointed trunk and without
        // the log-prob op's logits (`trainer::update`).
        critic: clamp(if w.value_model { 3 * trained } else { 0 }),
        // Its gradients, their sum over micro-batches (on the device, offloaded or not:
        // `trainer::update`), and its activations.
        critic_update: clamp(match w.value_model {
            true => trained * if w.accumulates() { 2 } else { 1 } + activations::value_model(m, w, kernels),
            false => 0,
        }),
        offloaded: false,
        pass_gradients: clamp(if w.checkpointing { trained.min((vocab * d + head_or_layer) * F32W) } else { trained }),
        step: clamp(6 * largest.min(trained / F32W) * F32W + if w.value_model { trained } else { 0 }),
        // One layer at a time without a graph: the attention's scores and probabilities, the
        // layer's hidden states; the log-prob op's logits chunk.
        scoring: clamp(
            (2 * heads * pass.query_keys
                + pass.tokens * (4 * d + 2 * q + 2 * kv + 3 * f)
                + activations::logits_chunk(pass.tokens, vocab))
                * F32W,
        ),
    }
}

/// `text` with its first letter in upper case.
fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

/// Tokens of the prefill's largest pass: each distinct prompt once, as many as
/// `w.prefill_budget` holds (a whole prompt at least; shorter prompts fit more rows).
fn prefill_tokens(w: &Workload) -> u128 {
    let distinct = w.rollout_sequences.div_ceil(w.shared.group.max(1)) as u128;
    let prompt = w.rollout_prompt as u128;
    (distinct * prompt).min((w.prefill_budget as u128).max(prompt))
}

/// The prefill's attention scores and probabilities over at most `prompt` keys for each of
/// `tokens` queries, f32 twice, as the generic attention holds them (the CPU's fused attention
/// keeps one query block's).
fn prefill_scores(m: &ModelConfig, tokens: u128, prompt: usize) -> u128 {
    tokens * m.num_attention_heads as u128 * prompt as u128 * 2 * F32W
}

/// A setting's effect on the workload (one of the ways out).
type Change = Box<dyn Fn(&mut Workload)>;

/// One policy's line of the plan.
#[derive(Clone, Debug)]
pub struct PolicyPlan {
    /// Its place in the config's `[[agents]]`.
    pub index: usize,
    pub name: String,
    pub model: String,
    pub device: DeviceSpec,
    pub shape: ModelConfig,
    /// The policy's adapters (`[agents.lora]`), if it trains with LoRA.
    pub lora: Option<LoraConfig>,
    /// Storage of its frozen weights.
    pub frozen_dtype: FrozenDtype,
    /// Its reference, moments and summed gradients wait in host memory (`offload`).
    pub offload: bool,
    pub footprint: Footprint,
}

impl PolicyPlan {
    /// Its footprint under `w`, with `lora` adapters and `frozen` storage. Offloading moves
    /// state off a GPU; on the CPU the host is the device, so it changes nothing there.
    fn footprint_as(&self, w: &Workload, lora: Option<&LoraConfig>, frozen: FrozenDtype) -> Footprint {
        let f = footprint(&self.shape, w, lora, frozen, Kernels::on(self.device));
        if self.offload && self.device != DeviceSpec::Cpu { f.offloaded() } else { f }
    }

    /// Whether offloading would lower its footprint (a GPU's policy that does not offload yet).
    fn could_offload(&self) -> bool {
        !self.offload && self.device != DeviceSpec::Cpu
    }
}

/// Where a device's memory figure comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Capacity {
    /// `--device-memory`.
    Given(u64),
    /// The machine's `MemAvailable` (CPU).
    Available(u64),
    /// `nvidia-smi`'s free memory of that GPU.
    Free(u64),
    /// Not known (a GPU without `nvidia-smi` and no `--device-memory`): nothing is refused.
    Unknown,
}

impl Capacity {
    pub fn bytes(&self) -> Option<u64> {
        match *self {
            Capacity::Given(b) | Capacity::Available(b) | Capacity::Free(b) => Some(b),
            Capacity::Unknown => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Capacity::Given(b) => format!("{} (--device-memory)", gb(*b)),
            Capacity::Available(b) => format!("{} available RAM", gb(*b)),
            Capacity::Free(b) => format!("{} free (nvidia-smi)", gb(*b)),
            Capacity::Unknown => "unknown free memory (pass --device-memory to check)".into(),
        }
    }
}

/// A device's policies and what they need together.
#[derive(Clone, Debug)]
pub struct DevicePlan {
    pub device: DeviceSpec,
    /// Indices into [`MemoryPlan::policies`].
    pub policies: Vec<usize>,
    pub need: u64,
    pub capacity: Capacity,
}

impl DevicePlan {
    pub fn fits(&self) -> bool {
        self.capacity.bytes().is_none_or(|have| self.need <= have)
    }
}

/// The plan of a run: every policy's footprint and every device's total.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    pub workload: Workload,
    pub policies: Vec<PolicyPlan>,
    pub devices: Vec<DevicePlan>,
    /// This machine's memory, for what offloaded policies keep there: not checked when
    /// `--device-memory` plans for another machine.
    pub host: Capacity,
}

impl MemoryPlan {
    /// The plan of `cfg` for the policies `hosted` marks (all, or a cluster host's);
    /// `device_memory` stands in for every device's free memory (for a device that is not
    /// there, or to override what the machine reports).
    pub fn of(cfg: &TrainConfig, device_memory: Option<u64>, hosted: &[bool]) -> Result<Self> {
        let workload = Workload::of(cfg)?;
        let mut policies = Vec::with_capacity(cfg.policies.len());
        for (k, p) in cfg.policies.iter().enumerate().filter(|&(k, _)| hosted.get(k) == Some(&true)) {
            let mut plan = PolicyPlan {
                index: k,
                name: cfg.policy_name(k),
                model: p.model.clone(),
                device: DeviceSpec::parse_name(&p.device)?,
                footprint: Footprint::default(),
                lora: p.lora.clone(),
                frozen_dtype: p.frozen_dtype,
                offload: p.offload,
                shape: model_shape(&p.model, cfg)?,
            };
            plan.footprint = plan.footprint_as(&workload, p.lora.as_ref(), p.frozen_dtype);
            policies.push(plan);
        }
        let mut devices: Vec<DevicePlan> = Vec::new();
        for (k, p) in policies.iter().enumerate() {
            match devices.iter_mut().find(|d| d.device == p.device) {
                Some(d) => d.policies.push(k),
                None => devices.push(DevicePlan {
                    device: p.device,
                    policies: vec![k],
                    need: 0,
                    capacity: Capacity::Unknown,
                }),
            }
        }
        for d in &mut devices {
            // Policies on one device run their phases one after another, but their persistent
            // state and the caching allocator's high-water marks add up.
            d.need = d.policies.iter().map(|&k| policies[k].footprint.peak()).sum();
            d.capacity = match device_memory {
                Some(b) => Capacity::Given(b),
                None => measured_capacity(d.device),
            };
        }
        let host = match device_memory {
            Some(_) => Capacity::Unknown,
            None => available_ram().map_or(Capacity::Unknown, Capacity::Available),
        };
        Ok(MemoryPlan { workload, policies, devices, host })
    }

    /// This plan under workload `w`: the same policies, shapes and devices (their capacities as
    /// measured), each footprint and device total recomputed.
    fn under(&self, w: Workload) -> MemoryPlan {
        let mut plan = self.clone();
        plan.workload = w;
        for p in &mut plan.policies {
            p.footprint = p.footprint_as(&w, p.lora.as_ref(), p.frozen_dtype);
        }
        for d in &mut plan.devices {
            d.need = d.policies.iter().map(|&k| plan.policies[k].footprint.peak()).sum();
        }
        plan
    }

    /// Whether every device fits, and what offloaded policies keep in host memory.
    pub fn fits(&self) -> bool {
        self.devices.iter().all(DevicePlan::fits) && self.host_fits()
    }

    /// What offloaded policies keep in host memory.
    pub fn offloaded(&self) -> u64 {
        self.policies.iter().map(|p| p.footprint.host()).sum()
    }

    /// Host memory for the offloaded state beside the CPU's own policies (no offload: the
    /// CPU's device plan says it all).
    fn host_fits(&self) -> bool {
        let cpu: u64 = self.devices.iter().filter(|d| d.device == DeviceSpec::Cpu).map(|d| d.need).sum();
        let need = self.offloaded();
        need == 0 || self.host.bytes().is_none_or(|have| need.saturating_add(cpu) <= have)
    }

    /// For a plan of `cfg` that does not fit: `cfg` with the settings that leave the run's
    /// mathematics as it is chosen so that every device fits, its plan, and a line that says
    /// what was chosen and why. Those settings: fewer prompts sampled together (the same
    /// sampling; the chunks' seeds differ, so other random draws, as another seed gives),
    /// gradient accumulation over a smaller micro-batch, then gradient checkpointing as well
    /// (recomputation); the largest rollout batch and micro-batch that fit are kept. When no
    /// such choice fits, the same search again with the GPU policies of the devices that do not
    /// fit offloaded (their state in host memory, copied at every step). None when the plan
    /// fits already or these cannot make it fit (the error of [`MemoryPlan::check`] then names
    /// the changes that alter the update).
    pub fn fitted(&self, cfg: &TrainConfig) -> Option<(TrainConfig, MemoryPlan, String)> {
        if self.fits() {
            return None;
        }
        let (prompts, micro_batch, checkpointing, plan) =
            self.leanest_fit(cfg).or_else(|| self.offloading_what_fits_no_other_way()?.leanest_fit(cfg))?;
        let w = self.workload;
        let (mut chose, mut how) = (vec![], vec![]);
        if prompts != cfg.rollout.batch_prompts.max(1) {
            chose.push(format!("rollout.batch_prompts = {prompts} (was {})", cfg.rollout.batch_prompts));
            how.push("prompts sampled in smaller batches (other random draws, as with another seed)".to_string());
        }
        let (key, was) = w.micro();
        if micro_batch != was {
            chose.push(format!("{key} = {micro_batch} (was {was})"));
            how.push("gradients accumulated over smaller micro-batches".to_string());
        }
        if checkpointing != w.checkpointing {
            chose.push("algo.gradient_checkpointing = true".to_string());
            how.push("activations recomputed in the backward pass".to_string());
        }
        let newly: Vec<&PolicyPlan> = plan
            .policies
            .iter()
            .zip(&self.policies)
            .filter(|(p, was)| p.offload && !was.offload)
            .map(|(p, _)| p)
            .collect();
        if !newly.is_empty() {
            let names: Vec<&str> = newly.iter().map(|p| p.name.as_str()).collect();
            let host: u64 = newly.iter().map(|p| p.footprint.host()).sum();
            chose.push(format!("offload = true for {}", names.join(", ")));
            how.push(format!(
                "AdamW moments, summed gradients and KL reference waiting in host memory ({}, copied at every step)",
                gb(host)
            ));
        }
        let d = self.devices.iter().find(|d| !d.fits()).expect("one does not fit");
        let now = plan.devices.iter().find(|x| x.device == d.device).map_or(0, |x| x.need);
        let line = format!(
            "the plan needed {} on {}, more than it has; chose {} ({} there): the same update, {}",
            gb(d.need),
            d.device,
            chose.join(" and "),
            gb(now),
            how.join(" and ")
        );
        let mut fitted = cfg.clone();
        let micro = plan.workload;
        (fitted.algo.micro_batch_sequences, fitted.algo.micro_batch_tokens) = (micro.micro_batch, micro.micro_tokens);
        fitted.algo.gradient_checkpointing = checkpointing;
        fitted.rollout.batch_prompts = prompts;
        for p in &newly {
            fitted.policies[p.index].offload = true;
        }
        Some((fitted, plan, line))
    }

    /// The largest rollout batch, then micro-batch (sequences, or a token budget when one is
    /// set), without then with checkpointing, that fit every device: (prompts per rollout
    /// batch, the micro-batch's bound, checkpointing, the plan).
    fn leanest_fit(&self, cfg: &TrainConfig) -> Option<(usize, usize, bool, MemoryPlan)> {
        let w = self.workload;
        let group = w.group_size;
        let halvings = |from: usize| std::iter::successors(Some(from), |&m| (m > 1).then_some(m / 2));
        let checkpointing = if w.checkpointing { vec![true] } else { vec![false, true] };
        let micro = w.smaller_micro_batches();
        // The rollout and the update never hold their memory at the same time (the peak is the
        // larger of the two), so each keeps what it can.
        let candidates = halvings(cfg.rollout.batch_prompts.max(1)).flat_map(|prompts| {
            let micro = &micro;
            checkpointing.iter().flat_map(move |&ckpt| micro.iter().map(move |&m| (prompts, m, ckpt)))
        });
        candidates
            .map(|(prompts, m, ckpt)| {
                let lean = Workload { checkpointing: ckpt, rollout_sequences: prompts * group, ..w.with_micro(m) };
                (prompts, m, ckpt, self.under(lean))
            })
            .find(|(.., plan)| plan.fits())
    }

    /// This plan with the GPU policies offloaded whose devices do not fit even at the leanest
    /// settings that keep the update ([`Workload::leanest`]); None when there is none.
    fn offloading_what_fits_no_other_way(&self) -> Option<MemoryPlan> {
        let leanest = self.workload.leanest();
        let offloaded = self.under(leanest).offloading_where_it_does_not_fit()?;
        let mut plan = self.clone();
        for (p, o) in plan.policies.iter_mut().zip(&offloaded.policies) {
            p.offload = o.offload;
        }
        Some(plan.under(self.workload))
    }

    /// This plan with every GPU policy of a device that does not fit offloaded; None when
    /// there is none to offload.
    fn offloading_where_it_does_not_fit(&self) -> Option<MemoryPlan> {
        let mut plan = self.clone();
        let mut any = false;
        for d in self.devices.iter().filter(|d| !d.fits()) {
            for &k in &d.policies {
                if plan.policies[k].could_offload() {
                    (plan.policies[k].offload, any) = (true, true);
                }
            }
        }
        any.then(|| plan.under(self.workload))
    }

    /// An error naming every device that does not fit, its policies, the numbers and the
    /// settings that would bring it down (a paragraph per device: a line per policy, one of
    /// ways out).
    pub fn check(&self, cfg: &TrainConfig) -> Result<()> {
        let failing: Vec<&DevicePlan> = self.devices.iter().filter(|d| !d.fits()).collect();
        if failing.is_empty() && self.host_fits() {
            return Ok(());
        }
        // What hacpo would choose by itself (`MemoryPlan::fitted`) at its leanest.
        let leanest = self.under(self.workload.leanest());
        let mut msg = String::new();
        for d in failing {
            msg.push_str(&self.device_report(cfg, d, &leanest));
        }
        if !self.host_fits() {
            let names: Vec<&str> =
                self.policies.iter().filter(|p| p.footprint.offloaded).map(|p| p.name.as_str()).collect();
            msg.push_str(&format!(
                "the offloaded state of {} (reference, AdamW moments, summed gradients) needs {} of host memory beside the CPU's policies, and this machine has {}.\nWays out: offload = false where the device fits without it; LoRA adapters (--lora 16); a machine with more memory, or the agents spread over machines (--host).\n",
                names.join(", "),
                gb(self.offloaded()),
                self.host.describe()
            ));
        }
        msg.push_str("--dry-run prints the whole plan; --skip-memory-check trains anyway.");
        Err(Error::InvalidArgument(msg))
    }

    /// One paragraph of [`MemoryPlan::check`]'s error: device `d`'s need, a line per policy,
    /// what the same run at its leanest (`leanest`) needs or why nothing of the kind can fit,
    /// and the ways out.
    fn device_report(&self, cfg: &TrainConfig, d: &DevicePlan, leanest: &MemoryPlan) -> String {
        let have = d.capacity.bytes().expect("a device that does not fit has a capacity");
        let mut msg = format!(
            "the memory plan does not fit {}: it needs about {}, and it has {}.\n",
            d.device,
            gb(d.need),
            d.capacity.describe()
        );
        for &k in &d.policies {
            let p = &self.policies[k];
            msg.push_str(&format!("  {} ({}): {}\n", p.name, p.model, breakdown(&p.footprint)));
        }
        // Held through an update whatever the batch sizes.
        let state: u64 = d.policies.iter().map(|&k| self.policies[k].footprint.state()).sum();
        let offloadable = d.policies.iter().any(|&k| self.policies[k].could_offload());
        if state > have && offloadable {
            let offloaded = leanest.offloading_where_it_does_not_fit().expect("a policy to offload");
            let same = offloaded.devices.iter().find(|x| x.device == d.device).map_or(0, |x| x.need);
            let verdict = match (same <= have, offloaded.host_fits()) {
                (true, true) => ", which fits: hacpo chooses such settings itself once every device fits".to_string(),
                (_, false) => format!(
                    ", and {} of host memory, more than this machine's {}",
                    gb(offloaded.offloaded()),
                    offloaded.host.describe()
                ),
                (false, true) => String::new(),
            };
            msg.push_str(&format!(
                "Its weights, reference, gradients and AdamW moments alone need {}; with the last three in host memory (offload = true under its [[agents]], or --offload: the same update), {} with gradient checkpointing and one prompt per rollout batch needs {}{verdict}.\n",
                gb(state),
                self.workload.leanest_micro_batch(),
                gb(same),
            ));
        } else if state > have {
            msg.push_str(&format!(
                "Its weights, reference, gradients and AdamW moments alone need {}: no batch size makes them fit, only a change to what is trained or stored.\n",
                gb(state)
            ));
        } else {
            let same = leanest.devices.iter().find(|x| x.device == d.device).map_or(0, |x| x.need);
            msg.push_str(&format!(
                "{} with gradient checkpointing and one prompt per rollout batch (the same run) needs {}{}.\n",
                capitalised(&self.workload.leanest_micro_batch()),
                gb(same),
                if same <= have {
                    ", which fits: hacpo chooses such settings itself once every device fits"
                } else {
                    ""
                }
            ));
        }
        let mut ways: Vec<String> = self
            .ways_out(cfg, d)
            .into_iter()
            .map(|(what, need)| format!("{what} → {}{}", gb(need), if need <= have { " (fits)" } else { "" }))
            .collect();
        if d.policies.len() > 1 {
            ways.push("one device per agent (--devices cuda:0,cuda:1)".into());
        }
        msg.push_str(&format!("Ways out: {}.\n", ways.join("; ")));
        msg
    }

    /// What the device would need under each setting that lowers the plan.
    fn ways_out(&self, cfg: &TrainConfig, d: &DevicePlan) -> Vec<(String, u64)> {
        // `lora`: every policy of the device that trains fully gets default adapters; `bf16`:
        // every policy stores its frozen weights in bf16.
        let default_lora = LoraConfig::default();
        let need_as = |w: &Workload, lora: bool, bf16: bool, offload: bool| -> u64 {
            d.policies
                .iter()
                .map(|&k| {
                    let p = PolicyPlan { offload: self.policies[k].offload || offload, ..self.policies[k].clone() };
                    let adapters = p.lora.as_ref().or(lora.then_some(&default_lora));
                    let frozen = if bf16 { FrozenDtype::Bf16 } else { p.frozen_dtype };
                    p.footprint_as(w, adapters, frozen).peak()
                })
                .sum()
        };
        let offloadable = d.policies.iter().any(|&k| self.policies[k].could_offload());
        let need = |w: &Workload, lora: bool| need_as(w, lora, false, false);
        let need_with = |w: &Workload| need(w, false);
        // bf16 storage lowers what is frozen: a LoRA base or a reference.
        let bf16_helps = d.policies.iter().any(|&k| {
            let p = &self.policies[k];
            p.frozen_dtype == FrozenDtype::F32 && (p.lora.is_some() || self.workload.reference)
        }) && d.device != DeviceSpec::Wgpu;
        let w = self.workload;
        let full: Vec<&str> = d
            .policies
            .iter()
            .filter(|&&k| self.policies[k].lora.is_none())
            .map(|&k| self.policies[k].name.as_str())
            .collect();
        // Each change alone, then all of them together.
        let mut changes: Vec<(String, Change)> = Vec::new();
        let least = w.one_sequence();
        let (key, n) = w.micro();
        if n > least {
            changes.push((format!("--set {key}={least}"), Box::new(move |w| *w = w.with_micro(least))));
        }
        if cfg.rollout.max_new_tokens > 1 {
            // Halved responses, also where another policy's are re-tokenised.
            let mut shorter = cfg.clone();
            shorter.rollout.max_new_tokens /= 2;
            shorter.rollout.max_response_tokens =
                shorter.rollout.max_response_tokens.min(shorter.rollout.max_new_tokens);
            let halved =
                Workload::of(&shorter).map(|h| (h.train_len, h.rollout_new)).unwrap_or((w.train_len, w.rollout_new));
            let r = &shorter.rollout;
            changes.push((
                format!(
                    "--set rollout.max_new_tokens={} --set rollout.max_response_tokens={}",
                    r.max_new_tokens, r.max_response_tokens
                ),
                Box::new(move |w| (w.train_len, w.rollout_new) = halved),
            ));
        }
        if cfg.rollout.batch_prompts > 1 {
            changes.push(("--set rollout.batch_prompts=1".into(), Box::new(|w| w.rollout_sequences = w.group_size)));
        }
        if !w.checkpointing {
            changes.push(("--set algo.gradient_checkpointing=true".into(), Box::new(|w| w.checkpointing = true)));
        }
        if w.reference {
            changes.push(("--set algo.kl_coef=0 (no reference)".into(), Box::new(|w| w.reference = false)));
        }
        let mut out: Vec<(String, u64)> = Vec::new();
        if !full.is_empty() {
            out.push((
                format!(
                    "LoRA adapters for {} (--lora {}, or [agents.lora] under its [[agents]])",
                    full.join(", "),
                    default_lora.rank
                ),
                need(&w, true),
            ));
        }
        if bf16_helps {
            out.push((
                "frozen_dtype = \"bf16\" under each [[agents]] (the LoRA base or KL reference in bf16)".into(),
                need_as(&w, false, true, false),
            ));
        }
        if offloadable {
            out.push((
                "offload = true under each [[agents]] or --offload (moments, summed gradients and reference in host memory; the same update)".into(),
                need_as(&w, false, false, true),
            ));
        }
        out.extend(changes.iter().map(|(what, change)| {
            let mut changed = w;
            change(&mut changed);
            (what.clone(), need_with(&changed))
        }));
        if out.len() > 1 {
            let mut all = w;
            changes.iter().for_each(|(_, change)| change(&mut all));
            out.push((
                "all of these".into(),
                need_as(&all, !full.is_empty(), d.device != DeviceSpec::Wgpu, offloadable),
            ));
        }
        out
    }
}

/// `weights 32.1 GB, reference …` for one footprint.
fn breakdown(f: &Footprint) -> String {
    format!(
        "weights {}, reference {}, gradients {}{}, AdamW moments {}, activations {}, rollout {}{}; peak {}",
        gb(f.weights),
        gb(f.reference),
        gb(f.gradients),
        match f.summed_on_device() {
            0 => String::new(),
            summed => format!(" (+{} summed over micro-batches)", gb(summed)),
        },
        gb(f.optimizer),
        gb(f.activations),
        gb(f.rollout),
        if f.critic > 0 {
            format!(", value model {} (+{} in an update)", gb(f.critic), gb(f.critic_update))
        } else {
            String::new()
        },
        gb(f.peak())
    )
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.workload;
        writeln!(
            f,
            "memory plan ({} matmuls; {}{}; rollout {} × {}+{} tokens{}):",
            w.compute.name(),
            match w.micro_tokens {
                0 => format!(
                    "micro-batch {} × {} tokens{}",
                    w.micro_batch,
                    w.train_len,
                    match w.shared.prompts_among(w.micro_batch) {
                        p if p < w.micro_batch => format!(" (at most {p} prompts, each run once)"),
                        _ => String::new(),
                    }
                ),
                budget => format!("micro-batches of {budget} token slots, sequences up to {} tokens", w.train_len),
            },
            if w.checkpointing { ", gradient checkpointing" } else { "" },
            w.rollout_sequences,
            w.rollout_prompt,
            w.rollout_new,
            if w.reference { "; KL reference" } else { "" }
        )?;
        writeln!(
            f,
            "  {:<34} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  device",
            "policy", "params", "weights", "ref", "grads", "adamw", "activ", "rollout", "peak"
        )?;
        for p in &self.policies {
            let fp = &p.footprint;
            writeln!(
                f,
                "  {:<34} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {}",
                match (&p.lora, p.frozen_dtype) {
                    (Some(l), FrozenDtype::F32) => format!("{} (LoRA r{})", p.name, l.rank),
                    (Some(l), dtype) => format!("{} (LoRA r{}, {})", p.name, l.rank, dtype.name()),
                    (None, _) => p.name.clone(),
                },
                count(p.shape.num_parameters() as u64),
                gb(fp.weights),
                gb(fp.reference),
                gb(fp.gradients.saturating_add(fp.summed_on_device())),
                gb(fp.optimizer),
                gb(fp.activations),
                gb(fp.rollout),
                gb(fp.peak()),
                p.device
            )?;
        }
        let host: u64 = self.policies.iter().map(|p| p.footprint.host()).sum();
        if host > 0 {
            let names: Vec<&str> =
                self.policies.iter().filter(|p| p.footprint.offloaded).map(|p| p.name.as_str()).collect();
            writeln!(
                f,
                "  offloaded ({}): {} of reference, moments and summed gradients in host memory{}; ref, grads and adamw above are there",
                names.join(", "),
                gb(host),
                match self.host {
                    Capacity::Available(have) => format!(" ({} available)", gb(have)),
                    _ => String::new(),
                }
            )?;
        }
        for d in &self.devices {
            let verdict = match d.capacity.bytes() {
                None => "not checked",
                Some(_) if d.fits() => "fits",
                Some(_) => "DOES NOT FIT",
            };
            writeln!(f, "  {}: needs {} of {}: {verdict}", d.device, gb(d.need), d.capacity.describe())?;
        }
        Ok(())
    }
}

/// What a command that does not train (`generate`, `eval`, `bench`) runs at once: sampling
/// `sequences` sequences of up to `prompt` + `new` tokens together, and (bench's train step)
/// a forward and backward pass over `train_sequences` × `train_len` tokens with AdamW.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommandLoad {
    pub sequences: usize,
    pub prompt: usize,
    pub new: usize,
    pub train_sequences: usize,
    pub train_len: usize,
    /// Every sequence's prompt prefilled in one pass (`hacpo bench`), not in passes of
    /// [`crate::generate::PREFILL_TOKEN_BUDGET`] tokens as a generation does.
    pub whole_batch_prefill: bool,
}

/// What a command that does not train runs on: its model's shape, the device and the dtype.
#[derive(Clone, Debug)]
pub struct CommandTarget<'a> {
    /// The command's name (`generate`, `eval`, `bench`).
    pub command: &'a str,
    /// The model as the user named it.
    pub model: &'a str,
    pub shape: ModelConfig,
    pub device: DeviceSpec,
    pub compute: ComputeDtype,
    /// `--device-memory`, standing in for the device's free memory.
    pub device_memory: Option<u64>,
}

/// The memory plan of a command that does not train, checked before its model loads: the
/// same estimate and the same refusal as `hacpo train`'s, with the command's own ways out.
pub fn check_command(target: &CommandTarget<'_>, load: CommandLoad, ways: &[String]) -> Result<()> {
    let CommandTarget { command, model, device, device_memory, .. } = *target;
    let capacity = match device_memory {
        Some(b) => Capacity::Given(b),
        None => measured_capacity(device),
    };
    let (need, parts) = command_need(target, load);
    if capacity.bytes().is_none_or(|have| need <= have) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "the memory plan does not fit {device}: `hacpo {command}` needs about {}, and it has {}.\n  {model}: {parts}; peak {}\n\
         Ways out: {}.\n--device-memory SIZE states the free memory; --skip-memory-check runs anyway.",
        gb(need),
        capacity.describe(),
        gb(need),
        ways.join("; ")
    )))
}

/// What a command that does not train needs on its device at its peak, and its parts in words
/// (`weights 0.54 GB, sampling 0.10 GB, train step 9.73 GB`).
pub fn command_need(target: &CommandTarget<'_>, load: CommandLoad) -> (u64, String) {
    let CommandTarget { ref shape, device, compute, .. } = *target;
    // A prompt (an upper bound from its bytes) never holds more tokens than the context.
    let context = shape.max_position_embeddings;
    let generating = Workload {
        micro_batch: 0,
        micro_tokens: 0,
        train_len: 0,
        shared: SharedPrompts::NONE,
        group_size: 1,
        rollout_sequences: load.sequences,
        rollout_prompt: load.prompt.min(context),
        rollout_new: load.new.min(context),
        // `hacpo bench` prefills its whole batch in one pass.
        prefill_budget: if load.whole_batch_prefill { usize::MAX } else { crate::generate::PREFILL_TOKEN_BUDGET },
        reference: false,
        checkpointing: false,
        compute,
        value_model: false,
        minibatch: 0,
    };
    let kernels = Kernels::on(device);
    let sampling = footprint(shape, &generating, None, FrozenDtype::F32, kernels);
    // Sampling reads the weights stored in the compute dtype (f32 ones are not kept beside).
    let weights = if compute.is_f32() { sampling.weights } else { shape.num_parameters() as u64 * compute.bytes() };
    let rollout = sampling.rollout.saturating_sub(if compute.is_f32() { 0 } else { weights });
    let mut need = weights.saturating_add(rollout);
    let mut parts = format!("weights {}, sampling {}", gb(weights), gb(rollout));
    if load.train_sequences > 0 {
        let train = footprint(
            shape,
            &Workload {
                micro_batch: load.train_sequences,
                micro_tokens: 0,
                train_len: load.train_len,
                shared: SharedPrompts::NONE,
                group_size: 1,
                rollout_sequences: 0,
                rollout_prompt: 0,
                rollout_new: 0,
                prefill_budget: crate::generate::PREFILL_TOKEN_BUDGET,
                reference: false,
                checkpointing: false,
                compute,
                value_model: false,
                minibatch: load.train_sequences,
            },
            None,
            FrozenDtype::F32,
            kernels,
        );
        let step = train
            .weights
            .saturating_add(train.optimizer)
            .saturating_add(train.gradients)
            .saturating_add(train.activations);
        parts.push_str(&format!(", train step {}", gb(step)));
        let retained = if kernels.keeps_freed_rollout() { rollout } else { 0 };
        need = need.max(step.saturating_add(retained));
    }
    (need, parts)
}

/// The memory a device has for the run: available RAM for the CPU, `nvidia-smi`'s free memory
/// for a CUDA device.
fn measured_capacity(device: DeviceSpec) -> Capacity {
    match device {
        DeviceSpec::Cpu => available_ram().map_or(Capacity::Unknown, Capacity::Available),
        DeviceSpec::Cuda(index) => nvidia_smi_free(index).map_or(Capacity::Unknown, Capacity::Free),
        DeviceSpec::Wgpu => Capacity::Unknown,
    }
}

/// `MemAvailable` of `/proc/meminfo` in bytes (Linux).
pub fn available_ram() -> Option<u64> {
    crate::alloc::proc_kib_field("/proc/meminfo", "MemAvailable")
}

/// Free memory of GPU `index` as `nvidia-smi` reports it (MiB), if it runs.
fn nvidia_smi_free(index: usize) -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.free", "--format=csv,noheader,nounits", &format!("--id={index}")])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let mib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(mib * 1024 * 1024)
}

/// The shape of a policy's model without loading weights: a tiny agent's spec, a zoo entry's
/// copy of its `config.json`, a local directory's `config.json` or a GGUF file's header.
pub fn model_shape(spec: &str, cfg: &TrainConfig) -> Result<ModelConfig> {
    let path = Path::new(spec);
    // A PEFT adapter directory: its base's shape (the adapter adds little).
    if crate::model::lora::is_adapter_dir(path) {
        return model_shape(&crate::model::adapter_base(path, None)?, cfg);
    }
    if path.is_dir() {
        return ModelConfig::from_file(&path.join("config.json"));
    }
    if path.is_file() {
        return crate::model::gguf::GgufFile::open(path)?.config();
    }
    if let Some(tiny) = crate::tiny::find_for(spec, &cfg.pretrain) {
        return crate::tiny::model_config(&tiny, tiny.vocab_size, &[0]);
    }
    match crate::model::zoo::find(spec) {
        Some(entry) => entry.model_config(),
        None => Err(crate::resolve::unknown_model(spec)),
    }
}

/// Parses `80GB`, `80G`, `80GiB`, `512MiB`, `1.5TB` (decimal units are powers of 1000, `…iB`
/// of 1024).
pub fn parse_size(text: &str) -> Result<u64> {
    let s = text.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    let bad = || {
        Error::InvalidArgument(format!(
            "cannot read the size {text:?}; give a number with a unit, e.g. 80GB, 81920MiB or 1.5TB"
        ))
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0_f64.powi(4),
        _ => return Err(bad()),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Bytes as decimal gigabytes (what GPU vendors and `--device-memory 80GB` use).
pub fn gb(bytes: u64) -> String {
    let g = bytes as f64 / 1e9;
    if g >= 10.0 {
        format!("{g:.1} GB")
    } else if g >= 0.01 {
        format!("{g:.2} GB")
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

/// `1.54B`, `135M`, `480K` parameters.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => format!("{:.0}K", n as f64 / 1e3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `"1.5B"` → 1.5e9, `"135M"` → 1.35e8.
    fn listed(params: &str) -> f64 {
        let (n, unit) = params.split_at(params.len() - 1);
        let scale = match unit {
            "B" => 1e9,
            "M" => 1e6,
            other => panic!("unit {other}"),
        };
        n.parse::<f64>().unwrap() * scale
    }

    /// One sequence of `train_len` tokens per micro-batch; 16 rollouts of 512 + 512 tokens.
    fn workload(train_len: usize, reference: bool) -> Workload {
        Workload {
            micro_batch: 1,
            micro_tokens: 0,
            train_len,
            shared: SharedPrompts::NONE,
            group_size: 1,
            rollout_sequences: 16,
            rollout_prompt: 512,
            rollout_new: 512,
            prefill_budget: crate::generate::PREFILL_TOKEN_BUDGET,
            reference,
            checkpointing: false,
            compute: ComputeDtype::F32,
            value_model: false,
            minibatch: 1,
        }
    }

    #[test]
    fn every_zoo_entry_has_the_parameter_count_its_model_card_gives() {
        for e in crate::model::zoo::entries() {
            let shape = e.model_config().unwrap_or_else(|err| panic!("{}: {err}", e.id));
            let params = shape.num_parameters() as f64;
            let card = listed(&e.params);
            // The cards round to two or three significant digits.
            assert!(
                (params / card - 1.0).abs() < 0.025,
                "{}: {params:.4e} parameters, the card says {}",
                e.id,
                e.params
            );
            let w = workload(1024, true);
            let f = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
            assert_eq!(f.weights, shape.num_parameters() as u64 * 4, "{}", e.id);
            assert_eq!((f.reference, f.gradients, f.optimizer), (f.weights, f.weights, 2 * f.weights), "{}", e.id);
        }
    }

    #[test]
    fn full_fine_tuning_of_llama_8b_needs_more_than_one_80_gb_gpu() {
        let shape = crate::model::zoo::find("llama-8b").unwrap().model_config().unwrap();
        let w = workload(512, false);
        let f = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
        // 8.03e9 parameters × (4 weights + 4 gradients + 8 moments) bytes.
        assert!((f.weights + f.gradients + f.optimizer) as f64 > 128e9);
        assert!(f.peak() as f64 > 80e9);
    }

    /// Offloaded, the device keeps the weights for the run and, in turn, each phase's own:
    /// with checkpointing a backward pass's gradients (the LM head's and one layer's or the
    /// embedding's, far below all of them), the reference beside the scoring pass, one parameter's update; the
    /// rest waits in host memory.
    #[test]
    fn offloading_leaves_the_weights_and_the_largest_phase_on_the_device() {
        let shape = crate::model::zoo::find("llama-8b").unwrap().model_config().unwrap();
        let w = Workload { checkpointing: true, ..workload(4096, true) };
        let resident = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
        let f = resident.offloaded();
        assert_eq!(f.persistent(), f.weights);
        assert_eq!(f.host(), f.reference + f.gradients + f.optimizer);
        // The LM head's (128,256 × 4,096), alive while the embedding's pass adds as many: more
        // than one layer's 218M parameters.
        assert_eq!(f.pass_gradients, 2 * 128_256 * 4096 * 4);
        assert_eq!(f.step, 6 * 128_256 * 4096 * 4, "the LM head's update, the old weights dropped as it goes");
        let phases = [f.pass_gradients + f.activations, f.rollout, f.step, f.reference + f.scoring];
        assert_eq!(f.peak(), f.weights + phases.into_iter().max().unwrap());
        assert!(f.scoring < f.activations && f.peak() < resident.peak() / 2, "{f:?}");
        // Resident, the update replaces the weights beside every gradient: the peak when the
        // backward pass's activations are smaller than the largest parameter's update (short
        // sequences, recomputation) and the rollout is short.
        let short = Workload { rollout_sequences: 1, rollout_prompt: 8, rollout_new: 8, ..w };
        let short = footprint(&shape, &Workload { train_len: 16, ..short }, None, FrozenDtype::F32, Kernels::Generic);
        assert!(short.activations < short.step && short.rollout < short.step, "{short:?}");
        assert_eq!(short.peak(), short.persistent() + short.gradients + short.step);
        // A value model's gradients wait through the policy's update.
        let critic = footprint(&shape, &Workload { value_model: true, ..w }, None, FrozenDtype::F32, Kernels::Generic);
        assert_eq!(critic.step, resident.step + resident.gradients);
        // Without checkpointing one backward pass leaves every gradient on the device.
        let plain = footprint(&shape, &workload(4096, true), None, FrozenDtype::F32, Kernels::Generic).offloaded();
        assert_eq!(plain.pass_gradients, plain.gradients);
    }

    /// The plan's bound on the prompts of a micro-batch holds however the trainer cuts a
    /// learner's samples: GRPO's mini-batches of its own groups in order, HACPO's own-first and
    /// interleaved ones with the other policies' groups; every group size, number of prompts
    /// and policies, mini-batch count and micro-batch size.
    #[test]
    fn a_micro_batch_holds_no_more_prompts_than_the_plan_counts() {
        use crate::rl::PoolSample;
        use crate::rl::hacpo::{MinibatchOrder, minibatches};
        use std::collections::HashSet;
        let mut cuts = 0;
        for group in 2..=5 {
            for prompts in 1..=4 {
                for policies in 1..=3 {
                    // Each policy's samples as the exchange publishes them: prompt after prompt,
                    // `group` responses each.
                    let pool: Vec<PoolSample> = (0..policies)
                        .flat_map(|agent| {
                            (0..prompts * group).map(move |i| PoolSample { agent, group: i / group, reward: 0.0 })
                        })
                        .collect();
                    let shared = SharedPrompts { group, runs: if policies > 1 { 2 } else { 1 }, prompt: 0 };
                    for learner in 0..policies {
                        let own: Vec<PoolSample> = pool.iter().filter(|s| s.agent == learner).cloned().collect();
                        for count in 1..=pool.len() {
                            let mut ways =
                                vec![(own.clone(), crate::rl::algorithm::contiguous_minibatches(own.len(), count))];
                            for order in [MinibatchOrder::SelfFirst, MinibatchOrder::Interleaved] {
                                if let Ok(cut) = minibatches(&pool, learner, count, order) {
                                    ways.push((pool.clone(), cut));
                                }
                            }
                            for (samples, cut) in ways {
                                for mb in &cut {
                                    for m in 1..=mb.len() {
                                        for micro in mb.chunks(m) {
                                            let distinct: HashSet<(usize, usize)> =
                                                micro.iter().map(|&j| (samples[j].agent, samples[j].group)).collect();
                                            assert!(
                                                distinct.len() <= shared.prompts_among(m),
                                                "{shared:?}, micro-batch {m}: {micro:?} holds {} prompts",
                                                distinct.len()
                                            );
                                            cuts += 1;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(cuts > 10_000, "{cuts}");
        // What the bound gives: a micro-batch of 8 over groups of 8 that starts mid-group spans
        // two prompts; one that joins the end of a learner's own samples to the start of another
        // policy's, each cut mid-group, four.
        let one = SharedPrompts { group: 8, runs: 1, prompt: 0 };
        assert_eq!([1, 8, 9, 10, 32].map(|m| one.prompts_among(m)), [1, 2, 2, 3, 5]);
        assert_eq!(SharedPrompts { runs: 2, ..one }.prompts_among(8), 4);
        assert_eq!(SharedPrompts::NONE.prompts_among(8), 8);
    }

    /// A micro-batch of a GRPO group runs its prompt once: the update's activations count the
    /// prompts the bound above allows and every response, not a prompt per response; what
    /// shares nothing (one sequence per micro-batch, one per prompt) counts as before.
    #[test]
    fn a_group_s_prompt_counts_once_in_the_update() {
        let shape = crate::model::zoo::find("qwen-1.5b").unwrap().model_config().unwrap();
        let activations = |w: &Workload| footprint(&shape, w, None, FrozenDtype::F32, Kernels::Generic).activations;
        let dense = Workload { micro_batch: 8, ..workload(640, false) };
        let shared = Workload { shared: SharedPrompts { group: 8, runs: 1, prompt: 512 }, ..dense };
        // Two prompts of 512 tokens and 8 responses of 128: 2,048 tokens instead of 5,120.
        let (d, s) = (activations(&dense), activations(&shared));
        assert!(s < d / 2, "{s} {d}");
        let responses = activations(&Workload { train_len: 128, ..dense });
        assert!(s > responses, "the responses attend to their prompt's keys: {s} {responses}");
        // (Two sequences over groups of two may be two prompts.)
        let pairs = Workload { micro_batch: 2, shared: SharedPrompts { group: 2, ..shared.shared }, ..shared };
        for alone in [Workload { micro_batch: 1, ..shared }, pairs] {
            assert_eq!(
                activations(&alone),
                activations(&Workload { shared: SharedPrompts::NONE, ..alone }),
                "{alone:?}"
            );
        }
        let recomputed = |w: Workload| activations(&Workload { checkpointing: true, ..w });
        assert!(recomputed(shared) < recomputed(dense) / 2);
        // The scoring pass of an offloaded reference shares the same way.
        let scoring = |w: &Workload| footprint(&shape, w, None, FrozenDtype::F32, Kernels::Generic).scoring;
        assert!(scoring(&shared) < scoring(&dense) / 2);
    }

    /// The KV cache grows to the prompt plus every new token and no further: the plan counts
    /// that capacity and, for the moment of the last growth, the buffer it grew from.
    #[test]
    fn the_rollout_counts_the_cache_up_to_the_longest_response_and_one_prompt_per_group_in_the_prefill() {
        let shape = crate::model::zoo::find("llama-8b").unwrap().model_config().unwrap();
        let w = Workload { rollout_sequences: 16, rollout_prompt: 1024, rollout_new: 4096, ..workload(1024, false) };
        let kv = 2 * (shape.num_key_value_heads * shape.head_dim * shape.num_hidden_layers) as u64 * 16 * 4;
        let f = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
        // One pass of the prefill: its rows' attention scores and probabilities and one layer's
        // hidden states; 8,192 tokens hold 8 prompts of 1,024.
        let (d, q, kvd, ffn) = (
            shape.hidden_size,
            shape.num_attention_heads * shape.head_dim,
            shape.num_key_value_heads * shape.head_dim,
            shape.intermediate_size,
        );
        let pass = |rows: u64| {
            rows * (shape.num_attention_heads as u64 * 1024 * 1024 * 2
                + 1024 * (4 * d + 2 * q + 2 * kvd + 3 * ffn) as u64)
                * 4
        };
        let sampling = 2 * 16 * shape.vocab_size as u64 * 4;
        // 1,536 slots grown to 5,120 (past a quarter of it, not doubled to 3,072 and 6,144):
        // both for a moment, or, for a shorter prompt, half the limit before it.
        assert_eq!(f.rollout, kv * (5120 + 2560) + sampling + pass(8));
        // Two prompts of a group of 8: the prefill runs each once.
        let group = SharedPrompts { group: 8, ..SharedPrompts::NONE };
        let grouped = footprint(&shape, &Workload { shared: group, ..w }, None, FrozenDtype::F32, Kernels::Generic);
        assert_eq!(grouped.rollout, kv * (5120 + 2560) + sampling + pass(2));
    }

    #[test]
    fn activations_grow_with_the_micro_batch_and_quadratically_with_length() {
        let shape = crate::model::zoo::find("qwen-1.5b").unwrap().model_config().unwrap();
        let w = workload(1024, true);
        let one = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic).activations as f64;
        let four = footprint(&shape, &Workload { micro_batch: 4, ..w }, None, FrozenDtype::F32, Kernels::Generic)
            .activations as f64;
        let long = footprint(&shape, &Workload { train_len: 4096, ..w }, None, FrozenDtype::F32, Kernels::Generic)
            .activations as f64;
        assert!(four > 3.5 * one && four < 4.0 * one, "{one} {four}");
        // 4× the tokens: the per-token part 4×, the attention part 16×.
        assert!(long > 5.0 * one && long < 16.0 * one, "{one} {long}");
        let no_ref = footprint(&shape, &Workload { reference: false, ..w }, None, FrozenDtype::F32, Kernels::Generic);
        assert_eq!(no_ref.reference, 0);
        // Checkpointing keeps each layer's input and one layer's activations: for 28 layers,
        // far less than all of them (the transient attention scores stay).
        let recomputed =
            footprint(&shape, &Workload { checkpointing: true, ..w }, None, FrozenDtype::F32, Kernels::Generic)
                .activations as f64;
        assert!(recomputed < one / 4.0, "{one} {recomputed}");
    }

    /// The CPU's fused kernels keep less than two thirds of what burn's generic ops keep, and the
    /// plan of SmolLM2-135M's dense train step (`hacpo bench --train-batch B --train-len T`)
    /// covers what it held, measured on a 2-core AMD EPYC (Zen 4, 2 threads): peak RSS less
    /// the 0.06 GB the process holds before a model is built, to within 10–30% above.
    #[test]
    fn the_cpu_plan_covers_smollm2_s_measured_train_steps() {
        let shape = crate::model::zoo::find("smollm2-135m").unwrap().model_config().unwrap();
        let measured =
            [(8, 128, 3.49), (8, 256, 5.04), (8, 512, 9.73), (16, 256, 8.53), (4, 1024, 11.87), (2, 2048, 17.03)];
        for (batch, len, gb) in measured {
            let w = Workload { micro_batch: batch, minibatch: batch, rollout_sequences: 1, ..workload(len, false) };
            let cpu = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::CpuFused);
            let held = (gb - 0.06) * 1e9;
            let planned = cpu.peak() as f64;
            assert!(planned > 1.1 * held && planned < 1.3 * held, "{batch} × {len}: {planned:.3e} for {held:.3e}");
            let generic = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
            assert!(2 * generic.activations > 3 * cpu.activations, "{batch} × {len}");
            // The fused attention holds one block of queries' scores in a prefill (beside the
            // weights packed for decoding, on a CPU with AVX2).
            let packed =
                Kernels::CpuFused.packs_rollout_copy(ComputeDtype::F32) as u64 * 4 * shape.num_parameters() as u64;
            assert!(cpu.rollout - packed < generic.rollout, "{batch} × {len}");
        }
    }

    /// The CPU plan of SmolLM2-135M's GRPO step (`scripts/rl_step_bench.py`'s config: 4 GSM8K
    /// prompts × 8, prompts up to 115 tokens, 256 new, no KL) covers the peak RSS of its second
    /// step (AdamW's moments alive), measured on a 2-core AMD EPYC (Zen 4, 2 threads) with each
    /// setting below, at most 45% above it.
    #[test]
    fn the_cpu_plan_covers_smollm2_s_measured_grpo_steps() {
        let base = r#"
            [algo]
            name = "grpo"
            group_size = 8
            prompts_per_step = 4
            minibatch_prompts = 4
            kl_coef = 0.0
            [rollout]
            max_new_tokens = 256
            max_prompt_tokens = 115
            max_response_tokens = 256
            batch_prompts = 4
            [task]
            kind = "math"
            [[policies]]
            name = "smollm2"
            model = "smollm2-135m"
        "#;
        let micro = |n: usize| format!("algo.micro_batch_sequences={n}");
        let lora = "[policies.lora]\nrank = 16";
        let measured = [
            (vec![micro(8)], "", 6.02),
            (vec![micro(32)], "", 15.69),
            (vec![micro(8), "algo.gradient_checkpointing=true".into()], "", 3.15),
            (vec![micro(8), "algo.kl_coef=0.01".into()], "", 6.50),
            (vec![micro(8), "algo.compute_dtype=\"bf16\"".into()], "", 6.56),
            (vec![micro(8)], lora, 4.30),
            (vec![micro(8)], &format!("frozen_dtype = \"bf16\"\n{lora}"), 4.53),
        ];
        for (settings, policy, gb) in measured {
            let cfg = TrainConfig::from_toml(&format!("{base}\n{policy}"), "grpo step", &settings).unwrap();
            let plan = MemoryPlan::of(&cfg, Some(100_000_000_000), &cfg.hosted("").unwrap()).unwrap();
            let planned = plan.devices[0].need as f64;
            assert!(planned > gb * 1e9 && planned < 1.45 * gb * 1e9, "{settings:?}: {planned:.3e} for {gb} GB");
        }
    }

    /// Gradient accumulation keeps the sum of a mini-batch's earlier micro-batches beside each
    /// pass's own gradients: a second copy, unless one micro-batch holds the mini-batch (an
    /// offloaded policy sums in host memory).
    #[test]
    fn micro_batches_that_accumulate_keep_the_sum_beside_a_pass_s_gradients() {
        let shape = crate::model::zoo::find("qwen-1.5b").unwrap().model_config().unwrap();
        let whole = Workload { micro_batch: 8, minibatch: 8, ..workload(1024, false) };
        let alone = footprint(&shape, &whole, None, FrozenDtype::F32, Kernels::Generic);
        assert_eq!(alone.summed, 0);
        for w in [
            Workload { minibatch: 32, ..whole },
            Workload { minibatch: 0, ..whole },
            Workload { micro_tokens: 8 * 1024, ..whole },
        ] {
            let f = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
            assert_eq!(f.summed, f.gradients, "{w:?}");
            assert_eq!(f.peak(), alone.peak() + f.gradients, "{w:?}");
            assert_eq!(f.offloaded().peak(), alone.offloaded().peak(), "{w:?}");
        }
        let lora = LoraConfig::default();
        let adapters =
            footprint(&shape, &Workload { minibatch: 32, ..whole }, Some(&lora), FrozenDtype::F32, Kernels::Generic);
        assert_eq!(adapters.summed, crate::model::lora::adapter_parameters(&shape, &lora) * 4);
        // A value model's sum is the value model's update's, on the device even offloaded.
        let valued = |w: Workload| {
            footprint(&shape, &Workload { value_model: true, ..w }, None, FrozenDtype::F32, Kernels::Generic)
        };
        let (one, several) = (valued(whole), valued(Workload { minibatch: 32, ..whole }));
        assert_eq!(several.summed, several.gradients);
        assert_eq!(several.critic_update, one.critic_update + several.gradients);
        assert_eq!(several.offloaded().peak(), one.offloaded().peak() + several.gradients);
    }

    /// A value model of its own (MAPPO with `shared_trunk = false`) holds a second copy of the
    /// trained weights with their moments, and its gradients and activations in an update.
    #[test]
    fn a_value_model_of_its_own_adds_its_weights_moments_and_update() {
        let shape = crate::model::zoo::find("qwen-1.5b").unwrap().model_config().unwrap();
        let plain = footprint(&shape, &workload(1024, false), None, FrozenDtype::F32, Kernels::Generic);
        let valued = footprint(
            &shape,
            &Workload { value_model: true, ..workload(1024, false) },
            None,
            FrozenDtype::F32,
            Kernels::Generic,
        );
        assert_eq!((plain.critic, plain.critic_update), (0, 0));
        assert_eq!(valued.critic, 3 * plain.gradients);
        assert_eq!(valued.persistent(), plain.persistent() + 3 * plain.gradients);
        assert!(valued.critic_update > plain.gradients && valued.peak() > plain.peak() + valued.critic);
    }

    #[test]
    fn lora_keeps_gradients_and_moments_of_the_adapters_only_and_no_reference_copy() {
        let shape = crate::model::zoo::find("llama-8b").unwrap().model_config().unwrap();
        let lora = LoraConfig::default();
        let full = footprint(&shape, &workload(1024, true), None, FrozenDtype::F32, Kernels::Generic);
        let f = footprint(&shape, &workload(1024, true), Some(&lora), FrozenDtype::F32, Kernels::Generic);
        let adapter = crate::model::lora::adapter_parameters(&shape, &lora) * 4;
        // Rank 16 on all seven projections of 32 layers: 16 × 81,920 × 32 = 41.9M parameters.
        assert_eq!(adapter, 41_943_040 * 4);
        assert_eq!(f.weights, full.weights + adapter);
        assert_eq!((f.reference, f.gradients, f.optimizer), (0, adapter, 2 * adapter));
        // Each adapter keeps its input's product with A: 7 × rank floats a token and layer.
        assert_eq!((f.activations - full.activations, f.rollout), (1024 * 32 * 7 * 16 * 4, full.rollout));
        // A bf16 base: half the base's bytes, the adapters still f32.
        let half = footprint(&shape, &workload(1024, true), Some(&lora), FrozenDtype::Bf16, Kernels::Generic);
        assert_eq!(half.weights, full.weights / 2 + adapter);
        let reference = footprint(&shape, &workload(1024, true), None, FrozenDtype::Bf16, Kernels::Generic);
        assert_eq!((reference.weights, reference.reference), (full.weights, full.weights / 2));
    }

    #[test]
    fn half_precision_compute_adds_the_weights_copy_in_that_dtype_unless_the_base_is_stored_so() {
        let shape = crate::model::zoo::find("qwen-1.5b").unwrap().model_config().unwrap();
        let params = shape.num_parameters() as u64;
        let f32 = footprint(&shape, &workload(1024, true), None, FrozenDtype::F32, Kernels::Generic);
        let w = Workload { compute: ComputeDtype::Bf16, ..workload(1024, true) };
        let bf16 = footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic);
        assert_eq!(bf16.activations, f32.activations + 2 * params);
        // The copy, and the KV cache at half its bytes: 16 sequences × 1,024 slots, keys and
        // values of every layer.
        let kv = (shape.num_key_value_heads * shape.head_dim * shape.num_hidden_layers) as u64;
        let f32_cache = 2 * kv * 16 * 1024 * 4;
        assert_eq!(bf16.rollout, f32.rollout - f32_cache / 2 + 2 * params);
        // The KL reference is kept as the forward reads it, in bf16.
        assert_eq!(bf16.reference, f32.reference / 2);
        // A LoRA base stored in bf16 is what bf16 matmuls read: no copy.
        let lora = LoraConfig::default();
        let stored = footprint(&shape, &w, Some(&lora), FrozenDtype::Bf16, Kernels::Generic);
        let f32_lora = footprint(&shape, &workload(1024, true), Some(&lora), FrozenDtype::Bf16, Kernels::Generic);
        assert_eq!(stored.rollout, f32_lora.rollout - f32_cache / 2);
        // f32 matmuls over a bf16 base: the update keeps the weights cast to f32.
        assert_eq!(stored.activations + 4 * params, f32_lora.activations);
        // The update casts the weights once a micro-batch, however many passes it runs (a
        // micro-batch of 8 over one prompt's group of 8 runs two prompts' passes, the group may
        // begin inside it, and their responses').
        let grouped = Workload {
            micro_batch: 8,
            shared: SharedPrompts { group: 8, runs: 1, prompt: 512 },
            ..workload(1024, true)
        };
        let plain = footprint(&shape, &grouped, None, FrozenDtype::F32, Kernels::Generic);
        let cast = Workload { compute: ComputeDtype::Bf16, ..grouped };
        let cast = footprint(&shape, &cast, None, FrozenDtype::F32, Kernels::Generic);
        assert_eq!(cast.activations, plain.activations + 2 * params);
        // f16: the copy, but attention and its cache stay f32.
        let other = footprint(
            &shape,
            &Workload { compute: ComputeDtype::F16, ..w },
            Some(&lora),
            FrozenDtype::Bf16,
            Kernels::Generic,
        );
        assert_eq!(other.rollout, f32_lora.rollout + 2 * params);
        // The CPU's kernels keep the copy packed beside it: bf16 with AVX512-BF16, and f32 (the
        // policy's own weights otherwise) with AVX2.
        let cpu = |w: &Workload| footprint(&shape, w, None, FrozenDtype::F32, Kernels::CpuFused).rollout;
        let packs = |dtype| Kernels::CpuFused.packs_rollout_copy(dtype) as u64;
        let (packed_bf16, packed_f32) = (packs(ComputeDtype::Bf16) * 2 * params, packs(ComputeDtype::F32) * 4 * params);
        let cpu_f16 = Workload { compute: ComputeDtype::F16, ..w };
        let cpu_f32 = cpu(&workload(1024, true)) - packed_f32;
        assert_eq!(cpu(&w), cpu_f32 - f32_cache / 2 + 2 * params + packed_bf16);
        assert_eq!(cpu(&cpu_f16), cpu_f32 + 2 * params, "f16 is not packed");
        assert!(!Kernels::Generic.packs_rollout_copy(ComputeDtype::F32), "a GPU packs nothing");
    }

    #[test]
    fn sizes_read_decimal_and_binary_units_and_refuse_the_rest() {
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("80g").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5TB").unwrap(), 1_500_000_000_000);
        for bad in ["80", "GB", "80 XB", "-1GB", "0GB", ""] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(err.contains("80GB"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_plan_that_does_not_fit_names_the_agent_the_numbers_and_the_ways_out() {
        let mut cfg = TrainConfig::from_toml("", "test", &[]).unwrap();
        cfg.policies = vec![crate::config::PolicyConfig {
            device: "cuda:0".into(),
            ..crate::config::PolicyConfig::new("llama-8b")
        }];
        let plan = MemoryPlan::of(&cfg, Some(80_000_000_000), &cfg.hosted("").unwrap()).unwrap();
        assert_eq!(plan.devices.len(), 1);
        assert!(!plan.devices[0].fits());
        let err = plan.check(&cfg).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let msg = err.to_string();
        for part in [
            "cuda:0",
            "llama-8b",
            "80.0 GB (--device-memory)",
            "micro_batch_sequences=1",
            "kl_coef=0",
            "LoRA adapters for agent0-llama-8b",
            "gradient_checkpointing=true",
            "--skip-memory-check",
        ] {
            assert!(msg.contains(part), "{part} missing from:\n{msg}");
        }
        let shown = plan.to_string();
        assert!(shown.contains("DOES NOT FIT") && shown.contains("8.03B"), "{shown}");
    }

    /// qwen-1.5b with LoRA adapters on one GPU, no KL term.
    fn qwen_lora_on_one_gpu() -> TrainConfig {
        let mut cfg = TrainConfig::from_toml("", "test", &[]).unwrap();
        cfg.policies = vec![crate::config::PolicyConfig {
            device: "cuda:0".into(),
            lora: Some(LoraConfig::default()),
            ..crate::config::PolicyConfig::new("qwen-1.5b")
        }];
        cfg.algo.kl_coef = 0.0;
        cfg
    }

    /// `fitted` prefers a smaller micro-batch to recomputation, takes recomputation where the
    /// micro-batch alone is not enough, and keeps the largest micro-batch that fits.
    #[test]
    fn fitting_halves_the_micro_batch_then_adds_recomputation() {
        let cfg = qwen_lora_on_one_gpu();
        let need = |mb: usize, ckpt: bool| {
            let mut c = cfg.clone();
            (c.algo.micro_batch_sequences, c.algo.gradient_checkpointing) = (mb, ckpt);
            MemoryPlan::of(&c, Some(1), &[true]).unwrap().devices[0].need
        };
        let hosted = [true];
        let micro = cfg.algo.micro_batch_sequences;
        assert!(micro >= 4 && need(1, true) < need(1, false));
        // Between micro-batch 1 without and with recomputation: recomputation, and the largest
        // micro-batch that fits with it.
        let have = (need(1, true) + need(1, false)) / 2;
        let fit = |have: u64| MemoryPlan::of(&cfg, Some(have), &hosted).unwrap().fitted(&cfg);
        let (fitted, plan, why) = fit(have).unwrap();
        assert!(plan.fits() && plan.workload.checkpointing, "{why}");
        assert!(fitted.algo.gradient_checkpointing, "{why}");
        let mb = fitted.algo.micro_batch_sequences;
        assert!(need(mb, true) <= have && (mb == micro || need(mb * 2, true) > have), "{mb}: {why}");
        assert!(why.contains("activations recomputed"), "{why}");
        // Just above micro-batch 2 without recomputation: micro-batch 2, no recomputation.
        let (fitted, _, why) = fit(need(2, false)).unwrap();
        assert_eq!((fitted.algo.micro_batch_sequences, fitted.algo.gradient_checkpointing), (2, false), "{why}");
        // Fits as it is, or cannot fit at all (below micro-batch 1 with recomputation, one
        // prompt per rollout batch and the adapters' moments in host memory): nothing chosen.
        assert!(fit(need(micro, false)).is_none());
        let mut leanest = cfg.clone();
        (leanest.algo.micro_batch_sequences, leanest.algo.gradient_checkpointing) = (1, true);
        leanest.rollout.batch_prompts = 1;
        let resident = MemoryPlan::of(&leanest, Some(1), &hosted).unwrap().devices[0].need;
        leanest.policies[0].offload = true;
        let offloaded = MemoryPlan::of(&leanest, Some(1), &hosted).unwrap().devices[0].need;
        assert!(offloaded < resident);
        let (fitted, _, why) = fit(resident - 1).unwrap();
        assert!(fitted.policies[0].offload && why.contains("offload = true for agent0-qwen-1.5b"), "{why}");
        assert!(fit(offloaded - 1).is_none());
    }

    /// When the rollout is the phase that does not fit, `fitted` samples fewer prompts at a
    /// time, the largest number that fits, and leaves the update as it is.
    #[test]
    fn fitting_samples_fewer_prompts_at_a_time_when_the_rollout_does_not_fit() {
        let mut cfg = qwen_lora_on_one_gpu();
        (cfg.algo.micro_batch_sequences, cfg.algo.gradient_checkpointing) = (2, true);
        cfg.rollout.batch_prompts = 64;
        let plan = |c: &TrainConfig, have: u64| MemoryPlan::of(c, Some(have), &[true]).unwrap();
        let f = plan(&cfg, 1).policies[0].footprint;
        let update = f.gradients + f.activations;
        assert!(f.rollout > 4 * update, "the rollout is the larger phase: {f:?}");
        let have = f.persistent() + update.max(f.rollout / 3);
        let (fitted, fitted_plan, why) = plan(&cfg, have).fitted(&cfg).unwrap();
        let prompts = fitted.rollout.batch_prompts;
        assert!(fitted_plan.fits() && (1..64).contains(&prompts), "{why}");
        assert_eq!((fitted.algo.micro_batch_sequences, fitted.algo.gradient_checkpointing), (2, true), "{why}");
        assert!(why.contains(&format!("chose rollout.batch_prompts = {prompts} (was 64)")), "{why}");
        assert!(why.contains("prompts sampled in smaller batches"), "{why}");
        let mut twice = cfg.clone();
        twice.rollout.batch_prompts = 2 * prompts;
        assert!(!plan(&twice, have).fits(), "{prompts} is the largest that fits");
    }

    fn full_fine_tunes(models: &[&str], devices: &[&str]) -> TrainConfig {
        let mut cfg = TrainConfig::from_toml("", "test", &[]).unwrap();
        cfg.policies = models
            .iter()
            .zip(devices)
            .map(|(m, d)| crate::config::PolicyConfig { device: d.to_string(), ..crate::config::PolicyConfig::new(*m) })
            .collect();
        cfg
    }

    /// The headline pair with no preset on two 80 GB GPUs, fully fine-tuned in f32: qwen-1.5b
    /// fits with batch sizes hacpo chooses itself; llama-8b's weights, reference, gradients and
    /// moments (160.6 GB) fit no batch size, so its state waits in host memory as well, and
    /// only its.
    #[test]
    fn the_headline_pair_fits_two_80_gb_gpus_with_llama_8b_offloaded() {
        let cfg = full_fine_tunes(&["qwen-1.5b", "llama-8b"], &["cuda:0", "cuda:1"]);
        let plan = MemoryPlan::of(&cfg, Some(80_000_000_000), &[true, true]).unwrap();
        assert!(!plan.fits());
        let (fitted, fitted_plan, why) = plan.fitted(&cfg).unwrap();
        assert!(fitted_plan.fits(), "{fitted_plan}");
        assert_eq!((fitted.policies[0].offload, fitted.policies[1].offload), (false, true), "{why}");
        assert!(fitted.algo.gradient_checkpointing && fitted.algo.micro_batch_sequences == 1, "{why}");
        assert!(why.contains("offload = true for agent1-llama-8b") && why.contains("host memory"), "{why}");
        let llama = &fitted_plan.policies[1].footprint;
        assert!(llama.offloaded && llama.peak() <= 80_000_000_000 && llama.peak() > 60_000_000_000, "{llama:?}");
        // Its reference, gradients and moments: 32.1 + 32.1 + 64.2 GB.
        assert_eq!(gb(llama.host()), "128.5 GB");
        assert!(fitted_plan.to_string().contains("offloaded (agent1-llama-8b): 128.5 GB"), "{fitted_plan}");
    }

    /// A machine whose memory cannot hold what offloading would put there: nothing is chosen,
    /// and the error says how much host memory it would take; an offloaded plan that does not
    /// fit the host is refused with the numbers.
    #[test]
    fn offloading_needs_the_host_memory_to_hold_the_state() {
        let cfg = full_fine_tunes(&["qwen-1.5b", "llama-8b"], &["cuda:0", "cuda:1"]);
        let mut plan = MemoryPlan::of(&cfg, Some(80_000_000_000), &[true, true]).unwrap();
        plan.host = Capacity::Available(100_000_000_000);
        assert!(plan.fitted(&cfg).is_none(), "128.5 GB of state does not fit 100 GB of RAM");
        let err = plan.check(&cfg).unwrap_err().to_string();
        let llama = &err[err.find("does not fit cuda:1").expect(&err)..];
        assert!(
            llama.contains("and 128.5 GB of host memory, more than this machine's 100.0 GB available RAM"),
            "{err}"
        );
        assert!(!llama.contains("which fits"), "{err}");

        let mut offloaded = cfg.clone();
        offloaded.policies[1].offload = true;
        let mut plan = MemoryPlan::of(&offloaded, Some(4_000_000_000_000), &[true, true]).unwrap();
        assert!(plan.fits() && plan.offloaded() > 128_000_000_000);
        plan.host = Capacity::Available(100_000_000_000);
        let err = plan.check(&offloaded).unwrap_err().to_string();
        assert!(err.contains("the offloaded state of agent1-llama-8b"), "{err}");
        assert!(err.contains("needs 128.5 GB of host memory") && err.contains("100.0 GB available RAM"), "{err}");
        assert!(!err.contains("does not fit cuda"), "the GPUs fit: {err}");
    }

    /// Where offloading is not enough (one 40 GB GPU) or saves nothing (the CPU, whose host is
    /// its device), the error says what the state alone needs and what would fit.
    #[test]
    fn a_device_whose_state_alone_does_not_fit_says_so() {
        let cfg = full_fine_tunes(&["llama-8b"], &["cuda:0"]);
        let plan = MemoryPlan::of(&cfg, Some(40_000_000_000), &[true]).unwrap();
        assert!(plan.fitted(&cfg).is_none());
        let err = plan.check(&cfg).unwrap_err().to_string();
        assert!(err.contains("Its weights, reference, gradients and AdamW moments alone need 160.6 GB"), "{err}");
        assert!(err.contains("with the last three in host memory (offload = true"), "{err}");
        assert!(!err.contains("which fits"), "{err}");
        assert!(err.contains("LoRA adapters for agent0-llama-8b") && err.contains("--offload"), "{err}");

        let cfg = full_fine_tunes(&["llama-8b"], &["cpu"]);
        let plan = MemoryPlan::of(&cfg, Some(80_000_000_000), &[true]).unwrap();
        assert!(plan.fitted(&cfg).is_none());
        let err = plan.check(&cfg).unwrap_err().to_string();
        assert!(err.contains("alone need 160.6 GB: no batch size makes them fit"), "{err}");
        assert!(!err.contains("offload"), "nothing to gain on the CPU: {err}");
    }

    #[test]
    fn the_embedded_default_fits_in_12_gb() {
        let cfg = TrainConfig::from_toml(crate::config::EMBEDDED_DEFAULT, "default", &[]).unwrap();
        let plan = MemoryPlan::of(&cfg, Some(12_000_000_000), &cfg.hosted("").unwrap()).unwrap();
        plan.check(&cfg).unwrap();
        assert_eq!(plan.devices.len(), 1, "both tiny agents on the CPU");
        assert_eq!(plan.devices[0].policies.len(), 2);
    }

    /// GSPO×2 samples twice the group: its rollout is planned as GSPO's with a group twice as
    /// large, and a group's prompt runs once over twice the sequences.
    #[test]
    fn the_rollout_counts_the_group_the_algorithm_samples() {
        let mut cfg = TrainConfig::from_toml(crate::config::EMBEDDED_DEFAULT, "default", &[]).unwrap();
        (cfg.algo.group_size, cfg.algo.minibatch_prompts, cfg.rollout.batch_prompts) = (4, 2, 3);
        let workload = |name: &str, group: usize| {
            let mut c = cfg.clone();
            (c.algo.name, c.algo.group_size) = (name.into(), group);
            Workload::of(&c).unwrap()
        };
        let (doubled, twice) = (workload("gspo2x", 4), workload("gspo", 8));
        assert_eq!((doubled.group_size, doubled.rollout_sequences, doubled.shared.group), (8, 24, 8));
        // GSPO×2 halves the mini-batch's prompts, whose groups are twice as large.
        assert_eq!((doubled.minibatch, twice.minibatch), (8, 16));
        assert_eq!(doubled, Workload { minibatch: 8, ..twice });
        assert_eq!(workload("gspo", 4).rollout_sequences, 12);
    }

    /// A token budget of m sequences' tokens plans the activations of m whole sequences of the
    /// longest length (sharing prompts or not: a response's copy of its prompt counts in the
    /// budget as a token would), a budget below one sequence plans one sequence, and a budget
    /// below the run's longest sequence is refused with the least that holds it.
    #[test]
    fn a_token_budget_plans_its_tokens_whatever_the_lengths() {
        let shape = crate::model::zoo::find("qwen-1.5b").unwrap().model_config().unwrap();
        let activations = |w: Workload| footprint(&shape, &w, None, FrozenDtype::F32, Kernels::Generic).activations;
        let w = workload(1024, true);
        let rows = |m: usize| activations(Workload { micro_batch: m, ..w });
        let budget = |tokens: usize| activations(Workload { micro_tokens: tokens, ..w });
        assert_eq!(budget(4 * 1024), rows(4));
        assert_eq!(budget(100), rows(1));
        assert!(budget(3 * 1024) > rows(2) && budget(3 * 1024) < rows(4));
        let group = SharedPrompts { group: 8, runs: 1, prompt: 512 };
        let shared = |m: usize, tokens: usize| {
            activations(Workload { micro_batch: m, micro_tokens: tokens, shared: group, ..w })
        };
        assert!(shared(4, 0) < rows(4) && shared(4, 4 * 1024) == rows(4));
        let mut cfg = TrainConfig::from_toml(crate::config::EMBEDDED_DEFAULT, "default", &[]).unwrap();
        let longest = Workload::of(&cfg).unwrap().train_len;
        cfg.algo.micro_batch_tokens = longest;
        assert_eq!(Workload::of(&cfg).unwrap().micro_tokens, longest);
        cfg.algo.micro_batch_tokens = 8;
        let err = Workload::of(&cfg).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "algo.micro_batch_tokens: 8 is below this run's longest sequence (up to {longest} tokens"
            )),
            "{err}"
        );
        assert!(err.contains(&format!("set {longest} or more, or 0")), "{err}");
    }

    /// Under a token budget the fit takes the largest budget that fits to within an eighth,
    /// down to one sequence's tokens, and says so; the ways out name the budget of one sequence.
    #[test]
    fn fitting_shrinks_a_token_budget() {
        let mut cfg = qwen_lora_on_one_gpu();
        let longest = Workload::of(&cfg).unwrap().train_len;
        cfg.algo.micro_batch_tokens = 8 * longest;
        let need = |tokens: usize, ckpt: bool| {
            let mut c = cfg.clone();
            (c.algo.micro_batch_tokens, c.algo.gradient_checkpointing) = (tokens, ckpt);
            MemoryPlan::of(&c, Some(1), &[true]).unwrap().devices[0].need
        };
        let fit = |have: u64| MemoryPlan::of(&cfg, Some(have), &[true]).unwrap().fitted(&cfg);
        let have = need(2 * longest, false);
        let (fitted, plan, why) = fit(have).unwrap();
        let budget = fitted.algo.micro_batch_tokens;
        assert!(plan.fits() && !fitted.algo.gradient_checkpointing, "{why}");
        assert!(budget <= 2 * longest && budget * 8 >= 2 * longest * 7 - 8 * 64, "{budget}: {why}");
        assert!(need(budget, false) <= have && budget % 64 == 0, "{budget}: {why}");
        assert_eq!(fitted.algo.micro_batch_sequences, cfg.algo.micro_batch_sequences);
        assert!(why.contains(&format!("chose algo.micro_batch_tokens = {budget} (was {})", 8 * longest)), "{why}");
        // Where no budget fits without recomputation: recomputation, and a budget that fits.
        let have = need(longest, true);
        assert!(need(longest, false) > have);
        let (fitted, _, why) = fit(have).unwrap();
        let budget = fitted.algo.micro_batch_tokens;
        assert!(fitted.algo.gradient_checkpointing && need(budget, true) <= have, "{why}");
        let err = MemoryPlan::of(&cfg, Some(need(longest, true) / 2), &[true]).unwrap().check(&cfg).unwrap_err();
        assert!(err.to_string().contains(&format!("--set algo.micro_batch_tokens={longest}")), "{err}");
    }
}
