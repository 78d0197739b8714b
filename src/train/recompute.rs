//! Gradient checkpointing (activation recomputation) for the update's forward/backward.
//!
//! Without it, the backward pass keeps every layer's intermediate activations for a whole
//! micro-batch: for Llama-3.1-8B about 40 MB per token, so one 1,500-token sequence needs
//! 60 GB. With it, the forward pass runs without a graph and keeps only each layer's input
//! (`hidden` floats per token and layer); the backward pass then recomputes one layer at a
//! time with a graph, backpropagates the gradient arriving from above through it, and drops
//! it. The cost is one more forward pass of the trunk (about a third more compute).
//!
//! burn 0.21's `BalancedCheckpointing` strategy recomputes only cheap element-wise nodes and
//! keeps matmul outputs, so it does not bound activations by the layer; this is the
//! layer-level scheme of `torch.utils.checkpoint` as HF models apply it per decoder layer.
//!
//! The maths is unchanged: a layer's parameter gradients come from the same backward ops on
//! the same recomputed values, and the gradient passed down is exactly the one the whole
//! graph would pass (the surrogate `Σ y ⊙ g` has gradient `g` with respect to `y`).
//!
//! The passes are [`Passes`]'s: when responses share prompts (a group's samples) or prompt
//! beginnings, each shared prompt or prefix runs once in the forward pass and in each layer's
//! recomputation, and the responses read its keys and values (on the CPU in one attention op,
//! elsewhere fanned out through a cache), so its gradient sums the responses'.

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};

use crate::error::Result;
use crate::generate::score::TokenBatch;
use crate::generate::shared_prompt::Passes;
use crate::model::CausalLm;
use crate::train::optim::GradStore;

type AD<B> = Autodiff<B>;

/// The trunk of one micro-batch after a graph-free forward pass: what the backward pass
/// needs to recompute each layer.
pub struct Trunk<B: Backend> {
    passes: Passes,
    ids: Tensor<B, 2, Int>,
    /// Each decoder layer's input, the passes' tokens packed (`[tokens, hidden]`), no graph.
    inputs: Vec<Tensor<B, 2>>,
    /// The last layer's output as a leaf of the head's graph.
    top: Tensor<AD<B>, 2>,
}

/// What [`forward`] returns: [`crate::generate::score::response_hidden`]'s three parts and the
/// trunk to finish the backward pass with.
pub struct Recomputed<B: Backend> {
    pub trunk: Trunk<B>,
    /// The selected final hidden states, a graph from the final norm on.
    pub hidden: Tensor<AD<B>, 2>,
    pub targets: Vec<u32>,
    pub lens: Vec<usize>,
}

/// The forward pass of [`crate::generate::score::response_hidden`] with recomputation: the
/// same hidden states, targets and response lengths, and the [`Trunk`] whose
/// [`Trunk::backward`] completes the backward pass below the final norm.
pub fn forward<B: Backend>(model: &CausalLm<AD<B>>, requests: &[(Vec<u32>, Vec<u32>)]) -> Result<Recomputed<B>> {
    // Checked before the passes are planned: every prompt has a token, every pair fits.
    let batch = TokenBatch::of(&model.config, requests)?;
    Ok(forward_as(model, batch, Passes::of(requests)))
}

/// [`forward`] of the checked `batch`, run as `passes` plans it.
fn forward_as<B: Backend>(model: &CausalLm<AD<B>>, batch: TokenBatch, passes: Passes) -> Recomputed<B> {
    let inner = model.valid();
    let tensors = passes.tensors(&inner);
    let ids = passes.ids::<B>(&inner.device());
    let mut x = passes.embed(&inner, ids.clone());
    let mut inputs = Vec::with_capacity(inner.layers.len());
    for layer in &inner.layers {
        inputs.push(x.clone());
        x = passes.layer(layer, &tensors, x);
    }
    let top = Tensor::from_inner(x).require_grad();
    // The final norm works per row, so it can come after the selection.
    let hidden = model.norm.forward(passes.select(top.clone()), model.compute);
    Recomputed { trunk: Trunk { passes, ids, inputs, top }, hidden, targets: batch.targets, lens: batch.lens }
}

/// `sum(y ⊙ g)`: its gradient with respect to `y` is `g`.
fn surrogate<B: Backend>(y: Tensor<AD<B>, 2>, g: Tensor<B, 2>) -> Tensor<AD<B>, 1> {
    (y * Tensor::from_inner(g)).sum()
}

impl<B: Backend> Trunk<B> {
    /// Backpropagates the head's gradients `head` (the loss's backward pass) through the
    /// decoder layers and the embedding, top to bottom, one recomputed layer at a time, and
    /// adds every parameter's gradient into `store`.
    pub fn backward(
        self,
        model: &CausalLm<AD<B>>,
        head: &<AD<B> as AutodiffBackend>::Gradients,
        store: &mut GradStore<B>,
    ) {
        // No gradient reaches the trunk when the loss does not depend on it (all-zero advantages
        // and no KL still have a graph, so this is rare).
        let Some(mut upstream) = self.top.grad(head) else {
            return;
        };
        let tensors = self.passes.tensors(model);
        for (layer, input) in model.layers.iter().zip(self.inputs).rev() {
            let x = Tensor::from_inner(input).require_grad();
            let y = self.passes.layer(layer, &tensors, x.clone());
            let grads = surrogate(y, upstream).backward();
            store.accumulate(model, &grads);
            upstream = x.grad(&grads).expect("a layer's output depends on its input");
        }
        if model.embed_tokens.is_require_grad() {
            let x = self.passes.embed(model, Tensor::<AD<B>, 2, Int>::from_inner(self.ids));
            let grads = surrogate(x, upstream).backward();
            store.accumulate(model, &grads);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::generate::score::dense_hidden;
    use crate::model::weights::{small_random_model, weighted_head_loss};

    /// Distinct prompts (dense passes: one, or one a length), and groups that share prompts:
    /// interleaved, with responses of one token, none, a prompt that extends a group's prompt,
    /// and a group whose responses are all empty (its prompt pass feeds no row the head reads).
    fn request_sets() -> [Vec<(Vec<u32>, Vec<u32>)>; 2] {
        let (a, b, c) = (vec![3, 9, 4, 12, 7], vec![11, 5], vec![2, 8, 14]);
        [
            vec![(vec![3, 9, 4], vec![7, 1, 60, 2]), (vec![11, 5, 6, 8, 20], vec![30, 31, 32, 33])],
            vec![
                (a.clone(), vec![7, 1, 60, 2]),
                (b.clone(), vec![30, 31, 8]),
                (c.clone(), vec![]),
                (a.clone(), vec![9]),
                (a, vec![50, 51, 52, 53, 54, 55]),
                (vec![3, 9, 4, 12, 7, 8], vec![2, 7]),
                (b.clone(), vec![]),
                (c, vec![]),
                (b, vec![1, 2, 3]),
            ],
        ]
    }

    #[test]
    fn recomputed_gradients_equal_the_whole_dense_graphs() {
        // Per set, the passes at the default overhead, and with none (every length apart).
        let overheads = [crate::generate::shared_prompt::PASS_OVERHEAD_TOKENS, 0];
        let counts = [[1, 2], [5, 7]];
        for ((set, requests), k) in request_sets().iter().enumerate().flat_map(|s| [(s, 0), (s, 1)]) {
            let overhead = overheads[k];
            for (tied, lora) in [(false, false), (true, false), (false, true)] {
                let mut m = small_random_model::<AD<Cpu>>(tied, 5);
                if lora {
                    let config = crate::model::lora::LoraConfig { rank: 2, ..Default::default() };
                    m = crate::model::lora::attach(m, &config, 1);
                }
                // The reference runs every prompt once per response, with the whole graph.
                let batch = TokenBatch::of(&m.config, requests).unwrap();
                let mut whole = GradStore::<Cpu>::default();
                whole.accumulate(&m, &weighted_head_loss(&m, dense_hidden(&m, requests)).backward());

                let passes = Passes::with_overhead(requests, overhead);
                let Recomputed { trunk, hidden, targets, lens } =
                    forward_as(&m, TokenBatch::of(&m.config, requests).unwrap(), passes);
                assert_eq!((targets, &lens), (batch.targets.clone(), &batch.lens));
                assert_eq!(trunk.passes.count(), counts[set][k], "passes");
                let mut recomputed = GradStore::<Cpu>::default();
                let head = weighted_head_loss(&m, hidden).backward();
                recomputed.accumulate(&m, &head);
                trunk.backward(&m, &head, &mut recomputed);

                let n = whole.names().len();
                assert!(n >= if lora { 2 * 7 * 3 } else { 3 * 11 }, "{n} parameters with gradients");
                let d = whole.max_relative_diff(&recomputed);
                // Float noise only: the recomputed forward runs the same kernels in another order.
                assert!(
                    d <= 1e-5,
                    "set {set}, overhead {overhead}, tied {tied}, lora {lora}: gradients differ by {d} (relative)"
                );
            }
        }
    }
}
