//! What a finished run says: held-out accuracy before and after per agent, rollouts consumed,
//! and the per-step curves (sampled reward, validation accuracy, capability, ω) as CSV.
//!
//! Figures (PNG): see [`figures`].
//!
//! Reads only the run directory (`config.toml`, `metrics.jsonl`, `summary.json`), so it works
//! for runs made by another machine or an older build.

pub mod figures;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result, read_to_string, write_atomic};
use crate::run_dir::RunDir;

/// One agent's line of the table.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AgentResult {
    pub agent: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// Mean sampled reward over the last 10% of steps (at least one).
    pub final_reward: Option<f64>,
    /// Own rollouts sampled by this agent over the run (a search team: every output of its
    /// trees, all roles, `search/outputs`).
    pub rollouts: u64,
    /// Mean wall seconds of a training step (`timing_s/step`).
    pub step_s: Option<f64>,
    /// The training process's peak resident memory in GB (`perf/peak_rss_gb`, its last value).
    pub peak_rss_gb: Option<f64>,
}

/// A run, read back.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub dir: PathBuf,
    /// The algorithm's registry name.
    pub algo: String,
    pub steps: u64,
    pub agents: Vec<AgentResult>,
    /// metrics.jsonl, one entry per step and agent.
    pub rows: Vec<(u64, String, BTreeMap<String, f64>)>,
}

/// Columns of `curves.csv`.
const CURVES: &[&str] = &[
    "critic/score/mean",
    "val/accuracy",
    "val/f1",
    "val/success",
    "search/f1",
    "turns/success_rate",
    "hacpo/capability",
    "hacpo/omega_mean",
    "hacpo/cross_clip_frac",
    "actor/pg_loss",
    "response_length/mean",
];

pub fn read(dir: &Path) -> Result<RunReport> {
    let run = RunDir::new(dir);
    let cfg = run.read_config()?;
    let metrics_path = run.metrics_path();
    let mut rows = Vec::new();
    if metrics_path.exists() {
        for (i, line) in read_to_string(&metrics_path)?.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line).map_err(|e| {
                Error::config(metrics_path.display().to_string(), format!("line {}: not JSON: {e}", i + 1))
            })?;
            let step = v["step"].as_u64().unwrap_or(0);
            let agent = v["agent"].as_str().unwrap_or("?").to_string();
            let data = v["data"]
                .as_object()
                .map(|m| m.iter().filter_map(|(k, x)| x.as_f64().map(|f| (k.clone(), f))).collect())
                .unwrap_or_default();
            rows.push((step, agent, data));
        }
    }
    let summary = run.read_summary();
    let steps = rows.iter().map(|r| r.0).max().unwrap_or(0);
    // The group the algorithm actually sampled (GSPO×2 doubles it).
    let group =
        crate::rl::registry::batch_shape(&cfg.algo.name, &cfg.algo.settings(), cfg.requested_shape())?.group_size;
    let mut names: Vec<String> = Vec::new();
    for (_, a, _) in &rows {
        if !names.contains(a) {
            names.push(a.clone());
        }
    }
    let agents = names
        .iter()
        .map(|name| {
            let mine: Vec<&BTreeMap<String, f64>> = rows.iter().filter(|r| &r.1 == name).map(|r| &r.2).collect();
            let tail = (mine.len() / 10).max(1);
            let last: Vec<f64> =
                mine.iter().rev().take(tail).filter_map(|m| m.get("critic/score/mean").copied()).collect();
            let change = summary.as_ref().and_then(|s| s.agents.get(name));
            AgentResult {
                agent: name.clone(),
                before: change.and_then(|c| c.before),
                after: change.map(|c| c.after).or_else(|| {
                    mine.iter()
                        .rev()
                        .find_map(|m| m.get("val/accuracy").or(m.get("val/f1")).or(m.get("val/success")).copied())
                }),
                final_reward: (!last.is_empty()).then(|| last.iter().sum::<f64>() / last.len() as f64),
                // A search team's trees and a turn-wise team's episodes have more outputs than
                // prompts × G: count what they sampled.
                rollouts: match mine
                    .iter()
                    .filter_map(|m| m.get("search/outputs").or(m.get("turns/outputs")))
                    .sum::<f64>()
                {
                    n if n > 0.0 => n as u64,
                    _ => steps * (cfg.algo.prompts_per_step * group) as u64,
                },
                step_s: {
                    let s: Vec<f64> = mine.iter().filter_map(|m| m.get("timing_s/step").copied()).collect();
                    (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64)
                },
                peak_rss_gb: mine.iter().filter_map(|m| m.get("perf/peak_rss_gb").copied()).reduce(f64::max),
            }
        })
        .collect();
    Ok(RunReport { dir: dir.to_path_buf(), algo: cfg.algo.name.clone(), steps, agents, rows })
}

/// Mean and sample standard deviation (0 for one value); none for no values.
pub fn mean_std(xs: &[f64]) -> Option<(f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    Some((mean, var.sqrt()))
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}%", v * 100.0)).unwrap_or_else(|| "–".into())
}

impl RunReport {
    /// The Markdown table.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "Run `{}`: {} for {} steps\n\n| agent | held-out before | after | change | sampled reward (last 10%) | rollouts |\n|---|---|---|---|---|---|\n",
            self.dir.display(),
            self.algo_name(),
            self.steps
        );
        for a in &self.agents {
            let change = match (a.before, a.after) {
                (Some(b), Some(x)) => format!("{:+.1} points", (x - b) * 100.0),
                _ => "–".into(),
            };
            let reward = a.final_reward.map(|r| format!("{r:.3}")).unwrap_or_else(|| "–".into());
            s += &format!(
                "| {} | {} | {} | {change} | {reward} | {} |\n",
                a.agent,
                pct(a.before),
                pct(a.after),
                a.rollouts
            );
        }
        s
    }

    /// `step,agent,<curve columns>`; empty cells where a metric was not recorded.
    pub fn curves_csv(&self) -> String {
        let mut s = format!("step,agent,{}\n", CURVES.join(","));
        for (step, agent, m) in &self.rows {
            let cells: Vec<String> =
                CURVES.iter().map(|k| m.get(*k).map(|v| v.to_string()).unwrap_or_default()).collect();
            s += &format!("{step},{agent},{}\n", cells.join(","));
        }
        s
    }

    /// `agent,algo,steps,before,after,final_reward,rollouts`.
    pub fn results_csv(&self) -> String {
        let opt = |x: Option<f64>| x.map(|v| v.to_string()).unwrap_or_default();
        let mut s = String::from("agent,algo,steps,before,after,final_reward,rollouts\n");
        for a in &self.agents {
            s += &format!(
                "{},{},{},{},{},{},{}\n",
                a.agent,
                self.algo_name(),
                self.steps,
                opt(a.before),
                opt(a.after),
                opt(a.final_reward),
                a.rollouts
            );
        }
        s
    }

    /// Writes `report.md`, `results.csv`, `curves.csv` and the figures into the run directory.
    pub fn write(&self) -> Result<Vec<PathBuf>> {
        let files =
            [("report.md", self.markdown()), ("results.csv", self.results_csv()), ("curves.csv", self.curves_csv())];
        let mut out = Vec::new();
        for (name, text) in files {
            let p = self.dir.join(name);
            write_atomic(&p, text.as_bytes())?;
            out.push(p);
        }
        let variant = figures::Variant { name: self.algo_name(), runs: std::slice::from_ref(self) };
        out.extend(figures::write(&self.dir, &[variant])?);
        Ok(out)
    }

    /// The algorithm as configs spell it (`hacpo`, `gspo2x`, …).
    pub fn algo_name(&self) -> String {
        self.algo.clone()
    }
}
