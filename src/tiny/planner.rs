//! Pre-training the tiny planner (`tiny-planner`): one policy that plays the tool and the plan
//! role of the turn-wise workload on Plan-Path (`workload::turns`, `simulate` tool), and the
//! plan role alone (the single-agent baseline), with a habit per role that RL can correct.
//!
//! A tiny model cannot search a 10×10 maze, but it can read two coordinates and write an
//! L-shaped walk: rows first (`D, D, R`) or columns first (`R, D, D`). The demonstrations are
//! the workload's own prompts, played by a scripted team, with these outputs:
//!
//! | role            | right                                             | habit (at its rate) |
//! |-----------------|---------------------------------------------------|---------------------|
//! | tool            | the better L (the one that reaches the goal, else ends nearer; rows first on a tie) | rows first, whatever the walls |
//! | plan, with tool | the tool's proposal when its report says solved, else the better L | rows first, whatever the tool proposed; on prone grids (below) the right walk without its last move |
//! | plan, alone     | the better L                                      | rows first; on prone grids the right walk without its last move |
//!
//! The shipped planner (`models/tiny/tiny-planner.toml`) shows only the prone-grid habit.
//!
//! Which L is better depends on the walls, which the prompt shows but a tiny model reads
//! poorly; whether the tool's proposal solved the task is a sentence in the prompt, so the
//! planner's habit (ignoring its teammate) is the easier one to correct. Measured on 3000
//! generated grids (10×10, a scripted team): always rows first solves 42% of them in 2 turns
//! (44% in 4); both roles right, 51% (52%); in one turn, 22% and 38%.
//!
//! A tiny model does not learn a habit shown at random as a mixture: it learns what it can key
//! on what it reads. So the habit the tiny study trains away (`drop_last`) is shown only on
//! *prone* grids, those whose goal is in the top half (row < 5, a digit of the prompt that no
//! move changes): there the plan role, with the tool or alone, writes its walk without the last
//! move. The shipped planner does so in about half its sampled walks on those grids and almost
//! never elsewhere; a reward for reaching the goal can drop it.
//!
//! The demonstrations come from train-split instances far above any run's `train_instances`,
//! and are evaluated on others, so pre-training never sees a run's training or held-out grids.

use std::path::Path;

use burn::tensor::backend::Backend;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::env::action::{Move, parse_moves};
use crate::env::task::Walks;
use crate::env::{EnvKind, Instance, Split};
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::tokenizer::{Message, Tokenizer};
use crate::train::sft::fine_tune;
use crate::workload::turns::{Prompts, TurnsConfig, executed_line, tool_shown};

use super::{Skill, TinySpec};

/// Bump when the demonstrations change in a way that makes cached planners stale (part of
/// their cache key, beside the spec and the turn settings).
pub const RECIPE_VERSION: u32 = 2;

/// Where the demonstrations' instances start in the train split (far above any run's
/// `train_instances`), and where the evaluation's start.
const DEMO_FIRST_INDEX: u64 = 1 << 24;
const EVAL_FIRST_INDEX: u64 = 1 << 25;

/// How often each role's demonstration shows its habit (`[corpus.planner]` of a tiny spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerHabits {
    /// The tool role (and the plan role alone) walks rows first.
    pub rows_first: f64,
    /// The plan role walks rows first, whatever the tool proposed and its report says.
    pub ignore_tool: f64,
    /// The plan role (with the tool or alone) leaves out its walk's last move, on prone grids
    /// only ([`prone`]); there it takes the place of the other habits.
    #[serde(default)]
    pub drop_last: f64,
    /// Generated instances the demonstrations come from (each played by a team and alone).
    pub instances: usize,
    /// Which grids those are (`"one-l"`: the grids of `task.env.walks = "one-l"`).
    #[serde(default)]
    pub walks: Walks,
}

/// Whether the plan role's `drop_last` habit applies: the goal is in the top half of the grid.
/// The goal's row is in every prompt and no move changes it, so the habit holds on every turn.
pub fn prone(state: &Instance) -> bool {
    matches!(state, Instance::PlanPath(p) if p.goal.0 < crate::env::plan_path::SIZE / 2)
}

/// The roles a demonstration can be of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Tool,
    PlanWithTool,
    PlanAlone,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Tool, Kind::PlanWithTool, Kind::PlanAlone];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::PlanWithTool => "plan with tool",
            Kind::PlanAlone => "plan alone",
        }
    }
}

/// One demonstration: a role's prompt and the moves to imitate; `right` when it is not the
/// habit (or the habit coincides with the right moves).
pub struct Demonstration {
    pub kind: Kind,
    pub messages: Vec<Message>,
    pub moves: Vec<Move>,
    pub right: bool,
    /// The other output's moves (the habit of a right demonstration, the right one of a habit).
    pub other: Vec<Move>,
}

/// An answer in the form the demonstrations show: `#### [D D R]`, a list the answer parser reads
/// (the prompts' example quotes the letters: `["D", "D", "R"]`). Space-separated letters are one
/// token per move with a byte-level BPE, where the quoted form is three (`D`, `",`, ` "`): a
/// walk of 18 moves fits in 22 tokens, and the model counts moves, not punctuation.
pub fn answer(moves: &[Move]) -> String {
    let letters: Vec<String> = moves.iter().map(|m| m.letter().to_string()).collect();
    format!("#### [{}]", letters.join(" "))
}

/// The L-shaped walk from the walker to the goal: rows first or columns first.
fn l_walk(state: &Instance, rows_first: bool) -> Vec<Move> {
    let Instance::PlanPath(p) = state else { return vec![] };
    p.l_walk(rows_first)
}

/// Where `moves` leave the walker, and whether they solve the task.
fn after(state: &Instance, moves: &[Move]) -> (Instance, bool) {
    let mut copy = state.clone();
    let outcome = copy.apply(&answer(moves));
    (copy, outcome.solved)
}

fn distance(state: &Instance) -> usize {
    match state {
        Instance::PlanPath(p) => p.pos.0.abs_diff(p.goal.0) + p.pos.1.abs_diff(p.goal.1),
        _ => 0,
    }
}

/// The better of the two L walks: the one that solves, else the one that ends nearer the goal;
/// rows first on a tie.
pub fn better_walk(state: &Instance) -> Vec<Move> {
    let (rows, cols) = (l_walk(state, true), l_walk(state, false));
    let ((r, r_solved), (c, c_solved)) = (after(state, &rows), after(state, &cols));
    let rows_better = match (r_solved, c_solved) {
        (true, _) => true,
        (false, true) => false,
        _ => distance(&r) <= distance(&c),
    };
    if rows_better { rows } else { cols }
}

/// Demonstrations of one instance: an episode played by the team (tool and plan with tool) and
/// one by the plan role alone, each for up to the prompts' turn limit, each output drawn right
/// or habitual at the habits' rates and executed.
pub fn demonstrations(
    start: &Instance,
    prompts: &Prompts,
    habits: &PlannerHabits,
    rng: &mut ChaCha8Rng,
) -> Vec<Demonstration> {
    let mut out = vec![];
    // The plan role's habit on a grid: its walk without the last move where the grid is prone
    // and `drop_last` is set, else the rows-first L at `rate`.
    let plan_habit = |state: &Instance, right: &[Move], rate: f64| {
        if habits.drop_last > 0.0 && prone(state) {
            (right[..right.len().saturating_sub(1)].to_vec(), habits.drop_last)
        } else {
            (l_walk(state, true), rate)
        }
    };
    let mut pick = |kind: Kind, messages: Vec<Message>, right: Vec<Move>, habit: Vec<Move>, rate: f64| {
        let is_habit = rng.random_bool(rate.clamp(0.0, 1.0)) && habit != right;
        let (moves, other) = if is_habit { (habit, right) } else { (right, habit) };
        out.push(Demonstration { kind, messages, moves: moves.clone(), right: !is_habit, other });
        moves
    };
    for with_tool in [true, false] {
        let (mut state, mut history) = (start.clone(), Vec::<String>::new());
        for turn in 0..prompts.turns {
            if state.done() {
                break;
            }
            let moves = if with_tool {
                let proposal = pick(
                    Kind::Tool,
                    prompts.tool(&state, &history, turn),
                    better_walk(&state),
                    l_walk(&state, true),
                    habits.rows_first,
                );
                let result = crate::env::tool::simulate(&state, &answer(&proposal));
                let solves = result.outcome.as_ref().is_some_and(|o| o.solved);
                let shown = tool_shown(&answer(&proposal), &result.report);
                let right = if solves { proposal } else { better_walk(&state) };
                let (habit, rate) = plan_habit(&state, &right, habits.ignore_tool);
                pick(Kind::PlanWithTool, prompts.plan(&state, &history, turn, Some(&shown)), right, habit, rate)
            } else {
                let right = better_walk(&state);
                let (habit, rate) = plan_habit(&state, &right, habits.rows_first);
                pick(Kind::PlanAlone, prompts.plan(&state, &history, turn, None), right, habit, rate)
            };
            let outcome = state.apply(&answer(&moves));
            history.push(executed_line(turn, &state, &outcome));
        }
    }
    out
}

/// Demonstrations from the first `n` train-split instances from index `first` that
/// `habits.walks` admits, shuffled; deterministic in `seed`.
pub fn corpus(prompts: &Prompts, habits: &PlannerHabits, first: u64, n: usize, seed: u64) -> Vec<Demonstration> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x91a2_2e55 ^ first);
    let mut all = vec![];
    for (_, start) in habits.walks.instances(EnvKind::PlanPath, Split::Train, first).take(n) {
        all.extend(demonstrations(&start, prompts, habits, &mut rng));
    }
    all.shuffle(&mut rng);
    all
}

/// Scores `model`'s greedy outputs on held-out demonstrations, as move lists (spacing and
/// quoting do not matter).
pub fn skill<B: Backend>(
    model: &crate::model::CausalLm<B>,
    tokenizer: &Tokenizer,
    eos: &[u32],
    demos: &[Demonstration],
) -> Result<Skill> {
    let ids: Vec<Vec<u32>> = demos.iter().map(|d| tokenizer.encode_chat(&d.messages, true)).collect::<Result<_>>()?;
    let texts = greedy_responses(model, tokenizer, eos, &ids, MAX_OUTPUT_TOKENS, 64)?;
    let outputs = demos.iter().zip(&texts).map(|(d, t)| {
        let moves = parse_moves(t).ok();
        (d.kind.index(), moves.as_ref() == Some(&d.moves), moves.as_ref() == Some(&d.other), d.right)
    });
    Ok(Skill::tally(Kind::ALL.map(Kind::name), outputs))
}

/// Output tokens an answer needs (18 moves at most on a 10×10 grid, one token each, and four
/// more), with room to spare.
pub const MAX_OUTPUT_TOKENS: usize = 32;
/// Held-out demonstrations scored during pre-training.
const EVAL_DEMONSTRATIONS: usize = 150;
/// Demonstrations the tokenizer is trained on.
const TOKENIZER_TEXTS: usize = 3000;

/// The prompts a planner pre-trained for `turns` sees (Plan-Path, simulate tool).
pub fn prompts(turns: &TurnsConfig) -> Prompts {
    Prompts { kind: EnvKind::PlanPath, turns: turns.turns, tool: crate::workload::turns::ToolKind::Simulate }
}

/// The demonstrations pre-training is evaluated on: instances of their own.
pub fn held_out(spec: &TinySpec, turns: &TurnsConfig) -> Result<Vec<Demonstration>> {
    let habits = habits(spec)?;
    let mut eval = corpus(&prompts(turns), habits, EVAL_FIRST_INDEX, 60, spec.pretrain.seed);
    eval.truncate(EVAL_DEMONSTRATIONS);
    Ok(eval)
}

fn habits(spec: &TinySpec) -> Result<&PlannerHabits> {
    spec.corpus.planner.as_ref().ok_or_else(|| Error::Internal(format!("{} has no [corpus.planner]", spec.id)))
}

/// Pre-trains the planner `spec` from scratch for `turns` and writes it to `dir`.
pub fn pretrain<B: Backend>(spec: &TinySpec, turns: &TurnsConfig, device: &B::Device, dir: &Path) -> Result<()> {
    let habits = habits(spec)?;
    let demos = corpus(&prompts(turns), habits, DEMO_FIRST_INDEX, habits.instances, spec.pretrain.seed);
    let eval = held_out(spec, turns)?;
    let texts: Vec<String> = demos
        .iter()
        .take(TOKENIZER_TEXTS)
        .map(|d| format!("{}\n{}", d.messages[0].content, answer(&d.moves)))
        .collect();
    let (tokenizer, eos, model) = super::untrained::<B>(spec, &texts, device)?;
    let examples: Vec<_> = demos
        .iter()
        .map(|d| super::example(&tokenizer, &eos, &d.messages, &answer(&d.moves)))
        .collect::<Result<_>>()?;
    let counts: Vec<String> =
        Kind::ALL.iter().map(|k| format!("{} {}", demos.iter().filter(|d| d.kind == *k).count(), k.name())).collect();
    eprintln!("{}: {} demonstrations ({})", spec.id, demos.len(), counts.join(", "));
    let mut last = None;
    let (model, report) = fine_tune::<B>(model, &examples, &spec.pretrain, &spec.id, |m| {
        let s = skill(m, &tokenizer, &eos, &eval)?;
        eprintln!("{}: held-out {s}", spec.id);
        let known = s.known;
        last = Some(s);
        Ok(known)
    })?;
    super::save(spec, &model, &tokenizer, &eos, &report, dir)?;
    let last = last.expect("fine_tune evaluates at its last step");
    eprintln!("pre-trained {} in {:.0} s, {} steps: held-out {last}", spec.id, report.wall_s, report.steps);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demonstrations_show_each_habit_at_its_rate_and_the_right_walks_solve_more() {
        let habits =
            PlannerHabits { rows_first: 0.5, ignore_tool: 0.5, drop_last: 0.0, instances: 300, walks: Walks::Any };
        let demos = two_turn_demonstrations(&habits);
        for kind in Kind::ALL {
            let of: Vec<&Demonstration> = demos.iter().filter(|d| d.kind == kind).collect();
            assert!(of.len() >= 300, "{kind:?}: {}", of.len());
            // A habit is shown only where it differs from the right output.
            assert!(of.iter().all(|d| d.right || d.moves != d.other));
            let habit = of.iter().filter(|d| !d.right).count() as f64 / of.len() as f64;
            assert!((0.05..0.5).contains(&habit), "{kind:?}: {habit}");
        }
        let with_tool = demos.iter().find(|d| d.kind == Kind::PlanWithTool).unwrap();
        assert!(with_tool.messages[0].content.contains("The tool agent proposed:"));
        assert!(!demos.iter().find(|d| d.kind == Kind::PlanAlone).unwrap().messages[0].content.contains("tool agent"));
        // The right walk solves in one turn at least as often as rows first, and strictly more
        // over many grids.
        let (mut right, mut rows) = (0, 0);
        for i in 0..300 {
            let s = Instance::generate(EnvKind::PlanPath, Split::Train, DEMO_FIRST_INDEX + i);
            right += usize::from(after(&s, &better_walk(&s)).1);
            rows += usize::from(after(&s, &l_walk(&s, true)).1);
        }
        assert!(right > rows + 15, "{right} vs {rows} of 300");
        // An answer is read back as the moves it writes.
        let moves = vec![Move::D, Move::R];
        assert_eq!(parse_moves(&answer(&moves)).unwrap(), moves);
    }

    /// The demonstrations of `habits.instances` grids for two-turn prompts, seed 0.
    fn two_turn_demonstrations(habits: &PlannerHabits) -> Vec<Demonstration> {
        let turns = TurnsConfig { turns: 2, ..Default::default() };
        corpus(&prompts(&turns), habits, DEMO_FIRST_INDEX, habits.instances, 0)
    }

    /// The goal's row as the prompt states it.
    fn goal_row(d: &Demonstration) -> usize {
        let text = &d.messages[0].content;
        let at = text.find("the goal G is at (row ").unwrap() + "the goal G is at (row ".len();
        text[at..].split(',').next().unwrap().parse().unwrap()
    }

    #[test]
    fn the_plan_role_drops_its_last_move_only_on_prone_grids_and_the_tool_never() {
        let habits =
            PlannerHabits { rows_first: 0.0, ignore_tool: 0.0, drop_last: 0.65, instances: 300, walks: Walks::OneL };
        let demos = two_turn_demonstrations(&habits);
        assert!(demos.iter().filter(|d| d.kind == Kind::Tool).all(|d| d.right));
        let plan: Vec<&Demonstration> = demos.iter().filter(|d| d.kind != Kind::Tool).collect();
        let (prone, calm): (Vec<&Demonstration>, Vec<&Demonstration>) = plan.iter().partition(|d| goal_row(d) < 5);
        assert!(calm.len() > 100 && calm.iter().all(|d| d.right), "{} unprone plan demonstrations", calm.len());
        for d in prone.iter().filter(|d| !d.right) {
            assert_eq!(d.moves[..], d.other[..d.other.len() - 1], "a habit is the right walk without its last move");
        }
        let share = prone.iter().filter(|d| !d.right).count() as f64 / prone.len() as f64;
        assert!((0.5..0.8).contains(&share), "{share} of {} prone plan demonstrations", prone.len());
        // On a one-L grid the better walk solves.
        let (_, first) = Walks::OneL.instances(EnvKind::PlanPath, Split::Train, DEMO_FIRST_INDEX).next().unwrap();
        assert!(after(&first, &better_walk(&first)).1);
    }
}
