//! How a mini-batch is cut into micro-batches, the forward/backward passes whose gradients
//! add up to one update (and how the scoring stage batches a policy's samples): a number of
//! sequences each (`algo.micro_batch_sequences`), or as many as a token budget holds
//! (`algo.micro_batch_tokens`, verl's dynamic batch size). A micro-batch's activations grow
//! with what its passes run, not with its rows: under a budget, short responses run many to a
//! micro-batch and long ones few, and the memory it takes is the budget's whatever the lengths.

use crate::config::AlgoConfig;
use crate::generate::shared_prompt;

/// What bounds a micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MicroBatching {
    /// At most this many sequences.
    Sequences(usize),
    /// At most this many token slots ([`shared_prompt::slots`]: the slots its passes' attention
    /// runs, padding included, and the prompt slots fanned out to its responses); a sequence above
    /// the budget runs alone.
    Tokens(usize),
}

impl MicroBatching {
    /// The budget when `algo.micro_batch_tokens` sets one, else micro-batches of sequences.
    pub fn of(algo: &AlgoConfig) -> Self {
        match algo.micro_batch_tokens {
            0 => MicroBatching::Sequences(algo.micro_batch_sequences.max(1)),
            budget => MicroBatching::Tokens(budget),
        }
    }

    /// `positions` cut into micro-batches, in order (`sequence(j)`: position j's prompt and
    /// response ids). Where more than one micro-batch may cut a run of positions with one
    /// prompt, the run is ordered longest response first, so that a micro-batch holds
    /// responses of like lengths (its passes pad less) and still the prompts it held.
    pub fn cut<'a>(&self, positions: &[usize], sequence: impl Fn(usize) -> (&'a [u32], &'a [u32])) -> Vec<Vec<usize>> {
        match *self {
            MicroBatching::Sequences(n) => {
                let n = n.max(1);
                let order = longest_first_within_prompts(positions, n < positions.len(), &sequence);
                order.chunks(n).map(<[usize]>::to_vec).collect()
            }
            MicroBatching::Tokens(budget) => {
                let order = longest_first_within_prompts(positions, true, &sequence);
                let mut cuts = Vec::new();
                let (mut micro, mut requests) = (Vec::new(), Vec::new());
                for j in order {
                    let (prompt, response) = sequence(j);
                    requests.push((prompt.to_vec(), response.to_vec()));
                    if !micro.is_empty() && shared_prompt::slots(&requests) > budget {
                        cuts.push(std::mem::take(&mut micro));
                        requests.drain(..requests.len() - 1);
                    }
                    micro.push(j);
                }
                if !micro.is_empty() {
                    cuts.push(micro);
                }
                cuts
            }
        }
    }
}

/// `positions` with each run of positions that share a prompt ordered longest response first
/// when `reorder` (`sequence(j)`: position j's prompt and response): only a run's order changes,
/// so every position keeps its prompt (the memory plan's bound on a micro-batch's prompts
/// counts runs).
fn longest_first_within_prompts<'a>(
    positions: &[usize],
    reorder: bool,
    sequence: impl Fn(usize) -> (&'a [u32], &'a [u32]),
) -> Vec<usize> {
    let mut order = positions.to_vec();
    if reorder {
        for run in order.chunk_by_mut(|&a, &b| sequence(a).0 == sequence(b).0) {
            run.sort_by_key(|&j| std::cmp::Reverse(sequence(j).1.len()));
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Position j: a prompt and a response of the given length.
    fn sequences() -> Vec<(Vec<u32>, Vec<u32>)> {
        let (a, b) = (vec![1, 2], vec![3]);
        [(&a, 3), (&a, 9), (&a, 1), (&a, 9), (&b, 2), (&b, 5), (&a, 4), (&a, 7)]
            .into_iter()
            .map(|(p, n)| (p.clone(), (0..n as u32).map(|t| 100 + t).collect()))
            .collect()
    }

    /// `algo.micro_batch_tokens` decides, and 0 leaves it to `algo.micro_batch_sequences`.
    #[test]
    fn a_budget_set_cuts_by_tokens() {
        let mut algo = AlgoConfig { micro_batch_sequences: 3, ..Default::default() };
        assert_eq!(MicroBatching::of(&algo), MicroBatching::Sequences(3));
        algo.micro_batch_tokens = 4096;
        assert_eq!(MicroBatching::of(&algo), MicroBatching::Tokens(4096));
    }

    /// Runs of one prompt are ordered longest response first, each in its place; nothing moves
    /// when one micro-batch takes the whole mini-batch.
    #[test]
    fn micro_batches_take_a_prompt_s_responses_longest_first() {
        let all = sequences();
        let sequence = |j: usize| (all[j].0.as_slice(), all[j].1.as_slice());
        let mb: Vec<usize> = (0..all.len()).collect();
        let cut = MicroBatching::Sequences(2).cut(&mb, sequence);
        assert_eq!(cut, [[1, 3], [0, 2], [5, 4], [7, 6]]);
        // Every position keeps its prompt, so a micro-batch holds the prompts it held.
        let prompts = |order: &[usize]| order.iter().map(|&j| &all[j].0).collect::<Vec<_>>();
        assert_eq!(prompts(&cut.concat()), prompts(&mb));
        assert_eq!(MicroBatching::Sequences(8).cut(&mb, sequence), [mb.as_slice()]);
        // Positions in another order (an interleaved mini-batch) keep theirs between runs.
        assert_eq!(MicroBatching::Sequences(1).cut(&[6, 4, 7, 5], sequence).concat(), [6, 4, 7, 5]);
        assert_eq!(MicroBatching::Sequences(1).cut(&[6, 7, 4, 5], sequence).concat(), [7, 6, 5, 4]);
    }

    /// A token budget takes as many sequences, in the same order, as its slots hold: every
    /// micro-batch within the budget unless it is one sequence, and none that could have taken
    /// the next one.
    #[test]
    fn a_token_budget_takes_what_its_slots_hold() {
        let all = sequences();
        let sequence = |j: usize| (all[j].0.as_slice(), all[j].1.as_slice());
        let mb: Vec<usize> = (0..all.len()).collect();
        let slots = |micro: &[usize]| shared_prompt::slots(&micro.iter().map(|&j| all[j].clone()).collect::<Vec<_>>());
        for budget in [1, 12, 20, 30, 45, 1000] {
            let cut = MicroBatching::Tokens(budget).cut(&mb, sequence);
            assert_eq!(cut.concat(), MicroBatching::Sequences(1).cut(&mb, sequence).concat(), "budget {budget}");
            for (k, micro) in cut.iter().enumerate() {
                assert!(micro.len() == 1 || slots(micro) <= budget, "budget {budget}: {micro:?}");
                if let Some(next) = cut.get(k + 1) {
                    assert!(slots(&[micro.as_slice(), &next[..1]].concat()) > budget, "budget {budget}: {cut:?}");
                }
            }
            match budget {
                1 => assert_eq!(cut.len(), mb.len()),
                1000 => assert_eq!(cut, [[1, 3, 0, 2, 5, 4, 7, 6]]),
                _ => assert!((2..mb.len()).contains(&cut.len()), "budget {budget}: {cut:?}"),
            }
        }
        // The first six share prompt [1, 2]: run once (2 slots), each response's rest over it
        // (its length less the last token, plus 2 fanned-out prompt slots a row).
        assert_eq!(slots(&[1, 3]), 2 + 2 * (8 + 2));
    }
}
