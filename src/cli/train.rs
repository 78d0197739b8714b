//! `hacpo train`: collaborative RL (HACPO) and its baselines.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use hacpo::backend::DeviceSpec;
use hacpo::collab::Trainer;
use hacpo::config::{AgentConfig, Algo, TrainConfig};
use hacpo::task::MathTask;
use hacpo::{Error, Result};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo train --config configs/hacpo-math.toml\n  \
    hacpo train --agents qwen3-1.7b-base,qwen3-4b-base --algo hacpo --task math --out runs/size-pair\n  \
    hacpo train --config configs/hacpo-math.toml --set algo.hacpo.alpha=3 --set algo.hacpo.delta_step=0.01\n  \
    hacpo train --resume runs/size-pair\n\n\
    Algorithms: hacpo, gspo, grpo, gspo2x, naive. Ablations: --set algo.hacpo.capability_baseline=false\n\
    (also discrepancy_coef, exp_is, stepwise).")]
pub struct TrainArgs {
    /// A TOML config (see configs/).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Agents (zoo ids or paths), comma-separated; replaces the config's [[agents]].
    #[arg(long, value_delimiter = ',')]
    pub agents: Vec<String>,
    /// hacpo, gspo, grpo, gspo2x or naive.
    #[arg(long)]
    pub algo: Option<String>,
    /// The task (math).
    #[arg(long)]
    pub task: Option<String>,
    /// One device for all agents, or one per agent (cpu, cuda:0, …).
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
}

impl TrainArgs {
    fn given(&self) -> bool {
        self.config.is_some() || !self.agents.is_empty() || !self.overrides.is_empty() || self.algo.is_some()
    }
}

/// The config the command line describes (file, then --set, then explicit flags).
fn build_config(args: &TrainArgs) -> Result<TrainConfig> {
    let mut cfg = match &args.config {
        Some(path) => TrainConfig::load(path, &args.overrides)?,
        None => TrainConfig::from_toml("", "command line", &args.overrides)?,
    };
    if !args.agents.is_empty() {
        cfg.agents = args
            .agents
            .iter()
            .map(|m| AgentConfig {
                model: m.clone(),
                name: None,
                device: "cpu".into(),
                chat_template_kwargs: Default::default(),
            })
            .collect();
    }
    if let Some(a) = &args.algo {
        cfg.algo.name = Algo::parse(a)?;
    }
    if let Some(t) = &args.task {
        cfg.task.kind = t.clone();
    }
    match args.devices.len() {
        0 => {}
        1 => cfg.agents.iter_mut().for_each(|a| a.device = args.devices[0].clone()),
        n if n == cfg.agents.len() => cfg.agents.iter_mut().zip(&args.devices).for_each(|(a, d)| a.device = d.clone()),
        n => {
            return Err(Error::InvalidArgument(format!(
                "--devices lists {n} devices for {} agents; give one or one per agent",
                cfg.agents.len()
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

/// One line on what is about to run, so a log says which run and where it resumed.
fn announce<B: burn::tensor::backend::Backend>(t: &Trainer<B>) {
    let names: Vec<&str> = t.agents.iter().map(|a| a.name.as_str()).collect();
    let what = format!("{} with {}", format!("{:?}", t.config.algo.name).to_lowercase(), names.join(", "));
    if t.step > 0 {
        eprintln!("resuming {} at step {} of {} ({what})", t.run_dir.display(), t.step, t.total_steps);
    } else {
        eprintln!("training {what} for {} steps in {}", t.total_steps, t.run_dir.display());
    }
}

pub fn run(args: TrainArgs) -> Result<()> {
    if args.resume.is_none() && !args.given() {
        return Err(Error::InvalidArgument(
            "nothing to train: pass --config FILE (e.g. configs/hacpo-math.toml) or --agents A,B; see `hacpo train --help`".into(),
        ));
    }
    let requested = if args.given() || args.steps.is_some() { Some(build_config(&args)?) } else { None };
    let cfg = match (&args.resume, &requested) {
        (Some(dir), None) => TrainConfig::load(&dir.join("config.toml"), &[]).map_err(|e| match e {
            Error::NotFound { path, .. } => Error::NotFound {
                what: "run to resume".into(),
                path,
                hint: "--resume takes a run directory written by `hacpo train` (it holds config.toml).".into(),
            },
            other => other,
        })?,
        (_, Some(c)) => c.clone(),
        (None, None) => unreachable!("checked above"),
    };
    cfg.validate()?;
    let specs: Vec<DeviceSpec> = cfg.agents.iter().map(|a| DeviceSpec::parse(&a.device)).collect::<Result<_>>()?;
    hacpo::collab::trainer::check_agent_specs(&cfg)?;
    let task = Arc::new(MathTask::from_config(&cfg.task)?);
    let summary = match specs[0] {
        DeviceSpec::Cpu => {
            if specs.iter().any(|s| *s != DeviceSpec::Cpu) {
                return Err(Error::InvalidArgument("all agents must use the same kind of device (cpu or cuda)".into()));
            }
            let devices = vec![Default::default(); cfg.agents.len()];
            let mut trainer = match &args.resume {
                Some(dir) => Trainer::<hacpo::backend::Cpu>::resume(dir, requested, task, devices)?,
                None => Trainer::<hacpo::backend::Cpu>::start(cfg, task, devices)?,
            };
            announce(&trainer);
            trainer.run()?
        }
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(_) => {
            let devices = specs
                .iter()
                .map(|s| match s {
                    DeviceSpec::Cuda(i) => Ok(burn::backend::cuda::CudaDevice::new(*i)),
                    DeviceSpec::Cpu => {
                        Err(Error::InvalidArgument("all agents must use the same kind of device (cpu or cuda)".into()))
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let mut trainer = match &args.resume {
                Some(dir) => Trainer::<hacpo::backend::Cuda>::resume(dir, requested, task, devices)?,
                None => Trainer::<hacpo::backend::Cuda>::start(cfg, task, devices)?,
            };
            announce(&trainer);
            trainer.run()?
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => unreachable!("DeviceSpec::parse rejects cuda without the feature"),
    };
    println!("trained {} steps in {:.1} s; run directory {}", summary.steps, summary.wall_s, summary.run_dir.display());
    for (name, m) in &summary.last {
        let get = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
        println!(
            "  {name}: score {:.3}  pg_loss {:.4}  grad_norm {:.3}  capability {:.3}",
            get("critic/score/mean"),
            get("actor/pg_loss"),
            get("actor/grad_norm"),
            get("hacpo/capability")
        );
    }
    Ok(())
}
