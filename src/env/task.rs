//! The planning environments as a task (`task.kind = "env"`, `task.train = "plan-path"`): a
//! prompt is one instance, named `<env>/<split>/<index>`, which the turn-wise workload
//! regenerates ([`instance`]) and plays over several turns. The task's own reward scores a
//! one-shot answer (solved: 1), for readers that have no episode.

use serde::{Deserialize, Serialize};

use super::{EnvKind, Instance, Split};
use crate::error::{Error, Result};
use crate::task::{Splits, Task, TaskPrompt};
use crate::tokenizer::Message;

/// Which Plan-Path grids a task plays (`task.env.walks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Walks {
    /// Every generated grid (PettingLLMs' distribution).
    #[default]
    Any,
    /// Grids that exactly one of the two L-shaped walks from the start solves (rows first or
    /// columns first; the other meets a wall): a world a tiny policy that writes L walks can
    /// solve every time by choosing the right one, and solves half the time by habit.
    OneL,
}

impl Walks {
    /// The instances of `split` from index `first` on that these walks admit, each with its
    /// index (which names it).
    pub fn instances(self, kind: EnvKind, split: Split, first: u64) -> impl Iterator<Item = (u64, Instance)> {
        (first..).map(move |i| (i, Instance::generate(kind, split, i))).filter(move |(_, inst)| self.admits(inst))
    }

    fn admits(self, instance: &Instance) -> bool {
        match (self, instance) {
            (Walks::Any, _) => true,
            (Walks::OneL, Instance::PlanPath(p)) => p.l_walk_solves(true) != p.l_walk_solves(false),
            (Walks::OneL, _) => false,
        }
    }
}

/// `[task.env]`: how many instances each split offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvTaskConfig {
    /// Training instances (the first N of the train split that `walks` admits); steps draw
    /// from them in epochs.
    pub train_instances: u64,
    /// Held-out instances scored by validation (`task.val_limit` caps them too).
    pub heldout_instances: u64,
    /// Plan-Path only: which grids (`"any"`, or `"one-l"`: those exactly one L-shaped walk
    /// solves).
    pub walks: Walks,
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
        EnvTaskConfig { train_instances: 4096, heldout_instances: 100, walks: Walks::Any }
    }
}

pub struct EnvTask {
    kind: EnvKind,
    train: Vec<TaskPrompt>,
    validation: Vec<TaskPrompt>,
}

/// The first `n` instances of `split` that `walks` admits, each named by its index (so that
/// [`instance`] regenerates it).
fn prompts(kind: EnvKind, split: Split, n: u64, walks: Walks) -> Vec<TaskPrompt> {
    let split_name = match split {
        Split::Train => "train",
        Split::HeldOut => "held-out",
    };
    walks
        .instances(kind, split, 0)
        .take(n as usize)
        .map(|(i, inst)| {
            let id = format!("{}/{split_name}/{i}", kind.name());
            TaskPrompt { id: id.clone(), messages: vec![Message::user(inst.render())], gold: id }
        })
        .collect()
}

impl EnvTask {
    /// The instances of `splits.train` (`plan-path`, `sokoban` or `sudoku`) with `env`'s counts.
    pub fn load(splits: &Splits, env: &EnvTaskConfig) -> Result<Self> {
        let kind =
            EnvKind::parse(splits.train).map_err(|e| Error::config("training config", format!("task.train: {e}")))?;
        if !splits.validation.is_empty() && splits.validation != splits.train {
            return Err(Error::config(
                "training config",
                format!(
                    "task.validation: the held-out instances are {}'s own (split by content); set it to {:?} or leave it empty",
                    splits.train, splits.train
                ),
            ));
        }
        env.validate()?;
        if env.walks != Walks::Any && kind != EnvKind::PlanPath {
            return Err(Error::config(
                "training config",
                "task.env.walks selects Plan-Path grids; leave it out for other environments",
            ));
        }
        // A split's first n instances are the first n of any longer run: generate only those.
        let cap = |n: u64, limit: Option<usize>| limit.map_or(n, |l| n.min(l as u64));
        Ok(EnvTask {
            kind,
            train: prompts(kind, Split::Train, cap(env.train_instances, splits.train_limit), env.walks),
            validation: prompts(kind, Split::HeldOut, cap(env.heldout_instances, splits.val_limit), env.walks),
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
    use crate::config::{TaskConfig, TaskKind};

    fn load(c: &TaskConfig) -> Result<EnvTask> {
        EnvTask::load(&c.splits(), &c.env)
    }

    fn cfg(train: &str) -> TaskConfig {
        TaskConfig {
            kind: TaskKind::Env,
            train: train.into(),
            validation: String::new(),
            env: EnvTaskConfig { train_instances: 5, heldout_instances: 3, ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn prompts_name_their_instances_and_the_task_rewards_a_solving_answer() {
        let task = load(&cfg("sokoban")).unwrap();
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

    /// `walks = "one-l"`: every grid is solved by exactly one of its two L walks, the ids name
    /// the grids' own indices (skipping the others), and the splits stay apart.
    #[test]
    fn one_l_grids_are_solved_by_exactly_one_l_walk() {
        let mut c = cfg("plan-path");
        c.env = EnvTaskConfig { train_instances: 40, heldout_instances: 10, walks: Walks::OneL };
        let task = load(&c).unwrap();
        assert_eq!((task.train().len(), task.validation().len()), (40, 10));
        let mut rows_first = 0;
        for p in task.train().iter().chain(task.validation()) {
            let Instance::PlanPath(grid) = instance(p).unwrap() else { panic!("{}", p.id) };
            assert_ne!(grid.l_walk_solves(true), grid.l_walk_solves(false), "{}", p.id);
            rows_first += usize::from(grid.l_walk_solves(true));
            let mut copy = Instance::PlanPath(grid.clone());
            let walk = grid.l_walk(grid.l_walk_solves(true));
            let letters: Vec<String> = walk.iter().map(|m| format!("{:?}", m.letter())).collect();
            assert!(copy.apply(&format!("#### [{}]", letters.join(", "))).solved, "{}", p.id);
        }
        // Neither L is the right one most of the time: a fixed habit solves about half.
        assert!((15..=35).contains(&rows_first), "{rows_first} of 50 solved rows first");
        let last: u64 = task.train()[39].id.rsplit('/').next().unwrap().parse().unwrap();
        assert!(last > 60, "one-L grids are a minority of all grids: the 40th is index {last}");
        c.train = "sokoban".into();
        assert!(load(&c).err().unwrap().to_string().contains("task.env.walks"));
    }

    #[test]
    fn bad_settings_are_config_errors() {
        assert!(load(&cfg("chess")).err().unwrap().to_string().contains("task.train"));
        let mut c = cfg("sudoku");
        c.validation = "plan-path".into();
        assert!(load(&c).err().unwrap().to_string().contains("task.validation"));
        c.validation = String::new();
        c.env.train_instances = 0;
        assert!(load(&c).err().unwrap().to_string().contains("train_instances"));
    }
}
