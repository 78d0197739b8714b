//! The algorithm registry: every algorithm `algo.name` can select, looked up by name.
//!
//! Adding an algorithm is a file in `rl/algos/`, one line here and, if it has settings of its
//! own, a table in [`AlgoSettings`](super::AlgoSettings) (see `docs/architecture.md`). Each
//! line also says which rollouts the algorithm learns from ([`RolloutShape`]): that, not the
//! algorithm object, decides which workload can train it.

use burn::tensor::backend::Backend;

use super::algorithm::{AlgoSettings, Algorithm};
use super::algos::{
    atgrpo::Atgrpo, drgrpo::DrGrpo, grpo::Grpo, gspo::Gspo, hacpo::Hacpo, mappo::Mappo, mgrpo::Mgrpo, mhgpo::Mhgpo,
};
use super::atgrpo::{Grouping, TurnRollout};
use super::mgrpo::SubAgent;
use super::mhgpo::{Credit, Fork};
use crate::error::{Error, Result};

/// The rollouts an algorithm learns from. Static: known from the name alone, without a
/// backend or settings; the workload that produces them owns the settings of their shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutShape {
    /// Each policy answers each prompt G times; the samples form one pool per step.
    Pool,
    /// A pipeline's outputs branched into a tree per question, rewards carried up it.
    Tree { fork: Fork, credit: Credit },
    /// A team's episodes over turns.
    Turns(TurnRollout),
    /// A main agent's episodes, with its sub-agent trained, frozen or absent.
    Delegate(SubAgent),
}

/// Builds an algorithm from the run's settings.
type Build<B> = fn(&AlgoSettings) -> Result<Box<dyn Algorithm<B>>>;

/// One registered algorithm.
pub struct Entry<B: Backend> {
    pub name: &'static str,
    pub shape: RolloutShape,
    pub build: Build<B>,
}

fn entry<B: Backend>(name: &'static str, shape: RolloutShape, build: Build<B>) -> Entry<B> {
    Entry { name, shape, build }
}

use RolloutShape::Pool;
const fn tree(fork: Fork) -> RolloutShape {
    RolloutShape::Tree { fork, credit: Credit::Propagated }
}
const fn turns(grouping: Grouping, single_agent: bool) -> RolloutShape {
    RolloutShape::Turns(TurnRollout { grouping, single_agent })
}

/// Every algorithm, in the order errors list them: one line each.
#[rustfmt::skip]
pub fn entries<B: Backend>() -> Vec<Entry<B>> {
    vec![
        entry("hacpo", Pool, |s| Ok(Box::new(Hacpo::new(s, false)?))), // every policy learns from every policy's samples (§2)
        entry("gspo", Pool, |s| Ok(Box::new(Gspo::new(s, false)?))),   // each policy alone, sequence-level ratio (§1.2)
        entry("grpo", Pool, |s| Ok(Box::new(Grpo::new(s)?))),          // each policy alone, token-level ratio (§1.1)
        entry("gspo2x", Pool, |s| Ok(Box::new(Gspo::new(s, true)?))),  // GSPO with twice the samples and updates
        entry("naive", Pool, |s| Ok(Box::new(Hacpo::new(s, true)?))),  // sharing with every HACPO mechanism off
        entry("drgrpo", Pool, |s| Ok(Box::new(DrGrpo::new(s)?))),      // no std division, token sums / a constant length
        entry("mhgpo-is", tree(Fork::Is), |s| Ok(Box::new(Mhgpo::new(s, "mhgpo-is")?))),   // fork G at every role (§3.5)
        entry("mhgpo-fof", tree(Fork::Fof), |s| Ok(Box::new(Mhgpo::new(s, "mhgpo-fof")?))), // fork G at the Rewriter
        entry("mhgpo-rr", tree(Fork::Rr), |s| Ok(Box::new(Mhgpo::new(s, "mhgpo-rr")?))),   // fork at a random role
        // PPO with a value head and GAE; G independent trajectories, each output rewarded with
        // the team's F1 plus its own penalty (MMOA-RAG).
        entry("mappo", RolloutShape::Tree { fork: Fork::Fof, credit: Credit::OwnPenalty }, |s| Ok(Box::new(Mappo::new(s)?))),
        entry("atgrpo", turns(Grouping::TurnWise, false), |s| Ok(Box::new(Atgrpo::new(s, "atgrpo")?))),            // K branches per (task, agent, turn) (§5)
        entry("mas-grpo", turns(Grouping::Trajectory, false), |s| Ok(Box::new(Atgrpo::new(s, "mas-grpo")?))),      // K whole trajectories per task
        entry("single-grpo", turns(Grouping::Trajectory, true), |s| Ok(Box::new(Atgrpo::new(s, "single-grpo")?))), // the plan role alone
        entry("mgrpo", RolloutShape::Delegate(SubAgent::Trained), |s| Ok(Box::new(Mgrpo::new(s, "mgrpo")?))),                   // main and sub-agent co-trained (§4)
        entry("mgrpo-main-only", RolloutShape::Delegate(SubAgent::Frozen), |s| Ok(Box::new(Mgrpo::new(s, "mgrpo-main-only")?))), // the sub-agent frozen
        entry("search-grpo", RolloutShape::Delegate(SubAgent::None), |s| Ok(Box::new(Mgrpo::new(s, "search-grpo")?))),          // one agent with the search tools
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

/// Every algorithm's name and the rollouts it learns from, in registry order.
pub fn shapes() -> Vec<(&'static str, RolloutShape)> {
    entries::<crate::backend::Cpu>().into_iter().map(|e| (e.name, e.shape)).collect()
}

/// The rollouts algorithm `name` learns from.
pub fn shape(name: &str) -> Result<RolloutShape> {
    check(name)?;
    Ok(shapes().into_iter().find(|(n, _)| *n == name).expect("checked above").1)
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
