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

use std::collections::HashMap;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::model::{CausalLm, KvCache, Layout};

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

/// [`super::score::response_hidden`]'s hidden states `[response tokens, hidden]` (in request
/// order) with each distinct prompt run once: per group, the prompt as one row, then its
/// responses as a batch over the prompt's fanned-out cache.
pub fn response_hidden<B: Backend>(
    model: &CausalLm<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
    groups: &PromptGroups,
) -> Tensor<B, 2> {
    let device = model.device();
    let ids = |ids: Vec<i64>, shape: [usize; 2]| Tensor::<B, 2, Int>::from_data(TensorData::new(ids, shape), &device);
    let mut parts: Vec<Tensor<B, 2>> = Vec::new();
    // Where each request's rows are among the parts' rows: its prompt pass's last row and its
    // first fed row.
    let mut at = vec![(0, 0); requests.len()];
    let mut rows = 0;
    for g in &groups.groups {
        let prompt = &requests[g[0]].0;
        let (p, n) = (prompt.len(), fed(requests, g));
        let mut cache = KvCache::new(model.layers.len(), p + n);
        let first = model.forward_hidden(
            ids(prompt.iter().map(|&t| t as i64).collect(), [1, p]),
            &model.layout_tensors(&Layout::dense(1, p)),
            Some(&mut cache),
        );
        let d = first.dims()[2];
        parts.push(first.reshape([p, d]).slice([p - 1..p, 0..d]));
        let last = rows;
        rows += 1;
        if n > 0 {
            cache.select_rows(&vec![0; g.len()]);
            let mut fed_ids = vec![0i64; g.len() * n];
            for (row, &i) in g.iter().enumerate() {
                let response = &requests[i].1;
                for (j, &t) in response[..response.len().saturating_sub(1)].iter().enumerate() {
                    fed_ids[row * n + j] = t as i64;
                }
            }
            // Right-padded, from the prompt's end: later slots never influence earlier ones.
            let layout = Layout { pads: vec![0; g.len()], start: p, len: n };
            let rest =
                model.forward_hidden(ids(fed_ids, [g.len(), n]), &model.layout_tensors(&layout), Some(&mut cache));
            parts.push(rest.reshape([g.len() * n, d]));
        }
        for (row, &i) in g.iter().enumerate() {
            at[i] = (last, rows + row * n);
        }
        rows += g.len() * n;
    }
    let mut select = Vec::new();
    for (i, (_, response)) in requests.iter().enumerate() {
        let (last, first_fed) = at[i];
        select.extend((0..response.len()).map(|j| if j == 0 { last } else { first_fed + j - 1 } as i64));
    }
    let n = select.len();
    Tensor::cat(parts, 0).select(0, Tensor::<B, 1, Int>::from_data(TensorData::new(select, [n]), &device))
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
            let shared = response_hidden(&m, &requests, &groups);
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
