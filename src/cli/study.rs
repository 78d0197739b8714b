//! `hacpo study`: HACPO against its baselines (and ablations) over several seeds (the study
//! runner is `hacpo::study`).

use std::path::PathBuf;

use clap::Args;
use hacpo::Result;
use hacpo::study::StudyOptions;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo study --algos hacpo,gspo,naive --seeds 3             # on the embedded default (tiny-duo)\n  \
    hacpo study --config configs/tiny-duo.toml --algos hacpo --ablate exp_is,stepwise --seeds 2\n\n\
    Runs go to OUT/<variant>/seed-<n>; finished runs are skipped and interrupted ones resumed, so\n\
    re-running the same command continues the study.")]
pub struct StudyArgs {
    /// A TOML config (default: the embedded configs/tiny-duo.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Algorithms to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = ["hacpo".to_string(), "gspo".to_string(), "naive".to_string()])]
    pub algos: Vec<String>,
    /// Seeds per variant (0..N).
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// HACPO variants with one mechanism off each: capability_baseline, discrepancy_coef, exp_is, stepwise.
    #[arg(long, value_delimiter = ',')]
    pub ablate: Vec<String>,
    /// Study directory.
    #[arg(long, default_value = "runs/study")]
    pub out: PathBuf,
    /// Training steps per run (default: the config's).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Override any config key in every run (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

pub fn run(args: StudyArgs) -> Result<()> {
    hacpo::study::run(&StudyOptions {
        config: args.config,
        algos: args.algos,
        seeds: args.seeds,
        ablate: args.ablate,
        out: args.out,
        steps: args.steps,
        overrides: args.overrides,
    })
}
