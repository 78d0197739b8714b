//! The rollout phase of one agent: G responses per prompt, their rewards, and their old
//! log-probabilities recomputed by the agent's own training forward pass.
//!
//! EOS handling follows ALGORITHMS.md §2.6: a terminal EOS is removed before anything else
//! (the log-prob sum and count exclude it, the text is decoded without it); a response that
//! is only EOS keeps that single token.

use std::time::Instant;

use burn::tensor::backend::Backend;
use serde::Serialize;

use super::agent::Agent;
use crate::error::{Error, Result};
use crate::generate::score::score;
use crate::generate::{FinishReason, GenerateRequest, SamplingParams, generate};
use crate::task::{Task, TaskPrompt};
use crate::tokenizer::Message;

/// One response, in a tokenizer-neutral record plus the source's own tokenisation.
#[derive(Clone, Debug, Serialize)]
pub struct Rollout {
    /// Source agent.
    pub agent: usize,
    /// The prompt's position in the step batch (its group).
    pub prompt_index: usize,
    pub sample: usize,
    pub messages: Vec<Message>,
    /// Response text without EOS and special tokens.
    pub text: String,
    /// The source's prompt ids.
    pub prompt_ids: Vec<u32>,
    /// The source's response ids without the terminal EOS (`[eos]` for an EOS-only response).
    pub response_ids: Vec<u32>,
    /// The source's log-prob of each response id at step start (old policy).
    pub token_logps: Vec<f32>,
    pub reward: f64,
    pub policy_version: u64,
    pub finish_reason: FinishReason,
}

impl Rollout {
    /// Mean old log-prob per response token (GSPO's length normalisation).
    pub fn mean_logp(&self) -> f64 {
        let n = self.token_logps.len().max(1);
        self.token_logps.iter().map(|&x| x as f64).sum::<f64>() / n as f64
    }
}

/// Seconds spent in each part of the rollout phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct RolloutTimings {
    pub generate: f64,
    pub reward: f64,
    pub score: f64,
    pub generated_tokens: usize,
}

/// SplitMix64: independent seeds from (run seed, step, agent, chunk).
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

/// Settings of one rollout phase.
#[derive(Clone, Debug)]
pub struct RolloutSettings {
    /// The training step (1-based), for error messages.
    pub step: u64,
    pub group_size: usize,
    pub sampling: SamplingParams,
    pub max_prompt_tokens: usize,
    pub batch_prompts: usize,
    pub score_batch: usize,
}

/// Samples `settings.group_size` responses for every prompt with `agent`'s current policy.
pub fn rollout<B: Backend>(
    agent: &Agent<B>,
    prompts: &[TaskPrompt],
    task: &dyn Task,
    settings: &RolloutSettings,
) -> Result<(Vec<Rollout>, RolloutTimings)> {
    let mut timings = RolloutTimings::default();
    let model = agent.inference_model();
    let g = settings.group_size;
    let prompt_ids: Vec<Vec<u32>> =
        prompts.iter().map(|p| agent.encode_prompt(&p.messages, settings.max_prompt_tokens)).collect::<Result<_>>()?;

    let mut out = Vec::with_capacity(prompts.len() * g);
    for (chunk_index, chunk) in prompt_ids.chunks(settings.batch_prompts.max(1)).enumerate() {
        let first = chunk_index * settings.batch_prompts.max(1);
        let mut params = settings.sampling.clone();
        params.seed = mix_seed(&[settings.sampling.seed, chunk_index as u64]);
        let mut req = GenerateRequest::new(chunk, params);
        req.num_samples = g;
        req.stop_token_ids = agent.eos_token_ids.clone();
        let started = Instant::now();
        let (completions, stats) = generate(&model, &req)?;
        timings.generate += started.elapsed().as_secs_f64();
        timings.generated_tokens += stats.generated_tokens;

        let started = Instant::now();
        for c in completions {
            let p = first + c.prompt_index;
            let mut ids = c.token_ids;
            if ids.last().is_some_and(|t| agent.eos_token_ids.contains(t)) {
                ids.pop();
            }
            let (response_ids, text) = if ids.is_empty() {
                (vec![agent.eos()?], String::new())
            } else {
                let text = agent.tokenizer.decode(&ids, true)?;
                (ids, text)
            };
            let reward = task.reward(&prompts[p], &text);
            out.push(Rollout {
                agent: agent.index,
                prompt_index: p,
                sample: c.sample_index,
                messages: prompts[p].messages.clone(),
                text,
                prompt_ids: prompt_ids[p].clone(),
                response_ids,
                token_logps: vec![],
                reward,
                policy_version: agent.policy_version,
                finish_reason: c.finish_reason,
            });
        }
        timings.reward += started.elapsed().as_secs_f64();
    }

    // Old log-probs from the training forward pass (not the sampler's), as the reference
    // implementation does: sampler and trainer numerics must not differ.
    let started = Instant::now();
    for batch in out.chunks_mut(settings.score_batch.max(1)) {
        let requests: Vec<(Vec<u32>, Vec<u32>)> =
            batch.iter().map(|r| (r.prompt_ids.clone(), r.response_ids.clone())).collect();
        let logps = score(&model, &requests, settings.sampling.temperature.max(1e-6))?;
        for (r, lp) in batch.iter_mut().zip(logps) {
            // A diverged model (NaN/inf weights or activations) shows here first.
            if let Some(&bad) = lp.iter().find(|x| !x.is_finite()) {
                return Err(Error::NonFinite {
                    agent: agent.name.clone(),
                    step: settings.step,
                    what: "log-probability of its own rollout",
                    value: bad as f64,
                });
            }
            r.token_logps = lp;
        }
    }
    timings.score = started.elapsed().as_secs_f64();
    Ok((out, timings))
}
