//! Groups that carry no signal: a group whose rewards are all equal gets advantage 0 for every
//! member, so group-relative methods learn nothing from it. This stage measures how much of a
//! step that is (per policy and role, with the policy's sampled entropy beside it, since a
//! policy that stops exploring makes every group flat) and, with `algo.filter_groups`, keeps
//! only prompts that carry signal, as DAPO's dynamic sampling does: flat groups leave the loss,
//! prompts without any other group leave the step, and more prompts are drawn until the step
//! has `prompts_per_step` of them or `algo.filter_max_draws` rollouts were made.

use std::collections::{BTreeMap, HashMap};

use crate::sample::{GroupKey, Sample};
use crate::train::metrics::Metrics;

/// Rewards closer than this are equal (rewards are sums of a few terms, not noise).
const EQUAL: f64 = 1e-9;

/// The groups of the trained samples (two or more members) whose rewards are all equal.
pub fn flat_groups(samples: &[Sample]) -> std::collections::HashSet<GroupKey> {
    let mut range: HashMap<&GroupKey, (f64, f64, usize)> = HashMap::new();
    for s in samples.iter().filter(|s| s.train) {
        let r = s.reward();
        let e = range.entry(&s.group).or_insert((r, r, 0));
        e.0 = e.0.min(r);
        e.1 = e.1.max(r);
        e.2 += 1;
    }
    range.into_iter().filter(|(_, (lo, hi, n))| *n >= 2 && hi - lo <= EQUAL).map(|(k, _)| k.clone()).collect()
}

/// Policy `policy`'s share of trained samples in flat groups, per role (`groups/<role>/flat_share`)
/// and over all (`groups/flat_share`), and its sampled entropy (`actor/entropy`: the mean of
/// −log π over the sampled response tokens, an unbiased estimate of the per-token entropy when
/// sampling at temperature 1).
pub fn metrics(samples: &[Sample], policy: usize) -> Metrics {
    let flat = flat_groups(samples);
    let own: Vec<&Sample> = samples.iter().filter(|s| s.policy == policy && s.train).collect();
    let mut per_role: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for s in &own {
        let e = per_role.entry(s.role.as_str()).or_default();
        e.0 += usize::from(flat.contains(&s.group));
        e.1 += 1;
    }
    let mut m = Metrics::new();
    let share = |(f, n): (usize, usize)| f as f64 / n.max(1) as f64;
    let all = per_role.values().fold((0, 0), |a, &(f, n)| (a.0 + f, a.1 + n));
    m.insert("groups/flat_share".into(), share(all));
    for (role, counts) in per_role {
        m.insert(format!("groups/{role}/flat_share"), share(counts));
    }
    let (sum, tokens) = samples
        .iter()
        .filter(|s| s.policy == policy)
        // The environment's tokens between a trajectory's turns were not sampled.
        .flat_map(|s| s.token_logps.iter().enumerate().filter(|(t, _)| s.loss_mask.get(*t) != Some(&false)))
        .fold((0.0, 0usize), |(sum, n), (_, &lp)| (sum - lp as f64, n + 1));
    if tokens > 0 {
        m.insert("actor/entropy".into(), sum / tokens as f64);
    }
    m
}

/// The step's prompts (by index) that carry signal: at least one trained, non-flat group.
pub fn prompts_with_signal(samples: &[Sample]) -> std::collections::BTreeSet<usize> {
    let flat = flat_groups(samples);
    samples.iter().filter(|s| s.train && !flat.contains(&s.group)).map(|s| s.prompt).collect()
}

/// Keeps the first `want` prompts that carry signal (in order) and their samples, with the
/// samples of flat groups out of the loss; renumbers prompts and parent links. Returns the
/// kept prompt indices (into the old numbering), in order.
pub fn keep_signal(samples: &mut Vec<Sample>, want: usize) -> Vec<usize> {
    let flat = flat_groups(samples);
    let kept: Vec<usize> = prompts_with_signal(samples).into_iter().take(want).collect();
    keep(samples, &kept, &flat);
    kept
}

/// Keeps the first `want` prompts as drawn, masking nothing.
pub fn keep_first(samples: &mut Vec<Sample>, want: usize) -> Vec<usize> {
    let mut kept: Vec<usize> = samples.iter().map(|s| s.prompt).collect();
    kept.sort_unstable();
    kept.dedup();
    kept.truncate(want);
    keep(samples, &kept, &Default::default());
    kept
}

/// Keeps the samples of the prompts `kept` (old indices, in their new order), renumbering
/// prompts and parent links, with the samples of `flat` groups out of the loss.
fn keep(samples: &mut Vec<Sample>, kept: &[usize], flat: &std::collections::HashSet<GroupKey>) {
    let new_prompt: HashMap<usize, usize> = kept.iter().enumerate().map(|(new, &old)| (old, new)).collect();
    let mut new_index = vec![None; samples.len()];
    let mut next = 0;
    for (i, s) in samples.iter().enumerate() {
        if new_prompt.contains_key(&s.prompt) {
            new_index[i] = Some(next);
            next += 1;
        }
    }
    let old = std::mem::take(samples);
    for (i, mut s) in old.into_iter().enumerate() {
        if new_index[i].is_none() {
            continue;
        }
        s.prompt = new_prompt[&s.prompt];
        s.parent = s.parent.and_then(|p| new_index[p]);
        if flat.contains(&s.group) {
            s.train = false;
        }
        samples.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(prompt: usize, group: &str, reward: f64, parent: Option<usize>) -> Sample {
        Sample {
            id: 0,
            policy: 0,
            role: if group.ends_with('a') { "answerer".into() } else { "solver".into() },
            group: GroupKey::new(&[group]),
            parent,
            turn: 0,
            prompt,
            sample_index: 0,
            messages: vec![],
            text: String::new(),
            prompt_ids: vec![],
            response_ids: vec![1],
            token_logps: vec![-0.5, -1.5],
            values: vec![],
            reward: Some(reward),
            penalty: 0.0,
            score: None,
            train: true,
            policy_version: 0,
            finish_reason: crate::generate::FinishReason::Stop,
            loss_mask: vec![],
        }
    }

    /// Prompt 0 has a flat group (g0) and one with signal (g0a); prompt 1 only a flat group;
    /// prompt 2 one with signal whose second member consumed the first's output.
    fn step() -> Vec<Sample> {
        vec![
            sample(0, "g0", 1.0, None),
            sample(0, "g0", 1.0, None),
            sample(0, "g0a", 0.0, None),
            sample(0, "g0a", 1.0, None),
            sample(1, "g1", 0.0, None),
            sample(1, "g1", 0.0, None),
            sample(2, "g2", 0.5, None),
            sample(2, "g2", 0.0, Some(6)),
        ]
    }

    #[test]
    fn flat_shares_are_per_role_and_entropy_is_the_sampled_estimate() {
        let m = metrics(&step(), 0);
        // solver: g0 (2 flat) + g1 (2 flat) + g2 (2 with signal) → 4/6; answerer: g0a → 0/2.
        assert!((m["groups/solver/flat_share"] - 4.0 / 6.0).abs() < 1e-12, "{m:?}");
        assert_eq!(m["groups/answerer/flat_share"], 0.0);
        assert!((m["groups/flat_share"] - 0.5).abs() < 1e-12);
        assert!((m["actor/entropy"] - 1.0).abs() < 1e-12);
        // Tokens the environment wrote between a trajectory's turns were not sampled.
        let mut masked = step();
        for s in &mut masked {
            s.loss_mask = vec![true, false];
        }
        assert!((metrics(&masked, 0)["actor/entropy"] - 0.5).abs() < 1e-12);
    }

    #[test]
    fn keeping_signal_drops_flat_prompts_masks_flat_groups_and_renumbers() {
        let mut s = step();
        assert_eq!(prompts_with_signal(&s).into_iter().collect::<Vec<_>>(), vec![0, 2]);
        let kept = keep_signal(&mut s, 8);
        assert_eq!(kept, vec![0, 2]);
        assert_eq!(s.len(), 6);
        assert_eq!(s.iter().map(|x| x.prompt).collect::<Vec<_>>(), vec![0, 0, 0, 0, 1, 1]);
        assert_eq!(s.iter().map(|x| x.train).collect::<Vec<_>>(), vec![false, false, true, true, true, true]);
        assert_eq!(s[5].parent, Some(4), "the parent link follows its sample");
        let mut s = step();
        assert_eq!(keep_signal(&mut s, 1), vec![0], "at most `want` prompts");
    }
}
