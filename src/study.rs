//! A study: algorithms against each other (and HACPO ablations) over several seeds, in
//! sequence (each run a `hacpo train` process of its own) and resumable, then one table of
//! held-out accuracy per policy (mean ± std over seeds), a CSV and figures. `hacpo study` is
//! its command line.

use std::path::{Path, PathBuf};

use crate::config::{EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, TrainConfig};
use crate::error::{Error, Result};
use crate::report::{self, AgentResult};
use crate::run_dir::RunDir;

/// The HACPO mechanisms `--ablate` can switch off.
const ABLATIONS: &[&str] = &["capability_baseline", "discrepancy_coef", "exp_is", "stepwise"];

/// What a study compares, and where.
#[derive(Clone, Debug)]
pub struct StudyOptions {
    /// A TOML config (`None`: the embedded default).
    pub config: Option<PathBuf>,
    /// Algorithm registry names.
    pub algos: Vec<String>,
    /// Seeds per variant (0..N).
    pub seeds: u64,
    /// HACPO mechanisms to switch off, one variant each.
    pub ablate: Vec<String>,
    /// Study directory.
    pub out: PathBuf,
    /// Training steps per run (`None`: the config's).
    pub steps: Option<usize>,
    /// `--set` overrides applied to every run.
    pub overrides: Vec<String>,
}

/// One cell of the matrix: a name and the overrides that make it.
struct Variant {
    name: String,
    overrides: Vec<String>,
    /// Each role of a multi-agent workload gets its own copy of the config's one policy.
    per_role: bool,
}

/// An `--algos` name: a registered algorithm, or one with `-shared` (one policy plays every
/// role, as the config has it) or `-per-role` (a copy of the policy per role).
fn variant(a: &str) -> Result<Variant> {
    let (algo, per_role) = match (a.strip_suffix("-per-role"), a.strip_suffix("-shared")) {
        _ if crate::rl::registry::names().contains(&a) => (a, false),
        (Some(stem), _) => (stem, true),
        (_, Some(stem)) => (stem, false),
        _ => (a, false),
    };
    crate::rl::registry::check(algo).map_err(|e| {
        Error::InvalidArgument(format!("{e} (a name may end in -shared or -per-role for multi-agent workloads)"))
    })?;
    Ok(Variant { name: a.to_string(), overrides: vec![format!("algo.name={algo:?}")], per_role })
}

/// `cfg` with its one policy copied once per role of its workload, each copy playing its role.
fn split_roles(mut cfg: TrainConfig) -> Result<TrainConfig> {
    let roles = crate::workload::role_names(cfg.workload.kind, &cfg.algo.name);
    let bad = |m: String| Err(Error::InvalidArgument(format!("a -per-role variant {m}")));
    if roles.len() < 2 {
        return bad(format!("needs a workload with two roles or more; {} has {}", cfg.algo.name, roles.len()));
    }
    if cfg.policies.len() != 1 || !cfg.roles.is_empty() {
        return bad("copies the config's one policy for each role: give one [[policies]] entry and no [[roles]]".into());
    }
    let base = cfg.policy_name(0);
    let policy = cfg.policies.remove(0);
    for role in roles {
        let name = format!("{base}-{role}");
        cfg.policies.push(crate::config::PolicyConfig { name: Some(name.clone()), ..policy.clone() });
        cfg.roles.push(crate::config::RoleConfig { name: role.to_string(), policies: vec![name], template: None });
    }
    Ok(cfg)
}

fn variants(args: &StudyOptions) -> Result<Vec<Variant>> {
    let mut out = Vec::new();
    for a in &args.algos {
        out.push(variant(a)?);
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
            per_role: false,
        });
    }
    if out.is_empty() {
        return Err(Error::InvalidArgument("nothing to compare: give --algos and/or --ablate".into()));
    }
    Ok(out)
}

fn config_for(args: &StudyOptions, variant: &Variant, seed: u64, dir: &Path) -> Result<TrainConfig> {
    let mut overrides = args.overrides.clone();
    overrides.extend(variant.overrides.iter().cloned());
    overrides.push(format!("run.seed={seed}"));
    if let Some(s) = args.steps {
        overrides.push(format!("run.steps={s}"));
    }
    let mut cfg = match &args.config {
        Some(p) => TrainConfig::load(p, &overrides)?,
        None => TrainConfig::from_toml(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, &overrides)?,
    };
    cfg.run.out_dir = dir.to_path_buf();
    if variant.per_role {
        cfg = split_roles(cfg)?;
    } else if variant.name.ends_with("-shared") && (cfg.policies.len() != 1 || !cfg.roles.is_empty()) {
        return Err(Error::InvalidArgument(format!(
            "{}: a -shared variant has one policy play every role; the config has {} [[policies]] and {} [[roles]]",
            variant.name,
            cfg.policies.len(),
            cfg.roles.len()
        )));
    }
    Ok(cfg)
}

/// Runs (or continues) the study and writes its table, CSV and figures.
pub fn run(args: &StudyOptions) -> Result<()> {
    if args.seeds == 0 || args.seeds > 1000 {
        return Err(Error::InvalidArgument(format!("--seeds must be between 1 and 1000, got {}", args.seeds)));
    }
    if args.out.exists() && !args.out.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "--out {} is a file; give the study a directory (it holds a run per variant and seed)",
            args.out.display()
        )));
    }
    let variants = variants(args)?;
    // Check every config before the first (long) run starts.
    let mut plan = Vec::new();
    for v in &variants {
        for seed in 0..args.seeds {
            let dir = args.out.join(&v.name).join(format!("seed-{seed}"));
            let cfg = config_for(args, v, seed, &dir)?;
            cfg.validate()?;
            check_existing(&dir, &cfg)?;
            plan.push((v.name.clone(), seed, dir, cfg));
        }
    }
    let total = plan.len();
    for (i, (name, seed, dir, cfg)) in plan.iter().enumerate() {
        let label = format!("[{}/{total}] {name} seed {seed}", i + 1);
        let run = RunDir::new(dir);
        if run.is_finished() {
            eprintln!("{label}: done, skipping ({})", dir.display());
            continue;
        }
        // A run that wrote its config is continued (from step 0 if it has no checkpoint yet):
        // a new run would be refused there.
        let started = run.has_config();
        eprintln!("{label}: {} {}", if started { "resuming" } else { "training" }, dir.display());
        train_in_child(&args.out, name, *seed, dir, cfg, started)?;
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
    // The search team is judged by its answers' F1; the other workloads by accuracy.
    let metric = match plan.first().map(|(_, _, _, cfg)| cfg.workload.kind) {
        Some(crate::workload::WorkloadKind::Search) => "F1",
        Some(crate::workload::WorkloadKind::Turns) => "success rate",
        _ => "accuracy",
    };
    let table = markdown(&variants, &rows, args.seeds, metric);
    let csv = results_csv(&rows);
    std::fs::create_dir_all(&args.out).map_err(|e| Error::io("create", &args.out, e))?;
    crate::error::write_atomic(&args.out.join("results.csv"), csv.as_bytes())?;
    crate::error::write_atomic(&args.out.join("results.md"), table.as_bytes())?;
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

/// Trains one run of the study in a `hacpo train` process of its own, so that each run's
/// peak memory (`perf/peak_rss_gb`) and speed are its own, not left over from the run before
/// (the allocator keeps freed memory for reuse). The planned config goes to
/// This program's path for the runs. When the binary was replaced while the study ran (a
/// rebuild or an upgrade: Linux then names the old one `PATH (deleted)`), the runs go on with
/// the binary now at that path rather than stopping the study.
fn own_executable() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| Error::io("locate", Path::new("hacpo"), e))?;
    let replaced = exe.to_str().and_then(|p| p.strip_suffix(" (deleted)")).map(PathBuf::from);
    match replaced {
        Some(now) if now.is_file() => {
            eprintln!("note: {} was replaced while the study ran; the next runs use the new binary", now.display());
            Ok(now)
        }
        _ => Ok(exe),
    }
}

/// `OUT/plans/<variant>-seed-<seed>.toml`; a started run is resumed with it.
fn train_in_child(out: &Path, name: &str, seed: u64, dir: &Path, cfg: &TrainConfig, started: bool) -> Result<()> {
    let plans = out.join("plans");
    std::fs::create_dir_all(&plans).map_err(|e| Error::io("create", &plans, e))?;
    let plan = plans.join(format!("{name}-seed-{seed}.toml"));
    crate::error::write_atomic(&plan, cfg.to_toml().as_bytes())?;
    let exe = match std::env::var_os("HACPO_BIN") {
        Some(p) => PathBuf::from(p),
        None => own_executable()?,
    };
    let mut command = std::process::Command::new(&exe);
    command.arg("train").arg("--config").arg(&plan);
    if started {
        command.arg("--resume").arg(dir);
    }
    let status = command.status().map_err(|e| Error::io("run", &exe, e))?;
    if !status.success() {
        let code = status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"));
        let message = format!(
            "the run {} stopped ({code}; its messages are above); run the same `hacpo study` again to continue",
            dir.display()
        );
        // The run's own kind of failure: a user error stays exit 2, anything else is not one.
        return Err(if status.code() == Some(2) { Error::InvalidArgument(message) } else { Error::Internal(message) });
    }
    Ok(())
}

/// A run already in the study directory must have been made with the settings planned for it:
/// otherwise skipping (or resuming) it would mix another experiment into the table.
fn check_existing(dir: &Path, cfg: &TrainConfig) -> Result<()> {
    let run = RunDir::new(dir);
    if !run.has_config() {
        return Ok(());
    }
    let saved = run.read_config()?;
    let mut diff = saved.differences(cfg);
    if run.is_finished() && saved.run.steps != cfg.run.steps {
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
    let mut s = String::from("variant,seed,agent,before,after,final_reward,rollouts,step_s,peak_rss_gb\n");
    for (v, seed, a) in rows {
        s += &format!(
            "{v},{seed},{},{},{},{},{},{},{}\n",
            a.agent,
            opt(a.before),
            opt(a.after),
            opt(a.final_reward),
            a.rollouts,
            opt(a.step_s),
            opt(a.peak_rss_gb)
        );
    }
    s
}

fn markdown(variants: &[Variant], rows: &[(String, u64, AgentResult)], seeds: u64, metric: &str) -> String {
    let mut agents: Vec<String> = Vec::new();
    for (_, _, a) in rows {
        if !agents.contains(&a.agent) {
            agents.push(a.agent.clone());
        }
    }
    let mut s = format!(
        "Held-out {metric} after training, mean ± std over {seeds} seed(s) (before training in brackets); \
         rollouts = own rollouts per agent (a search team: all roles' outputs), s/step and peak GB (the training process's peak resident \
         memory) are means over seeds.\n\n| variant |"
    );
    for a in &agents {
        s += &format!(" {a} |");
    }
    s += " rollouts/agent | s/step | peak GB |\n|---|";
    for _ in &agents {
        s += "---|";
    }
    s += "---|---|---|\n";
    for v in variants {
        s += &format!("| {} |", v.name);
        let mut rollouts = 0;
        let runs: Vec<&AgentResult> = rows.iter().filter(|(n, _, _)| n == &v.name).map(|(_, _, r)| r).collect();
        let step_s: Vec<f64> = runs.iter().filter_map(|r| r.step_s).collect();
        let peak: Vec<f64> = runs.iter().filter_map(|r| r.peak_rss_gb).collect();
        for a in &agents {
            let mine: Vec<&AgentResult> =
                rows.iter().filter(|(n, _, r)| n == &v.name && &r.agent == a).map(|(_, _, r)| r).collect();
            let after: Vec<f64> = mine.iter().filter_map(|r| r.after).collect();
            let before: Vec<f64> = mine.iter().filter_map(|r| r.before).collect();
            // The columns of agents a variant does not have must not reset it to 0. Seeds
            // differ where rollouts depend on the samples (a search team's sub-query count).
            if !mine.is_empty() {
                rollouts = (mine.iter().map(|r| r.rollouts as f64).sum::<f64>() / mine.len() as f64).round() as u64;
            }
            let Some((m, sd)) = report::mean_std(&after) else {
                s += " – |";
                continue;
            };
            let b = report::mean_std(&before).map(|(b, _)| format!(" ({:.1})", b * 100.0)).unwrap_or_default();
            s += &format!(" {:.1} ± {:.1}{b} |", m * 100.0, sd * 100.0);
        }
        let step_s = report::mean_std(&step_s).map(|(m, _)| format!("{m:.1}")).unwrap_or_else(|| "–".into());
        let peak = report::mean_std(&peak).map(|(m, _)| format!("{m:.2}")).unwrap_or_else(|| "–".into());
        s += &format!(" {rollouts} | {step_s} | {peak} |\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PolicyConfig;
    use crate::workload::WorkloadKind;

    fn turns_config(algo: &str) -> TrainConfig {
        let mut cfg = TrainConfig {
            policies: vec![PolicyConfig { name: Some("tiny".into()), ..PolicyConfig::new("tiny-planner") }],
            ..Default::default()
        };
        cfg.workload.kind = WorkloadKind::Turns;
        cfg.algo.name = algo.into();
        cfg
    }

    #[test]
    fn per_role_variants_copy_the_one_policy_for_each_role() {
        let v = variant("atgrpo-per-role").unwrap();
        assert!(v.per_role && v.overrides == ["algo.name=\"atgrpo\""] && v.name == "atgrpo-per-role");
        let v = variant("atgrpo-shared").unwrap();
        assert!(!v.per_role && v.overrides == ["algo.name=\"atgrpo\""]);
        assert!(!variant("mas-grpo").unwrap().per_role);
        assert!(variant("chess-per-role").err().unwrap().to_string().contains("-per-role"));

        let split = split_roles(turns_config("atgrpo")).unwrap();
        let names: Vec<String> = (0..split.policies.len()).map(|k| split.policy_name(k)).collect();
        assert_eq!(names, ["tiny-tool", "tiny-plan"]);
        assert_eq!(split.policies[1].model, "tiny-planner");
        let roles: Vec<(&str, &[String])> = split.roles.iter().map(|r| (r.name.as_str(), &r.policies[..])).collect();
        assert_eq!(roles, [("tool", &["tiny-tool".to_string()][..]), ("plan", &["tiny-plan".to_string()][..])]);

        assert!(split_roles(turns_config("single-grpo")).unwrap_err().to_string().contains("two roles"));
        assert!(split_roles(split).unwrap_err().to_string().contains("one [[policies]] entry"));
    }

    /// A shared variant's row keeps its rollouts though a per-role variant adds agent columns
    /// it has no value in.
    #[test]
    fn the_table_counts_a_variants_rollouts_whatever_columns_other_variants_add() {
        let result = |agent: &str, rollouts: u64| AgentResult {
            agent: agent.into(),
            before: Some(0.4),
            after: Some(0.3),
            final_reward: None,
            rollouts,
            step_s: Some(1.0),
            peak_rss_gb: None,
        };
        let variants = [variant("atgrpo-shared").unwrap(), variant("atgrpo-per-role").unwrap()];
        let rows = vec![
            ("atgrpo-shared".to_string(), 0, result("tiny", 960)),
            ("atgrpo-shared".to_string(), 1, result("tiny", 1001)),
            ("atgrpo-per-role".to_string(), 0, result("tiny-tool", 480)),
            ("atgrpo-per-role".to_string(), 0, result("tiny-plan", 480)),
        ];
        let table = markdown(&variants, &rows, 2, "success rate");
        // The rollouts are the mean over the seeds, not the first seed's.
        let shared = table.lines().find(|l| l.starts_with("| atgrpo-shared |")).unwrap();
        assert!(shared.contains("| 30.0 ± 0.0 (40.0) | – | – | 981 |"), "{table}");
        assert!(table.contains("Held-out success rate"), "{table}");
    }
}
