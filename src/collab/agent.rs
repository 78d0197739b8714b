//! One agent of a collaborative run: its trainable model, frozen reference, tokenizer and
//! chat template, optimizer and device.

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::model::{CausalLm, Pretrained};
use crate::tokenizer::{Message, Tokenizer};
use crate::train::optim::{AdamW, AdamWConfig};

/// An agent: everything one heterogeneous policy needs to sample and learn.
pub struct Agent<B: Backend> {
    pub index: usize,
    /// Name in metrics and logs.
    pub name: String,
    /// What `--model` said (zoo id or path), for reloading the reference on resume.
    pub spec: String,
    pub device: B::Device,
    /// The trainable policy (f32 master weights).
    pub model: CausalLm<Autodiff<B>>,
    /// The frozen initial policy for the KL term (`None` when the KL coefficient is 0).
    pub reference: Option<CausalLm<B>>,
    pub tokenizer: Tokenizer,
    pub eos_token_ids: Vec<u32>,
    /// Extra chat-template variables.
    pub chat_kwargs: Map<String, Value>,
    pub optimizer: AdamW<B>,
    /// Completed updates of the policy (rollouts carry the version they were sampled with).
    pub policy_version: u64,
}

impl<B: Backend> Agent<B> {
    /// Builds an agent from a loaded trainable model and its initial weights for the KL
    /// reference.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: usize,
        name: String,
        spec: String,
        device: B::Device,
        pretrained: Pretrained<Autodiff<B>>,
        reference: Option<CausalLm<B>>,
        chat_kwargs: Map<String, Value>,
        optimizer: AdamWConfig,
    ) -> Self {
        Agent {
            index,
            name,
            spec,
            device,
            model: pretrained.model,
            reference,
            tokenizer: pretrained.tokenizer,
            eos_token_ids: pretrained.eos_token_ids,
            chat_kwargs,
            optimizer: AdamW::new(optimizer),
            policy_version: 0,
        }
    }

    /// The policy without autodiff, for sampling and scoring (shares the weights).
    pub fn inference_model(&self) -> CausalLm<B> {
        self.model.valid()
    }

    /// The prompt ids of `messages` in this agent's chat template (plain text when the
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
            return Err(Error::InvalidArgument(format!("agent {}: a prompt encodes to no tokens", self.name)));
        }
        Ok(ids)
    }

    /// The first end-of-sequence id (the single target of a terminal-only response).
    pub fn eos(&self) -> Result<u32> {
        self.eos_token_ids.first().copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "agent {}: the model declares no end-of-sequence token (eos_token_id in config.json or generation_config.json)",
                self.name
            ))
        })
    }
}
