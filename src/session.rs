//! One training session end to end, as `hacpo train` and `hacpo study` run it: pick the
//! backend the policies' devices name, make their models loadable (pre-training the tiny
//! agents if needed), measure held-out accuracy before training, train, and write the summary.

use std::path::Path;

use burn::tensor::backend::Backend;

use crate::backend::DeviceSpec;
use crate::cluster::nats::{JoinSettings, NatsBus};
use crate::cluster::{Bus, LocalBus};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::memory_plan::MemoryPlan;
use crate::run_dir::{AccuracyChange, RunDir, RunSummaryFile};
use crate::trainer::{Inputs, Trainer};

/// How a session treats its memory plan (`hacpo train --dry-run --device-memory
/// --skip-memory-check`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryCheck {
    /// Stands in for every device's free memory.
    pub device_memory: Option<u64>,
    /// Print the plan and stop: nothing loads, no backend is needed.
    pub dry_run: bool,
    /// Train even when the plan says it does not fit.
    pub skip: bool,
}

/// Trains `cfg` (a new run, or `resume` continuing a run whose config `requested` must match)
/// on the devices its policies name, after checking its memory plan. In a cluster run
/// (`[cluster]`), `host` names the policies this process trains.
pub fn train(
    cfg: TrainConfig,
    requested: Option<TrainConfig>,
    resume: Option<&Path>,
    memory: MemoryCheck,
    host: Option<&str>,
) -> Result<()> {
    cfg.validate()?;
    check_host(&cfg, host)?;
    // One warning per kind of device the run's policies are on.
    let mut warnings: Vec<String> =
        cfg.policies.iter().filter_map(|p| cfg.algo.compute_dtype.speed_warning(&p.device)).collect();
    if cfg.policies.iter().any(|p| {
        p.offload && crate::backend::DeviceSpec::parse_name(&p.device).ok() == Some(crate::backend::DeviceSpec::Cpu)
    }) {
        warnings.push(
            "note: offload on the CPU saves no memory (its host memory is its device's): the run is the same, with copies at every step".into(),
        );
    }
    warnings.sort();
    warnings.dedup();
    for w in warnings {
        eprintln!("{w}");
    }
    crate::resolve::check_known(&cfg)?;
    // A cluster process plans (and loads) only the policies its host trains.
    let hosted = cfg.hosted(host.unwrap_or_default())?;
    // A new run that does not fit gets the micro-batch and recomputation that make it fit (the
    // same update); a resumed run keeps its recorded settings, and the processes of a cluster
    // run share one config, which a per-host choice would break.
    let mut cfg = cfg;
    let mut plan = MemoryPlan::of(&cfg, memory.device_memory, &hosted)?;
    if resume.is_none()
        && cfg.cluster.is_none()
        && !memory.skip
        && let Some((fitted, fitted_plan, why)) = plan.fitted(&cfg)
    {
        eprintln!("note: {why}");
        (cfg, plan) = (fitted, fitted_plan);
    }
    if memory.dry_run {
        print!("{plan}");
        plan.check(&cfg)?;
        println!("dry run: the plan fits; nothing was loaded");
        return Ok(());
    }
    // Before anything loads: a new run never overwrites another's files, and a finished run
    // with no steps left is reported, not re-run (its summary stays as it is).
    match resume {
        None => RunDir::new(&cfg.run.out_dir).check_new()?,
        Some(dir) => {
            let run = RunDir::new(dir);
            run.check_layout()?;
            // What the command line asks of a resumed run applies or is refused, also when
            // nothing is left to train.
            TrainConfig::resumed(dir, run.read_config()?, requested.clone())?;
            if let Some(summary) = finished(&run, &cfg)? {
                print_finished(dir, &summary);
                return Ok(());
            }
        }
    }
    match plan.check(&cfg) {
        Ok(()) => eprint!("{plan}"),
        Err(e) if memory.skip => eprintln!("{plan}warning: --skip-memory-check: {e}"),
        Err(e) => return Err(e),
    }
    let specs: Vec<DeviceSpec> = cfg.policies.iter().map(|p| DeviceSpec::parse(&p.device)).collect::<Result<_>>()?;
    if specs.iter().any(|s| std::mem::discriminant(s) != std::mem::discriminant(&specs[0])) {
        return Err(Error::InvalidArgument("all policies must use the same kind of device (cpu or cuda)".into()));
    }
    // Joining checks the config against the run's and claims the host, before models load.
    let bus: Box<dyn Bus> = match (&cfg.cluster, host) {
        (Some(cluster), Some(host)) => Box::new(NatsBus::join(&JoinSettings {
            cluster,
            host,
            config: &cfg.shared_toml(),
            resume: resume.is_some(),
        })?),
        _ => Box::new(LocalBus::new()),
    };
    crate::with_backend!(specs[0], |B, _first| {
        let devices: Vec<_> = specs.iter().map(|&s| <B as crate::backend::DeviceOf>::device_of(s)).collect();
        train_on::<B>(resume, cfg, requested, devices, bus)
    })
}

/// `--host` goes with a `[cluster]` table, and names one of its hosts.
fn check_host(cfg: &TrainConfig, host: Option<&str>) -> Result<()> {
    match (&cfg.cluster, host) {
        (None, None) => Ok(()),
        (None, Some(h)) => Err(Error::InvalidArgument(format!(
            "--host {h}: the config has no [cluster] table; --host picks this process's policies in a run \
             spread over processes (docs/distributed.md)"
        ))),
        (Some(c), None) => {
            let names: Vec<&str> = c.hosts.iter().map(|h| h.name.as_str()).collect();
            Err(Error::InvalidArgument(format!(
                "the config's [cluster] spreads the run over hosts {}: pass --host NAME to say which this process is",
                names.join(", ")
            )))
        }
        (Some(c), Some(h)) => c.host(h).map(|_| ()).map_err(Error::InvalidArgument),
    }
}

/// The summary of the run in `run` when it has already trained every step `cfg` asks for and
/// its last checkpoint is intact (a damaged one is repaired by training its steps again, which
/// rewrites the summary with the same numbers). A finished run asked for more steps needs a
/// checkpoint to continue from.
fn finished(run: &RunDir, cfg: &TrainConfig) -> Result<Option<RunSummaryFile>> {
    let Some(summary) = run.read_summary() else { return Ok(None) };
    let (wanted, done) = (cfg.run.steps as u64, summary.steps);
    if wanted > 0 && wanted < done {
        return Err(Error::InvalidArgument(format!(
            "--steps {wanted} is below the {done} steps {} has completed; give at least {done}",
            run.path().display()
        )));
    }
    let newest = crate::train::checkpoint::resume_candidates(&run.checkpoints())
        .ok()
        .and_then(|(candidates, _)| candidates.into_iter().next())
        .and_then(|c| crate::train::checkpoint::load_state(&c).ok())
        .map(|s| s.step);
    match newest {
        Some(step) if step < done || wanted > done => Ok(None),
        None if wanted > done => Err(Error::InvalidArgument(format!(
            "{} finished {done} steps and holds no checkpoint to continue from, so it cannot train to step {wanted}; \
             start a new run with another --out",
            run.path().display()
        ))),
        _ => Ok(Some(summary)),
    }
}

fn print_finished(dir: &Path, summary: &RunSummaryFile) {
    println!(
        "{} already finished its {} steps; nothing to train (raise --steps to train further)",
        dir.display(),
        summary.steps
    );
    for (name, change) in &summary.agents {
        match change.before {
            Some(b) => println!("  {name}: held-out {:.1}% → {:.1}%", b * 100.0, change.after * 100.0),
            None => println!("  {name}: held-out {:.1}%", change.after * 100.0),
        }
    }
}

/// One line on what is about to run, so a log says which run and where it resumed.
fn announce<B: Backend>(t: &Trainer<B>) {
    let names: Vec<&str> = t.policies.iter().map(|p| p.name.as_str()).collect();
    let what = format!("{} with {}", t.algorithm_name(), names.join(", "));
    if t.step > 0 {
        eprintln!("resuming {} at step {} of {} ({what})", t.run.path().display(), t.step, t.total_steps);
    } else {
        eprintln!("training {what} for {} steps in {}", t.total_steps, t.run.path().display());
    }
}

fn train_on<B: Backend>(
    resume: Option<&Path>,
    cfg: TrainConfig,
    requested: Option<TrainConfig>,
    devices: Vec<B::Device>,
    bus: Box<dyn Bus>,
) -> Result<()> {
    let started = std::time::Instant::now();
    // The task first: a missing data file is said before the tiny agents pre-train.
    let task = cfg.task.build()?;
    crate::resolve::prepare::<B>(&cfg, &devices[0])?;
    let models = cfg.policies.iter().map(|p| crate::resolve::model_source(&p.model, &cfg)).collect::<Result<_>>()?;
    let inputs = Inputs { task, devices, models, bus };
    crate::train::interrupt::install();
    let mut trainer = match resume {
        Some(dir) => Trainer::<B>::resume(dir, requested, inputs)?,
        None => Trainer::<B>::start(cfg, inputs)?,
    };
    announce(&trainer);
    // The held-out score (accuracy; F1 for the search team) before training, kept in the run
    // directory so a resumed run still reports it.
    let key = trainer.validation_key();
    let label = crate::workload::validation_label(key);
    let before = if trainer.step == 0 && trainer.validates() {
        let acc = trainer.accuracies()?;
        for (name, a) in &acc {
            eprintln!("  {name}: held-out {label} before training {:.1}%", a * 100.0);
        }
        trainer.run.write_before(&acc)?;
        Some(acc)
    } else {
        trainer.run.read_before()
    };
    let summary = trainer.run()?;
    println!("trained {} steps in {:.1} s; run directory {}", summary.steps, summary.wall_s, summary.run_dir.display());
    for (name, m) in &summary.last {
        let get = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
        if !m.contains_key("actor/pg_loss") {
            // A frozen or idle role's policy (a sub-agent nobody delegated to).
            println!("  {name}: no samples to learn from in the last step");
            continue;
        }
        println!(
            "  {name}: score {:.3}  pg_loss {:.4}  grad_norm {:.3}",
            get("critic/score/mean"),
            get("actor/pg_loss"),
            get("actor/grad_norm"),
        );
    }
    if !trainer.validates() {
        return Ok(());
    }
    // The last step validates when validation is on; otherwise measure now.
    // (A resumed run that had trained every step but was stopped before its summary trains
    // none here: measure.)
    let after = if !summary.last.is_empty() && summary.last.iter().all(|(_, m)| m.contains_key(key)) {
        summary.last.iter().map(|(n, m)| (n.clone(), m[key])).collect()
    } else {
        trainer.accuracies()?
    };
    let mut agents = std::collections::BTreeMap::new();
    for (name, &a) in &after {
        let b = before.as_ref().and_then(|b| b.get(name)).copied();
        match b {
            Some(b) => println!(
                "  {name}: held-out {label} {:.1}% → {:.1}% ({:+.1} points)",
                b * 100.0,
                a * 100.0,
                (a - b) * 100.0
            ),
            None => println!("  {name}: held-out {label} {:.1}%", a * 100.0),
        }
        agents.insert(name.clone(), AccuracyChange { before: b, after: a });
    }
    trainer.run.write_summary(&RunSummaryFile {
        agents,
        steps: summary.steps,
        wall_s: started.elapsed().as_secs_f64(),
        train_wall_s: summary.wall_s,
    })?;
    println!("summary: {}", trainer.run.summary_path().display());
    Ok(())
}
