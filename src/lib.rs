//! hacpo: heterogeneous LLMs improving each other with reinforcement learning on verifiable
//! rewards (HACPO), and multi-agent LLM systems trained with RL.
//!
//! Module map (`docs/architecture.md`): [`model`] holds the transformer families and their
//! checkpoints, [`tokenizer`] tokenizers and chat templates, [`generate`] the sampling engine
//! and log-prob scoring; [`rl`] the algorithms (registry), [`workload`] what produces samples,
//! [`trainer`] the staged step over [`policy`] and [`sample`], [`run_dir`] a run's files,
//! [`session`] and [`study`] the training entry points.

pub mod alloc;
pub mod backend;
pub mod bench;
pub mod cache;
pub mod cluster;
pub mod config;
pub mod data;
pub mod delegate;
pub mod dtype;
pub mod env;
pub mod error;
pub mod eval;
pub mod generate;
pub mod math;
pub mod memory_plan;
pub mod model;
pub mod plot;
pub mod policy;
pub mod progress;
pub mod report;
pub mod resolve;
pub mod reward;
pub mod rl;
pub mod run_dir;
pub mod sample;
pub mod search;
pub mod session;
pub mod stable_hash;
pub mod study;
pub mod task;
pub mod tiny;
pub mod tokenizer;
pub mod train;
pub mod trainer;
pub mod workload;

pub use error::{Error, Result};
