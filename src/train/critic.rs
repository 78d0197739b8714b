//! The critic of an actor-critic algorithm: a value head, one linear map from a last hidden
//! state to a value, read either
//! - from a value model of its own ([`Critic::trunk`]), a copy of the policy's model made at
//!   the start of the run and trained only by the value loss, with its own AdamW, as verl and
//!   OpenRLHF run PPO's critic; or
//! - from the policy's own trunk (TRL 0.9's `AutoModelForCausalLMWithValueHead`, which
//!   MMOA-RAG uses), whose weights then learn from the value loss through the policy's optimizer.
//!
//! The head's `hidden + 1` numbers and their AdamW moments are kept on the host and
//! checkpointed in `trainer_state.json`; a value model's weights and moments beside the
//! policy's in the checkpoint (`agent-K-critic/`).
//!
//! The head starts at zero (TRL draws it at random): deterministic, and a fresh head's values
//! do not add noise to the first advantages.

use burn::module::{AutodiffModule, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::optim::{AdamW, AdamWConfig};
use crate::model::CausalLm;
use crate::model::weights::{ParamVisitor, walk_params};

/// A policy's critic: its value head and, unless the head reads the policy's trunk, the value
/// model the head sits on.
pub struct Critic<B: Backend> {
    pub head: ValueHead,
    pub trunk: Option<ValueTrunk<B>>,
}

/// A value model of its own: the trunk its head reads, and the trunk's optimizer.
pub struct ValueTrunk<B: Backend> {
    pub model: CausalLm<burn::backend::Autodiff<B>>,
    pub optimizer: AdamW<B>,
}

impl<B: Backend> ValueTrunk<B> {
    /// A trunk that starts as `policy` but shares no autodiff leaf with it: a plain clone would
    /// share the policy's leaves until the first update, and the value loss's gradient would
    /// reach the policy's weights through them.
    pub fn copy_of(policy: &CausalLm<burn::backend::Autodiff<B>>, optimizer: AdamWConfig) -> Self {
        struct Fresh;
        impl<AB: AutodiffBackend> ParamVisitor<AB> for Fresh {
            fn vector(&mut self, _: &str, p: Param<Tensor<AB, 1>>) -> Param<Tensor<AB, 1>> {
                p.map(fresh)
            }
            fn matrix(&mut self, _: &str, p: Param<Tensor<AB, 2>>, _: bool) -> Param<Tensor<AB, 2>> {
                p.map(fresh)
            }
        }
        // A frozen weight (a LoRA base) stays frozen.
        fn fresh<AB: AutodiffBackend, const D: usize>(t: Tensor<AB, D>) -> Tensor<AB, D> {
            let trainable = t.is_require_grad();
            let t = Tensor::from_inner(t.inner());
            if trainable { t.require_grad() } else { t }
        }
        ValueTrunk { model: walk_params(policy.clone(), &mut Fresh), optimizer: AdamW::new(optimizer) }
    }

    /// The value model without autodiff (scoring, checkpoints; shares the weights).
    pub fn inference_model(&self) -> CausalLm<B> {
        self.model.valid()
    }
}

/// A value head with its optimizer state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueHead {
    pub weight: Vec<f32>,
    pub bias: f32,
    /// AdamW's first and second moments (weight then bias) and its update count.
    moments: Vec<f32>,
    squares: Vec<f32>,
    updates: u64,
}

/// The head's parameters as autodiff leaves of one micro-batch, to read their gradients.
pub struct HeadLeaves<B: AutodiffBackend> {
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
}

impl ValueHead {
    pub fn new(hidden: usize) -> Self {
        ValueHead {
            weight: vec![0.0; hidden],
            bias: 0.0,
            moments: vec![0.0; hidden + 1],
            squares: vec![0.0; hidden + 1],
            updates: 0,
        }
    }

    /// Values `[n]` of hidden states `[n, hidden]` (no gradient).
    pub fn values<B: Backend>(&self, hidden: Tensor<B, 2>) -> Tensor<B, 1> {
        let device = hidden.device();
        let w = Tensor::<B, 2>::from_data(TensorData::new(self.weight.clone(), [self.weight.len(), 1]), &device);
        let n = hidden.dims()[0];
        hidden.matmul(w).reshape([n]).add_scalar(self.bias)
    }

    /// Values `[n]` with gradients to the trunk and to the head's leaves.
    pub fn values_tracked<B: AutodiffBackend>(&self, hidden: Tensor<B, 2>) -> (Tensor<B, 1>, HeadLeaves<B>) {
        let device = hidden.device();
        let weight = Tensor::<B, 2>::from_data(TensorData::new(self.weight.clone(), [self.weight.len(), 1]), &device)
            .require_grad();
        let bias = Tensor::<B, 1>::from_data(TensorData::new(vec![self.bias], [1]), &device).require_grad();
        let n = hidden.dims()[0];
        let values = hidden.matmul(weight.clone()).reshape([n]) + bias.clone().expand([n]);
        (values, HeadLeaves { weight, bias })
    }

    /// AdamW on the head with gradient `grad` (weight then bias), as `train::optim::AdamW`.
    pub fn step(&mut self, grad: &[f64], lr: f64, c: &AdamWConfig) {
        self.updates += 1;
        let t = self.updates as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let n = self.weight.len();
        for (i, &g) in grad.iter().enumerate().take(n + 1) {
            let p = if i < n { self.weight[i] as f64 } else { self.bias as f64 };
            let p = p * (1.0 - lr * c.weight_decay);
            let m = c.beta1 * self.moments[i] as f64 + (1.0 - c.beta1) * g;
            let v = c.beta2 * self.squares[i] as f64 + (1.0 - c.beta2) * g * g;
            let p = p - lr / bc1 * m / (v.sqrt() / bc2.sqrt() + c.eps);
            (self.moments[i], self.squares[i]) = (m as f32, v as f32);
            if i < n {
                self.weight[i] = p as f32;
            } else {
                self.bias = p as f32;
            }
        }
    }
}

impl<B: AutodiffBackend> HeadLeaves<B> {
    /// The leaves' gradients from a backward pass (weight then bias), zero where none flowed.
    pub fn gradient(&self, grads: &B::Gradients) -> Vec<f64> {
        let read = |t: Option<Tensor<B::InnerBackend, 2>>, n: usize| -> Vec<f64> {
            t.map(|g| g.into_data().convert::<f64>().into_vec::<f64>().expect("f64 data"))
                .unwrap_or_else(|| vec![0.0; n])
        };
        let n = self.weight.dims()[0];
        let mut out = read(self.weight.grad(grads), n);
        out.extend(read(self.bias.grad(grads).map(|b| b.reshape([1, 1])), 1));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Cpu, CpuAutodiff};

    /// A value model copied from the policy shares no autodiff leaf with it: in one backward
    /// pass through both (as an update runs them), the policy's gradients are those of its
    /// own loss alone, and the copy gets gradients of its own. A plain clone would not pass.
    #[test]
    fn a_value_model_copy_takes_no_gradient_from_the_policy() {
        use crate::generate::score::response_hidden;
        use crate::train::optim::GradStore;
        let policy: CausalLm<CpuAutodiff> = crate::model::weights::small_random_model(false, 3);
        let requests = vec![(vec![1, 2, 3], vec![4, 5]), (vec![6, 7], vec![8, 9, 10])];
        let mut head = ValueHead::new(32);
        head.weight.iter_mut().enumerate().for_each(|(i, w)| *w = (i as f32 - 15.5) / 20.0);
        let policy_loss = |m: &CausalLm<CpuAutodiff>| response_hidden(m, &requests).unwrap().0.powi_scalar(2).sum();
        let value_loss =
            |m: &CausalLm<CpuAutodiff>| head.values_tracked(response_hidden(m, &requests).unwrap().0).0.sum();
        let grads_of = |loss: Tensor<CpuAutodiff, 1>, models: &[&CausalLm<CpuAutodiff>]| {
            let g = loss.backward();
            models
                .iter()
                .map(|m| {
                    let mut store = GradStore::default();
                    store.accumulate(*m, &g);
                    store.host("model.layers.0.self_attn.q_proj.weight").unwrap()
                })
                .collect::<Vec<_>>()
        };
        let alone = grads_of(policy_loss(&policy), &[&policy]).remove(0);
        let copy = ValueTrunk::<crate::backend::Cpu>::copy_of(&policy, AdamWConfig::default());
        let both = grads_of(policy_loss(&policy) + value_loss(&copy.model), &[&policy, &copy.model]);
        let max_diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(max_diff(&both[0], &alone) < 1e-6, "the value loss reached the policy");
        assert!(both[1].iter().any(|g| g.abs() > 1e-6), "the copy got no gradient");
        // The check can fail: through a plain clone, the value loss does reach the policy.
        let clone = policy.clone();
        let shared = grads_of(policy_loss(&policy) + value_loss(&clone), &[&policy]).remove(0);
        assert!(max_diff(&shared, &alone) > 1e-4);
    }

    /// On a fixed batch of hidden states and returns, AdamW steps on the squared value error
    /// make the loss fall (the acceptance test of the critic).
    #[test]
    fn the_value_loss_decreases_on_a_fixed_batch() {
        let device = Default::default();
        // Fixed hidden states, and returns a linear head can fit exactly (w·h + 0.3).
        let h: Vec<f32> = (0..16 * 8).map(|k| ((k * 7 + k / 8 * 3) % 11) as f32 / 5.0 - 1.0).collect();
        let returns: Vec<f32> = h
            .chunks(8)
            .map(|row| row.iter().enumerate().map(|(j, x)| x * (j as f32 - 3.5) / 8.0).sum::<f32>() + 0.3)
            .collect();
        let hidden = Tensor::<CpuAutodiff, 2>::from_data(TensorData::new(h, [16, 8]), &device);
        let target = Tensor::<CpuAutodiff, 1>::from_data(TensorData::new(returns, [16]), &device);
        let mut head = ValueHead::new(8);
        let config = AdamWConfig { lr: 0.05, weight_decay: 0.0, ..Default::default() };
        let mut losses = vec![];
        for _ in 0..40 {
            let (v, leaves) = head.values_tracked(hidden.clone().detach());
            let loss = (v - target.clone()).powi_scalar(2).mean();
            losses.push(loss.clone().into_scalar() as f64);
            let grads = loss.backward();
            head.step(&leaves.gradient(&grads), config.lr, &config);
        }
        assert!(losses[39] < 0.5 * losses[0], "{losses:?}");
        // The untracked values equal the tracked ones.
        let (tracked, _) = head.values_tracked(hidden.clone().detach());
        let plain = head.values::<Cpu>(hidden.inner());
        let d: f32 = (tracked.inner() - plain).abs().max().into_scalar();
        assert!(d < 1e-6);
    }
}
