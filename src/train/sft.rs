//! Supervised fine-tuning on (prompt, response) token pairs: the pre-training that gives the
//! embedded tiny agents a starting policy RL can improve.
//!
//! Loss: mean negative log-likelihood of the response tokens (prompt tokens are context only).
//! The learning rate decays linearly to 10% over `max_steps`; evaluation runs every
//! `eval_every` steps, and training stops early if it reaches `target_accuracy` (when set).

use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::ElementConversion;
use burn::tensor::backend::Backend;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::generate::score::{response_hidden, token_logprobs_autodiff};
use crate::model::CausalLm;
use crate::train::optim::{AdamW, AdamWConfig, GradStore};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    pub lr: f64,
    /// Sequences per update.
    pub batch: usize,
    pub max_steps: usize,
    pub eval_every: usize,
    /// Stop once the evaluation reaches this accuracy (none: train the whole budget).
    pub target_accuracy: Option<f64>,
    pub grad_clip: f64,
    pub seed: u64,
    /// Batches of examples of similar length (an epoch's shuffled order cut into windows of 16
    /// batches, each sorted by length): much less padding when the lengths differ a lot, as the
    /// search roles' prompts do. (Left out of a tiny agent's cache key when off.)
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub length_buckets: bool,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            lr: 3e-3,
            batch: 32,
            max_steps: 3000,
            eval_every: 100,
            target_accuracy: None,
            grad_clip: 1.0,
            seed: 0,
            length_buckets: false,
        }
    }
}

/// What happened.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SftReport {
    pub steps: usize,
    pub final_loss: f64,
    pub accuracy: f64,
    /// (step, accuracy) at each evaluation.
    pub evaluations: Vec<(usize, f64)>,
    pub wall_s: f64,
    pub reached_target: bool,
}

impl SftReport {
    /// Continues this report with the next stage's (its steps counted after this one's).
    pub fn append(&mut self, next: SftReport) {
        let offset = self.steps;
        self.evaluations.extend(next.evaluations.into_iter().map(|(s, a)| (s + offset, a)));
        self.steps += next.steps;
        self.final_loss = next.final_loss;
        self.accuracy = next.accuracy;
        self.wall_s += next.wall_s;
        self.reached_target = next.reached_target;
    }
}

/// One epoch of batches of similar length, in random order.
fn bucketed_batches(examples: &[(Vec<u32>, Vec<u32>)], rng: &mut ChaCha8Rng, batch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..examples.len()).collect();
    order.shuffle(rng);
    let len = |i: &usize| examples[*i].0.len() + examples[*i].1.len();
    let mut batches: Vec<Vec<usize>> = vec![];
    for window in order.chunks_mut(batch.max(1) * 16) {
        window.sort_by_key(len);
        batches.extend(window.chunks(batch.max(1)).map(<[usize]>::to_vec));
    }
    batches.shuffle(rng);
    batches
}

/// Trains `model` on `examples`; `evaluate` scores the current policy (accuracy in 0..=1).
pub fn fine_tune<B: Backend>(
    model: CausalLm<Autodiff<B>>,
    examples: &[(Vec<u32>, Vec<u32>)],
    cfg: &SftConfig,
    label: &str,
    evaluate: impl FnMut(&CausalLm<B>) -> Result<f64>,
) -> Result<(CausalLm<Autodiff<B>>, SftReport)> {
    fine_tune_masked(model, examples, &[], cfg, label, evaluate)
}

/// [`fine_tune`] on the response tokens `learned` marks, one mask per example as long as its
/// response (none: every token): a whole conversation is one example whose own turns are
/// learned and whose environment text between them (tool responses, turn markers) is context
/// only, as multi-turn SFT does. The loss is the mean over the learned tokens. One example per
/// conversation instead of one per turn reads each prefix once: a five-turn conversation costs
/// one forward pass, not five.
pub fn fine_tune_masked<B: Backend>(
    mut model: CausalLm<Autodiff<B>>,
    examples: &[(Vec<u32>, Vec<u32>)],
    learned: &[Vec<bool>],
    cfg: &SftConfig,
    label: &str,
    mut evaluate: impl FnMut(&CausalLm<B>) -> Result<f64>,
) -> Result<(CausalLm<Autodiff<B>>, SftReport)> {
    if examples.is_empty() {
        return Err(Error::InvalidArgument("no examples to fine-tune on".into()));
    }
    if !learned.is_empty() {
        let bad = (learned.len() != examples.len())
            || learned.iter().zip(examples).any(|(m, (_, r))| m.len() != r.len() || !m.contains(&true));
        if bad {
            return Err(Error::InvalidArgument(
                "fine-tuning masks: one per example, as long as its response, learning at least one token".into(),
            ));
        }
    }
    let started = Instant::now();
    let mut optimizer = AdamW::<B>::new(AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() });
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut order: Vec<usize> = (0..examples.len()).collect();
    order.shuffle(&mut rng);
    let mut cursor = 0;
    let mut pending: Vec<Vec<usize>> = vec![];
    let bar = crate::progress::Progress::new(format!("pre-training {label}"), cfg.max_steps as u64);
    let mut report = SftReport {
        steps: 0,
        final_loss: f64::NAN,
        accuracy: 0.0,
        evaluations: vec![],
        wall_s: 0.0,
        reached_target: false,
    };
    for step in 1..=cfg.max_steps {
        let mut picked = Vec::with_capacity(cfg.batch);
        if cfg.length_buckets {
            if pending.is_empty() {
                pending = bucketed_batches(examples, &mut rng, cfg.batch);
            }
            picked = pending.pop().expect("an epoch has a batch");
        } else {
            for _ in 0..cfg.batch {
                if cursor == order.len() {
                    order.shuffle(&mut rng);
                    cursor = 0;
                }
                picked.push(order[cursor]);
                cursor += 1;
            }
        }
        let batch: Vec<(Vec<u32>, Vec<u32>)> = picked.iter().map(|&i| examples[i].clone()).collect();
        let (hidden, targets, _) = response_hidden(&model, &batch)?;
        let logp = token_logprobs_autodiff(hidden, model.lm_head_weight(), &targets, 1.0);
        let (logp, n) = match learned.is_empty() {
            true => (logp, targets.len()),
            false => {
                // The targets are the batch's responses in order, so the masks line up.
                let weights: Vec<f32> =
                    picked.iter().flat_map(|&i| &learned[i]).map(|&m| f32::from(u8::from(m))).collect();
                let n = weights.iter().filter(|&&w| w > 0.0).count();
                let weights = burn::tensor::Tensor::<Autodiff<B>, 1>::from_floats(weights.as_slice(), &logp.device());
                (logp.mul(weights), n)
            }
        };
        let loss = crate::backend::reduce::row_sum(logp.unsqueeze::<2>()).reshape([1]).div_scalar(n as f64).neg();
        let loss_value = loss.clone().into_scalar().elem::<f64>();
        if !loss_value.is_finite() {
            return Err(Error::NonFinite {
                agent: label.into(),
                step: step as u64,
                what: "pre-training loss",
                value: loss_value,
            });
        }
        let grads = loss.backward();
        let mut store = GradStore::<B>::default();
        store.accumulate(&model, &grads);
        drop(grads); // the store holds what the update needs
        store.clip_global_norm(cfg.grad_clip);
        // Linear decay to 10%: a fixed budget with a stable end.
        let lr = cfg.lr * (1.0 - 0.9 * (step - 1) as f64 / cfg.max_steps as f64);
        model = optimizer.step(model, store, lr);
        report.steps = step;
        report.final_loss = loss_value;
        bar.set_position(step as u64);
        if step % cfg.eval_every.max(1) == 0 || step == cfg.max_steps {
            let acc = evaluate(&model.valid())?;
            report.evaluations.push((step, acc));
            report.accuracy = acc;
            bar.set_message(format!("loss {loss_value:.3} held-out accuracy {:.1}%", acc * 100.0));
            tracing::info!(label, step, loss = loss_value, accuracy = acc, "pre-training evaluation");
            if cfg.target_accuracy.is_some_and(|t| acc >= t) {
                report.reached_target = true;
                break;
            }
        } else if step % 10 == 0 {
            bar.set_message(format!("loss {loss_value:.3}"));
        }
    }
    bar.finish();
    report.wall_s = started.elapsed().as_secs_f64();
    Ok((model, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Cpu, CpuAutodiff};
    use crate::model::weights::{RandomWeights, build};

    fn model() -> CausalLm<CpuAutodiff> {
        let spec = crate::tiny::find("tiny-llama").unwrap();
        let config = crate::tiny::model_config(&spec, 300, &[1]).unwrap();
        build::<CpuAutodiff>(&config, &mut RandomWeights::new(&config, 3, 0.02), &Default::default()).unwrap()
    }

    fn trained(examples: &[(Vec<u32>, Vec<u32>)], learned: &[Vec<bool>]) -> Result<Vec<f32>> {
        let cfg = SftConfig { lr: 1e-2, batch: 2, max_steps: 3, eval_every: 100, ..SftConfig::default() };
        let (m, _) = fine_tune_masked::<Cpu>(model(), examples, learned, &cfg, "test", |_| Ok(0.0))?;
        Ok(m.lm_head_weight().into_data().to_vec::<f32>().unwrap())
    }

    /// A masked-out token is not learned: changing it (where nothing reads it as context)
    /// leaves the weights bit-identical; an all-true mask is no mask; bad masks are refused.
    #[test]
    fn masked_tokens_are_context_only_and_a_full_mask_is_no_mask() {
        let example = |last: u32| vec![(vec![3, 4, 5], vec![10, 11, 12, last]), (vec![3, 7], vec![20, 21])];
        let mask = vec![vec![true, true, true, false], vec![true, true]];
        assert_eq!(trained(&example(13), &mask).unwrap(), trained(&example(99), &mask).unwrap());
        assert_ne!(trained(&example(13), &[]).unwrap(), trained(&example(99), &[]).unwrap());
        let all = vec![vec![true; 4], vec![true; 2]];
        assert_eq!(trained(&example(13), &all).unwrap(), trained(&example(13), &[]).unwrap());
        for bad in [vec![vec![true; 3], vec![true; 2]], vec![vec![true; 4]], vec![vec![false; 4], vec![true; 2]]] {
            assert!(trained(&example(13), &bad).is_err());
        }
    }
}
