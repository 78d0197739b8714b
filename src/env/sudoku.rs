//! Sudoku 4×4 (2×2 boxes) with exactly one solution. A solved grid is shuffled from a base
//! pattern (digits, rows within bands, bands, columns within stacks, stacks, transposition),
//! then clues are removed in random order while the solver still finds one solution only.
//!
//! An answer is either the full grid `[[1,2,3,4], …]` or fill steps `[[row, column, digit], …]`
//! (0-based). Both must keep the clues: a full grid that changes a clue is invalid, as is a fill
//! of a clue or a filled cell; PettingLLMs let a full grid overwrite the clues, so any valid
//! grid "solved" every puzzle. Rewards, after PettingLLMs' `SudukuEnvState` without its bugs:
//! −0.01 per answer or fill, −0.3 for an invalid fill (nothing changes), +0.1 for a valid fill
//! (+0.1 more when the cell had a single candidate), +0.5 × the gain in the filled fraction,
//! −0.5 for a full grid that breaks a row, column or box, and +2 when the puzzle is solved.

use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

pub const N: usize = 4;
const BOX: usize = 2;
const STEP: f64 = -0.01;
const INVALID_FILL: f64 = -0.3;
const VALID_FILL: f64 = 0.1;
const FORCED_FILL: f64 = 0.1;
const PROGRESS: f64 = 0.5;
const CONFLICT: f64 = -0.5;
const SOLVED: f64 = 2.0;

pub type Grid = [[u8; N]; N];

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sudoku {
    /// The puzzle as given; 0 is an empty cell.
    pub clues: Grid,
    /// The current grid.
    pub grid: Grid,
    /// The unique solution.
    pub solution: Grid,
}

/// What an answer asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SudokuAction {
    Grid(Grid),
    Fills(Vec<(usize, usize, u8)>),
}

impl SudokuAction {
    /// Rows of integers (from [`super::action::parse_int_rows`]) as a grid or fill steps.
    pub fn from_rows(rows: &[Vec<i64>]) -> Result<SudokuAction, String> {
        let digit = |v: i64| (1..=N as i64).contains(&v).then_some(v as u8);
        if rows.len() == N && rows.iter().all(|r| r.len() == N) {
            let mut grid = [[0u8; N]; N];
            for (r, row) in rows.iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    grid[r][c] = digit(v).ok_or_else(|| format!("{v} is not a digit 1..{N}"))?;
                }
            }
            return Ok(SudokuAction::Grid(grid));
        }
        if rows.iter().all(|r| r.len() == 3) {
            let index = |v: i64| (0..N as i64).contains(&v).then_some(v as usize);
            return rows
                .iter()
                .map(|f| match (index(f[0]), index(f[1]), digit(f[2])) {
                    (Some(r), Some(c), Some(v)) => Ok((r, c, v)),
                    _ => Err(format!("{f:?} is not [row 0..{}, column 0..{}, digit 1..{N}]", N - 1, N - 1)),
                })
                .collect::<Result<_, _>>()
                .map(SudokuAction::Fills);
        }
        Err(format!("expected {N} rows of {N} digits, or [row, column, digit] fill steps"))
    }
}

impl Sudoku {
    pub fn generate(rng: &mut impl Rng) -> Sudoku {
        let solution = shuffled_solution(rng);
        let mut clues = solution;
        let mut cells: Vec<(usize, usize)> = (0..N).flat_map(|r| (0..N).map(move |c| (r, c))).collect();
        cells.shuffle(rng);
        for (r, c) in cells {
            let keep = clues[r][c];
            clues[r][c] = 0;
            if count_solutions(&mut clues.clone(), 2) != 1 {
                clues[r][c] = keep;
            }
        }
        Sudoku { clues, grid: clues, solution }
    }

    pub fn solved(&self) -> bool {
        self.grid == self.solution
    }

    fn filled(&self) -> f64 {
        self.grid.iter().flatten().filter(|&&v| v != 0).count() as f64 / (N * N) as f64
    }

    /// Digits that fit cell (r, c) by the row, column and box.
    fn candidates(&self, r: usize, c: usize) -> Vec<u8> {
        (1..=N as u8).filter(|&v| fits(&self.grid, r, c, v)).collect()
    }

    /// One answer; returns its reward, how many of its fills (or its one grid) were refused,
    /// and how many were applied (fills after the puzzle is solved are not).
    pub fn step(&mut self, action: &SudokuAction) -> (f64, usize, usize) {
        if self.solved() {
            return (0.0, 0, 0);
        }
        let before = self.filled();
        let (mut reward, mut invalid, mut applied) = (0.0, 0, 0);
        match action {
            SudokuAction::Grid(grid) => {
                reward += STEP;
                applied = 1;
                let keeps_clues =
                    (0..N).all(|r| (0..N).all(|c| self.clues[r][c] == 0 || self.clues[r][c] == grid[r][c]));
                if keeps_clues {
                    self.grid = *grid;
                    if !consistent(&self.grid) {
                        reward += CONFLICT;
                    }
                } else {
                    reward += INVALID_FILL;
                    invalid = 1;
                }
            }
            SudokuAction::Fills(fills) => {
                for &(r, c, v) in fills {
                    if self.solved() {
                        break;
                    }
                    applied += 1;
                    reward += STEP;
                    if self.grid[r][c] != 0 || !fits(&self.grid, r, c, v) {
                        reward += INVALID_FILL;
                        invalid += 1;
                        continue;
                    }
                    reward += VALID_FILL;
                    if self.candidates(r, c).len() == 1 {
                        reward += FORCED_FILL;
                    }
                    self.grid[r][c] = v;
                }
            }
        }
        reward += PROGRESS * (self.filled() - before);
        if self.solved() {
            reward += SOLVED;
        }
        (reward, invalid, applied)
    }

    /// Fill steps that complete the puzzle from the current grid (when it is on the way).
    pub fn remaining_fills(&self) -> Vec<(usize, usize, u8)> {
        (0..N)
            .flat_map(|r| (0..N).map(move |c| (r, c)))
            .filter(|&(r, c)| self.grid[r][c] == 0)
            .map(|(r, c)| (r, c, self.solution[r][c]))
            .collect()
    }

    /// Rows of digits with `.` for empty cells.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for row in &self.grid {
            let cells: Vec<String> =
                row.iter().map(|&v| if v == 0 { ".".to_string() } else { v.to_string() }).collect();
            out.push_str(&cells.join(" "));
            out.push('\n');
        }
        out.push_str(&format!(
            "Fill the empty cells (.) with digits 1-{N} so that every row, column and 2x2 box holds each digit once; the given digits stay."
        ));
        out
    }
}

fn fits(grid: &Grid, r: usize, c: usize, v: u8) -> bool {
    let (br, bc) = (r / BOX * BOX, c / BOX * BOX);
    (0..N).all(|i| (i == c || grid[r][i] != v) && (i == r || grid[i][c] != v))
        && (br..br + BOX).all(|i| (bc..bc + BOX).all(|j| (i, j) == (r, c) || grid[i][j] != v))
}

/// No row, column or box repeats a digit (empty cells aside).
pub fn consistent(grid: &Grid) -> bool {
    (0..N).all(|r| (0..N).all(|c| grid[r][c] == 0 || fits(grid, r, c, grid[r][c])))
}

/// Solutions of `grid`, counted up to `limit` (backtracking; a 4×4 is instant).
pub fn count_solutions(grid: &mut Grid, limit: usize) -> usize {
    let Some((r, c)) = (0..N).flat_map(|r| (0..N).map(move |c| (r, c))).find(|&(r, c)| grid[r][c] == 0) else {
        return usize::from(consistent(grid));
    };
    let mut count = 0;
    for v in 1..=N as u8 {
        if fits(grid, r, c, v) {
            grid[r][c] = v;
            count += count_solutions(grid, limit - count);
            grid[r][c] = 0;
            if count >= limit {
                break;
            }
        }
    }
    count
}

fn shuffled_solution(rng: &mut impl Rng) -> Grid {
    // The base pattern: row r is the digits shifted by (r % 2)·2 + r / 2.
    let mut base = [[0u8; N]; N];
    for (r, row) in base.iter_mut().enumerate() {
        for (c, cell) in row.iter_mut().enumerate() {
            *cell = ((c + (r % BOX) * BOX + r / BOX) % N) as u8 + 1;
        }
    }
    let mut digits: Vec<u8> = (1..=N as u8).collect();
    digits.shuffle(rng);
    let rows = shuffled_lines(rng);
    let cols = shuffled_lines(rng);
    let transpose = rng.random_bool(0.5);
    let mut grid = [[0u8; N]; N];
    for r in 0..N {
        for c in 0..N {
            let (sr, sc) = if transpose { (cols[c], rows[r]) } else { (rows[r], cols[c]) };
            grid[r][c] = digits[base[sr][sc] as usize - 1];
        }
    }
    grid
}

/// 0..N with the bands shuffled and the lines shuffled within each band.
fn shuffled_lines(rng: &mut impl Rng) -> Vec<usize> {
    let mut bands: Vec<usize> = (0..N / BOX).collect();
    bands.shuffle(rng);
    let mut lines = Vec::with_capacity(N);
    for b in bands {
        let mut inner: Vec<usize> = (0..BOX).map(|i| b * BOX + i).collect();
        inner.shuffle(rng);
        lines.extend(inner);
    }
    lines
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn every_generated_puzzle_has_exactly_one_solution_and_it_keeps_the_clues() {
        let mut clue_counts = Vec::new();
        for seed in 0..300 {
            let s = Sudoku::generate(&mut ChaCha8Rng::seed_from_u64(seed));
            assert!(consistent(&s.solution) && s.solution.iter().flatten().all(|&v| v != 0), "seed {seed}");
            assert_eq!(count_solutions(&mut s.clues.clone(), 10), 1, "seed {seed}");
            for r in 0..N {
                for c in 0..N {
                    assert!(s.clues[r][c] == 0 || s.clues[r][c] == s.solution[r][c]);
                }
            }
            clue_counts.push(s.clues.iter().flatten().filter(|&&v| v != 0).count());
        }
        // Minimal puzzles: no clue can go without a second solution appearing.
        assert!(clue_counts.iter().all(|&n| (4..=8).contains(&n)), "{clue_counts:?}");
    }

    #[test]
    fn filling_the_solution_solves_and_the_clues_cannot_be_overwritten() {
        let mut s = Sudoku::generate(&mut ChaCha8Rng::seed_from_u64(5));
        let (r, c) = (0..N).flat_map(|r| (0..N).map(move |c| (r, c))).find(|&(r, c)| s.clues[r][c] != 0).unwrap();
        // A fill on a clue is invalid and changes nothing.
        let other = s.clues[r][c] % N as u8 + 1;
        let (reward, invalid, applied) = s.step(&SudokuAction::Fills(vec![(r, c, other)]));
        assert!(invalid == 1 && applied == 1 && s.grid == s.clues);
        assert!((reward - (STEP + INVALID_FILL)).abs() < 1e-12);
        // Some other valid grid that changes a clue is refused: PettingLLMs' bug.
        let mut relabelled = s.solution;
        for v in relabelled.iter_mut().flatten() {
            *v = *v % N as u8 + 1;
        }
        assert!(consistent(&relabelled));
        let (_, invalid, _) = s.step(&SudokuAction::Grid(relabelled));
        assert!(invalid == 1 && !s.solved());
        // The solution's fills solve it.
        let fills = s.remaining_fills();
        let mut twice = fills.clone();
        twice.extend(fills.iter().copied()); // the second copy comes after the solve: not applied
        let (reward, invalid, applied) = s.step(&SudokuAction::Fills(twice));
        assert!(invalid == 0 && applied == fills.len() && s.solved());
        assert!(reward > SOLVED);
    }

    #[test]
    fn a_full_grid_with_a_conflict_is_penalised() {
        let mut s = Sudoku::generate(&mut ChaCha8Rng::seed_from_u64(9));
        let mut grid = s.solution;
        let (r, c) = (0..N).flat_map(|r| (0..N).map(move |c| (r, c))).find(|&(r, c)| s.clues[r][c] == 0).unwrap();
        grid[r][c] = grid[r][c] % N as u8 + 1;
        let (reward, invalid, _) = s.step(&SudokuAction::Grid(grid));
        assert!(invalid == 0 && !s.solved());
        assert!(reward < CONFLICT + PROGRESS);
    }

    #[test]
    fn answers_are_read_as_grids_or_fill_steps() {
        assert!(matches!(
            SudokuAction::from_rows(&[vec![1, 2, 3, 4], vec![3, 4, 1, 2], vec![2, 1, 4, 3], vec![4, 3, 2, 1]]),
            Ok(SudokuAction::Grid(_))
        ));
        assert_eq!(SudokuAction::from_rows(&[vec![0, 1, 3]]), Ok(SudokuAction::Fills(vec![(0, 1, 3)])));
        assert!(SudokuAction::from_rows(&[vec![0, 4, 3]]).is_err());
        assert!(SudokuAction::from_rows(&[vec![0, 1, 5]]).is_err());
        assert!(SudokuAction::from_rows(&[vec![1, 2]]).is_err());
        assert!(SudokuAction::from_rows(&vec![vec![1, 2, 3, 0]; 4]).is_err());
    }
}
