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

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};

use crate::error::Result;
use crate::generate::score::TokenBatch;
use crate::model::{CausalLm, Layout};
use crate::train::optim::GradStore;

type AD<B> = Autodiff<B>;

/// The trunk of one micro-batch after a graph-free forward pass: what the backward pass
/// needs to recompute each layer.
pub struct Trunk<B: Backend> {
    ids: Tensor<B, 2, Int>,
    batch: (usize, usize),
    /// Each decoder layer's input `[b, t, hidden]`, no graph.
    inputs: Vec<Tensor<B, 3>>,
    /// The last layer's output as a leaf of the head's graph.
    top: Tensor<AD<B>, 3>,
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
    let batch = TokenBatch::of(&model.config, requests)?;
    let (b, t) = (batch.b, batch.t);
    let inner = model.valid();
    let device = inner.device();
    let layout = inner.layout_tensors(&Layout::dense(b, t));
    let ids = batch.ids::<B>(&device);
    let mut x = inner.embed(ids.clone());
    let mut inputs = Vec::with_capacity(inner.layers.len());
    for layer in &inner.layers {
        inputs.push(x.clone());
        x = layer.forward(x, &layout, None);
    }
    let top = Tensor::<AD<B>, 3>::from_inner(x).require_grad();
    let hidden = model.norm.forward(top.clone(), model.compute);
    let d = hidden.dims()[2];
    let rows = hidden.reshape([b * t, d]).select(0, batch.rows(&model.device()));
    Ok(Recomputed {
        trunk: Trunk { ids, batch: (b, t), inputs, top },
        hidden: rows,
        targets: batch.targets,
        lens: batch.lens,
    })
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
        let Some(mut upstream) = self.top.grad(head) else { return };
        let (b, t) = self.batch;
        let layout = model.layout_tensors(&Layout::dense(b, t));
        for (layer, input) in model.layers.iter().zip(self.inputs).rev() {
            let x = Tensor::<AD<B>, 3>::from_inner(input).require_grad();
            let y = layer.forward(x.clone(), &layout, None);
            let grads = (y * Tensor::from_inner(upstream)).sum().backward();
            store.accumulate(model, &grads);
            upstream = x.grad(&grads).expect("a layer's output depends on its input");
        }
        if model.embed_tokens.is_require_grad() {
            let ids = Tensor::<AD<B>, 2, Int>::from_inner(self.ids);
            let x = model.embed(ids);
            let grads = (x * Tensor::from_inner(upstream)).sum().backward();
            store.accumulate(model, &grads);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::model::weights::small_random_model;

    fn model(tied: bool) -> CausalLm<AD<Cpu>> {
        small_random_model(tied, 5)
    }

    /// A loss of the selected hidden states through the LM head, as the update's is.
    fn loss(model: &CausalLm<AD<Cpu>>, hidden: Tensor<AD<Cpu>, 2>) -> Tensor<AD<Cpu>, 1> {
        let logits = model.logits(hidden);
        burn::tensor::activation::log_softmax(logits, 1).slice([0..5, 0..7]).sum().neg()
    }

    #[test]
    fn recomputed_gradients_equal_the_whole_graphs() {
        let requests = vec![(vec![3, 9, 4], vec![7, 1, 60, 2]), (vec![11, 5, 6, 8, 20], vec![30, 31])];
        for (tied, lora) in [(false, false), (true, false), (false, true)] {
            let mut m = model(tied);
            if lora {
                m = crate::model::lora::attach(m, &crate::model::lora::LoraConfig { rank: 2, ..Default::default() }, 1);
            }
            let (hidden, ..) = crate::generate::score::response_hidden(&m, &requests).unwrap();
            let mut whole = GradStore::<Cpu>::default();
            whole.accumulate(&m, &loss(&m, hidden).backward());

            let Recomputed { trunk, hidden, targets, lens } = forward(&m, &requests).unwrap();
            assert_eq!((targets.len(), lens), (6, vec![4, 2]));
            let mut recomputed = GradStore::<Cpu>::default();
            let head = loss(&m, hidden).backward();
            recomputed.accumulate(&m, &head);
            trunk.backward(&m, &head, &mut recomputed);

            let n = whole.names().len();
            assert!(n >= if lora { 2 * 7 * 3 } else { 3 * 11 }, "{n} parameters with gradients");
            let d = whole.max_relative_diff(&recomputed);
            // Float noise only: the recomputed forward runs the same kernels in another order.
            assert!(d <= 1e-5, "tied {tied}, lora {lora}: gradients differ by {d} (relative)");
        }
    }
}
