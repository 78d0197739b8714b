//! The multi-agent search pipeline's parts (issue "the multi-agent search workload"):
//! Rewriter → retriever → Reranker → Answerer, in the spirit of MMOA-RAG.
//!
//! [`metric`] scores answers (HotpotQA/SQuAD EM and F1), [`corpus`] loads questions and
//! passages, [`retriever`] finds passages (BM25 over tantivy), [`roles`] holds the three roles'
//! prompts, output readers and format penalties, [`pipeline`] runs questions through the team
//! greedily, [`task`] is the QA task (questions, answers, indexed passages). The reward
//! arithmetic of MHGPO lives in `rl::mhgpo`; the trainer's workload is `workload::search`.

pub mod corpus;
pub mod kb;
pub mod metric;
pub mod pipeline;
pub mod retriever;
pub mod roles;
pub mod task;
