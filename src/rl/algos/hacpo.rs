//! HACPO (docs/algorithms.md §2) and naive sharing (every HACPO mechanism off, others' responses
//! treated as the learner's own): every policy learns from the whole pool of a group.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde_json::{Value, json};

use super::sequence;
use crate::error::{Error, Result};
use crate::rl::algorithm::{AlgoSettings, Algorithm, MicroBatch, Routing, SequenceRecord};
use crate::rl::capability::{Capabilities, CapabilityConfig, CapabilityTracker};
use crate::rl::hacpo::{self as core, HacpoConfig};
use crate::rl::records::{PoolSample, SampleTerms};

/// HACPO, or naive sharing when built with `naive`.
pub struct Hacpo {
    name: &'static str,
    core: HacpoConfig,
    capability: CapabilityConfig,
    /// Created at the first step (it needs the number of policies) or restored.
    tracker: Option<CapabilityTracker>,
    /// This step's estimates, fixed between `observe` and the next step.
    caps: Capabilities,
}

impl Hacpo {
    pub fn new(settings: &AlgoSettings, naive: bool) -> Result<Self> {
        let core = sequence::core_config(settings, naive);
        core.validate()?;
        Ok(Hacpo {
            name: if naive { "naive" } else { "hacpo" },
            core,
            capability: settings.capability.clone(),
            tracker: None,
            caps: Capabilities::fixed(vec![]),
        })
    }
}

impl<B: Backend> Algorithm<B> for Hacpo {
    fn name(&self) -> &'static str {
        self.name
    }

    fn routing(&self) -> Routing {
        Routing::Shared
    }

    fn min_policies(&self) -> usize {
        2
    }

    fn observe(&mut self, samples: &[PoolSample], policies: usize) {
        let capability = &self.capability;
        let tracker = self.tracker.get_or_insert_with(|| CapabilityTracker::new(policies, capability.clone()));
        let rewards: Vec<Vec<f64>> =
            (0..policies).map(|k| samples.iter().filter(|s| s.agent == k).map(|s| s.reward).collect()).collect();
        tracker.update(&rewards);
        self.caps = tracker.capabilities();
    }

    fn state(&self) -> Value {
        self.tracker.as_ref().map(|t| serde_json::to_value(t).expect("tracker serialises")).unwrap_or(Value::Null)
    }

    fn restore(&mut self, state: Value) -> Result<()> {
        if state.is_null() {
            return Ok(());
        }
        let tracker: CapabilityTracker = serde_json::from_value(state).map_err(|e| {
            Error::InvalidArgument(format!("the checkpoint's capability estimates are unreadable: {e}"))
        })?;
        self.caps = tracker.capabilities();
        self.tracker = Some(tracker);
        Ok(())
    }

    fn advantages(&self, samples: &[PoolSample], learner: usize) -> Result<Vec<f64>> {
        core::advantages(samples, learner, &self.caps, &self.core)
    }

    fn minibatches(&self, samples: &[PoolSample], learner: usize, count: usize) -> Result<Vec<Vec<usize>>> {
        core::minibatches(samples, learner, count, self.core.minibatch_order)
    }

    fn policy_loss(&self, batch: &MicroBatch<B>) -> Tensor<B, 1> {
        sequence::policy_loss(batch, &self.core, &self.caps)
    }

    fn sequence_terms(&self, learner: usize, records: &[SequenceRecord]) -> Vec<SampleTerms> {
        sequence::terms(learner, records, &self.core, &self.caps)
    }

    fn metrics(&self, learner: usize, terms: &[SampleTerms]) -> Vec<(&'static str, f64)> {
        let cross: Vec<&SampleTerms> = terms.iter().filter(|t| t.cross).collect();
        let own: Vec<&SampleTerms> = terms.iter().filter(|t| !t.cross).collect();
        vec![
            ("hacpo/capability", self.caps.values.get(learner).copied().unwrap_or(1.0)),
            ("hacpo/omega_mean", sequence::mean_of(&cross, |t| t.coef)),
            ("hacpo/cross_ratio_mean", sequence::mean_of(&cross, |t| t.ratio)),
            ("hacpo/cross_clip_frac", sequence::clip_fraction(&cross)),
            ("hacpo/self_clip_frac", sequence::clip_fraction(&own)),
        ]
    }

    fn audit(&self) -> Option<Value> {
        Some(json!({"config": self.core, "capabilities": self.caps.values}))
    }
}
