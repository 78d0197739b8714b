//! hacpo: heterogeneous LLMs improving each other with reinforcement learning on verifiable
//! rewards (HACPO), and multi-agent LLM systems trained with RL.
//!
//! Module map (see `ARCHITECTURE.md` in the shared docs): [`model`] holds the transformer
//! families and their checkpoints, [`tokenizer`] tokenizers and chat templates, [`generate`]
//! the sampling engine and log-prob scoring. Higher layers (RL, collaboration, evaluation)
//! build on these.

pub mod alloc;
pub mod backend;
pub mod bench;
pub mod collab;
pub mod config;
pub mod data;
pub mod error;
pub mod eval;
pub mod generate;
pub mod math;
pub mod model;
pub mod plot;
pub mod report;
pub mod reward;
pub mod rl;
pub mod task;
pub mod tiny;
pub mod tokenizer;
pub mod train;

pub use error::{Error, Result};
