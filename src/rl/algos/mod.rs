//! The algorithms of the registry, one file each (see `super::registry`).

pub mod atgrpo;
pub mod drgrpo;
pub mod grpo;
pub mod gspo;
pub mod hacpo;
pub mod mappo;
pub mod mgrpo;
pub mod mhgpo;
pub mod sequence;
