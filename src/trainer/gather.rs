//! A cluster run's step: each process has rolled out and scored its own policies' samples;
//! here they cross to every host ([`Bus::all_gather`]), and every process continues with the
//! whole step, in the order one process would have it.

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

impl Part {
    fn of(mut samples: Vec<Sample>, ref_logps: Vec<Option<Vec<f32>>>) -> Part {
        let token_logps = samples.iter_mut().map(|s| bits(&std::mem::take(&mut s.token_logps))).collect();
        let values = samples.iter_mut().map(|s| bits(&std::mem::take(&mut s.values))).collect();
        let ref_logps = ref_logps.iter().map(|r| r.as_deref().map(bits)).collect();
        Part { samples, token_logps, values, ref_logps }
    }

    fn into_samples(self) -> impl Iterator<Item = (Sample, Option<Vec<f32>>)> {
        let Part { samples, token_logps, values, ref_logps } = self;
        samples.into_iter().zip(token_logps).zip(values).zip(ref_logps).map(|(((mut s, lp), v), r)| {
            s.token_logps = floats(&lp);
            s.values = floats(&v);
            (s, r.as_deref().map(floats))
        })
    }
}

/// Every host's samples of `step`, in step order as one process has them
/// ([`super::into_step_order`]), with their reference log-probs in the same order.
pub fn gather_step(bus: &dyn Bus, step: u64, samples: Vec<Sample>, scored: Scored) -> Result<(Vec<Sample>, Scored)> {
    let Scored { ref_logps, old_s, ref_s } = scored;
    let mine = serde_json::to_vec(&Part::of(samples, ref_logps)).map_err(|e| Error::Internal(e.to_string()))?;
    let (mut samples, mut ref_logps) = (Vec::new(), Vec::new());
    for (host, bytes) in bus.hosts().iter().zip(bus.all_gather(step, "samples", mine)?) {
        let part: Part = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Internal(format!("host {host}'s samples of step {step} cannot be read ({e}): is it the same hacpo?"))
        })?;
        let n = part.samples.len();
        if n != part.token_logps.len() || n != part.values.len() || n != part.ref_logps.len() {
            return Err(Error::Internal(format!("host {host}'s samples of step {step} are incomplete")));
        }
        // A part's parent links are within it: they move with it.
        let start = samples.len();
        for (mut s, r) in part.into_samples() {
            s.parent = s.parent.map(|p| p + start);
            samples.push(s);
            ref_logps.push(r);
        }
    }
    let former = super::into_step_order(&mut samples);
    let ref_logps = former.iter().map(|&f| ref_logps[f].take()).collect();
    Ok((samples, Scored { ref_logps, old_s, ref_s }))
}
