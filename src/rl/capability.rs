//! Agent capability estimates P̂ and capability ratios ω (docs/algorithms.md §2.3).
//!
//! Each step, every agent's accuracy on its own rollouts (the positive rate: the fraction of
//! responses with reward > 0) is floored at 1e-8 and pushed into a sliding window of the last
//! K = 5 steps *including the current one*; P̂ is the window mean. The ratio
//! `ω(source, target) = clip(P̂_source / P̂_target, 0.1, 10)`, and 1 during warm-up.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// What a step's accuracy is measured as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapabilityMetric {
    /// Fraction of the agent's responses with reward > 0 (= mean reward for {0,1} rewards).
    PositiveRate,
    /// Mean reward.
    RewardMean,
}

/// Settings of the tracker; defaults are the paper's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapabilityConfig {
    /// Sliding window length K (steps), current step included.
    pub window: usize,
    /// Floor applied to each step's accuracy before it enters the window.
    pub floor: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Steps during which every ratio is 1.
    pub warmup_steps: usize,
    pub metric: CapabilityMetric,
}

impl CapabilityConfig {
    /// Refuses settings that make the ratios meaningless (a floor of 0 divides by zero, a
    /// `ratio_min` above `ratio_max` has no clip band) or the window unbounded.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=100_000).contains(&self.window) {
            return Err(format!("window must be between 1 and 100000 steps, got {}", self.window));
        }
        if !(self.floor.is_finite() && self.floor > 0.0 && self.floor <= 1.0) {
            return Err(format!("floor must be in (0, 1], got {}", self.floor));
        }
        if !(self.ratio_min.is_finite()
            && self.ratio_max.is_finite()
            && self.ratio_min > 0.0
            && self.ratio_min <= self.ratio_max)
        {
            return Err(format!(
                "ratio_min and ratio_max must be finite with 0 < ratio_min ≤ ratio_max, got {} and {}",
                self.ratio_min, self.ratio_max
            ));
        }
        Ok(())
    }
}

impl Default for CapabilityConfig {
    fn default() -> Self {
        CapabilityConfig {
            window: 5,
            floor: 1e-8,
            ratio_min: 0.1,
            ratio_max: 10.0,
            warmup_steps: 0,
            metric: CapabilityMetric::PositiveRate,
        }
    }
}

/// Smoothed capabilities of all agents at one step, and the ratios derived from them.
#[derive(Clone, Debug, PartialEq)]
pub struct Capabilities {
    /// P̂ per agent.
    pub values: Vec<f64>,
    /// Whether ratios are forced to 1 (warm-up).
    pub warming_up: bool,
    pub ratio_min: f64,
    pub ratio_max: f64,
}

impl Capabilities {
    /// Fixed capabilities (e.g. from `hacpo rl inspect`), no warm-up, default clip.
    pub fn fixed(values: Vec<f64>) -> Self {
        let c = CapabilityConfig::default();
        Capabilities { values, warming_up: false, ratio_min: c.ratio_min, ratio_max: c.ratio_max }
    }

    pub fn num_agents(&self) -> usize {
        self.values.len()
    }

    /// `ω(source, target) = clip(P̂_source / P̂_target, ratio_min, ratio_max)`; 1 in warm-up
    /// and for `source == target`.
    pub fn ratio(&self, source: usize, target: usize) -> f64 {
        if self.warming_up || source == target {
            return 1.0;
        }
        let r = self.values[source] / self.values[target];
        if r.is_nan() { 1.0 } else { r.clamp(self.ratio_min, self.ratio_max) }
    }
}

/// Sliding-window capability tracker for `n` agents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapabilityTracker {
    config: CapabilityConfig,
    windows: Vec<VecDeque<f64>>,
    steps: usize,
}

impl CapabilityTracker {
    pub fn new(num_agents: usize, config: CapabilityConfig) -> Self {
        CapabilityTracker { windows: vec![VecDeque::with_capacity(config.window); num_agents], config, steps: 0 }
    }

    /// This step's accuracy of one agent from its rewards under the configured metric.
    pub fn step_accuracy(&self, rewards: &[f64]) -> f64 {
        if rewards.is_empty() {
            return 0.0;
        }
        match self.config.metric {
            CapabilityMetric::PositiveRate => {
                rewards.iter().filter(|&&r| r > 0.0).count() as f64 / rewards.len() as f64
            }
            CapabilityMetric::RewardMean => super::stats::mean(rewards),
        }
    }

    /// Records one step: `rewards[k]` are all of agent k's rewards in the step batch. Call
    /// before computing the step's advantages (the window includes the current step).
    pub fn update(&mut self, rewards: &[Vec<f64>]) {
        assert_eq!(rewards.len(), self.windows.len(), "one reward list per agent");
        for (k, r) in rewards.iter().enumerate() {
            let acc = self.step_accuracy(r).max(self.config.floor);
            let w = &mut self.windows[k];
            if w.len() == self.config.window {
                w.pop_front();
            }
            w.push_back(acc);
        }
        self.steps += 1;
    }

    /// Steps recorded so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// P̂ per agent (1 for an agent with an empty window) and the ratio settings.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            values: self
                .windows
                .iter()
                .map(|w| if w.is_empty() { 1.0 } else { w.iter().sum::<f64>() / w.len() as f64 })
                .collect(),
            warming_up: self.steps <= self.config.warmup_steps,
            ratio_min: self.config.ratio_min,
            ratio_max: self.config.ratio_max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_includes_current_step_and_slides() {
        let mut t = CapabilityTracker::new(2, CapabilityConfig::default());
        assert_eq!(t.capabilities().values, vec![1.0, 1.0]);
        t.update(&[vec![1.0, 0.0, 1.0, 1.0], vec![0.0, 0.0, 0.0, 0.0]]);
        let c = t.capabilities();
        assert_eq!(c.values[0], 0.75);
        assert_eq!(c.values[1], 1e-8); // floored
        assert_eq!(c.ratio(0, 1), 10.0); // clipped
        assert_eq!(c.ratio(1, 0), 0.1);
        for i in 0..6 {
            // Agent 0 answers i of 10 correctly.
            let rewards: Vec<f64> = (0..10).map(|j| if j < i { 1.0 } else { 0.0 }).collect();
            t.update(&[rewards, vec![1.0]]);
        }
        // Window of the last 5 steps: 0.1..0.5 (the first two steps slid out).
        let c = t.capabilities();
        assert!((c.values[0] - 0.3).abs() < 1e-12, "{:?}", c.values);
        assert_eq!(c.values[1], 1.0);
    }

    #[test]
    fn warmup_forces_unit_ratios() {
        let cfg = CapabilityConfig { warmup_steps: 2, ..Default::default() };
        let mut t = CapabilityTracker::new(2, cfg);
        let step = [vec![1.0, 1.0], vec![1.0, 0.0]];
        t.update(&step);
        t.update(&step);
        assert_eq!(t.capabilities().ratio(0, 1), 1.0);
        t.update(&step);
        assert_eq!(t.capabilities().ratio(0, 1), 2.0);
    }

    #[test]
    fn metrics() {
        let t = CapabilityTracker::new(1, CapabilityConfig::default());
        assert_eq!(t.step_accuracy(&[0.5, 0.0, 2.0, 0.0]), 0.5);
        let t =
            CapabilityTracker::new(1, CapabilityConfig { metric: CapabilityMetric::RewardMean, ..Default::default() });
        assert_eq!(t.step_accuracy(&[0.5, 0.0, 2.0, 0.0]), 0.625);
    }
}
