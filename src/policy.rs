//! A policy: one trainable model with everything it needs to sample and learn (frozen
//! reference, tokenizer and chat template, optimizer, device). Which roles it plays and which
//! samples it learns from are the workload's and the algorithm's business, not its own.

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::model::lora::LoraConfig;
use crate::model::offload::HostModel;
use crate::model::{CausalLm, Pretrained};
use crate::tokenizer::{Message, Tokenizer};
use crate::train::optim::{AdamW, AdamWConfig};

/// Where the KL reference waits between scoring passes.
pub enum Reference<B: Backend> {
    /// On the policy's device, as sampling reads it.
    Device(CausalLm<B>),
    /// In host memory as stored, copied to the device for each scoring pass (`[[agents]]
    /// offload`).
    Host(HostModel<B>),
}

/// One trainable policy of a run.
pub struct Policy<B: Backend> {
    pub index: usize,
    /// Name in metrics, logs and `[[roles]]`.
    pub name: String,
    /// What the config said (zoo id or path), for reloading the reference on resume.
    pub spec: String,
    pub device: B::Device,
    /// The trainable model (f32 master weights).
    pub model: CausalLm<Autodiff<B>>,
    /// The frozen initial model for the KL term (`None` when the KL coefficient is 0, and
    /// with LoRA, whose reference is the base under the adapters: see [`Policy::reference_model`]).
    pub reference: Option<Reference<B>>,
    /// The adapters' settings when the policy trains LoRA adapters on a frozen base.
    pub lora: Option<LoraConfig>,
    pub tokenizer: Tokenizer,
    pub eos_token_ids: Vec<u32>,
    /// Extra chat-template variables.
    pub chat_kwargs: Map<String, Value>,
    pub optimizer: AdamW<B>,
    /// The critic (actor-critic algorithms only).
    pub critic: Option<crate::train::critic::Critic<B>>,
    /// Completed updates (samples carry the version they were drawn with).
    pub version: u64,
}

impl<B: Backend> Policy<B> {
    /// A policy from a loaded trainable model and, when a KL term is on, its reference.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: usize,
        name: String,
        spec: String,
        device: B::Device,
        pretrained: Pretrained<Autodiff<B>>,
        reference: Option<Reference<B>>,
        chat_kwargs: Map<String, Value>,
        optimizer: AdamWConfig,
    ) -> Self {
        Policy {
            index,
            name,
            spec,
            device,
            model: pretrained.model,
            reference,
            lora: None,
            tokenizer: pretrained.tokenizer,
            eos_token_ids: pretrained.eos_token_ids,
            chat_kwargs,
            optimizer: AdamW::new(optimizer),
            critic: None,
            version: 0,
        }
    }

    /// The model without autodiff, for sampling and scoring: it shares the weights, or with a
    /// half-precision `algo.compute_dtype` is their copy in that dtype, packed for the CPU's
    /// panel products where they run ([`crate::model::precision::rollout_copy`]).
    pub fn inference_model(&self) -> CausalLm<B> {
        crate::model::precision::rollout_copy(self.model.valid())
    }

    /// The f32 master weights without autodiff (what checkpoints save; shares the weights).
    pub fn master_model(&self) -> CausalLm<B> {
        self.model.valid()
    }

    /// The frozen model the KL term compares with: the loaded reference, or with LoRA the base
    /// without its adapters (the same weights, not a copy).
    pub fn reference_model(&self) -> Option<CausalLm<B>> {
        match (&self.lora, &self.reference) {
            (Some(_), _) => {
                Some(crate::model::lora::strip(crate::model::precision::lora_reference_copy(self.model.valid())))
            }
            (None, Some(Reference::Device(model))) => Some(model.clone()),
            // Copied to the device for this use; the caller drops it after.
            (None, Some(Reference::Host(host))) => Some(crate::model::precision::reference_copy(host.upload())),
            (None, None) => None,
        }
    }

    /// The prompt ids of `messages` in this policy's chat template (plain text when the
    /// tokenizer has none), keeping the last `max_tokens`.
    pub fn encode_prompt(&self, messages: &[Message], max_tokens: usize) -> Result<Vec<u32>> {
        let mut ids = if self.tokenizer.chat_template().is_some() {
            let text = self.tokenizer.apply_chat_template(messages, true, &self.chat_kwargs)?;
            self.tokenizer.encode(&text, false)?
        } else {
            let text: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
            self.tokenizer.encode(&text.join("\n"), true)?
        };
        if ids.len() > max_tokens {
            ids.drain(..ids.len() - max_tokens);
        }
        if ids.is_empty() {
            return Err(Error::InvalidArgument(format!("policy {}: a prompt encodes to no tokens", self.name)));
        }
        Ok(ids)
    }

    /// The first end-of-sequence id (the single target of a terminal-only response).
    pub fn eos(&self) -> Result<u32> {
        self.eos_token_ids.first().copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "policy {}: the model declares no end-of-sequence token (eos_token_id in config.json or generation_config.json)",
                self.name
            ))
        })
    }
}

/// The policy of index `k` among `policies`, the ones this process holds (every policy of the
/// run, but in a cluster run its host's): a workload that needs one it does not hold says so.
pub fn held<B: Backend>(policies: &[Policy<B>], k: usize) -> Result<&Policy<B>> {
    policies.iter().find(|p| p.index == k).ok_or_else(|| {
        Error::Internal(format!("policy {k} is not held by this process: its host samples and trains it"))
    })
}

/// Runs `work` on each item (one per policy: the policy's index and the item) in its own
/// scoped thread, on that policy's device stream ([`crate::backend::on_lane`]), so a policy
/// keeps its stream (and memory pool) whichever policies a stage runs; results in order. A
/// panicking thread becomes an internal error naming the stage.
pub fn per_policy<T: Send, R: Send>(
    items: impl IntoIterator<Item = (usize, T)>,
    stage: &str,
    work: impl Fn(T) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    let work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> =
            items.into_iter().map(|(k, item)| s.spawn(move || crate::backend::on_lane(k, || work(item)))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal(format!("a policy's {stage} thread panicked")))))
            .collect()
    })
}
