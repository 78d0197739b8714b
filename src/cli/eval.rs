//! `hacpo eval`: math benchmarks end to end.

use std::path::PathBuf;

use clap::Args;
use hacpo::backend::DeviceSpec;
use hacpo::data::{Benchmark, load_benchmark};
use hacpo::eval::{BenchReport, EvalOptions, evaluate};
use hacpo::reward::{GradeConfig, GradeMode};
use hacpo::{Error, Result, with_backend};

use super::ModelArgs;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo eval --model qwen-1.5b --bench math500,gsm8k --limit 100 --out report.json\n  \
    hacpo eval --model ./ckpt --bench aime25 --samples 8 --temperature 0.6 --top-p 0.95\n  \
    hacpo eval --model smollm2-135m --bench gsm8k=/data/gsm8k_test.jsonl --limit 20\n  \
    hacpo eval --workload search --model smollm2-135m --data hotpotqa --limit 20 --out search.json\n\n\
    Benchmarks: gsm8k, math500, math_train, aime24, aime25, amc23, minerva, olympiad. Data comes from\n\
    NAME=PATH (or NAME=hf://datasets/<owner>/<name>[@<revision>]/<file>), $HACPO_DATA_DIR,\n\
    $HACPO_SHARED/data/math, or the benchmark's file on the hub (cached; HF_HUB_OFFLINE=1 forbids downloads).")]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated benchmarks, each optionally `name=path` (the math workload).
    #[arg(long, value_delimiter = ',')]
    pub bench: Vec<String>,
    /// math (benchmarks of final answers) or search (the Rewriter → BM25 → Reranker → Answerer
    /// pipeline on multi-hop questions, one model playing every role).
    #[arg(long, default_value = "math")]
    pub workload: String,
    /// Search workload: hotpotqa, musique (HotpotQA-100, MuSiQue-100 with their passages),
    /// tiny-kb (the held-out questions of configs/tiny-search.toml's generated world), or a
    /// JSONL file of {"id", "question", "answers": [...]} (then --corpus).
    #[arg(long)]
    pub data: Option<String>,
    /// Search workload: a JSONL file of passages {"id", "title", "text"} for --data FILE.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Evaluate only the first N problems of each benchmark.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Samples per problem (K): accuracy is avg@K, and pass@K is reported.
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 2048)]
    pub max_new_tokens: usize,
    /// Problems generated together.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Grading: full or boxed-exact.
    #[arg(long, default_value = "full")]
    pub mode: String,
    /// Write the full report (per-problem results) as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: EvalArgs) -> Result<()> {
    match args.workload.as_str() {
        "math" => {}
        "search" => return super::eval_search::run(&args),
        other => return Err(Error::InvalidArgument(format!("unknown --workload {other:?}; use math or search"))),
    }
    if args.bench.is_empty() {
        return Err(Error::InvalidArgument("name the benchmarks: --bench gsm8k,math500 (see --help)".into()));
    }
    let device = DeviceSpec::parse(&args.model.device)?;
    let mode = GradeMode::parse(&args.mode)?;
    if args.samples > 1 && args.temperature == 0.0 {
        return Err(Error::InvalidArgument(
            "--samples > 1 needs --temperature > 0 (greedy samples are identical)".into(),
        ));
    }
    if args.limit == Some(0) {
        return Err(Error::InvalidArgument("--limit 0 evaluates nothing; give at least 1 or leave it out".into()));
    }
    check_sampling(&args)?;
    // Where the report goes is checked now, not after an evaluation of hours.
    if let Some(out) = &args.out {
        hacpo::error::check_writable(out)?;
    }
    // Resolve every benchmark before loading the model: a typo should fail in a second.
    let mut benches = Vec::new();
    for spec in &args.bench {
        let (name, source) = match spec.split_once('=') {
            Some((n, s)) => (n, Some(s)),
            None => (spec.as_str(), None),
        };
        let bench = Benchmark::parse(name)?;
        let problems = load_benchmark(bench, source, args.limit)?;
        if problems.is_empty() {
            return Err(Error::InvalidArgument(format!("benchmark {spec} has no problems; check its file")));
        }
        benches.push((bench, problems));
    }
    // Each batch's KV caches live together: estimated before the model loads, a prompt's
    // tokens bounded by its bytes plus what a chat template adds.
    let longest = benches.iter().flat_map(|(_, ps)| ps.iter().map(|p| p.question.len())).max().unwrap_or(0);
    let load = hacpo::memory_plan::CommandLoad {
        sequences: args.batch_size * args.samples,
        prompt: longest + super::generate::TEMPLATE_TOKENS,
        new: args.max_new_tokens,
        ..Default::default()
    };
    let ways = [
        format!("smaller batches (--batch-size {})", (args.batch_size / 4).max(1)),
        format!("shorter responses (--max-new-tokens {})", (args.max_new_tokens / 4).max(1)),
    ];
    args.model.check_memory("eval", load, &ways)?;
    with_backend!(device, |B, dev| run_on::<B>(&args, mode, &benches, &dev))
}

fn run_on<B: burn::tensor::backend::Backend>(
    args: &EvalArgs,
    mode: GradeMode,
    benches: &[(Benchmark, Vec<hacpo::data::MathProblem>)],
    device: &B::Device,
) -> Result<()> {
    let pretrained = args.model.load::<B>(device)?;
    let mut reports: Vec<BenchReport> = Vec::new();
    for (bench, problems) in benches {
        let opts = EvalOptions {
            samples: args.samples,
            temperature: args.temperature,
            top_p: args.top_p,
            max_new_tokens: args.max_new_tokens,
            batch_prompts: args.batch_size,
            seed: args.seed,
            grader: GradeConfig { mode, gold_precision: bench.approximate_answers(), ..Default::default() },
        };
        let bar = hacpo::progress::Progress::new(format!("eval {}", bench.name()), problems.len() as u64);
        let report = evaluate(&pretrained, bench.name(), problems, &opts, &mut |done| bar.set_position(done as u64))?;
        bar.finish();
        reports.push(report);
    }
    let k = args.samples;
    println!(
        "{:<12} {:>6} {:>10} {:>10} {:>10} {:>9}",
        "benchmark",
        "n",
        if k == 1 { "accuracy".to_string() } else { format!("avg@{k}") },
        format!("pass@{k}"),
        "mean len",
        "time s"
    );
    for r in &reports {
        println!(
            "{:<12} {:>6} {:>9.1}% {:>9.1}% {:>10.1} {:>9.1}",
            r.bench,
            r.problems,
            100.0 * r.accuracy,
            100.0 * r.pass_at_k,
            r.mean_response_tokens,
            r.seconds
        );
    }
    if let Some(path) = &args.out {
        let json = serde_json::json!({
            "model": args.model.model, "mode": args.mode, "samples": k, "temperature": args.temperature,
            "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "benchmarks": reports,
        });
        hacpo::error::write_atomic(path, serde_json::to_string_pretty(&json).expect("json").as_bytes())?;
        eprintln!("report written to {}", path.display());
    }
    Ok(())
}

/// The sampling flags, checked before anything loads (also for the search workload).
pub fn check_sampling(args: &EvalArgs) -> Result<()> {
    if args.samples == 0 || args.samples > 1024 {
        return Err(Error::InvalidArgument(format!("--samples must be between 1 and 1024, got {}", args.samples)));
    }
    if args.batch_size == 0 || args.batch_size > 4096 {
        return Err(Error::InvalidArgument(format!(
            "--batch-size must be between 1 and 4096, got {}",
            args.batch_size
        )));
    }
    hacpo::generate::SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: 0,
        max_new_tokens: args.max_new_tokens,
        seed: args.seed,
    }
    .validate()
    .map_err(|e| Error::InvalidArgument(format!("--{e}")))
}
