//! The planning environments as a task (`task.kind = "env"`, `task.train = "plan-path"`): a
//! prompt is one instance, named `<env>/<split>/<index>`, which the turn-wise workload
//! regenerates ([`instance`]) and plays over several turns. The task's own reward scores a
//! one-shot answer (solved: 1), for readers that have no episode.

use serde::{Deserialize, Serialize};

use super::{EnvKind, Instance, Split};
use crate::error::{Error, Result};
use crate::task::{Task, TaskConfig, TaskPrompt};
use crate::tokenizer::Message;

/// `[task.env]`: how many instances each split offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvTaskConfig {
    /// Training instances (indices 0..N of the train split); steps draw from them in epochs.
    pub train_instances: u64,
    /// Held-out instances scored by validation (`task.val_limit` caps them too).
    pub heldout_instances: u64,
}

impl EnvTaskConfig {
    /// The instances are generated up front: at least one to train on, and counts a machine holds.
    pub fn validate(&self) -> Result<()> {
        const MOST: u64 = 10_000_000;
        if !(1..=MOST).contains(&self.train_instances) {
            return Err(Error::config(
                "training config",
                format!("task.env.train_instances must be between 1 and {MOST}, got {}", self.train_instances),
            ));
        }
        if self.heldout_instances > MOST {
            return Err(Error::config(
                "training config",
                format!("task.env.heldout_instances must be at most {MOST}, got {}", self.heldout_instances),
            ));
        }
        Ok(())
    }
}

impl Default for EnvTaskConfig {
    fn default() -> Self {
        EnvTaskConfig { train_instances: 4096, heldout_instances: 100 }
    }
}

pub struct EnvTask {
    kind: EnvKind,
    train: Vec<TaskPrompt>,
    validation: Vec<TaskPrompt>,
}

fn prompts(kind: EnvKind, split: Split, n: u64) -> Vec<TaskPrompt> {
    let split_name = match split {
        Split::Train => "train",
        Split::HeldOut => "held-out",
    };
    (0..n)
        .map(|i| {
            let id = format!("{}/{split_name}/{i}", kind.name());
            let inst = Instance::generate(kind, split, i);
            TaskPrompt { id: id.clone(), messages: vec![Message::user(inst.render())], gold: id }
        })
        .collect()
}

impl EnvTask {
    pub fn from_config(cfg: &TaskConfig) -> Result<Self> {
        let kind =
            EnvKind::parse(&cfg.train).map_err(|e| Error::config("training config", format!("task.train: {e}")))?;
        if !cfg.validation.is_empty() && cfg.validation != cfg.train {
            return Err(Error::config(
                "training config",
                format!(
                    "task.validation: the held-out instances are {}'s own (split by content); set it to {:?} or leave it empty",
                    cfg.train, cfg.train
                ),
            ));
        }
        let env = &cfg.env;
        env.validate()?;
        let heldout = cfg.val_limit.map_or(env.heldout_instances, |l| env.heldout_instances.min(l as u64));
        Ok(EnvTask {
            kind,
            train: prompts(kind, Split::Train, env.train_instances),
            validation: prompts(kind, Split::HeldOut, heldout),
        })
    }

    pub fn kind(&self) -> EnvKind {
        self.kind
    }
}

/// The instance a prompt of an [`EnvTask`] names, in its initial state.
pub fn instance(prompt: &TaskPrompt) -> Result<Instance> {
    let bad = || Error::Internal(format!("{:?} is not an environment instance id (env/split/index)", prompt.gold));
    let mut parts = prompt.gold.split('/');
    let (Some(kind), Some(split), Some(index), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let kind = EnvKind::parse(kind).map_err(|_| bad())?;
    let split = Split::parse(split).map_err(|_| bad())?;
    let index = index.parse::<u64>().map_err(|_| bad())?;
    Ok(Instance::generate(kind, split, index))
}

impl Task for EnvTask {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn train(&self) -> &[TaskPrompt] {
        &self.train
    }

    fn validation(&self) -> &[TaskPrompt] {
        &self.validation
    }

    fn reward(&self, prompt: &TaskPrompt, response: &str) -> f64 {
        match instance(prompt) {
            Ok(mut inst) => f64::from(u8::from(inst.apply(response).solved)),
            Err(_) => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(train: &str) -> TaskConfig {
        TaskConfig {
            kind: crate::task::TaskKind::Env,
            train: train.into(),
            validation: String::new(),
            env: EnvTaskConfig { train_instances: 5, heldout_instances: 3 },
            ..Default::default()
        }
    }

    #[test]
    fn prompts_name_their_instances_and_the_task_rewards_a_solving_answer() {
        let task = EnvTask::from_config(&cfg("sokoban")).unwrap();
        assert_eq!(task.train().len(), 5);
        assert_eq!(task.validation().len(), 3);
        assert_eq!(task.validation()[2].id, "sokoban/held-out/2");
        let p = &task.train()[4];
        let inst = instance(p).unwrap();
        assert_eq!(inst, Instance::generate(EnvKind::Sokoban, Split::Train, 4));
        assert_eq!(p.messages[0].content, inst.render());
        assert_eq!(task.reward(p, &format!("#### {}", inst.solution().unwrap())), 1.0);
        assert_eq!(task.reward(p, "#### []"), 0.0);
    }

    #[test]
    fn bad_settings_are_config_errors() {
        assert!(EnvTask::from_config(&cfg("chess")).err().unwrap().to_string().contains("task.train"));
        let mut c = cfg("sudoku");
        c.validation = "plan-path".into();
        assert!(EnvTask::from_config(&c).err().unwrap().to_string().contains("task.validation"));
        c.validation = String::new();
        c.env.train_instances = 0;
        assert!(EnvTask::from_config(&c).err().unwrap().to_string().contains("train_instances"));
    }
}
