//! The delegation workload's parts (M-GRPO, docs/algorithms.md §4): a main agent that works
//! over turns and hands tasks to search sub-agents, which work over turns with tools over the
//! local corpus and return their findings.
//!
//! [`protocol`] reads a turn (a tool call or a result, hostile outputs included),
//! [`conversation`] keeps an agent's turns as one token sequence with a loss mask, [`team`]
//! plays the episodes (main turns, delegations, sub-agents' searches), [`relay`] splits them
//! between two processes (the main agent's and the sub-agent's trainers), [`judge`] scores a
//! sub-agent's research for the reward's judge term. The reward, alignment
//! and advantage arithmetic lives in `rl::mgrpo`; the trainer's workload is
//! `workload::delegate`.

pub mod conversation;
pub mod judge;
pub mod protocol;
pub mod relay;
pub mod team;
