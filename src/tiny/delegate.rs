//! The delegation team's demonstrations on the generated knowledge base (`search::kb`): a
//! scripted main agent and sub-agent play the workload's own episodes (its prompts, the BM25
//! search and the passages, `delegate::team::play`), right or with a habit, and every turn they
//! take becomes a pre-training example (the conversation's tokens up to the turn → the turn).
//! This is what tiny main and sub policies are pre-trained on, with habits that RL on the
//! team's reward can remove.
//!
//! | agent | right                                                        | habit                                   |
//! |-------|--------------------------------------------------------------|-----------------------------------------|
//! | main  | delegate "Who wrote T?", then "Where was A born?", answer B  | answers the author A (the bridge)       |
//! | sub   | search the task's name, open the passage titled so, report   | reports the first hit's title unopened  |
//!
//! A question (a task) shows its agent's habit when it is prone (`prone_every`, as the search
//! agents' habits) and a draw keyed on its text falls under the rate: the same question always
//! gets the same demonstration, whatever the order the team plays it in.

use crate::delegate::conversation::{Conversation, Speech};
use crate::delegate::protocol::{DELEGATE, OPEN, SEARCH, result, tool_call};
use crate::delegate::team::{Episode, Limits, Mode, Tools, Voice, play};
use crate::error::Result;
use crate::search::kb::Kb;
use crate::search::task::Passages;
use crate::stable_hash::{hash_bytes, mix_seed};
use crate::tokenizer::Tokenizer;

/// How often each agent's demonstration shows its habit, on the questions prone to it.
#[derive(Clone, Debug, PartialEq)]
pub struct DelegateHabits {
    pub main_bridge: f64,
    pub sub_unopened: f64,
    /// One question in `prone_every` (by a hash of its text) is prone; none or 0: every one.
    pub prone_every: Option<usize>,
    pub seed: u64,
}

impl DelegateHabits {
    /// Whether `text`'s demonstration by agent `agent` shows the habit of rate `rate`.
    fn shows(&self, agent: u64, text: &str, rate: f64) -> bool {
        let h = mix_seed(&[self.seed, agent, hash_bytes(text.as_bytes())]);
        let prone = match self.prone_every {
            None | Some(0) => true,
            Some(every) => (h >> 32).is_multiple_of(every as u64),
        };
        prone && ((h & 0xffff_ffff) as f64 / 4_294_967_296.0) < rate
    }
}

/// The text between the last `<tool_response>` and its closing tag.
fn last_response(so_far: &str) -> &str {
    let start = so_far.rfind("<tool_response>").map_or(0, |p| p + "<tool_response>".len());
    let end = so_far[start..].find("</tool_response>").map_or(so_far.len(), |p| start + p);
    &so_far[start..end]
}

/// The text between the last `before` in `text` and the `after` that follows it.
fn between<'a>(text: &'a str, before: &str, after: &str) -> Option<&'a str> {
    let start = text.rfind(before)? + before.len();
    let end = text[start..].find(after)? + start;
    Some(&text[start..end])
}

/// The main agent's turn, from the conversation so far.
fn main_turn(so_far: &str, habits: &DelegateHabits) -> String {
    let question = between(so_far, " who wrote ", " born?").unwrap_or("");
    match so_far.matches("</tool_response>").count() {
        0 => tool_call(DELEGATE, &format!("Who wrote {question}?")),
        1 => {
            let author = last_response(so_far).trim();
            if habits.shows(0, question, habits.main_bridge) {
                result(author)
            } else {
                tool_call(DELEGATE, &format!("Where was {author} born?"))
            }
        }
        _ => result(last_response(so_far).trim()),
    }
}

/// The sub-agent's turn, from the conversation so far.
fn sub_turn(so_far: &str, habits: &DelegateHabits) -> String {
    // The task: "Who wrote T?" or "Where was A born?"; its name is what to search for.
    let name = between(so_far, "Who wrote ", "?").or_else(|| between(so_far, "Where was ", " born?")).unwrap_or("");
    let hits = |text: &str| -> Vec<(String, String)> {
        text.lines().filter_map(|l| l.split_once(": ").map(|(id, t)| (id.trim().to_string(), t.to_string()))).collect()
    };
    match so_far.matches("</tool_response>").count() {
        0 => tool_call(SEARCH, name),
        1 => {
            let found = hits(last_response(so_far));
            if habits.shows(1, name, habits.sub_unopened) {
                return result(found.first().map_or(name, |(_, t)| t.as_str()));
            }
            let id = found.iter().find(|(_, t)| t == name).or(found.first()).map_or("", |(id, _)| id.as_str());
            tool_call(OPEN, id)
        }
        _ => {
            let passage = last_response(so_far);
            let fact = between(passage, "written by ", ".").or_else(|| between(passage, " was born in ", "."));
            result(fact.unwrap_or(name))
        }
    }
}

/// A scripted agent: its turns written from the conversation so far.
struct Scripted<'a> {
    tokenizer: &'a Tokenizer,
    chat_kwargs: serde_json::Map<String, serde_json::Value>,
    eos_token_ids: Vec<u32>,
    write: Box<dyn Fn(&str) -> String + 'a>,
}

impl<'a> Scripted<'a> {
    fn new(tokenizer: &'a Tokenizer, eos: &[u32], write: Box<dyn Fn(&str) -> String + 'a>) -> Self {
        Scripted { tokenizer, chat_kwargs: serde_json::Map::new(), eos_token_ids: eos.to_vec(), write }
    }
}

impl Voice for Scripted<'_> {
    fn speech(&self) -> Speech<'_> {
        Speech { tokenizer: self.tokenizer, chat_kwargs: &self.chat_kwargs, eos_token_ids: &self.eos_token_ids }
    }

    fn turns(&self, sequences: &[Vec<u32>], _seed: u64) -> Result<Vec<Vec<u32>>> {
        sequences
            .iter()
            .map(|s| self.tokenizer.encode(&(self.write)(&self.tokenizer.decode(s, false)?), false))
            .collect()
    }
}

/// The scripted team's episodes on every question of `world`, the agents speaking through
/// `tokenizer` (its chat template and `eos`).
pub fn episodes(world: &Kb, tokenizer: &Tokenizer, eos: &[u32], habits: &DelegateHabits) -> Result<Vec<Episode>> {
    let passages = Passages::new(world.documents.clone())?;
    let tools = Tools { passages: &passages, search_k: 3 };
    let main = Scripted::new(tokenizer, eos, Box::new(|s: &str| main_turn(s, habits)));
    let sub = Scripted::new(tokenizer, eos, Box::new(|s: &str| sub_turn(s, habits)));
    let questions: Vec<&str> = world.train.iter().chain(&world.heldout).map(|(q, _)| q.question.as_str()).collect();
    let limits = Limits { main_turns: 4, sub_turns: 4, calls: 3, max_tokens: 4096, turn_tokens: 64 };
    play(&main, &sub, &tools, &questions, Mode::Delegate, &limits, 0)
}

/// Each of the agent's turns in `c` as a pre-training example: the tokens before it → the turn.
pub fn turn_examples(c: &Conversation) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut out = vec![];
    let mut start = None;
    for t in 0..=c.response_ids.len() {
        let own = t < c.response_ids.len() && c.loss_mask[t];
        match (own, start) {
            (true, None) => start = Some(t),
            (false, Some(s)) => {
                let mut prefix = c.prompt_ids.clone();
                prefix.extend(&c.response_ids[..s]);
                out.push((prefix, c.response_ids[s..t].to_vec()));
                start = None;
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delegate::conversation::State;
    use crate::search::kb::{KbConfig, generate};
    use crate::search::metric::score;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shared/assets/tokenizers/qwen3");
        Tokenizer::from_dir(&dir).unwrap()
    }

    /// The right team answers every question of a world through the workload's own prompts,
    /// search and passages: the protocol can be played on the knowledge base in two
    /// delegations of three sub-agent turns each.
    #[test]
    fn the_right_team_answers_every_question_in_two_delegations() {
        let world = generate(&KbConfig { people: 40, heldout: 10, group: 1, seed: 5 }).unwrap();
        let tok = tokenizer();
        let right = DelegateHabits { main_bridge: 0.0, sub_unopened: 0.0, prone_every: None, seed: 0 };
        let all: Vec<_> = world.train.iter().chain(&world.heldout).collect();
        let episodes = episodes(&world, &tok, &[151645], &right).unwrap();
        for (e, (q, f)) in episodes.iter().zip(&all) {
            assert_eq!(e.main.state, State::Done(f.birthplace.clone()), "{}", q.question);
            assert_eq!(score(&f.birthplace, &q.answers).em, 1.0);
            assert_eq!(e.subs.len(), 2);
            assert!(e.subs.iter().all(|s| s.turns == 3 && matches!(s.state, State::Done(_))));
            assert_eq!(e.subs[0].state, State::Done(f.author.clone()));
        }
        // Every turn is an example: 3 main turns and 2 × 3 sub-agent turns per question.
        let e = &episodes[0];
        let main = turn_examples(&e.main);
        assert_eq!(main.len(), 3);
        assert_eq!(tok.decode(&main[2].1, false).unwrap(), result(&all[0].1.birthplace));
        assert!(main[1].0.len() > main[0].0.len() + main[0].1.len(), "the reply sits between the turns");
        assert_eq!(turn_examples(&e.subs[0]).len(), 3);
    }

    /// With every question prone and the rates at 1, the main agent answers the bridge and the
    /// sub-agent reports the first hit unopened; at 0.5 about half the questions do.
    #[test]
    fn habits_show_on_their_share_of_questions_and_always_the_same_way() {
        let world = generate(&KbConfig { people: 40, heldout: 10, group: 1, seed: 6 }).unwrap();
        let tok = tokenizer();
        let all: Vec<_> = world.train.iter().chain(&world.heldout).collect();
        let bridge = DelegateHabits { main_bridge: 1.0, sub_unopened: 0.0, prone_every: None, seed: 0 };
        for (e, (_, f)) in episodes(&world, &tok, &[151645], &bridge).unwrap().iter().zip(&all) {
            assert_eq!(e.main.state, State::Done(f.author.clone()));
            assert_eq!(e.subs.len(), 1);
        }
        let unopened = DelegateHabits { main_bridge: 0.0, sub_unopened: 1.0, prone_every: None, seed: 0 };
        for e in episodes(&world, &tok, &[151645], &unopened).unwrap() {
            assert!(e.subs.iter().all(|s| s.turns == 2), "reported after the search");
        }
        let half = DelegateHabits { main_bridge: 0.5, sub_unopened: 0.0, prone_every: Some(2), seed: 0 };
        let runs =
            [episodes(&world, &tok, &[151645], &half).unwrap(), episodes(&world, &tok, &[151645], &half).unwrap()];
        let bridged = |es: &[Episode]| es.iter().filter(|e| e.subs.len() == 1).count();
        assert_eq!(bridged(&runs[0]), bridged(&runs[1]), "the same questions every time");
        // Prone: about half; below the rate: about half of those.
        assert!((4..=22).contains(&bridged(&runs[0])), "{}", bridged(&runs[0]));
    }
}
