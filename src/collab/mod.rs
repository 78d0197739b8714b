//! The HACPO runtime: agents, the rollout pool, views across tokenizers, learner updates and
//! the training loop.
//!
//! Data flow of one step (ARCHITECTURE.md): every [`Agent`] samples on its own thread →
//! [`RolloutPool`] (everyone receives everything) → capability tracker → each learner builds
//! its [`views`](view) of the pool and updates ([`update`]) → metrics and checkpoints
//! ([`trainer`]).

pub mod agent;
pub mod pool;
pub mod rollout;
pub mod trainer;
pub mod update;
pub mod view;

pub use agent::Agent;
pub use pool::RolloutPool;
pub use rollout::Rollout;
pub use trainer::{RunSummary, Trainer};
