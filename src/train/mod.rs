//! Training machinery shared by every algorithm: the optimizer and schedule
//! ([`optim`]), checkpoints and resume ([`checkpoint`]), metrics sinks ([`metrics`],
//! [`tensorboard`]). It knows nothing about which algorithm computes the loss.

pub mod checkpoint;
pub mod interrupt;
pub mod metrics;
pub mod optim;
pub mod sft;
pub mod tensorboard;
