//! A run directory and everything in it, for the trainer, `hacpo report`, `hacpo study` and
//! the tests: one place that knows the file names and how each file is read and written.
//!
//! ```text
//! RUN_DIR/config.toml        the resolved config (what --resume continues)
//! RUN_DIR/metrics.jsonl      one line per step and policy (+ TensorBoard events if asked)
//! RUN_DIR/before.json        held-out accuracy per policy before training
//! RUN_DIR/summary.json       held-out accuracy before/after, steps, wall time (a finished run)
//! RUN_DIR/checkpoints/       step-NNNNNN/ in Hugging Face layout, `latest`
//! RUN_DIR/batches/           audit dumps (run.dump_batches)
//! RUN_DIR/rollouts/          every step's samples (run.dump_rollouts)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::error::{Error, Result, write_atomic};

/// What a run writes into its directory (besides the `.lock`): files, then folders.
const RUN_FILES: [&str; 4] = ["config.toml", "metrics.jsonl", "before.json", "summary.json"];
const RUN_FOLDERS: [&str; 4] = ["checkpoints", "batches", "rollouts", "tb"];

/// Held-out accuracy of every policy, by name.
pub type Accuracies = BTreeMap<String, f64>;

/// One policy's line of `summary.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccuracyChange {
    pub before: Option<f64>,
    pub after: f64,
}

/// `summary.json`: what a finished run reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummaryFile {
    pub agents: BTreeMap<String, AccuracyChange>,
    pub steps: u64,
    pub wall_s: f64,
    pub train_wall_s: f64,
}

/// The lock on a run directory, held while this value lives.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

/// A run directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RunDir { root: root.into() }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.toml")
    }

    pub fn metrics_path(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    pub fn before_path(&self) -> PathBuf {
        self.root.join("before.json")
    }

    pub fn summary_path(&self) -> PathBuf {
        self.root.join("summary.json")
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    pub fn batches(&self) -> PathBuf {
        self.root.join("batches")
    }

    /// Step `step`'s samples as JSON Lines (`run.dump_rollouts`): one object per sample.
    pub fn write_rollouts<'a>(
        &self,
        step: u64,
        samples: impl IntoIterator<Item = &'a crate::sample::Sample>,
    ) -> Result<()> {
        let dir = self.root.join("rollouts");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let mut text = String::new();
        for s in samples {
            let prompt: Vec<&str> = s.messages.iter().map(|m| m.content.as_str()).collect();
            let line = serde_json::json!({
                "step": step, "policy": s.policy, "role": s.role, "group": s.group.0, "turn": s.turn,
                "prompt": s.prompt, "parent": s.parent, "messages": prompt, "response": s.text,
                "reward": s.reward, "penalty": s.penalty, "score": s.score, "train": s.train,
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
        write_atomic(&dir.join(format!("step-{step:06}.jsonl")), text.as_bytes())
    }

    /// Creates the directory and checks that it is writable.
    pub fn prepare(&self) -> Result<()> {
        let unwritable = |e: std::io::Error| {
            Error::InvalidArgument(format!(
                "cannot write to the run directory {}: {e}; choose another with --out",
                self.root.display()
            ))
        };
        std::fs::create_dir_all(&self.root).map_err(unwritable)?;
        crate::error::probe_beside(&self.config_path()).map(|_| ()).map_err(unwritable)
    }

    pub fn write_config(&self, config: &TrainConfig) -> Result<()> {
        write_atomic(&self.config_path(), config.to_toml().as_bytes())
    }

    /// The run's own config; a directory without one is "not a run" (exit 2). A config
    /// written by an older hacpo is migrated, with a note on stderr for each moved key.
    pub fn read_config(&self) -> Result<TrainConfig> {
        self.read_config_with(&[])
    }

    /// [`Self::read_config`] with `--set` overrides applied.
    pub fn read_config_with(&self, overrides: &[String]) -> Result<TrainConfig> {
        if self.root.exists() && !self.root.is_dir() {
            return Err(Error::InvalidArgument(format!(
                "{} is a file, not a run directory; give the directory `hacpo train` wrote (it holds config.toml)",
                self.root.display()
            )));
        }
        let (config, notes) = TrainConfig::load_saved(&self.config_path(), overrides).map_err(|e| match e {
            Error::NotFound { path, .. } => Error::NotFound {
                what: "run".into(),
                path,
                hint: "Expected a run directory written by `hacpo train` (it holds config.toml).".into(),
            },
            other => other,
        })?;
        for n in notes {
            eprintln!("note: {}: {n} (written by an older hacpo)", self.config_path().display());
        }
        Ok(config)
    }

    /// Whether `config.toml` exists.
    pub fn has_config(&self) -> bool {
        self.config_path().exists()
    }

    /// The files and folders of a run already in the directory, by name. A new run never
    /// starts where any of them is: it would overwrite a run's results (or a user's own
    /// `config.toml`).
    pub fn run_files(&self) -> Vec<&'static str> {
        RUN_FILES.iter().chain(&RUN_FOLDERS).copied().filter(|name| self.root.join(name).exists()).collect()
    }

    /// Refuses (exit 2) a run directory whose folders are files or whose files are folders,
    /// before a step trains and finds out at its checkpoint.
    pub fn check_layout(&self) -> Result<()> {
        if self.root.exists() && !self.root.is_dir() {
            return Err(Error::InvalidArgument(format!("{} is a file, not a run directory", self.root.display())));
        }
        for name in RUN_FILES.iter().chain(&RUN_FOLDERS) {
            let path = self.root.join(name);
            let folder = RUN_FOLDERS.contains(name);
            if path.exists() && path.is_dir() != folder {
                return Err(Error::InvalidArgument(format!(
                    "{} should be a {} but is a {}; move it away and run again",
                    path.display(),
                    if folder { "directory" } else { "file" },
                    if folder { "file" } else { "directory" }
                )));
            }
        }
        Ok(())
    }

    /// Whether the directory holds only what a run that stopped before its first step left:
    /// its config, an empty metrics file and perhaps the held-out scores before training.
    /// Nothing there is a result, so a new run may start in its place.
    fn stopped_before_its_first_step(&self) -> bool {
        let empty_metrics = std::fs::metadata(self.metrics_path()).is_ok_and(|m| m.is_file() && m.len() == 0);
        empty_metrics
            && self.config_path().is_file()
            && self.run_files().iter().all(|f| ["config.toml", "metrics.jsonl", "before.json"].contains(f))
    }

    /// Refuses (exit 2) a directory that already holds a run's files, with the ways out.
    pub fn check_new(&self) -> Result<()> {
        let found = self.run_files();
        if found.is_empty() {
            return Ok(());
        }
        if self.stopped_before_its_first_step() {
            return Ok(());
        }
        let dir = self.root.display();
        Err(Error::InvalidArgument(format!(
            "{dir} already holds a run's files ({}), which a new run would overwrite; continue that run with \
             `hacpo train --resume {dir}`, or choose another --out (or move those files away)",
            found.join(", ")
        )))
    }

    pub fn write_before(&self, acc: &Accuracies) -> Result<()> {
        write_atomic(&self.before_path(), serde_json::to_string_pretty(acc).expect("json").as_bytes())
    }

    /// Accuracy before training, if it was measured.
    pub fn read_before(&self) -> Option<Accuracies> {
        std::fs::read_to_string(self.before_path()).ok().and_then(|t| serde_json::from_str(&t).ok())
    }

    pub fn write_summary(&self, summary: &RunSummaryFile) -> Result<()> {
        write_atomic(&self.summary_path(), serde_json::to_string_pretty(summary).expect("json").as_bytes())
    }

    /// The summary of a finished run, if any.
    pub fn read_summary(&self) -> Option<RunSummaryFile> {
        std::fs::read_to_string(self.summary_path()).ok().and_then(|t| serde_json::from_str(&t).ok())
    }

    /// Whether the run finished (it wrote its summary).
    pub fn is_finished(&self) -> bool {
        self.summary_path().exists()
    }

    /// The checkpoint to resume from: the one `latest` names, or the newest complete one
    /// when that is damaged or missing (said on stderr). Never deletes anything.
    pub fn resume_point(&self) -> Result<Option<PathBuf>> {
        let Some((dir, note)) = crate::train::checkpoint::resume_point(&self.checkpoints())? else { return Ok(None) };
        if let Some(note) = note {
            eprintln!("note: {note}; resuming from {} instead", dir.display());
        }
        Ok(Some(dir))
    }

    /// Whether any checkpoint exists, complete or not.
    pub fn has_checkpoints(&self) -> Result<bool> {
        crate::train::checkpoint::any(&self.checkpoints())
    }

    /// Takes the run's lock (`RUN_DIR/.lock`, an advisory lock the OS releases when the
    /// process ends, however it ends); a run directory another process trains in is refused.
    pub fn lock(&self) -> Result<RunLock> {
        use std::io::Write;
        let path = self.root.join(".lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io("write", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                return Err(Error::InvalidArgument(format!(
                    "{} is in use by another hacpo process{}; wait for it to finish, or choose another --out",
                    self.root.display(),
                    if holder.is_empty() { String::new() } else { format!(" (pid {holder})") }
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", &path, e)),
        }
        file.set_len(0).map_err(|e| Error::io("write", &path, e))?;
        write!(file, "{}", std::process::id()).map_err(|e| Error::io("write", &path, e))?;
        Ok(RunLock { _file: file })
    }
}
