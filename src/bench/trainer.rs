//! Where a collaborative training step spends its time: `hacpo bench --trainer`.
//!
//! Two random agents of ~5M non-embedding parameters, one Qwen3 with the real Qwen3 tokenizer
//! and one Llama-3.1 with the real Llama-3.1 tokenizer, train a few HACPO steps on GSM8K
//! prompts. Random weights rarely stop early, so every response runs to `max_new_tokens`: the
//! worst case for rollout cost and the realistic one for retokenisation (long foreign texts).
//! The first step warms up allocators and caches and is left out of the figures.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::backend::Backend;

use crate::config::TrainConfig;
use crate::model::weights::{RandomWeights, build};
use crate::model::{ModelConfig, SaveDtype, save_pretrained};
use crate::task::MathTask;
use crate::tokenizer::Tokenizer;
use crate::trainer::Trainer;
use crate::{Error, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct TrainerBenchOptions {
    /// The Qwen3 and the Llama-3.1 tokenizer directories.
    pub qwen_tokenizer: PathBuf,
    pub llama_tokenizer: PathBuf,
    /// GSM8K problems (JSONL).
    pub prompts: PathBuf,
    /// Measured steps (one warm-up step runs before them).
    pub steps: usize,
    pub prompts_per_step: usize,
    pub group_size: usize,
    pub max_new_tokens: usize,
    pub hidden: usize,
    pub layers: usize,
    /// Recompute layers in the update's backward pass (`algo.gradient_checkpointing`).
    pub gradient_checkpointing: bool,
    /// The matmuls' dtype (`algo.compute_dtype`).
    pub compute_dtype: crate::dtype::ComputeDtype,
}

/// Mean seconds per measured step, and token counts, over both agents.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainerBreakdown {
    pub agents: Vec<AgentShape>,
    pub steps: usize,
    /// Wall seconds of a step and of its two phases (rollout to routing, then updates).
    pub step_s: f64,
    pub rollout_phase_s: f64,
    pub update_phase_s: f64,
    /// Generation, retokenisation and update are summed over agents (they run concurrently, so
    /// these may exceed the phase's wall time); old log-probs, reward and reference are wall.
    pub generate_s: f64,
    pub old_logp_s: f64,
    pub reward_s: f64,
    pub retokenize_s: f64,
    pub reference_s: f64,
    pub update_s: f64,
    pub generated_tokens: f64,
    pub update_tokens: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct AgentShape {
    pub name: String,
    pub parameters: usize,
    pub non_embedding_parameters: usize,
}

impl TrainerBreakdown {
    /// Generated plus trained tokens per wall second.
    pub fn tokens_per_second(&self) -> f64 {
        (self.generated_tokens + self.update_tokens) / self.step_s
    }

    /// Phase shares of a step, for the report.
    pub fn shares(&self) -> Vec<(&'static str, f64)> {
        let s = self.step_s;
        vec![
            ("rollout to routing (wall)", self.rollout_phase_s / s),
            ("  generation (agent-sum)", self.generate_s / s),
            ("  reward / grading (wall)", self.reward_s / s),
            ("  old log-prob scoring (wall)", self.old_logp_s / s),
            ("  reference log-probs (wall)", self.reference_s / s),
            ("  retokenisation (agent-sum)", self.retokenize_s / s),
            ("update stage (wall)", self.update_phase_s / s),
            ("  forward/backward/AdamW (agent-sum)", self.update_s / s),
        ]
    }
}

/// The two agents' model configs: Qwen3 (q/k norm) and Llama, same body size.
fn agent_config(family: &str, vocab: usize, hidden: usize, layers: usize, eos: &[u32]) -> Result<ModelConfig> {
    let v = serde_json::json!({
        "model_type": family, "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": hidden * 3, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": true, "eos_token_id": eos,
    });
    ModelConfig::from_json(&v, &format!("bench {family}"))
}

/// Writes one random agent in Hugging Face layout under `dir`.
fn write_agent(
    dir: &Path,
    tokenizer_dir: &Path,
    (tokenizer, family, eos_tokens): (&str, &str, [&str; 2]),
    opts: &TrainerBenchOptions,
) -> Result<AgentShape> {
    let tok = Tokenizer::from_dir(tokenizer_dir)?;
    let eos: Vec<u32> = eos_tokens.iter().filter_map(|t| tok.token_to_id(t)).collect();
    let config = agent_config(family, tok.vocab_size(), opts.hidden, opts.layers, &eos)?;
    let device = Default::default();
    let model = build::<crate::backend::Cpu>(&config, &mut RandomWeights::new(&config, 7, 0.02), &device)?;
    save_pretrained(&model, &tok, &eos, dir, SaveDtype::F32)?;
    let parameters = config.num_parameters();
    Ok(AgentShape {
        name: format!("{family}+{tokenizer}"),
        parameters,
        non_embedding_parameters: parameters - config.vocab_size * config.hidden_size,
    })
}

/// Runs the benchmark on backend `B` (all agents on `device`).
pub fn run<B: Backend>(opts: &TrainerBenchOptions, device: &B::Device) -> Result<TrainerBreakdown> {
    for (what, p) in [
        ("Qwen3 tokenizer directory", &opts.qwen_tokenizer),
        ("Llama-3.1 tokenizer directory", &opts.llama_tokenizer),
        ("GSM8K file", &opts.prompts),
    ] {
        if !p.exists() {
            return Err(Error::NotFound {
                what: what.into(),
                path: p.clone(),
                hint: "the trainer benchmark reads the test assets (tests/shared/README.md): pass --shared DIR, \
                       set HACPO_SHARED, or run scripts/fetch-test-assets.sh for the Llama tokenizer"
                    .into(),
            });
        }
    }
    let work = tempfile::tempdir().map_err(|e| Error::io("create", &std::env::temp_dir(), e))?;
    let qwen = work.path().join("qwen3");
    let llama = work.path().join("llama");
    let shapes = vec![
        write_agent(&qwen, &opts.qwen_tokenizer, ("qwen3", "qwen3", ["<|im_end|>", "<|endoftext|>"]), opts)?,
        write_agent(&llama, &opts.llama_tokenizer, ("llama3.1", "llama", ["<|eot_id|>", "<|end_of_text|>"]), opts)?,
    ];
    let toml = format!(
        r#"
[run]
out_dir = "{out}"
seed = 1
steps = {steps}
checkpoint_every = 0

[algo]
name = "hacpo"
group_size = {g}
prompts_per_step = {p}
minibatch_prompts = {p}
micro_batch_sequences = 8
gradient_checkpointing = {ckpt}
compute_dtype = "{compute}"

[algo.optimizer]
lr = 1e-5

[rollout]
max_new_tokens = {n}
max_response_tokens = {n}
batch_prompts = {p}

[task]
train = "gsm8k={prompts}"
grade_mode = "full"

[[policies]]
model = "{qwen}"
chat_template_kwargs = {{ enable_thinking = false }}

[[policies]]
model = "{llama}"
"#,
        out = work.path().join("run").display(),
        steps = opts.steps + 1,
        g = opts.group_size,
        p = opts.prompts_per_step,
        n = opts.max_new_tokens,
        ckpt = opts.gradient_checkpointing,
        compute = opts.compute_dtype.name(),
        prompts = opts.prompts.display(),
        qwen = qwen.display(),
        llama = llama.display(),
    );
    let cfg = TrainConfig::from_toml(&toml, "trainer benchmark", &[])?;
    let task = Arc::new(MathTask::load(&cfg.task.splits(), cfg.task.grade_mode)?);
    let inputs = crate::trainer::Inputs::as_given(&cfg, task, vec![device.clone(); 2]);
    let mut trainer = Trainer::<B>::start(cfg, inputs)?;
    let bar = crate::progress::Progress::new("bench step", opts.steps as u64 + 1);
    let mut out = TrainerBreakdown {
        agents: shapes,
        steps: opts.steps,
        step_s: 0.0,
        rollout_phase_s: 0.0,
        update_phase_s: 0.0,
        generate_s: 0.0,
        old_logp_s: 0.0,
        reward_s: 0.0,
        retokenize_s: 0.0,
        reference_s: 0.0,
        update_s: 0.0,
        generated_tokens: 0.0,
        update_tokens: 0.0,
    };
    for step in 0..=opts.steps {
        let phases = trainer.train_step()?;
        bar.inc(1);
        bar.set_message(phases);
        if step == 0 {
            continue; // warm-up
        }
        let per_step = 1.0 / opts.steps as f64;
        let wall = &trainer.last_metrics[0].1;
        let get = |m: &crate::train::metrics::Metrics, k: &str| m.get(k).copied().unwrap_or(0.0) * per_step;
        out.step_s += get(wall, "timing_s/step");
        out.rollout_phase_s += get(wall, "timing_s/step") - get(wall, "timing_s/update_actor");
        out.update_phase_s += get(wall, "timing_s/update_actor");
        // Stages that run once for all policies (wall clock).
        out.old_logp_s += get(wall, "timing_s/old_log_prob");
        out.reward_s += get(wall, "timing_s/reward");
        out.reference_s += get(wall, "timing_s/ref");
        for (_, m) in &trainer.last_metrics {
            out.generate_s += get(m, "timing_s/gen");
            out.retokenize_s += get(m, "timing_s/retokenize");
            out.update_s += get(m, "timing_s/update");
            out.generated_tokens += get(m, "perf/generated_tokens");
            out.update_tokens += get(m, "perf/update_tokens");
        }
    }
    bar.finish();
    Ok(out)
}
