//! The value head of an actor-critic algorithm (MAPPO as MMOA-RAG runs it with TRL's
//! `AutoModelForCausalLMWithValueHead`): one linear map from the policy's last hidden state to
//! a value, on the policy's own trunk. The trunk learns from the value loss through the
//! policy's optimizer; the head's `hidden + 1` numbers and their AdamW moments are kept on the
//! host and checkpointed in `trainer_state.json`.
//!
//! The head starts at zero (TRL draws it at random): deterministic, and a fresh head's values
//! do not add noise to the first advantages.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::optim::AdamWConfig;

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
