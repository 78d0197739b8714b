//! What the trainer needs from an RL algorithm, behind one small trait (verl's `core_algos`
//! split into advantage estimators and policy losses, here one object per algorithm).
//!
//! The trainer never asks *which* algorithm runs: it asks the [`Algorithm`] which samples a
//! policy learns from ([`Routing`]), for the advantages of a learner's samples (per response,
//! or per token from a value model's estimates), how to cut them into mini-batches, and for
//! the loss terms of a micro-batch, which it sums and back-propagates. Algorithms are built by
//! name from [`super::registry`]; their settings are [`AlgoSettings`].

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::capability::CapabilityConfig;
use super::hacpo::MinibatchOrder;
use super::objective::LossAggregation;
use super::records::{PoolSample, SampleTerms};
use super::tensor::AggregationScope;
use crate::error::Result;

/// Which samples a policy learns from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Only the samples it produced itself.
    Own,
    /// Every sample of the groups it takes part in, whoever produced it.
    Shared,
}

/// Settings shared by every algorithm (`[algo]`), plus each algorithm's own table. A `None`
/// means "the algorithm's default" (GSPO's clip band is 3e-4/4e-4, GRPO's 0.2/0.28).
#[derive(Clone, Debug, PartialEq)]
pub struct AlgoSettings {
    pub kl_coef: f64,
    pub clip_low: Option<f64>,
    pub clip_high: Option<f64>,
    pub loss_agg: Option<LossAggregation>,
    pub adv_epsilon: f64,
    pub normalize_by_std: Option<bool>,
    pub max_abs_log_ratio: f64,
    pub hacpo: HacpoSettings,
    pub capability: CapabilityConfig,
    pub drgrpo: DrGrpoSettings,
    pub mappo: super::mappo::CriticSettings,
}

/// HACPO's mechanisms (`[algo.hacpo]`; docs/algorithms.md §2.10 defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HacpoSettings {
    /// Exponential importance-sampling exponent α (§2.7).
    pub alpha: f64,
    /// The cross clip lower bound starts at `1 − delta` (§2.8) …
    pub delta: f64,
    /// … and rises by `delta_step` per mini-batch update within a step.
    pub delta_step: f64,
    /// Capability-weighted baseline (off: plain mean of the pool).
    pub capability_baseline: bool,
    /// ω(source, learner) on cross responses (off: 1).
    pub discrepancy_coef: bool,
    /// Exponential importance sampling (off: α = 0).
    pub exp_is: bool,
    /// Stepwise rising lower bound (off: δ_step = 0).
    pub stepwise: bool,
    /// All rewards of a group equal → plain mean baseline.
    pub uniform_reward_guard: bool,
    /// Weighted baseline above `max_reward` → the learner's own mean reward in the group.
    pub binary_baseline_guard: bool,
    pub max_reward: f64,
    pub minibatch_order: MinibatchOrder,
}

impl Default for HacpoSettings {
    fn default() -> Self {
        let core = super::hacpo::HacpoConfig::default();
        HacpoSettings {
            alpha: core.alpha,
            delta: core.delta,
            delta_step: core.delta_step,
            capability_baseline: core.capability_baseline,
            discrepancy_coef: core.discrepancy_coef,
            exp_is: core.exp_is,
            stepwise: core.stepwise,
            uniform_reward_guard: core.uniform_reward_guard,
            binary_baseline_guard: core.binary_baseline_guard,
            max_reward: core.max_reward,
            minibatch_order: core.minibatch_order,
        }
    }
}

/// Dr. GRPO's settings (`[algo.drgrpo]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrGrpoSettings {
    /// The constant each response's token sum is divided by; 0: `rollout.max_new_tokens`.
    pub norm_length: usize,
}

/// The batch shape a run asks for, which an algorithm may reshape or reject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    pub policies: usize,
    pub group_size: usize,
    pub minibatch_prompts: usize,
    /// The constant length of `seq-mean-token-sum-norm` (starts as `rollout.max_new_tokens`).
    pub norm_length: usize,
}

/// The critic an actor-critic algorithm trains beside each policy (`train::critic`: a value
/// head, one linear map from a last hidden state, on a value model of its own or on the
/// policy's trunk).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ValueModel {
    /// The critic's AdamW rate (no weight decay, constant).
    pub lr: f64,
    /// The head reads a value model of its own, initialised from the policy, rather than the
    /// policy's trunk.
    pub own_trunk: bool,
}

/// What a token-level advantage estimator reads of one routed response: its reward and the
/// value head's estimate at each of its tokens at step start.
#[derive(Clone, Copy, Debug)]
pub struct ValuedResponse<'a> {
    pub reward: f64,
    pub values: &'a [f32],
}

/// Per-token advantages and value targets of a learner's routed responses, in routed order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenAdvantages {
    pub advantages: Vec<Vec<f32>>,
    pub returns: Vec<Vec<f32>>,
}

impl TokenAdvantages {
    /// Each response's mean advantage (what per-response metrics and audits read).
    pub fn means(&self) -> Vec<f64> {
        self.advantages.iter().map(|a| a.iter().map(|&x| x as f64).sum::<f64>() / a.len().max(1) as f64).collect()
    }
}

/// The value side of a micro-batch, `[n, L]` each: the per-token advantages, the head's
/// predictions (with gradient), the rollout's values and the returns.
pub struct ValueBatch<B: Backend> {
    pub advantages: Tensor<B, 2>,
    pub predicted: Tensor<B, 2>,
    pub old: Tensor<B, 2>,
    pub returns: Tensor<B, 2>,
}

/// One weighted term of an algorithm's loss. The trainer back-propagates the weighted sum of
/// the terms (and its own KL term), reads each term back once per mini-batch and logs its
/// mean over the step's mini-batches under `metric`.
pub struct LossTerm<B: Backend> {
    pub metric: &'static str,
    pub weight: f64,
    pub value: Tensor<B, 1>,
}

/// One micro-batch of a learner's update, on the learner's device. Rows are sequences.
pub struct MicroBatch<B: Backend> {
    /// The learner's log-prob of each response token (with gradient), padded `[n, L]`.
    pub logp: Tensor<B, 2>,
    /// 1 on valid tokens.
    pub mask: Tensor<B, 2>,
    /// The producing policy's old per-token log-probs; valid on the learner's own rows only
    /// (another tokenizer's tokens do not line up with the learner's).
    pub old_logp: Tensor<B, 2>,
    /// The producing policy's mean old log-prob per response (own and cross).
    pub mean_logp_source: Vec<f64>,
    pub advantages: Vec<f64>,
    /// An actor-critic algorithm's per-token advantages and value predictions, else `None`.
    pub value: Option<ValueBatch<B>>,
    /// The policy that produced each row.
    pub sources: Vec<usize>,
    pub learner: usize,
    /// The optimizer update within the step (0-based).
    pub minibatch_index: usize,
    /// What the mini-batch aggregate is normalised by.
    pub scope: AggregationScope,
}

/// One response as the metrics see it after an optimizer step (host values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequenceRecord {
    pub source: usize,
    pub advantage: f64,
    pub mean_logp_target: f64,
    pub mean_logp_source: f64,
    pub minibatch_index: usize,
}

/// An RL algorithm as the trainer uses it. `B` is the autodiff backend the loss runs on.
pub trait Algorithm<B: Backend>: Send + Sync {
    /// The registry name (`algo.name`).
    fn name(&self) -> &'static str;

    /// Which samples each policy learns from.
    fn routing(&self) -> Routing;

    /// The fewest policies it can train (sharing needs two).
    fn min_policies(&self) -> usize {
        1
    }

    /// The batch shape it trains with, or an error naming the key to change. GSPO×2 doubles
    /// the group and halves the mini-batch here.
    fn shape(&self, requested: BatchShape) -> Result<BatchShape> {
        Ok(requested)
    }

    /// The value head an actor-critic algorithm trains beside each policy; `None` for
    /// critic-free algorithms. With one, the trainer keeps a head per policy (checkpointed
    /// with the run), estimates every own token's value at step start, asks
    /// [`Algorithm::token_advantages`] for the per-token advantages and returns, hands the
    /// loss the head's predictions ([`MicroBatch::value`]) and steps the head with the
    /// gradient of the loss terms.
    fn value_model(&self) -> Option<ValueModel> {
        None
    }

    /// Per-token advantages and returns of a learner's routed responses (an actor-critic
    /// algorithm's estimator, GAE for MAPPO); asked only of an algorithm with a value model.
    fn token_advantages(&self, _responses: &[ValuedResponse<'_>]) -> Result<TokenAdvantages> {
        Err(crate::error::Error::Internal(format!("{} has no token-level advantage estimator", self.name())))
    }

    /// Sees every sample of the step (with rewards) before any advantage: HACPO updates its
    /// capability estimates here.
    fn observe(&mut self, _samples: &[PoolSample], _policies: usize) {}

    /// State to checkpoint (JSON), restored by [`Algorithm::restore`].
    fn state(&self) -> Value {
        Value::Null
    }

    fn restore(&mut self, _state: Value) -> Result<()> {
        Ok(())
    }

    /// Advantages of a learner's routed samples, in order.
    fn advantages(&self, samples: &[PoolSample], learner: usize) -> Result<Vec<f64>>;

    /// Indices of the routed samples in each of `count` mini-batches (default: in order).
    fn minibatches(&self, samples: &[PoolSample], _learner: usize, count: usize) -> Result<Vec<Vec<usize>>> {
        Ok(contiguous_minibatches(samples.len(), count))
    }

    /// The policy loss of a micro-batch: its share of the mini-batch loss (to minimise).
    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1>;

    /// Every term of a micro-batch's loss; the policy loss first (the trainer adds its KL term
    /// right after it). An actor-critic algorithm adds its value loss here.
    fn loss_terms(&self, batch: &MicroBatch<B>) -> Vec<LossTerm<B>> {
        vec![LossTerm { metric: "actor/pg_loss", weight: 1.0, value: self.policy_loss(batch) }]
    }

    /// Per-response terms of a finished mini-batch for metrics and audits (sequence-level
    /// algorithms; empty for token-level ones).
    fn sequence_terms(&self, _learner: usize, _records: &[SequenceRecord]) -> Vec<SampleTerms> {
        Vec::new()
    }

    /// Metrics of a learner's step from the terms of all its mini-batches.
    fn metrics(&self, _learner: usize, _terms: &[SampleTerms]) -> Vec<(&'static str, f64)> {
        Vec::new()
    }

    /// What an audit dump needs to recompute the terms (config, capabilities), if anything.
    fn audit(&self) -> Option<Value> {
        None
    }
}

/// `count` mini-batches of `n` items in order, as equal as can be (sizes differ by at most
/// one when `count` does not divide `n`; a workload whose sample count varies, such as the
/// search tree, gets no empty mini-batch unless `n < count`).
pub fn contiguous_minibatches(n: usize, count: usize) -> Vec<Vec<usize>> {
    let count = count.max(1);
    (0..count).map(|m| (m * n / count..(m + 1) * n / count).collect()).collect()
}
