//! The delegation workload (M-GRPO): the team's episodes played by scripted agents around the
//! real Qwen3 and Llama-3.1 tokenizers (every turn generated from exactly the tokens that are
//! later trained, the environment's tokens masked, limits and hostile turns ending a
//! conversation), and `hacpo train` on it with tiny random policies, through SIGKILL and
//! `--resume`.

mod common;

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use common::{deterministic_metrics as metrics, output_text as text, run_hacpo as run, succeeded as ok};
use hacpo::delegate::conversation::{Conversation, Speech, State};
use hacpo::delegate::protocol::{DELEGATE, OPEN, SEARCH, result, tool_call};
use hacpo::delegate::relay::{Line, Relay, serve};
use hacpo::delegate::team::{
    Episode, Instructions, Limits, Mode, Tools, Voice, lead, main_messages, play, sub_messages,
};
use hacpo::search::corpus::Document;
use hacpo::search::task::Passages;
use hacpo::tokenizer::Tokenizer;
use serde_json::{Map, Value};

/// An agent whose turns a function writes from the conversation so far (decoded); it records
/// every sequence it was asked to continue.
struct Script<'a> {
    tokenizer: &'a Tokenizer,
    eos: Vec<u32>,
    kwargs: Map<String, Value>,
    write: Box<dyn Fn(&str) -> String + 'a>,
    seen: RefCell<Vec<Vec<u32>>>,
}

impl<'a> Script<'a> {
    fn new(tokenizer: &'a Tokenizer, eos: u32, write: impl Fn(&str) -> String + 'a) -> Self {
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
        Script { tokenizer, eos: vec![eos], kwargs, write: Box::new(write), seen: RefCell::new(vec![]) }
    }
}

impl Voice for Script<'_> {
    fn speech(&self) -> Speech<'_> {
        Speech { tokenizer: self.tokenizer, chat_kwargs: &self.kwargs, eos_token_ids: &self.eos }
    }

    fn turns(&self, sequences: &[Vec<u32>], _seed: u64) -> hacpo::Result<Vec<Vec<u32>>> {
        self.seen.borrow_mut().extend(sequences.iter().cloned());
        sequences
            .iter()
            .map(|s| {
                let so_far = self.tokenizer.decode(s, false)?;
                self.tokenizer.encode(&(self.write)(&so_far), false)
            })
            .collect()
    }
}

fn passages() -> Passages {
    let doc = |id: &str, title: &str, text: &str| Document { id: id.into(), title: title.into(), text: text.into() };
    Passages::new(vec![
        doc("p1", "The Glass Road", "The Glass Road is a novel written by Ann Lee."),
        doc("p2", "Ann Lee", "Ann Lee was born in Lisbon."),
        doc("p3", "Lisbon", "Lisbon is the capital of Portugal."),
    ])
    .unwrap()
}

fn limits() -> Limits {
    Limits { main_turns: 3, sub_turns: 3, calls: 2, max_tokens: 4096, turn_tokens: 64 }
}

/// The tokenizers the team is tested with, and their end-of-turn ids.
fn tokenizers() -> Vec<(Tokenizer, u32)> {
    vec![
        (Tokenizer::from_dir(&common::shared("assets/tokenizers/qwen3")).unwrap(), 151645),
        (Tokenizer::from_dir(&common::shared("assets/tokenizers/llama3.1")).unwrap(), 128009),
    ]
}

/// A main agent that delegates once and answers with what it reads; a sub-agent that searches,
/// opens the first passage it found and reports it.
fn research_team(tok: &Tokenizer, eos: u32) -> (Script<'_>, Script<'_>) {
    let main = Script::new(tok, eos, |so_far| match so_far.matches("</tool_response>").count() {
        0 => tool_call(DELEGATE, "Who wrote The Glass Road?"),
        _ => result("Ann Lee"),
    });
    let sub = Script::new(tok, eos, |so_far| match so_far.matches("</tool_response>").count() {
        0 => format!("Let me look.\n{}", tool_call(SEARCH, "Glass Road novel")),
        1 => tool_call(OPEN, "p1"),
        _ => result("The Glass Road was written by Ann Lee."),
    });
    (main, sub)
}

#[test]
fn a_delegation_is_one_token_sequence_per_agent_with_the_environment_masked() {
    let docs = passages();
    let tools = Tools { passages: &docs, search_k: 2, instructions: Instructions::Full };
    for (tok, eos) in tokenizers() {
        let (main, sub) = research_team(&tok, eos);
        let episodes = play(&main, &sub, &tools, &["Who wrote The Glass Road?"], Mode::Delegate, &limits(), 1).unwrap();
        let Episode { main: m, subs } = &episodes[0];
        assert_eq!(m.state, State::Done("Ann Lee".into()));
        assert_eq!(subs.len(), 1);
        assert_eq!(subs[0].state, State::Done("The Glass Road was written by Ann Lee.".into()));
        assert_eq!((m.turns, subs[0].turns), (2, 3));
        // Every turn was generated from the conversation's tokens up to it: the second main
        // turn continued exactly the first turn and the tool's reply.
        let seen = main.seen.borrow();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], m.prompt_ids);
        assert!(m.sequence().starts_with(&seen[1]) && seen[1].len() > seen[0].len());
        let sub_seen = sub.seen.borrow();
        assert_eq!(sub_seen.len(), 3);
        assert!(subs[0].sequence().starts_with(&sub_seen[2]));
        // The trained tokens are the agent's turns; the masked ones hold the tool's reply.
        for (c, turns) in [(m, 2usize), (&subs[0], 3)] {
            assert_eq!(c.loss_mask.len(), c.response_ids.len());
            let runs = |own: bool| -> Vec<String> {
                let mut out = vec![];
                let mut run = vec![];
                for (&id, &m) in c.response_ids.iter().zip(&c.loss_mask) {
                    if m == own {
                        run.push(id);
                    } else if !run.is_empty() {
                        out.push(tok.decode(&std::mem::take(&mut run), false).unwrap());
                    }
                }
                if !run.is_empty() {
                    out.push(tok.decode(&run, false).unwrap());
                }
                out
            };
            let (own, env) = (runs(true), runs(false));
            assert_eq!(own.len(), turns, "{own:?}");
            assert_eq!(env.len(), turns - 1, "{env:?}");
            assert!(env.iter().all(|e| e.contains("<tool_response>") && e.contains("</tool_response>")), "{env:?}");
            assert!(own.iter().all(|o| !o.contains("<tool_response>")), "{own:?}");
        }
        // The sub-agent's replies are the tools' answers; the main agent read the findings.
        let sub_text = tok.decode(&subs[0].sequence(), false).unwrap();
        assert!(sub_text.contains("p1: The Glass Road") && sub_text.contains("written by Ann Lee."), "{sub_text}");
        let main_text = tok.decode(&m.sequence(), false).unwrap();
        assert!(main_text.contains("<tool_response>The Glass Road was written by Ann Lee.</tool_response>"));
        // The sequence is the template's: its prompt, then each turn, then the reply in the
        // template's markers (the end of the turn and the next one's header are the
        // environment's, masked).
        let prompt = tok.apply_chat_template(&m.messages[..2], true, &main.kwargs).unwrap();
        let last = tok.apply_chat_template(&m.messages[..4], true, &main.kwargs).unwrap();
        let reply_tail = &last[last.rfind("</tool_call>").unwrap() + "</tool_call>".len()..];
        let call = tool_call(DELEGATE, "Who wrote The Glass Road?");
        assert_eq!(main_text, format!("{prompt}{call}{reply_tail}{}", result("Ann Lee")));
    }
}

/// A team for the split: the main agent delegates twice on one question, answers another
/// at once and delegates a task its sub-agent fails on a third; the sub-agent searches the
/// task, opens a title and reports the passage.
fn varied_team(tok: &Tokenizer, eos: u32) -> (Script<'_>, Script<'_>) {
    let main = Script::new(tok, eos, |so_far| {
        let replies = so_far.matches("</tool_response>").count();
        if so_far.contains("Which country") {
            return result("Portugal");
        }
        if so_far.contains("Who edited") {
            return if replies == 0 { tool_call(DELEGATE, "nothing to find") } else { result("unknown") };
        }
        match replies {
            0 => tool_call(DELEGATE, "Who wrote The Glass Road?"),
            1 => tool_call(DELEGATE, "Where was Ann Lee born?"),
            _ => result("Lisbon"),
        }
    });
    let sub = Script::new(tok, eos, |so_far| {
        if so_far.contains("nothing to find") {
            return "oops".into();
        }
        let last_reply = || {
            let from = so_far.rfind("<tool_response>").unwrap() + "<tool_response>".len();
            so_far[from..so_far.rfind("</tool_response>").unwrap()].to_string()
        };
        let book = so_far.contains("Who wrote");
        match so_far.matches("</tool_response>").count() {
            0 => tool_call(SEARCH, if book { "Glass Road" } else { "Ann Lee born" }),
            1 => tool_call(OPEN, if book { "The Glass Road" } else { "Ann Lee" }),
            _ => result(&last_reply()),
        }
    });
    (main, sub)
}

/// One side of an in-memory line between two threads: a round sends this side's part and
/// waits for the other side's part of the same phase.
struct Channel {
    to: std::sync::mpsc::Sender<(String, Vec<u8>)>,
    from: std::sync::mpsc::Receiver<(String, Vec<u8>)>,
}

impl Line for Channel {
    fn round(&self, phase: &str, mine: Vec<u8>) -> hacpo::Result<Vec<u8>> {
        self.to.send((phase.to_string(), mine)).unwrap();
        let (theirs, part) = self.from.recv().unwrap();
        assert_eq!(theirs, phase, "the two sides play the same rounds");
        Ok(part)
    }
}

fn same_conversation(a: &Conversation, b: &Conversation, what: &str) {
    assert_eq!(
        (&a.prompt_ids, &a.response_ids, &a.loss_mask),
        (&b.prompt_ids, &b.response_ids, &b.loss_mask),
        "{what}"
    );
    assert_eq!((a.turns, &a.state), (b.turns, &b.state), "{what}");
}

/// The team split between two processes (here two threads on a line) plays the episodes one
/// process plays: the main side has the main conversations, the sub side the sub-agents', each
/// knowing how the other side's ended. The two agents are of two families (tokenizers and
/// chat templates); only texts pass between them.
#[test]
fn a_team_split_between_two_processes_plays_the_one_process_episodes() {
    let docs = passages();
    let tools = Tools { passages: &docs, search_k: 2, instructions: Instructions::Brief };
    let questions = ["Where was the author of The Glass Road born?", "Which country is Lisbon in?", "Who edited it?"];
    // Two families: a Qwen3 main agent and a Llama-3.1 sub-agent; only texts pass between them.
    let toks = tokenizers();
    let ((qwen, qwen_eos), (llama, llama_eos)) = (&toks[0], &toks[1]);
    let (main, sub) = (varied_team(qwen, *qwen_eos).0, varied_team(llama, *llama_eos).1);
    let one = play(&main, &sub, &tools, &questions, Mode::Delegate, &limits(), 5).unwrap();
    assert!(qwen.decode(&one[0].main.sequence(), false).unwrap().contains("<|im_start|>assistant"));
    let research = llama.decode(&one[0].subs[1].sequence(), false).unwrap();
    assert!(research.contains("<|start_header_id|>assistant") && research.contains("born in Lisbon"), "{research}");
    let subs: Vec<usize> = one.iter().map(|e| e.subs.len()).collect();
    assert_eq!(subs, [2, 0, 1]);
    assert_eq!(one[2].subs[0].state, State::Failed("no <tool_call> and no <result>".into()));

    let (to_sub, from_main) = std::sync::mpsc::channel();
    let (to_main, from_sub) = std::sync::mpsc::channel();
    let (main_line, sub_line) = (Channel { to: to_sub, from: from_sub }, Channel { to: to_main, from: from_main });
    let (mains, served) = std::thread::scope(|scope| {
        let docs = &docs;
        let main_side = scope.spawn(move || {
            let (tok, eos) = tokenizers().remove(0);
            let main = varied_team(&tok, eos).0;
            let tools = Tools { passages: docs, search_k: 2, instructions: Instructions::Brief };
            let mut relay = Relay::new(&main_line);
            let mains = lead(&main, &mut relay, &tools, &questions, Mode::Delegate, &limits(), 5).unwrap();
            relay.finish(mains).unwrap()
        });
        let sub_side = scope.spawn(move || {
            let (tok, eos) = tokenizers().remove(1);
            let sub = varied_team(&tok, eos).1;
            let tools = Tools { passages: docs, search_k: 2, instructions: Instructions::Brief };
            serve(&sub, &tools, &limits(), questions.len(), 5, &sub_line).unwrap()
        });
        (main_side.join().unwrap(), sub_side.join().unwrap())
    });
    for (e, ((m, s), o)) in mains.iter().zip(&served).zip(&one).enumerate() {
        same_conversation(&m.main, &o.main, &format!("episode {e}'s main conversation"));
        assert_eq!(s.main.state, o.main.state, "the sub side knows how episode {e} ended");
        assert_eq!((m.subs.len(), s.subs.len()), (o.subs.len(), o.subs.len()), "episode {e}'s calls");
        for (i, ((ms, ss), os)) in m.subs.iter().zip(&s.subs).zip(&o.subs).enumerate() {
            same_conversation(ss, os, &format!("episode {e}'s sub-agent {i}"));
            assert_eq!(ms.state, os.state, "the main side knows how its sub-agent {i} ended");
            assert!(ms.response_ids.is_empty(), "the main side holds no sub-agent tokens");
        }
    }
}

/// `open` finds a passage by its id, else by its title (what the hit list shows beside it);
/// anything else is a reply that says so, not an error.
#[test]
fn open_takes_a_passage_id_or_its_title() {
    let docs = passages();
    let tools = Tools { passages: &docs, search_k: 2, instructions: Instructions::Brief };
    let by_id = tools.call(OPEN, "p2").unwrap();
    assert_eq!(by_id, "Ann Lee: Ann Lee was born in Lisbon.");
    assert_eq!(tools.call(OPEN, "Ann Lee").unwrap(), by_id);
    assert_eq!(tools.call(OPEN, "ann lee").unwrap(), "no passage has id or title ann lee");
    assert!(tools.call(SEARCH, "Glass Road").unwrap().starts_with("p1: The Glass Road"));
}

/// Brief instructions are one sentence per agent with no example call (the turns are the
/// protocol's all the same), and tell the single agent from the main agent, which one
/// pre-trained policy may play both.
#[test]
fn brief_instructions_name_each_agents_task_without_example_calls() {
    let system = |m: Vec<hacpo::tokenizer::Message>| m[0].content.clone();
    let mut briefs = vec![];
    for mode in [Mode::Delegate, Mode::Single] {
        let (full, brief) =
            (main_messages("q?", mode, Instructions::Full), main_messages("q?", mode, Instructions::Brief));
        assert_eq!(full[1].content, brief[1].content, "the question is the user's message");
        assert!(system(full).contains("<tool_call>{"));
        briefs.push(system(brief));
    }
    briefs.push(system(sub_messages("t", Instructions::Brief)));
    assert!(system(sub_messages("t", Instructions::Full)).contains("<tool_call>{"));
    for b in &briefs {
        assert!(!b.contains('<') && b.ends_with('.') && b.matches('.').count() == 1, "{b}");
    }
    assert!(briefs[0] != briefs[1] && briefs[1] != briefs[2] && briefs[0] != briefs[2], "{briefs:?}");
}

#[test]
fn limits_and_hostile_turns_end_a_conversation_as_failed() {
    let docs = passages();
    let tools = Tools { passages: &docs, search_k: 2, instructions: Instructions::Full };
    let (tok, eos) = tokenizers().remove(0);
    let questions = ["q"];
    let run_with = |main: &Script, sub: &Script, limits: Limits| {
        play(main, sub, &tools, &questions, Mode::Delegate, &limits, 0).unwrap().remove(0)
    };
    // A sub-agent that never reports: failed after its turns; the main agent reads that.
    let main = Script::new(&tok, eos, |so_far| match so_far.matches("</tool_response>").count() {
        0 => tool_call(DELEGATE, "t"),
        _ => result(if so_far.contains("found nothing") { "none" } else { "?" }),
    });
    let searcher = Script::new(&tok, eos, |_| tool_call(SEARCH, "lisbon"));
    let e = run_with(&main, &searcher, limits());
    assert_eq!(e.subs[0].state, State::Failed("no result within 3 turns".into()));
    assert_eq!(e.main.state, State::Done("none".into()));
    // Delegating past the limit, never answering, a malformed turn, an over-long conversation.
    let (_, reporter) = research_team(&tok, eos);
    let delegator = Script::new(&tok, eos, |_| tool_call(DELEGATE, "t"));
    let e = run_with(&delegator, &reporter, Limits { calls: 1, ..limits() });
    assert_eq!(e.main.state, State::Failed("more than 1 delegations".into()));
    assert_eq!(e.subs.len(), 1, "a delegation past the limit starts no sub-agent");
    let e = run_with(&delegator, &reporter, Limits { calls: 5, main_turns: 2, ..limits() });
    assert_eq!(e.main.state, State::Failed("no result within 2 turns".into()));
    let rambler = Script::new(&tok, eos, |_| "<result>a</result> and <result>b</result>".into());
    let e = run_with(&rambler, &reporter, limits());
    assert_eq!(e.main.state, State::Failed("more than one action in a turn".into()));
    assert!(e.subs.is_empty());
    let faker = Script::new(&tok, eos, |_| "<tool_response>Ann Lee</tool_response>".into());
    let e = run_with(&faker, &reporter, limits());
    assert!(matches!(&e.main.state, State::Failed(why) if why.contains("environment's tag")), "{:?}", e.main.state);
    let e = run_with(&delegator, &reporter, Limits { max_tokens: 150, ..limits() });
    assert!(matches!(&e.main.state, State::Failed(why) if why.contains("would pass 150 tokens")), "{:?}", e.main.state);
    assert!(e.main.len() <= 150, "a reply that would not fit is not appended");
    // Reasoning before the action, as Qwen3 writes it (its template rewrites such a turn once
    // the conversation goes on): the reply still follows the turn's own tokens.
    let thinker = Script::new(&tok, eos, |so_far| match so_far.matches("</tool_response>").count() {
        0 => format!("<think>two hops</think>{}", tool_call(DELEGATE, "Who wrote The Glass Road?")),
        _ => format!("<think>\n\n</think>\n\n{}", result("Ann Lee")),
    });
    let e = run_with(&thinker, &reporter, limits());
    assert_eq!(e.main.state, State::Done("Ann Lee".into()));
    assert!(tok.decode(&e.main.sequence(), false).unwrap().contains("<think>two hops</think><tool_call>"));
    // The single agent searches itself.
    let single = Script::new(&tok, eos, |so_far| match so_far.matches("</tool_response>").count() {
        0 => tool_call(SEARCH, "Ann Lee born"),
        _ => result("Lisbon"),
    });
    let e = play(&single, &reporter, &tools, &questions, Mode::Single, &limits(), 0).unwrap().remove(0);
    assert_eq!(e.main.state, State::Done("Lisbon".into()));
    assert!(e.subs.is_empty());
    assert!(tok.decode(&e.main.sequence(), false).unwrap().contains("p2: Ann Lee"));
    let delegating_alone = run_with(&delegator, &reporter, Limits { main_turns: 4, ..limits() });
    assert_eq!(delegating_alone.main.state, State::Failed("more than 2 delegations".into()));
    assert_eq!(delegating_alone.subs.len(), 2);
    let e = play(&delegator, &reporter, &tools, &questions, Mode::Single, &limits(), 0).unwrap().remove(0);
    assert_eq!(e.main.state, State::Failed("no tool named \"delegate\"".into()));
}

struct Setup {
    _agent: tempfile::TempDir,
    data: tempfile::TempDir,
    model: PathBuf,
}

/// A tiny random policy that favours the protocol's tags and the answers' words, a corpus and
/// questions.
fn setup() -> Setup {
    let words = &["<result>", "</result>", " Lisbon", "<tool_call>", "</tool_call>"];
    let agent = common::tiny_agent_writing("qwen3", "qwen3", 32, 3, words, false);
    let data = tempfile::tempdir().unwrap();
    let docs = passages();
    let docs: Vec<(&str, &str, &str)> =
        docs.documents.iter().map(|d| (d.id.as_str(), d.title.as_str(), d.text.as_str())).collect();
    let questions = [
        ("q1", "Where was the author of The Glass Road born?", vec!["Lisbon"]),
        ("q2", "Who wrote The Glass Road?", vec!["Ann Lee"]),
        ("q3", "Which country has Lisbon as its capital?", vec!["Portugal"]),
    ];
    common::write_qa_files(data.path(), &docs, &questions);
    let model = agent.path().to_path_buf();
    Setup { _agent: agent, data, model }
}

impl Setup {
    fn config(&self, algo: &str) -> PathBuf {
        let path = |n: &str| self.data.path().join(n).display().to_string();
        let toml = format!(
            r#"
[run]
seed = 3
steps = 3
checkpoint_every = 1

[workload]
kind = "delegate"

[workload.delegate]
main_turns = 2
sub_turns = 2
calls = 2
max_tokens = 768

[workload.delegate.mgrpo]
align = 2

[algo]
name = "{algo}"
group_size = 2
prompts_per_step = 2
minibatch_prompts = 2
micro_batch_sequences = 8

[rollout]
max_new_tokens = 12
batch_prompts = 4
max_prompt_tokens = 512

[task]
kind = "qa"
train = "{questions}"
corpus = "{corpus}"
validation = "{questions}"
val_limit = 2
val_every = 3
val_max_new_tokens = 12

[[policies]]
name = "agent"
model = "{model}"
chat_template_kwargs = {{ enable_thinking = false }}
"#,
            questions = path("questions.jsonl"),
            corpus = path("corpus.jsonl"),
            model = self.model.display(),
        );
        let file = self.data.path().join(format!("{algo}.toml"));
        std::fs::write(&file, toml).unwrap();
        file
    }
}

fn get(record: &Value, key: &str) -> f64 {
    record["data"][key].as_f64().unwrap_or_else(|| panic!("no {key} in {record}"))
}

#[test]
fn m_grpo_trains_through_the_trainer_and_resumes_after_sigkill() {
    let s = setup();
    let cfg = s.config("mgrpo");
    let cfg = cfg.to_str().unwrap();
    let reference = s.data.path().join("reference");
    let out = ok(run(&["train", "--config", cfg, "--out", reference.to_str().unwrap()]));
    assert!(text(&out).contains("held-out F1"), "{}", text(&out));
    let m = metrics(&reference);
    assert_eq!(m.len(), 3, "one record per step for the one policy playing both roles");
    for r in &m {
        for key in ["delegate/calls_per_episode", "delegate/main_format_fail", "delegate/f1", "delegate/align_masked"] {
            assert!(get(r, key).is_finite() && get(r, key) >= 0.0, "{key}: {r}");
        }
        assert!(get(r, "response_length/mean") > 0.0 && get(r, "actor/entropy") > 0.0, "the update read them: {r}");
        assert!(get(r, "actor/grad_norm").is_finite());
    }
    assert!(m[2]["data"].get("val/f1").is_some() && m[2]["data"].get("val/calls").is_some());
    let killed = s.data.path().join("killed");
    let mut args = vec!["train", "--out", killed.to_str().unwrap(), "--config", cfg];
    common::train_killed_after_checkpoint(&args, 2);
    args.truncate(0);
    ok(run(&["train", "--resume", killed.to_str().unwrap()]));
    assert_eq!(metrics(&killed), m);
    // The other two variants run on the same world, and M-GRPO with the grounded judge.
    for (algo, set) in
        [("mgrpo-main-only", None), ("search-grpo", None), ("mgrpo", Some("workload.delegate.judge=grounded"))]
    {
        let cfg = s.config(algo);
        let out_dir = s.data.path().join(format!("{algo}-{}", set.is_some()));
        let mut args =
            vec!["train", "--config", cfg.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--steps", "1"];
        args.extend(set.iter().flat_map(|s| ["--set", *s]));
        ok(run(&args));
        let r = &metrics(&out_dir)[0];
        if algo == "search-grpo" {
            assert_eq!(get(r, "delegate/calls_per_episode"), 0.0);
        }
        if set.is_some() {
            assert!((0.0..=1.0).contains(&get(r, "delegate/judge")), "{r}");
        }
    }
}

#[test]
fn bad_delegate_settings_are_refused_before_anything_loads() {
    let s = setup();
    let cfg = s.config("mgrpo");
    let out = s.data.path().join("x");
    for (set, expect) in [
        ("workload.delegate.main_turns=0", "workload.delegate.main_turns"),
        ("workload.delegate.f1_threshold=1.5", "f1_threshold"),
        ("workload.delegate.mgrpo.align=0", "align"),
        ("workload.delegate.calls=0", "workload.delegate.calls"),
        ("workload.delegate.mgrpo.epsilon=0.1", "algo.adv_epsilon"),
        ("workload.delegate.judge=\"llm\"", "grounded"),
        ("algo.name=hacpo", "the delegate workload trains with mgrpo, mgrpo-main-only or search-grpo"),
    ] {
        let o = run(&["train", "--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", text(&o));
        assert!(text(&o).contains(expect), "{set}: expected {expect:?} in {}", text(&o));
    }
    assert!(!Path::new(&out).join("checkpoints").exists());
}

/// configs/tiny-delegate.toml (the shipped pre-trained team, which delegates) with the main
/// agent and the sub-agent as two policies, short; with `cluster` appended.
fn split_team_config(dir: &Path, name: &str, cluster: &str) -> String {
    let base =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tiny-delegate.toml")).unwrap();
    let settings = &base[..base.find("[[policies]]").unwrap()];
    let policies = "[[policies]]\nname = \"lead\"\nmodel = \"tiny-delegate\"\n\n\
                    [[policies]]\nname = \"researcher\"\nmodel = \"tiny-delegate\"\n\n\
                    [[roles]]\nname = \"main\"\npolicies = [\"lead\"]\n\n\
                    [[roles]]\nname = \"sub\"\npolicies = [\"researcher\"]\n";
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("{settings}{policies}{cluster}")).unwrap();
    path.to_str().unwrap().to_string()
}

/// `hacpo train` arguments for a short run of `config` into `out`.
fn short<'a>(config: &'a str, out: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train", "--config", config, "--out", out];
    for s in ["run.steps=2", "run.checkpoint_every=1", "algo.prompts_per_step=3", "algo.minibatch_prompts=3"] {
        a.extend(["--set", s]);
    }
    a.extend([
        "--set",
        "task.val_every=2",
        "--set",
        "task.val_limit=6",
        "--set",
        "workload.delegate.pilot_questions=4",
    ]);
    // Not the pilot's d: a process that lost the pilot's would align to 5.
    a.extend(["--set", "workload.delegate.mgrpo.align=5"]);
    a.extend(more);
    a
}

/// M-GRPO's decoupled trainers: the main agent's and the sub-agent's in two processes that
/// meet through a real `nats-server` (delegations and findings cross, no weights), each
/// ending where the one-process run did (metrics, held-out F1, weights, bit for bit); also
/// when the sub-agent's process is SIGKILLed after its first checkpoint and resumed. The
/// alignment target comes from a pilot that both processes play together, and a resumed
/// process takes it from its checkpoint.
#[test]
fn the_main_agent_and_the_sub_agent_train_in_two_processes_as_in_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let one = dir("one");
    let config = split_team_config(tmp.path(), "one", "");
    let said = text(&ok(run(&short(&config, &one, &[]))));
    assert!(said.contains("delegation pilot:") && said.contains("aligned to d = "), "{said}");
    let reference = metrics(Path::new(&one));
    // The pilot's d is every step's and is what a checkpoint keeps.
    let d = get(&reference[0], "delegate/align_target");
    assert!((1.0..5.0).contains(&d) && reference.iter().all(|r| get(r, "delegate/align_target") == d), "{reference:?}");
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&one).join("checkpoints/step-000001/trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["workload"]["align"].as_f64(), Some(d), "{state}");
    assert!(
        reference.iter().all(|r| r["agent"] != "researcher" || get(r, "delegate/calls_per_episode") > 0.5),
        "the team delegates, so the sub-agent's side has work: {reference:?}"
    );
    let server = common::nats_server::NatsServer::start();
    for (run_name, kill_sub) in [("team", false), ("team-killed", true)] {
        let cluster = format!(
            "\n[cluster]\nnats = \"{}\"\nrun = \"{run_name}\"\ntimeout_s = 300\n\
             [[cluster.hosts]]\nname = \"m\"\npolicies = [\"lead\"]\n\
             [[cluster.hosts]]\nname = \"s\"\npolicies = [\"researcher\"]\n",
            server.url()
        );
        let config = split_team_config(tmp.path(), run_name, &cluster);
        let (m, s) = (dir(&format!("{run_name}-m")), dir(&format!("{run_name}-s")));
        let log = tmp.path().join(format!("{run_name}-m.log"));
        let main_host = common::hacpo_command(&short(&config, &m, &["--host", "m"]))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        if kill_sub {
            common::train_killed_after_checkpoint(&short(&config, &s, &["--host", "s"]), 1);
            let said = text(&ok(run(&["train", "--resume", &s, "--host", "s"])));
            assert!(!said.contains("delegation pilot"), "the checkpoint keeps the pilot's d: {said}");
        } else {
            ok(run(&short(&config, &s, &["--host", "s"])));
        }
        let status = main_host.wait_with_output().unwrap().status;
        assert!(status.success(), "host m: {}", std::fs::read_to_string(&log).unwrap());
        for (host, agent, k) in [(&m, "lead", 0), (&s, "researcher", 1)] {
            let mine = metrics(Path::new(host));
            let theirs: Vec<Value> = reference.iter().filter(|r| r["agent"] == agent).cloned().collect();
            assert_eq!(mine, theirs, "{run_name}: {agent}'s metrics");
            let before = |d: &str| -> Value {
                serde_json::from_str(&std::fs::read_to_string(Path::new(d).join("before.json")).unwrap()).unwrap()
            };
            assert_eq!(before(host)[agent], before(&one)[agent], "{run_name}: {agent}'s held-out F1 before");
            let weights = |d: &str| {
                std::fs::read(Path::new(d).join(format!("checkpoints/step-000002/agent-{k}/model.safetensors")))
            };
            assert!(weights(host).unwrap() == weights(&one).unwrap(), "{run_name}: {agent}'s weights");
        }
    }
}
