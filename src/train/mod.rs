//! Training machinery shared by every algorithm: the optimizer and schedule
//! ([`optim`]), checkpoints and resume ([`checkpoint`]), metrics sinks ([`metrics`],
//! [`tensorboard`]), the value head of actor-critic algorithms ([`critic`]), gradient
//! checkpointing ([`recompute`]), the parameters' autodiff graph ([`autodiff_graph`]). It knows nothing
//! about which algorithm computes the loss.

pub mod autodiff_graph;
pub mod checkpoint;
pub mod critic;
pub mod interrupt;
pub mod loss_scale;
pub mod metrics;
pub mod optim;
pub mod recompute;
pub mod sft;
pub mod tensorboard;
