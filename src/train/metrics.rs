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
            let (body, notes) = cut_back(&text, last);
            for n in notes {
                eprintln!("note: {}: {n}", path.display());
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

/// `metrics.jsonl` cut back to the records of steps up to `last` (a resumed run repeats the
/// later ones). A last line cut off by a kill mid-write is removed and said so; other lines
/// that are not records are kept as they are (never lose data), also said.
fn cut_back(text: &str, last: u64) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::with_capacity(lines.len());
    for (i, l) in lines.iter().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<serde_json::Value>(l).ok().map(|v| v["step"].as_u64()) {
            Some(Some(step)) if step <= last => kept.push(*l),
            Some(Some(_)) => {}
            _ if i + 1 == lines.len() && !text.ends_with('\n') => {
                notes.push(format!("its last line was cut off mid-write (line {}); removed it", i + 1));
            }
            _ => {
                notes.push(format!("line {} is not a metrics record; kept as it is", i + 1));
                kept.push(*l);
            }
        }
    }
    let mut body = kept.join("\n");
    if !body.is_empty() {
        body.push('\n');
    }
    (body, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_cut_off_mid_write_is_repaired_and_said() {
        let text =
            "{\"step\":1,\"agent\":\"a\",\"data\":{}}\n{\"step\":2,\"agent\":\"a\",\"data\":{}}\n{\"step\":3,\"ag";
        let (body, notes) = cut_back(text, 2);
        assert_eq!(body.lines().count(), 2);
        assert!(body.ends_with("}\n"));
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("cut off") && notes[0].contains("line 3"), "{notes:?}");
        // Steps after the checkpoint go; nothing else is said.
        let (body, notes) = cut_back(text.rsplit_once('\n').unwrap().0, 1);
        assert_eq!((body.lines().count(), notes.len()), (1, 0));
    }
}
