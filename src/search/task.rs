//! The QA task (`task.kind = "qa"`): questions with gold answers, and the passages they are
//! answered from, indexed once for the run. Played by the search workload; a prompt's gold
//! is its answers as a JSON array, so any answer alias scores.

use std::path::Path;
use std::sync::Arc;

use super::corpus::{Document, QaSet, Question, read_questions};
use super::kb::{Kb, KbConfig};
use super::metric::score;
use super::retriever::Bm25;
use super::roles::{Penalties, read_answerer};
use crate::error::{Error, Result};
use crate::task::{Splits, Task, TaskPrompt};
use crate::tokenizer::Message;

/// The passages of a run and their BM25 index.
pub struct Passages {
    pub documents: Vec<Document>,
    pub retriever: Bm25,
}

impl Passages {
    pub fn new(documents: Vec<Document>) -> Result<Self> {
        let retriever = Bm25::new(&documents)?;
        Ok(Passages { documents, retriever })
    }
}

/// Questions answered from passages; the reward of a bare answer is its F1.
pub struct QaTask {
    train: Vec<TaskPrompt>,
    validation: Vec<TaskPrompt>,
    passages: Arc<Passages>,
}

/// A question as a task prompt: the question as the user message, the answers as the gold.
pub fn question_prompt(q: &Question) -> TaskPrompt {
    TaskPrompt {
        id: q.id.clone(),
        messages: vec![Message::user(q.question.clone())],
        gold: serde_json::to_string(&q.answers).expect("strings serialise"),
    }
}

/// The question of a prompt made by [`question_prompt`].
pub fn question_text(prompt: &TaskPrompt) -> &str {
    prompt.messages.last().map_or("", |m| m.content.as_str())
}

/// The gold answers of a prompt made by [`question_prompt`].
pub fn answers(prompt: &TaskPrompt) -> Vec<String> {
    serde_json::from_str(&prompt.gold).unwrap_or_else(|_| vec![prompt.gold.clone()])
}

/// The generated knowledge base's name in `task.train` / `task.validation` (`[task.kb]`).
pub const TINY_KB: &str = "tiny-kb";

/// Questions (and passages, for a built-in set) of `spec`: `hotpotqa`, `musique`, `tiny-kb` or
/// a questions file, whose passages come from `task.corpus`.
/// `world` holds the generated knowledge base once a split has named it (generated once for both).
fn load(
    corpus: &str,
    kb: &KbConfig,
    world: &mut Option<Kb>,
    spec: &str,
    key: &str,
) -> Result<(Vec<Question>, Option<Vec<Document>>)> {
    if spec == TINY_KB {
        // The generated world: its training questions for task.train, its held-out ones for
        // task.validation.
        if world.is_none() {
            *world = Some(super::kb::generate(kb)?);
        }
        let kb = world.as_ref().expect("generated above");
        let items = if key == "task.train" { &kb.train } else { &kb.heldout };
        return Ok((Kb::questions(items), Some(kb.documents.clone())));
    }
    if let Some(set) = QaSet::parse(spec) {
        let (qs, docs) = set.load()?;
        return Ok((qs, Some(docs)));
    }
    if corpus.is_empty() {
        return Err(Error::config(
            "training config",
            format!(
                "{key} = {spec:?} is not a built-in set (hotpotqa, musique, {TINY_KB}); a questions file \
                 needs task.corpus = \"passages.jsonl\""
            ),
        ));
    }
    Ok((read_questions(Path::new(spec))?, None))
}

impl QaTask {
    /// Loads `task.train`, `task.validation` (optional) and the passages: `task.corpus` when
    /// given, else the built-in sets' own (both sets' when train and validation differ).
    pub fn load(splits: &Splits, corpus: &str, kb: &KbConfig) -> Result<Self> {
        let mut world = None;
        let (train, train_docs) = load(corpus, kb, &mut world, splits.train, "task.train")?;
        let (validation, val_docs) = if splits.validation.is_empty() {
            (vec![], None)
        } else {
            load(corpus, kb, &mut world, splits.validation, "task.validation")?
        };
        let documents = if corpus.is_empty() {
            let mut docs = train_docs.unwrap_or_default();
            for d in val_docs.unwrap_or_default() {
                if !docs.iter().any(|x| x.id == d.id) {
                    docs.push(d);
                }
            }
            docs
        } else {
            super::corpus::read_corpus(Path::new(corpus))?
        };
        let (train, validation) = splits.limit(train, validation);
        Self::new(train, validation, documents)
    }

    /// The passages the questions are answered from, with their index.
    pub fn passages(&self) -> Arc<Passages> {
        self.passages.clone()
    }

    pub fn new(train: Vec<Question>, validation: Vec<Question>, documents: Vec<Document>) -> Result<Self> {
        if train.is_empty() {
            return Err(Error::InvalidArgument("task.train holds no questions".into()));
        }
        Ok(QaTask {
            train: train.iter().map(question_prompt).collect(),
            validation: validation.iter().map(question_prompt).collect(),
            passages: Arc::new(Passages::new(documents)?),
        })
    }
}

impl Task for QaTask {
    fn name(&self) -> &str {
        "qa"
    }

    fn train(&self) -> &[TaskPrompt] {
        &self.train
    }

    fn validation(&self) -> &[TaskPrompt] {
        &self.validation
    }

    /// F1 of the answer read as the Answerer's is (inside `**…**`, else the first line).
    fn reward(&self, prompt: &TaskPrompt, response: &str) -> f64 {
        let (answer, _) = read_answerer(response, &Penalties::default());
        score(&answer, &answers(prompt)).f1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_carries_the_question_and_every_alias() {
        let q = Question { id: "7".into(), question: "Who?".into(), answers: vec!["Ann Lee".into(), "Ann".into()] };
        let p = question_prompt(&q);
        assert_eq!((question_text(&p), answers(&p)), ("Who?", q.answers.clone()));
        let task = QaTask::new(vec![q], vec![], super::super::corpus::jaws_corpus()).unwrap();
        assert_eq!(task.reward(&p, "**Ann**"), 1.0);
        // "ann lee did it" against "ann lee": precision 1/2, recall 1.
        assert!((task.reward(&p, "Ann Lee did it") - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(task.passages().documents.len(), 5);
    }

    #[test]
    fn a_questions_file_without_a_corpus_is_a_clear_error() {
        let cfg = crate::config::TaskConfig {
            kind: crate::config::TaskKind::Qa,
            train: "q.jsonl".into(),
            ..Default::default()
        };
        let e = QaTask::load(&cfg.splits(), &cfg.corpus, &cfg.kb).err().unwrap().to_string();
        assert!(e.contains("task.corpus") && e.contains("task.train"), "{e}");
    }
}
