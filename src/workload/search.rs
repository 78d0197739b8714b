//! The multi-agent search workload (`workload.kind = "search"`, docs/algorithms.md §3): each
//! question's rollouts form an MHGPO tree over the pipeline Rewriter → BM25 retriever →
//! Reranker → Answerer, branched as the algorithm's registered shape says (IS, FoF or RR),
//! rewards credited as it says (MHGPO's propagation, or MAPPO's team outcome plus each
//! output's own penalty).
//!
//! ```text
//! plan trees (seeded per question) ─▶ Rewriter outputs of every tree ─▶ retrieval
//!   ─▶ Reranker outputs ─▶ Answerer outputs ─▶ F1 + penalties ─▶ rewards propagated upwards
//! ```
//!
//! Roles run level by level over all questions at once, so each level is one batched
//! generation by the policy that plays the role: one policy for all three roles (the paper's
//! setting) or one per role through `[[roles]]` (say a Qwen Rewriter with a Llama Answerer).
//! Every output is a [`Sample`] whose group is (question, fork, role) and whose parent is the
//! output it read. The reward stage propagates `R = Aggr(successors' R) + P` from the
//! Answerer's F1 upwards and marks which outputs train: singletons (RR's upstream chain) and
//! IS's downstream continuations only carry rewards.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::roles::RoleMap;
use super::{Rollout, RolloutSettings, RolloutTimings, ValidationSettings, Workload, encode_within, sample_in_chunks};
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::policy::{Policy, held};
use crate::rl::mhgpo::{self, Aggregate, Credit, Fork, MhgpoSettings, Node, Sampling};
use crate::sample::{GroupKey, Sample};
use crate::search::corpus::Question;
use crate::search::metric::score;
use crate::search::pipeline::{self, Role, contains_answer};
use crate::search::retriever::candidates;
use crate::search::roles::{Penalties, read_answerer, read_reranker, read_rewriter};
use crate::search::task::QaTask;
use crate::search::task::{Passages, answers, question_text};
use crate::stable_hash::mix_seed;
use crate::task::{Task, TaskPrompt};
use crate::tokenizer::Message;
use crate::train::metrics::Metrics;

/// `[workload.search]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// Format penalties (`[workload.search.penalties]`; MMOA-RAG's values by default).
    pub penalties: Penalties,
    /// How an output's successors' rewards combine under MHGPO's credit: `mean` (default),
    /// `max` or `min` (docs/algorithms.md §3.3).
    pub aggregate: Aggregate,
    /// Propagate the successors' format penalties upwards (the recursion of §3.3) or only
    /// their task reward.
    pub propagate_penalties: bool,
    /// `mhgpo-rr`: the probability of forking at the Rewriter, Reranker and Answerer (§3.5).
    pub rr_probabilities: [f64; 3],
}

impl Default for SearchConfig {
    fn default() -> Self {
        let Sampling::Rr { probabilities } = Sampling::RR_DEFAULT else { unreachable!() };
        SearchConfig {
            penalties: Penalties::default(),
            aggregate: Aggregate::Mean,
            propagate_penalties: true,
            rr_probabilities: probabilities,
        }
    }
}

impl SearchConfig {
    pub fn validate(&self) -> Result<()> {
        Fork::Rr
            .sampling(self.rr_probabilities)
            .validate(Role::ALL.len())
            .map_err(|e| Error::config("training config", format!("workload.search.rr_probabilities: {e}")))?;
        let p = &self.penalties;
        let bad =
            |key: &str, m: &str| Err(Error::config("training config", format!("workload.search.penalties.{key}: {m}")));
        for (key, v) in [("rewriter", p.rewriter), ("reranker", p.reranker), ("answerer", p.answerer)] {
            if !(v.is_finite() && v <= 0.0) {
                return bad(key, &format!("a penalty is a number ≤ 0, not {v}"));
            }
        }
        if p.rewriter_max_chars == 0 || p.answerer_max_words == 0 {
            return bad("rewriter_max_chars", "rewriter_max_chars and answerer_max_words must be positive");
        }
        Ok(())
    }
}

/// Seeds the tree plans apart from generation.
const TREE_STREAM: u64 = 0x7EE5;
const GENERATE_STREAM: u64 = 0x5EA2C4;

/// The pipeline as a workload.
pub struct Search {
    task: Arc<dyn Task>,
    passages: Arc<Passages>,
    /// The policy that plays each role, in [`Role::ALL`] order.
    players: [usize; 3],
    sampling: Sampling,
    /// Propagation settings of the rewards (only the mask is read of the advantages).
    credit: MhgpoSettings,
    penalties: Penalties,
}

/// The pipeline position of a sample's role.
fn role_index(s: &Sample) -> Result<usize> {
    Role::ALL
        .iter()
        .position(|r| r.name() == s.role)
        .ok_or_else(|| Error::Internal(format!("a search sample in role {:?}", s.role)))
}

/// Who plays each role, in [`Role::ALL`] order.
pub fn players(roles: &RoleMap) -> Result<[usize; 3]> {
    let names = Role::ALL.map(|r| r.name());
    let p = roles.players("search", &names, &[0, 1, 2])?;
    Ok([0, 1, 2].map(|r| p[r].expect("every role is needed")))
}

/// One output of a tree while it is being rolled out.
struct TreeNode {
    prompt: usize,
    local: usize,
    role: usize,
    parent: Option<usize>,
    group: String,
    trained: bool,
    /// Rewriter: the retrieved candidates; Reranker: the chosen ones (corpus positions).
    passages: Vec<usize>,
    /// How many of the upstream passages its prompt showed (all unless they did not fit).
    shown: usize,
    /// Its position in the step's samples.
    sample: usize,
}

impl Search {
    /// The pipeline over `task`'s passages, branched at `fork`, rewards credited as `credit`.
    pub fn new(
        config: &SearchConfig,
        roles: &RoleMap,
        task: Arc<dyn Task>,
        fork: Fork,
        credit: Credit,
    ) -> Result<Self> {
        config.validate()?;
        let any: &dyn std::any::Any = task.as_ref();
        let passages = any.downcast_ref::<QaTask>().map(QaTask::passages).ok_or_else(|| {
            Error::config("training config", "the search workload needs a task with passages: task.kind = \"qa\"")
        })?;
        let credit = match credit {
            Credit::Propagated => MhgpoSettings {
                aggregate: config.aggregate,
                propagate_penalties: config.propagate_penalties,
                ..MhgpoSettings::default()
            },
            // The mean of one chain's leaf is its F1 (FoF), never a successor's penalty.
            Credit::OwnPenalty => {
                MhgpoSettings { aggregate: Aggregate::Mean, propagate_penalties: false, ..MhgpoSettings::default() }
            }
        };
        Ok(Search {
            players: players(roles)?,
            task,
            passages,
            sampling: fork.sampling(config.rr_probabilities),
            credit,
            penalties: config.penalties,
        })
    }

    /// The messages and prompt ids of tree node `i` in `policy`'s template, and how many of
    /// the upstream passages they show ([`fit_passages`]).
    fn fit<B: Backend>(
        &self,
        policy: &Policy<B>,
        nodes: &[TreeNode],
        i: usize,
        prompts: &[TaskPrompt],
        max_tokens: usize,
    ) -> Result<(Vec<Message>, Vec<u32>, usize)> {
        let n = &nodes[i];
        let upstream = n.parent.map_or(&[][..], |p| nodes[p].passages.as_slice());
        let question = question_text(&prompts[n.prompt]);
        fit_passages(policy, Role::ALL[n.role], question, &self.passages.documents, upstream, max_tokens)
    }

    /// Penalty, score and passages of an output of node `i` (retrieval after the Rewriter).
    fn read(
        &self,
        nodes: &[TreeNode],
        i: usize,
        text: &str,
        prompt: &TaskPrompt,
    ) -> Result<(f64, Option<f64>, Vec<usize>)> {
        let n = &nodes[i];
        let upstream = n.parent.map_or(&[][..], |p| &nodes[p].passages[..n.shown]);
        Ok(match Role::ALL[n.role] {
            Role::Rewriter => {
                let (queries, penalty) = read_rewriter(text, &self.penalties);
                (penalty, None, candidates(&self.passages.retriever, question_text(prompt), &queries)?)
            }
            Role::Reranker => {
                let (selected, penalty) = read_reranker(text, upstream.len(), &self.penalties);
                (penalty, None, selected.iter().map(|&k| upstream[k]).collect())
            }
            Role::Answerer => {
                let (answer, penalty) = read_answerer(text, &self.penalties);
                (penalty, Some(score(&answer, &answers(prompt)).f1), vec![])
            }
        })
    }
}

/// Homogenisation within groups: the mean over groups of two or more outputs of the mean
/// pairwise Jaccard similarity of their token sets (1: a group of identical outputs, which
/// leaves group-relative advantages nothing to compare).
fn group_similarity<'a>(outputs: impl IntoIterator<Item = (&'a GroupKey, &'a [u32])>) -> f64 {
    let mut groups: std::collections::BTreeMap<&GroupKey, Vec<std::collections::BTreeSet<u32>>> = Default::default();
    for (group, ids) in outputs {
        groups.entry(group).or_default().push(ids.iter().copied().collect());
    }
    let per_group: Vec<f64> = groups
        .values()
        .filter(|g| g.len() > 1)
        .map(|g| {
            let mut total = (0.0, 0);
            for i in 0..g.len() {
                for j in i + 1..g.len() {
                    let union = g[i].union(&g[j]).count();
                    total.0 += if union == 0 { 1.0 } else { g[i].intersection(&g[j]).count() as f64 / union as f64 };
                    total.1 += 1;
                }
            }
            total.0 / total.1 as f64
        })
        .collect();
    if per_group.is_empty() { 0.0 } else { per_group.iter().sum::<f64>() / per_group.len() as f64 }
}

/// The messages and prompt ids of a `role` prompt in `policy`'s template showing as many of
/// `passages` as fit `max_tokens` (the last ones dropped), and how many that is. Retrieved
/// passages vary in length, and a run must not stop (nor its resumption stop again at the same
/// step) because one draw retrieved long ones; a prompt too long without any passage is the
/// user's to fix ([`encode`]'s error).
fn fit_passages<B: Backend>(
    policy: &Policy<B>,
    role: Role,
    question: &str,
    documents: &[crate::search::corpus::Document],
    passages: &[usize],
    max_tokens: usize,
) -> Result<(Vec<Message>, Vec<u32>, usize)> {
    let mut shown = passages.len();
    loop {
        let messages = pipeline::messages(role, question, documents, &passages[..shown]);
        if shown == 0 {
            let ids = encode(policy, role, &messages, max_tokens)?;
            return Ok((messages, ids, 0));
        }
        let ids = policy.encode_prompt(&messages, usize::MAX)?;
        if ids.len() <= max_tokens {
            return Ok((messages, ids, shown));
        }
        shown -= 1;
    }
}

/// `messages` in `policy`'s chat template; a prompt longer than `max_tokens` is an error
/// rather than a cut (a cut would drop the instructions and the question, not the passages).
fn encode<B: Backend>(policy: &Policy<B>, role: Role, messages: &[Message], max_tokens: usize) -> Result<Vec<u32>> {
    let hint = format!(
        " (the Reranker sees up to {} passages of up to {} characters) or use a corpus with shorter passages",
        crate::search::roles::RETRIEVAL_BUDGET,
        pipeline::PASSAGE_CHARS
    );
    encode_within(policy, role.name(), messages, max_tokens, &hint)
}

impl<B: Backend> Workload<B> for Search {
    fn name(&self) -> &str {
        "search"
    }

    fn validation_key(&self) -> &'static str {
        "val/f1"
    }

    fn rollout(&self, policies: &[Policy<B>], prompts: &[TaskPrompt], settings: &RolloutSettings) -> Result<Rollout> {
        let mut nodes: Vec<TreeNode> = Vec::new();
        for p in 0..prompts.len() {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(&[
                settings.run_seed,
                settings.step,
                TREE_STREAM,
                p as u64,
            ]));
            let plan = mhgpo::plan(self.sampling, Role::ALL.len(), settings.group_size, &mut rng)
                .map_err(|e| Error::config("training config", e))?;
            let base = nodes.len();
            nodes.extend(plan.into_iter().enumerate().map(|(local, n)| TreeNode {
                prompt: p,
                local,
                role: n.role,
                parent: n.parent.map(|q| base + q),
                group: n.group,
                trained: n.trained,
                passages: vec![],
                shown: 0,
                sample: 0,
            }));
        }
        let mut samples = Vec::with_capacity(nodes.len());
        let mut timings = vec![RolloutTimings::default(); settings.policies];
        let mut dropped = 0;
        for (role, r) in Role::ALL.iter().enumerate() {
            let level: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].role == role).collect();
            let policy = held(policies, self.players[role])?;
            let _span =
                tracing::info_span!("rollout", policy = %policy.name, role = r.name(), step = settings.step).entered();
            let mut messages = Vec::with_capacity(level.len());
            let mut ids = Vec::with_capacity(level.len());
            for &i in &level {
                let (m, p, shown) = self.fit(policy, &nodes, i, prompts, settings.max_prompt_tokens)?;
                dropped += nodes[i].parent.map_or(0, |q| nodes[q].passages.len()) - shown;
                nodes[i].shown = shown;
                messages.push(m);
                ids.push(p);
            }
            let seed = |c: usize| mix_seed(&[settings.run_seed, settings.step, GENERATE_STREAM, role as u64, c as u64]);
            let outputs = sample_in_chunks(policy, &ids, settings, 1, seed, &mut timings[self.players[role]])?;
            for (((&i, messages), ids), out) in level.iter().zip(messages).zip(ids).zip(outputs) {
                let prompt = &prompts[nodes[i].prompt];
                let (penalty, score, passages) = self.read(&nodes, i, &out.response.text, prompt)?;
                let n = &mut nodes[i];
                n.passages = passages;
                n.sample = samples.len();
                let (parent, p, local, trained) = (n.parent, n.prompt, n.local, n.trained);
                let group = GroupKey::new(&[&prompt.id, &p.to_string(), &n.group]);
                samples.push(Sample {
                    role: r.name().to_string(),
                    group,
                    parent: parent.map(|q| nodes[q].sample),
                    sample_index: local,
                    penalty,
                    score,
                    train: trained,
                    ..Sample::new(policy.index, policy.version, p, messages, ids, out.response)
                });
            }
        }
        let gold: Vec<Vec<String>> = prompts.iter().map(answers).collect();
        let share = |role: Role| {
            let mine: Vec<&TreeNode> = nodes.iter().filter(|n| n.role == role.index()).collect();
            let hits = mine
                .iter()
                .filter(|n| n.passages.iter().any(|&d| contains_answer(&self.passages.documents[d], &gold[n.prompt])))
                .count();
            hits as f64 / mine.len().max(1) as f64
        };
        let mut metrics = Metrics::new();
        metrics.insert("search/dropped_passages".into(), dropped as f64);
        metrics.insert("search/retrieval_recall".into(), share(Role::Rewriter));
        metrics.insert("search/selected_recall".into(), share(Role::Reranker));
        Ok(Rollout { samples, timings, metrics })
    }

    /// Propagates each tree's rewards upwards and masks what has no baseline (§3.3, §3.5).
    fn assign_rewards(&self, samples: &mut [Sample], prompts: &[TaskPrompt]) -> Result<()> {
        let mut trees: Vec<Vec<usize>> = vec![vec![]; prompts.len()];
        for (i, s) in samples.iter().enumerate() {
            trees[s.prompt].push(i);
        }
        for members in &mut trees {
            // Plan order: a parent before its children, and a node's index is its sample_index.
            members.sort_by_key(|&i| samples[i].sample_index);
            let nodes: Vec<Node> = members
                .iter()
                .map(|&i| {
                    let s = &samples[i];
                    Ok(Node {
                        role: role_index(s)?,
                        parent: s.parent.map(|q| samples[q].sample_index),
                        penalty: s.penalty,
                        score: s.score,
                        group: s.group.0.clone(),
                        trained: s.train,
                    })
                })
                .collect::<Result<_>>()?;
            let rewards = mhgpo::propagate(&nodes, &self.credit).map_err(Error::Internal)?;
            let (_, mask) = mhgpo::advantages(&nodes, &rewards, &self.credit);
            for (k, &i) in members.iter().enumerate() {
                samples[i].reward = Some(rewards[k]);
                samples[i].train = mask[k];
            }
        }
        Ok(())
    }

    /// The team's answers (F1, EM over every Answerer output) and each role's rewards,
    /// penalty rate and number of trained outputs.
    fn metrics(&self, samples: &[Sample], prompts: &[TaskPrompt]) -> Metrics {
        let mut m = Metrics::new();
        let mean = |xs: &[f64]| if xs.is_empty() { 0.0 } else { xs.iter().sum::<f64>() / xs.len() as f64 };
        let answerer: Vec<&Sample> = samples.iter().filter(|s| s.role == Role::Answerer.name()).collect();
        let f1: Vec<f64> = answerer.iter().filter_map(|s| s.score).collect();
        let em: Vec<f64> = answerer
            .iter()
            .map(|s| score(&read_answerer(&s.text, &self.penalties).0, &answers(&prompts[s.prompt])).em)
            .collect();
        m.insert("search/f1".into(), mean(&f1));
        m.insert("search/em".into(), mean(&em));
        // A tree's outputs, not questions × G: what the step sampled (reports count rollouts by it).
        m.insert("search/outputs".into(), samples.len() as f64);
        for role in Role::ALL {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.role == role.name()).collect();
            let rewards: Vec<f64> = mine.iter().map(|s| s.reward()).collect();
            let penalised: Vec<f64> = mine.iter().map(|s| (s.penalty < 0.0) as u8 as f64).collect();
            m.insert(format!("search/{}/reward", role.name()), mean(&rewards));
            m.insert(format!("search/{}/penalty_rate", role.name()), mean(&penalised));
            m.insert(format!("search/{}/trained", role.name()), mine.iter().filter(|s| s.train).count() as f64);
            let lengths: Vec<f64> = mine.iter().map(|s| s.response_ids.len() as f64).collect();
            m.insert(format!("search/{}/response_length", role.name()), mean(&lengths));
            m.insert(
                format!("search/{}/group_similarity", role.name()),
                group_similarity(mine.iter().map(|s| (&s.group, s.response_ids.as_slice()))),
            );
        }
        let queries: Vec<f64> = samples
            .iter()
            .filter(|s| s.role == Role::Rewriter.name())
            .map(|s| read_rewriter(&s.text, &self.penalties).0.len() as f64)
            .collect();
        m.insert("search/sub_queries".into(), mean(&queries));
        m
    }

    /// The team answers the held-out questions greedily; every policy gets the team's numbers.
    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>> {
        let questions: Vec<Question> = self
            .task
            .validation()
            .iter()
            .map(|p| Question { id: p.id.clone(), question: question_text(p).to_string(), answers: answers(p) })
            .collect();
        let mut generate = |role: Role, prompts: &[Vec<Message>]| -> Result<Vec<String>> {
            let policy = held(policies, self.players[role.index()])?;
            let ids: Vec<Vec<u32>> =
                prompts.iter().map(|m| encode(policy, role, m, settings.max_prompt_tokens)).collect::<Result<_>>()?;
            greedy_responses(
                &policy.inference_model(),
                &policy.tokenizer,
                &policy.eos_token_ids,
                &ids,
                settings.max_new_tokens,
                settings.batch_prompts,
            )
        };
        // As in training, passages that do not fit the prompt limit are left out.
        let fit = |role: Role, question: &str, passages: &[usize]| -> Result<usize> {
            let policy = held(policies, self.players[role.index()])?;
            let documents = &self.passages.documents;
            Ok(fit_passages(policy, role, question, documents, passages, settings.max_prompt_tokens)?.2)
        };
        let traces = pipeline::run(
            &mut generate,
            &self.passages.retriever,
            &self.passages.documents,
            &questions,
            &self.penalties,
            &fit,
        )?;
        let s = pipeline::summarize(&traces);
        let team = Metrics::from([
            ("val/f1".to_string(), s.f1),
            ("val/em".to_string(), s.em),
            ("val/retrieval_recall".to_string(), s.retrieval_recall),
            ("val/selected_recall".to_string(), s.selected_recall),
            ("val/rewriter_penalty_rate".to_string(), s.rewriter_penalty_rate),
            ("val/reranker_penalty_rate".to_string(), s.reranker_penalty_rate),
            ("val/answerer_penalty_rate".to_string(), s.answerer_penalty_rate),
        ]);
        Ok(vec![team; settings.policies])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_similarity_is_the_mean_pairwise_jaccard_over_groups_of_two_or_more() {
        let (a, b, c) = (GroupKey("a".into()), GroupKey("b".into()), GroupKey("c".into()));
        let outputs: Vec<(&GroupKey, &[u32])> = vec![
            (&a, &[1, 2]),
            (&a, &[1, 2]),
            (&a, &[1, 2]), // group a: identical outputs, 1
            (&b, &[1, 2]),
            (&b, &[2, 3]), // group b: {2} of {1, 2, 3}, 1/3
            (&c, &[7]),    // a singleton compares nothing
        ];
        assert!((group_similarity(outputs) - (1.0 + 1.0 / 3.0) / 2.0).abs() < 1e-12);
        assert_eq!(group_similarity(vec![(&c, &[7u32][..])]), 0.0);
    }

    #[test]
    fn penalties_must_be_non_positive() {
        let mut s = SearchConfig::default();
        assert!(s.validate().is_ok());
        s.penalties.reranker = 0.5;
        assert!(s.validate().unwrap_err().to_string().contains("reranker"));
        let rr = SearchConfig { rr_probabilities: [0.0; 3], ..SearchConfig::default() };
        assert!(rr.validate().unwrap_err().to_string().contains("workload.search.rr_probabilities"));
    }
}
