//! `hacpo train`: collaborative RL (HACPO) and its baselines.

use std::path::PathBuf;

use clap::Args;
use hacpo::config::{EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, PolicyConfig, TaskKind, TrainConfig};
use hacpo::run_dir::RunDir;
use hacpo::{Error, Result};

#[derive(Args, Debug)]
#[command(after_help = after_help())]
pub struct TrainArgs {
    /// A TOML config (see configs/); without --config and --agents, the embedded default
    /// (configs/tiny-duo.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Agents (zoo ids or paths), comma-separated; replaces the config's [[agents]].
    #[arg(long, value_delimiter = ',')]
    pub agents: Vec<String>,
    /// An algorithm of the registry (listed below).
    #[arg(long)]
    pub algo: Option<String>,
    /// The task: math, arith, qa or env.
    #[arg(long)]
    pub task: Option<String>,
    /// One device for all agents, or one per agent (cpu, cuda:0, …, wgpu).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Run directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Training steps (0: one pass over the training prompts).
    #[arg(long)]
    pub steps: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override any config key: --set algo.hacpo.alpha=2 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Continue the run in this directory from its last complete checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// In a run spread over processes (the config's [cluster]), the host this process is: it
    /// trains that host's policies (docs/distributed.md).
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Print the memory plan (per agent: weights, reference, gradients, optimizer,
    /// activations, KV cache) and stop, exit 2 when it does not fit; loads nothing and needs
    /// no GPU, also for cuda devices.
    #[arg(long)]
    pub dry_run: bool,
    /// The free memory of every device, e.g. 80GB (default: available RAM on the CPU,
    /// nvidia-smi's free memory on a GPU).
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<String>,
    /// Train even when the memory plan says the run does not fit.
    #[arg(long)]
    pub skip_memory_check: bool,
    /// Train LoRA adapters of this rank (α = 2 × rank, every projection) on every agent,
    /// the base weights frozen; per agent: an [agents.lora] table in the config.
    #[arg(long, value_name = "RANK")]
    pub lora: Option<usize>,
    /// Store every agent's frozen weights (a LoRA base, the KL reference) as bf16 or f16.
    /// Per agent: frozen_dtype under its [[agents]].
    #[arg(long, value_name = "DTYPE", value_parser = ["f32", "bf16", "f16"])]
    pub frozen_dtype: Option<String>,
    /// Run the matmuls in bf16 or f16 (mixed precision: f32 master weights, norms, softmax and
    /// optimizer; sampling reads a copy of the weights in that dtype). Same as
    /// --set algo.compute_dtype=DTYPE. bf16 needs CUDA or the CPU (wgpu has f16 only).
    #[arg(long, value_name = "DTYPE", value_parser = ["f32", "bf16", "f16"])]
    pub compute_dtype: Option<String>,
    /// Keep every agent's AdamW moments, summed gradients and KL reference in host memory
    /// between uses (the same update; copies at every step). Per agent: offload = true under
    /// its [[agents]]. The memory plan turns it on by itself where a GPU fits no other way.
    #[arg(long)]
    pub offload: bool,
}

impl TrainArgs {
    fn given(&self) -> bool {
        self.config.is_some()
            || !self.agents.is_empty()
            || !self.overrides.is_empty()
            || self.algo.is_some()
            || self.lora.is_some()
            || self.frozen_dtype.is_some()
            || self.compute_dtype.is_some()
            || self.offload
            || self.task.is_some()
            || self.seed.is_some()
            || !self.devices.is_empty()
    }
}

/// The examples, and the registry's algorithms by workload (read from the registry, so a new
/// algorithm is listed without touching this file).
fn after_help() -> String {
    format!(
        "Examples:\n  \
    hacpo train                                  # the embedded default: configs/tiny-duo.toml on the CPU\n  \
    hacpo train --config configs/hacpo-math.toml\n  \
    hacpo train --agents qwen3-1.7b-base,qwen3-4b-base --algo hacpo --task math --out runs/size-pair\n  \
    hacpo train --config configs/hacpo-math.toml --set algo.hacpo.alpha=3 --set algo.hacpo.delta_step=0.01\n  \
    hacpo train --resume runs/size-pair\n  \
    hacpo train --agents qwen-1.5b,llama-8b --devices cuda:0,cuda:1 --device-memory 80GB --dry-run\n  \
    hacpo train --lora 16                        # LoRA adapters (PEFT layout) instead of full fine-tuning\n  \
    hacpo train --agents llama-8b --lora 16 --frozen-dtype bf16 --set algo.gradient_checkpointing=true\n  \
    hacpo train --config trio.toml --host node-a  # this process's policies of a run spread over processes\n\n\
    HACPO's ablations: --set algo.hacpo.capability_baseline=false (also discrepancy_coef, exp_is, stepwise).\n\n\
    Algorithms (--algo), by the workload that trains them ([workload] kind):\n{}",
        hacpo::workload::algorithms_by_workload()
    )
}

/// The config the command line describes (file, then --set, then explicit flags).
fn build_config(args: &TrainArgs) -> Result<TrainConfig> {
    let mut cfg = match &args.config {
        Some(path) => TrainConfig::load(path, &args.overrides)?,
        // Continuing a run: its own config, with what the command line changes.
        None if args.resume.is_some() && args.agents.is_empty() => {
            RunDir::new(args.resume.as_ref().expect("checked")).read_config_with(&args.overrides)?
        }
        // Agents without a config: the library defaults (math). Nothing at all: the embedded default.
        None if !args.agents.is_empty() => TrainConfig::from_toml("", "command line", &args.overrides)?,
        None => TrainConfig::from_toml(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, &args.overrides)?,
    };
    if !args.agents.is_empty() {
        cfg.policies = args.agents.iter().map(PolicyConfig::new).collect();
    }
    if let Some(rank) = args.lora {
        let lora = hacpo::model::lora::LoraConfig { rank, alpha: 2.0 * rank as f64, ..Default::default() };
        cfg.policies.iter_mut().for_each(|p| p.lora = Some(lora.clone()));
    }
    if let Some(d) = &args.frozen_dtype {
        let dtype = hacpo::dtype::FrozenDtype::parse(d).expect("clap checked the value");
        cfg.policies.iter_mut().for_each(|p| p.frozen_dtype = dtype);
    }
    if args.offload {
        cfg.policies.iter_mut().for_each(|p| p.offload = true);
    }
    if let Some(d) = &args.compute_dtype {
        cfg.algo.compute_dtype = hacpo::dtype::ComputeDtype::parse(d).expect("clap checked the value");
    }
    if let Some(a) = &args.algo {
        hacpo::rl::registry::check(a)?;
        cfg.algo.name = a.clone();
    }
    if let Some(t) = &args.task {
        cfg.task.kind = TaskKind::parse(t)?;
    }
    match args.devices.len() {
        0 => {}
        1 => cfg.policies.iter_mut().for_each(|a| a.device = args.devices[0].clone()),
        n if n == cfg.policies.len() => {
            cfg.policies.iter_mut().zip(&args.devices).for_each(|(a, d)| a.device = d.clone())
        }
        n => {
            return Err(Error::InvalidArgument(format!(
                "--devices lists {n} devices for {} policies; give one or one per policy",
                cfg.policies.len()
            )));
        }
    }
    if let Some(o) = &args.out {
        cfg.run.out_dir = o.clone();
    }
    if let Some(s) = args.steps {
        cfg.run.steps = s;
    }
    if let Some(s) = args.seed {
        cfg.run.seed = s;
    }
    Ok(cfg)
}

pub fn run(args: TrainArgs) -> Result<()> {
    // Every value given with --resume applies or is refused: a run cannot move (--out).
    if let (Some(dir), Some(out)) = (&args.resume, &args.out)
        && !same_dir(dir, out)
    {
        return Err(Error::InvalidArgument(format!(
            "--out {} with --resume {}: a resumed run continues in its own directory; drop --out",
            out.display(),
            dir.display()
        )));
    }
    let requested =
        if args.resume.is_none() || args.given() || args.steps.is_some() { Some(build_config(&args)?) } else { None };
    let cfg = match (&args.resume, &requested) {
        (Some(dir), None) => RunDir::new(dir).read_config()?,
        (_, Some(c)) => c.clone(),
        (None, None) => unreachable!("a config is built unless resuming"),
    };
    let memory = hacpo::session::MemoryCheck {
        device_memory: args.device_memory.as_deref().map(hacpo::memory_plan::parse_size).transpose()?,
        dry_run: args.dry_run,
        skip: args.skip_memory_check,
    };
    hacpo::session::train(cfg, requested, args.resume.as_deref(), memory, args.host.as_deref())
}

/// Whether two paths name the same directory (as given, or once both exist, canonically).
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}
