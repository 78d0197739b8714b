//! Verifiable tasks: prompts with a gold answer and a reward function.
//!
//! The trainer sees only the [`Task`] trait, so any task whose reward a program can check
//! plugs in; [`MathTask`] (math word problems graded by [`crate::reward`]) is the built-in one.
//! (A module of its own rather than part of `data`: a task joins a dataset to a reward.)

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::data::arith::{self, ArithConfig, ArithProblem};
use crate::data::{Benchmark, MathProblem, load_benchmark};
use crate::error::Result;
use crate::reward::{GradeConfig, GradeMode, Grader};
use crate::tokenizer::Message;

/// The instruction appended to every math question (Qwen2.5-Math's prompt).
pub const MATH_PROMPT: &str = "Please reason step by step, and put your final answer within \\boxed{}.";

/// The user message for a math question.
pub fn math_prompt_text(question: &str) -> String {
    format!("{}\n{MATH_PROMPT}", question.trim())
}

/// The task kinds `task.kind` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// Math benchmark files graded by the answer grader.
    Math,
    /// Generated arithmetic word problems (`[task.arith]`).
    Arith,
    /// Questions answered from passages (`train`/`validation`: `hotpotqa`, `musique` or a
    /// questions file with `corpus`), played by the search workload.
    Qa,
    /// Generated planning environments (`train`: `plan-path`, `sokoban` or `sudoku`; settings
    /// under `[task.env]`), played over turns by the turn-wise workload.
    Env,
}

impl TaskKind {
    /// `--task` on the command line.
    pub fn parse(s: &str) -> Result<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_lowercase()))
            .map_err(|_| crate::Error::InvalidArgument(format!("unknown task {s:?}; use math, arith, qa or env")))
    }
}

/// The `[task]` table of a training config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    pub kind: TaskKind,
    /// Training problems: a benchmark name (`math_train`, `gsm8k`, …), optionally `name=path`.
    pub train: String,
    pub grade_mode: GradeMode,
    /// Validation benchmark (`math500`), empty for none.
    pub validation: String,
    pub val_every: usize,
    pub val_limit: Option<usize>,
    /// Train on the first N training prompts only (a fixed instance set, e.g. to check that
    /// an algorithm raises the reward on prompts it can learn); unset: all of them.
    pub train_limit: Option<usize>,
    pub val_max_new_tokens: usize,
    /// The generator of the `arith` task.
    pub arith: ArithConfig,
    /// `qa`: the passages to search (JSON Lines `{"id", "title", "text"}`); empty: the
    /// built-in sets' own.
    pub corpus: String,
    /// The generated knowledge base of `train = "tiny-kb"`.
    pub kb: crate::search::kb::KbConfig,
    /// `env`: how many train and held-out instances.
    pub env: crate::env::task::EnvTaskConfig,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            kind: TaskKind::Math,
            train: "math_train".into(),
            grade_mode: GradeMode::Full,
            validation: String::new(),
            val_every: 3,
            val_limit: None,
            train_limit: None,
            val_max_new_tokens: 4096,
            arith: Default::default(),
            corpus: String::new(),
            kb: Default::default(),
            env: Default::default(),
        }
    }
}

/// The task a config describes.
pub fn from_config(cfg: &TaskConfig) -> Result<Arc<dyn Task>> {
    let task: Arc<dyn Task> = match cfg.kind {
        TaskKind::Arith => Arc::new(MathTask::arith(cfg)?),
        TaskKind::Math => Arc::new(MathTask::from_config(cfg)?),
        TaskKind::Qa => Arc::new(crate::search::task::QaTask::from_config(cfg)?),
        TaskKind::Env => Arc::new(crate::env::task::EnvTask::from_config(cfg)?),
    };
    Ok(match cfg.train_limit {
        Some(n) => Arc::new(Limited { inner: task, n }),
        None => task,
    })
}

/// A task trained on its first `n` training prompts (`task.train_limit`).
struct Limited {
    inner: Arc<dyn Task>,
    n: usize,
}

impl Task for Limited {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn train(&self) -> &[TaskPrompt] {
        let all = self.inner.train();
        &all[..self.n.min(all.len())]
    }

    fn validation(&self) -> &[TaskPrompt] {
        self.inner.validation()
    }

    fn reward(&self, prompt: &TaskPrompt, response: &str) -> f64 {
        self.inner.reward(prompt, response)
    }

    fn passages(&self) -> Option<Arc<crate::search::task::Passages>> {
        self.inner.passages()
    }
}

/// One prompt: the chat messages every agent renders with its own template, and the gold
/// answer the reward compares against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskPrompt {
    pub id: String,
    pub messages: Vec<Message>,
    pub gold: String,
}

/// A task with a verifiable reward.
pub trait Task: Send + Sync {
    fn name(&self) -> &str;
    /// Training prompts.
    fn train(&self) -> &[TaskPrompt];
    /// Held-out prompts for validation (may be empty).
    fn validation(&self) -> &[TaskPrompt];
    /// The reward of `response` (the decoded text, special tokens removed).
    fn reward(&self, prompt: &TaskPrompt, response: &str) -> f64;
    /// The passages a question is answered from, for tasks that have them (`qa`).
    fn passages(&self) -> Option<Arc<crate::search::task::Passages>> {
        None
    }
}

/// Math problems graded by the answer grader: reward 1 for a correct final answer, else 0.
/// Benchmark files (`math`) and generated arithmetic (`arith`) differ only in where the
/// prompts come from.
pub struct MathTask {
    name: &'static str,
    train: Vec<TaskPrompt>,
    validation: Vec<TaskPrompt>,
    grader: Grader,
}

fn to_prompts(problems: Vec<MathProblem>) -> Vec<TaskPrompt> {
    problems
        .into_iter()
        .map(|p| TaskPrompt { id: p.id, messages: vec![Message::user(math_prompt_text(&p.question))], gold: p.answer })
        .collect()
}

fn load(spec: &str, limit: Option<usize>) -> Result<(Benchmark, Vec<MathProblem>)> {
    let (name, source) = match spec.split_once('=') {
        Some((n, s)) => (n, Some(s)),
        None => (spec, None),
    };
    let bench = Benchmark::parse(name)?;
    Ok((bench, load_benchmark(bench, source, limit)?))
}

impl MathTask {
    pub fn from_config(cfg: &TaskConfig) -> Result<Self> {
        let (bench, train) = load(&cfg.train, None)?;
        let validation = if cfg.validation.is_empty() { vec![] } else { load(&cfg.validation, cfg.val_limit)?.1 };
        let grader = Grader {
            config: GradeConfig {
                mode: cfg.grade_mode,
                gold_precision: bench.approximate_answers(),
                ..Default::default()
            },
        };
        Ok(MathTask { name: "math", train: to_prompts(train), validation: to_prompts(validation), grader })
    }

    /// Generated arithmetic word problems (`crate::data::arith`). The prompt is the bare
    /// question: tiny models have no use for an instruction they cannot read.
    pub fn arith(cfg: &TaskConfig) -> Result<Self> {
        let (train, heldout) = arith::generate(&cfg.arith)?;
        let mut validation = arith_prompts(&heldout);
        if let Some(limit) = cfg.val_limit {
            validation.truncate(limit);
        }
        Ok(MathTask {
            name: "arith",
            train: arith_prompts(&train),
            validation,
            grader: Grader { config: GradeConfig { mode: cfg.grade_mode, ..Default::default() } },
        })
    }

    /// A task over given problems (tests, synthetic data).
    pub fn new(train: Vec<MathProblem>, validation: Vec<MathProblem>, grader: Grader) -> Self {
        MathTask { name: "math", train: to_prompts(train), validation: to_prompts(validation), grader }
    }
}

impl Task for MathTask {
    fn name(&self) -> &str {
        self.name
    }

    fn train(&self) -> &[TaskPrompt] {
        &self.train
    }

    fn validation(&self) -> &[TaskPrompt] {
        &self.validation
    }

    fn reward(&self, prompt: &TaskPrompt, response: &str) -> f64 {
        if self.grader.grade(&prompt.gold, response) { 1.0 } else { 0.0 }
    }
}

fn arith_prompts(problems: &[ArithProblem]) -> Vec<TaskPrompt> {
    problems
        .iter()
        .map(|p| TaskPrompt {
            id: p.id.clone(),
            messages: vec![Message::user(p.question.clone())],
            gold: p.answer.clone(),
        })
        .collect()
}
