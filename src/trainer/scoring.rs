//! The old/ref log-prob stage: every policy scores its own samples with its training forward
//! pass (the old policy's per-token log-probs, not the sampler's: sampler and trainer numerics
//! must not differ) and, when the KL term is on, with its frozen reference. One thread per
//! policy.

use std::time::Instant;

use burn::tensor::backend::Backend;

use super::micro_batches::MicroBatching;
use crate::error::{Error, Result};
use crate::generate::score::{read_responses, score, score_and_read};
use crate::model::CausalLm;
use crate::policy::Policy;
use crate::sample::Sample;
use crate::train::critic::ValueHead;

/// Settings of the scoring stage.
pub struct ScoreSettings {
    pub step: u64,
    /// What bounds a forward pass (the update's micro-batches).
    pub micro_batches: MicroBatching,
    pub temperature: f32,
    /// Score the old policy (not when the update's own pass gives its log-probs).
    pub old: bool,
    pub with_reference: bool,
}

/// What the stage produced besides the samples' `token_logps`.
pub struct Scored {
    /// Reference log-probs per sample (own samples of policies with a reference).
    pub ref_logps: Vec<Option<Vec<f32>>>,
    /// Wall seconds of the slowest policy, old and reference.
    pub old_s: f64,
    pub ref_s: f64,
}

/// Each own sample's index, old log-probs and values (empty without a critic).
type OwnScores = Vec<(usize, Vec<f32>, Vec<f32>)>;

/// Old log-probs (and values), reference log-probs, seconds of each.
type PolicyScores = (OwnScores, Vec<(usize, Vec<f32>)>, f64, f64);

/// Fills `token_logps` (and, for policies with a value head, `values`) of every sample and
/// returns the reference log-probs.
pub fn score_samples<B: Backend>(
    policies: &[Policy<B>],
    samples: &mut [Sample],
    settings: &ScoreSettings,
) -> Result<Scored> {
    let view: &[Sample] = samples;
    let items = policies.iter().map(|p| (p.index, p));
    let results = crate::policy::per_policy(items, "scoring", |p| {
        crate::backend::on_a_cpu_worker::<B, _>(|| score_policy(p, view, settings))
    });
    let mut out = Scored { ref_logps: vec![None; samples.len()], old_s: 0.0, ref_s: 0.0 };
    for r in results {
        let (old, reference, old_s, ref_s) = r?;
        for (i, lp, values) in old {
            samples[i].token_logps = lp;
            samples[i].values = values;
        }
        for (i, lp) in reference {
            out.ref_logps[i] = Some(lp);
        }
        out.old_s = out.old_s.max(old_s);
        out.ref_s = out.ref_s.max(ref_s);
    }
    Ok(out)
}

/// One policy's own samples, scored in batches cut as the update's micro-batches are.
fn score_policy<B: Backend>(policy: &Policy<B>, samples: &[Sample], settings: &ScoreSettings) -> Result<PolicyScores> {
    // Samples no policy learns from (an MHGPO tree's singletons and IS's continuations) only
    // carry rewards: nothing reads their log-probs.
    let own: Vec<usize> =
        (0..samples.len()).filter(|&i| samples[i].policy == policy.index && samples[i].train).collect();
    let temperature = settings.temperature.max(1e-6);
    // A value head on the policy's trunk reads the old policy's hidden states in the same
    // forward pass; one on a value model of its own, that model's.
    let value_trunk = policy.critic.as_ref().and_then(|c| c.trunk.as_ref()).map(|t| t.inference_model());
    let run = |model: &CausalLm<B>, head: Option<&ValueHead>| -> Result<OwnScores> {
        let mut out = Vec::with_capacity(own.len());
        let sequence = |i: usize| (samples[i].prompt_ids.as_slice(), samples[i].response_ids.as_slice());
        for chunk in settings.micro_batches.cut(&own, sequence) {
            let requests: Vec<(Vec<u32>, Vec<u32>)> =
                chunk.iter().map(|&i| (samples[i].prompt_ids.clone(), samples[i].response_ids.clone())).collect();
            let (logps, values) = match (head, &value_trunk) {
                (Some(h), None) => score_and_read(model, &requests, temperature, &|hidden| h.values(hidden))?,
                (Some(h), Some(trunk)) => (
                    score(model, &requests, temperature)?,
                    read_responses(trunk, &requests, &|hidden| h.values(hidden))?,
                ),
                (None, _) => (score(model, &requests, temperature)?, vec![vec![]; requests.len()]),
            };
            for ((&i, lp), values) in chunk.iter().zip(logps).zip(values) {
                // A diverged model (NaN/inf weights or activations) shows here first.
                if let Some(&bad) = lp.iter().find(|x| !x.is_finite()) {
                    return Err(Error::NonFinite {
                        agent: policy.name.clone(),
                        step: settings.step,
                        what: "log-probability of its own sample",
                        value: bad as f64,
                    });
                }
                out.push((i, lp, values));
            }
        }
        Ok(out)
    };
    let (old, old_s) = match settings.old {
        true => {
            let t = Instant::now();
            (run(&policy.inference_model(), policy.critic.as_ref().map(|c| &c.head))?, t.elapsed().as_secs_f64())
        }
        false => (Vec::new(), 0.0),
    };
    let t = Instant::now();
    let reference = match settings.with_reference.then(|| policy.reference_model()).flatten() {
        Some(r) => run(&r, None)?.into_iter().map(|(i, lp, _)| (i, lp)).collect(),
        None => Vec::new(),
    };
    Ok((old, reference, old_s, t.elapsed().as_secs_f64()))
}
