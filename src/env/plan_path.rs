//! Plan-Path: walk from the start to the goal of a 10×10 grid with about 22% walls, as in
//! PettingLLMs' planning suite. Start and goal are distinct free cells that a BFS connects.
//!
//! Rewards per move (PettingLLMs' `PlanPathGridEnvState.step_single`): −0.01 for a move, −0.1
//! for one into a wall or off the grid (the walker stays), potential shaping `γ·φ(next) − φ(cur)`
//! with φ = −(Manhattan distance to the goal) and γ = 0.99, +1 on reaching the goal and +0.5
//! more when the walk took exactly the BFS-optimal number of moves. Unlike PettingLLMs, the
//! rendering shows where the walker is now, and running out of moves is a failure.

use std::collections::VecDeque;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::action::Move;

pub const SIZE: usize = 10;
pub const WALL_RATE: f64 = 0.22;
const STEP: f64 = -0.01;
const INVALID: f64 = -0.1;
const GAMMA: f64 = 0.99;
const GOAL: f64 = 1.0;
const OPTIMAL_BONUS: f64 = 0.5;
/// Moves an episode may take before it fails (PettingLLMs' cap is 10 000; a walk that needs
/// more than 100 moves on a 10×10 grid has lost its way).
pub const MAX_MOVES: usize = 100;
/// The goal is at least this far (BFS moves) from the start: a plan, not a step.
const MIN_DISTANCE: usize = 4;

pub type Cell = (usize, usize);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanPath {
    /// `true` where a wall is; row-major.
    pub walls: Vec<Vec<bool>>,
    pub start: Cell,
    pub goal: Cell,
    pub pos: Cell,
    /// Moves taken so far (invalid ones included, as in PettingLLMs).
    pub moves: usize,
    /// Length of a shortest path from the start.
    pub optimal: usize,
}

impl PlanPath {
    pub fn generate(rng: &mut impl Rng) -> PlanPath {
        loop {
            let walls: Vec<Vec<bool>> =
                (0..SIZE).map(|_| (0..SIZE).map(|_| rng.random_bool(WALL_RATE)).collect()).collect();
            let free: Vec<Cell> =
                (0..SIZE).flat_map(|r| (0..SIZE).map(move |c| (r, c))).filter(|&(r, c)| !walls[r][c]).collect();
            if free.len() < 2 {
                continue;
            }
            let start = free[rng.random_range(0..free.len())];
            let goal = free[rng.random_range(0..free.len())];
            let Some(path) = shortest_path(&walls, start, goal) else { continue };
            if path.len() < MIN_DISTANCE {
                continue;
            }
            return PlanPath { walls, start, goal, pos: start, moves: 0, optimal: path.len() };
        }
    }

    pub fn solved(&self) -> bool {
        self.pos == self.goal
    }

    pub fn out_of_moves(&self) -> bool {
        self.moves >= MAX_MOVES
    }

    /// A shortest path from where the walker is now.
    pub fn solution(&self) -> Vec<Move> {
        shortest_path(&self.walls, self.pos, self.goal).unwrap_or_default()
    }

    fn free(&self, r: i32, c: i32) -> bool {
        (0..SIZE as i32).contains(&r) && (0..SIZE as i32).contains(&c) && !self.walls[r as usize][c as usize]
    }

    fn potential(&self, (r, c): Cell) -> f64 {
        -((r.abs_diff(self.goal.0) + c.abs_diff(self.goal.1)) as f64)
    }

    /// One move; returns its reward and whether it was valid.
    pub fn step(&mut self, m: Move) -> (f64, bool) {
        if self.solved() || self.out_of_moves() {
            return (0.0, true);
        }
        self.moves += 1;
        let (dr, dc) = m.delta();
        let (r, c) = (self.pos.0 as i32 + dr, self.pos.1 as i32 + dc);
        let valid = self.free(r, c);
        let before = self.potential(self.pos);
        let mut reward = if valid {
            self.pos = (r as usize, c as usize);
            STEP
        } else {
            INVALID
        };
        reward += GAMMA * self.potential(self.pos) - before;
        if self.solved() {
            reward += GOAL;
            if self.moves == self.optimal {
                reward += OPTIMAL_BONUS;
            }
        }
        (reward, valid)
    }

    /// The L-shaped walk from the walker to the goal: all row moves then all column moves
    /// (`rows_first`), or the other way round.
    pub fn l_walk(&self, rows_first: bool) -> Vec<Move> {
        let (dr, dc) = (self.goal.0 as i64 - self.pos.0 as i64, self.goal.1 as i64 - self.pos.1 as i64);
        let rows = vec![if dr > 0 { Move::D } else { Move::U }; dr.unsigned_abs() as usize];
        let cols = vec![if dc > 0 { Move::R } else { Move::L }; dc.unsigned_abs() as usize];
        if rows_first { [rows, cols].concat() } else { [cols, rows].concat() }
    }

    /// Whether the L walk (`rows_first` or not) reaches the goal: no wall on it.
    pub fn l_walk_solves(&self, rows_first: bool) -> bool {
        let mut copy = self.clone();
        for m in self.l_walk(rows_first) {
            if !copy.step(m).1 {
                return false;
            }
        }
        copy.solved()
    }

    /// The grid as the prompts show it: `#` wall, `.` free, `S` the walker, `G` the goal.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in 0..SIZE {
            for c in 0..SIZE {
                out.push(match (r, c) {
                    p if p == self.pos => 'S',
                    p if p == self.goal => 'G',
                    (r, c) if self.walls[r][c] => '#',
                    _ => '.',
                });
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "You are at S = (row {}, column {}); the goal G is at (row {}, column {}), {} and {}. Rows count from 0 at the top, columns from 0 at the left.",
            self.pos.0,
            self.pos.1,
            self.goal.0,
            self.goal.1,
            offset(self.pos.0, self.goal.0, "row", "down", "up"),
            offset(self.pos.1, self.goal.1, "column", "right", "left"),
        ));
        out
    }
}

/// Where the goal is along one axis, in words: `3 rows down`, `1 column left`, `in your row`.
/// The prompt says it so that no model has to subtract coordinates to know the direction; the
/// walls are the task.
fn offset(from: usize, to: usize, axis: &str, forward: &str, back: &str) -> String {
    let n = from.abs_diff(to);
    let way = if to > from { forward } else { back };
    match n {
        0 => format!("in your {axis}"),
        1 => format!("1 {axis} {way}"),
        _ => format!("{n} {axis}s {way}"),
    }
}

/// Breadth-first search over free cells: the moves of a shortest path, or `None`.
pub fn shortest_path(walls: &[Vec<bool>], from: Cell, to: Cell) -> Option<Vec<Move>> {
    let (h, w) = (walls.len(), walls[0].len());
    let mut prev: Vec<Vec<Option<(Cell, Move)>>> = vec![vec![None; w]; h];
    let mut seen = vec![vec![false; w]; h];
    let mut queue = VecDeque::from([from]);
    seen[from.0][from.1] = true;
    while let Some(cell) = queue.pop_front() {
        if cell == to {
            let mut moves = Vec::new();
            let mut at = to;
            while let Some((p, m)) = prev[at.0][at.1] {
                moves.push(m);
                at = p;
            }
            moves.reverse();
            return Some(moves);
        }
        for m in Move::ALL {
            let (dr, dc) = m.delta();
            let (r, c) = (cell.0 as i32 + dr, cell.1 as i32 + dc);
            if r < 0 || c < 0 || r >= h as i32 || c >= w as i32 {
                continue;
            }
            let (r, c) = (r as usize, c as usize);
            if walls[r][c] || seen[r][c] {
                continue;
            }
            seen[r][c] = true;
            prev[r][c] = Some((cell, m));
            queue.push_back((r, c));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn generated_grids_connect_start_and_goal_and_the_optimum_is_bfs() {
        let mut walls = 0usize;
        for seed in 0..200 {
            let mut p = PlanPath::generate(&mut ChaCha8Rng::seed_from_u64(seed));
            walls += p.walls.iter().flatten().filter(|w| **w).count();
            assert_ne!(p.start, p.goal);
            let path = p.solution();
            assert_eq!(path.len(), p.optimal, "seed {seed}");
            assert!(p.optimal >= MIN_DISTANCE);
            // Walking the BFS path reaches the goal with the optimal bonus.
            let total: f64 = path.iter().map(|&m| p.step(m).0).sum();
            assert!(p.solved(), "seed {seed}");
            assert!(total > GOAL + OPTIMAL_BONUS, "seed {seed}: {total}");
        }
        let rate = walls as f64 / (200 * SIZE * SIZE) as f64;
        assert!((0.18..0.26).contains(&rate), "wall rate {rate}");
    }

    #[test]
    fn rewards_follow_the_shaping_and_walls_block() {
        let mut walls = vec![vec![false; SIZE]; SIZE];
        walls[0][1] = true;
        let mut p = PlanPath { walls, start: (0, 0), goal: (0, 3), pos: (0, 0), moves: 0, optimal: 5 };
        // Into the wall: −0.1 + 0.99·(−3) − (−3) = −0.07; the walker stays.
        let (r, valid) = p.step(Move::R);
        assert!(!valid && p.pos == (0, 0));
        assert!((r - (-0.1 - 0.99 * 3.0 + 3.0)).abs() < 1e-12);
        // Off the grid is invalid too.
        assert!(!p.step(Move::U).1);
        // Down: further away, −0.01 + 0.99·(−4) + 3.
        let (r, _) = p.step(Move::D);
        assert!((r - (-0.01 - 0.99 * 4.0 + 3.0)).abs() < 1e-12);
        for m in [Move::R, Move::R, Move::R] {
            p.step(m);
        }
        // The last move onto the goal: no optimal bonus after 6 moves (optimal 5).
        let (r, _) = p.step(Move::U);
        assert!(p.solved());
        assert!((r - (-0.01 + 0.0 + 1.0 + 1.0)).abs() < 1e-12, "{r}");
        // After the goal, moves count nothing.
        assert_eq!(p.step(Move::D), (0.0, true));
        assert_eq!(p.pos, (0, 3));
    }

    #[test]
    fn running_out_of_moves_is_not_success() {
        let walls = vec![vec![false; SIZE]; SIZE];
        let mut p = PlanPath { walls, start: (0, 0), goal: (5, 5), pos: (0, 0), moves: 0, optimal: 10 };
        for _ in 0..MAX_MOVES + 5 {
            p.step(Move::U); // off the grid: invalid, but a move all the same
        }
        assert!(p.out_of_moves() && !p.solved());
        assert_eq!(p.moves, MAX_MOVES);
        assert_eq!(p.step(Move::D), (0.0, true), "no move after the cap");
        assert_eq!(p.pos, (0, 0));
    }

    #[test]
    fn the_rendering_marks_the_walker_and_the_goal() {
        let p = PlanPath::generate(&mut ChaCha8Rng::seed_from_u64(1));
        let text = p.render();
        let rows: Vec<&str> = text.lines().take(SIZE).collect();
        assert_eq!(rows[p.pos.0].as_bytes()[p.pos.1], b'S');
        assert_eq!(rows[p.goal.0].as_bytes()[p.goal.1], b'G');
        assert!(rows.iter().all(|r| r.len() == SIZE));
        let q = PlanPath { pos: (2, 8), goal: (6, 4), ..p.clone() };
        assert!(q.render().contains("(row 6, column 4), 4 rows down and 4 columns left."), "{}", q.render());
        let q = PlanPath { pos: (6, 3), goal: (6, 4), ..p };
        assert!(q.render().contains("in your row and 1 column right."), "{}", q.render());
    }
}
