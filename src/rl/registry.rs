//! The algorithm registry: every algorithm `algo.name` can select, looked up by name.
//!
//! Adding an algorithm is a file in `rl/algos/`, one line here and, if it has settings of its
//! own, a table in [`AlgoSettings`](super::AlgoSettings) (see `docs/architecture.md`).

use burn::tensor::backend::Backend;

use super::algorithm::{AlgoSettings, Algorithm};
use super::algos::{atgrpo::Atgrpo, drgrpo::DrGrpo, grpo::Grpo, gspo::Gspo, hacpo::Hacpo, mappo::Mappo, mhgpo::Mhgpo};
use crate::error::{Error, Result};

/// Builds an algorithm from the run's settings.
type Build<B> = fn(&AlgoSettings) -> Result<Box<dyn Algorithm<B>>>;

/// One registered algorithm.
pub struct Entry<B: Backend> {
    pub name: &'static str,
    pub build: Build<B>,
}

fn entry<B: Backend>(name: &'static str, build: Build<B>) -> Entry<B> {
    Entry { name, build }
}

/// Every algorithm, in the order errors list them: one line each.
#[rustfmt::skip]
pub fn entries<B: Backend>() -> Vec<Entry<B>> {
    vec![
        entry("hacpo", |s| Ok(Box::new(Hacpo::new(s, false)?))), // every policy learns from every policy's samples (§2)
        entry("gspo", |s| Ok(Box::new(Gspo::new(s, false)?))),   // each policy alone, sequence-level ratio (§1.2)
        entry("grpo", |s| Ok(Box::new(Grpo::new(s)?))),          // each policy alone, token-level ratio (§1.1)
        entry("gspo2x", |s| Ok(Box::new(Gspo::new(s, true)?))),  // GSPO with twice the samples and updates
        entry("naive", |s| Ok(Box::new(Hacpo::new(s, true)?))),  // sharing with every HACPO mechanism off
        entry("drgrpo", |s| Ok(Box::new(DrGrpo::new(s)?))),      // no std division, token sums / a constant length
        entry("mhgpo-is", |s| Ok(Box::new(Mhgpo::new(s, "is")?))),   // search workload: fork G at every role (§3.5)
        entry("mhgpo-fof", |s| Ok(Box::new(Mhgpo::new(s, "fof")?))), // search workload: fork G at the Rewriter
        entry("mhgpo-rr", |s| Ok(Box::new(Mhgpo::new(s, "rr")?))),   // search workload: fork at a random role
        entry("mappo", |s| Ok(Box::new(Mappo::new(s)?))),             // search workload: PPO with a value head, GAE
        entry("atgrpo", |s| Ok(Box::new(Atgrpo::new(s, "atgrpo")?))),           // turn-wise workload: K branches per (task, agent, turn) (§5)
        entry("mas-grpo", |s| Ok(Box::new(Atgrpo::new(s, "mas-grpo")?))),       // turn-wise workload: K whole trajectories per task
        entry("single-grpo", |s| Ok(Box::new(Atgrpo::new(s, "single-grpo")?))), // turn-wise workload: the plan role alone
    ]
}

/// The registered names.
pub fn names() -> Vec<&'static str> {
    entries::<crate::backend::Cpu>().iter().map(|e| e.name).collect()
}

/// Checks that `name` is registered; the error lists the known names.
pub fn check(name: &str) -> Result<()> {
    if names().contains(&name) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("unknown algorithm {name:?}; known: {}", names().join(", "))))
}

/// The algorithm `name` with `settings`.
pub fn build<B: Backend>(name: &str, settings: &AlgoSettings) -> Result<Box<dyn Algorithm<B>>> {
    check(name)?;
    let entry = entries::<B>().into_iter().find(|e| e.name == name).expect("checked above");
    (entry.build)(settings)
}

/// The batch shape algorithm `name` trains with (GSPO×2 doubles the group), for readers of a
/// run such as `hacpo report`.
pub fn batch_shape(
    name: &str,
    settings: &AlgoSettings,
    requested: super::algorithm::BatchShape,
) -> Result<super::algorithm::BatchShape> {
    build::<crate::backend::Cpu>(name, settings)?.shape(requested)
}
