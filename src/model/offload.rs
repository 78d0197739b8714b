//! A frozen model that waits in host memory between uses (`[[agents]] offload`).
//!
//! The KL reference is read once per step, by the scoring stage; on a GPU it need not hold
//! device memory through the rollout and the update, which are the phases that fill it (verl's
//! `ref.param_offload`). [`HostModel::upload`] copies it to its device for one use, and the
//! caller drops the copy after. The values are the stored ones, bit for bit, in their dtype.

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::CausalLm;
use super::weights::{ParamVisitor, walk_params};

/// A model's weights in host memory, with the rest of the model (its config, its structure)
/// kept as it was.
pub struct HostModel<B: Backend> {
    /// The model with every parameter replaced by a one-element placeholder.
    skeleton: CausalLm<B>,
    /// Every parameter's values in [`walk_params`] order, in the dtype it was stored in.
    weights: Vec<TensorData>,
    device: B::Device,
}

impl<B: Backend> HostModel<B> {
    /// Moves `model`'s weights to host memory; its device is where [`HostModel::upload`] puts
    /// them back.
    pub fn of(model: CausalLm<B>) -> Self {
        struct Take<B: Backend> {
            weights: Vec<TensorData>,
            device: B::Device,
        }
        impl<B: Backend> Take<B> {
            fn take<const D: usize>(&mut self, t: Tensor<B, D>) -> Tensor<B, D> {
                self.weights.push(t.into_data());
                Tensor::zeros([1; D], &self.device)
            }
        }
        impl<B: Backend> ParamVisitor<B> for Take<B> {
            fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
                p.map(|t| self.take(t))
            }
            fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
                p.map(|t| self.take(t))
            }
        }
        let device = model.embed_tokens.val().device();
        let mut take = Take { weights: Vec::new(), device: device.clone() };
        let skeleton = walk_params(model, &mut take);
        HostModel { skeleton, weights: take.weights, device }
    }

    /// A copy of the model on its device.
    pub fn upload(&self) -> CausalLm<B> {
        struct Put<'a, B: Backend> {
            weights: std::slice::Iter<'a, TensorData>,
            device: &'a B::Device,
        }
        impl<B: Backend> Put<'_, B> {
            fn put<const D: usize>(&mut self) -> Tensor<B, D> {
                let data = self.weights.next().expect("one stored tensor per parameter").clone();
                let dtype = data.dtype;
                Tensor::from_data(data, (self.device, dtype))
            }
        }
        impl<B: Backend> ParamVisitor<B> for Put<'_, B> {
            fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
                p.map(|_| self.put())
            }
            fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
                p.map(|_| self.put())
            }
        }
        walk_params(self.skeleton.clone(), &mut Put { weights: self.weights.iter(), device: &self.device })
    }

    /// Bytes of host memory the weights take.
    pub fn bytes(&self) -> usize {
        self.weights.iter().map(|d| d.bytes.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::dtype::FrozenDtype;
    use crate::model::precision::{rollout_copy, set_compute, store_frozen};
    use crate::model::weights::small_random_model;

    /// What comes back is what went in: every weight's bits and dtype (f32 and a bf16-stored
    /// model), tied and untied heads, and the same log-probabilities.
    #[test]
    fn an_uploaded_copy_has_every_weight_bit_for_bit_in_its_dtype() {
        let requests = vec![(vec![1u32, 2, 3], vec![4u32, 5, 6, 7])];
        for (tied, frozen) in [(false, FrozenDtype::F32), (true, FrozenDtype::Bf16)] {
            let model = store_frozen(small_random_model::<Cpu>(tied, 2), frozen);
            let weights = |m: &CausalLm<Cpu>| {
                struct All(Vec<TensorData>);
                impl ParamVisitor<Cpu> for All {
                    fn vector(&mut self, _: &str, p: Param<Tensor<Cpu, 1>>) -> Param<Tensor<Cpu, 1>> {
                        self.0.push(p.val().into_data());
                        p
                    }
                    fn matrix(&mut self, _: &str, p: Param<Tensor<Cpu, 2>>, _: bool) -> Param<Tensor<Cpu, 2>> {
                        self.0.push(p.val().into_data());
                        p
                    }
                }
                let mut all = All(Vec::new());
                walk_params(m.clone(), &mut all);
                all.0
            };
            let host = HostModel::of(model.clone());
            assert_eq!(host.bytes(), model.config.num_parameters() * if tied { 2 } else { 4 });
            let back = host.upload();
            let (a, b) = (weights(&model), weights(&back));
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!((x.dtype, &x.shape, &x.bytes[..]), (y.dtype, &y.shape, &y.bytes[..]));
            }
            let score = |m: &CausalLm<Cpu>| crate::generate::score::score(m, &requests, 1.0).unwrap();
            assert_eq!(score(&model), score(&back), "tied {tied}");
            // A second use reads the same host copy.
            assert_eq!(score(&host.upload()), score(&model));
        }
        // A reference as bf16 compute samples it (bf16 weights, the CPU's decoding layout) is
        // kept in bf16 and laid out again after each upload, as `Policy::reference_model` does.
        let bf16 = crate::dtype::ComputeDtype::Bf16;
        let sampled = rollout_copy(set_compute(small_random_model::<Cpu>(false, 4), bf16));
        let host = HostModel::of(sampled.clone());
        assert_eq!(host.bytes(), sampled.config.num_parameters() * 2);
        let score = |m: &CausalLm<Cpu>| crate::generate::score::score(m, &requests, 1.0).unwrap();
        assert_eq!(score(&rollout_copy(host.upload())), score(&sampled));
    }
}
