//! A cluster run's step: each process has rolled out and scored its own policies' samples;
//! here they cross to every host ([`Bus::all_gather`]), and every process continues with the
//! whole step, in the order one process would have it. A workload whose episodes span
//! processes also lists stand-ins for the other processes' samples, so its rewards read what
//! they need: they stay home, and links to them are made by key (policy, prompt, position)
//! and resolved to the real samples.

use serde::{Deserialize, Serialize};

use super::scoring::Scored;
use crate::cluster::Bus;
use crate::error::{Error, Result};
use crate::sample::Sample;

/// One host's part of a step: its samples, scored, with their reference log-probs. The f32
/// numbers travel as their bits: JSON's shortest decimals read back through f64 could round
/// differently in the last bit, and the run must be bit for bit the one-process run's.
#[derive(Serialize, Deserialize)]
struct Part {
    /// Without `token_logps` and `values`, which follow as bits.
    samples: Vec<Sample>,
    /// Each sample's parent, by key (`parent` itself is left out: it indexes the sender's list).
    parents: Vec<Option<Key>>,
    token_logps: Vec<Vec<u32>>,
    values: Vec<Vec<u32>>,
    ref_logps: Vec<Option<Vec<u32>>>,
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn floats(x: &[u32]) -> Vec<f32> {
    x.iter().map(|&b| f32::from_bits(b)).collect()
}

/// A sample's identity within a step: its policy, prompt and position among that policy's
/// samples of the prompt (what step order sorts by).
type Key = (usize, usize, usize);

fn key(s: &Sample) -> Key {
    (s.policy, s.prompt, s.sample_index)
}

impl Part {
    /// The samples of the `held` policies among `samples`, with their reference log-probs.
    fn of(samples: Vec<Sample>, ref_logps: Vec<Option<Vec<f32>>>, held: &[usize]) -> Part {
        let keys: Vec<Key> = samples.iter().map(key).collect();
        let mut part =
            Part { samples: vec![], parents: vec![], token_logps: vec![], values: vec![], ref_logps: vec![] };
        for (mut s, r) in samples.into_iter().zip(ref_logps).filter(|(s, _)| held.contains(&s.policy)) {
            part.parents.push(s.parent.take().map(|p| keys[p]));
            part.token_logps.push(bits(&std::mem::take(&mut s.token_logps)));
            part.values.push(bits(&std::mem::take(&mut s.values)));
            part.ref_logps.push(r.as_deref().map(bits));
            part.samples.push(s);
        }
        part
    }

    fn into_samples(self) -> impl Iterator<Item = (Sample, Option<Key>, Option<Vec<f32>>)> {
        let Part { samples, parents, token_logps, values, ref_logps } = self;
        samples.into_iter().zip(parents).zip(token_logps).zip(values).zip(ref_logps).map(
            |((((mut s, parent), lp), v), r)| {
                s.token_logps = floats(&lp);
                s.values = floats(&v);
                (s, parent, r.as_deref().map(floats))
            },
        )
    }
}

/// Every host's samples of `step`, in step order as one process has them
/// ([`super::into_step_order`]), with their reference log-probs in the same order; this
/// process's part is its `held` policies' samples.
pub fn gather_step(
    bus: &dyn Bus,
    step: u64,
    samples: Vec<Sample>,
    scored: Scored,
    held: &[usize],
) -> Result<(Vec<Sample>, Scored)> {
    let Scored { ref_logps, old_s, ref_s } = scored;
    let mine = serde_json::to_vec(&Part::of(samples, ref_logps, held)).map_err(|e| Error::Internal(e.to_string()))?;
    let (mut samples, mut parents, mut ref_logps) = (Vec::new(), Vec::new(), Vec::new());
    for (host, bytes) in bus.hosts().iter().zip(bus.all_gather(step, "samples", mine)?) {
        let part: Part = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Internal(format!("host {host}'s samples of step {step} cannot be read ({e}): is it the same hacpo?"))
        })?;
        let n = part.samples.len();
        if [part.parents.len(), part.token_logps.len(), part.values.len(), part.ref_logps.len()] != [n; 4] {
            return Err(Error::Internal(format!("host {host}'s samples of step {step} are incomplete")));
        }
        for (s, parent, r) in part.into_samples() {
            samples.push(s);
            parents.push(parent);
            ref_logps.push(r);
        }
    }
    let at: std::collections::HashMap<Key, usize> = samples.iter().enumerate().map(|(i, s)| (key(s), i)).collect();
    if at.len() != samples.len() {
        return Err(Error::Internal(format!("two hosts sent the same sample of step {step}")));
    }
    for (s, parent) in samples.iter_mut().zip(parents) {
        s.parent = match parent {
            Some(k) => Some(*at.get(&k).ok_or_else(|| {
                Error::Internal(format!("no host sent the sample {k:?} that a sample of step {step} follows"))
            })?),
            None => None,
        };
    }
    let former = super::into_step_order(&mut samples);
    let ref_logps = former.iter().map(|&f| ref_logps[f].take()).collect();
    Ok((samples, Scored { ref_logps, old_s, ref_s }))
}
