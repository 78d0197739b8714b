//! Scoring and training on a group's responses with their shared prompt run once.
//!
//! A GRPO group is G responses to one prompt: laid out as G full sequences (as
//! [`super::score::response_hidden`]'s dense batch does), the prompt's tokens go through every
//! layer G times, forward and backward. Here each distinct prompt runs once, its keys and values
//! fan out to its responses through the KV cache (as [`super::generate`] fans a prefill out to
//! its samples), and the responses run on top: the same hidden states, to rounding, with the
//! prompt's share of the work divided by G. In a training pass the fan-out is a row selection,
//! whose backward sums the responses' gradients into the one prompt pass.
//!
//! The last response token is never fed (nothing here reads what it predicts), and the first
//! response token is predicted by the prompt pass's last position.
//!
//! [`Passes`] is the plan, run one decoder layer at a time ([`Passes::layer`]) so that gradient
//! checkpointing ([`crate::train::recompute`]) can keep each layer's inputs and recompute it.

use std::collections::HashMap;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use super::score::TokenBatch;
use crate::model::transformer::DecoderLayer;
use crate::model::{CausalLm, KvCache, Layout, LayoutTensors};

/// The requests' distinct prompts, in order of first appearance.
pub struct PromptGroups {
    /// Each group's request indices, in request order.
    groups: Vec<Vec<usize>>,
}

impl PromptGroups {
    pub fn of(requests: &[(Vec<u32>, Vec<u32>)]) -> Self {
        let mut index: HashMap<&[u32], usize> = HashMap::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, (prompt, _)) in requests.iter().enumerate() {
            let next = groups.len();
            let g = *index.entry(prompt.as_slice()).or_insert(next);
            if g == next {
                groups.push(Vec::new());
            }
            groups[g].push(i);
        }
        PromptGroups { groups }
    }

    /// Whether some prompt is repeated, so that running each once saves its repeats' work.
    pub fn repeat(&self) -> bool {
        self.groups.iter().any(|g| g.len() > 1)
    }
}

/// Response tokens fed per row of group `g`: all but the last of its longest response.
fn fed(requests: &[(Vec<u32>, Vec<u32>)], g: &[usize]) -> usize {
    g.iter().map(|&i| requests[i].1.len().saturating_sub(1)).max().unwrap_or(0)
}

/// One forward pass of a plan: `rows` right-padded sequences of `len` tokens.
struct Pass {
    ids: Vec<i64>,
    rows: usize,
    len: usize,
    /// Whether it continues the pass before it (a prompt's), over that pass's keys and values
    /// fanned out to each of its rows.
    continues: bool,
}

/// How a batch of (prompt, response) pairs runs: its forward passes, and the rows of their
/// outputs, flattened and concatenated in pass order, that predict each response token (in
/// request order).
pub struct Passes {
    passes: Vec<Pass>,
    select: Vec<i64>,
}

impl Passes {
    /// Each distinct prompt once when some prompt repeats; otherwise `batch` as one dense pass.
    pub fn of(requests: &[(Vec<u32>, Vec<u32>)], batch: &TokenBatch) -> Self {
        let groups = PromptGroups::of(requests);
        if groups.repeat() { Self::shared(requests, &groups) } else { Self::dense(batch) }
    }

    /// The whole right-padded batch in one pass, every prompt run once per response.
    pub fn dense(batch: &TokenBatch) -> Self {
        let pass = Pass { ids: batch.ids.clone(), rows: batch.b, len: batch.t, continues: false };
        Passes { passes: vec![pass], select: batch.rows.clone() }
    }

    /// Per group, the prompt as one row, then its responses as a batch over the prompt's
    /// fanned-out cache (none when every response has a single token).
    pub fn shared(requests: &[(Vec<u32>, Vec<u32>)], groups: &PromptGroups) -> Self {
        let mut passes = Vec::new();
        // Where each request's rows are in the flattened outputs: its prompt pass's last row
        // and its first fed row.
        let mut at = vec![(0, 0); requests.len()];
        let mut offset = 0;
        for g in &groups.groups {
            let prompt = &requests[g[0]].0;
            let (p, n) = (prompt.len(), fed(requests, g));
            passes.push(Pass { ids: prompt.iter().map(|&t| t as i64).collect(), rows: 1, len: p, continues: false });
            let last = offset + p - 1;
            offset += p;
            if n > 0 {
                let mut ids = vec![0i64; g.len() * n];
                for (row, &i) in g.iter().enumerate() {
                    let response = &requests[i].1;
                    for (j, &t) in response[..response.len().saturating_sub(1)].iter().enumerate() {
                        ids[row * n + j] = t as i64;
                    }
                }
                passes.push(Pass { ids, rows: g.len(), len: n, continues: true });
            }
            for (row, &i) in g.iter().enumerate() {
                at[i] = (last, offset + row * n);
            }
            offset += g.len() * n;
        }
        let mut select = Vec::new();
        for (i, (_, response)) in requests.iter().enumerate() {
            let (last, first_fed) = at[i];
            select.extend((0..response.len()).map(|j| if j == 0 { last } else { first_fed + j - 1 } as i64));
        }
        Passes { passes, select }
    }

    /// Each pass's positions and mask (a continuing pass starts after its prompt).
    pub fn layouts<B: Backend>(&self, model: &CausalLm<B>) -> Vec<LayoutTensors<B>> {
        let mut start = 0;
        let mut layouts = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            start = if pass.continues { start } else { 0 };
            // Right-padded, from the prompt's end: later slots never influence earlier ones.
            layouts.push(model.layout_tensors(&Layout { pads: vec![0; pass.rows], start, len: pass.len }));
            start += pass.len;
        }
        layouts
    }

    /// Each pass's token ids `[rows, len]`.
    pub fn ids<B: Backend>(&self, device: &B::Device) -> Vec<Tensor<B, 2, Int>> {
        let ids = |p: &Pass| Tensor::from_data(TensorData::new(p.ids.clone(), [p.rows, p.len]), device);
        self.passes.iter().map(ids).collect()
    }

    /// `layer` over every pass's input `xs`, in order: a prompt pass that a pass continues
    /// keeps its keys and values for it.
    pub fn layer<B: Backend>(
        &self,
        layer: &DecoderLayer<B>,
        layouts: &[LayoutTensors<B>],
        xs: Vec<Tensor<B, 3>>,
    ) -> Vec<Tensor<B, 3>> {
        let mut kept: Option<KvCache<B>> = None;
        let mut out = Vec::with_capacity(xs.len());
        for (i, (pass, x)) in self.passes.iter().zip(xs).enumerate() {
            let y = if pass.continues {
                let mut cache = kept.take().expect("a continuing pass follows its prompt's");
                cache.select_rows(&vec![0; pass.rows]);
                let start = cache.len();
                layer.forward(x, &layouts[i], Some((&mut cache, 0, start)))
            } else if let Some(next) = self.passes.get(i + 1).filter(|n| n.continues) {
                let mut cache = KvCache::new(1, pass.len + next.len);
                let y = layer.forward(x, &layouts[i], Some((&mut cache, 0, 0)));
                cache.advance(pass.len);
                kept = Some(cache);
                y
            } else {
                layer.forward(x, &layouts[i], None)
            };
            out.push(y);
        }
        out
    }

    /// The rows of the passes' outputs `[rows, len, hidden]` that predict each response token:
    /// `[response tokens, hidden]`.
    pub fn select<B: Backend>(&self, outputs: Vec<Tensor<B, 3>>) -> Tensor<B, 2> {
        let device = outputs[0].device();
        let flat: Vec<Tensor<B, 2>> = outputs
            .into_iter()
            .map(|x| {
                let [rows, len, d] = x.dims();
                x.reshape([rows * len, d])
            })
            .collect();
        let n = self.select.len();
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(self.select.clone(), [n]), &device);
        Tensor::cat(flat, 0).select(0, rows)
    }

    /// The final hidden states of [`Self::select`]'s rows, the whole model's forward pass run
    /// as planned.
    pub fn response_hidden<B: Backend>(&self, model: &CausalLm<B>) -> Tensor<B, 2> {
        let layouts = self.layouts(model);
        let mut xs: Vec<Tensor<B, 3>> = self.ids(&model.device()).into_iter().map(|ids| model.embed(ids)).collect();
        for layer in &model.layers {
            xs = self.layer(layer, &layouts, xs);
        }
        // The final norm works per row, so it can come after the selection.
        model.norm.forward(self.select(xs), model.compute)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::generate::score::{TokenBatch, dense_hidden};
    use crate::model::weights::small_random_model;
    use crate::train::optim::GradStore;

    type AD = burn::backend::Autodiff<Cpu>;

    /// Two groups interleaved (prompts of 5 and 2 tokens; responses of 1 to 6 tokens, one of them
    /// empty) and a prompt of its own.
    fn requests() -> Vec<(Vec<u32>, Vec<u32>)> {
        let (a, b) = (vec![3, 9, 4, 12, 7], vec![11, 5]);
        vec![
            (a.clone(), vec![7, 1, 60, 2]),
            (b.clone(), vec![30, 31, 8]),
            (a.clone(), vec![9]),
            (vec![40, 41, 42], vec![6, 6]),
            (a.clone(), vec![50, 51, 52, 53, 54, 55]),
            (b.clone(), vec![]),
            (b, vec![1, 2, 3]),
        ]
    }

    fn host(t: Tensor<AD, 2>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    #[test]
    fn each_prompt_run_once_gives_the_dense_hidden_states_and_gradients() {
        let requests = requests();
        let groups = PromptGroups::of(&requests);
        assert_eq!(groups.groups, vec![vec![0, 2, 4], vec![1, 5, 6], vec![3]]);
        for (tied, lora) in [(false, false), (true, false), (false, true)] {
            let mut m = small_random_model::<AD>(tied, 5);
            if lora {
                m = crate::model::lora::attach(m, &crate::model::lora::LoraConfig { rank: 2, ..Default::default() }, 1);
            }
            let batch = TokenBatch::of(&m.config, &requests).unwrap();
            let dense = dense_hidden(&m, &batch);
            let shared = Passes::shared(&requests, &groups).response_hidden(&m);
            assert_eq!(dense.dims(), shared.dims());
            let (x, y) = (host(dense.clone()), host(shared.clone()));
            let scale = x.iter().map(|v| v.abs()).fold(0.0, f32::max);
            let d = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max) / scale;
            assert!(d <= 1e-5, "tied {tied}, lora {lora}: hidden states differ by {d} (relative)");
            // A loss that weighs every row differently, through the LM head.
            let loss = |h: Tensor<AD, 2>| {
                let n = h.dims()[0];
                let w: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 0.25).collect();
                let w = Tensor::<AD, 1>::from_data(TensorData::new(w, [n]), &h.device()).reshape([n, 1]);
                (burn::tensor::activation::log_softmax(m.logits(h), 1) * w).slice([0..n, 0..7]).sum().neg()
            };
            let (mut a, mut b) = (GradStore::<Cpu>::default(), GradStore::<Cpu>::default());
            a.accumulate(&m, &loss(dense).backward());
            b.accumulate(&m, &loss(shared).backward());
            assert!(a.names().len() >= if lora { 2 * 7 } else { 3 * 11 }, "{} parameters", a.names().len());
            let d = a.max_relative_diff(&b);
            assert!(d <= 1e-5, "tied {tied}, lora {lora}: gradients differ by {d} (relative)");
        }
    }

    #[test]
    fn prompts_run_once_only_when_one_repeats() {
        let requests = requests();
        assert!(PromptGroups::of(&requests).repeat());
        let distinct: Vec<_> =
            requests.iter().enumerate().map(|(i, (p, r))| ([p.as_slice(), &[i as u32]].concat(), r.clone())).collect();
        assert!(!PromptGroups::of(&distinct).repeat());
    }
}
