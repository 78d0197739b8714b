//! Verifiable tasks: prompts with a gold answer and a reward function.
//!
//! The trainer sees only the [`Task`] trait, so any task whose reward a program can check
//! plugs in; [`MathTask`] (math word problems graded by [`crate::reward`]) is the built-in one.
//! (A module of its own rather than part of `data`: a task joins a dataset to a reward.)

use serde::{Deserialize, Serialize};

use crate::data::arith::{self, ArithConfig, ArithProblem};
use crate::data::{Benchmark, MathProblem, load_benchmark};
use crate::error::{Error, Result};
use crate::reward::{GradeConfig, GradeMode, Grader};
use crate::tokenizer::Message;

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
            .map_err(|_| Error::InvalidArgument(format!("unknown task {s:?}; use math, arith, qa or env")))
    }
}

/// The instruction appended to every math question (Qwen2.5-Math's prompt).
pub const MATH_PROMPT: &str = "Please reason step by step, and put your final answer within \\boxed{}.";

/// The user message for a math question.
pub fn math_prompt_text(question: &str) -> String {
    format!("{}\n{MATH_PROMPT}", question.trim())
}

/// Where a task's prompts come from: the `[task]` keys every kind reads.
#[derive(Clone, Copy, Debug)]
pub struct Splits<'a> {
    /// Training prompts (`task.train`).
    pub train: &'a str,
    /// Held-out prompts (`task.validation`), empty for none.
    pub validation: &'a str,
    /// At most this many held-out prompts (`task.val_limit`).
    pub val_limit: Option<usize>,
    /// Train on the first N training prompts only (`task.train_limit`).
    pub train_limit: Option<usize>,
}

impl Splits<'_> {
    /// `train` and `validation` (prompts, or what they are made from) cut to the limits.
    pub fn limit<T>(&self, mut train: Vec<T>, mut validation: Vec<T>) -> (Vec<T>, Vec<T>) {
        if let Some(n) = self.train_limit {
            train.truncate(n);
        }
        if let Some(n) = self.val_limit {
            validation.truncate(n);
        }
        (train, validation)
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

/// A task with a verifiable reward. A workload that needs more of its task than prompts and a
/// reward (the search workload, the passages) downcasts it (`&dyn Task` upcasts to `&dyn Any`).
pub trait Task: Send + Sync + std::any::Any {
    fn name(&self) -> &str;
    /// Training prompts.
    fn train(&self) -> &[TaskPrompt];
    /// Held-out prompts for validation (may be empty).
    fn validation(&self) -> &[TaskPrompt];
    /// The reward of `response` (the decoded text, special tokens removed).
    fn reward(&self, prompt: &TaskPrompt, response: &str) -> f64;
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
    /// Benchmark files (`task.kind = "math"`).
    pub fn load(splits: &Splits, grade_mode: GradeMode) -> Result<Self> {
        let (bench, train) = load(splits.train, splits.train_limit)?;
        let validation =
            if splits.validation.is_empty() { vec![] } else { load(splits.validation, splits.val_limit)?.1 };
        let grader = Grader {
            config: GradeConfig { mode: grade_mode, gold_precision: bench.approximate_answers(), ..Default::default() },
        };
        Ok(MathTask { name: "math", train: to_prompts(train), validation: to_prompts(validation), grader })
    }

    /// Generated arithmetic word problems (`crate::data::arith`). The prompt is the bare
    /// question: tiny models have no use for an instruction they cannot read.
    pub fn arith(arith: &ArithConfig, splits: &Splits, grade_mode: GradeMode) -> Result<Self> {
        let (train, heldout) = arith::generate(arith)?;
        let (train, validation) = splits.limit(arith_prompts(&train), arith_prompts(&heldout));
        Ok(MathTask {
            name: "arith",
            train,
            validation,
            grader: Grader { config: GradeConfig { mode: grade_mode, ..Default::default() } },
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
