//! `hacpo bench`: prefill, decode and train-step throughput of a model (default: the built-in
//! ~5M-parameter config with random weights).

use clap::Args;
use hacpo::backend::DeviceSpec;
use hacpo::bench::trainer::TrainerBenchOptions;
use hacpo::bench::{self, Measurement};
use hacpo::dtype::ComputeDtype;
use hacpo::model::precision::{rollout_copy, set_compute};
use hacpo::model::{CausalLm, weights};
use hacpo::{Error, Result, with_backend};

use super::Format;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo bench                      # ~5M-parameter Llama config, random weights\n  \
    hacpo bench --model \"$(bash scripts/fetch-smollm2.sh)\" --format json\n  \
    hacpo bench --trainer            # where a two-agent HACPO step spends its time\n  \
    hacpo bench --random-shape qwen-1.5b --device cuda   # a Qwen2.5-1.5B-shaped model, random weights\n  \
    hacpo bench --random-shape qwen-1.5b --device cuda --compute-dtype bf16")]
pub struct BenchArgs {
    /// Model to measure (directory, .gguf or zoo id); default: the built-in tiny-5m config.
    #[arg(short, long, conflicts_with = "random_shape")]
    pub model: Option<String>,
    /// Random weights in the shape of a zoo entry (e.g. qwen-1.5b), from the config the zoo
    /// carries: no download.
    #[arg(long, value_name = "ZOO_ID")]
    pub random_shape: Option<String>,
    /// cpu, cuda, cuda:N or wgpu.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The matmuls' dtype, as algo.compute_dtype: prefill and decode read the weights stored in
    /// it, the train step casts f32 master weights (bf16: CUDA or CPU, faster than f32 on a CPU
    /// with AVX512-BF16, elsewhere slower and says so; wgpu has f16 only).
    #[arg(long, value_name = "DTYPE", default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    pub compute_dtype: String,
    /// Prefill: sequences per batch.
    #[arg(long, default_value_t = 4)]
    pub prefill_batch: usize,
    /// Prefill: tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub prefill_len: usize,
    /// Decode: batch sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
    pub decode_batch: Vec<usize>,
    /// Decode: sequences sampled from each prompt, as an RL step's groups (each batch a
    /// multiple of it); 1, every prompt distinct.
    #[arg(long, default_value_t = 1)]
    pub decode_samples: usize,
    /// Decode: prompt tokens per sequence.
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// Decode: generated tokens per sequence.
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Train step: sequences per batch.
    #[arg(long, default_value_t = 8)]
    pub train_batch: usize,
    /// Train step: tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub train_len: usize,
    /// Timed repetitions of each measurement (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Skip the train-step measurement.
    #[arg(long)]
    pub no_train: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Measure a collaborative HACPO step instead: two random ~5M agents (Qwen3 and Llama-3.1
    /// with their real tokenizers) on GSM8K prompts; reports each phase's share of a step.
    #[arg(long)]
    pub trainer: bool,
    /// --trainer: measured steps (after one warm-up step).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// --trainer: prompts per step.
    #[arg(long, default_value_t = 4)]
    pub prompts: usize,
    /// --trainer: responses per prompt per agent (G).
    #[arg(long, default_value_t = 8)]
    pub group_size: usize,
    /// --trainer: response length (random models rarely stop early).
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// --trainer: recompute each layer in the update's backward pass (algo.gradient_checkpointing).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// --trainer: hidden size and layers of both agents.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    #[arg(long, default_value_t = 6)]
    pub layers: usize,
    /// --trainer: a directory in the layout of tests/shared (tokenizers and GSM8K); default
    /// $HACPO_SHARED, then the repository's tests/shared and the fetched test assets.
    #[arg(long)]
    pub shared: Option<std::path::PathBuf>,
    /// The device's free memory, e.g. 16GB (default: available RAM on the CPU, nvidia-smi's
    /// free memory on a GPU); the memory estimate is checked against it before anything loads.
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Run even when the memory estimate says the benchmark does not fit.
    #[arg(long)]
    pub skip_memory_check: bool,
}

/// The largest batch a flag may ask for (the memory plan refuses what does not fit).
const MAX_BATCH: usize = 1 << 20;

/// A size flag's range: at least `least`, at most `most`.
fn check_size(flag: &str, value: usize, least: usize, most: usize) -> Result<()> {
    if (least..=most).contains(&value) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("{flag} must be between {least} and {most}, got {value}")))
}

/// A length flag: at least `least` tokens, and within the model's context.
fn check_len(flag: &str, value: usize, least: usize, context: usize) -> Result<()> {
    if value > context {
        return Err(Error::InvalidArgument(format!(
            "{flag} ({value} tokens) exceeds the model's context of {context} tokens"
        )));
    }
    check_size(flag, value, least, context)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let device = DeviceSpec::parse(&args.device)?;
    check_size("--reps", args.reps, 1, 1000)?;
    let compute = super::compute_dtype(&args.compute_dtype, &args.device)?;
    if args.trainer {
        check_size("--steps", args.steps, 1, 1000)?;
        check_size("--prompts", args.prompts, 1, 4096)?;
        check_size("--group-size", args.group_size, 2, 4096)?;
        check_size("--max-new-tokens", args.max_new_tokens, 1, 1 << 16)?;
        check_size("--layers", args.layers, 1, 256)?;
        check_size("--hidden", args.hidden, 8, 16384)?;
        if !args.hidden.is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!(
                "--hidden must be a multiple of 8 (4 heads of an even size), got {}",
                args.hidden
            )));
        }
        return with_backend!(device, |B, dev| run_trainer::<B>(&args, compute, &dev));
    }
    // Every size is checked, against the model's context too, and the memory estimate before
    // any weight is built: a zero panics in the forward pass, a huge batch exhausts the machine.
    check_size("--prefill-batch", args.prefill_batch, 1, MAX_BATCH)?;
    check_size("--decode-samples", args.decode_samples, 1, MAX_BATCH)?;
    for &b in &args.decode_batch {
        check_size("--decode-batch", b, 1, MAX_BATCH)?;
        if b % args.decode_samples != 0 {
            return Err(Error::InvalidArgument(format!(
                "--decode-batch {b} is not a multiple of --decode-samples {}: each batch is whole groups of samples",
                args.decode_samples
            )));
        }
    }
    check_size("--train-batch", args.train_batch, 1, MAX_BATCH)?;
    let shape = model_shape(&args)?;
    let context = shape.max_position_embeddings;
    check_len("--prefill-len", args.prefill_len, 1, context)?;
    check_len("--prompt-len", args.prompt_len, 1, context)?;
    check_len("--new-tokens", args.new_tokens, 1, context)?;
    check_len("--prompt-len + --new-tokens", args.prompt_len + args.new_tokens, 2, context)?;
    check_len("--train-len", args.train_len, 2, context)?;
    let name = model_name(&args);
    let decode = args.decode_batch.iter().copied().max().unwrap_or(1);
    let load = hacpo::memory_plan::CommandLoad {
        sequences: decode.max(args.prefill_batch),
        prompt: args.prompt_len.max(args.prefill_len),
        new: args.new_tokens,
        train_sequences: if args.no_train { 0 } else { args.train_batch },
        train_len: args.train_len,
        whole_batch_prefill: true,
    };
    let device_memory = args.device_memory.as_deref().map(hacpo::memory_plan::parse_size).transpose()?;
    let ways = [
        "smaller batches (--prefill-batch, --decode-batch, --train-batch)".to_string(),
        "shorter sequences (--prefill-len, --prompt-len, --new-tokens, --train-len)".into(),
        "--no-train".into(),
    ];
    let target =
        hacpo::memory_plan::CommandTarget { command: "bench", model: &name, shape, device, compute, device_memory };
    match hacpo::memory_plan::check_command(&target, load, &ways) {
        Err(e) if args.skip_memory_check => eprintln!("warning: --skip-memory-check: {e}"),
        other => other?,
    }
    // On the CPU the device's memory is the process's: what it held at its peak, beside the
    // plan, shows how close the plan is on this machine.
    let memory = (device == DeviceSpec::Cpu).then(|| MemoryReport {
        planned: hacpo::memory_plan::command_need(&target, load).0,
        at_start: hacpo::alloc::resident_bytes(),
        peak: None,
    });
    with_backend!(device, |B, dev| run_on::<B>(&args, compute, &dev, memory))
}

/// The process's memory against the plan (the CPU only), in bytes.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct MemoryReport {
    /// The memory plan's peak for this command.
    planned: u64,
    /// Resident before any weight was built: the plan counts what comes after.
    at_start: Option<u64>,
    /// The process's peak resident memory.
    peak: Option<u64>,
}

impl MemoryReport {
    fn line(&self) -> String {
        let gb = hacpo::memory_plan::gb;
        let peak = self.peak.map_or("unknown".into(), gb);
        let start = self.at_start.map_or(String::new(), |b| format!(", {} of it before the model was built", gb(b)));
        format!("memory: peak {peak} resident{start}; the memory plan said {}", gb(self.planned))
    }
}

/// The shape of the model to measure, before any weight is read or built.
fn model_shape(args: &BenchArgs) -> Result<hacpo::model::ModelConfig> {
    if let Some(id) = &args.random_shape {
        let entry = hacpo::model::zoo::find(id).ok_or_else(|| hacpo::resolve::unknown_model(id))?;
        return entry.model_config();
    }
    match &args.model {
        Some(m) => hacpo::memory_plan::model_shape(m, &hacpo::config::TrainConfig::default()),
        None => Ok(bench::tiny_5m_config()),
    }
}

fn model_name(args: &BenchArgs) -> String {
    match (&args.random_shape, &args.model) {
        (Some(id), _) => format!("{id} shape (random)"),
        (None, Some(m)) => m.clone(),
        (None, None) => "tiny-5m (random)".into(),
    }
}

/// The model to measure, computing in `compute` (its weights still f32).
fn load<B: burn::tensor::backend::Backend>(
    args: &BenchArgs,
    compute: ComputeDtype,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    Ok(set_compute(load_weights(args, device)?, compute))
}

fn load_weights<B: burn::tensor::backend::Backend>(args: &BenchArgs, device: &B::Device) -> Result<CausalLm<B>> {
    match (&args.random_shape, &args.model) {
        (None, Some(m)) => Ok(hacpo::model::load::<B>(m, device)?.model),
        // A zoo entry's shape or the built-in tiny-5m, with random weights.
        _ => {
            let config = model_shape(args)?;
            weights::build(&config, &mut weights::RandomWeights::parallel(&config, 0, 0.02), device)
        }
    }
}

fn run_on<B: burn::tensor::backend::Backend>(
    args: &BenchArgs,
    compute: ComputeDtype,
    device: &B::Device,
    memory: Option<MemoryReport>,
) -> Result<()> {
    let name = model_name(args);
    // What sampling reads: the weights stored in the compute dtype.
    let model = rollout_copy(load::<B>(args, compute, device)?);
    let params = model.config.num_parameters();
    // A figure depends on the instructions the kernels ran (HACPO_CPU_KERNELS may cap them).
    let kernels = hacpo::backend::kernels::level().name();
    let machine = bench::machine::Machine::here();
    eprintln!(
        "benchmarking {name} ({params} parameters) on {}, {} matmuls, with {} threads, hacpo's CPU kernels at {kernels}",
        args.device,
        args.compute_dtype,
        rayon::current_num_threads()
    );
    eprintln!("machine: {}", machine.describe());
    let mut results: Vec<Measurement> = vec![bench::prefill(&model, args.prefill_batch, args.prefill_len, args.reps)];
    for &b in &args.decode_batch {
        results.push(bench::decode(&model, [b, args.decode_samples], args.prompt_len, args.new_tokens, args.reps));
    }
    drop(model);
    if !args.no_train {
        let trainable = load::<burn::backend::Autodiff<B>>(args, compute, device)?;
        results.push(bench::train_step(trainable, args.train_batch, args.train_len, args.reps));
    }
    let memory = memory.map(|m| MemoryReport { peak: hacpo::alloc::peak_resident_bytes(), ..m });
    match args.format {
        Format::Json => {
            let out = serde_json::json!({"model": name, "parameters": params, "device": args.device,
                "compute_dtype": args.compute_dtype, "threads": rayon::current_num_threads(), "cpu_kernels": kernels,
                "machine": machine,
                "decode_samples": args.decode_samples,
                "results": results, "memory": memory});
            println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        }
        Format::Text => {
            println!(
                "{:<12} {:>6} {:>8} {:>10} {:>12}  (median of {} runs)",
                "phase", "batch", "tokens", "seconds", "tokens/s", args.reps
            );
            for r in &results {
                println!(
                    "{:<12} {:>6} {:>8} {:>10.3} {:>12.1}",
                    r.name, r.batch, r.tokens, r.seconds, r.tokens_per_second
                );
            }
            if let Some(m) = memory {
                println!("{}", m.line());
            }
        }
    }
    Ok(())
}

fn run_trainer<B: burn::tensor::backend::Backend>(
    args: &BenchArgs,
    compute: ComputeDtype,
    device: &B::Device,
) -> Result<()> {
    let opts = TrainerBenchOptions {
        qwen_tokenizer: asset(args, "assets/tokenizers/qwen3"),
        llama_tokenizer: asset(args, "assets/tokenizers/llama3.1"),
        // GSM8K's training split where a larger copy has it, else its test split.
        prompts: Some(asset(args, "data/math/gsm8k_train.jsonl"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| asset(args, "data/math/gsm8k_test.jsonl")),
        steps: args.steps,
        prompts_per_step: args.prompts,
        group_size: args.group_size,
        max_new_tokens: args.max_new_tokens,
        hidden: args.hidden,
        layers: args.layers,
        gradient_checkpointing: args.gradient_checkpointing,
        compute_dtype: compute,
    };
    eprintln!(
        "benchmarking a HACPO step: 2 agents, {} prompts × G={} × {} new tokens, {} threads",
        opts.prompts_per_step,
        opts.group_size,
        opts.max_new_tokens,
        rayon::current_num_threads()
    );
    let machine = bench::machine::Machine::here();
    eprintln!("machine: {}", machine.describe());
    let r = bench::trainer::run::<B>(&opts, device)?;
    match args.format {
        Format::Json => {
            let out = serde_json::json!({"device": args.device, "threads": rayon::current_num_threads(),
                "machine": machine, "tokens_per_second": r.tokens_per_second(), "breakdown": r});
            println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        }
        Format::Text => {
            for a in &r.agents {
                println!(
                    "agent {:<16} {:>6.1}M parameters ({:.1}M without embeddings)",
                    a.name,
                    a.parameters as f64 / 1e6,
                    a.non_embedding_parameters as f64 / 1e6
                );
            }
            println!("step {:.2} s (mean of {} steps after a warm-up)", r.step_s, r.steps);
            for (name, share) in r.shares() {
                println!("{name:<40} {:>6.1}%", share * 100.0);
            }
            println!(
                "tokens/s overall {:.0} ({:.0} generated + {:.0} trained per step)",
                r.tokens_per_second(),
                r.generated_tokens,
                r.update_tokens
            );
        }
    }
    Ok(())
}

/// A test asset (tests/shared/README.md) for the trainer benchmark: the first of --shared,
/// $HACPO_SHARED, the repository's tests/shared and what scripts/fetch-test-assets.sh fetched
/// that holds it (the first candidate, to name in the error, when none does).
fn asset(args: &BenchArgs, rel: &str) -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_default();
    let roots: Vec<std::path::PathBuf> = args
        .shared
        .iter()
        .cloned()
        .chain(std::env::var_os("HACPO_SHARED").map(Into::into))
        .chain([concat!(env!("CARGO_MANIFEST_DIR"), "/tests/shared").into(), home.join(".cache/hacpo/test-assets")])
        .collect();
    roots.iter().map(|r| r.join(rel)).find(|p| p.exists()).unwrap_or_else(|| roots[0].join(rel))
}
