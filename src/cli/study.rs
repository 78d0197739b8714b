//! `hacpo study`: HACPO against its baselines (and ablations) over several seeds, in sequence
//! and resumable, then one table of held-out accuracy per agent (mean ± std over seeds).

use std::path::{Path, PathBuf};

use clap::Args;
use hacpo::config::TrainConfig;
use hacpo::report::{self, AgentResult};
use hacpo::{Error, Result};

/// The HACPO mechanisms `--ablate` can switch off.
const ABLATIONS: &[&str] = &["capability_baseline", "discrepancy_coef", "exp_is", "stepwise"];

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

/// One cell of the matrix: a name and the overrides that make it.
struct Variant {
    name: String,
    overrides: Vec<String>,
}

fn variants(args: &StudyArgs) -> Result<Vec<Variant>> {
    let mut out = Vec::new();
    for a in &args.algos {
        hacpo::config::Algo::parse(a)?;
        out.push(Variant { name: a.clone(), overrides: vec![format!("algo.name={a:?}")] });
    }
    for m in &args.ablate {
        if !ABLATIONS.contains(&m.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "unknown mechanism {m:?} for --ablate; available: {}",
                ABLATIONS.join(", ")
            )));
        }
        out.push(Variant {
            name: format!("hacpo-no-{m}"),
            overrides: vec!["algo.name=\"hacpo\"".into(), format!("algo.hacpo.{m}=false")],
        });
    }
    if out.is_empty() {
        return Err(Error::InvalidArgument("nothing to compare: give --algos and/or --ablate".into()));
    }
    Ok(out)
}

fn config_for(args: &StudyArgs, variant: &Variant, seed: u64, dir: &Path) -> Result<TrainConfig> {
    let mut overrides = args.overrides.clone();
    overrides.extend(variant.overrides.iter().cloned());
    overrides.push(format!("run.seed={seed}"));
    if let Some(s) = args.steps {
        overrides.push(format!("run.steps={s}"));
    }
    let mut cfg = match &args.config {
        Some(p) => TrainConfig::load(p, &overrides)?,
        None => TrainConfig::from_toml(
            super::train::DEFAULT_CONFIG,
            "configs/tiny-duo.toml (embedded default)",
            &overrides,
        )?,
    };
    cfg.run.out_dir = dir.to_path_buf();
    Ok(cfg)
}

pub fn run(args: StudyArgs) -> Result<()> {
    if args.seeds == 0 {
        return Err(Error::InvalidArgument("--seeds must be at least 1".into()));
    }
    let variants = variants(&args)?;
    // Check every config before the first (long) run starts.
    let mut plan = Vec::new();
    for v in &variants {
        for seed in 0..args.seeds {
            let dir = args.out.join(&v.name).join(format!("seed-{seed}"));
            let cfg = config_for(&args, v, seed, &dir)?;
            cfg.validate()?;
            check_existing(&dir, &cfg)?;
            plan.push((v.name.clone(), seed, dir, cfg));
        }
    }
    let total = plan.len();
    for (i, (name, seed, dir, cfg)) in plan.iter().enumerate() {
        let label = format!("[{}/{total}] {name} seed {seed}", i + 1);
        if dir.join("summary.json").exists() {
            eprintln!("{label}: done, skipping ({})", dir.display());
            continue;
        }
        let started = hacpo::train::checkpoint::latest(dir)?.is_some();
        eprintln!("{label}: {} {}", if started { "resuming" } else { "training" }, dir.display());
        let resume = started.then_some(dir.as_path());
        super::train::run_config(cfg.clone(), Some(cfg.clone()), resume)?;
    }

    // Aggregate.
    let mut rows: Vec<(String, u64, AgentResult)> = Vec::new();
    let mut reports: Vec<Vec<report::RunReport>> = variants.iter().map(|_| Vec::new()).collect();
    for (name, seed, dir, _) in &plan {
        let run = report::read(dir)?;
        for a in &run.agents {
            rows.push((name.clone(), *seed, a.clone()));
        }
        let i = variants.iter().position(|v| &v.name == name).expect("planned variant");
        reports[i].push(run);
    }
    let table = markdown(&variants, &rows, args.seeds);
    let csv = results_csv(&rows);
    std::fs::create_dir_all(&args.out).map_err(|e| Error::io("create", &args.out, e))?;
    hacpo::error::write_atomic(&args.out.join("results.csv"), csv.as_bytes())?;
    hacpo::error::write_atomic(&args.out.join("results.md"), table.as_bytes())?;
    let figure_variants: Vec<report::figures::Variant> = variants
        .iter()
        .zip(&reports)
        .map(|(v, runs)| report::figures::Variant { name: v.name.clone(), runs })
        .collect();
    let figures = report::figures::write(&args.out, &figure_variants)?;
    print!("{table}");
    eprintln!("wrote {}, {}", args.out.join("results.csv").display(), args.out.join("results.md").display());
    for f in figures {
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}

/// A run already in the study directory must have been made with the settings planned for it:
/// otherwise skipping (or resuming) it would mix another experiment into the table.
fn check_existing(dir: &Path, cfg: &TrainConfig) -> Result<()> {
    let saved_path = dir.join("config.toml");
    if !saved_path.exists() {
        return Ok(());
    }
    let saved = TrainConfig::load(&saved_path, &[])?;
    let mut diff = saved.differences(cfg);
    if dir.join("summary.json").exists() && saved.run.steps != cfg.run.steps {
        diff.push(format!("run.steps: {} → {}", saved.run.steps, cfg.run.steps));
    }
    if diff.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{} was trained with other settings ({}); give the study another --out, or delete that run to redo it",
        dir.display(),
        diff.join(", ")
    )))
}

fn results_csv(rows: &[(String, u64, AgentResult)]) -> String {
    let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
    let mut s = String::from("variant,seed,agent,before,after,final_reward,rollouts\n");
    for (v, seed, a) in rows {
        s += &format!(
            "{v},{seed},{},{},{},{},{}\n",
            a.agent,
            opt(a.before),
            opt(a.after),
            opt(a.final_reward),
            a.rollouts
        );
    }
    s
}

fn markdown(variants: &[Variant], rows: &[(String, u64, AgentResult)], seeds: u64) -> String {
    let mut agents: Vec<String> = Vec::new();
    for (_, _, a) in rows {
        if !agents.contains(&a.agent) {
            agents.push(a.agent.clone());
        }
    }
    let mut s = format!(
        "Held-out accuracy after training, mean ± std over {seeds} seed(s) (before training in brackets); rollouts = own rollouts per agent.\n\n| variant |"
    );
    for a in &agents {
        s += &format!(" {a} |");
    }
    s += " rollouts/agent |\n|---|";
    for _ in &agents {
        s += "---|";
    }
    s += "---|\n";
    for v in variants {
        s += &format!("| {} |", v.name);
        let mut rollouts = 0;
        for a in &agents {
            let mine: Vec<&AgentResult> =
                rows.iter().filter(|(n, _, r)| n == &v.name && &r.agent == a).map(|(_, _, r)| r).collect();
            let after: Vec<f64> = mine.iter().filter_map(|r| r.after).collect();
            let before: Vec<f64> = mine.iter().filter_map(|r| r.before).collect();
            rollouts = mine.first().map(|r| r.rollouts).unwrap_or(0);
            let Some((m, sd)) = report::mean_std(&after) else {
                s += " – |";
                continue;
            };
            let b = report::mean_std(&before).map(|(b, _)| format!(" ({:.1})", b * 100.0)).unwrap_or_default();
            s += &format!(" {:.1} ± {:.1}{b} |", m * 100.0, sd * 100.0);
        }
        s += &format!(" {rollouts} |\n");
    }
    s
}
