//! `hacpo rl inspect`: what HACPO does to one mini-batch of one learner.
//!
//! Input (JSON; every field but `samples` optional, defaults from docs/algorithms.md):
//! `{"learner": 0, "capabilities": [0.6, 0.3], "minibatch_index": 0, "alpha": 1.0, …,
//!   "samples": [{"agent": 0, "prompt": "p0", "reward": 1.0, "mean_logp_target": -1.2,
//!                "mean_logp_source": -1.0}, …]}`
//! Any [`HacpoConfig`] field (`delta`, `naive`, `capability_baseline`, …) may appear at the
//! top level. Samples with the same `prompt` form one group; capabilities are the smoothed P̂.

use serde::Serialize;
use serde_json::{Map, Value};

use super::capability::Capabilities;
use super::hacpo::{self, HacpoConfig};
use super::records::PoolSample;
use crate::error::{Error, Result};

/// One inspected response.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SampleReport {
    pub agent: usize,
    pub prompt: String,
    pub reward: f64,
    pub kind: &'static str,
    pub advantage: f64,
    pub coef: f64,
    pub ratio: f64,
    pub clipped_ratio: f64,
    pub objective: f64,
    pub grad_weight: f64,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub learner: usize,
    pub minibatch_index: usize,
    /// The cross clip lower bound at this mini-batch index.
    pub cross_lower_bound: f64,
    pub capabilities: Vec<f64>,
    pub samples: Vec<SampleReport>,
    /// Negative mean objective.
    pub loss: f64,
}

/// A parsed input.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub learner: usize,
    pub capabilities: Vec<f64>,
    pub minibatch_index: usize,
    pub config: HacpoConfig,
    pub samples: Vec<InputSample>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct InputSample {
    pub agent: usize,
    pub prompt: String,
    pub reward: f64,
    pub mean_logp_target: f64,
    pub mean_logp_source: f64,
}

fn field_error(path: &str, message: impl std::fmt::Display) -> Error {
    Error::config("rl inspect input", format!("{path}: {message}"))
}

/// The largest magnitude of a reward, log-probability or capability: far beyond any real one,
/// and far enough below the largest float that the group statistics cannot overflow.
const MAX_MAGNITUDE: f64 = 1e12;

/// The most agents (and so the highest agent index) a batch may name.
const MAX_AGENTS: usize = 4096;

fn number(v: &Value, path: &str) -> Result<f64> {
    let x = v.as_f64().ok_or_else(|| field_error(path, format!("expected a number, found {v}")))?;
    if x.abs() > MAX_MAGNITUDE {
        return Err(field_error(path, format!("{x} is out of range (at most {MAX_MAGNITUDE:e} in magnitude)")));
    }
    Ok(x)
}

fn index(v: &Value, path: &str) -> Result<usize> {
    v.as_u64()
        .filter(|&x| x < 1 << 32)
        .map(|x| x as usize)
        .ok_or_else(|| field_error(path, format!("expected a non-negative integer below 2^32, found {v}")))
}

fn agent_index(v: &Value, path: &str) -> Result<usize> {
    let a = index(v, path)?;
    if a >= MAX_AGENTS {
        return Err(field_error(path, format!("agent {a} is out of range (at most {MAX_AGENTS} agents)")));
    }
    Ok(a)
}

impl Input {
    /// Parses the JSON text; errors name the offending field.
    pub fn parse(text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| Error::config("rl inspect input", format!("not valid JSON: {e}")))?;
        let obj = root.as_object().ok_or_else(|| field_error("(top level)", "expected a JSON object"))?;

        let mut config_fields = Map::new();
        let (mut learner, mut minibatch_index, mut capabilities, mut samples) = (0, 0, None, None);
        let config_keys: Vec<String> = match serde_json::to_value(HacpoConfig::default()) {
            Ok(Value::Object(m)) => m.keys().cloned().collect(),
            _ => unreachable!("HacpoConfig serialises to an object"),
        };
        for (key, v) in obj {
            match key.as_str() {
                "learner" => learner = agent_index(v, "learner")?,
                "minibatch_index" => minibatch_index = index(v, "minibatch_index")?,
                "capabilities" => {
                    let list = v.as_array().ok_or_else(|| field_error("capabilities", "expected a list of numbers"))?;
                    let caps = list
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let x = number(c, &format!("capabilities[{i}]"))?;
                            if x > 0.0 { Ok(x) } else { Err(field_error(&format!("capabilities[{i}]"), "must be > 0")) }
                        })
                        .collect::<Result<Vec<_>>>()?;
                    capabilities = Some(caps);
                }
                "samples" => samples = Some(parse_samples(v)?),
                k if config_keys.iter().any(|c| c == k) => {
                    config_fields.insert(key.clone(), v.clone());
                }
                other => {
                    return Err(field_error(
                        other,
                        format!(
                            "unknown field; expected learner, capabilities, minibatch_index, samples or one of {}",
                            config_keys.join(", ")
                        ),
                    ));
                }
            }
        }
        let config: HacpoConfig = serde_json::from_value(Value::Object(config_fields))
            .map_err(|e| Error::config("rl inspect input", format!("{e}")))?;
        config.validate()?;
        let samples = samples.ok_or_else(|| field_error("samples", "missing (a list of responses is required)"))?;
        if samples.is_empty() {
            return Err(field_error("samples", "the list is empty"));
        }
        let agents = samples.iter().map(|s| s.agent).max().unwrap_or(0) + 1;
        let capabilities = capabilities.unwrap_or_else(|| vec![1.0; agents.max(learner + 1)]);
        if let Some((i, s)) = samples.iter().enumerate().find(|(_, s)| s.agent >= capabilities.len()) {
            return Err(field_error(
                &format!("samples[{i}].agent"),
                format!("agent {} has no capability ({} given)", s.agent, capabilities.len()),
            ));
        }
        if learner >= capabilities.len() {
            return Err(field_error(
                "learner",
                format!("agent {learner} has no capability ({} given)", capabilities.len()),
            ));
        }
        Ok(Input { learner, capabilities, minibatch_index, config, samples })
    }

    /// Runs the scalar core on the input.
    pub fn report(&self) -> Result<Report> {
        let caps = Capabilities::fixed(self.capabilities.clone());
        let mut groups: Vec<&str> = Vec::new();
        let pool: Vec<PoolSample> = self
            .samples
            .iter()
            .map(|s| {
                let group = groups.iter().position(|g| *g == s.prompt).unwrap_or_else(|| {
                    groups.push(&s.prompt);
                    groups.len() - 1
                });
                PoolSample { agent: s.agent, group, reward: s.reward }
            })
            .collect();
        let adv = hacpo::advantages(&pool, self.learner, &caps, &self.config)?;
        let mut terms = Vec::with_capacity(pool.len());
        let mut samples = Vec::with_capacity(pool.len());
        for (s, a) in self.samples.iter().zip(adv) {
            let t = hacpo::sample_terms(
                s.agent,
                self.learner,
                a,
                s.mean_logp_target,
                s.mean_logp_source,
                self.minibatch_index,
                &caps,
                &self.config,
            );
            samples.push(SampleReport {
                agent: s.agent,
                prompt: s.prompt.clone(),
                reward: s.reward,
                kind: if t.cross { "cross" } else { "own" },
                advantage: t.advantage,
                coef: t.coef,
                ratio: t.ratio,
                clipped_ratio: t.clipped_ratio,
                objective: t.objective,
                grad_weight: t.grad_weight,
            });
            terms.push(t);
        }
        let loss = hacpo::policy_loss(&terms);
        // Numbers that overflow would print as `null`: an error that says where, instead.
        for (i, s) in samples.iter().enumerate() {
            let values = [s.advantage, s.coef, s.ratio, s.clipped_ratio, s.objective, s.grad_weight];
            if values.iter().any(|x| !x.is_finite()) {
                return Err(field_error(
                    &format!("samples[{i}]"),
                    "its advantage or objective is not finite: the rewards or log-probabilities are too large",
                ));
            }
        }
        if !loss.is_finite() {
            return Err(field_error(
                "samples",
                "the loss is not finite: the rewards or log-probabilities are too large",
            ));
        }
        Ok(Report {
            learner: self.learner,
            minibatch_index: self.minibatch_index,
            cross_lower_bound: self.config.cross_lower_bound(self.minibatch_index),
            capabilities: self.capabilities.clone(),
            samples,
            loss,
        })
    }
}

fn parse_samples(v: &Value) -> Result<Vec<InputSample>> {
    let list = v.as_array().ok_or_else(|| field_error("samples", "expected a list of objects"))?;
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let p = |f: &str| format!("samples[{i}].{f}");
            let o = s.as_object().ok_or_else(|| field_error(&format!("samples[{i}]"), "expected an object"))?;
            if let Some(k) = o
                .keys()
                .find(|k| !["agent", "prompt", "reward", "mean_logp_target", "mean_logp_source"].contains(&k.as_str()))
            {
                return Err(field_error(
                    &p(k),
                    "unknown field; expected agent, prompt, reward, mean_logp_target, mean_logp_source",
                ));
            }
            let get = |f: &str| o.get(f).ok_or_else(|| field_error(&p(f), "missing"));
            let prompt = match get("prompt")? {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => return Err(field_error(&p("prompt"), format!("expected a string or number, found {other}"))),
            };
            Ok(InputSample {
                agent: agent_index(get("agent")?, &p("agent"))?,
                prompt,
                reward: number(get("reward")?, &p("reward"))?,
                mean_logp_target: number(get("mean_logp_target")?, &p("mean_logp_target"))?,
                mean_logp_source: number(get("mean_logp_source")?, &p("mean_logp_source"))?,
            })
        })
        .collect()
}

impl Report {
    /// A fixed-width table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "learner {}  mini-batch {}  cross lower bound {:.6}  capabilities {:?}\n",
            self.learner, self.minibatch_index, self.cross_lower_bound, self.capabilities
        );
        out.push_str(&format!(
            "{:>3} {:>5} {:<8} {:<5} {:>6} {:>10} {:>8} {:>9} {:>9} {:>10} {:>10}\n",
            "#", "agent", "prompt", "kind", "reward", "advantage", "coef", "ratio", "clipped", "objective", "grad"
        ));
        for (i, s) in self.samples.iter().enumerate() {
            out.push_str(&format!(
                "{:>3} {:>5} {:<8} {:<5} {:>6} {:>10.6} {:>8.4} {:>9.6} {:>9.6} {:>10.6} {:>10.6}\n",
                i,
                s.agent,
                s.prompt,
                s.kind,
                s.reward,
                s.advantage,
                s.coef,
                s.ratio,
                s.clipped_ratio,
                s.objective,
                s.grad_weight
            ));
        }
        out.push_str(&format!("loss {:.6}\n", self.loss));
        out
    }
}
