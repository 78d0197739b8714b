//! Synthetic integer-arithmetic word problems with worked solutions: the embedded default's
//! task, small enough for models of a few hundred thousand parameters to learn on a CPU.
//!
//! A problem starts from a quantity and applies 1..=`max_ops` operations (gain, loss,
//! multiply), each one sentence; the solution writes one equation per operation and ends in
//! `\boxed{answer}`, so the project's grader scores it like any math benchmark. Difficulty is
//! the number of operations and the size of the operands. The train and held-out splits come
//! from different seeds, and held-out questions that also occur in train are dropped.

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Generator settings (`[task.arith]` in a training config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithConfig {
    /// Training problems.
    pub train_size: usize,
    /// Held-out problems (validation and the before/after accuracy).
    pub heldout_size: usize,
    /// Operations per problem: 1..=max_ops, uniformly.
    pub max_ops: usize,
    /// Largest starting quantity and largest amount gained or lost.
    pub max_operand: u32,
    /// Largest multiplier (0 or 1: no multiplications).
    pub max_multiplier: u32,
    /// The train split's seed; the held-out split uses `seed + 1_000_003`.
    pub seed: u64,
}

impl Default for ArithConfig {
    fn default() -> Self {
        ArithConfig { train_size: 20_000, heldout_size: 200, max_ops: 2, max_operand: 20, max_multiplier: 3, seed: 0 }
    }
}

impl ArithConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, why: &str| Err(Error::config("task.arith", format!("{key} {why}")));
        if self.train_size == 0 {
            return bad("train_size", "must be at least 1");
        }
        if self.max_ops == 0 || self.max_ops > 6 {
            return bad("max_ops", "must be between 1 and 6");
        }
        if self.max_operand < 2 || self.max_operand > 10_000 {
            return bad("max_operand", "must be between 2 and 10000");
        }
        Ok(())
    }
}

/// One problem.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArithProblem {
    pub id: String,
    pub question: String,
    /// The worked solution, ending in `\boxed{answer}`.
    pub solution: String,
    pub answer: String,
}

const NAMES: &[&str] = &["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jack", "Kim", "Leo"];
const ITEMS: &[&str] =
    &["apples", "books", "coins", "marbles", "stamps", "pencils", "cards", "shells", "eggs", "stickers"];

/// One random problem.
fn problem(rng: &mut ChaCha8Rng, cfg: &ArithConfig, id: String) -> ArithProblem {
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let item = ITEMS[rng.random_range(0..ITEMS.len())];
    let mut value: u64 = rng.random_range(1..=cfg.max_operand as u64);
    let ops = rng.random_range(1..=cfg.max_ops);
    let mut sentences = vec![format!("{name} has {value} {item}.")];
    let mut steps = Vec::new();
    for _ in 0..ops {
        let kind = rng.random_range(0..if cfg.max_multiplier >= 2 { 3 } else { 2 });
        let (sentence, step, next) = match kind {
            // A loss only when there is something to lose.
            1 if value >= 2 => {
                let n = rng.random_range(1..=value.min(cfg.max_operand as u64));
                (format!("{name} gives away {n}."), format!("{value} - {n} = {}.", value - n), value - n)
            }
            2 => {
                let n = rng.random_range(2..=cfg.max_multiplier as u64);
                let word = match n {
                    2 => "doubles".to_string(),
                    3 => "triples".to_string(),
                    _ => format!("multiplies by {n}"),
                };
                (format!("{name} {word} the {item}."), format!("{value} * {n} = {}.", value * n), value * n)
            }
            _ => {
                let n = rng.random_range(1..=cfg.max_operand as u64);
                (format!("{name} gets {n} more."), format!("{value} + {n} = {}.", value + n), value + n)
            }
        };
        sentences.push(sentence);
        steps.push(step);
        value = next;
    }
    sentences.push(format!("How many {item} does {name} have?"));
    ArithProblem {
        id,
        question: sentences.join(" "),
        solution: format!("{} The answer is \\boxed{{{value}}}.", steps.join(" ")),
        answer: value.to_string(),
    }
}

/// The train and held-out splits.
pub fn generate(cfg: &ArithConfig) -> Result<(Vec<ArithProblem>, Vec<ArithProblem>)> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let train: Vec<ArithProblem> =
        (0..cfg.train_size).map(|i| problem(&mut rng, cfg, format!("arith-train-{i}"))).collect();
    let seen: HashSet<&str> = train.iter().map(|p| p.question.as_str()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(1_000_003));
    let mut heldout = Vec::with_capacity(cfg.heldout_size);
    // Small problem spaces can run out of unseen questions; give up after a generous budget.
    let mut tries = 0;
    while heldout.len() < cfg.heldout_size && tries < cfg.heldout_size * 100 {
        tries += 1;
        let p = problem(&mut rng, cfg, format!("arith-heldout-{}", heldout.len()));
        if !seen.contains(p.question.as_str()) {
            heldout.push(p);
        }
    }
    if heldout.len() < cfg.heldout_size {
        return Err(Error::config(
            "task.arith",
            format!(
                "only {} of {} held-out problems differ from the training problems; raise max_operand or max_ops, or lower train_size",
                heldout.len(),
                cfg.heldout_size
            ),
        ));
    }
    Ok((train, heldout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solutions_compute_the_answer_and_splits_are_disjoint() {
        let cfg = ArithConfig { train_size: 2000, heldout_size: 100, ..Default::default() };
        let (train, heldout) = generate(&cfg).unwrap();
        assert_eq!((train.len(), heldout.len()), (2000, 100));
        let seen: HashSet<_> = train.iter().map(|p| &p.question).collect();
        assert!(heldout.iter().all(|p| !seen.contains(&p.question)));
        for p in train.iter().chain(&heldout) {
            // Replay the equations: each starts from the previous result and is right.
            let mut last: Option<u64> = None;
            for eq in p.solution.split(". ").filter(|s| s.contains(" = ")) {
                let (lhs, rhs) = eq.split_once(" = ").unwrap();
                let parts: Vec<&str> = lhs.split(' ').collect();
                let (a, op, b): (u64, &str, u64) = (parts[0].parse().unwrap(), parts[1], parts[2].parse().unwrap());
                if let Some(l) = last {
                    assert_eq!(a, l, "{}", p.solution);
                }
                let r = match op {
                    "+" => a + b,
                    "-" => a - b,
                    "*" => a * b,
                    _ => panic!("{op}"),
                };
                assert_eq!(rhs.trim_end_matches('.').parse::<u64>().unwrap(), r, "{}", p.solution);
                last = Some(r);
            }
            assert_eq!(last.unwrap().to_string(), p.answer);
            assert!(p.solution.ends_with(&format!("\\boxed{{{}}}.", p.answer)));
        }
        // The same seed gives the same problems.
        assert_eq!(generate(&cfg).unwrap().0[17], train[17]);
    }

    #[test]
    fn too_small_a_problem_space_is_a_clear_error() {
        let cfg =
            ArithConfig { train_size: 5000, heldout_size: 200, max_ops: 1, max_operand: 2, max_multiplier: 0, seed: 0 };
        let e = generate(&cfg).unwrap_err().to_string();
        assert!(e.contains("held-out") && e.contains("max_operand"), "{e}");
    }
}
