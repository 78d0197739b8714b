//! Pre-training the tiny delegation team (`tiny-delegate`, M-GRPO's study): one policy
//! pre-trained on the turns of a scripted main agent, sub-agent and single agent playing the
//! workload's own episodes on the generated knowledge base (`search::kb`: its prompts, the
//! BM25 search and the passages, `delegate::team::play`), right or with a habit. Every turn an
//! agent takes is an example: the conversation's tokens up to the turn → the turn. The study
//! then trains two copies of it, one as the main agent and one as the sub-agent.
//!
//! | agent  | right                                                              | habit                               |
//! |--------|--------------------------------------------------------------------|-------------------------------------|
//! | main   | delegate "Who wrote T?", then "Where was A born?", answer B         | answers the author A (the bridge)   |
//! | sub    | search the task's name, open the passage titled so (by title), report `written by A` / `born in B` | reports the first hit's title unopened |
//! | single | search T, open it, search A, open it, answer B                      | either habit, on the same questions |
//!
//! A habit shows on the questions prone to it, a split every world shares: the main agent's
//! (and the single agent's bridge) by the question's profession, the sub-agent's (and the
//! single agent's unopened report) by the name it looks for (a title's colour, a person's first
//! name), one in `prone_every` of each list. On those, a draw keyed on the question (or name)
//! and the world falls under the habit's rate. A habit of some questions is what greedy
//! decoding keeps there and drops elsewhere, so the team starts right on part of the held-out
//! questions and sampling leaves the right turn often enough to reward (the search and
//! turn-wise studies' finding, models/tiny/tiny-searcher.toml).
//!
//! The main agent's turns are taught from episodes with a right sub-agent, the sub-agent's
//! from episodes with a right main agent: each habit is one agent's, and what the main agent
//! does with a sub-agent's unopened report is nothing it was shown (it answers what came
//! back). So a sub-agent's habit costs the team its answer, and only training the sub-agent
//! removes it: what separates co-training from training the main agent alone.
//!
//! The episodes are played with the run's `[workload.delegate]` instructions, and the study
//! asks for brief ones: with the full instructions' example calls in every system prompt the
//! tiny model never learned to copy a name (models/tiny/tiny-delegate.toml has the measurements).

use std::path::Path;

use burn::tensor::backend::Backend;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{Skill, Stage, TinySpec};
use crate::delegate::conversation::{Conversation, Speech};
use crate::delegate::protocol::{DELEGATE, OPEN, SEARCH, Tool, result, tool_call};
use crate::delegate::team::{Episode, Limits, Mode, STOP_STRINGS, Tools, Voice, play};
use crate::error::Result;
use crate::generate::{GenerateRequest, SamplingParams, generate};
use crate::model::CausalLm;
use crate::search::kb::{Kb, KbConfig, generate as generate_kb, list_position, name_position};
use crate::search::task::Passages;
use crate::stable_hash::{hash_bytes, mix_seed};
use crate::tokenizer::Tokenizer;
use crate::tokenizer::train::{TokenizerKind, train};
use crate::workload::delegate::DelegateConfig;

/// Bump when the demonstrations change in a way that makes cached delegation agents stale
/// (part of their cache key, beside the spec, the knowledge base's settings, `search_k` and the
/// instructions).
pub const RECIPE_VERSION: u32 = 2;

/// How often each agent's demonstration shows its habit (`[corpus.delegate]` of a tiny spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegateHabits {
    /// The main agent answers the bridge (the author) after the first delegation.
    pub main_bridge: f64,
    /// The sub-agent reports a search's first hit without opening it.
    pub sub_unopened: f64,
    /// One name in `prone_every` of each list is prone (see the module's text); none or 0:
    /// every question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prone_every: Option<usize>,
    /// Generated worlds the demonstrations come from (each as large as the run's).
    pub worlds: usize,
    /// A curriculum: pre-training runs these stages in order, each on its agents'
    /// conversations only (none: one stage of all three for `[pretrain] max_steps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage<Agent>>,
}

/// The agent a turn example teaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Agent {
    Main,
    Sub,
    Single,
}

impl Agent {
    pub const ALL: [Agent; 3] = [Agent::Main, Agent::Sub, Agent::Single];

    fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        ["main", "sub", "single"][self.index()]
    }
}

/// What a scripted agent does: its habits' rates, and the seed of the draws (a world's).
#[derive(Clone, Debug)]
struct Script {
    main_bridge: f64,
    sub_unopened: f64,
    prone_every: Option<usize>,
    seed: u64,
}

impl Script {
    fn of(habits: &DelegateHabits, main_bridge: f64, sub_unopened: f64, seed: u64) -> Self {
        Script { main_bridge, sub_unopened, prone_every: habits.prone_every, seed }
    }

    /// Never a habit.
    fn right() -> Self {
        Script { main_bridge: 0.0, sub_unopened: 0.0, prone_every: None, seed: 0 }
    }

    /// The habit wherever there is one to show.
    fn habitual() -> Self {
        Script { main_bridge: 1.0, sub_unopened: 1.0, prone_every: None, seed: 0 }
    }

    /// Whether agent `agent`'s turn about `key` shows the habit of rate `rate`; `position`:
    /// where the key's deciding word stands in its list.
    fn shows(&self, agent: u64, key: &str, position: Option<usize>, rate: f64) -> bool {
        let prone = match self.prone_every {
            None | Some(0) => true,
            Some(every) => position.is_some_and(|k| k % every == 0),
        };
        let h = mix_seed(&[self.seed, agent, hash_bytes(key.as_bytes())]);
        prone && ((h & 0xffff_ffff) as f64 / 4_294_967_296.0) < rate
    }

    /// Whether the answer to the question in `so_far` is the bridge.
    fn bridges(&self, so_far: &str) -> bool {
        let profession = between(so_far, "Where was the ", " from ").unwrap_or("");
        self.shows(0, question_title(so_far), list_position(profession), self.main_bridge)
    }

    /// The turn after a search for `name` that listed `found`: open the passage titled so (by
    /// its title: copying the right id needs finding its line first, which the tiny model
    /// never learned), or (the habit) report the first hit's title.
    fn read_hits(&self, found: &str, name: &str) -> String {
        let hits: Vec<(&str, &str)> = found.lines().filter_map(|l| l.split_once(": ")).collect();
        if self.shows(1, name, name_position(name), self.sub_unopened) {
            return answer(hits.first().map_or(name, |h| h.1));
        }
        call(OPEN, hits.iter().find(|h| h.1 == name).or(hits.first()).map_or(name, |h| h.1))
    }

    fn turn(&self, agent: Agent, so_far: &str) -> String {
        match agent {
            Agent::Main => self.main_turn(so_far),
            Agent::Sub => self.sub_turn(so_far),
            Agent::Single => self.single_turn(so_far),
        }
    }

    fn main_turn(&self, so_far: &str) -> String {
        let found = last_response(so_far);
        match so_far.matches("</tool_response>").count() {
            0 => call(DELEGATE, &format!("Who wrote {}?", question_title(so_far))),
            1 => match after(found, "written by ") {
                Some(author) if self.bridges(so_far) => answer(author),
                Some(author) => call(DELEGATE, &format!("Where was {author} born?")),
                // Findings without the author: nothing a demonstration shows; answer them.
                None => answer(found.trim()),
            },
            _ => answer(after(found, "born in ").unwrap_or(found.trim())),
        }
    }

    fn sub_turn(&self, so_far: &str) -> String {
        // The task: "Who wrote T?" or "Where was A born?"; its name is what to search for.
        let name = between(so_far, "Who wrote ", "?").or_else(|| between(so_far, "Where was ", " born?")).unwrap_or("");
        let found = last_response(so_far);
        match so_far.matches("</tool_response>").count() {
            0 => call(SEARCH, name),
            1 => self.read_hits(found, name),
            _ => answer(report(found)),
        }
    }

    fn single_turn(&self, so_far: &str) -> String {
        let title = question_title(so_far);
        let found = last_response(so_far);
        match so_far.matches("</tool_response>").count() {
            0 => call(SEARCH, title),
            1 => self.read_hits(found, title),
            2 => match after(found, "written by ") {
                Some(author) if self.bridges(so_far) => answer(author),
                Some(author) => call(SEARCH, author),
                None => answer(found.trim()),
            },
            3 => self.read_hits(found, after(so_far, "written by ").unwrap_or("")),
            _ => answer(after(found, "born in ").unwrap_or(found.trim())),
        }
    }
}

/// A tool call as the demonstrations write it: the argument after a space, so that a name
/// reads as the same tokens as in the text it is copied from (a byte-level BPE spells `Fox`
/// after a space and after a quote differently, and a tiny model would have to learn that
/// mapping name by name). The protocol trims arguments.
fn call(tool: Tool, argument: &str) -> String {
    tool_call(tool, &format!(" {argument}"))
}

/// A result, after a space (see [`call`]).
fn answer(text: &str) -> String {
    result(&format!(" {text}"))
}

/// The book the question in `so_far` names.
fn question_title(so_far: &str) -> &str {
    between(so_far, " who wrote ", " born?").unwrap_or("")
}

/// What a sub-agent reports from an opened passage: the clause that answers its task,
/// `written by A` or `born in B` (short: a tiny model copies it token by token, and the name
/// after a space reads as it does in the passage), else the passage's first sentence.
fn report(passage: &str) -> &str {
    let text = passage.split_once(": ").map_or(passage, |(_, t)| t).trim();
    let sentence = text.find('.').map_or(text, |end| &text[..end]);
    ["written by ", "born in "].iter().find_map(|c| sentence.find(c).map(|at| &sentence[at..])).unwrap_or(sentence)
}

/// The name or place after `clause` in findings (`written by A`, `… born in B.`).
fn after<'a>(found: &'a str, clause: &str) -> Option<&'a str> {
    let start = found.rfind(clause)? + clause.len();
    let rest = &found[start..];
    Some(rest.find('.').map_or(rest, |end| &rest[..end]).trim()).filter(|n| !n.is_empty())
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

/// A scripted agent: its turns written from the conversation so far.
struct Scripted<'a> {
    tokenizer: &'a Tokenizer,
    chat_kwargs: serde_json::Map<String, serde_json::Value>,
    eos_token_ids: Vec<u32>,
    script: &'a Script,
    agent: Agent,
}

impl Voice for Scripted<'_> {
    fn speech(&self) -> Speech<'_> {
        Speech { tokenizer: self.tokenizer, chat_kwargs: &self.chat_kwargs, eos_token_ids: &self.eos_token_ids }
    }

    fn turns(&self, sequences: &[Vec<u32>], _seed: u64) -> Result<Vec<Vec<u32>>> {
        sequences
            .iter()
            .map(|s| self.tokenizer.encode(&self.script.turn(self.agent, &self.tokenizer.decode(s, false)?), false))
            .collect()
    }
}

/// The turn limits the demonstrations are played with (the single agent's right episode
/// takes five turns, a sub-agent's three).
const LIMITS: Limits = Limits { main_turns: 5, sub_turns: 4, calls: 3, max_tokens: 4096, turn_tokens: 64 };

/// The scripted team's (or, in `Mode::Single`, the single agent's) episodes on every question
/// of `world`, speaking through `tokenizer` (its chat template and `eos`).
fn episodes(
    world: &Kb,
    tokenizer: &Tokenizer,
    eos: &[u32],
    script: &Script,
    mode: Mode,
    workload: &DelegateConfig,
) -> Result<Vec<Episode>> {
    let passages = Passages::new(world.documents.clone())?;
    let tools = Tools { passages: &passages, search_k: workload.search_k, instructions: workload.instructions };
    let voice =
        |agent| Scripted { tokenizer, chat_kwargs: serde_json::Map::new(), eos_token_ids: eos.to_vec(), script, agent };
    let main = voice(if mode == Mode::Single { Agent::Single } else { Agent::Main });
    let sub = voice(Agent::Sub);
    let questions: Vec<&str> = world.train.iter().chain(&world.heldout).map(|(q, _)| q.question.as_str()).collect();
    play(&main, &sub, &tools, &questions, mode, &LIMITS, 0)
}

/// A turn to imitate: the agent, the conversation's tokens before it, the turn's.
pub struct TurnExample {
    pub agent: Agent,
    /// Which of the agent's turns in its conversation (0: the first).
    pub index: usize,
    pub prefix: Vec<u32>,
    pub turn: Vec<u32>,
}

/// Each of the agent's turns in `c` as an example: the tokens before it → the turn.
pub fn turn_examples(agent: Agent, c: &Conversation) -> Vec<TurnExample> {
    let mut out = vec![];
    let mut start = None;
    for t in 0..=c.response_ids.len() {
        let own = t < c.response_ids.len() && c.loss_mask[t];
        match (own, start) {
            (true, None) => start = Some(t),
            (false, Some(s)) => {
                let mut prefix = c.prompt_ids.clone();
                prefix.extend(&c.response_ids[..s]);
                out.push(TurnExample { agent, index: out.len(), prefix, turn: c.response_ids[s..t].to_vec() });
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The three agents' conversations on `world`, its habits' draws keyed on `seed`: the main
/// agent's beside a right sub-agent, the sub-agent's beside a right main agent, the single
/// agent's with both habits.
fn world_conversations(
    world: &Kb,
    tokenizer: &Tokenizer,
    eos: &[u32],
    habits: &DelegateHabits,
    seed: u64,
    workload: &DelegateConfig,
) -> Result<Vec<(Agent, Conversation)>> {
    let mut out = vec![];
    let script = Script::of(habits, habits.main_bridge, 0.0, seed);
    for e in episodes(world, tokenizer, eos, &script, Mode::Delegate, workload)? {
        out.push((Agent::Main, e.main));
    }
    let script = Script::of(habits, 0.0, habits.sub_unopened, seed);
    for e in episodes(world, tokenizer, eos, &script, Mode::Delegate, workload)? {
        out.extend(e.subs.into_iter().map(|s| (Agent::Sub, s)));
    }
    let script = Script::of(habits, habits.main_bridge, habits.sub_unopened, seed);
    for e in episodes(world, tokenizer, eos, &script, Mode::Single, workload)? {
        out.push((Agent::Single, e.main));
    }
    Ok(out)
}

/// The turn examples of [`world_conversations`].
fn world_examples(
    world: &Kb,
    tokenizer: &Tokenizer,
    eos: &[u32],
    habits: &DelegateHabits,
    seed: u64,
    workload: &DelegateConfig,
) -> Result<Vec<TurnExample>> {
    let conversations = world_conversations(world, tokenizer, eos, habits, seed, workload)?;
    Ok(conversations.iter().flat_map(|(agent, c)| turn_examples(*agent, c)).collect())
}

/// A pre-training example (prompt ids, response ids) and which response tokens are learned.
type Learned = ((Vec<u32>, Vec<u32>), Vec<bool>);

/// A conversation as one pre-training example: its prompt, its response up to the end of the
/// agent's last turn, and which of those tokens are the agent's (the ones learned).
fn conversation_example(c: &Conversation) -> Option<Learned> {
    let end = c.loss_mask.iter().rposition(|&own| own)? + 1;
    Some(((c.prompt_ids.clone(), c.response_ids[..end].to_vec()), c.loss_mask[..end].to_vec()))
}

/// World `w` of the demonstrations: shaped like `kb`, with a seed far from the run's (the
/// policy learns to read passages, not the run's facts).
fn world(kb: &KbConfig, w: usize) -> Result<Kb> {
    generate_kb(&KbConfig { seed: kb.seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(w as u64 + 1), ..kb.clone() })
}

/// Held-out turns scored during pre-training, per agent.
const EVAL_PER_AGENT: usize = 50;
/// The longest turn a greedy evaluation writes.
const MAX_TURN_TOKENS: usize = 64;

/// The texts the tokenizer is trained on: the first world's conversations, played through a
/// byte tokenizer of the same chat format.
fn tokenizer_texts(
    spec: &TinySpec,
    kb: &KbConfig,
    habits: &DelegateHabits,
    workload: &DelegateConfig,
) -> Result<Vec<String>> {
    let bytes = train(TokenizerKind::Char, 0, spec.chat_format, &[])?;
    let eos = [bytes.token_to_id(spec.chat_format.special_tokens()[0]).expect("eos is a special token")];
    let script = Script::of(habits, habits.main_bridge, habits.sub_unopened, 0);
    let mut texts = vec![];
    for mode in [Mode::Delegate, Mode::Single] {
        for e in episodes(&world(kb, 0)?, &bytes, &eos, &script, mode, workload)? {
            for c in std::iter::once(&e.main).chain(&e.subs) {
                let ids: Vec<u32> = c.prompt_ids.iter().chain(&c.response_ids).copied().collect();
                texts.push(bytes.decode(&ids, true)?);
            }
        }
    }
    Ok(texts)
}

/// Pre-trains the delegation agent `spec` from scratch on episodes shaped like `kb`'s world
/// (as `workload` plays them: its searches' passages, its instructions) and writes it to `dir`.
pub fn pretrain<B: Backend>(
    spec: &TinySpec,
    kb: &KbConfig,
    workload: &DelegateConfig,
    device: &B::Device,
    dir: &Path,
) -> Result<()> {
    let habits = spec.corpus.delegate.as_ref().expect("a delegation agent's spec has [corpus.delegate]");
    let texts = tokenizer_texts(spec, kb, habits, workload)?;
    let (tokenizer, eos, model) = super::untrained::<B>(spec, &texts, device)?;
    // One example per conversation, its own turns learned (see `fine_tune_masked`).
    let (mut turns, mut examples, mut learned) = ([0; 3], vec![], vec![]);
    for w in 0..habits.worlds {
        for (agent, c) in world_conversations(&world(kb, w)?, &tokenizer, &eos, habits, w as u64, workload)? {
            turns[agent.index()] += c.turns;
            if let Some((example, mask)) = conversation_example(&c) {
                examples.push((agent, example));
                learned.push(mask);
            }
        }
    }
    let eval = held_out(spec, kb, &tokenizer, &eos, workload)?;
    eprintln!(
        "{}: {} conversations, {} turns to imitate (main {}, sub {}, single {})",
        spec.id,
        examples.len(),
        turns.iter().sum::<usize>(),
        turns[0],
        turns[1],
        turns[2]
    );
    let curriculum =
        super::Curriculum { examples: &examples, learned: &learned, roles: &Agent::ALL, names: Agent::name };
    let (model, report, last) = super::fine_tune_stages::<B, Agent>(spec, model, &curriculum, &habits.stages, |m| {
        skill(m, &tokenizer, &eos, &eval)
    })?;
    super::save(spec, &model, &tokenizer, &eos, &report, dir)?;
    eprintln!("pre-trained {} in {:.0} s, {} steps: held-out {last}", spec.id, report.wall_s, report.steps);
    Ok(())
}

/// The turns pre-training is scored on: [`EVAL_PER_AGENT`] per agent from a world of their own.
pub fn held_out(
    spec: &TinySpec,
    kb: &KbConfig,
    tokenizer: &Tokenizer,
    eos: &[u32],
    workload: &DelegateConfig,
) -> Result<Vec<TurnExample>> {
    let habits = spec.corpus.delegate.as_ref().expect("a delegation agent's spec has [corpus.delegate]");
    let mut all = world_examples(&world(kb, habits.worlds)?, tokenizer, eos, habits, habits.worlds as u64, workload)?;
    all.shuffle(&mut ChaCha8Rng::seed_from_u64(spec.pretrain.seed ^ 0xe7a1));
    let mut kept = vec![];
    for agent in Agent::ALL {
        kept.extend(all.iter().filter(|e| e.agent == agent).take(EVAL_PER_AGENT).map(|e| TurnExample {
            agent,
            index: e.index,
            prefix: e.prefix.clone(),
            turn: e.turn.clone(),
        }));
    }
    Ok(kept)
}

/// Scores `model`'s greedy turns on held-out turns: the demonstrated one, the right one, the
/// habit (the scripts' turns on the same conversation).
pub fn skill<B: Backend>(
    model: &CausalLm<B>,
    tokenizer: &Tokenizer,
    eos: &[u32],
    turns: &[TurnExample],
) -> Result<Skill> {
    let prompts: Vec<Vec<u32>> = turns.iter().map(|t| t.prefix.clone()).collect();
    let mut written = vec![String::new(); prompts.len()];
    let batch = 64;
    for (c, chunk) in prompts.chunks(batch).enumerate() {
        let mut req = GenerateRequest::new(chunk, SamplingParams::greedy(MAX_TURN_TOKENS));
        req.stop_token_ids = eos.to_vec();
        req.stop_strings = STOP_STRINGS.iter().map(|s| s.to_string()).collect();
        req.tokenizer = Some(tokenizer);
        for done in generate(model, &req)?.0 {
            written[c * batch + done.prompt_index] = tokenizer.decode(&done.token_ids, true)?;
        }
    }
    let mut outputs = Vec::with_capacity(turns.len());
    // Per agent and turn: (demonstrated, scored), to see which copies are learned first.
    let mut by_turn = [[(0, 0); 5]; 3];
    for (t, w) in turns.iter().zip(&written) {
        let so_far = tokenizer.decode(&t.prefix, false)?;
        let output = tokenizer.decode(&t.turn, true)?;
        let right = Script::right().turn(t.agent, &so_far);
        let habit = Script::habitual().turn(t.agent, &so_far);
        let output_right = output.trim() == right.trim();
        let other = if output_right { habit } else { right };
        let (w, output) = (w.trim(), output.trim());
        let demonstrated = w == output;
        let tally = &mut by_turn[t.agent.index()][t.index.min(4)];
        *tally = (tally.0 + usize::from(demonstrated), tally.1 + 1);
        if !demonstrated {
            tracing::debug!(
                agent = t.agent.name(),
                turn = t.index + 1,
                wrote = w,
                demonstrated = output,
                "held-out turn"
            );
        }
        outputs.push((t.agent.index(), demonstrated, w == other.trim() && other.trim() != output, output_right));
    }
    let mut skill = Skill::tally(Agent::ALL.map(Agent::name), outputs);
    let shares = |agent: Agent| {
        let of = by_turn[agent.index()].iter().filter(|(_, n)| *n > 0);
        of.map(|(k, n)| format!("{:.0}", 100.0 * *k as f64 / *n as f64)).collect::<Vec<_>>().join("/")
    };
    skill.detail = format!("by turn: {}", Agent::ALL.map(|a| format!("{} {}%", a.name(), shares(a))).join(", "));
    Ok(skill)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delegate::conversation::State;
    use crate::search::kb::KbConfig;
    use crate::search::metric::score;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shared/assets/tokenizers/qwen3");
        Tokenizer::from_dir(&dir).unwrap()
    }

    const EOS: [u32; 1] = [151645];

    fn kb(seed: u64) -> Kb {
        generate_kb(&KbConfig { people: 40, heldout: 10, group: 1, seed }).unwrap()
    }

    /// The right team answers every question of a world through the workload's own prompts,
    /// search and passages in two delegations of three sub-agent turns each, and the right
    /// single agent in five turns.
    #[test]
    fn the_right_agents_answer_every_question() {
        let world = kb(5);
        let tok = tokenizer();
        let all: Vec<_> = world.train.iter().chain(&world.heldout).collect();
        let episodes_of =
            |mode| episodes(&world, &tok, &EOS, &Script::right(), mode, &DelegateConfig::default()).unwrap();
        let team = episodes_of(Mode::Delegate);
        for (e, (q, f)) in team.iter().zip(&all) {
            assert_eq!(e.main.state, State::Done(f.birthplace.clone()), "{}", q.question);
            assert_eq!(score(&f.birthplace, &q.answers).em, 1.0);
            assert_eq!(e.subs.len(), 2);
            assert!(e.subs.iter().all(|s| s.turns == 3 && matches!(s.state, State::Done(_))));
            assert_eq!(e.subs[0].state, State::Done(format!("written by {}", f.author)));
            assert_eq!(e.subs[1].state, State::Done(format!("born in {}", f.birthplace)));
        }
        // Every turn is an example: 3 main turns and 2 × 3 sub-agent turns per question.
        let main = turn_examples(Agent::Main, &team[0].main);
        assert_eq!(main.len(), 3);
        assert_eq!(tok.decode(&main[2].turn, false).unwrap(), format!("<result> {}</result>", all[0].1.birthplace));
        assert!(main[1].prefix.len() > main[0].prefix.len() + main[0].turn.len(), "the reply sits between the turns");
        assert_eq!(turn_examples(Agent::Sub, &team[0].subs[0]).len(), 3);
        for (e, (_, f)) in episodes_of(Mode::Single).iter().zip(&all) {
            assert_eq!((e.main.turns, &e.main.state), (5, &State::Done(f.birthplace.clone())));
            assert!(e.subs.is_empty());
        }
    }

    /// Each habit where it shows: the main agent answers the bridge after one delegation; the
    /// sub-agent reports the title it searched for, and the main agent answers what came back;
    /// with `prone_every`, only the questions whose profession (main) or name (sub) is prone.
    #[test]
    fn habits_show_on_the_questions_prone_to_them() {
        let world = kb(6);
        let tok = tokenizer();
        let all: Vec<_> = world.train.iter().chain(&world.heldout).collect();
        let habits = |main_bridge, sub_unopened, prone_every| {
            let h = DelegateHabits { main_bridge, sub_unopened, prone_every, worlds: 1, stages: vec![] };
            Script::of(&h, main_bridge, sub_unopened, 0)
        };
        let play = |s: &Script| episodes(&world, &tok, &EOS, s, Mode::Delegate, &DelegateConfig::default()).unwrap();
        for (e, (_, f)) in play(&habits(1.0, 0.0, None)).iter().zip(&all) {
            assert_eq!((&e.main.state, e.subs.len()), (&State::Done(f.author.clone()), 1));
        }
        for (e, (_, f)) in play(&habits(0.0, 1.0, None)).iter().zip(&all) {
            assert_eq!(e.subs.len(), 1, "the main agent answers the unopened report");
            assert_eq!(e.subs[0].turns, 2, "reported after the search");
            assert_eq!(e.main.state, State::Done(f.title.clone()));
        }
        let prone = |word: Option<usize>| word.is_some_and(|k| k % 2 == 0);
        let bridged = play(&habits(1.0, 0.0, Some(2)));
        for (e, (_, f)) in bridged.iter().zip(&all) {
            assert_eq!(e.subs.len() == 1, prone(list_position(&f.profession)), "{}", f.profession);
        }
        let unopened = play(&habits(0.0, 1.0, Some(2)));
        for (e, (_, f)) in unopened.iter().zip(&all) {
            assert_eq!(e.subs[0].turns == 2, prone(name_position(&f.title)), "{}", f.title);
        }
        assert!((5..45).contains(&bridged.iter().filter(|e| e.subs.len() == 1).count()));
        // At a rate below 1 the draw is the same on every play.
        let half = habits(0.5, 0.5, Some(2));
        let turns = |es: &[Episode]| es.iter().map(|e| e.main.turns).collect::<Vec<_>>();
        assert_eq!(turns(&play(&half)), turns(&play(&half)));
    }

    /// The examples: each agent's turns, the main agent's beside a right sub-agent.
    #[test]
    fn world_examples_teach_each_agent_its_own_turns() {
        let world = kb(7);
        let tok = tokenizer();
        let habits =
            DelegateHabits { main_bridge: 0.5, sub_unopened: 0.5, prone_every: Some(2), worlds: 1, stages: vec![] };
        let examples = world_examples(&world, &tok, &EOS, &habits, 0, &DelegateConfig::default()).unwrap();
        let of = |a: Agent| examples.iter().filter(|e| e.agent == a).collect::<Vec<_>>();
        let questions = world.train.len() + world.heldout.len();
        // Main: 3 turns, 2 where it answered the bridge; sub: 3 turns, 2 unopened.
        assert!((2 * questions..=3 * questions).contains(&of(Agent::Main).len()));
        assert!((2 * 2 * questions..=3 * 2 * questions).contains(&of(Agent::Sub).len()));
        assert!((3 * questions..=5 * questions).contains(&of(Agent::Single).len()));
        for e in of(Agent::Main) {
            let so_far = tok.decode(&e.prefix, false).unwrap();
            let turn = tok.decode(&e.turn, false).unwrap();
            // The system prompt names the tag too: the reports are the ones closed.
            for report in so_far.split("<tool_response>").filter_map(|r| r.split_once("</tool_response>")).map(|r| r.0)
            {
                assert!(
                    report.starts_with("written by ") || report.starts_with("born in "),
                    "a right sub-agent's: {report}"
                );
            }
            assert!(turn.starts_with("<tool_call>") || turn.starts_with("<result> "), "{turn}");
        }
    }
}
