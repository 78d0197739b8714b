//! AT-GRPO's grouping and branch selection (docs/algorithms.md §5), plain and testable without a
//! model: the turn-wise workload asks here which group a decision belongs to, how a branch's
//! reward mixes the team's and the role's own, and which branch the episode continues from.
//!
//! At each (task, agent, turn) K candidates are sampled from one shared state, so they share
//! one prompt and form a group of K: the key is (task id, agent, turn), the paper's semantics
//! (PettingLLMs' code divides the task index by the branch count, which would merge tasks).
//! The baseline it replaces, whole-trajectory grouping, samples K independent trajectories and
//! groups the outputs that answer the same prompt: after the first turn every trajectory has a
//! history of its own (a role that reads another's output per trajectory, from the first), so
//! those groups are singletons, whose advantage is their raw reward (verl's convention): no
//! baseline, no variance reduction.

use serde::{Deserialize, Serialize};

use crate::sample::GroupKey;
use crate::stable_hash::hash_bytes;

/// How a turn-wise workload groups its decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Grouping {
    /// AT-GRPO: K branches per (task, agent, turn) from one shared state; the best continues.
    #[default]
    TurnWise,
    /// Multi-agent GRPO with whole trajectories: K independent rollouts per task, grouped by
    /// identical prompt (task, agent, turn and the history itself).
    Trajectory,
}

/// How the turn-wise workload rolls an episode out for an algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnRollout {
    pub grouping: Grouping,
    /// Only the plan role plays (single-agent GRPO): no tool role, no tool.
    pub single_agent: bool,
}

/// One decision of an agent: the task, the agent's role, the turn and the exact prompt text.
#[derive(Clone, Copy, Debug)]
pub struct Decision<'a> {
    pub task: &'a str,
    pub role: &'a str,
    pub turn: u32,
    pub prompt: &'a str,
}

/// The group a decision's advantage is normalised in.
pub fn group_key(grouping: Grouping, d: &Decision) -> GroupKey {
    let turn = d.turn.to_string();
    match grouping {
        Grouping::TurnWise => GroupKey::new(&[d.task, d.role, &turn]),
        Grouping::Trajectory => {
            let history = format!("{:016x}", hash_bytes(d.prompt.as_bytes()));
            GroupKey::new(&[d.task, d.role, &turn, &history])
        }
    }
}

/// `α · team + local` (α = 1 in the paper's experiments).
pub fn mixed_reward(alpha: f64, team: f64, local: f64) -> f64 {
    alpha * team + local
}

/// The branch the episode continues from: the highest reward, the first on ties; a NaN reward
/// never wins (PettingLLMs' `argmax`, made total).
pub fn best_branch(rewards: &[f64]) -> usize {
    let mut best = 0;
    for (i, &r) in rewards.iter().enumerate() {
        if r > rewards[best] || rewards[best].is_nan() && !r.is_nan() {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::rl::stats::grpo_advantages;

    /// Group labels for `grpo_advantages` from keys, in order of first appearance.
    fn labels(keys: &[GroupKey]) -> Vec<usize> {
        let mut index: HashMap<&GroupKey, usize> = HashMap::new();
        keys.iter()
            .map(|k| {
                let next = index.len();
                *index.entry(k).or_insert(next)
            })
            .collect()
    }

    /// A hand-built two-turn episode of one task with two agents (tool, plan) and K = 3
    /// branches per decision. Turn 0: the tool's branches score 0, 1, 2 and the plan's 1, 1, 4;
    /// turn 1: the tool's 2, 2, 2 and the plan's 0, 3, 3.
    #[test]
    fn turn_wise_groups_have_k_members_and_hand_computed_advantages() {
        let rewards = [[[0.0, 1.0, 2.0], [1.0, 1.0, 4.0]], [[2.0, 2.0, 2.0], [0.0, 3.0, 3.0]]];
        let (mut keys, mut flat) = (Vec::new(), Vec::new());
        for (turn, agents) in rewards.iter().enumerate() {
            for (agent, role) in ["tool", "plan"].iter().enumerate() {
                // Every branch of a decision sees the same prompt: the shared state.
                let prompt = format!("turn {turn} state after the best branch");
                for &r in &agents[agent] {
                    keys.push(group_key(
                        Grouping::TurnWise,
                        &Decision { task: "plan-path/7", role, turn: turn as u32, prompt: &prompt },
                    ));
                    flat.push(r);
                }
            }
        }
        let groups = labels(&keys);
        assert_eq!(groups, vec![0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        assert_eq!(keys[0], GroupKey("plan-path/7|tool|0".into()));
        assert_eq!(keys[9], GroupKey("plan-path/7|plan|1".into()));
        let adv = grpo_advantages(&flat, &groups, 1e-6, true);
        // Tool, turn 0: mean 1, unbiased std 1 → −1, 0, 1.
        let want0 = [-1.0, 0.0, 1.0].map(|a: f64| a / (1.0 + 1e-6));
        // Plan, turn 0: mean 2, unbiased std √3 → (−1, −1, 2)/√3.
        let s = 3f64.sqrt() + 1e-6;
        let want1 = [-1.0 / s, -1.0 / s, 2.0 / s];
        // Tool, turn 1: all equal → 0. Plan, turn 1: mean 2, std √3 → (−2, 1, 1)/√3.
        let want3 = [-2.0 / s, 1.0 / s, 1.0 / s];
        let want: Vec<f64> = want0.iter().chain(&want1).chain(&[0.0; 3]).chain(&want3).copied().collect();
        for (a, w) in adv.iter().zip(&want) {
            assert!((a - w).abs() < 1e-12, "{adv:?} vs {want:?}");
        }
        // The plan continues from its best branch at each turn.
        assert_eq!(best_branch(&rewards[0][1]), 2);
        assert_eq!(best_branch(&rewards[1][1]), 1, "the first of equal rewards");
    }

    #[test]
    fn trajectory_grouping_leaves_singletons_after_the_first_turn() {
        let k = 3;
        let mut keys = Vec::new();
        for turn in 0..2u32 {
            for branch in 0..k {
                // Turn 0: one prompt for all; turn 1: each trajectory's own history.
                let prompt = if turn == 0 { "start".to_string() } else { format!("start, then move {branch}") };
                keys.push(group_key(
                    Grouping::Trajectory,
                    &Decision { task: "sokoban/3", role: "plan", turn, prompt: &prompt },
                ));
            }
        }
        let groups = labels(&keys);
        assert_eq!(groups, vec![0, 0, 0, 1, 2, 3]);
        let adv = grpo_advantages(&[1.0, 0.0, 2.0, 5.0, 0.0, 1.0], &groups, 1e-6, true);
        // A singleton has no baseline: verl's GRPO (and so PettingLLMs') gives it its raw reward.
        assert_eq!(&adv[3..], &[5.0, 0.0, 1.0], "singletons keep their raw rewards: {adv:?}");
        assert!(adv[..3].iter().any(|&a| a != 0.0));
        // Identical histories still meet: two trajectories that moved alike share a group.
        let same = |b| group_key(Grouping::Trajectory, &Decision { task: "t", role: "plan", turn: 1, prompt: b });
        assert_eq!(same("h"), same("h"));
        assert_ne!(same("h"), same("h2"));
    }

    #[test]
    fn the_mixed_reward_and_the_best_branch() {
        assert_eq!(mixed_reward(1.0, 2.0, -0.5), 1.5);
        assert_eq!(mixed_reward(0.7, 1.0, 0.0), 0.7);
        assert_eq!(best_branch(&[f64::NAN, -3.0, -1.0]), 2);
        assert_eq!(best_branch(&[1.0, f64::NAN, 1.0]), 0);
        assert_eq!(best_branch(&[]), 0);
    }
}
