//! A team split between two processes (M-GRPO's decoupled trainers): the main agent's process
//! plays the main conversations and hands each turn's delegations over a [`Line`]; the
//! sub-agent's process researches them with its own policy and hands back how each ended. No
//! weights or gradients cross, only task texts, findings and, at the end, how each main
//! conversation ended (what the sub-agent's rewards follow).
//!
//! ```text
//! main's process                        sub's process
//!   per main turn but the last:
//!     tasks{t}:  [(episode, task)] ──▶   research them (research_seed(seed, t))
//!     found{t}:  [end state]      ◀──   (skipped when there were no tasks)
//!   ends:        [main end state] ──▶   the sub-agents' rewards and metrics
//! ```
//!
//! Each side ends with the one-process [`Episode`]s, the other side's conversations stood in for
//! by how they ended ([`Conversation::ended_elsewhere`]): the same seeds and the same batches
//! give the sub-agents the conversations they would have had in one process.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::conversation::{Conversation, State};
use super::team::{self, Episode, Limits, Research, SubAgents, Tools, Voice, research_seed};
use crate::error::{Error, Result};

/// The two sides of a split team: one round hands this side's part to the other and returns
/// the other's (an empty part where a side has nothing to say).
pub trait Line {
    fn round(&self, phase: &str, mine: Vec<u8>) -> Result<Vec<u8>>;
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::Internal(e.to_string()))
}

fn decode<T: DeserializeOwned>(phase: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Internal(format!("the other side's {phase} cannot be read ({e}): is it the same hacpo?")))
}

/// The main agent's side: delegations go over `line`, their end states come back.
pub struct Relay<'a> {
    line: &'a dyn Line,
    turn: usize,
    calls: Vec<(usize, State)>,
}

impl<'a> Relay<'a> {
    pub fn new(line: &'a dyn Line) -> Self {
        Relay { line, turn: 0, calls: vec![] }
    }

    /// Tells the sub-agents' side how each of `mains` ended; the episodes, the sub-agents'
    /// conversations known by their ends.
    pub fn finish(self, mains: Vec<Conversation>) -> Result<Vec<Episode>> {
        let ends: Vec<&State> = mains.iter().map(|c| &c.state).collect();
        self.line.round("ends", encode(&ends)?)?;
        let subs = self.calls.into_iter().map(|(e, end)| (e, Conversation::ended_elsewhere(end)));
        Ok(team::episodes(mains, subs))
    }
}

impl Research for Relay<'_> {
    fn research(&mut self, tasks: &[(usize, String)], _seed: u64) -> Result<Vec<State>> {
        let turn = self.turn;
        self.turn += 1;
        self.line.round(&format!("tasks{turn}"), encode(&tasks)?)?;
        if tasks.is_empty() {
            return Ok(vec![]);
        }
        let phase = format!("found{turn}");
        let ends: Vec<State> = decode(&phase, &self.line.round(&phase, vec![])?)?;
        if ends.len() != tasks.len() {
            return Err(Error::Internal(format!("{} findings for {} tasks in {phase}", ends.len(), tasks.len())));
        }
        self.calls.extend(tasks.iter().map(|(e, _)| *e).zip(ends.iter().cloned()));
        Ok(ends)
    }
}

/// The sub-agents' side of `episodes` episodes played with `seed`: researches what the main
/// agents' side delegates, turn by turn, with `voice`; the episodes, the main conversations
/// known by their ends.
pub fn serve(
    voice: &dyn Voice,
    tools: &Tools<'_>,
    limits: &Limits,
    episodes: usize,
    seed: u64,
    line: &dyn Line,
) -> Result<Vec<Episode>> {
    let mut agents = SubAgents::new(voice, tools, limits);
    for turn in 0..limits.main_turns.saturating_sub(1) {
        let phase = format!("tasks{turn}");
        let tasks: Vec<(usize, String)> = decode(&phase, &line.round(&phase, vec![])?)?;
        if tasks.iter().any(|(e, _)| *e >= episodes) {
            return Err(Error::Internal(format!("{phase} names an episode past the {episodes} played")));
        }
        if tasks.is_empty() {
            continue;
        }
        let ends = agents.research(&tasks, research_seed(seed, turn))?;
        line.round(&format!("found{turn}"), encode(&ends)?)?;
    }
    let ends: Vec<State> = decode("ends", &line.round("ends", vec![])?)?;
    if ends.len() != episodes {
        return Err(Error::Internal(format!("{} main conversations ended, {episodes} were played", ends.len())));
    }
    Ok(agents.episodes(ends.into_iter().map(Conversation::ended_elsewhere).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line whose other side has already said everything: each phase's part is read from a
    /// script, and what this side says is kept.
    struct Scripted {
        theirs: std::collections::HashMap<String, Vec<u8>>,
        said: std::cell::RefCell<Vec<(String, Vec<u8>)>>,
    }

    impl Line for Scripted {
        fn round(&self, phase: &str, mine: Vec<u8>) -> Result<Vec<u8>> {
            self.said.borrow_mut().push((phase.to_string(), mine));
            Ok(self.theirs.get(phase).cloned().unwrap_or_default())
        }
    }

    #[test]
    fn the_main_side_hands_tasks_over_and_reads_their_ends() {
        let found = vec![State::Done("Ann".into()), State::Failed("no result".into())];
        let line =
            Scripted { theirs: [("found0".to_string(), encode(&found).unwrap())].into(), said: Default::default() };
        let mut relay = Relay::new(&line);
        let tasks = vec![(1, "find Ann".to_string()), (0, "find Bob".to_string())];
        assert_eq!(relay.research(&tasks, 7).unwrap(), found);
        // A turn without delegations is one round, so the other side keeps count.
        assert_eq!(relay.research(&[], 8).unwrap(), vec![]);
        let mains = vec![Conversation::ended_elsewhere(State::Done("x".into())); 2];
        let episodes = relay.finish(mains).unwrap();
        assert_eq!(episodes[0].subs[0].state, State::Failed("no result".into()));
        assert_eq!(episodes[1].subs[0].state, State::Done("Ann".into()));
        let phases: Vec<String> = line.said.borrow().iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(phases, ["tasks0", "found0", "tasks1", "ends"]);
        let said = line.said.borrow();
        assert_eq!(decode::<Vec<(usize, String)>>("tasks0", &said[0].1).unwrap(), tasks);
        assert!(said[1].1.is_empty(), "the main side says nothing while the sub side answers");
    }

    #[test]
    fn a_garbled_or_short_answer_is_an_error_not_a_panic() {
        for found in [b"not json".to_vec(), encode(&vec![State::Done("only one".into())]).unwrap()] {
            let line = Scripted { theirs: [("found0".to_string(), found)].into(), said: Default::default() };
            let tasks = vec![(0, "a".to_string()), (1, "b".to_string())];
            assert!(Relay::new(&line).research(&tasks, 0).is_err());
        }
    }
}
