//! The routing stage: which samples each policy learns from, their advantages, and the token
//! ids the learner scores them with (retokenisation, docs/algorithms.md §2.6).
//!
//! Own samples reuse their exact ids. Another policy's sample is re-rendered: the learner's
//! chat template over the same messages (prompt, keeping the last `cross_max_prompt_tokens`),
//! and the response text re-encoded without special tokens (keeping the first
//! `max_response_tokens`); an empty response (EOS only at the source) becomes the learner's
//! EOS. Prompts are rendered once per learner and group, not once per response.

use std::collections::HashMap;

use burn::tensor::backend::Backend;

use crate::error::{Error, Result};
use crate::policy::Policy;
use crate::rl::{PoolSample, Routing};
use crate::sample::{GroupKey, Sample};

/// Token ids of one sample in the learner's tokenizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    /// The sample's loss mask ([`Sample::loss_mask`]): empty when every token is trained.
    pub loss_mask: Vec<bool>,
}

impl View {
    /// The response tokens in the loss.
    pub fn trained_tokens(&self) -> usize {
        if self.loss_mask.is_empty() { self.response_ids.len() } else { self.loss_mask.iter().filter(|&&m| m).count() }
    }
}

/// The samples a policy learns from, in step order, as the algorithm sees them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routed {
    /// Indices into the step's samples.
    pub indices: Vec<usize>,
    /// Source policy, group (numbered in order of first appearance) and reward of each.
    pub pool: Vec<PoolSample>,
}

/// The samples `learner` learns from under `routing`: its own, or every trainable sample of
/// the groups it answered.
pub fn route(samples: &[Sample], learner: usize, routing: Routing) -> Routed {
    let in_play: std::collections::HashSet<&GroupKey> =
        samples.iter().filter(|s| s.policy == learner).map(|s| &s.group).collect();
    let take = |s: &Sample| {
        s.train
            && match routing {
                Routing::Own => s.policy == learner,
                Routing::Shared => in_play.contains(&s.group),
            }
    };
    let mut numbers: HashMap<&GroupKey, usize> = HashMap::new();
    let mut out = Routed::default();
    for (i, s) in samples.iter().enumerate().filter(|(_, s)| take(s)) {
        let next = numbers.len();
        let group = *numbers.entry(&s.group).or_insert(next);
        out.indices.push(i);
        out.pool.push(PoolSample { agent: s.policy, group, reward: s.reward() });
    }
    out
}

/// The learner's views of `samples[indices]` (in order).
pub fn views<B: Backend>(
    learner: &Policy<B>,
    samples: &[Sample],
    indices: &[usize],
    cross_max_prompt_tokens: usize,
    max_response_tokens: usize,
) -> Result<Vec<View>> {
    let mut prompts: HashMap<&GroupKey, Vec<u32>> = HashMap::new();
    let mut out = Vec::with_capacity(indices.len());
    for &i in indices {
        let s = &samples[i];
        if s.policy == learner.index {
            if !s.loss_mask.is_empty() && s.loss_mask.len() != s.response_ids.len() {
                return Err(Error::Internal(format!(
                    "sample {i} of policy {} has a loss mask of {} for {} response tokens",
                    learner.name,
                    s.loss_mask.len(),
                    s.response_ids.len()
                )));
            }
            out.push(View {
                prompt_ids: s.prompt_ids.clone(),
                response_ids: s.response_ids.clone(),
                loss_mask: s.loss_mask.clone(),
            });
            continue;
        }
        if !s.loss_mask.is_empty() {
            // Which of the re-encoded tokens the environment wrote is not known.
            return Err(Error::Internal(format!(
                "policy {}'s sample holds environment tokens between its turns; it cannot be re-encoded for \
                 policy {}: a multi-turn workload routes each policy its own samples",
                s.policy, learner.name
            )));
        }
        let prompt_ids = match prompts.get(&s.group) {
            Some(p) => p.clone(),
            None => {
                let p = learner.encode_prompt(&s.messages, cross_max_prompt_tokens)?;
                prompts.insert(&s.group, p.clone());
                p
            }
        };
        let mut response_ids =
            if s.text.is_empty() { vec![learner.eos()?] } else { learner.tokenizer.encode(&s.text, false)? };
        if response_ids.is_empty() {
            return Err(Error::Internal(format!(
                "policy {}'s response {:?} encodes to no tokens for policy {}",
                s.policy, s.text, learner.name
            )));
        }
        response_ids.truncate(max_response_tokens.max(1));
        out.push(View { prompt_ids, response_ids, loss_mask: vec![] });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::FinishReason;

    pub(crate) fn sample(policy: usize, group: &str, reward: f64) -> Sample {
        Sample {
            id: 0,
            policy,
            role: "solver".into(),
            group: GroupKey(group.into()),
            parent: None,
            turn: 0,
            prompt: 0,
            sample_index: 0,
            messages: vec![],
            text: String::new(),
            prompt_ids: vec![1],
            response_ids: vec![2],
            token_logps: vec![-1.0],
            values: vec![],
            reward: Some(reward),
            penalty: 0.0,
            score: None,
            train: true,
            policy_version: 0,
            finish_reason: FinishReason::Stop,
            loss_mask: vec![],
        }
    }

    #[test]
    fn own_routing_keeps_the_learners_samples_and_numbers_groups_in_order() {
        let s = vec![sample(0, "b", 1.0), sample(1, "b", 0.0), sample(0, "a", 0.0), sample(1, "a", 1.0)];
        let r = route(&s, 1, Routing::Own);
        assert_eq!(r.indices, vec![1, 3]);
        assert_eq!(
            r.pool,
            vec![PoolSample { agent: 1, group: 0, reward: 0.0 }, PoolSample { agent: 1, group: 1, reward: 1.0 }]
        );
    }

    #[test]
    fn shared_routing_takes_the_groups_the_learner_answered_and_skips_masked_samples() {
        let mut s = vec![sample(0, "a", 1.0), sample(1, "a", 0.0), sample(1, "b", 1.0), sample(0, "c", 0.0)];
        s[2].train = false;
        // Policy 0 answered a and c; b is not its group, and c has only its own sample.
        let r = route(&s, 0, Routing::Shared);
        assert_eq!(r.indices, vec![0, 1, 3]);
        assert_eq!(r.pool.iter().map(|p| p.group).collect::<Vec<_>>(), vec![0, 0, 1]);
        assert_eq!(r.pool.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 1, 0]);
    }
}
