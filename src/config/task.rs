//! The `[task]` table, and the task it builds. Above `task/`, `search/` and `env/`: the table
//! names each kind's own settings (`[task.arith]`, `[task.kb]`, `[task.env]`), and each kind's
//! task is built from its part of it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::data::arith::ArithConfig;
use crate::env::task::{EnvTask, EnvTaskConfig};
use crate::error::Result;
use crate::reward::GradeMode;
use crate::search::kb::KbConfig;
use crate::search::task::QaTask;
pub use crate::task::TaskKind;
use crate::task::{MathTask, Splits, Task};

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
    pub kb: KbConfig,
    /// `env`: how many train and held-out instances.
    pub env: EnvTaskConfig,
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

impl TaskConfig {
    /// The keys every kind reads.
    pub fn splits(&self) -> Splits<'_> {
        Splits {
            train: &self.train,
            validation: &self.validation,
            val_limit: self.val_limit,
            train_limit: self.train_limit,
        }
    }

    /// The task this table describes (loads or generates its prompts).
    pub fn build(&self) -> Result<Arc<dyn Task>> {
        let splits = self.splits();
        Ok(match self.kind {
            TaskKind::Arith => Arc::new(MathTask::arith(&self.arith, &splits, self.grade_mode)?),
            TaskKind::Math => Arc::new(MathTask::load(&splits, self.grade_mode)?),
            TaskKind::Qa => Arc::new(QaTask::load(&splits, &self.corpus, &self.kb)?),
            TaskKind::Env => Arc::new(EnvTask::load(&splits, &self.env)?),
        })
    }
}
