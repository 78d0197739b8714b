//! The batched sampling engine (no autodiff) and response scoring.
//!
//! [`generate`] runs `prompts × num_samples` sequences together:
//! 1. **prefill** each distinct prompt once, and a beginning that prompts share once
//!    ([`prefill`]), left-padded to a common length, in chunks that bound activation memory;
//!    keep the last position's logits;
//! 2. **fan out** the KV cache to `num_samples` rows per prompt (prompts are never recomputed
//!    per sample or per repeat);
//! 3. **decode** one token per step for every live row, sampling on the CPU in parallel;
//!    rows that finished are dropped from the batch once they are an eighth of it, so long
//!    tails do not pay for finished sequences.
//!
//! Determinism: each sequence samples from its own random stream (see [`sampler`]), so a seed
//! reproduces every sample exactly, whatever the batch composition.

mod prefill;
pub mod sampler;
pub mod score;
pub mod shared_prompt;

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use rayon::prelude::*;

pub use sampler::SamplingParams;

/// The most tokens any budget (prompt, response) may be: above every model's context.
pub const MAX_TOKENS: usize = 1 << 22;

/// Prompt tokens a prefill runs in one forward pass by default (the memory plan counts one such
/// pass).
pub const PREFILL_TOKEN_BUDGET: usize = 8192;

/// Slots for new tokens a KV cache reserves at first; it grows past them only when a response
/// runs longer (the memory plan counts the same).
pub const FIRST_NEW_SLOTS: usize = 512;

use crate::error::{Error, Result};
use crate::model::{CausalLm, KvCache, Layout, Pad};
use crate::tokenizer::Tokenizer;

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token was sampled (it is the last id of the completion).
    Eos,
    /// A stop string appeared in the decoded text.
    Stop,
    /// `max_new_tokens` or the model's context was reached.
    Length,
}

/// One generated sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub prompt_index: usize,
    pub sample_index: usize,
    /// Generated ids, including the EOS id or the token that completed a stop string.
    pub token_ids: Vec<u32>,
    /// Log-probability of each generated id under the distribution it was sampled from.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    /// The stop string that ended the sequence, if any.
    pub stop_string: Option<String>,
}

/// Timings and counts of one [`generate`] call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Slots the prefill ran, padding included: fewer than the prompts' tokens when prompts
    /// repeat or begin alike.
    pub prefill_slots: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub decode_steps: usize,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateRequest<'a> {
    pub prompts: &'a [Vec<u32>],
    pub num_samples: usize,
    pub params: SamplingParams,
    /// Any of these ids ends a sequence.
    pub stop_token_ids: Vec<u32>,
    /// Any of these strings in the decoded output ends a sequence (needs `tokenizer`).
    pub stop_strings: Vec<String>,
    pub tokenizer: Option<&'a Tokenizer>,
    /// Upper bound on prompt tokens prefilled in one forward pass.
    pub prefill_token_budget: usize,
}

impl<'a> GenerateRequest<'a> {
    pub fn new(prompts: &'a [Vec<u32>], params: SamplingParams) -> Self {
        GenerateRequest {
            prompts,
            num_samples: 1,
            params,
            stop_token_ids: vec![],
            stop_strings: vec![],
            tokenizer: None,
            prefill_token_budget: PREFILL_TOKEN_BUDGET,
        }
    }
}

/// Per-sequence decoding state.
struct Sequence {
    index: usize,
    prompt_len: usize,
    pad: Pad,
    rng: rand_chacha::ChaCha8Rng,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
    stop_string: Option<String>,
}

/// Greedy responses to `prompts`, decoded without special tokens, in prompt order; `batch`
/// prompts at a time. What validation and held-out evaluation score.
pub fn greedy_responses<B: Backend>(
    model: &CausalLm<B>,
    tokenizer: &Tokenizer,
    stop_token_ids: &[u32],
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    batch: usize,
) -> Result<Vec<String>> {
    let mut texts = vec![String::new(); prompts.len()];
    for (c, chunk) in prompts.chunks(batch.max(1)).enumerate() {
        let mut req = GenerateRequest::new(chunk, SamplingParams::greedy(max_new_tokens));
        req.stop_token_ids = stop_token_ids.to_vec();
        let (out, _) = generate(model, &req)?;
        for done in out {
            texts[c * batch.max(1) + done.prompt_index] = tokenizer.decode(&done.token_ids, true)?;
        }
    }
    Ok(texts)
}

/// Generates `num_samples` completions for each prompt; results are ordered by prompt, then
/// sample.
pub fn generate<B: Backend>(
    model: &CausalLm<B>,
    req: &GenerateRequest<'_>,
) -> Result<(Vec<Completion>, GenerationStats)> {
    crate::backend::on_a_cpu_worker::<B, _>(|| generate_here(model, req))
}

fn generate_here<B: Backend>(
    model: &CausalLm<B>,
    req: &GenerateRequest<'_>,
) -> Result<(Vec<Completion>, GenerationStats)> {
    req.params.validate()?;
    if req.num_samples == 0 {
        return Err(Error::InvalidArgument("num-samples must be at least 1".into()));
    }
    if !req.stop_strings.is_empty() && req.tokenizer.is_none() {
        return Err(Error::InvalidArgument("stop strings need a tokenizer to decode the output".into()));
    }
    let context = model.config.max_position_embeddings;
    for p in req.prompts {
        if p.is_empty() {
            return Err(Error::InvalidArgument("empty prompt: give at least one token".into()));
        }
        if p.len() >= context {
            return Err(Error::PromptTooLong { prompt_tokens: p.len(), context });
        }
    }
    let mut stats = GenerationStats { prompt_tokens: req.prompts.iter().map(Vec::len).sum(), ..Default::default() };
    if req.prompts.is_empty() {
        return Ok((vec![], stats));
    }
    let _span = tracing::info_span!("generate", prompts = req.prompts.len(), samples = req.num_samples).entered();

    // 1. Prefill.
    let started = Instant::now();
    let prefilled = prefill::prefill(model, req.prompts, req.prefill_token_budget, req.params.max_new_tokens)?;
    let mut cache = prefilled.cache;
    stats.prefill_slots = prefilled.slots;
    stats.prefill_seconds = started.elapsed().as_secs_f64();

    // 2. Fan out to samples (and to repeats of a prompt).
    let g = req.num_samples;
    let n = req.prompts.len() * g;
    let source: Vec<usize> = (0..n).map(|i| prefilled.row_of[i / g]).collect();
    if source.iter().enumerate().any(|(i, &row)| row != i) {
        cache.select_rows(&source);
    }
    let vocab = prefilled.logits.len() / prefilled.pads.len();
    let mut logits: Vec<f32> = Vec::with_capacity(n * vocab);
    for &row in &source {
        logits.extend_from_slice(&prefilled.logits[row * vocab..(row + 1) * vocab]);
    }
    let mut rows: Vec<Sequence> = (0..n)
        .map(|i| Sequence {
            index: i,
            prompt_len: req.prompts[i / g].len(),
            pad: prefilled.pads[source[i]],
            rng: sampler::sequence_rng(req.params.seed, i as u64),
            ids: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
            stop_string: None,
        })
        .collect();
    let mut finished: Vec<Sequence> = Vec::with_capacity(n);

    // 3. Decode.
    let started = Instant::now();
    let max_stop_chars = req.stop_strings.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    loop {
        rows.par_iter_mut().zip(logits.par_chunks(vocab)).for_each(|(seq, row)| {
            if seq.finish.is_none() {
                step_sequence(seq, row, req, context, max_stop_chars);
            }
        });
        stats.decode_steps += 1;

        let done = rows.iter().filter(|s| s.finish.is_some()).count();
        if done == rows.len() {
            finished.append(&mut rows);
            break;
        }
        if done > 0 && done * 8 >= rows.len() {
            let keep: Vec<usize> = (0..rows.len()).filter(|&r| rows[r].finish.is_none()).collect();
            cache.select_rows(&keep);
            let (live, dead): (Vec<_>, Vec<_>) = rows.into_iter().partition(|s| s.finish.is_none());
            rows = live;
            finished.extend(dead);
        }

        let ids: Vec<i64> = rows.iter().map(|s| *s.ids.last().expect("one token sampled") as i64).collect();
        let layout = Layout { pads: rows.iter().map(|s| s.pad).collect(), start: cache.len(), len: 1 };
        logits = forward_last(model, ids, layout, &mut cache)?;
    }
    stats.decode_seconds = started.elapsed().as_secs_f64();

    finished.sort_by_key(|s| s.index);
    let completions: Vec<Completion> = finished
        .into_iter()
        .map(|s| Completion {
            prompt_index: s.index / g,
            sample_index: s.index % g,
            token_ids: s.ids,
            logprobs: s.logprobs,
            finish_reason: s.finish.expect("finished"),
            stop_string: s.stop_string,
        })
        .collect();
    stats.generated_tokens = completions.iter().map(|c| c.token_ids.len()).sum();
    tracing::info!(
        generated = stats.generated_tokens,
        prefill_slots = stats.prefill_slots,
        prefill_s = stats.prefill_seconds,
        decode_s = stats.decode_seconds,
        "generation done"
    );
    Ok((completions, stats))
}

/// Samples one token for `seq` and decides whether it ends.
fn step_sequence(seq: &mut Sequence, logits: &[f32], req: &GenerateRequest<'_>, context: usize, max_stop_chars: usize) {
    let (token, logprob) = sampler::sample(logits, &req.params, &mut seq.rng);
    seq.ids.push(token);
    seq.logprobs.push(logprob);
    if req.stop_token_ids.contains(&token) {
        seq.finish = Some(FinishReason::Eos);
        return;
    }
    if max_stop_chars > 0
        && let Some(tok) = req.tokenizer
    {
        // A stop string can only have been completed by the newest token, so decoding a tail
        // long enough to hold the longest stop string is enough.
        let tail_start = seq.ids.len().saturating_sub(max_stop_chars + 4);
        if let Ok(text) = tok.decode(&seq.ids[tail_start..], false)
            && let Some(s) = req.stop_strings.iter().find(|s| text.contains(s.as_str()))
        {
            seq.finish = Some(FinishReason::Stop);
            seq.stop_string = Some(s.clone());
            return;
        }
    }
    if seq.ids.len() >= req.params.max_new_tokens || seq.prompt_len + seq.ids.len() >= context {
        seq.finish = Some(FinishReason::Length);
    }
}

/// Runs `ids` (`[rows, layout.len]`, row-major) through the model with the cache and returns
/// the logits of each row's last position, `[rows, vocab]` row-major.
fn forward_last<B: Backend>(
    model: &CausalLm<B>,
    ids: Vec<i64>,
    layout: Layout,
    cache: &mut KvCache<B>,
) -> Result<Vec<f32>> {
    let (rows, t) = (layout.batch(), layout.len);
    let device = model.device();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, t]), &device);
    let hidden = model.forward_hidden(ids, &model.layout_tensors(&layout), Some(cache));
    let d = hidden.dims()[2];
    let last = hidden.slice([0..rows, t - 1..t, 0..d]).reshape([rows, d]);
    model.logits(last).into_data().into_vec::<f32>().map_err(|e| Error::Internal(format!("reading logits: {e:?}")))
}
