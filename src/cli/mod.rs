//! Command definitions (clap) and dispatch. Each subcommand has its own file; all of them
//! return `hacpo::Result` so `main` can print one clear paragraph and exit with code 2 for
//! user errors.

mod bench;
mod cluster;
mod convert;
mod env;
mod eval;
mod eval_search;
mod generate;
mod grade;
mod models;
mod pretrain;
mod report;
mod rl;
mod score;
mod study;
mod train;

use clap::{Parser, Subcommand};
use hacpo::Result;

#[derive(Parser, Debug)]
#[command(
    name = "hacpo",
    version,
    about = "Heterogeneous LLMs improving each other with reinforcement learning on verifiable rewards",
    long_about = None,
    after_help = "Examples:\n  \
        hacpo models\n  \
        hacpo generate --model smollm2-135m --chat --greedy --prompt 'What is 12 + 30?'\n  \
        hacpo score --model ./my-model --prompt 'The capital of France is' --response ' Paris.'\n  \
        hacpo bench --model ~/.cache/hacpo/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n  \
        hacpo rl inspect --input tests/fixtures/rl/worked_example.json --minibatch-index 0,1,2,3"
)]
pub struct Cli {
    /// More logging on stderr (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Sample completions from a model.
    Generate(generate::GenerateArgs),
    /// Per-token log-probabilities of a response given a prompt.
    Score(score::ScoreArgs),
    /// List the model zoo.
    Models(models::ModelsArgs),
    /// Convert a model (e.g. a GGUF file) to a Hugging Face directory.
    Convert(convert::ConvertArgs),
    /// Measure prefill, decode and training-step throughput.
    Bench(bench::BenchArgs),
    /// RL algorithm tools (`hacpo rl inspect`).
    Rl(rl::RlArgs),
    /// Grade a math answer (or a JSONL file of answers) against a gold answer.
    Grade(grade::GradeArgs),
    /// Evaluate a model on math benchmarks (GSM8K, MATH-500, AIME, AMC, Minerva, OlympiadBench).
    Eval(eval::EvalArgs),
    /// Train agents with HACPO (or a baseline) on a verifiable task.
    Train(train::TrainArgs),
    /// Pre-train the tiny agents of a config from scratch (reproduces the shipped ones).
    Pretrain(pretrain::PretrainArgs),
    /// Summarise a training run: held-out accuracy before/after, rollouts, per-step curves.
    Report(report::ReportArgs),
    /// Compare algorithms (and HACPO ablations) over seeds: runs the matrix, then one table.
    Study(study::StudyArgs),
    /// The planning environments (Plan-Path, Sokoban, Sudoku): sample instances, or play one.
    Env(env::EnvArgs),
    /// Runs whose policies train in several processes (`[cluster]`): their hosts and heartbeats.
    Cluster(cluster::ClusterArgs),
}

pub fn run(cli: Cli) -> Result<()> {
    hacpo::backend::kernels::checked_level()?;
    match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Score(a) => score::run(a),
        Command::Models(a) => models::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Rl(a) => rl::run(a),
        Command::Grade(a) => grade::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Train(a) => train::run(a),
        Command::Pretrain(a) => pretrain::run(a),
        Command::Report(a) => report::run(a),
        Command::Study(a) => study::run(a),
        Command::Env(a) => env::run(a),
        Command::Cluster(a) => cluster::run(a),
    }
}

pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour codes only on a terminal: a redirected log stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .try_init();
}

/// Output format shared by commands that print results.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// `--model` and `--device`, shared by the model commands.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face model directory, a .gguf file, or a zoo id (see `hacpo models`).
    #[arg(short, long)]
    pub model: String,
    /// Where to run: cpu, cuda, cuda:N or wgpu (CUDA and wgpu need a `--features cuda` or `wgpu` build).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The matmuls' dtype, as algo.compute_dtype in training (the weights are stored in it, as a
    /// policy samples): f32, bf16 (CUDA, CPU) or f16.
    #[arg(long, value_name = "DTYPE", default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    pub compute_dtype: String,
    /// The device's free memory, e.g. 16GB (default: available RAM on the CPU, nvidia-smi's
    /// free memory on a GPU); the memory estimate is checked against it before the model loads.
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Run even when the memory estimate says the command does not fit.
    #[arg(long)]
    pub skip_memory_check: bool,
}

impl ModelArgs {
    /// The memory estimate of running `load` on this model, checked before it loads (a warning
    /// instead of a refusal with --skip-memory-check).
    pub fn check_memory(&self, command: &str, load: hacpo::memory_plan::CommandLoad, ways: &[String]) -> Result<()> {
        let device = hacpo::backend::DeviceSpec::parse_name(&self.device)?;
        let compute = compute_dtype(&self.compute_dtype, &self.device)?;
        let device_memory = self.device_memory.as_deref().map(hacpo::memory_plan::parse_size).transpose()?;
        let shape = hacpo::memory_plan::model_shape(&self.model, &hacpo::config::TrainConfig::default())?;
        let target =
            hacpo::memory_plan::CommandTarget { command, model: &self.model, shape, device, compute, device_memory };
        match hacpo::memory_plan::check_command(&target, load, ways) {
            Err(e) if self.skip_memory_check => {
                eprintln!("warning: --skip-memory-check: {e}");
                Ok(())
            }
            other => other,
        }
    }

    /// The model, computing in `--compute-dtype` with its weights stored in that dtype.
    pub fn load<B: burn::tensor::backend::Backend>(&self, device: &B::Device) -> Result<hacpo::model::Pretrained<B>> {
        use hacpo::model::precision::{rollout_copy, set_compute};
        let compute = compute_dtype(&self.compute_dtype, &self.device)?;
        let mut pretrained = hacpo::model::load::<B>(&self.model, device)?;
        pretrained.model = rollout_copy(set_compute(pretrained.model, compute));
        Ok(pretrained)
    }
}

/// `--compute-dtype NAME` (clap checked the spelling) for `--device DEVICE`: bf16 is refused on
/// wgpu.
pub fn compute_dtype(name: &str, device: &str) -> Result<hacpo::dtype::ComputeDtype> {
    use hacpo::dtype::ComputeDtype;
    let compute = ComputeDtype::parse(name).expect("clap checked the value");
    if compute == ComputeDtype::Bf16 && device == "wgpu" {
        return Err(hacpo::Error::InvalidArgument(
            "--compute-dtype bf16 is not available on wgpu (WGSL has no bf16 type); use f16 there".into(),
        ));
    }
    if let Some(w) = compute.speed_warning(device) {
        eprintln!("{w}");
    }
    Ok(compute)
}

/// Encodes a prompt: rendered by the chat template as one user message (after an optional
/// system message) with `--chat`, else as plain text with the tokenizer's special tokens.
pub fn encode_prompt(
    tokenizer: &hacpo::tokenizer::Tokenizer,
    prompt: &str,
    chat: bool,
    system: Option<&str>,
) -> Result<Vec<u32>> {
    use hacpo::tokenizer::Message;
    if chat {
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(Message::system(s));
        }
        messages.push(Message::user(prompt));
        tokenizer.encode_chat(&messages, true)
    } else {
        tokenizer.encode(prompt, true)
    }
}
