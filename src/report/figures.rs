//! The PNG figures of a run or a study, one question each:
//! - `reward.png`: how each agent's sampled reward moves under each variant (a panel per agent);
//! - `heldout.png`: held-out accuracy at each validation, per agent and variant (the search
//!   team's F1, the turn-wise team's success rate: whichever the runs record);
//! - `accuracy.png`: final held-out accuracy (F1, success rate) per agent and variant (mean ±
//!   std over seeds), with the value before training marked;
//! - `capability.png`: HACPO's capability estimate and discrepancy coefficient ω over time.
//!
//! A variant is a list of runs of one configuration (seeds); curves are means over its runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{RunReport, mean_std};
use crate::error::Result;
use crate::plot::{self, BarGroup, Panel, Series};

/// Runs of one configuration, under a display name.
pub struct Variant<'a> {
    pub name: String,
    pub runs: &'a [RunReport],
}

/// Agents in first-seen order over all variants.
fn agent_names(variants: &[Variant]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for v in variants {
        for r in v.runs {
            for a in &r.agents {
                if !names.contains(&a.agent) {
                    names.push(a.agent.clone());
                }
            }
        }
    }
    names
}

/// The mean over `runs` of `metric` for `agent` at each step where any run recorded it.
fn mean_curve(runs: &[RunReport], agent: &str, metric: &str) -> Vec<(f64, f64)> {
    let mut by_step: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
    for r in runs {
        for (step, a, m) in &r.rows {
            if a == agent
                && let Some(v) = m.get(metric).filter(|v| v.is_finite())
            {
                let e = by_step.entry(*step).or_insert((0.0, 0));
                e.0 += v;
                e.1 += 1;
            }
        }
    }
    by_step.into_iter().map(|(s, (sum, n))| (s as f64, sum / n as f64)).collect()
}

fn seeds_note(variants: &[Variant]) -> String {
    let most = variants.iter().map(|v| v.runs.len()).max().unwrap_or(1);
    if most > 1 { format!(", mean over {most} seeds") } else { String::new() }
}

/// The held-out metric the runs record (its key, and its name for axes): accuracy, the search
/// team's F1, or the turn-wise team's success rate.
fn heldout_metric(variants: &[Variant]) -> (&'static str, &'static str) {
    const METRICS: [(&str, &str); 3] =
        [("val/accuracy", "accuracy"), ("val/f1", "F1"), ("val/success", "success rate")];
    let recorded = |key: &str| {
        variants.iter().flat_map(|v| v.runs.iter()).flat_map(|r| &r.rows).any(|(_, _, m)| m.contains_key(key))
    };
    METRICS.into_iter().find(|(key, _)| recorded(key)).unwrap_or(METRICS[0])
}

/// Writes the figures into `dir`; returns their paths.
pub fn write(dir: &Path, variants: &[Variant]) -> Result<Vec<PathBuf>> {
    let agents = agent_names(variants);
    let seeds = seeds_note(variants);
    let mut written = Vec::new();

    // Sampled reward: noisy per step (each step draws new prompts), so smoothed.
    let steps = variants.iter().flat_map(|v| v.runs.iter().map(|r| r.steps)).max().unwrap_or(1) as usize;
    let window = (steps / 10).clamp(1, 20);
    let panels: Vec<Panel> = agents
        .iter()
        .map(|agent| Panel {
            title: agent.clone(),
            x_desc: "training step".into(),
            y_desc: format!("sampled reward ({window}-step moving average)"),
            series: variants
                .iter()
                .enumerate()
                .map(|(i, v)| Series {
                    name: v.name.clone(),
                    points: plot::moving_average(&mean_curve(v.runs, agent, "critic/score/mean"), window),
                    markers: false,
                    colour: i,
                })
                .filter(|s| !s.points.is_empty())
                .collect(),
            y_range: None,
        })
        .collect();
    let path = dir.join("reward.png");
    plot::line_panels(&path, &format!("Sampled reward per agent{seeds}"), &panels)?;
    written.push(path);

    // Held-out accuracy (F1, success rate) over training, starting from its value before.
    let (key, metric) = heldout_metric(variants);
    let panels: Vec<Panel> = agents
        .iter()
        .map(|agent| Panel {
            title: agent.clone(),
            x_desc: "training step".into(),
            y_desc: format!("held-out {metric}, % (greedy)"),
            series: variants
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let before: Vec<f64> = v
                        .runs
                        .iter()
                        .filter_map(|r| r.agents.iter().find(|a| &a.agent == agent).and_then(|a| a.before))
                        .collect();
                    let mut points: Vec<(f64, f64)> = mean_std(&before).map(|(m, _)| (0.0, m)).into_iter().collect();
                    points.extend(mean_curve(v.runs, agent, key));
                    let points = points.into_iter().map(|(x, y)| (x, y * 100.0)).collect();
                    Series { name: v.name.clone(), points, markers: true, colour: i }
                })
                .filter(|s| !s.points.is_empty())
                .collect(),
            y_range: None,
        })
        .collect();
    let path = dir.join("heldout.png");
    plot::line_panels(&path, &format!("Held-out {metric} during training{seeds}"), &panels)?;
    written.push(path);

    // Final accuracy bars.
    let names: Vec<String> = variants.iter().map(|v| v.name.clone()).collect();
    let groups: Vec<BarGroup> = agents
        .iter()
        .map(|agent| {
            let of = |v: &Variant, f: fn(&super::AgentResult) -> Option<f64>| -> Vec<f64> {
                v.runs.iter().filter_map(|r| r.agents.iter().find(|a| &a.agent == agent).and_then(f)).collect()
            };
            let before: Vec<f64> = variants.iter().flat_map(|v| of(v, |a| a.before)).collect();
            BarGroup {
                label: agent.clone(),
                bars: variants
                    .iter()
                    .map(|v| mean_std(&of(v, |a| a.after)).map(|(m, s)| (m * 100.0, s * 100.0)))
                    .collect(),
                reference: mean_std(&before).map(|(m, _)| m * 100.0),
            }
        })
        .collect();
    let path = dir.join("accuracy.png");
    let error = if seeds.is_empty() { "" } else { " (bars: ± std over seeds)" };
    plot::grouped_bars(
        &path,
        &format!("Held-out {metric} after training{error}"),
        &format!("held-out {metric}, % (greedy)"),
        &names,
        &groups,
        "before training",
    )?;
    written.push(path);

    // Capability and ω: only variants that record them (HACPO and its ablations).
    let mut capability = Vec::new();
    let mut omega = Vec::new();
    let mut colour = 0;
    for v in variants {
        for agent in &agents {
            let label = if variants.len() > 1 { format!("{} · {agent}", v.name) } else { agent.clone() };
            let c = mean_curve(v.runs, agent, "hacpo/capability");
            let w = mean_curve(v.runs, agent, "hacpo/omega_mean");
            if c.is_empty() && w.is_empty() {
                continue;
            }
            capability.push(Series { name: label.clone(), points: c, markers: false, colour });
            omega.push(Series { name: label, points: w, markers: false, colour });
            colour += 1;
        }
    }
    if !capability.is_empty() {
        let panels = [
            Panel {
                title: "capability: accuracy on own rollouts, mean over the last K steps".into(),
                x_desc: "training step".into(),
                y_desc: "capability".into(),
                series: capability,
                y_range: None,
            },
            Panel {
                title: "discrepancy coefficient ω on the other agents' responses".into(),
                x_desc: "training step".into(),
                y_desc: "mean ω".into(),
                series: omega,
                y_range: None,
            },
        ];
        let path = dir.join("capability.png");
        plot::line_panels(&path, &format!("HACPO capability and ω per agent{seeds}"), &panels)?;
        written.push(path);
    }
    Ok(written)
}
