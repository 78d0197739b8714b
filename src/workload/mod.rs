//! Workloads: what produces a step's samples from the policies and assigns their rewards.
//!
//! The trainer hands a [`Workload`] the policies and the step's prompts; it gets back
//! [`Sample`]s, each naming its policy, role and group key, and then asks the workload for
//! their rewards. Generation, tool calls and environment steps live here; advantages, routing
//! and updates do not. [`exchange::Exchange`] is HACPO's workload: every policy answers every
//! prompt in the role `solver`, and everything goes to one pool.

pub mod exchange;
pub mod pool;

use burn::tensor::backend::Backend;

use crate::error::Result;
use crate::generate::SamplingParams;
use crate::policy::Policy;
use crate::sample::Sample;
use crate::task::TaskPrompt;
use crate::tokenizer::Message;

/// A role of a workload: its name, the policies that play it and how a prompt is put to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    pub name: String,
    /// Indices of the policies that play it.
    pub policies: Vec<usize>,
    /// The user message with `{prompt}` for the task's; `None`: the task's messages as they are.
    pub template: Option<String>,
}

impl Role {
    /// The messages this role sees for a task prompt.
    pub fn messages(&self, prompt: &TaskPrompt) -> Vec<Message> {
        let Some(template) = &self.template else { return prompt.messages.clone() };
        let mut messages = prompt.messages.clone();
        if let Some(last) = messages.iter_mut().rev().find(|m| m.role == "user") {
            last.content = template.replace("{prompt}", &last.content);
        }
        messages
    }
}

/// Sampling settings of one step.
#[derive(Clone, Debug)]
pub struct RolloutSettings {
    /// The training step (1-based), for seeds and error messages.
    pub step: u64,
    pub run_seed: u64,
    /// Samples per prompt per policy.
    pub group_size: usize,
    /// Temperature, top-p/k and length; the seed is derived per policy and chunk.
    pub sampling: SamplingParams,
    pub max_prompt_tokens: usize,
    /// Prompts generated together.
    pub batch_prompts: usize,
}

/// Seconds and tokens a policy spent producing its samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct RolloutTimings {
    pub generate: f64,
    pub generated_tokens: usize,
}

/// A workload the trainer can host.
pub trait Workload<B: Backend>: Send + Sync {
    fn name(&self) -> &str;

    /// The step's samples (rewards and old log-probs not yet filled in) and each policy's
    /// timings, indexed like `policies`.
    fn rollout(
        &self,
        policies: &[Policy<B>],
        prompts: &[TaskPrompt],
        settings: &RolloutSettings,
    ) -> Result<(Vec<Sample>, Vec<RolloutTimings>)>;

    /// Fills in every sample's reward.
    fn assign_rewards(&self, samples: &mut [Sample], prompts: &[TaskPrompt]) -> Result<()>;
}

/// SplitMix64: independent seeds from (run seed, step, policy, chunk).
pub fn mix_seed(parts: &[u64]) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for &p in parts {
        x ^= p.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(x << 6).wrapping_add(x >> 2);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x = z ^ (z >> 31);
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_template_wraps_the_last_user_message() {
        let p = TaskPrompt { id: "1".into(), messages: vec![Message::user("2+2?")], gold: "4".into() };
        let plain = Role { name: "solver".into(), policies: vec![0], template: None };
        assert_eq!(plain.messages(&p), p.messages);
        let wrapped = Role { template: Some("Q: {prompt}\nA:".into()), ..plain };
        assert_eq!(wrapped.messages(&p)[0].content, "Q: 2+2?\nA:");
    }
}
