//! The delegation workload's parts (M-GRPO, docs/algorithms.md §4): a main agent that works
//! over turns and hands tasks to search sub-agents, which work over turns with tools over the
//! local corpus and return their findings.
//!
//! [`protocol`] reads a turn (a tool call or a result, hostile outputs included). The reward,
//! alignment and advantage arithmetic lives in `rl::mgrpo`.

pub mod protocol;
