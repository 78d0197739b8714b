//! The trainable parameters of a model put into one autodiff graph before a forward pass
//! uses them.
//!
//! burn-autodiff (0.21) gives every tensor marked `require_grad` a graph of its own. The first
//! operation that reads tensors of two graphs merges them, moving one graph's entries into the
//! other's, and which one moves is the order of a hash map: half the time it is the forward
//! pass's whole graph moving into a parameter's single node. A forward pass reads each
//! parameter once, so every update (which makes new parameter tensors) paid one such merge
//! per parameter, each moving everything computed so far: on the embedded default, 13 million
//! moved entries in 6 steps and a third of the update's time.
//!
//! [`join`] merges the parameters' graphs with one another while each is a single node, with
//! one operation that reads a one-element view of each (its result is dropped and no loss
//! depends on it, so no backward pass visits it); the forward pass then starts inside that graph
//! and merges nothing. Values, gradients and the order of every computation stay the same.

use burn::module::Param;
use burn::prelude::*;

use crate::model::CausalLm;
use crate::model::weights::{ParamVisitor, walk_params};

/// `model` with its trainable parameters in one autodiff graph (see the module docs). A no-op
/// for a model without trainable parameters (any backend without autodiff).
pub fn join<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    let mut views = Views(Vec::new());
    let model = walk_params(model, &mut views);
    // Trainable weights are f32 masters; one of another dtype would stay apart rather than
    // fail the concatenation.
    let mut views = views.0;
    if let Some(dtype) = views.first().map(|v| v.dtype()) {
        views.retain(|v| v.dtype() == dtype);
    }
    if views.len() > 1 {
        drop(Tensor::cat(views, 0));
    }
    model
}

/// One element of each trainable parameter, a view rather than a copy.
struct Views<B: Backend>(Vec<Tensor<B, 1>>);

impl<B: Backend> ParamVisitor<B> for Views<B> {
    fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
        if p.is_require_grad() {
            self.0.push(p.val().slice(0..1));
        }
        p
    }

    fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
        if p.is_require_grad() {
            self.0.push(p.val().slice([0..1, 0..1]).reshape([1]));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Cpu, CpuAutodiff};
    use crate::generate::score::response_hidden;
    use crate::model::weights::{small_random_model, weighted_head_loss};
    use crate::train::optim::GradStore;

    /// The gradients of one loss through a joined model and through the same model unjoined
    /// are the same bits, for every parameter, on two forward passes in a row (the second
    /// after the first's backward pass has freed its graph).
    #[test]
    fn joined_parameters_give_the_same_gradients_bit_for_bit() {
        let model = small_random_model::<CpuAutodiff>(true, 3);
        let requests = vec![(vec![1u32, 2, 3], vec![4u32, 5, 6, 7]), (vec![8u32, 9], vec![10u32, 11, 12])];
        let gradients = |model: &CausalLm<CpuAutodiff>| {
            let (hidden, _, _) = response_hidden(model, &requests).unwrap();
            let mut store = GradStore::<Cpu>::default();
            store.accumulate(model, &weighted_head_loss(model, hidden).backward());
            store.names().into_iter().map(|n| (n.clone(), store.host(&n).unwrap())).collect::<Vec<_>>()
        };
        let plain = gradients(&model);
        assert!(plain.len() > 10, "every parameter has a gradient: {}", plain.len());
        let joined = join(model.clone());
        for pass in 0..2 {
            let again = gradients(&joined);
            assert_eq!(again.len(), plain.len());
            for ((name, a), (other, b)) in plain.iter().zip(&again) {
                assert_eq!(name, other);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(a), bits(b), "{name}, pass {pass}");
            }
        }
    }

    /// Joining marks nothing trainable that was not, and leaves frozen models alone.
    #[test]
    fn joining_keeps_what_is_trainable_and_accepts_a_model_without_autodiff() {
        let model = small_random_model::<CpuAutodiff>(true, 4);
        let joined = join(model.clone());
        assert_eq!(joined.embed_tokens.is_require_grad(), model.embed_tokens.is_require_grad());
        assert_eq!(
            joined.layers[0].mlp.down_proj.weight.val().into_data(),
            model.layers[0].mlp.down_proj.weight.val().into_data()
        );
        let frozen = small_random_model::<Cpu>(true, 4);
        let kept = join(frozen.clone());
        assert_eq!(kept.embed_tokens.val().into_data(), frozen.embed_tokens.val().into_data());
    }
}
