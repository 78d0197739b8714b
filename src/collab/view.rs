//! A learner's view of a rollout: the token ids its own model scores (ALGORITHMS.md §2.6).
//!
//! Own rollouts reuse their exact ids. Another agent's rollout is re-rendered: the learner's
//! chat template over the same messages (prompt, keeping the last `cross_max_prompt_tokens`),
//! and the response text re-encoded without special tokens (keeping the first
//! `max_response_tokens`); an empty response (EOS only at the source) becomes the learner's
//! EOS. Prompts are rendered once per learner and prompt, not once per response.

use std::collections::HashMap;

use burn::tensor::backend::Backend;

use super::agent::Agent;
use super::rollout::Rollout;
use crate::error::{Error, Result};

/// Token ids of one rollout in the learner's tokenizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

/// Builds the learner's views of `rollouts` (in order).
pub fn views<B: Backend>(
    learner: &Agent<B>,
    rollouts: &[Rollout],
    cross_max_prompt_tokens: usize,
    max_response_tokens: usize,
) -> Result<Vec<View>> {
    let mut prompts: HashMap<usize, Vec<u32>> = HashMap::new();
    let mut out = Vec::with_capacity(rollouts.len());
    for r in rollouts {
        if r.agent == learner.index {
            out.push(View { prompt_ids: r.prompt_ids.clone(), response_ids: r.response_ids.clone() });
            continue;
        }
        let prompt_ids = match prompts.get(&r.prompt_index) {
            Some(p) => p.clone(),
            None => {
                let p = learner.encode_prompt(&r.messages, cross_max_prompt_tokens)?;
                prompts.insert(r.prompt_index, p.clone());
                p
            }
        };
        let mut response_ids =
            if r.text.is_empty() { vec![learner.eos()?] } else { learner.tokenizer.encode(&r.text, false)? };
        if response_ids.is_empty() {
            return Err(Error::Internal(format!(
                "agent {}'s response {:?} encodes to no tokens for agent {}",
                r.agent, r.text, learner.name
            )));
        }
        response_ids.truncate(max_response_tokens.max(1));
        out.push(View { prompt_ids, response_ids });
    }
    Ok(out)
}
