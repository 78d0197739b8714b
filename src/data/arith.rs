//! Synthetic integer-arithmetic word problems with worked solutions: the embedded default's
//! task, small enough for models of a few hundred thousand parameters to learn on a CPU.
//!
//! A problem starts from a quantity and applies 1..=`max_ops` operations (gain, loss,
//! multiply), each one sentence; the solution writes one equation per operation and ends in
//! `\boxed{answer}`, so the project's grader scores it like any math benchmark. Difficulty is
//! the number of operations and the size of the operands. The train and held-out splits come
//! from different seeds, and held-out questions that also occur in train are dropped.
//! [`worked_solution`] can also write a solution with a [`Habit`]'s slips, for pre-training
//! corpora that mix right and wrong solutions.

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
        ArithConfig { train_size: 20_000, heldout_size: 200, max_ops: 2, max_operand: 10, max_multiplier: 3, seed: 0 }
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
        // Generated up front: sizes a machine can hold, and numbers that stay far from overflow.
        if self.train_size > 10_000_000 || self.heldout_size > 10_000_000 {
            return bad("train_size and heldout_size", "must be at most 10000000");
        }
        if self.max_multiplier > 100 {
            return bad("max_multiplier", "must be at most 100");
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
    /// The starting quantity and the operations, so the solution can be rewritten (see [`Habit`]).
    pub start: u64,
    pub ops: Vec<Op>,
}

/// One operation of a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Gain(u64),
    Loss(u64),
    Times(u64),
}

/// A habitual mistake in a worked solution: the kind of slip a corpus of human-written
/// solutions is full of. A tiny agent's pre-training corpus writes a fraction of its solutions
/// with its family's habit (see `models/tiny/`), so the pre-trained policy knows the right
/// method but does not reliably choose it: the gap between pass@k and pass@1 that RL with a
/// verifiable reward closes, and that an agent without the habit can demonstrate to one with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Habit {
    /// "gives away n" is added instead of subtracted.
    LossAsGain,
    /// "doubles"/"triples" adds 2/3 instead of multiplying.
    TimesAsPlus,
}

impl Habit {
    fn applies_to(self, op: Op) -> bool {
        matches!((self, op), (Habit::LossAsGain, Op::Loss(_)) | (Habit::TimesAsPlus, Op::Times(_)))
    }
}

/// The worked solution of `start` followed by `ops` (with `habit`'s slip at every operation it
/// applies to) and the answer it arrives at. Signed: after a slip a later loss can exceed what
/// is left, and the solution then goes below zero as its author would write it.
pub fn worked_solution(start: u64, ops: &[Op], habit: Option<Habit>) -> (String, i64) {
    let mut value = start as i64;
    let mut steps = Vec::with_capacity(ops.len());
    for &op in ops {
        let slip = habit.is_some_and(|h| h.applies_to(op));
        let (sign, n) = match op {
            Op::Gain(n) => ('+', n as i64),
            Op::Loss(n) => (if slip { '+' } else { '-' }, n as i64),
            Op::Times(n) => (if slip { '+' } else { '*' }, n as i64),
        };
        let next = match sign {
            '+' => value + n,
            '-' => value - n,
            _ => value * n,
        };
        steps.push(format!("{value} {sign} {n} = {next}."));
        value = next;
    }
    (format!("{} The answer is \\boxed{{{value}}}.", steps.join(" ")), value)
}

const NAMES: &[&str] = &["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jack", "Kim", "Leo"];
const ITEMS: &[&str] =
    &["apples", "books", "coins", "marbles", "stamps", "pencils", "cards", "shells", "eggs", "stickers"];

/// One random problem.
fn problem(rng: &mut ChaCha8Rng, cfg: &ArithConfig, id: String) -> ArithProblem {
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let item = ITEMS[rng.random_range(0..ITEMS.len())];
    let start: u64 = rng.random_range(1..=cfg.max_operand as u64);
    let n_ops = rng.random_range(1..=cfg.max_ops);
    let mut sentences = vec![format!("{name} has {start} {item}.")];
    let mut ops = Vec::with_capacity(n_ops);
    let mut value = start;
    for _ in 0..n_ops {
        let kind = rng.random_range(0..if cfg.max_multiplier >= 2 { 3 } else { 2 });
        let op = match kind {
            // A loss only when there is something to lose.
            1 if value >= 2 => Op::Loss(rng.random_range(1..=value.min(cfg.max_operand as u64))),
            2 => Op::Times(rng.random_range(2..=cfg.max_multiplier as u64)),
            _ => Op::Gain(rng.random_range(1..=cfg.max_operand as u64)),
        };
        sentences.push(match op {
            Op::Gain(n) => format!("{name} gets {n} more."),
            Op::Loss(n) => format!("{name} gives away {n}."),
            Op::Times(2) => format!("{name} doubles the {item}."),
            Op::Times(3) => format!("{name} triples the {item}."),
            Op::Times(n) => format!("{name} multiplies the {item} by {n}."),
        });
        value = match op {
            Op::Gain(n) => value + n,
            Op::Loss(n) => value - n,
            Op::Times(n) => value * n,
        };
        ops.push(op);
    }
    sentences.push(format!("How many {item} does {name} have?"));
    let (solution, answer) = worked_solution(start, &ops, None);
    ArithProblem { id, question: sentences.join(" "), solution, answer: answer.to_string(), start, ops }
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
    fn a_habit_slips_on_its_own_operations_and_carries_the_slip_forward() {
        let ops = [Op::Loss(3), Op::Times(2), Op::Gain(4)];
        assert_eq!(
            worked_solution(10, &ops, None).0,
            "10 - 3 = 7. 7 * 2 = 14. 14 + 4 = 18. The answer is \\boxed{18}."
        );
        let (s, v) = worked_solution(10, &ops, Some(Habit::LossAsGain));
        assert_eq!((s.as_str(), v), ("10 + 3 = 13. 13 * 2 = 26. 26 + 4 = 30. The answer is \\boxed{30}.", 30));
        let (s, v) = worked_solution(10, &ops, Some(Habit::TimesAsPlus));
        assert_eq!((s.as_str(), v), ("10 - 3 = 7. 7 + 2 = 9. 9 + 4 = 13. The answer is \\boxed{13}.", 13));
        // A slip can leave less than a later loss takes: the solution goes negative, never wraps.
        let (s, v) = worked_solution(2, &[Op::Times(3), Op::Loss(6)], Some(Habit::TimesAsPlus));
        assert_eq!((s.as_str(), v), ("2 + 3 = 5. 5 - 6 = -1. The answer is \\boxed{-1}.", -1));
        // Problems keep their operations, and the habit-free solution is the problem's.
        let (train, _) = generate(&ArithConfig { train_size: 50, heldout_size: 5, ..Default::default() }).unwrap();
        for p in &train {
            assert_eq!(worked_solution(p.start, &p.ops, None), (p.solution.clone(), p.answer.parse().unwrap()));
        }
    }

    #[test]
    fn too_small_a_problem_space_is_a_clear_error() {
        let cfg =
            ArithConfig { train_size: 5000, heldout_size: 200, max_ops: 1, max_operand: 2, max_multiplier: 0, seed: 0 };
        let e = generate(&cfg).unwrap_err().to_string();
        assert!(e.contains("held-out") && e.contains("max_operand"), "{e}");
    }
}
