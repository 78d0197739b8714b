//! MHGPO's arithmetic (docs/algorithms.md §3): the rollout tree of a multi-agent pipeline, backward
//! reward propagation, heterogeneous-group advantages, and the three group-sampling plans.
//!
//! A question's rollouts form a tree: each output of role k (0 = first agent) has one parent
//! output of role k − 1 and the outputs of role k + 1 that consumed it as children. Rewards are
//! known at the leaves (the last role's task score plus its format penalty) and flow upwards:
//! `R_k = Aggr(R of its successors) + P_k` (§3.3). Advantages normalise `R` within groups that
//! share (question, role, fork); an output alone in its group has no baseline and is masked out
//! of the loss instead of getting `A = R` (§3.5, the recommended treatment of RR's upstream
//! singletons).
//!
//! Pure arithmetic on plain vectors: no tensors, no text, no threads.

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::stats::{mean, unbiased_std};

/// How a node's successors' rewards combine (§3.3; the paper's ablation compares the three).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    #[default]
    Mean,
    Max,
    Min,
}

impl Aggregate {
    fn apply(self, values: &[f64]) -> f64 {
        match self {
            Aggregate::Mean => mean(values),
            Aggregate::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Aggregate::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }
}

/// One output in a question's rollout tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The role that produced it (0 = first agent of the pipeline).
    pub role: usize,
    /// The output it consumed; `None` for the first role.
    pub parent: Option<usize>,
    /// The role's format penalty for this output (≤ 0).
    pub penalty: f64,
    /// The task score (F1) of a last-role output; `None` upstream.
    #[serde(default)]
    pub score: Option<f64>,
    /// Its group: outputs of one question with the same role and fork share it.
    pub group: String,
    /// Whether the plan trains on it (IS's downstream continuations only produce rewards).
    #[serde(default = "yes")]
    pub trained: bool,
}

fn yes() -> bool {
    true
}

/// Settings of the propagation and the advantage.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MhgpoSettings {
    pub aggregate: Aggregate,
    /// Propagate successors' penalties upwards (the recursion of §3.3, default) or only the
    /// penalty-free task reward.
    pub propagate_penalties: bool,
    pub epsilon: f64,
}

impl Default for MhgpoSettings {
    fn default() -> Self {
        MhgpoSettings { aggregate: Aggregate::Mean, propagate_penalties: true, epsilon: 1e-6 }
    }
}

/// Every node's reward, computed from the leaves up. Errors on a tree that is not one: a leaf
/// (no children) without a score, a parent after its child, a parent of another role.
pub fn propagate(nodes: &[Node], settings: &MhgpoSettings) -> Result<Vec<f64>, String> {
    if !(settings.epsilon.is_finite() && settings.epsilon > 0.0) {
        return Err(format!("epsilon must be a positive number, not {}", settings.epsilon));
    }
    let mut children: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        if !(n.penalty.is_finite() && n.penalty <= 0.0) {
            return Err(format!("node {i}: a penalty is a number ≤ 0, not {}", n.penalty));
        }
        if n.score.is_some_and(|x| !x.is_finite()) {
            return Err(format!("node {i}: the score is not a finite number"));
        }
        if let Some(p) = n.parent {
            if p >= i {
                return Err(format!("node {i}: its parent {p} does not come before it"));
            }
            if nodes[p].role + 1 != n.role {
                return Err(format!("node {i} (role {}): parent {p} has role {}", n.role, nodes[p].role));
            }
            children[p].push(i);
        } else if n.role != 0 {
            return Err(format!("node {i} has role {} but no parent", n.role));
        }
    }
    // reward: R; task: the same without any penalty below the node (for the flag).
    let mut reward = vec![0.0; nodes.len()];
    let mut task = vec![0.0; nodes.len()];
    for i in (0..nodes.len()).rev() {
        let n = &nodes[i];
        if children[i].is_empty() {
            let score = n.score.ok_or_else(|| format!("node {i} (role {}) has no successors and no score", n.role))?;
            task[i] = score;
            reward[i] = score + n.penalty;
            continue;
        }
        let kids: Vec<f64> =
            children[i].iter().map(|&c| if settings.propagate_penalties { reward[c] } else { task[c] }).collect();
        let kid_tasks: Vec<f64> = children[i].iter().map(|&c| task[c]).collect();
        task[i] = settings.aggregate.apply(&kid_tasks);
        reward[i] = settings.aggregate.apply(&kids) + n.penalty;
    }
    Ok(reward)
}

/// Advantages and loss mask: `(R − mean) / (std + ε)` within each group (unbiased std), and
/// mask `false` for outputs alone in their group or not trained by the plan (advantage 0).
pub fn advantages(nodes: &[Node], rewards: &[f64], settings: &MhgpoSettings) -> (Vec<f64>, Vec<bool>) {
    // Keyed by role too: a group never mixes roles, whatever the labels say.
    let mut groups: std::collections::BTreeMap<(usize, &str), Vec<usize>> = Default::default();
    for (i, n) in nodes.iter().enumerate() {
        groups.entry((n.role, n.group.as_str())).or_default().push(i);
    }
    let mut adv = vec![0.0; nodes.len()];
    let mut mask = vec![false; nodes.len()];
    for members in groups.values() {
        if members.len() < 2 {
            continue;
        }
        let rs: Vec<f64> = members.iter().map(|&i| rewards[i]).collect();
        let (m, s) = (mean(&rs), unbiased_std(&rs));
        for &i in members {
            if nodes[i].trained {
                adv[i] = (rewards[i] - m) / (s + settings.epsilon);
                mask[i] = true;
            }
        }
    }
    (adv, mask)
}

/// How a question's rollouts branch (§3.5).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Sampling {
    /// Independent sampling: for every role, G outputs from one shared upstream prefix, each
    /// continued one-to-one; each role trains on its own homogeneous group.
    Is,
    /// Fork on first: G first-role outputs, each continued one-to-one; every role trains (the
    /// first role's group is homogeneous, the later ones heterogeneous).
    Fof,
    /// Round robin: fork at a role drawn with these probabilities (one per role), a single
    /// chain before it (singletons: masked), one-to-one after it.
    Rr { probabilities: [f64; 3] },
}

impl Sampling {
    /// RR with the paper summary's probabilities (Rewriter, Reranker, Answerer).
    pub const RR_DEFAULT: Sampling = Sampling::Rr { probabilities: [0.7, 0.1, 0.2] };
}

/// Where a question's rollouts fork: [`Sampling`] without RR's probabilities, which are the
/// workload's setting (`workload.search.rr_probabilities`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fork {
    Is,
    Fof,
    Rr,
}

impl Fork {
    /// The sampling plan, RR's fork drawn with `rr_probabilities`.
    pub fn sampling(self, rr_probabilities: [f64; 3]) -> Sampling {
        match self {
            Fork::Is => Sampling::Is,
            Fork::Fof => Sampling::Fof,
            Fork::Rr => Sampling::Rr { probabilities: rr_probabilities },
        }
    }
}

/// How rewards reach the outputs upstream of the last role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credit {
    /// MHGPO's recursion (§3.3): the successors' rewards aggregated plus the output's own
    /// penalty, as the workload's `aggregate` and `propagate_penalties` say.
    Propagated,
    /// The team's outcome (the mean task score of the leaves below) plus the output's own
    /// penalty, never a successor's (MMOA-RAG's rewards, which MAPPO trains on).
    OwnPenalty,
}

/// A node of a plan: what the rollout executor generates, in an order where parents come
/// first. Rewards and penalties are filled in later (as [`Node`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanNode {
    pub role: usize,
    pub parent: Option<usize>,
    pub group: String,
    pub trained: bool,
}

impl Sampling {
    /// Checks the settings for a pipeline of `roles` roles (RR: one probability per role,
    /// finite, ≥ 0, not all 0).
    pub fn validate(&self, roles: usize) -> Result<(), String> {
        if roles == 0 {
            return Err("a pipeline needs at least one role".into());
        }
        if let Sampling::Rr { probabilities } = self {
            if roles != probabilities.len() {
                return Err(format!("RR has {} fork probabilities for {roles} roles", probabilities.len()));
            }
            if probabilities.iter().any(|p| !p.is_finite() || *p < 0.0) || probabilities.iter().sum::<f64>() <= 0.0 {
                return Err(format!("RR fork probabilities must be finite, ≥ 0 and not all 0: {probabilities:?}"));
            }
        }
        Ok(())
    }
}

/// The rollout tree of one question for `roles` roles and group size `g` (settings checked
/// with [`Sampling::validate`]).
pub fn plan(sampling: Sampling, roles: usize, g: usize, rng: &mut impl Rng) -> Result<Vec<PlanNode>, String> {
    sampling.validate(roles)?;
    let mut out = vec![];
    match sampling {
        Sampling::Is => {
            for k in 0..roles {
                fork_at(&mut out, k, roles, g, &format!("fork{k}"), |role| role == k);
            }
        }
        Sampling::Fof => fork_at(&mut out, 0, roles, g, "fork0", |_| true),
        Sampling::Rr { probabilities } => {
            let total: f64 = probabilities.iter().sum();
            let mut x = rng.random_range(0.0..total);
            let mut f = roles - 1;
            for (k, p) in probabilities.iter().take(roles).enumerate() {
                if x < *p {
                    f = k;
                    break;
                }
                x -= p;
            }
            fork_at(&mut out, f, roles, g, &format!("fork{f}"), |role| role >= f);
        }
    }
    Ok(out)
}

/// A chain of single outputs for roles `0..k`, `g` outputs of role `k` from its end, each
/// continued one-to-one to the last role. Groups are `<fork>/role<r>`; the chain's outputs
/// are alone in theirs.
fn fork_at(out: &mut Vec<PlanNode>, k: usize, roles: usize, g: usize, fork: &str, trained: impl Fn(usize) -> bool) {
    let mut parent = None;
    for role in 0..k {
        out.push(PlanNode { role, parent, group: format!("{fork}/chain{role}"), trained: false });
        parent = Some(out.len() - 1);
    }
    for _ in 0..g {
        let mut p = parent;
        for role in k..roles {
            out.push(PlanNode { role, parent: p, group: format!("{fork}/role{role}"), trained: trained(role) });
            p = Some(out.len() - 1);
        }
    }
}

/// A batch for `hacpo rl inspect` (format: `docs/mhgpo-batch.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// `"mhgpo"`.
    pub algorithm: String,
    #[serde(default)]
    pub settings: MhgpoSettings,
    pub questions: Vec<QuestionTree>,
}

/// One question's rollout tree.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuestionTree {
    pub id: String,
    pub nodes: Vec<Node>,
}

/// What MHGPO makes of one output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeReport {
    pub question: String,
    pub node: usize,
    pub role: usize,
    pub parent: Option<usize>,
    pub group: String,
    pub score: Option<f64>,
    pub penalty: f64,
    pub reward: f64,
    pub advantage: f64,
    pub in_loss: bool,
}

impl Batch {
    /// Propagated reward, advantage and mask of every output; errors name the question.
    pub fn report(&self) -> Result<Vec<NodeReport>, String> {
        let mut out = vec![];
        for q in &self.questions {
            let rewards = propagate(&q.nodes, &self.settings).map_err(|e| format!("question {:?}: {e}", q.id))?;
            let (adv, mask) = advantages(&q.nodes, &rewards, &self.settings);
            // Scores near the largest float overflow the group statistics: an error, not a
            // table of nulls.
            if let Some(i) = (0..q.nodes.len()).find(|&i| !(rewards[i].is_finite() && adv[i].is_finite())) {
                return Err(format!(
                    "question {:?}: node {i}'s reward or advantage is not finite (the scores are too large to normalise)",
                    q.id
                ));
            }
            for (i, n) in q.nodes.iter().enumerate() {
                out.push(NodeReport {
                    question: q.id.clone(),
                    node: i,
                    role: n.role,
                    parent: n.parent,
                    group: n.group.clone(),
                    score: n.score,
                    penalty: n.penalty,
                    reward: rewards[i],
                    advantage: adv[i],
                    in_loss: mask[i],
                });
            }
        }
        Ok(out)
    }
}

/// The human view of [`Batch::report`].
pub fn table(rows: &[NodeReport]) -> String {
    let mut s = format!(
        "{:<10} {:>4} {:>4} {:>6} {:<12} {:>7} {:>8} {:>9} {:>9} {:>5}\n",
        "question", "node", "role", "parent", "group", "score", "penalty", "reward", "advantage", "loss"
    );
    for r in rows {
        s += &format!(
            "{:<10} {:>4} {:>4} {:>6} {:<12} {:>7} {:>8.3} {:>9.4} {:>9.4} {:>5}\n",
            r.question.chars().take(10).collect::<String>(),
            r.node,
            r.role,
            r.parent.map_or("-".into(), |p| p.to_string()),
            r.group.chars().take(12).collect::<String>(),
            r.score.map_or("-".into(), |x| format!("{x:.3}")),
            r.penalty,
            r.reward,
            r.advantage,
            if r.in_loss { "yes" } else { "no" },
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn node(role: usize, parent: Option<usize>, penalty: f64, score: Option<f64>, group: &str) -> Node {
        Node { role, parent, penalty, score, group: group.into(), trained: true }
    }

    /// One rewriter output r with two rerankers x0 (penalised −1) and x1; x0 has answers
    /// a0 (F1 1.0) and a1 (F1 0.5, −1 for length), x1 has a2 (F1 0.0).
    fn tree() -> Vec<Node> {
        vec![
            node(0, None, -0.5, None, "r"),
            node(1, Some(0), -1.0, None, "x"),
            node(1, Some(0), 0.0, None, "x"),
            node(2, Some(1), 0.0, Some(1.0), "a"),
            node(2, Some(1), -1.0, Some(0.5), "a"),
            node(2, Some(2), 0.0, Some(0.0), "a"),
        ]
    }

    fn close(a: &[f64], b: &[f64]) {
        assert!(a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12), "{a:?} vs {b:?}");
    }

    #[test]
    fn propagation_by_hand_with_mean_max_min_and_without_penalties() {
        let t = tree();
        let s = |aggregate, propagate_penalties| MhgpoSettings { aggregate, propagate_penalties, epsilon: 1e-6 };
        // Leaves: 1.0, −0.5, 0.0. x0 = mean(1, −0.5) − 1 = −0.75; x1 = 0; r = mean(−0.75, 0) − 0.5.
        close(&propagate(&t, &s(Aggregate::Mean, true)).unwrap(), &[-0.875, -0.75, 0.0, 1.0, -0.5, 0.0]);
        // Max: x0 = 1 − 1 = 0, x1 = 0, r = 0 − 0.5.
        close(&propagate(&t, &s(Aggregate::Max, true)).unwrap(), &[-0.5, 0.0, 0.0, 1.0, -0.5, 0.0]);
        // Min: x0 = −0.5 − 1 = −1.5, x1 = 0, r = −1.5 − 0.5.
        close(&propagate(&t, &s(Aggregate::Min, true)).unwrap(), &[-2.0, -1.5, 0.0, 1.0, -0.5, 0.0]);
        // Only task rewards flow up: x0 = mean(1, 0.5) − 1 = −0.25, x1 = 0,
        // r = mean(0.75, 0) − 0.5 (the task part of x0 is 0.75, its own penalty stays with it).
        close(&propagate(&t, &s(Aggregate::Mean, false)).unwrap(), &[-0.125, -0.25, 0.0, 1.0, -0.5, 0.0]);
    }

    #[test]
    fn bad_sampling_settings_are_errors() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        for p in [[f64::INFINITY, 0.0, 0.0], [0.0; 3], [-0.1, 0.6, 0.5], [f64::NAN, 0.5, 0.5]] {
            assert!(plan(Sampling::Rr { probabilities: p }, 3, 4, &mut rng).is_err(), "{p:?}");
        }
        assert!(plan(Sampling::RR_DEFAULT, 2, 4, &mut rng).unwrap_err().contains("3 fork probabilities"));
        assert!(plan(Sampling::Fof, 0, 4, &mut rng).is_err());
    }

    #[test]
    fn malformed_trees_are_errors() {
        let s = MhgpoSettings::default();
        let mut t = tree();
        t[3].score = None;
        assert!(propagate(&t, &s).unwrap_err().contains("no score"));
        let mut t = tree();
        t[3].parent = Some(0);
        assert!(propagate(&t, &s).unwrap_err().contains("has role 0"));
        let mut t = tree();
        t[1].parent = None;
        assert!(propagate(&t, &s).unwrap_err().contains("no parent"));
        let mut t = tree();
        t[2].penalty = 0.5;
        assert!(propagate(&t, &s).unwrap_err().contains("≤ 0"));
        let zero = MhgpoSettings { epsilon: 0.0, ..s };
        assert!(propagate(&tree(), &zero).unwrap_err().contains("epsilon"));
    }

    #[test]
    fn advantages_normalise_within_groups_and_mask_singletons() {
        let t = tree();
        let s = MhgpoSettings::default();
        let r = propagate(&t, &s).unwrap();
        let (adv, mask) = advantages(&t, &r, &s);
        // "r" is alone: masked. "x": (−0.75, 0): mean −0.375, unbiased std 0.53033.
        assert_eq!(mask, [false, true, true, true, true, true]);
        let sd = (2.0f64 * 0.375 * 0.375).sqrt();
        close(&adv[1..3], &[-0.375 / (sd + 1e-6), 0.375 / (sd + 1e-6)]);
        // "a": (1, −0.5, 0): mean 1/6.
        let a = [1.0, -0.5, 0.0];
        let m = mean(&a);
        let sd = unbiased_std(&a);
        close(&adv[3..], &a.map(|x| (x - m) / (sd + 1e-6)));
        assert_eq!(adv[0], 0.0);
    }

    fn sizes(p: &[PlanNode]) -> std::collections::BTreeMap<String, (usize, usize)> {
        let mut m = std::collections::BTreeMap::new();
        for n in p {
            let e = m.entry(n.group.clone()).or_insert((0, 0));
            e.0 += 1;
            e.1 += n.trained as usize;
        }
        m
    }

    /// Distinct parents among a group's members: 1 = homogeneous.
    fn inputs(p: &[PlanNode], group: &str) -> usize {
        p.iter().filter(|n| n.group == group).map(|n| n.parent).collect::<std::collections::BTreeSet<_>>().len()
    }

    #[test]
    fn fof_forks_once_and_continues_one_to_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let p = plan(Sampling::Fof, 3, 4, &mut rng).unwrap();
        assert_eq!(p.len(), 12);
        let s = sizes(&p);
        assert_eq!(s.len(), 3);
        for r in 0..3 {
            assert_eq!(s[&format!("fork0/role{r}")], (4, 4), "every role trains on G outputs");
        }
        assert_eq!(inputs(&p, "fork0/role0"), 1, "the Rewriter group is homogeneous");
        assert_eq!(inputs(&p, "fork0/role1"), 4, "downstream groups are heterogeneous");
        assert_eq!(inputs(&p, "fork0/role2"), 4);
    }

    #[test]
    fn is_gives_every_role_a_homogeneous_trained_group() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let p = plan(Sampling::Is, 3, 4, &mut rng).unwrap();
        // Fork at 0: 4×3; at 1: 1 + 4×2; at 2: 2 + 4.
        assert_eq!(p.len(), 12 + 9 + 6);
        for k in 0..3 {
            let g = format!("fork{k}/role{k}");
            assert_eq!(sizes(&p)[&g], (4, 4), "{g}");
            assert_eq!(inputs(&p, &g), 1, "{g} is homogeneous");
        }
        let trained = p.iter().filter(|n| n.trained).count();
        assert_eq!(trained, 12, "continuations only produce rewards");
        for (i, n) in p.iter().enumerate() {
            assert!(n.parent.is_none_or(|q| q < i && p[q].role + 1 == n.role));
        }
    }

    #[test]
    fn rr_forks_at_a_random_role_with_the_given_probabilities_and_masks_the_chain() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut forks = [0usize; 3];
        for _ in 0..4000 {
            let p = plan(Sampling::RR_DEFAULT, 3, 4, &mut rng).unwrap();
            let f = p.iter().find(|n| n.trained).unwrap().role;
            forks[f] += 1;
            // A chain of f singletons (untrained), then G × (3 − f) trained outputs.
            assert_eq!(p.len(), f + 4 * (3 - f));
            assert!(p.iter().take(f).all(|n| !n.trained && n.group.contains("chain")));
            assert_eq!(inputs(&p, &format!("fork{f}/role{f}")), 1, "the fork group is homogeneous");
        }
        let share = forks.map(|c| c as f64 / 4000.0);
        for (s, want) in share.iter().zip([0.7, 0.1, 0.2]) {
            assert!((s - want).abs() < 0.03, "{share:?}");
        }
        // A chain output's reward is the mean over its descendants, and it is masked.
        let p = plan(Sampling::Rr { probabilities: [0.0, 0.0, 1.0] }, 3, 2, &mut rng).unwrap();
        let nodes: Vec<Node> = p
            .iter()
            .enumerate()
            .map(|(i, n)| Node {
                role: n.role,
                parent: n.parent,
                penalty: 0.0,
                score: (n.role == 2).then_some(i as f64),
                group: n.group.clone(),
                trained: n.trained,
            })
            .collect();
        let s = MhgpoSettings::default();
        let r = propagate(&nodes, &s).unwrap();
        assert_eq!(r[0], r[1]);
        assert_eq!(r[1], (2.0 + 3.0) / 2.0);
        let (_, mask) = advantages(&nodes, &r, &s);
        assert_eq!(mask, [false, false, true, true]);
    }
}
