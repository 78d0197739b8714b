//! Throughput measurements shared by `hacpo bench` and `benches/model.rs`.
//!
//! Three figures decide what an RL step costs: **prefill** (prompt tokens/s through a forward
//! pass), **decode** (generated tokens/s with the KV cache, at batch 1 and at rollout batch
//! sizes) and the **train step** (tokens/s through forward + backward + AdamW). Each is run
//! once to warm up, then `reps` times; the median rate is reported, because shared 2-core
//! machines vary by ±30% from run to run.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use crate::generate::{GenerateRequest, GenerationStats, SamplingParams, generate, score};
use crate::model::{CausalLm, Layout, ModelConfig};
use crate::train::optim::{AdamW, AdamWConfig, GradStore};

pub mod machine;
pub mod trainer;

/// A ~5M-parameter Llama-architecture config (vocab 8192, hidden 256, 4 layers, GQA 4/2).
pub fn tiny_5m_config() -> ModelConfig {
    let v = serde_json::json!({
        "model_type": "llama", "vocab_size": 8192, "hidden_size": 256, "intermediate_size": 768,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "tie_word_embeddings": true
    });
    ModelConfig::from_json(&v, "tiny-5m").expect("valid built-in config")
}

/// One measurement: the median over repetitions.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Measurement {
    pub name: String,
    pub batch: usize,
    /// Tokens processed in one repetition.
    pub tokens: usize,
    /// Seconds of the median repetition.
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub reps: usize,
    /// Seconds of the warm-up run, kernel compilation (GPU) and first allocations included.
    pub warmup_seconds: f64,
}

/// Runs `run` once to warm up and `reps` more times; `run` returns (tokens, seconds).
///
/// Each phase shows progress and writes its figure to stderr as soon as it is measured: on a
/// GPU the warm-up alone (kernels compiled on first use) can take minutes, and a run stopped
/// by a time limit still leaves the phases it finished.
fn median_of(name: &str, batch: usize, reps: usize, mut run: impl FnMut() -> (usize, f64)) -> Measurement {
    let reps = reps.max(1);
    let progress = crate::progress::Progress::new(format!("{name} b{batch}"), reps as u64 + 1);
    progress.set_message("warm-up");
    let started = Instant::now();
    run();
    let warmup_seconds = started.elapsed().as_secs_f64();
    progress.inc(1);
    let mut samples: Vec<(usize, f64)> = (0..reps)
        .map(|i| {
            progress.set_message(format!("run {}/{reps}", i + 1));
            let sample = run();
            progress.inc(1);
            sample
        })
        .collect();
    progress.finish();
    samples.sort_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1)));
    let (tokens, seconds) = samples[samples.len() / 2];
    let measurement = Measurement {
        name: name.into(),
        batch,
        tokens,
        seconds,
        tokens_per_second: tokens as f64 / seconds,
        reps: samples.len(),
        warmup_seconds,
    };
    eprintln!(
        "{name} b{batch}: {:.1} tokens/s (median of {}; warm-up {warmup_seconds:.1} s)",
        measurement.tokens_per_second, measurement.reps
    );
    measurement
}

/// `n` uniformly random token ids below `vocab`.
pub fn random_ids(rng: &mut rand_chacha::ChaCha8Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// One forward pass over `ids` (`batch` rows of `seq_len`), producing the last-position
/// logits, as the prefill of a generation does.
pub fn prefill_once<B: Backend>(model: &CausalLm<B>, ids: &[u32], batch: usize, seq_len: usize) {
    let data: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(data, [batch, seq_len]), &model.device());
    let hidden = model.forward_hidden(ids, &model.layout_tensors(&Layout::dense(batch, seq_len)), None);
    let d = hidden.dims()[2];
    let last = hidden.slice([0..batch, seq_len - 1..seq_len, 0..d]).reshape([batch, d]);
    let _ = model.logits(last).into_data();
}

/// Prompt tokens per second through [`prefill_once`].
pub fn prefill<B: Backend>(model: &CausalLm<B>, batch: usize, seq_len: usize, reps: usize) -> Measurement {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let vocab = model.config.vocab_size;
    median_of("prefill", batch, reps, || {
        let ids = random_ids(&mut rng, batch * seq_len, vocab);
        let t = Instant::now();
        // Where generation runs its prefill (see `generate`).
        crate::backend::on_a_cpu_worker::<B, _>(|| prefill_once(model, &ids, batch, seq_len));
        (batch * seq_len, t.elapsed().as_secs_f64())
    })
}

/// Greedy generation of `new_tokens` for each prompt, `samples` times (no stop tokens, so
/// every row decodes the full length).
pub fn decode_once<B: Backend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    samples: usize,
    new_tokens: usize,
) -> GenerationStats {
    let req =
        GenerateRequest { num_samples: samples, ..GenerateRequest::new(prompts, SamplingParams::greedy(new_tokens)) };
    generate(model, &req).expect("generation on valid prompts").1
}

/// Generated tokens per second for `batch` sequences decoding `new_tokens` greedy tokens
/// each, `samples` of each random prompt of `prompt_len` tokens (an RL step's groups; 1:
/// every prompt distinct); prefill time excluded.
pub fn decode<B: Backend>(
    model: &CausalLm<B>,
    [batch, samples]: [usize; 2],
    prompt_len: usize,
    new_tokens: usize,
    reps: usize,
) -> Measurement {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let vocab = model.config.vocab_size;
    assert!(samples > 0 && batch % samples == 0, "a decoding batch of {batch} is not groups of {samples}");
    median_of("decode", batch, reps, || {
        let prompts: Vec<Vec<u32>> = (0..batch / samples).map(|_| random_ids(&mut rng, prompt_len, vocab)).collect();
        let stats = decode_once(model, &prompts, samples, new_tokens);
        (stats.generated_tokens, stats.decode_seconds)
    })
}

type Trainable<B> = CausalLm<burn::backend::Autodiff<B>>;

/// A supervised training step on random sequences: forward, negative log-likelihood through
/// the chunked log-prob op, backward, and the trainer's own AdamW (`train::optim`, PyTorch's
/// defaults with weight decay 0.01, as `scripts/bench_pytorch.py`).
pub struct TrainStep<B: Backend> {
    model: Option<Trainable<B>>,
    optim: AdamW<B>,
    rng: rand_chacha::ChaCha8Rng,
    batch: usize,
    seq_len: usize,
}

impl<B: Backend> TrainStep<B> {
    pub fn new(model: Trainable<B>, batch: usize, seq_len: usize) -> Self {
        let optim = AdamW::new(AdamWConfig { lr: 1e-4, ..AdamWConfig::default() });
        TrainStep { model: Some(model), optim, rng: rand_chacha::ChaCha8Rng::seed_from_u64(2), batch, seq_len }
    }

    /// Runs one step and returns the number of tokens trained on, on a CPU worker as the
    /// trainer's updates run when its policies update one at a time (the default;
    /// [`crate::backend::training_on_a_cpu_worker`]).
    pub fn step(&mut self) -> usize {
        crate::backend::training_on_a_cpu_worker::<B, _>(|| self.step_here())
    }

    fn step_here(&mut self) -> usize {
        let model = self.model.take().expect("model present between steps");
        let vocab = model.config.vocab_size;
        let requests: Vec<(Vec<u32>, Vec<u32>)> = (0..self.batch)
            .map(|_| (random_ids(&mut self.rng, 1, vocab), random_ids(&mut self.rng, self.seq_len - 1, vocab)))
            .collect();
        let (hidden, targets, _) = score::response_hidden(&model, &requests).expect("valid batch");
        let logp = score::token_logprobs_autodiff(hidden, model.lm_head_weight(), &targets, 1.0);
        let mut grads = GradStore::default();
        grads.accumulate(&model, &logp.mean().neg().backward());
        let model = self.optim.step(model, grads, 1e-4);
        // Read a weight back so queued device work (CUDA) is inside the step.
        let _ = model.valid().norm.weight.val().into_data();
        self.model = Some(model);
        self.batch * self.seq_len
    }
}

/// Training tokens per second through [`TrainStep`].
pub fn train_step<B: Backend>(model: Trainable<B>, batch: usize, seq_len: usize, reps: usize) -> Measurement {
    let mut step = TrainStep::new(model, batch, seq_len);
    median_of("train_step", batch, reps, || {
        let t = Instant::now();
        let tokens = step.step();
        (tokens, t.elapsed().as_secs_f64())
    })
}
