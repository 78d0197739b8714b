//! The RL algorithm core: GRPO, GSPO, HACPO, MHGPO and M-GRPO (docs/algorithms.md §1–4).
//!
//! - [`stats`]: group statistics, GRPO advantages; [`records`]: what advantages and metrics
//!   read of a response, for every algorithm;
//! - [`capability`]: the capability tracker P̂ and ratios ω;
//! - [`objective`]: per-token and per-sequence objectives with analytic gradients, KL k3,
//!   loss aggregation;
//! - [`hacpo`]: HACPO's advantages, per-response terms and mini-batch ordering, each
//!   mechanism switchable;
//! - [`tensor`]: the same losses as burn tensor expressions for autodiff training;
//! - [`inspect`]: `hacpo rl inspect`, which explains what HACPO does to a batch;
//! - [`algorithm`]: the [`Algorithm`] trait the trainer uses, [`registry`] the algorithms
//!   by name, [`algos`] one file per algorithm (HACPO, naive, GSPO, GSPO×2, GRPO, Dr. GRPO,
//!   MHGPO's three samplings);
//! - [`mhgpo`]: MHGPO's rollout trees, reward propagation and heterogeneous-group advantages;
//! - [`mgrpo`]: M-GRPO's rewards, trajectory alignment and main/sub advantages;
//! - [`atgrpo`]: AT-GRPO's turn-wise group keys, mixed rewards and branch selection.
//!
//! The scalar core is plain f64 Rust, testable without a model; the tensor side is checked
//! against it. Nothing here knows about threads or files (inspect parses a string).

pub mod algorithm;
pub mod algos;
pub mod atgrpo;
pub mod capability;
pub mod hacpo;
pub mod inspect;
pub mod mappo;
pub mod mgrpo;
pub mod mhgpo;
pub mod objective;
pub mod records;
pub mod registry;
pub mod stats;
pub mod tensor;

pub use algorithm::{AlgoSettings, Algorithm, BatchShape, DrGrpoSettings, HacpoSettings, Routing};
pub use capability::{Capabilities, CapabilityConfig, CapabilityTracker};
pub use hacpo::{HacpoConfig, MinibatchOrder};
pub use objective::LossAggregation;
pub use records::{PoolSample, SampleTerms};
