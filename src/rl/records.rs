//! The plain records an algorithm computes on, whatever the algorithm: a routed response as
//! the advantage sees it ([`PoolSample`]), and a response's sequence-level terms after an
//! update ([`SampleTerms`], for metrics and audits).

use serde::{Deserialize, Serialize};

/// One response as an algorithm's advantage sees it: who produced it, its group, its reward.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolSample {
    /// Source agent.
    pub agent: usize,
    /// Prompt group.
    pub group: usize,
    pub reward: f64,
}

/// What a sequence-level objective (HACPO, GSPO) does to one response in the learner's
/// mini-batch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleTerms {
    /// Advantage before ω.
    pub advantage: f64,
    /// ω(source, learner); 1 for own responses.
    pub coef: f64,
    /// Sequence ratio s.
    pub ratio: f64,
    /// s after the clip that applies to it (GSPO band or cross stepwise clamp).
    pub clipped_ratio: f64,
    pub objective: f64,
    /// ∂objective / ∂mean_logp_target.
    pub grad_weight: f64,
    pub cross: bool,
}
