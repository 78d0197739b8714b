//! MHGPO (docs/algorithms.md §3): critic-free training of a multi-agent pipeline. The workload
//! branches each question's rollouts as the registry's shape says (IS, FoF or RR), carries
//! rewards up the tree and masks singletons ([`crate::rl::mhgpo`]); what reaches the algorithm is every
//! trained output with its propagated reward and its (question, role, fork) group. The loss is
//! GRPO's token-level clipped surrogate (§3.4), each output with its own role's prompt; a shared
//! policy gets all roles' outputs in one batch.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::grpo::TokenClip;
use super::gspo::group_advantages;
use crate::error::{Error, Result};
use crate::rl::algorithm::{AlgoSettings, Algorithm, MicroBatch, Routing};
use crate::rl::objective::LossAggregation;
use crate::rl::records::PoolSample;

/// The three MHGPO variants differ only in how the rollouts branch (the registry's shapes),
/// not in their loss.
pub struct Mhgpo {
    name: &'static str,
    clip: TokenClip,
}

impl Mhgpo {
    /// `name` is `mhgpo-is`, `mhgpo-fof` or `mhgpo-rr`.
    pub fn new(s: &AlgoSettings, name: &'static str) -> Result<Self> {
        Ok(Mhgpo {
            name,
            clip: TokenClip {
                eps_low: s.clip_low.unwrap_or(0.2),
                eps_high: s.clip_high.unwrap_or(0.28),
                aggregation: s.loss_agg.unwrap_or(LossAggregation::TokenMean),
                // ε must be positive: 0 would divide a uniform group by 0.
                adv_epsilon: s.adv_epsilon.max(f64::MIN_POSITIVE),
                normalize_by_std: true,
            },
        })
    }
}

impl<B: Backend> Algorithm<B> for Mhgpo {
    fn name(&self) -> &'static str {
        self.name
    }

    fn routing(&self) -> Routing {
        Routing::Own
    }

    /// `(R − mean) / (std + ε)` within each (question, role, fork) group. The workload has
    /// already left out singletons and untrained continuations, so every group that reaches
    /// here is whole and has at least two members: this equals `rl::mhgpo::advantages`.
    fn advantages(&self, samples: &[PoolSample], _learner: usize) -> Result<Vec<f64>> {
        // A singleton here would get A = R (verl's convention), the case §3.5 rules out.
        let mut sizes = std::collections::HashMap::new();
        for s in samples {
            *sizes.entry(s.group).or_insert(0usize) += 1;
        }
        if let Some((group, _)) = sizes.iter().find(|(_, n)| **n < 2) {
            return Err(Error::Internal(format!("MHGPO group {group} reached the loss with one output")));
        }
        Ok(group_advantages(samples, self.clip.adv_epsilon, true))
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        self.clip.loss(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::mhgpo::{Fork, MhgpoSettings, Node, advantages, propagate};
    use crate::rl::registry::{RolloutShape, shape};

    fn settings() -> AlgoSettings {
        crate::config::AlgoConfig::default().settings()
    }

    #[test]
    fn the_three_variants_branch_as_named() {
        let fork = |name| match shape(name).unwrap() {
            RolloutShape::Tree { fork, .. } => fork,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!([fork("mhgpo-is"), fork("mhgpo-fof"), fork("mhgpo-rr")], [Fork::Is, Fork::Fof, Fork::Rr]);
    }

    /// The trainer's advantages over the trained outputs equal the tree arithmetic's.
    #[test]
    fn advantages_match_the_tree_arithmetic() {
        let algo = Mhgpo::new(&settings(), "mhgpo-fof").unwrap();
        let tree = MhgpoSettings { epsilon: algo.clip.adv_epsilon, ..MhgpoSettings::default() };
        let node = |role, parent, score: Option<f64>, penalty| Node {
            role,
            parent,
            penalty,
            score,
            group: format!("fork0/role{role}"),
            trained: true,
        };
        // FoF with G = 2 over two roles: two Rewriter outputs, each with one Answerer output.
        let nodes = vec![
            node(0, None, None, 0.0),
            node(1, Some(0), Some(0.5), 0.0),
            node(0, None, None, -0.5),
            node(1, Some(2), Some(1.0), -1.0),
        ];
        let rewards = propagate(&nodes, &tree).unwrap();
        let (expected, mask) = advantages(&nodes, &rewards, &tree);
        assert!(mask.iter().all(|&m| m));
        let pool: Vec<PoolSample> =
            nodes.iter().zip(&rewards).map(|(n, &r)| PoolSample { agent: 0, group: n.role, reward: r }).collect();
        let got = <Mhgpo as Algorithm<crate::backend::Cpu>>::advantages(&algo, &pool, 0).unwrap();
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-12, "{got:?} vs {expected:?}");
        }
    }
}
