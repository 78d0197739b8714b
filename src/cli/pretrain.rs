//! `hacpo pretrain`: pre-train the tiny agents of a config from scratch.

use std::path::PathBuf;

use clap::Args;
use hacpo::Result;
use hacpo::backend::Cpu;
use hacpo::config::{EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, TrainConfig};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo pretrain --out /tmp/agents                 # the embedded default's tiny-qwen and tiny-llama\n  \
    hacpo pretrain --out models/tiny/pretrained      # refresh the agents shipped with the project\n  \
    hacpo pretrain --config configs/tiny-duo.toml --set pretrain.max_steps=200 --out /tmp/short\n\n\
    `hacpo train` installs the shipped agents or pre-trains on first use by itself; this command\n\
    reproduces them (on the CPU; bit for bit with the same build on the same kind of machine) or\n\
    makes variants.")]
pub struct PretrainArgs {
    /// A TOML config naming tiny agents (default: the embedded default, configs/tiny-duo.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override any config key: --set pretrain.max_steps=200 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Where the agents go, one directory `<id>-<key>` each (default: the cache, $HACPO_CACHE/tiny).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: PretrainArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(path) => TrainConfig::load(path, &args.overrides)?,
        None => TrainConfig::from_toml(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, &args.overrides)?,
    };
    cfg.validate()?;
    let out = args.out.unwrap_or_else(|| hacpo::cache::root().join("tiny"));
    for dir in hacpo::tiny::pretrain_agents::<Cpu>(&cfg, &out, &Default::default())? {
        println!("{}", dir.display());
    }
    Ok(())
}
