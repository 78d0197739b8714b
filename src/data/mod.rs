//! Datasets: the math benchmarks and training sets, from local files or the hub.
//!
//! Each benchmark stores its answer differently (see `tests/shared/README.md`); the readers here
//! turn every row into a [`MathProblem`] `{id, question, answer}` and name the file, line and
//! field when a row does not have the expected shape.

pub mod arith;
pub mod math;

pub use math::{Benchmark, MathProblem, load_benchmark};
