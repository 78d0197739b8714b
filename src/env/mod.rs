//! Generated, checked planning environments for turn-wise multi-agent training (AT-GRPO,
//! docs/algorithms.md §5): Plan-Path, Sokoban and Sudoku, after PettingLLMs' planning suite but
//! generated here from a seed, each instance checked solvable (and a Sudoku unique), and
//! success true only when the task is solved.
//!
//! An [`Instance`] is one task: it renders as text for a prompt, applies an answer read from a
//! model's text ([`Instance::apply`]: the move list or the Sudoku grid, a format penalty when it
//! cannot be read) and knows a solution (BFS or the solver). `clone` it to simulate an answer on
//! a copy, as AT-GRPO does for every branch.
//!
//! Train and held-out instances never meet: an instance belongs to the held-out split only when
//! a hash of its content says so, so two seeds that happen to generate the same small puzzle
//! still land in the same split (the splits' generator seeds also start apart, at 0 and 2^40).

pub mod action;
pub mod plan_path;
pub mod sandbox;
pub mod sokoban;
pub mod sudoku;
pub mod task;
pub mod tool;

use std::fmt;
use std::hash::{Hash, Hasher};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::stable_hash::StableHasher;
use action::{Move, format_moves, parse_int_rows, parse_moves};
use plan_path::PlanPath;
use sokoban::Sokoban;
use sudoku::{Sudoku, SudokuAction};

/// The reward of an answer that cannot be read (PettingLLMs: −1 for a non-list action).
pub const FORMAT_PENALTY: f64 = -1.0;

/// Which environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnvKind {
    PlanPath,
    Sokoban,
    Sudoku,
}

impl EnvKind {
    pub const ALL: [EnvKind; 3] = [EnvKind::PlanPath, EnvKind::Sokoban, EnvKind::Sudoku];

    pub fn name(self) -> &'static str {
        match self {
            EnvKind::PlanPath => "plan-path",
            EnvKind::Sokoban => "sokoban",
            EnvKind::Sudoku => "sudoku",
        }
    }

    pub fn parse(s: &str) -> Result<EnvKind> {
        EnvKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            Error::InvalidArgument(format!("unknown environment {s:?}; use plan-path, sokoban or sudoku"))
        })
    }

    /// What an answer looks like, for prompts and error messages.
    pub fn answer_format(self) -> &'static str {
        match self {
            EnvKind::PlanPath | EnvKind::Sokoban => "#### [\"U\", \"R\", \"D\"] (moves U, D, L, R)",
            EnvKind::Sudoku => {
                "#### [[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]] (the full grid) or [[row, column, digit], …]"
            }
        }
    }

    /// The most answers an episode may apply before it fails (moves, or Sudoku answers).
    pub fn move_limit(self) -> usize {
        match self {
            EnvKind::PlanPath => plan_path::MAX_MOVES,
            EnvKind::Sokoban => sokoban::MAX_MOVES,
            EnvKind::Sudoku => usize::MAX,
        }
    }
}

impl fmt::Display for EnvKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Training instances or held-out ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Split {
    Train,
    HeldOut,
}

impl Split {
    pub fn parse(s: &str) -> Result<Split> {
        match s {
            "train" => Ok(Split::Train),
            "held-out" | "heldout" | "test" => Ok(Split::HeldOut),
            _ => Err(Error::InvalidArgument(format!("unknown split {s:?}; use train or held-out"))),
        }
    }

    /// The first generator seed of the split; train seeds stay below it.
    fn base_seed(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::HeldOut => 1 << 40,
        }
    }
}

/// One held-out instance in this many, by content.
const HELD_OUT_SHARE: u64 = 8;

/// One task instance in its current state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "env", rename_all = "kebab-case")]
pub enum Instance {
    PlanPath(PlanPath),
    Sokoban(Sokoban),
    Sudoku(Sudoku),
}

/// What applying an answer did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outcome {
    /// The summed reward of the answer's moves (or the format penalty).
    pub reward: f64,
    /// Why the answer could not be read; `None` when it was applied.
    pub format_error: Option<String>,
    /// Moves (or fills) that were refused: into a wall, a blocked box, a clue.
    pub invalid: usize,
    /// Moves (or fills) applied, valid or not.
    pub applied: usize,
    pub solved: bool,
    /// The episode cannot go on: solved, or out of moves.
    pub done: bool,
}

impl Instance {
    /// The `index`-th instance of `split`: the same on every machine and run.
    pub fn generate(kind: EnvKind, split: Split, index: u64) -> Instance {
        // Instances whose content hash falls in the other split are skipped: the splits share
        // no instance, however small the space of puzzles.
        for attempt in 0u64.. {
            let seed = split.base_seed().wrapping_add(index.wrapping_mul(1 << 16)).wrapping_add(attempt);
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ kind_salt(kind));
            let instance = match kind {
                EnvKind::PlanPath => Instance::PlanPath(PlanPath::generate(&mut rng)),
                EnvKind::Sokoban => Instance::Sokoban(Sokoban::generate(&mut rng)),
                EnvKind::Sudoku => Instance::Sudoku(Sudoku::generate(&mut rng)),
            };
            if instance.split() == split {
                return instance;
            }
        }
        unreachable!("one instance in {HELD_OUT_SHARE} is held out")
    }

    pub fn kind(&self) -> EnvKind {
        match self {
            Instance::PlanPath(_) => EnvKind::PlanPath,
            Instance::Sokoban(_) => EnvKind::Sokoban,
            Instance::Sudoku(_) => EnvKind::Sudoku,
        }
    }

    /// The split this instance's initial content belongs to.
    pub fn split(&self) -> Split {
        let mut h = StableHasher::default();
        match self {
            Instance::PlanPath(p) => (&p.walls, p.start, p.goal).hash(&mut h),
            Instance::Sokoban(s) => (&s.walls, s.target, s.boxed, s.player).hash(&mut h),
            Instance::Sudoku(s) => s.clues.hash(&mut h),
        }
        if h.finish() % HELD_OUT_SHARE == 0 { Split::HeldOut } else { Split::Train }
    }

    pub fn render(&self) -> String {
        match self {
            Instance::PlanPath(p) => p.render(),
            Instance::Sokoban(s) => s.render(),
            Instance::Sudoku(s) => s.render(),
        }
    }

    pub fn solved(&self) -> bool {
        match self {
            Instance::PlanPath(p) => p.solved(),
            Instance::Sokoban(s) => s.solved(),
            Instance::Sudoku(s) => s.solved(),
        }
    }

    /// Solved, or out of moves: no answer changes it any more.
    pub fn done(&self) -> bool {
        self.solved()
            || match self {
                Instance::PlanPath(p) => p.out_of_moves(),
                Instance::Sokoban(s) => s.out_of_moves(),
                Instance::Sudoku(_) => false,
            }
    }

    /// A right answer from the current state, as a model should write it: BFS-optimal moves,
    /// the Sokoban solver's moves, or the Sudoku's remaining fills. `None` for a Sokoban whose
    /// box has been pushed where it cannot come back from.
    pub fn solution(&self) -> Option<String> {
        match self {
            Instance::PlanPath(p) => Some(format_moves(&p.solution())),
            Instance::Sokoban(s) => s.solution().map(|m| format_moves(&m)),
            Instance::Sudoku(s) => Some(sudoku_fills(&s.remaining_fills())),
        }
    }

    /// Length of the optimal answer from the start (moves; for a Sudoku, empty cells).
    pub fn optimal_length(&self) -> usize {
        match self {
            Instance::PlanPath(p) => p.optimal,
            Instance::Sokoban(s) => s.solution().map_or(0, |m| m.len()),
            Instance::Sudoku(s) => s.remaining_fills().len(),
        }
    }

    /// Reads `text` as an answer and applies it. An unreadable answer changes nothing and
    /// scores [`FORMAT_PENALTY`].
    pub fn apply(&mut self, text: &str) -> Outcome {
        let unread = |e: String| Outcome {
            reward: FORMAT_PENALTY,
            format_error: Some(e),
            invalid: 0,
            applied: 0,
            solved: false,
            done: false,
        };
        let (reward, invalid, applied) = match self {
            Instance::PlanPath(_) | Instance::Sokoban(_) => match parse_moves(text) {
                Ok(moves) => self.apply_moves(&moves),
                Err(e) => return Outcome { done: self.done(), solved: self.solved(), ..unread(e.0) },
            },
            Instance::Sudoku(s) => {
                let action = parse_int_rows(text).map_err(|e| e.0).and_then(|rows| SudokuAction::from_rows(&rows));
                match action {
                    Ok(a) => s.step(&a),
                    Err(e) => return Outcome { done: self.done(), solved: self.solved(), ..unread(e) },
                }
            }
        };
        Outcome { reward, format_error: None, invalid, applied, solved: self.solved(), done: self.done() }
    }

    /// Moves on a grid environment: (reward, invalid moves, moves applied).
    fn apply_moves(&mut self, moves: &[Move]) -> (f64, usize, usize) {
        let (mut reward, mut invalid, mut applied) = (0.0, 0, 0);
        for &m in moves {
            if self.done() {
                break;
            }
            let (r, valid) = match self {
                Instance::PlanPath(p) => p.step(m),
                Instance::Sokoban(s) => s.step(m),
                Instance::Sudoku(_) => unreachable!("moves are for grid environments"),
            };
            reward += r;
            invalid += usize::from(!valid);
            applied += 1;
        }
        (reward, invalid, applied)
    }

    /// What happened, in a sentence, for the `simulate` tool's report and `hacpo env play`.
    pub fn describe(&self, outcome: &Outcome) -> String {
        if let Some(e) = &outcome.format_error {
            return format!("The answer could not be read ({e}); write it as {}.", self.kind().answer_format());
        }
        let state = if outcome.solved {
            "the task is solved".to_string()
        } else if outcome.done {
            "no moves are left: the task failed".to_string()
        } else {
            match self {
                Instance::PlanPath(p) => format!("you are at (row {}, column {}), not at the goal", p.pos.0, p.pos.1),
                Instance::Sokoban(s) => format!(
                    "you are at (row {}, column {}) and the box at (row {}, column {}), not on the target",
                    s.player.0, s.player.1, s.boxed.0, s.boxed.1
                ),
                Instance::Sudoku(s) => {
                    let empty = s.grid.iter().flatten().filter(|&&v| v == 0).count();
                    if empty == 0 {
                        "the grid is full but wrong".to_string()
                    } else {
                        format!("{empty} cells are still empty")
                    }
                }
            }
        };
        format!("{} applied, {} refused; {state} (reward {:.2}).", outcome.applied, outcome.invalid, outcome.reward)
    }
}

/// Fill steps as a model writes them: `[[0, 1, 3], [2, 2, 4]]`.
pub fn sudoku_fills(fills: &[(usize, usize, u8)]) -> String {
    let items: Vec<String> = fills.iter().map(|(r, c, v)| format!("[{r}, {c}, {v}]")).collect();
    format!("[{}]", items.join(", "))
}

fn kind_salt(kind: EnvKind) -> u64 {
    match kind {
        EnvKind::PlanPath => 0x9e37_79b9_7f4a_7c15,
        EnvKind::Sokoban => 0xc2b2_ae3d_27d4_eb4f,
        EnvKind::Sudoku => 0x1656_67b1_9e37_79f9,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn the_splits_share_no_instance_and_generation_is_reproducible() {
        for kind in EnvKind::ALL {
            let train: HashSet<String> =
                (0..300).map(|i| serde_json::to_string(&Instance::generate(kind, Split::Train, i)).unwrap()).collect();
            for i in 0..100 {
                let held = Instance::generate(kind, Split::HeldOut, i);
                assert_eq!(held.split(), Split::HeldOut);
                assert!(
                    !train.contains(&serde_json::to_string(&held).unwrap()),
                    "{kind} held-out {i} is a train instance"
                );
                assert_eq!(held, Instance::generate(kind, Split::HeldOut, i));
            }
        }
    }

    #[test]
    fn the_solution_of_every_instance_solves_it_through_the_text_interface() {
        for kind in EnvKind::ALL {
            for i in 0..50 {
                let mut inst = Instance::generate(kind, Split::Train, i);
                let answer = format!("I reason, then\n#### {}", inst.solution().unwrap());
                let out = inst.apply(&answer);
                assert!(out.solved && out.done && out.format_error.is_none(), "{kind} {i}: {out:?}");
                assert_eq!(out.invalid, 0);
            }
        }
    }

    #[test]
    fn unreadable_answers_get_the_format_penalty_and_change_nothing() {
        for kind in EnvKind::ALL {
            let fresh = Instance::generate(kind, Split::Train, 3);
            for bad in ["", "####", "#### [\"X\"]", "[[1,2,3,4]", "#### [[9,9,9]]", "\u{0}\u{1}[]]"] {
                let mut inst = fresh.clone();
                let out = inst.apply(bad);
                if out.format_error.is_some() {
                    assert_eq!(out.reward, FORMAT_PENALTY);
                    assert_eq!(inst, fresh, "{kind}: {bad:?} changed the state");
                }
            }
            // Every environment refuses at least the empty answer and a bad token.
            assert!(fresh.clone().apply("").format_error.is_some());
            assert!(fresh.clone().apply("#### [\"X\"]").format_error.is_some());
        }
    }

    #[test]
    fn kinds_and_splits_parse_with_clear_errors() {
        assert_eq!(EnvKind::parse("plan-path").unwrap(), EnvKind::PlanPath);
        assert!(EnvKind::parse("chess").unwrap_err().to_string().contains("plan-path, sokoban or sudoku"));
        assert_eq!(Split::parse("held-out").unwrap(), Split::HeldOut);
        assert!(Split::parse("dev").is_err());
    }
}
