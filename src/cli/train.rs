//! `hacpo train`: collaborative RL (HACPO) and its baselines.

use std::path::PathBuf;

use clap::Args;
use hacpo::backend::DeviceSpec;
use hacpo::collab::Trainer;
use hacpo::config::{AgentConfig, Algo, TrainConfig};
use hacpo::{Error, Result};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo train                                  # the embedded default: configs/tiny-duo.toml on the CPU\n  \
    hacpo train --config configs/hacpo-math.toml\n  \
    hacpo train --agents qwen3-1.7b-base,qwen3-4b-base --algo hacpo --task math --out runs/size-pair\n  \
    hacpo train --config configs/hacpo-math.toml --set algo.hacpo.alpha=3 --set algo.hacpo.delta_step=0.01\n  \
    hacpo train --resume runs/size-pair\n\n\
    Algorithms: hacpo, gspo, grpo, gspo2x, naive. Ablations: --set algo.hacpo.capability_baseline=false\n\
    (also discrepancy_coef, exp_is, stepwise).")]
pub struct TrainArgs {
    /// A TOML config (see configs/); without --config and --agents, the embedded default
    /// (configs/tiny-duo.toml).
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
        // Agents without a config: the library defaults (math). Nothing at all: the embedded default.
        None if !args.agents.is_empty() => TrainConfig::from_toml("", "command line", &args.overrides)?,
        None => TrainConfig::from_toml(DEFAULT_CONFIG, "configs/tiny-duo.toml (embedded default)", &args.overrides)?,
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

/// `hacpo train` with no arguments: two tiny heterogeneous agents on generated arithmetic.
pub(crate) const DEFAULT_CONFIG: &str = include_str!("../../configs/tiny-duo.toml");

pub fn run(args: TrainArgs) -> Result<()> {
    let requested =
        if args.resume.is_none() || args.given() || args.steps.is_some() { Some(build_config(&args)?) } else { None };
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
        (None, None) => unreachable!("a config is built unless resuming"),
    };
    run_config(cfg, requested, args.resume.as_deref())
}

/// Trains `cfg` (a new run, or `resume` continuing a run whose config `requested` must match),
/// on the devices its agents name.
pub(crate) fn run_config(
    cfg: TrainConfig,
    requested: Option<TrainConfig>,
    resume: Option<&std::path::Path>,
) -> Result<()> {
    cfg.validate()?;
    let specs: Vec<DeviceSpec> = cfg.agents.iter().map(|a| DeviceSpec::parse(&a.device)).collect::<Result<_>>()?;
    hacpo::collab::trainer::check_agent_specs(&cfg)?;
    match specs[0] {
        DeviceSpec::Cpu => {
            if specs.iter().any(|s| *s != DeviceSpec::Cpu) {
                return Err(Error::InvalidArgument("all agents must use the same kind of device (cpu or cuda)".into()));
            }
            let devices = vec![Default::default(); cfg.agents.len()];
            train_on::<hacpo::backend::Cpu>(resume, cfg, requested, devices)
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
            train_on::<hacpo::backend::Cuda>(resume, cfg, requested, devices)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => unreachable!("DeviceSpec::parse rejects cuda without the feature"),
    }
}

/// Held-out accuracy of every agent, by name.
type Accuracies = std::collections::BTreeMap<String, f64>;

fn train_on<B: burn::tensor::backend::Backend>(
    resume: Option<&std::path::Path>,
    cfg: TrainConfig,
    requested: Option<TrainConfig>,
    devices: Vec<B::Device>,
) -> Result<()> {
    let started = std::time::Instant::now();
    hacpo::tiny::prepare_agents::<B>(&cfg, &devices[0])?;
    let task = hacpo::task::from_config(&cfg.task)?;
    let validating = !task.validation().is_empty();
    let mut trainer = match resume {
        Some(dir) => Trainer::<B>::resume(dir, requested, task, devices)?,
        None => Trainer::<B>::start(cfg, task, devices)?,
    };
    announce(&trainer);
    // Accuracy before training, kept in the run directory so a resumed run still reports it.
    let before_path = trainer.run_dir.join("before.json");
    let before: Option<Accuracies> = if trainer.step == 0 && validating {
        let acc = accuracies(&trainer)?;
        for (name, a) in &acc {
            eprintln!("  {name}: held-out accuracy before training {:.1}%", a * 100.0);
        }
        hacpo::error::write_atomic(&before_path, serde_json::to_string_pretty(&acc).expect("json").as_bytes())?;
        Some(acc)
    } else {
        std::fs::read_to_string(&before_path).ok().and_then(|t| serde_json::from_str(&t).ok())
    };
    let summary = trainer.run()?;
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
    if validating {
        // The last step validates when validation is on; otherwise measure now.
        let after: Accuracies = if summary.last.iter().all(|(_, m)| m.contains_key("val/accuracy")) {
            summary.last.iter().map(|(n, m)| (n.clone(), m["val/accuracy"])).collect()
        } else {
            accuracies(&trainer)?
        };
        let mut agents = serde_json::Map::new();
        for (name, a) in &after {
            let b = before.as_ref().and_then(|b| b.get(name)).copied();
            match b {
                Some(b) => println!(
                    "  {name}: held-out accuracy {:.1}% → {:.1}% ({:+.1} points)",
                    b * 100.0,
                    a * 100.0,
                    (a - b) * 100.0
                ),
                None => println!("  {name}: held-out accuracy {:.1}%", a * 100.0),
            }
            agents.insert(name.clone(), serde_json::json!({"before": b, "after": a}));
        }
        let out = serde_json::json!({
            "agents": agents,
            "steps": summary.steps,
            "wall_s": started.elapsed().as_secs_f64(),
            "train_wall_s": summary.wall_s,
        });
        let path = summary.run_dir.join("summary.json");
        hacpo::error::write_atomic(&path, serde_json::to_string_pretty(&out).expect("json").as_bytes())?;
        println!("summary: {}", path.display());
    }
    Ok(())
}

fn accuracies<B: burn::tensor::backend::Backend>(trainer: &Trainer<B>) -> Result<Accuracies> {
    (0..trainer.agents.len()).map(|k| Ok((trainer.agents[k].name.clone(), trainer.validate(k)?))).collect()
}
