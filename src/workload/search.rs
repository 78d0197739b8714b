//! The multi-agent search workload (`workload.kind = "search"`, ALGORITHMS.md §3): each
//! question's rollouts form an MHGPO tree over the pipeline Rewriter → BM25 retriever →
//! Reranker → Answerer, branched as the algorithm's sampling says (IS, FoF or RR).
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

use super::{RolloutSettings, RolloutTimings, ValidationSettings, Workload, mix_seed, sample_in_chunks};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::policy::Policy;
use crate::rl::mhgpo::{self, Node, TreeRollout};
use crate::sample::{GroupKey, Sample};
use crate::search::corpus::Question;
use crate::search::metric::score;
use crate::search::pipeline::{self, Role, contains_answer};
use crate::search::retriever::candidates;
use crate::search::roles::{Penalties, read_answerer, read_reranker, read_rewriter};
use crate::search::task::QaTask;
use crate::search::task::{Passages, answers, question_text};
use crate::task::{Task, TaskPrompt};
use crate::tokenizer::Message;
use crate::train::metrics::Metrics;

/// `[workload.search]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// Format penalties (`[workload.search.penalties]`; MMOA-RAG's values by default).
    pub penalties: Penalties,
}

impl SearchConfig {
    pub fn validate(&self) -> Result<()> {
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
    tree: TreeRollout,
    penalties: Penalties,
    /// What the last step's retrieval did (the trainer asks for metrics after the rollout).
    retrieval: std::sync::Mutex<RetrievalStats>,
}

/// The role a `[[roles]]` entry names.
fn role_index(name: &str) -> Option<usize> {
    Role::ALL.iter().position(|r| r.name() == name)
}

/// Who plays what: one policy for every role, or `[[roles]]` naming each role once with one
/// policy; every policy plays something.
fn players(cfg: &TrainConfig) -> Result<[usize; 3]> {
    let bad = |m: String| Err(Error::config("training config", m));
    let names = || Role::ALL.map(|r| r.name()).join(", ");
    if cfg.roles.is_empty() {
        if cfg.policies.len() != 1 {
            return bad(format!(
                "roles: with {} policies the search workload needs [[roles]] entries for {} naming the one policy that plays each",
                cfg.policies.len(),
                names()
            ));
        }
        return Ok([0; 3]);
    }
    let mut players = [None; 3];
    for (i, r) in cfg.roles.iter().enumerate() {
        let Some(k) = role_index(&r.name) else {
            return bad(format!("roles[{i}].name: the search workload's roles are {}, not {:?}", names(), r.name));
        };
        if players[k].is_some() {
            return bad(format!("roles[{i}].name: {:?} is given twice", r.name));
        }
        if r.template.is_some() {
            return bad(format!("roles[{i}].template: the search roles' prompts are built in; leave it out"));
        }
        let policy = match r.policies.as_slice() {
            [] if cfg.policies.len() == 1 => 0,
            [p] => cfg
                .policy_index(p)
                .ok_or_else(|| Error::config("training config", format!("roles[{i}].policies: no policy {p:?}")))?,
            _ => return bad(format!("roles[{i}].policies: one policy plays the {} role; name exactly one", r.name)),
        };
        players[k] = Some(policy);
    }
    let Some(players) = players.iter().copied().collect::<Option<Vec<usize>>>() else {
        let missing: Vec<&str> =
            Role::ALL.iter().zip(&players).filter(|(_, p)| p.is_none()).map(|(r, _)| r.name()).collect();
        return bad(format!("roles: no [[roles]] entry for {}", missing.join(", ")));
    };
    if let Some(k) = (0..cfg.policies.len()).find(|k| !players.contains(k)) {
        return bad(format!(
            "roles: policy {:?} plays no role; give it one or remove it from [[policies]]",
            cfg.policy_name(k)
        ));
    }
    Ok([players[0], players[1], players[2]])
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
    pub fn new(cfg: &TrainConfig, task: Arc<dyn Task>, tree: TreeRollout) -> Result<Self> {
        let any: &dyn std::any::Any = task.as_ref();
        let passages = any.downcast_ref::<QaTask>().map(QaTask::passages).ok_or_else(|| {
            Error::config("training config", "the search workload needs a task with passages: task.kind = \"qa\"")
        })?;
        Ok(Search {
            players: players(cfg)?,
            task,
            passages,
            tree,
            penalties: cfg.workload.search.penalties,
            retrieval: Default::default(),
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

/// What a step's retrieval did: passages left out to fit the prompt limit, and the share of
/// Rewriter outputs whose candidates (of Reranker outputs whose choice) hold a gold answer.
#[derive(Clone, Copy, Debug, Default)]
struct RetrievalStats {
    dropped: usize,
    recall: f64,
    selected_recall: f64,
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
    let ids = policy.encode_prompt(messages, usize::MAX)?;
    if ids.len() > max_tokens {
        return Err(Error::InvalidArgument(format!(
            "a {} prompt of policy {} has {} tokens, above rollout.max_prompt_tokens = {max_tokens}; raise it \
             (the Reranker sees up to {} passages of up to {} characters) or use a corpus with shorter passages",
            role.name(),
            policy.name,
            ids.len(),
            crate::search::roles::RETRIEVAL_BUDGET,
            pipeline::PASSAGE_CHARS
        )));
    }
    Ok(ids)
}

impl<B: Backend> Workload<B> for Search {
    fn name(&self) -> &str {
        "search"
    }

    fn validation_key(&self) -> &'static str {
        "val/f1"
    }

    fn rollout(
        &self,
        policies: &[Policy<B>],
        prompts: &[TaskPrompt],
        settings: &RolloutSettings,
    ) -> Result<(Vec<Sample>, Vec<RolloutTimings>)> {
        let mut nodes: Vec<TreeNode> = Vec::new();
        for p in 0..prompts.len() {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(mix_seed(&[
                settings.run_seed,
                settings.step,
                TREE_STREAM,
                p as u64,
            ]));
            let plan = mhgpo::plan(self.tree.sampling, Role::ALL.len(), settings.group_size, &mut rng)
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
        let mut timings = vec![RolloutTimings::default(); policies.len()];
        let mut dropped = 0;
        for (role, r) in Role::ALL.iter().enumerate() {
            let level: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].role == role).collect();
            let policy = &policies[self.players[role]];
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
                let (penalty, score, passages) = self.read(&nodes, i, &out.text, prompt)?;
                let n = &mut nodes[i];
                n.passages = passages;
                n.sample = samples.len();
                let (parent, p, local, trained) = (n.parent, n.prompt, n.local, n.trained);
                let group = GroupKey::new(&[&prompt.id, &p.to_string(), &n.group]);
                samples.push(Sample {
                    id: 0,
                    policy: policy.index,
                    role: r.name().to_string(),
                    group,
                    parent: parent.map(|q| nodes[q].sample),
                    turn: role as u32,
                    prompt: p,
                    sample_index: local,
                    messages,
                    text: out.text,
                    prompt_ids: ids,
                    response_ids: out.response_ids,
                    token_logps: vec![],
                    values: vec![],
                    reward: None,
                    penalty,
                    score,
                    train: trained,
                    policy_version: policy.version,
                    finish_reason: out.finish_reason,
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
        *self.retrieval.lock().expect("not poisoned") =
            RetrievalStats { dropped, recall: share(Role::Rewriter), selected_recall: share(Role::Reranker) };
        Ok((samples, timings))
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
                    Node {
                        role: s.turn as usize,
                        parent: s.parent.map(|q| samples[q].sample_index),
                        penalty: s.penalty,
                        score: s.score,
                        group: s.group.0.clone(),
                        trained: s.train,
                    }
                })
                .collect();
            let rewards = mhgpo::propagate(&nodes, &self.tree.settings).map_err(Error::Internal)?;
            let (_, mask) = mhgpo::advantages(&nodes, &rewards, &self.tree.settings);
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
        let answerer: Vec<&Sample> = samples.iter().filter(|s| s.turn as usize == Role::Answerer.index()).collect();
        let f1: Vec<f64> = answerer.iter().filter_map(|s| s.score).collect();
        let em: Vec<f64> = answerer
            .iter()
            .map(|s| score(&read_answerer(&s.text, &self.penalties).0, &answers(&prompts[s.prompt])).em)
            .collect();
        m.insert("search/f1".into(), mean(&f1));
        m.insert("search/em".into(), mean(&em));
        // A tree's outputs, not questions × G: what the step sampled (reports count rollouts by it).
        m.insert("search/outputs".into(), samples.len() as f64);
        for (k, role) in Role::ALL.iter().enumerate() {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.turn as usize == k).collect();
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
            .filter(|s| s.turn as usize == Role::Rewriter.index())
            .map(|s| read_rewriter(&s.text, &self.penalties).0.len() as f64)
            .collect();
        m.insert("search/sub_queries".into(), mean(&queries));
        let retrieval = *self.retrieval.lock().expect("not poisoned");
        m.insert("search/dropped_passages".into(), retrieval.dropped as f64);
        m.insert("search/retrieval_recall".into(), retrieval.recall);
        m.insert("search/selected_recall".into(), retrieval.selected_recall);
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
            let policy = &policies[self.players[role.index()]];
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
            let policy = &policies[self.players[role.index()]];
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
        Ok(vec![team; policies.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::{PolicyConfig, RoleConfig};

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

    fn cfg(policies: &[&str], roles: &[(&str, &[&str])]) -> TrainConfig {
        let policies =
            policies.iter().map(|m| PolicyConfig { name: Some(m.to_string()), ..PolicyConfig::new(*m) }).collect();
        let roles = roles
            .iter()
            .map(|(n, p)| RoleConfig {
                name: n.to_string(),
                policies: p.iter().map(|s| s.to_string()).collect(),
                template: None,
            })
            .collect();
        TrainConfig { policies, roles, ..Default::default() }
    }

    #[test]
    fn roles_map_to_one_policy_each() {
        assert_eq!(players(&cfg(&["a"], &[])).unwrap(), [0, 0, 0]);
        let per_role = cfg(&["a", "b"], &[("rewriter", &["a"]), ("reranker", &["a"]), ("answerer", &["b"])]);
        assert_eq!(players(&per_role).unwrap(), [0, 0, 1]);
        let err = |c: TrainConfig| players(&c).unwrap_err().to_string();
        assert!(err(cfg(&["a", "b"], &[])).contains("[[roles]]"));
        assert!(err(cfg(&["a"], &[("solver", &[])])).contains("not \"solver\""));
        assert!(err(cfg(&["a"], &[("rewriter", &[]), ("answerer", &[])])).contains("no [[roles]] entry for reranker"));
        assert!(
            err(cfg(&["a", "b"], &[("rewriter", &["c"]), ("reranker", &["a"]), ("answerer", &["b"])]))
                .contains("no policy \"c\"")
        );
        let idle = cfg(&["a", "b"], &[("rewriter", &["a"]), ("reranker", &["a"]), ("answerer", &["a"])]);
        assert!(err(idle).contains("\"b\" plays no role"));
        assert!(err(cfg(&["a"], &[("rewriter", &[]), ("rewriter", &[])])).contains("twice"));
    }

    #[test]
    fn penalties_must_be_non_positive() {
        let mut s = SearchConfig::default();
        assert!(s.validate().is_ok());
        s.penalties.reranker = 0.5;
        assert!(s.validate().unwrap_err().to_string().contains("reranker"));
    }
}
