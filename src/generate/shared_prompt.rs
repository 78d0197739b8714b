//! Scoring and training on responses with their shared prompt, or shared prompt prefix, run once.
//!
//! A GRPO group is G responses to one prompt: laid out as G full sequences, the prompt's
//! tokens go through every layer G times, forward and backward. Here each distinct prompt runs
//! once and its responses run on top, reading its keys and values: the same hidden states, to
//! rounding, with the prompt's share of the work divided by G. On the CPU backends they read
//! them where the prompt's pass left them ([`packed_attention`]); on the others the keys and
//! values fan out to the responses through the KV cache (as [`super::generate`] fans a prefill
//! out to its samples), a row selection whose backward sums the responses' gradients into the
//! one prompt pass.
//!
//! Prompts that are not identical but begin alike (a multi-turn team's K episodes of one task,
//! whose later turns' prompts differ by what each episode did) share that beginning the same
//! way, when that saves work ([`PromptGroups`]): the prefix runs once and each request runs the
//! rest of its prompt and its response over it.
//!
//! Only the attention needs its rows side by side: everything else in a layer works token by
//! token. So the passes' tokens are packed, padding left out, and every projection and MLP of
//! a layer multiplies all of them at once (verl's and TRL's padding-free batches: one product
//! of each weight a micro-batch, a bf16 weight rounded once). On a CPU backend one attention op
//! runs every row of every pass on the packed tokens, a continuing row reading its prompt's
//! keys where the prompt pass left them ([`packed_attention`]: no cache, no padding). On the
//! other backends each pass's attention runs on its rows right-padded to the longest, gathered
//! from the packed tokens and back by [`gather_rows`], whose gradient is a gather too, and
//! responses of very different lengths (a math rollout's run from a few hundred tokens to the
//! limit) run in passes of like lengths where that saves more padding than a pass costs
//! ([`passes_by_length`]).
//!
//! The last response token is never fed (nothing here reads what it predicts), and the first
//! response token is predicted by the last prompt position, in the prefix pass when the prompt
//! is all prefix.
//!
//! [`Passes`] is the plan, run one decoder layer at a time ([`Passes::layer`]) so that gradient
//! checkpointing ([`crate::train::recompute`]) can keep each layer's inputs and recompute it.

use std::collections::HashMap;
use std::sync::Arc;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use crate::backend::fused::CpuBackend;
use crate::backend::gather::gather_rows;
use crate::backend::packed_attention::{self, PackedSeq};
use crate::dtype::ComputeDtype;
use crate::model::layout::RopeTables;
use crate::model::transformer::DecoderLayer;
use crate::model::{CausalLm, KvCache, Layout, LayoutTensors};

/// Requests whose prompts begin with the same tokens, run as one pass over that prefix and
/// one or more over the rest of each prompt and its response (one in the prefill; scoring and
/// training cut them by length, [`passes_by_length`]).
#[derive(Debug, PartialEq)]
struct Group {
    /// Tokens the members' prompts share (the whole prompt when they are identical).
    prefix: usize,
    /// Request indices, in request order.
    members: Vec<usize>,
    /// The longest of the members' [`rest`]s: a single rest pass's width.
    width: usize,
}

/// The requests grouped by shared prompt prefix: identical prompts (a GRPO group's samples)
/// always, and distinct prompts that share a beginning (K episodes of one task whose later
/// turns differ) when running the shared part once saves a quarter of the joining prompt's
/// tokens or more, padding counted.
pub struct PromptGroups {
    groups: Vec<Group>,
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many tokens `request` runs past the first `prefix` tokens of its prompt ([`rest`]).
fn rest_len(request: &(Vec<u32>, Vec<u32>), prefix: usize) -> usize {
    request.0.len() - prefix + request.1.len().saturating_sub(1)
}

/// The tokens `request` runs past the first `prefix` tokens of its prompt: the rest of its
/// prompt, then all but the last token of its response (nothing reads what that predicts).
fn rest(request: &(Vec<u32>, Vec<u32>), prefix: usize) -> impl Iterator<Item = u32> + '_ {
    let (prompt, response) = request;
    prompt[prefix..].iter().chain(&response[..response.len().saturating_sub(1)]).copied()
}

impl PromptGroups {
    pub fn of(requests: &[(Vec<u32>, Vec<u32>)]) -> Self {
        // Identical prompts first, in order of first appearance.
        let mut index: HashMap<&[u32], usize> = HashMap::new();
        let mut distinct: Vec<Vec<usize>> = Vec::new();
        for (i, (prompt, _)) in requests.iter().enumerate() {
            let next = distinct.len();
            let d = *index.entry(prompt.as_slice()).or_insert(next);
            if d == next {
                distinct.push(Vec::new());
            }
            distinct[d].push(i);
        }
        // Then each distinct prompt joins the group where that saves the most tokens, if any.
        let mut groups: Vec<Group> = Vec::new();
        for members in distinct {
            let best = (groups.iter().enumerate())
                .filter_map(|(k, g)| g.join(requests, &members).map(|joined| (joined, k)))
                .max_by_key(|&((saved, _), k)| (saved, std::cmp::Reverse(k)));
            match best {
                Some(((_, joined), k)) => groups[k] = joined,
                None => {
                    let prefix = requests[members[0]].0.len();
                    let width = members.iter().map(|&i| rest_len(&requests[i], prefix)).max().unwrap_or(0);
                    groups.push(Group { prefix, members, width });
                }
            }
        }
        PromptGroups { groups }
    }

    /// Whether some group has more than one request, so that running each prefix once saves
    /// its repeats' work.
    pub fn repeat(&self) -> bool {
        self.groups.iter().any(|g| g.members.len() > 1)
    }

    /// Each group's shared prefix length and its members (request indices, in request order).
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[usize])> {
        self.groups.iter().map(|g| (g.prefix, g.members.as_slice()))
    }
}

impl Group {
    /// `(tokens saved, the joined group)` when `joining`, requests with one prompt, join this
    /// group rather than form their own, if that saves a quarter of the prompt or more. A group
    /// runs `prefix + rows · width` tokens as one rest pass padded to its longest rest (the
    /// prefill's; scoring's passes by length run fewer, so this errs towards not joining);
    /// joining shrinks the prefix to the tokens shared, which lengthens every member's rest by
    /// as many.
    fn join(&self, requests: &[(Vec<u32>, Vec<u32>)], joining: &[usize]) -> Option<(usize, Group)> {
        let prompt = &requests[joining[0]].0;
        let l = common_prefix(&requests[self.members[0]].0[..self.prefix], prompt);
        let widest = |p: usize| joining.iter().map(|&i| rest_len(&requests[i], p)).max().unwrap_or(0);
        let width = (self.width + self.prefix - l).max(widest(l));
        let rows = self.members.len() + joining.len();
        let apart = self.prefix + self.members.len() * self.width + prompt.len() + joining.len() * widest(prompt.len());
        let joined = l + rows * width;
        if l == 0 || joined + prompt.len() / 4 > apart {
            return None;
        }
        let mut members = [self.members.as_slice(), joining].concat();
        members.sort_unstable();
        Some((apart - joined, Group { prefix: l, members, width }))
    }
}

/// One forward pass of a plan: `rows` right-padded sequences of `len` slots.
struct Pass {
    /// Its tokens, each row's after the one before, padding left out.
    ids: Vec<i64>,
    rows: usize,
    len: usize,
    /// Each row's tokens (`len` for the longest).
    lens: Vec<usize>,
    /// Whether it continues the last prompt pass before it (one that does not continue): its
    /// rows see that pass's keys and values first.
    continues: bool,
}

/// What one more pass costs beside its tokens, in tokens: on a GPU each pass gathers its rows'
/// keys, queries and values and launches the attention's kernels of every layer again. A batch
/// splits into passes of like lengths only where that saves more padding than this. (The
/// CPU's packed attention runs no padding: the cut changes nothing there.)
pub const PASS_OVERHEAD_TOKENS: usize = 256;

/// Rows of lengths `lens` cut into passes (row indices, each pass's in row order, longest
/// pass first) that run the fewest tokens, padding counted, plus `overhead` per pass: passes of
/// rows of like lengths, so that a short response does not run padded to the longest. Rows of
/// length 0 run in no pass (a last list of their own, costing nothing).
fn passes_by_length(lens: &[usize], overhead: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    // A pass of rows order[i..j] runs (j − i) rows of the longest's length, order[i]'s.
    let cost = |i: usize, j: usize| match lens[order[i]] {
        0 => 0,
        len => (j - i) * len + overhead,
    };
    // best[j]: the least cost of order[..j], and where its last pass starts.
    let mut best: Vec<(usize, usize)> = vec![(0, 0)];
    for j in 1..=order.len() {
        let at = (0..j).min_by_key(|&i| (best[i].0 + cost(i, j), i)).expect("j ≥ 1");
        best.push((best[at].0 + cost(at, j), at));
    }
    let mut cuts = Vec::new();
    let mut j = order.len();
    while j > 0 {
        let i = best[j].1;
        let mut rows = order[i..j].to_vec();
        rows.sort_unstable();
        cuts.push(rows);
        j = i;
    }
    cuts.reverse();
    cuts
}

/// The token slots (see [`Passes::slots`]) of `requests` run as [`Passes::of`] plans them;
/// with an empty prompt among them (which scoring refuses), every request's tokens.
pub fn slots(requests: &[(Vec<u32>, Vec<u32>)]) -> usize {
    match requests.is_empty() || requests.iter().any(|(p, _)| p.is_empty()) {
        true => requests.iter().map(|(p, r)| p.len() + r.len()).sum(),
        false => Passes::of(requests).slots(),
    }
}

/// Where a request's tokens are among a plan's packed tokens: its prefix's length (0 for a
/// request run whole), the prefix pass's first token, and its own first token in its rest
/// pass.
#[derive(Clone, Copy)]
struct Rows {
    prefix: usize,
    first: usize,
    own: usize,
}

/// The output rows that predict each response token, in request order: response token j is
/// predicted at position |prompt| − 1 + j, in the prefix pass only for the first token after a
/// prompt that is all prefix.
fn response_rows(requests: &[(Vec<u32>, Vec<u32>)], at: &[Rows]) -> Vec<i64> {
    let mut select = Vec::new();
    for ((prompt, response), at) in requests.iter().zip(at) {
        select.extend((0..response.len()).map(|j| {
            let q = prompt.len() - 1 + j;
            (if q < at.prefix { at.first + q } else { at.own + q - at.prefix }) as i64
        }));
    }
    select
}

/// How a batch of (prompt, response) pairs runs: its forward passes, and the rows of their
/// packed tokens (every pass's, padding left out, in pass order) that predict each response
/// token (in request order).
pub struct Passes {
    passes: Vec<Pass>,
    select: Vec<i64>,
}

impl Passes {
    /// Each shared prompt or prefix once when some group has more than one request; otherwise
    /// every request whole. Rows of like lengths run together ([`PASS_OVERHEAD_TOKENS`]).
    /// Callers check the requests first ([`super::score::TokenBatch::of`]): there is one at
    /// least, and no prompt is empty.
    pub fn of(requests: &[(Vec<u32>, Vec<u32>)]) -> Self {
        Self::with_overhead(requests, PASS_OVERHEAD_TOKENS)
    }

    /// [`Self::of`] with `overhead` tokens counted per pass.
    pub(crate) fn with_overhead(requests: &[(Vec<u32>, Vec<u32>)], overhead: usize) -> Self {
        debug_assert!(!requests.is_empty() && requests.iter().all(|(p, _)| !p.is_empty()), "unchecked requests");
        let groups = PromptGroups::of(requests);
        if groups.repeat() { Self::shared(requests, &groups, overhead) } else { Self::dense(requests, overhead) }
    }

    /// Every request whole, prompt and response, right-padded in passes of like lengths.
    fn dense(requests: &[(Vec<u32>, Vec<u32>)], overhead: usize) -> Self {
        let mut passes = Vec::new();
        let everyone: Vec<usize> = (0..requests.len()).collect();
        let rows = Self::push_rests(&mut passes, requests, &everyone, 0, overhead, &mut 0);
        let at: Vec<Rows> = rows.into_iter().map(|own| Rows { prefix: 0, first: 0, own }).collect();
        Passes { passes, select: response_rows(requests, &at) }
    }

    /// Per group, the shared prefix as one row, then each request's rest (the remainder of its
    /// prompt and its response) in passes of like lengths over the prefix's fanned-out cache
    /// (none for requests with no rest: identical prompts with single-token responses).
    fn shared(requests: &[(Vec<u32>, Vec<u32>)], groups: &PromptGroups, overhead: usize) -> Self {
        let mut passes = Vec::new();
        let mut at = vec![Rows { prefix: 0, first: 0, own: 0 }; requests.len()];
        let mut offset = 0;
        for g in &groups.groups {
            let p = g.prefix;
            let prefix = &requests[g.members[0]].0[..p];
            let ids = prefix.iter().map(|&t| t as i64).collect();
            passes.push(Pass { ids, rows: 1, len: p, lens: vec![p], continues: false });
            let first = offset;
            offset += p;
            let rows = Self::push_rests(&mut passes, requests, &g.members, p, overhead, &mut offset);
            for (&i, own) in g.members.iter().zip(rows) {
                at[i] = Rows { prefix: p, first, own };
            }
        }
        Passes { passes, select: response_rows(requests, &at) }
    }

    /// Pushes the rests past `prefix` tokens of `members` (request indices) as passes of like
    /// lengths, continuing the prompt pass before them when `prefix` is not 0 (none for rests
    /// of no token), and returns each member's first token among the packed tokens, counted
    /// from `offset`, which moves past them.
    fn push_rests(
        passes: &mut Vec<Pass>,
        requests: &[(Vec<u32>, Vec<u32>)],
        members: &[usize],
        prefix: usize,
        overhead: usize,
        offset: &mut usize,
    ) -> Vec<usize> {
        let rests: Vec<usize> = members.iter().map(|&i| rest_len(&requests[i], prefix)).collect();
        let mut first_rows = vec![0; members.len()];
        for rows in passes_by_length(&rests, overhead) {
            let n = rows.iter().map(|&k| rests[k]).max().unwrap_or(0);
            let mut ids = Vec::new();
            for &k in &rows {
                ids.extend(rest(&requests[members[k]], prefix).map(|t| t as i64));
                first_rows[k] = *offset;
                *offset += rests[k];
            }
            if n > 0 {
                let lens = rows.iter().map(|&k| rests[k]).collect();
                passes.push(Pass { ids, rows: rows.len(), len: n, lens, continues: prefix > 0 });
            }
        }
        first_rows
    }

    /// How many forward passes run.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.passes.len()
    }

    /// What the passes hold per layer, in token slots: every slot their attention runs,
    /// padding included (the matmuls run the tokens alone), and for each continuing pass a copy
    /// of its prompt's keys and values, a slot per prompt token and row. A training
    /// micro-batch's activations grow with it (the budget of `algo.micro_batch_tokens`). The
    /// CPU's packed attention runs neither the padding nor the copies: there this bounds them.
    pub fn slots(&self) -> usize {
        let mut prompt = 0;
        let mut slots = 0;
        for pass in &self.passes {
            match pass.continues {
                true => slots += pass.rows * prompt,
                false => prompt = pass.len,
            }
            slots += pass.rows * pass.len;
        }
        slots
    }

    /// What the attention reads, on `model`'s device, made once for all the layers: on a CPU
    /// backend every pass's rows as packed sequences, each token's position and what it
    /// continues; elsewhere [`Self::pass_tensors`].
    pub(crate) fn tensors<B: Backend>(&self, model: &CausalLm<B>) -> PlanTensors<B> {
        let Some(on) = packed_attention::backend::<B>() else {
            return PlanTensors::Passes(self.pass_tensors(model));
        };
        let (mut seqs, mut positions) = (Vec::new(), Vec::new());
        // A continuing pass's rows see its prompt pass's tokens: (first token, length).
        let (mut prompt, mut first) = ((0, 0), 0);
        for pass in &self.passes {
            let (prefix, prefix_len) = if pass.continues { prompt } else { (0, 0) };
            if !pass.continues {
                prompt = (first, pass.len);
            }
            for &len in &pass.lens {
                seqs.push(PackedSeq { first, len, prefix, prefix_len });
                positions.extend((0..len).map(|i| prefix_len + i));
                first += len;
            }
        }
        let tables = model.rope_tables(&positions);
        PlanTensors::Packed { tables, seqs: seqs.into(), on, compute: model.compute }
    }

    /// What each pass's attention reads, on `model`'s device, made once for all the layers:
    /// its positions and mask (a continuing pass starts after its prompt pass), and where its
    /// slots are among the packed tokens.
    fn pass_tensors<B: Backend>(&self, model: &CausalLm<B>) -> Vec<PassTensors<B>> {
        let device = model.device();
        let index = |at: Vec<i64>| {
            let n = at.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(at, [n]), &device)
        };
        let (mut prompt, mut first) = (0, 0);
        let total = self.passes.iter().map(|p| p.ids.len()).sum();
        let mut tensors = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            let start = if pass.continues { prompt } else { 0 };
            if !pass.continues {
                prompt = pass.len;
            }
            let (tokens, slots) = (pass.ids.len(), pass.rows * pass.len);
            let gather = (tokens < slots).then(|| {
                // A padding slot reads the pass's first token, never seen (later slots never
                // influence earlier ones), so its gradient is zero: each token takes its own
                // slot's, and the other passes' tokens the zero row (`slots`).
                let mut reads = vec![first as i64; slots];
                let mut back = vec![slots as i64; total];
                // Back from the slots, a padding slot takes the zero row (`tokens`).
                let mut slots_back = vec![tokens as i64; slots];
                for (packed, slot) in pass.real_slots().enumerate() {
                    reads[slot] = (first + packed) as i64;
                    back[first + packed] = slot as i64;
                    slots_back[slot] = packed as i64;
                }
                // Each of its tokens' slot, in packed order, as `back` holds them.
                let token_slots = back[first..first + tokens].to_vec();
                [[index(reads), index(back)], [index(token_slots), index(slots_back)]]
            });
            // Right-padded, from the prompt's end.
            let layout = model.layout_tensors(&Layout { start, ..Layout::dense(pass.rows, pass.len) });
            tensors.push(PassTensors { layout, first, tokens, gather });
            first += tokens;
        }
        tensors
    }

    /// The tokens of every pass, packed without padding in pass order: `[1, tokens]`.
    pub fn ids<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = self.passes.iter().flat_map(|p| p.ids.iter().copied()).collect();
        let n = ids.len();
        Tensor::from_data(TensorData::new(ids, [1, n]), device)
    }

    /// The whole model's inputs for [`Self::layer`]: the embeddings of [`Self::ids`],
    /// `[tokens, hidden]`.
    pub fn embed<B: Backend>(&self, model: &CausalLm<B>, ids: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let x = model.embed(ids);
        let [_, n, d] = x.dims();
        x.reshape([n, d])
    }

    /// `layer` over the packed tokens `x` (`[tokens, hidden]`, [`Self::ids`]' order): the
    /// projections and the MLP over all of them at once, padding left out; the attention on a
    /// CPU backend over every pass's rows at once ([`packed_attention`]), elsewhere pass by
    /// pass, each pass's rows right-padded to its length. There a prompt pass that passes
    /// continue keeps its keys and values for them, each continuing pass a copy fanned out to
    /// its rows (the last takes the kept cache itself).
    pub(crate) fn layer<B: Backend>(
        &self,
        layer: &DecoderLayer<B>,
        tensors: &PlanTensors<B>,
        x: Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        match tensors {
            PlanTensors::Packed { tables, seqs, on, compute } => layer.forward_packed(x, *compute, |attention, qkv| {
                attention.attend_packed(qkv, tables, seqs, (*on, *compute))
            }),
            PlanTensors::Passes(tensors) => self.layer_by_passes(layer, tensors, x),
        }
    }

    /// [`Self::layer`] with the attention pass by pass.
    fn layer_by_passes<B: Backend>(
        &self,
        layer: &DecoderLayer<B>,
        tensors: &[PassTensors<B>],
        x: Tensor<B, 2>,
    ) -> Tensor<B, 2> {
        layer.forward_packed(x, tensors[0].layout.compute, |attention, [q, k, v]| {
            let mut kept: Option<KvCache<B>> = None;
            let mut out = Vec::with_capacity(self.passes.len());
            for (i, (pass, at)) in self.passes.iter().zip(tensors).enumerate() {
                let slots = [&q, &k, &v].map(|t| at.slots_of(t.clone()));
                let layout = &at.layout;
                let y = if pass.continues {
                    let fan_out = vec![0; pass.rows];
                    let mut cache = match self.passes.get(i + 1).is_some_and(|n| n.continues) {
                        true => kept.as_ref().expect("a continuing pass follows its prompt's").copy_rows(&fan_out),
                        false => {
                            let mut cache = kept.take().expect("a continuing pass follows its prompt's");
                            cache.select_rows(&fan_out);
                            cache
                        }
                    };
                    let start = cache.len();
                    attention.attend(slots, [pass.rows, pass.len], layout, Some((&mut cache, 0, start)))
                } else if let Some(widest) = self.continuations(i).map(|n| n.len).max() {
                    let mut cache = KvCache::new(1, pass.len + widest);
                    let y = attention.attend(slots, [pass.rows, pass.len], layout, Some((&mut cache, 0, 0)));
                    cache.advance(pass.len);
                    kept = Some(cache);
                    y
                } else {
                    attention.attend(slots, [pass.rows, pass.len], layout, None)
                };
                out.push(at.tokens_of(y));
            }
            match out.len() {
                1 => out.pop().expect("one pass"),
                _ => Tensor::cat(out, 0),
            }
        })
    }

    /// The passes that continue pass `i` (a prompt pass), in order.
    fn continuations(&self, i: usize) -> impl Iterator<Item = &Pass> {
        self.passes[i + 1..].iter().take_while(|n| n.continues)
    }

    /// The rows of the packed tokens' outputs `[tokens, hidden]` that predict each response
    /// token: `[response tokens, hidden]`.
    pub fn select<B: Backend>(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let n = self.select.len();
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(self.select.clone(), [n]), &x.device());
        x.select(0, rows)
    }

    /// The final hidden states of [`Self::select`]'s rows, the whole model's forward pass run
    /// as planned.
    pub fn response_hidden<B: Backend>(&self, model: &CausalLm<B>) -> Tensor<B, 2> {
        self.hidden_with(model, &self.tensors(model))
    }

    /// [`Self::response_hidden`] with the attention reading `tensors`.
    fn hidden_with<B: Backend>(&self, model: &CausalLm<B>, tensors: &PlanTensors<B>) -> Tensor<B, 2> {
        let mut x = self.embed(model, self.ids(&model.device()));
        for layer in &model.layers {
            x = self.layer(layer, tensors, x);
        }
        // The final norm works per row, so it can come after the selection.
        model.norm.forward(self.select(x), model.compute)
    }
}

impl Pass {
    /// The slots (`row · len + position`) that hold its tokens, in packed order.
    fn real_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.lens.iter().enumerate().flat_map(move |(row, &n)| (row * self.len..).take(n))
    }
}

/// What the attention of a plan's layers reads ([`Passes::tensors`]).
pub(crate) enum PlanTensors<B: Backend> {
    /// On a CPU backend (`on`): the query's and key's RoPE tables of the packed tokens, and
    /// their sequences.
    Packed { tables: [RopeTables<B>; 2], seqs: Arc<[PackedSeq]>, on: CpuBackend, compute: ComputeDtype },
    /// Elsewhere, each pass's.
    Passes(Vec<PassTensors<B>>),
}

/// What a pass's attention reads ([`Passes::pass_tensors`]).
pub struct PassTensors<B: Backend> {
    layout: LayoutTensors<B>,
    /// Its first token among the packed tokens, and how many it has.
    first: usize,
    tokens: usize,
    /// For a padded pass, [`gather_rows`]' `index` and `back` from the packed tokens to its
    /// slots (the packed token each slot reads; the slot of each of its tokens), and from its
    /// slots to its tokens.
    gather: Option<[[Tensor<B, 1, Int>; 2]; 2]>,
}

impl<B: Backend> PassTensors<B> {
    /// The pass's slots `[rows · len, width]` of the packed rows `x` (`[tokens, width]`).
    fn slots_of(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.gather {
            Some([[reads, back], _]) => gather_rows(x, reads.clone(), back.clone()),
            None => {
                let width = x.dims()[1];
                x.slice([self.first..self.first + self.tokens, 0..width])
            }
        }
    }

    /// The outputs of the pass's tokens, packed (`[tokens, width]`), from its slots' `[rows,
    /// len, width]`.
    fn tokens_of(&self, y: Tensor<B, 3>) -> Tensor<B, 2> {
        let [rows, len, width] = y.dims();
        let y = y.reshape([rows * len, width]);
        match &self.gather {
            Some([_, [slots, back]]) => gather_rows(y, slots.clone(), back.clone()),
            None => y,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::dtype::ComputeDtype;
    use crate::generate::score::dense_hidden;
    use crate::model::weights::{small_biased_model, small_random_model, weighted_head_loss};
    use crate::train::optim::GradStore;

    type AD = burn::backend::Autodiff<Cpu>;

    /// Two groups of identical prompts interleaved (5 and 2 tokens; responses of 1 to 6 tokens,
    /// one of them empty), a prompt that extends the first group's and joins it, one that is all
    /// prefix of another's (its first response token is predicted in the prefix pass, the other's
    /// in the rest pass), one that shares a token with the first group, too little to join, and
    /// a second response of the first group's longest length (a pass of like lengths with two
    /// rows that another pass continuing the same prompt follows).
    fn requests() -> Vec<(Vec<u32>, Vec<u32>)> {
        let (a, b) = (vec![3, 9, 4, 12, 7], vec![11, 5]);
        vec![
            (a.clone(), vec![7, 1, 60, 2]),
            (b.clone(), vec![30, 31, 8]),
            (a.clone(), vec![9]),
            (vec![40, 41, 42], vec![6, 6]),
            (a.clone(), vec![50, 51, 52, 53, 54, 55]),
            (b.clone(), vec![]),
            (vec![3, 9, 4, 12, 7, 8], vec![2, 7]),
            (b, vec![1, 2, 3]),
            (vec![40, 41], vec![19, 6, 3]),
            (vec![3, 7], vec![5, 5]),
            (a.clone(), vec![56, 57, 58, 59, 60, 61]),
        ]
    }

    fn host(t: Tensor<AD, 2>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    /// [`requests`] with every prompt made distinct (one more first token each): dense passes.
    fn distinct() -> Vec<(Vec<u32>, Vec<u32>)> {
        let prefixed = |(i, (p, r)): (usize, (Vec<u32>, Vec<u32>))| ([&[80 + i as u32], p.as_slice()].concat(), r);
        requests().into_iter().enumerate().map(prefixed).collect()
    }

    #[test]
    fn each_prefix_run_once_gives_the_dense_hidden_states_and_gradients() {
        let requests = requests();
        let groups = PromptGroups::of(&requests);
        let shape: Vec<(usize, Vec<usize>)> = groups.groups.iter().map(|g| (g.prefix, g.members.clone())).collect();
        assert_eq!(shape, vec![(5, vec![0, 2, 4, 6, 10]), (2, vec![1, 5, 7]), (2, vec![3, 8]), (2, vec![9])]);
        assert!(!PromptGroups::of(&distinct()).repeat());
        // Shared prefixes and dense passes; at this size the default runs each group's rests in
        // one pass, and no overhead splits them by every length.
        let cases = [(requests.clone(), PASS_OVERHEAD_TOKENS, 8), (requests, 0, 10), (distinct(), 0, 7)];
        for (requests, overhead, count) in cases {
            let passes = Passes::with_overhead(&requests, overhead);
            assert_eq!(passes.passes.len(), count, "passes at overhead {overhead}");
            for (tied, lora, biased) in
                [(false, false, false), (true, false, false), (false, true, false), (false, false, true)]
            {
                let mut m = if biased { small_biased_model::<AD>(5) } else { small_random_model::<AD>(tied, 5) };
                if lora {
                    let config = crate::model::lora::LoraConfig { rank: 2, ..Default::default() };
                    m = crate::model::lora::attach(m, &config, 1);
                }
                let dense = dense_hidden(&m, &requests);
                let mut a = GradStore::<Cpu>::default();
                a.accumulate(&m, &weighted_head_loss(&m, dense.clone()).backward());
                assert!(a.names().len() >= if lora { 2 * 7 } else { 3 * 11 }, "{} parameters", a.names().len());
                // The CPU's packed attention, and the passes one by one as the GPUs run them.
                let packed = passes.tensors(&m);
                assert!(matches!(packed, PlanTensors::Packed { .. }), "the CPU backend runs the packed op");
                let by_passes = PlanTensors::Passes(passes.pass_tensors(&m));
                for (tensors, how) in [(packed, "packed"), (by_passes, "by passes")] {
                    let planned = passes.hidden_with(&m, &tensors);
                    assert_eq!(dense.dims(), planned.dims());
                    let (x, y) = (host(dense.clone()), host(planned.clone()));
                    let scale = x.iter().map(|v| v.abs()).fold(0.0, f32::max);
                    let d = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max) / scale;
                    let case = format!("{count} passes {how}, tied {tied}, lora {lora}, biased {biased}");
                    assert!(d <= 1e-5, "{case}: hidden states differ by {d} (relative)");
                    let mut b = GradStore::<Cpu>::default();
                    b.accumulate(&m, &weighted_head_loss(&m, planned).backward());
                    let d = a.max_relative_diff(&b);
                    assert!(d <= 1e-5, "{case}: gradients differ by {d} (relative)");
                }
            }
        }
    }

    /// The passes' tokens are packed without padding, and each weight multiplies all of them
    /// at once: a bf16 forward pass rounds each weight of a layer once, however many passes run.
    #[test]
    fn every_weight_multiplies_all_the_passes_tokens_at_once() {
        use crate::backend::bf16_trained::WEIGHTS_ROUNDED;
        let requests = requests();
        // At this size each group's rests run in one pass, padded to the longest.
        let passes = Passes::of(&requests);
        assert_eq!(passes.count(), 8);
        let tokens: usize = passes.passes.iter().map(|p| p.ids.len()).sum();
        assert!(tokens < passes.passes.iter().map(|p| p.rows * p.len).sum(), "some pass is padded");
        assert_eq!(passes.ids::<Cpu>(&Default::default()).dims(), [1, tokens]);
        let m = crate::model::precision::set_compute(small_random_model::<AD>(false, 5), ComputeDtype::Bf16);
        WEIGHTS_ROUNDED.with(|n| n.set(0));
        let x = passes.embed(&m, passes.ids(&m.device()));
        assert_eq!(x.dims(), [tokens, m.config.hidden_size]);
        let tensors = passes.tensors(&m);
        let _ = passes.layer(&m.layers[0], &tensors, x);
        // q, k, v, o, gate, up and down.
        assert_eq!(WEIGHTS_ROUNDED.with(|n| n.get()), 7);
    }

    /// Every way to cut rows of random lengths into passes (set partitions, up to 7 rows) costs
    /// at least what [`passes_by_length`] chose, which covers every row once.
    #[test]
    fn passes_by_length_runs_the_fewest_tokens() {
        use rand::{Rng, SeedableRng};
        // The cost of a cut: each pass's rows at its longest, plus `overhead` a pass that runs.
        let cost = |cut: &[Vec<usize>], lens: &[usize], overhead: usize| -> usize {
            cut.iter()
                .map(|rows| match rows.iter().map(|&i| lens[i]).max().unwrap_or(0) {
                    0 => 0,
                    n => rows.len() * n + overhead,
                })
                .sum()
        };
        // Every set partition of 0..n (restricted growth strings).
        fn partitions(n: usize) -> Vec<Vec<Vec<usize>>> {
            let mut out = Vec::new();
            let mut label = vec![0usize; n];
            loop {
                let parts = label.iter().max().map_or(0, |&m| m + 1);
                out.push((0..parts).map(|p| (0..n).filter(|&i| label[i] == p).collect()).collect());
                // The next string: raise the last position that can be raised, reset those after it.
                let Some(k) = (1..n).rev().find(|&k| label[k] <= *label[..k].iter().max().unwrap()) else {
                    return out;
                };
                label[k] += 1;
                label[k + 1..].iter_mut().for_each(|l| *l = 0);
            }
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for case in 0..300 {
            let n = 1 + case % 7;
            let lens: Vec<usize> =
                (0..n).map(|_| if rng.random_bool(0.1) { 0 } else { rng.random_range(1..40) }).collect();
            let overhead = [0, 1, 5, 20, 1000][case % 5];
            let cut = passes_by_length(&lens, overhead);
            let mut covered: Vec<usize> = cut.concat();
            covered.sort_unstable();
            assert_eq!(covered, (0..n).collect::<Vec<_>>(), "{lens:?}: every row once");
            let least = partitions(n).iter().map(|p| cost(p, &lens, overhead)).min().unwrap();
            assert_eq!(cost(&cut, &lens, overhead), least, "{lens:?} at overhead {overhead}: {cut:?}");
        }
        // One pass when splitting saves less than a pass; passes of like lengths when it saves more.
        assert_eq!(passes_by_length(&[500, 480, 100, 90], 256), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(passes_by_length(&[500, 480, 400, 450], 256), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn prefixes_run_once_only_when_one_is_shared() {
        let requests = requests();
        assert!(PromptGroups::of(&requests).repeat());
        // Prompts that differ from their first token share nothing.
        let distinct: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(i, (p, r))| ([&[100 + i as u32], p.as_slice()].concat(), r.clone()))
            .collect();
        assert!(!PromptGroups::of(&distinct).repeat());
        // Two copies of a prompt stay a group of their own rather than shrink to the 3 tokens a
        // third prompt shares with them: the three rows would run 3 tokens each past a 3-token
        // prefix (12) instead of the copies' 6 and the third's 4 (10).
        let copies =
            [(vec![1, 2, 3, 4, 5, 6], vec![7]), (vec![1, 2, 3, 4, 5, 6], vec![8]), (vec![1, 2, 3, 9], vec![7])];
        let shape = |requests: &[(Vec<u32>, Vec<u32>)]| -> Vec<(usize, Vec<usize>)> {
            PromptGroups::of(requests).groups.into_iter().map(|g| (g.prefix, g.members)).collect()
        };
        assert_eq!(shape(&copies), vec![(6, vec![0, 1]), (4, vec![2])]);
        // Padding counts: a 30-token prompt that shares 9 tokens with two 10-token copies would
        // pad all three rows to its 21-token rest (9 + 3 × 21 = 72 tokens instead of 10 + 30).
        let ten: Vec<u32> = (1..=10).collect();
        let long: Vec<u32> = (1..=9).chain(100..121).collect();
        let padded = [(ten.clone(), vec![7]), (ten, vec![8]), (long, vec![7])];
        assert_eq!(shape(&padded), vec![(10, vec![0, 1]), (30, vec![2])]);
        // Two prompts that share only their first token (a chat template's) would save 1 of 100.
        let apart = [((0..100).collect(), vec![7]), ([0].into_iter().chain(200..299).collect(), vec![7])];
        assert_eq!(shape(&apart), vec![(100, vec![0]), (100, vec![1])]);
    }
}
