//! M-GRPO's arithmetic (docs/algorithms.md §4): the main agent's and the sub-agents' rewards,
//! trajectory alignment of a question's sub-trajectories to `d` per rollout, and both agents'
//! group-normalised advantages.
//!
//! A question has K rollouts. Rollout k is one main trajectory and the d_k sub-trajectories its
//! delegations produced (d_k varies). The main agent's group is the K main trajectories. The
//! sub-agent's group is the question's sub-trajectories after alignment: every rollout
//! contributes exactly d slots, filled by duplicating its own sub-trajectories at random when it
//! has fewer, dropping at random when it has more, and masking when it has none (§4.3). A
//! duplicate counts in the statistics and in the loss; a masked slot in neither.
//!
//! Pure arithmetic on plain values: no tensors, no text, no threads.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::stats::mean;

/// The sub-agent in the three variants of §4.6: trained with the main agent (M-GRPO), frozen
/// (main-only), or absent (one agent with the search tools).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubAgent {
    Trained,
    Frozen,
    None,
}

/// Which sub-agent reward (§4.2): the paper's weighted sum, or the released code's table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubReward {
    /// `β1·format + β2·main_correct + β3·expert` when the format is valid, else 0.
    #[default]
    Paper,
    /// MrlX's `reward_func`: invalid format 0; the main agent wrong or malformed 0.1; right 1.
    Released,
}

/// Reward weights and the alignment target (the paper's values by default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MgrpoSettings {
    /// α1, α2: the main agent's format and correctness weights.
    pub main_weights: [f64; 2],
    /// β1, β2, β3: the sub-agent's format, main-correctness and judge weights.
    pub sub_weights: [f64; 3],
    pub sub_reward: SubReward,
    /// Sub-trajectory slots per rollout after alignment (the paper's d = 8).
    pub align: usize,
    /// Added to the standard deviation; a group whose rewards are all equal gets advantage 0.
    pub epsilon: f64,
}

impl Default for MgrpoSettings {
    fn default() -> Self {
        MgrpoSettings {
            main_weights: [0.1, 0.9],
            sub_weights: [0.1, 0.4, 0.5],
            sub_reward: SubReward::Paper,
            align: 8,
            epsilon: super::stats::ADV_EPSILON,
        }
    }
}

impl MgrpoSettings {
    /// The settings a user can get wrong, checked before a run starts.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let weights = self.main_weights.iter().chain(&self.sub_weights);
        if weights.clone().any(|w| !w.is_finite() || *w < 0.0) {
            return Err(format!(
                "reward weights must be finite and ≥ 0, found main {:?} and sub {:?}",
                self.main_weights, self.sub_weights
            ));
        }
        if self.align == 0 {
            return Err("align: at least one sub-trajectory slot per rollout (the paper uses 8)".into());
        }
        if !(self.epsilon.is_finite() && self.epsilon >= 0.0) {
            return Err(format!("epsilon must be finite and ≥ 0, found {}", self.epsilon));
        }
        Ok(())
    }

    /// The main agent's reward R_M: `α1 + α2·correct` when its trajectory kept the protocol,
    /// else 0 (0.1 / 1.0 with the paper's weights, as the released code).
    pub fn main_reward(&self, format_ok: bool, correct: f64) -> f64 {
        if !format_ok {
            return 0.0;
        }
        let [a1, a2] = self.main_weights;
        a1 + a2 * correct
    }

    /// A sub-trajectory's reward R_S, from its own format, the main agent's outcome in the same
    /// rollout, and the judge's score of how it did its task (`None`: no judge, the term is 0).
    pub fn sub_reward(&self, format_ok: bool, main: &MainOutcome, expert: Option<f64>) -> f64 {
        if !format_ok {
            return 0.0;
        }
        match self.sub_reward {
            SubReward::Paper => {
                let [b1, b2, b3] = self.sub_weights;
                let main_correct = if main.format_ok { main.correct } else { 0.0 };
                b1 + b2 * main_correct + b3 * expert.unwrap_or(0.0)
            }
            // The code compares the main reward with 0 and 0.1: anything above is "right".
            SubReward::Released => {
                if main.format_ok && main.correct > 0.0 {
                    1.0
                } else {
                    0.1
                }
            }
        }
    }
}

/// What the main agent's trajectory of one rollout came to.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MainOutcome {
    /// Every turn kept the protocol and the trajectory ended with a result.
    pub format_ok: bool,
    /// Correctness of the result in [0, 1] (exact match, or an F1 threshold: 0 or 1).
    pub correct: f64,
}

/// One slot of a rollout's aligned sub-trajectories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Slot {
    /// The rollout's sub-trajectory of this index (a duplicate when it fills a slot twice).
    Sub(usize),
    /// A rollout that never delegated: zero loss weight, out of the statistics.
    Masked,
}

/// Aligns a rollout's `calls` sub-trajectories to exactly `d` slots (§4.3): all of them and
/// random duplicates (with replacement) when there are fewer, a random `d` of them when more,
/// `d` masked slots when there are none. Slots are in sub-trajectory order.
pub fn align(calls: usize, d: usize, rng: &mut impl Rng) -> Vec<Slot> {
    if calls == 0 {
        return vec![Slot::Masked; d];
    }
    let mut picked: Vec<usize> = if calls <= d {
        let mut all: Vec<usize> = (0..calls).collect();
        all.extend((calls..d).map(|_| rng.random_range(0..calls)));
        all
    } else {
        let mut order: Vec<usize> = (0..calls).collect();
        order.shuffle(rng);
        order.truncate(d);
        order
    };
    picked.sort_unstable();
    picked.into_iter().map(Slot::Sub).collect()
}

/// How many slots each of `calls` sub-trajectories fills (0: dropped; 2 or more: duplicated).
pub fn copies(slots: &[Slot], calls: usize) -> Vec<usize> {
    let mut out = vec![0; calls];
    for s in slots {
        if let Slot::Sub(i) = *s {
            out[i] += 1;
        }
    }
    out
}

/// The smallest `d` with at least `quantile` of the pilot's rollouts making `d` or fewer calls
/// (the paper picks P(d_k ≤ d) ≈ 0.99); at least 1.
pub fn pilot_align(calls_per_rollout: &[usize], quantile: f64) -> usize {
    if calls_per_rollout.is_empty() {
        return 1;
    }
    let mut sorted = calls_per_rollout.to_vec();
    sorted.sort_unstable();
    let need = (quantile.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[need.clamp(1, sorted.len()) - 1].max(1)
}

/// `(r − μ) / (σ + ε)` with the population standard deviation (§4.3); all-equal rewards
/// (σ = 0) give 0, whatever ε.
pub fn population_advantages(rewards: &[f64], epsilon: f64) -> Vec<f64> {
    let m = mean(rewards);
    let var = mean(&rewards.iter().map(|r| (r - m).powi(2)).collect::<Vec<_>>());
    let sd = var.sqrt();
    if sd == 0.0 {
        return vec![0.0; rewards.len()];
    }
    rewards.iter().map(|r| (r - m) / (sd + epsilon)).collect()
}

/// One question's K rollouts as the reward stage sees them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    pub main: MainOutcome,
    /// Its sub-trajectories, in call order.
    #[serde(default)]
    pub subs: Vec<SubOutcome>,
}

/// A sub-trajectory as the reward stage sees it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubOutcome {
    pub format_ok: bool,
    /// The judge's score of the sub-task's execution in [0, 1], when a judge runs.
    #[serde(default)]
    pub expert: Option<f64>,
}

/// Rewards, alignment and advantages of one question's K rollouts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Question {
    /// R_M per rollout.
    pub main_rewards: Vec<f64>,
    /// Â_M per rollout (every token of the main agent's own turns carries it).
    pub main_advantages: Vec<f64>,
    /// R_S per rollout and sub-trajectory.
    pub sub_rewards: Vec<Vec<f64>>,
    /// Each rollout's `d` aligned slots.
    pub slots: Vec<Vec<Slot>>,
    /// Â_S per rollout and sub-trajectory (0 for a dropped one, which is out of the loss).
    pub sub_advantages: Vec<Vec<f64>>,
    /// Loss weight per rollout and sub-trajectory: the slots it fills.
    pub sub_copies: Vec<Vec<usize>>,
}

impl Question {
    /// Duplicated slots, dropped sub-trajectories and masked slots (the alignment's metrics).
    pub fn alignment_counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for (copies, slots) in self.sub_copies.iter().zip(&self.slots) {
            counts.0 += copies.iter().map(|&c| c.saturating_sub(1)).sum::<usize>();
            counts.1 += copies.iter().filter(|&&c| c == 0).count();
            counts.2 += slots.iter().filter(|s| **s == Slot::Masked).count();
        }
        counts
    }
}

/// Rewards, aligned groups and advantages of one question's rollouts; `rng` draws the
/// alignment's duplicates and drops.
pub fn question(rollouts: &[Rollout], settings: &MgrpoSettings, rng: &mut impl Rng) -> Question {
    let main_rewards: Vec<f64> =
        rollouts.iter().map(|r| settings.main_reward(r.main.format_ok, r.main.correct)).collect();
    let main_advantages = population_advantages(&main_rewards, settings.epsilon);
    let sub_rewards: Vec<Vec<f64>> = rollouts
        .iter()
        .map(|r| r.subs.iter().map(|s| settings.sub_reward(s.format_ok, &r.main, s.expert)).collect())
        .collect();
    let slots: Vec<Vec<Slot>> = rollouts.iter().map(|r| align(r.subs.len(), settings.align, rng)).collect();
    // The sub-agent's group: every filled slot of every rollout, duplicates included.
    let filled: Vec<f64> = slots
        .iter()
        .zip(&sub_rewards)
        .flat_map(|(s, r)| s.iter().filter_map(|slot| if let Slot::Sub(i) = *slot { Some(r[i]) } else { None }))
        .collect();
    let m = mean(&filled);
    let sd = mean(&filled.iter().map(|r| (r - m).powi(2)).collect::<Vec<_>>()).sqrt();
    let sub_copies: Vec<Vec<usize>> = slots.iter().zip(rollouts).map(|(s, r)| copies(s, r.subs.len())).collect();
    let sub_advantages = sub_rewards
        .iter()
        .zip(&sub_copies)
        .map(|(rs, cs)| {
            rs.iter()
                .zip(cs)
                .map(|(r, &c)| if c == 0 || sd == 0.0 { 0.0 } else { (r - m) / (sd + settings.epsilon) })
                .collect()
        })
        .collect();
    Question { main_rewards, main_advantages, sub_rewards, slots, sub_advantages, sub_copies }
}

/// The seed of a question's alignment draws: the run's seed and the question's id, so a
/// question aligns the same way in every process and on every replay.
pub fn question_seed(seed: u64, question: &str) -> u64 {
    crate::stable_hash::mix_seed(&[seed, crate::stable_hash::hash_bytes(question.as_bytes()), 0xA11C])
}

/// An M-GRPO batch as `hacpo rl inspect` reads it (docs/mgrpo-batch.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// `"mgrpo"`.
    pub algorithm: String,
    #[serde(default)]
    pub settings: MgrpoSettings,
    /// The alignment's seed (with each question's id).
    #[serde(default)]
    pub seed: u64,
    pub questions: Vec<BatchQuestion>,
}

/// One question's rollouts.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchQuestion {
    pub id: String,
    pub rollouts: Vec<Rollout>,
}

/// What M-GRPO makes of one trajectory: the main agent's of a rollout (`sub: None`) or one
/// sub-trajectory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrajectoryReport {
    pub question: String,
    pub rollout: usize,
    pub sub: Option<usize>,
    pub format_ok: bool,
    pub reward: f64,
    pub advantage: f64,
    /// Loss weight: 1 for a main trajectory; the aligned slots it fills for a sub-trajectory.
    pub copies: usize,
}

impl Batch {
    /// Every trajectory's reward, advantage and loss weight; errors name the question.
    pub fn report(&self) -> std::result::Result<Vec<TrajectoryReport>, String> {
        if self.algorithm != "mgrpo" {
            return Err(format!("algorithm: expected \"mgrpo\", found {:?}", self.algorithm));
        }
        self.settings.validate().map_err(|e| format!("settings: {e}"))?;
        let mut out = vec![];
        for q in &self.questions {
            let bad = |what: String| format!("question {:?}: {what}", q.id);
            if q.rollouts.is_empty() {
                return Err(bad("no rollouts".into()));
            }
            for (k, r) in q.rollouts.iter().enumerate() {
                let judged = r.subs.iter().filter_map(|s| s.expert);
                if !(0.0..=1.0).contains(&r.main.correct) || judged.clone().any(|e| !(0.0..=1.0).contains(&e)) {
                    return Err(bad(format!("rollout {k}: correct and expert are scores in [0, 1]")));
                }
            }
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(question_seed(self.seed, &q.id));
            let result = question(&q.rollouts, &self.settings, &mut rng);
            for (k, r) in q.rollouts.iter().enumerate() {
                out.push(TrajectoryReport {
                    question: q.id.clone(),
                    rollout: k,
                    sub: None,
                    format_ok: r.main.format_ok,
                    reward: result.main_rewards[k],
                    advantage: result.main_advantages[k],
                    copies: 1,
                });
                for (i, s) in r.subs.iter().enumerate() {
                    out.push(TrajectoryReport {
                        question: q.id.clone(),
                        rollout: k,
                        sub: Some(i),
                        format_ok: s.format_ok,
                        reward: result.sub_rewards[k][i],
                        advantage: result.sub_advantages[k][i],
                        copies: result.sub_copies[k][i],
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The human view of a report: one line per trajectory.
pub fn table(rows: &[TrajectoryReport]) -> String {
    let mut s = format!(
        "{:<10} {:>7} {:<6} {:>6} {:>8} {:>9} {:>6}\n",
        "question", "rollout", "agent", "format", "reward", "advantage", "copies"
    );
    for r in rows {
        s += &format!(
            "{:<10} {:>7} {:<6} {:>6} {:>8.4} {:>9.4} {:>6}\n",
            r.question.chars().take(10).collect::<String>(),
            r.rollout,
            r.sub.map_or("main".to_string(), |i| format!("sub{i}")),
            if r.format_ok { "ok" } else { "bad" },
            r.reward,
            r.advantage,
            r.copies,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use rand_chacha::ChaCha8Rng;

    use super::*;

    fn rng() -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(7)
    }

    #[test]
    fn main_reward_is_format_then_correctness() {
        let s = MgrpoSettings::default();
        assert_eq!(s.main_reward(false, 1.0), 0.0);
        assert!((s.main_reward(true, 0.0) - 0.1).abs() < 1e-12);
        assert!((s.main_reward(true, 1.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn sub_reward_paper_and_released() {
        let mut s = MgrpoSettings::default();
        let right = MainOutcome { format_ok: true, correct: 1.0 };
        let wrong = MainOutcome { format_ok: true, correct: 0.0 };
        let broken = MainOutcome { format_ok: false, correct: 1.0 };
        // Paper: 0.1·format + 0.4·main correct + 0.5·judge.
        assert!((s.sub_reward(true, &right, Some(0.6)) - (0.1 + 0.4 + 0.3)).abs() < 1e-12);
        assert!((s.sub_reward(true, &right, None) - 0.5).abs() < 1e-12);
        assert!((s.sub_reward(true, &wrong, Some(1.0)) - 0.6).abs() < 1e-12);
        assert!((s.sub_reward(true, &broken, None) - 0.1).abs() < 1e-12, "a malformed main answer is not correct");
        assert_eq!(s.sub_reward(false, &right, Some(1.0)), 0.0);
        s.sub_reward = SubReward::Released;
        assert_eq!(s.sub_reward(true, &right, None), 1.0);
        assert_eq!(s.sub_reward(true, &wrong, None), 0.1);
        assert_eq!(s.sub_reward(true, &broken, None), 0.1);
        assert_eq!(s.sub_reward(false, &right, None), 0.0);
    }

    #[test]
    fn alignment_duplicates_drops_and_masks() {
        let mut r = rng();
        assert_eq!(align(0, 3, &mut r), vec![Slot::Masked; 3]);
        assert_eq!(align(3, 3, &mut r), vec![Slot::Sub(0), Slot::Sub(1), Slot::Sub(2)]);
        for _ in 0..50 {
            let few = align(2, 5, &mut r);
            let c = copies(&few, 2);
            assert_eq!(few.len(), 5);
            assert!(c.iter().all(|&c| c >= 1), "every own sub-trajectory stays: {few:?}");
            assert_eq!(c.iter().sum::<usize>(), 5);
            let many = align(6, 4, &mut r);
            let c = copies(&many, 6);
            assert_eq!(c.iter().filter(|&&c| c == 0).count(), 2, "{many:?}");
            assert!(c.iter().all(|&c| c <= 1), "a drop never duplicates: {many:?}");
        }
        // Every sub-trajectory is dropped sometimes: the drop is uniform, not the last ones.
        let mut dropped = [0; 6];
        for _ in 0..600 {
            for (i, c) in copies(&align(6, 3, &mut r), 6).into_iter().enumerate() {
                dropped[i] += (c == 0) as usize;
            }
        }
        assert!(dropped.iter().all(|&n| (200..400).contains(&n)), "{dropped:?}");
    }

    #[test]
    fn pilot_picks_the_99th_percentile() {
        let mut calls = vec![1; 90];
        calls.extend([2; 9]);
        calls.push(30);
        assert_eq!(pilot_align(&calls, 0.99), 2);
        assert_eq!(pilot_align(&calls, 1.0), 30);
        assert_eq!(pilot_align(&[0, 0, 0], 0.99), 1);
        assert_eq!(pilot_align(&[], 0.99), 1);
    }

    #[test]
    fn population_std_and_flat_groups() {
        // Rewards 1, 0.1, 0.1, 0: mean 0.3, population variance (0.49 + 0.04 + 0.04 + 0.09) / 4.
        let a = population_advantages(&[1.0, 0.1, 0.1, 0.0], 0.0);
        let sd = (0.66f64 / 4.0).sqrt();
        for (x, r) in a.iter().zip([1.0, 0.1, 0.1, 0.0]) {
            assert!((x - (r - 0.3) / sd).abs() < 1e-12, "{a:?}");
        }
        assert_eq!(population_advantages(&[0.1, 0.1], 1e-6), vec![0.0, 0.0]);
    }

    /// A hand computation: K = 3 rollouts, d = 2, paper rewards without a judge.
    #[test]
    fn question_matches_a_hand_computation() {
        let sub = |ok: bool| SubOutcome { format_ok: ok, expert: None };
        let rollouts = vec![
            // Right answer, one call: the call fills both slots.
            Rollout { main: MainOutcome { format_ok: true, correct: 1.0 }, subs: vec![sub(true)] },
            // Wrong answer, two calls, one malformed.
            Rollout { main: MainOutcome { format_ok: true, correct: 0.0 }, subs: vec![sub(true), sub(false)] },
            // Malformed, never delegated: two masked slots.
            Rollout { main: MainOutcome { format_ok: false, correct: 0.0 }, subs: vec![] },
        ];
        let s = MgrpoSettings { align: 2, epsilon: 0.0, ..Default::default() };
        let q = question(&rollouts, &s, &mut rng());
        assert_eq!(q.main_rewards.len(), 3);
        for (x, want) in q.main_rewards.iter().zip([1.0, 0.1, 0.0]) {
            assert!((x - want).abs() < 1e-12);
        }
        // Main: mean 1.1/3, population variance over the three.
        let m = 1.1 / 3.0;
        let sd = (([1.0, 0.1, 0.0].iter().map(|r: &f64| (r - m).powi(2)).sum::<f64>()) / 3.0).sqrt();
        for (x, r) in q.main_advantages.iter().zip([1.0, 0.1, 0.0]) {
            assert!((x - (r - m) / sd).abs() < 1e-12);
        }
        // Sub rewards: 0.1 + 0.4 = 0.5; 0.1; 0.
        assert_eq!(q.sub_copies, vec![vec![2], vec![1, 1], vec![]]);
        assert_eq!(q.slots[2], vec![Slot::Masked; 2]);
        // The group: 0.5, 0.5 (duplicate), 0.1, 0: mean 0.275, masked slots out.
        let filled = [0.5f64, 0.5, 0.1, 0.0];
        let m = 0.275f64;
        let sd = (filled.iter().map(|r| (r - m).powi(2)).sum::<f64>() / 4.0).sqrt();
        assert!((q.sub_advantages[0][0] - (0.5 - m) / sd).abs() < 1e-12);
        assert!((q.sub_advantages[1][0] - (0.1 - m) / sd).abs() < 1e-12);
        assert!((q.sub_advantages[1][1] - (0.0 - m) / sd).abs() < 1e-12);
        assert_eq!(q.alignment_counts(), (1, 0, 2));
    }

    #[test]
    fn settings_refuse_what_cannot_train() {
        assert!(MgrpoSettings::default().validate().is_ok());
        let bad = [
            MgrpoSettings { align: 0, ..Default::default() },
            MgrpoSettings { main_weights: [f64::NAN, 0.9], ..Default::default() },
            MgrpoSettings { sub_weights: [0.1, -0.4, 0.5], ..Default::default() },
            MgrpoSettings { epsilon: -1.0, ..Default::default() },
        ];
        for s in bad {
            assert!(s.validate().is_err(), "{s:?}");
        }
    }
}
