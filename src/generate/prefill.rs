//! The prefill: each distinct prompt once, and a beginning that prompts share once.
//!
//! Identical prompts (a team's K episodes of one task at their first turn) run as one row,
//! fanned out afterwards as a prompt is to its samples. Distinct prompts that begin alike (the
//! same episodes' later turns) share that beginning as [`PromptGroups`] groups them for
//! scoring: a *prefix pass* runs each group's beginning once, one row per group, its keys and
//! values fan out to the group's prompts, and a *rest pass* runs the rest of every prompt over
//! them. Each row's cache then holds its beginning, a [`Pad`] and the rest of its prompt, all
//! rows ending at the same slot, so decoding goes on as after a left-padded prefill. Without a
//! shared beginning (or where padding would eat the saving) there is no prefix pass and the
//! rest pass is the plain left-padded batch.

use std::collections::HashMap;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};

use super::forward_last;
use super::shared_prompt::PromptGroups;
use crate::error::Result;
use crate::model::{CausalLm, KvCache, Layout, Pad};

/// The prefilled cache and what decoding needs from it.
pub(super) struct Prefilled<B: Backend> {
    pub cache: KvCache<B>,
    /// Each cache row's next-token logits, `[rows, vocab]` row-major.
    pub logits: Vec<f32>,
    /// Each cache row's pad.
    pub pads: Vec<Pad>,
    /// The cache row of each prompt.
    pub row_of: Vec<usize>,
    /// Slots the passes ran, padding included.
    pub slots: usize,
}

/// Distinct prompts (indices) whose first `kept` tokens run once, in a prefix pass of their
/// own; `kept` is 0 for the prompts that share nothing, which run as the plain batch.
#[derive(Debug, PartialEq)]
struct Unit {
    kept: usize,
    members: Vec<usize>,
}

/// Runs `prompts` (each at least one token) into a cache with room for up to
/// [`super::FIRST_NEW_SLOTS`] more slots, which grows to at most `max_new` more than the
/// longest prompt; a rest pass runs at most `token_budget` tokens, or one prompt.
pub(super) fn prefill<B: Backend>(
    model: &CausalLm<B>,
    prompts: &[Vec<u32>],
    token_budget: usize,
    max_new: usize,
) -> Result<Prefilled<B>> {
    let mut index: HashMap<&[u32], usize> = HashMap::new();
    let mut distinct: Vec<&[u32]> = Vec::new();
    let distinct_of: Vec<usize> = prompts
        .iter()
        .map(|p| {
            let next = distinct.len();
            let d = *index.entry(p.as_slice()).or_insert(next);
            if d == next {
                distinct.push(p);
            }
            d
        })
        .collect();

    let layers = model.config.num_hidden_layers;
    // Every row ends where the longest prompt does (shorter parts are widened below).
    let limit = distinct.iter().map(|p| p.len()).max().unwrap_or(0) + max_new;
    let reserve_new = max_new.min(super::FIRST_NEW_SLOTS);
    let new_cache = |reserve| KvCache::new(layers, reserve).with_limit(limit).for_sampling();
    let mut parts: Vec<(KvCache<B>, usize, usize)> = Vec::new();
    let (mut logits, mut pads, mut slots) = (Vec::new(), Vec::new(), 0);
    let mut order = vec![0; distinct.len()];
    for unit in plan(&distinct) {
        let width = unit.members.iter().map(|&d| distinct[d].len() - unit.kept).max().unwrap_or(0);
        let reserve = unit.kept + width + reserve_new;
        let prefix = (unit.kept > 0).then(|| {
            let mut cache = new_cache(reserve);
            let ids = distinct[unit.members[0]][..unit.kept].iter().map(|&t| t as i64).collect();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, unit.kept]), &model.device());
            model.forward_hidden(ids, &model.layout_tensors(&Layout::dense(1, unit.kept)), Some(&mut cache));
            slots += unit.kept;
            cache
        });
        for members in unit.members.chunks((token_budget / width.max(1)).max(1)) {
            let mut cache = match &prefix {
                Some(prefix) => prefix.copy_rows(&vec![0; members.len()]),
                None => new_cache(reserve),
            };
            let mut ids = vec![0i64; members.len() * width];
            for (r, &d) in members.iter().enumerate() {
                let rest = &distinct[d][unit.kept..];
                let first = r * width + width - rest.len();
                ids[first..(r + 1) * width].iter_mut().zip(rest).for_each(|(id, &t)| *id = t as i64);
                pads.push(Pad { at: unit.kept, len: width - rest.len() });
                order[d] = pads.len() - 1;
            }
            let layout = Layout { pads: pads[pads.len() - members.len()..].to_vec(), start: unit.kept, len: width };
            logits.extend(forward_last(model, ids, layout, &mut cache)?);
            slots += members.len() * width;
            parts.push((cache, unit.kept, members.len()));
        }
    }
    // Every row ends at the same slot: a shorter part gets empty slots where its pads begin.
    let longest = parts.iter().map(|(c, ..)| c.len()).max().unwrap_or(0);
    let mut row = 0;
    let mut caches = Vec::with_capacity(parts.len());
    for (mut cache, at, rows) in parts {
        let short = longest - cache.len();
        pads[row..row + rows].iter_mut().for_each(|p| p.len += short);
        cache.widen(at, short);
        caches.push(cache);
        row += rows;
    }
    let row_of = distinct_of.iter().map(|&d| order[d]).collect();
    Ok(Prefilled { cache: KvCache::concat(caches), logits, pads, row_of, slots })
}

/// Each group of distinct prompts that begin alike ([`PromptGroups`]) runs its beginning once,
/// up to its shortest prompt but one token (the rest pass predicts every row's first new
/// token); the prompts that share nothing run together as the plain left-padded batch, last.
fn plan(distinct: &[&[u32]]) -> Vec<Unit> {
    let requests: Vec<(Vec<u32>, Vec<u32>)> = distinct.iter().map(|p| (p.to_vec(), Vec::new())).collect();
    let mut units = Vec::new();
    let mut plain = Vec::new();
    for (prefix, members) in PromptGroups::of(&requests).iter() {
        match members {
            [one] => plain.push(*one),
            _ => {
                let shortest = members.iter().map(|&d| distinct[d].len()).min().unwrap_or(1);
                units.push(Unit { kept: prefix.min(shortest - 1), members: members.to_vec() });
            }
        }
    }
    if !plain.is_empty() {
        plain.sort_unstable();
        units.push(Unit { kept: 0, members: plain });
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_beginning_runs_once_and_the_rest_as_the_plain_batch() {
        let base: Vec<u32> = (1..=20).collect();
        let turn = |tail: &[u32]| [base.as_slice(), tail].concat();
        // Three later turns of one task between two unrelated prompts: the 20 shared tokens run
        // once, all but the one the shortest prompt keeps for the rest pass.
        let prompts = [vec![7, 8], turn(&[30, 31]), turn(&[]), vec![9], turn(&[40])];
        let distinct: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let unit = |kept, members: &[usize]| Unit { kept, members: members.to_vec() };
        assert_eq!(plan(&distinct), vec![unit(19, &[1, 2, 4]), unit(0, &[0, 3])]);
        // Unrelated prompts: the plain batch alone.
        assert_eq!(plan(&distinct[..1]), vec![unit(0, &[0])]);
    }
}
