//! Per-step metrics: `metrics.jsonl` (one line per step and agent:
//! `{"step": N, "agent": "...", "data": {"actor/pg_loss": …}}`, verl's names) and optional
//! TensorBoard scalars (`<agent>/<name>`).
//!
//! On resume the file is cut back to the checkpointed step first, so a step that ran after the
//! last checkpoint and is run again appears once.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::tensorboard::EventWriter;
use crate::error::{Error, Result, write_atomic};

/// Metric values of one agent at one step.
pub type Metrics = BTreeMap<String, f64>;

pub struct MetricsSink {
    path: PathBuf,
    jsonl: BufWriter<File>,
    tensorboard: Option<EventWriter>,
}

impl MetricsSink {
    /// Opens `run_dir/metrics.jsonl` for appending, first dropping lines after `keep_through`.
    pub fn open(run_dir: &Path, tensorboard: bool, keep_through: Option<u64>) -> Result<Self> {
        let path = run_dir.join("metrics.jsonl");
        if let Some(last) = keep_through
            && path.exists()
        {
            let text = crate::error::read_to_string(&path)?;
            let kept: Vec<&str> = text
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v["step"].as_u64())
                        .is_some_and(|s| s <= last)
                })
                .collect();
            let mut body = kept.join("\n");
            if !body.is_empty() {
                body.push('\n');
            }
            write_atomic(&path, body.as_bytes())?;
        } else if keep_through.is_none() {
            // A fresh run starts a fresh file.
            write_atomic(&path, b"")?;
        }
        let file = OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::io("open", &path, e))?;
        let tensorboard = if tensorboard { Some(EventWriter::create(&run_dir.join("tb"))?) } else { None };
        Ok(MetricsSink { path, jsonl: BufWriter::new(file), tensorboard })
    }

    /// Records one agent's metrics for `step` and flushes.
    pub fn record(&mut self, step: u64, agent: &str, data: &Metrics) -> Result<()> {
        let finite: BTreeMap<&String, serde_json::Value> =
            data.iter().map(|(k, v)| (k, if v.is_finite() { json!(v) } else { json!(v.to_string()) })).collect();
        let line = json!({"step": step, "agent": agent, "data": finite});
        writeln!(self.jsonl, "{line}").map_err(|e| Error::io("write", &self.path, e))?;
        self.jsonl.flush().map_err(|e| Error::io("write", &self.path, e))?;
        if let Some(tb) = &mut self.tensorboard {
            for (k, v) in data {
                tb.scalar(&format!("{agent}/{k}"), *v, step)?;
            }
            tb.flush()?;
        }
        Ok(())
    }
}
