//! Sokoban: push the one box onto its target in a 6×6 room (a wall border round a 4×4 floor
//! with up to two pillars). Instances come from reverse play, as gym-sokoban and PettingLLMs
//! make them: from the box on its target, the player walks and *pulls* the box away, so every
//! state reached can be pushed back; a forward BFS solver checks it and gives the optimal moves.
//!
//! Rewards per move (PettingLLMs' `SokobanGridEnvState.step_single`): −0.01 for a move, −0.05
//! for one into a wall or a blocked box (the player stays), +1 when the box lands on the target,
//! −0.5 when it leaves it, shaping `0.1·(γ·φ(next) − φ(cur))` with φ = −(box's Manhattan distance
//! to the target) and γ = 0.99, and +10 when the puzzle is solved. 200 moves without solving is a
//! failure (PettingLLMs counted that timeout as a success).

use std::collections::{HashMap, VecDeque};

use rand::Rng;
use rand::seq::IndexedRandom;
use serde::{Deserialize, Serialize};

use super::action::Move;

pub const SIZE: usize = 6;
const STEP: f64 = -0.01;
const INVALID: f64 = -0.05;
const ON_TARGET: f64 = 1.0;
const OFF_TARGET: f64 = -0.5;
const SHAPING: f64 = 0.1;
const GAMMA: f64 = 0.99;
const SOLVED: f64 = 10.0;
pub const MAX_MOVES: usize = 200;
/// The box starts at least this far (Manhattan) from its target.
const MIN_DISPLACEMENT: usize = 2;
const MAX_PILLARS: usize = 2;

pub type Cell = (usize, usize);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sokoban {
    /// `true` where a wall is; the border is all walls.
    pub walls: Vec<Vec<bool>>,
    pub target: Cell,
    pub boxed: Cell,
    pub player: Cell,
    pub moves: usize,
}

fn offset((r, c): Cell, m: Move) -> Cell {
    let (dr, dc) = m.delta();
    ((r as i32 + dr) as usize, (c as i32 + dc) as usize)
}

fn distance(a: Cell, b: Cell) -> usize {
    a.0.abs_diff(b.0) + a.1.abs_diff(b.1)
}

impl Sokoban {
    pub fn generate(rng: &mut impl Rng) -> Sokoban {
        loop {
            let mut walls = vec![vec![true; SIZE]; SIZE];
            for row in walls.iter_mut().take(SIZE - 1).skip(1) {
                for cell in row.iter_mut().take(SIZE - 1).skip(1) {
                    *cell = false;
                }
            }
            for _ in 0..rng.random_range(0..=MAX_PILLARS) {
                let (r, c) = (rng.random_range(1..SIZE - 1), rng.random_range(1..SIZE - 1));
                walls[r][c] = true;
            }
            let floor = floor_cells(&walls);
            if !connected(&walls, &floor) {
                continue;
            }
            let target = *floor.choose(rng).expect("a 4×4 floor less two pillars is not empty");
            // Every state from which the box can be pushed onto the target: pull it away.
            let starts: Vec<(Cell, Cell)> = floor.iter().filter(|&&p| p != target).map(|&p| (p, target)).collect();
            let reachable = reverse_reachable(&walls, &starts);
            let candidates: Vec<&(Cell, Cell)> =
                reachable.iter().filter(|(_, b)| distance(*b, target) >= MIN_DISPLACEMENT).collect();
            let Some(&&(player, boxed)) = candidates.choose(rng) else { continue };
            return Sokoban { walls, target, boxed, player, moves: 0 };
        }
    }

    pub fn solved(&self) -> bool {
        self.boxed == self.target
    }

    pub fn out_of_moves(&self) -> bool {
        self.moves >= MAX_MOVES
    }

    fn free(&self, (r, c): Cell) -> bool {
        !self.walls[r][c]
    }

    /// One move; returns its reward and whether it was valid.
    pub fn step(&mut self, m: Move) -> (f64, bool) {
        if self.solved() || self.out_of_moves() {
            return (0.0, true);
        }
        self.moves += 1;
        let next = offset(self.player, m);
        let before = -(distance(self.boxed, self.target) as f64);
        let was_on = self.solved();
        let valid = if !self.free(next) {
            false
        } else if next == self.boxed {
            let beyond = offset(next, m);
            if self.free(beyond) {
                self.boxed = beyond;
                self.player = next;
                true
            } else {
                false
            }
        } else {
            self.player = next;
            true
        };
        let after = -(distance(self.boxed, self.target) as f64);
        let mut reward = if valid { STEP } else { INVALID };
        reward += SHAPING * (GAMMA * after - before);
        match (was_on, self.solved()) {
            (false, true) => reward += ON_TARGET + SOLVED,
            (true, false) => reward += OFF_TARGET,
            _ => {}
        }
        (reward, valid)
    }

    /// A shortest solution (in moves) from the current state.
    pub fn solution(&self) -> Option<Vec<Move>> {
        solve(&self.walls, self.player, self.boxed, self.target)
    }

    /// The room in Sokoban's usual symbols, with `_` for floor so that no cell is a space.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in 0..SIZE {
            for c in 0..SIZE {
                let p = (r, c);
                out.push(match () {
                    _ if self.walls[r][c] => '#',
                    _ if p == self.boxed && p == self.target => '*',
                    _ if p == self.boxed => '$',
                    _ if p == self.player && p == self.target => '+',
                    _ if p == self.player => '@',
                    _ if p == self.target => '.',
                    _ => '_',
                });
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "# wall, _ floor, @ you, $ the box, . the target (+ you on it, * the box on it). You are at (row {}, column {}); the box at (row {}, column {}); the target at (row {}, column {}). Push the box onto the target; you cannot pull it.",
            self.player.0, self.player.1, self.boxed.0, self.boxed.1, self.target.0, self.target.1
        ));
        out
    }
}

fn floor_cells(walls: &[Vec<bool>]) -> Vec<Cell> {
    (0..SIZE).flat_map(|r| (0..SIZE).map(move |c| (r, c))).filter(|&(r, c)| !walls[r][c]).collect()
}

fn connected(walls: &[Vec<bool>], floor: &[Cell]) -> bool {
    let Some(&first) = floor.first() else { return false };
    let mut seen = vec![first];
    let mut queue = VecDeque::from([first]);
    while let Some(cell) = queue.pop_front() {
        for m in Move::ALL {
            let n = offset(cell, m);
            if !walls[n.0][n.1] && !seen.contains(&n) {
                seen.push(n);
                queue.push_back(n);
            }
        }
    }
    seen.len() == floor.len()
}

/// States (player, box) reachable from `starts` by walking and pulling: exactly the states from
/// which pushing can bring the box back. The border walls keep every offset in range.
fn reverse_reachable(walls: &[Vec<bool>], starts: &[(Cell, Cell)]) -> Vec<(Cell, Cell)> {
    let mut seen: Vec<(Cell, Cell)> = starts.to_vec();
    let mut queue: VecDeque<(Cell, Cell)> = starts.iter().copied().collect();
    while let Some((player, boxed)) = queue.pop_front() {
        for m in Move::ALL {
            let to = offset(player, m);
            if walls[to.0][to.1] || to == boxed {
                continue;
            }
            let mut next = vec![(to, boxed)];
            // Pulling: the box behind the player follows it.
            let (dr, dc) = m.delta();
            let behind = ((player.0 as i32 - dr) as usize, (player.1 as i32 - dc) as usize);
            if behind == boxed {
                next.push((to, player));
            }
            for state in next {
                if !seen.contains(&state) {
                    seen.push(state);
                    queue.push_back(state);
                }
            }
        }
    }
    seen
}

/// Breadth-first search over (player, box): the moves of a shortest solution, or `None` when
/// the box cannot reach the target.
pub fn solve(walls: &[Vec<bool>], player: Cell, boxed: Cell, target: Cell) -> Option<Vec<Move>> {
    let mut prev: HashMap<(Cell, Cell), ((Cell, Cell), Move)> = HashMap::new();
    let start = (player, boxed);
    let mut queue = VecDeque::from([start]);
    let mut seen = vec![start];
    while let Some(state @ (p, b)) = queue.pop_front() {
        if b == target {
            let mut moves = Vec::new();
            let mut at = state;
            while let Some(&(from, m)) = prev.get(&at) {
                moves.push(m);
                at = from;
            }
            moves.reverse();
            return Some(moves);
        }
        for m in Move::ALL {
            let to = offset(p, m);
            if walls[to.0][to.1] {
                continue;
            }
            let next = if to == b {
                let beyond = offset(b, m);
                if walls[beyond.0][beyond.1] {
                    continue;
                }
                (to, beyond)
            } else {
                (to, b)
            };
            if !seen.contains(&next) {
                seen.push(next);
                prev.insert(next, (state, m));
                queue.push_back(next);
            }
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
    fn every_generated_room_is_solvable_by_the_solver() {
        for seed in 0..200 {
            let mut s = Sokoban::generate(&mut ChaCha8Rng::seed_from_u64(seed));
            assert!(s.walls[0].iter().all(|w| *w) && s.walls.iter().all(|row| row[0] && row[SIZE - 1]));
            assert!(distance(s.boxed, s.target) >= MIN_DISPLACEMENT, "seed {seed}");
            assert_ne!(s.player, s.boxed);
            let moves = s.solution().unwrap_or_else(|| panic!("seed {seed} is not solvable:\n{}", s.render()));
            let total: f64 = moves.iter().map(|&m| s.step(m).0).sum();
            assert!(s.solved(), "seed {seed}");
            assert!(total > SOLVED, "seed {seed}: {total}");
        }
    }

    #[test]
    fn pushes_move_the_box_and_blocked_moves_are_invalid() {
        let mut walls = vec![vec![true; SIZE]; SIZE];
        for row in walls.iter_mut().take(SIZE - 1).skip(1) {
            for cell in row.iter_mut().take(SIZE - 1).skip(1) {
                *cell = false;
            }
        }
        // @ at (1,1), box at (1,2), target at (1,4).
        let mut s = Sokoban { walls, target: (1, 4), boxed: (1, 2), player: (1, 1), moves: 0 };
        // Up into the border wall: −0.05, shaping 0.1·(0.99·(−2) + 2).
        let (r, valid) = s.step(Move::U);
        assert!(!valid);
        assert!((r - (-0.05 + 0.1 * (0.99 * -2.0 + 2.0))).abs() < 1e-12);
        // Push right: the box moves to (1,3).
        let (r, valid) = s.step(Move::R);
        assert!(valid && s.boxed == (1, 3) && s.player == (1, 2));
        assert!((r - (-0.01 + 0.1 * (-0.99 + 2.0))).abs() < 1e-12);
        // Push onto the target: +1 + 10.
        let (r, _) = s.step(Move::R);
        assert!(s.solved());
        assert!((r - (-0.01 + 0.1 * (0.0 + 1.0) + 11.0)).abs() < 1e-12, "{r}");
        assert_eq!(s.step(Move::L), (0.0, true), "nothing moves once solved");
    }

    #[test]
    fn a_box_against_the_wall_does_not_move_and_a_cornered_box_is_unsolvable() {
        let mut walls = vec![vec![true; SIZE]; SIZE];
        for row in walls.iter_mut().take(SIZE - 1).skip(1) {
            for cell in row.iter_mut().take(SIZE - 1).skip(1) {
                *cell = false;
            }
        }
        let mut s = Sokoban { walls: walls.clone(), target: (3, 3), boxed: (1, 4), player: (1, 3), moves: 0 };
        assert!(!s.step(Move::R).1);
        assert_eq!(s.boxed, (1, 4));
        // The box in the corner (1,4) can never leave it.
        assert_eq!(solve(&walls, (2, 2), (1, 4), (3, 3)), None);
    }

    #[test]
    fn the_timeout_is_a_failure() {
        let s0 = Sokoban::generate(&mut ChaCha8Rng::seed_from_u64(3));
        let mut s = Sokoban { player: (1, 1), boxed: (3, 3), target: (1, 3), ..s0 };
        s.walls[1][1] = false;
        for _ in 0..MAX_MOVES + 3 {
            s.step(Move::U); // into the border
        }
        assert!(s.out_of_moves() && !s.solved());
        assert_eq!(s.moves, MAX_MOVES);
    }
}
