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
    mut model: CausalLm<Autodiff<B>>,
    examples: &[(Vec<u32>, Vec<u32>)],
    cfg: &SftConfig,
    label: &str,
    mut evaluate: impl FnMut(&CausalLm<B>) -> Result<f64>,
) -> Result<(CausalLm<Autodiff<B>>, SftReport)> {
    if examples.is_empty() {
        return Err(Error::InvalidArgument("no examples to fine-tune on".into()));
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
        let mut batch = Vec::with_capacity(cfg.batch);
        if cfg.length_buckets {
            if pending.is_empty() {
                pending = bucketed_batches(examples, &mut rng, cfg.batch);
            }
            batch.extend(pending.pop().expect("an epoch has a batch").into_iter().map(|i| examples[i].clone()));
        } else {
            for _ in 0..cfg.batch {
                if cursor == order.len() {
                    order.shuffle(&mut rng);
                    cursor = 0;
                }
                batch.push(examples[order[cursor]].clone());
                cursor += 1;
            }
        }
        let (hidden, targets, _) = response_hidden(&model, &batch)?;
        let n = targets.len();
        let logp = token_logprobs_autodiff(hidden, model.lm_head_weight(), &targets, 1.0);
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
