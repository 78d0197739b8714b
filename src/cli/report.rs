//! `hacpo report RUN_DIR`: the held-out accuracy table, the per-step curves and the figures of a run.

use std::path::PathBuf;

use clap::Args;
use hacpo::Result;

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  hacpo report runs/tiny-duo      # prints the table; writes report.md, results.csv, curves.csv and PNG figures\n  (reward.png, heldout.png, accuracy.png, capability.png)"
)]
pub struct ReportArgs {
    /// A run directory written by `hacpo train`.
    pub run: PathBuf,
}

pub fn run(args: ReportArgs) -> Result<()> {
    let report = hacpo::report::read(&args.run)?;
    print!("{}", report.markdown());
    for p in report.write()? {
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
