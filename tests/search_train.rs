//! `hacpo train` on the search workload as a user runs it: tiny random policies around the
//! real Qwen3 and Llama-3.1 tokenizers, a JSON Lines corpus and questions, the real BM25
//! retriever, MHGPO's three samplings, checkpoints, SIGKILL and `--resume`, and the errors
//! (exit code 2) for bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{deterministic_metrics as metrics, output_text as text, rejects, run_hacpo as run, succeeded as ok};
use serde_json::Value;

struct Setup {
    _agents: [tempfile::TempDir; 2],
    data: tempfile::TempDir,
    qwen: PathBuf,
    llama: PathBuf,
}

/// Policies that favour the answer's tokens (so F1 varies between outputs) and a two-hop
/// corpus with distractors.
fn setup() -> Setup {
    let words = &[" Cincinnati", " Ohio", ","];
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, words);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, words);
    let data = tempfile::tempdir().unwrap();
    let passages = [
        ("0", "Jaws (film)", "Jaws is a 1975 thriller film directed by Steven Spielberg."),
        ("1", "Steven Spielberg", "Steven Spielberg was born in Cincinnati, Ohio, in 1946."),
        ("2", "Cincinnati", "Cincinnati is a city in Ohio on the Ohio River."),
        ("3", "Shark", "Sharks are fish with a cartilaginous skeleton."),
        ("4", "Jaws (novel)", "Jaws is a 1974 novel by Peter Benchley about a shark."),
        ("5", "Peter Benchley", "Peter Benchley was born in New York City in 1940."),
    ];
    let questions = [
        ("q1", "Where was the director of Jaws born?", vec!["Cincinnati", "Cincinnati, Ohio"]),
        ("q2", "In which state is the birthplace of Steven Spielberg?", vec!["Ohio"]),
        ("q3", "Where was the author of the novel Jaws born?", vec!["New York City"]),
        ("q4", "Which river flows past the city where Spielberg was born?", vec!["Ohio River"]),
    ];
    common::write_qa_files(data.path(), &passages, &questions);
    let (q, l) = (qwen.path().to_path_buf(), llama.path().to_path_buf());
    Setup { _agents: [qwen, llama], data, qwen: q, llama: l }
}

impl Setup {
    fn path(&self, name: &str) -> String {
        self.data.path().join(name).display().to_string()
    }

    /// A config: `algo` with the Qwen policy playing every role, or (`per_role`) the Qwen
    /// policy as Rewriter and Reranker and the Llama one as Answerer.
    fn config(&self, algo: &str, per_role: bool, extra: &str) -> PathBuf {
        let policies = if per_role {
            format!(
                r#"
[[policies]]
name = "qwen"
model = "{}"
chat_template_kwargs = {{ enable_thinking = false }}

[[policies]]
name = "llama"
model = "{}"

[[roles]]
name = "rewriter"
policies = ["qwen"]

[[roles]]
name = "reranker"
policies = ["qwen"]

[[roles]]
name = "answerer"
policies = ["llama"]
"#,
                self.qwen.display(),
                self.llama.display()
            )
        } else {
            format!(
                "[[policies]]\nname = \"qwen\"\nmodel = \"{}\"\nchat_template_kwargs = {{ enable_thinking = false }}\n",
                self.qwen.display()
            )
        };
        let toml = format!(
            r#"
[run]
seed = 7
steps = 3
checkpoint_every = 1

[workload]
kind = "search"

[algo]
name = "{algo}"
group_size = 2
prompts_per_step = 2
minibatch_prompts = 1
micro_batch_sequences = 8
kl_coef = 0.01

[algo.optimizer]
lr = 1e-3

[rollout]
max_new_tokens = 6
batch_prompts = 8
max_prompt_tokens = 1024

[task]
kind = "qa"
train = "{questions}"
corpus = "{corpus}"
validation = "{questions}"
val_limit = 2
val_every = 3
val_max_new_tokens = 6
{extra}
{policies}"#,
            questions = self.path("questions.jsonl"),
            corpus = self.path("corpus.jsonl"),
        );
        let path = self.data.path().join(format!("{algo}-{per_role}.toml"));
        std::fs::write(&path, toml).unwrap();
        path
    }
}

fn hacpo(args: &[&str]) -> Command {
    common::hacpo_command(args)
}

/// `hacpo train ARGS --out DIR` killed right after its step-2 checkpoint (abort: no clean-up,
/// the lock left behind), then `--resume DIR`; the resumed run's metrics.
fn killed_and_resumed(args: &[&str], dir: &Path) -> Vec<Value> {
    let mut all = vec!["train", "--out", dir.to_str().unwrap()];
    all.extend(args);
    common::train_killed_after_checkpoint(&all, 2);
    ok(run(&["train", "--resume", dir.to_str().unwrap()]));
    metrics(dir)
}

fn get(record: &Value, key: &str) -> f64 {
    record["data"][key].as_f64().unwrap_or_else(|| panic!("no {key} in {record}"))
}

#[test]
fn fork_on_first_trains_resumes_after_sigkill_and_reports_f1() {
    let s = setup();
    let cfg = s.config("mhgpo-fof", false, "");
    let cfg = cfg.to_str().unwrap();
    let reference = s.data.path().join("reference");
    let out = ok(run(&["train", "--config", cfg, "--out", reference.to_str().unwrap()]));
    let log = text(&out);
    assert!(log.contains("held-out F1 before training") && log.contains("held-out F1"), "{log}");
    let m = metrics(&reference);
    assert_eq!(m.len(), 3, "one record per step for the one policy");
    for r in &m {
        // FoF, G = 2, 2 questions: every role has 2 groups of 2, all trained.
        for role in ["rewriter", "reranker", "answerer"] {
            assert_eq!(get(r, &format!("search/{role}/trained")), 4.0, "{role}: {r}");
        }
        let f1 = get(r, "search/f1");
        assert!((0.0..=1.0).contains(&f1));
        assert!(get(r, "actor/grad_norm").is_finite());
        // FoF continues 1-to-1, so mean aggregation makes each role's mean reward its
        // successor's plus its own mean penalty (MMOA-RAG's −1, −1, −0.5).
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} vs {b} in {r}");
        let rate = |role: &str| get(r, &format!("search/{role}/penalty_rate"));
        let reward = |role: &str| get(r, &format!("search/{role}/reward"));
        close(reward("answerer"), f1 - rate("answerer"));
        close(reward("reranker"), reward("answerer") - rate("reranker"));
        close(reward("rewriter"), reward("reranker") - 0.5 * rate("rewriter"));
    }
    // The policies favour the answer's words, so F1 differs within groups and the policy
    // gradient is not zero.
    assert!(m.iter().any(|r| get(r, "search/f1") > 0.0), "{m:?}");
    assert!(m.iter().any(|r| get(r, "actor/pg_loss") != 0.0), "{m:?}");
    assert!((0.0..=1.0).contains(&get(&m[2], "val/f1")) && m[2]["data"].get("val/em").is_some());
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(reference.join("summary.json")).unwrap()).unwrap();
    assert!(summary["agents"]["qwen"]["before"].is_number(), "{summary}");

    // Killed right after the checkpoint of step 2, then resumed: the same three records.
    let killed = s.data.path().join("killed");
    assert_eq!(killed_and_resumed(&["--config", cfg], &killed), m);
}

#[test]
fn per_role_policies_with_different_tokenizers_train_with_independent_sampling() {
    let s = setup();
    let cfg = s.config("mhgpo-is", true, "");
    let out_dir = s.data.path().join("is");
    ok(run(&["train", "--config", cfg.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--steps", "1"]));
    let m = metrics(&out_dir);
    let by_agent = |a: &str| m.iter().find(|r| r["agent"] == a).unwrap_or_else(|| panic!("no {a} record"));
    let (qwen, llama) = (by_agent("qwen"), by_agent("llama"));
    // IS, G = 2, 2 questions: each role's homogeneous fork group (2 per question) trains; the
    // chains before a fork and the continuations after it only carry rewards.
    for role in ["rewriter", "reranker", "answerer"] {
        assert_eq!(get(qwen, &format!("search/{role}/trained")), 4.0, "{role}");
    }
    // The Llama Answerer learns from its own outputs, the Qwen policy from two roles'.
    assert!(get(llama, "actor/grad_norm").is_finite() && get(qwen, "actor/grad_norm").is_finite());
}

#[test]
fn round_robin_masks_the_chain_before_its_fork() {
    let s = setup();
    // RR forking always at the Answerer: the Rewriter and Reranker outputs are singletons.
    let cfg =
        s.config("mhgpo-rr", false, "[workload.search]\nrr_probabilities = [0.0, 0.0, 1.0]\naggregate = \"max\"\n");
    let out_dir = s.data.path().join("rr");
    ok(run(&["train", "--config", cfg.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--steps", "1"]));
    let r = &metrics(&out_dir)[0];
    assert_eq!(get(r, "search/rewriter/trained"), 0.0);
    assert_eq!(get(r, "search/reranker/trained"), 0.0);
    assert_eq!(get(r, "search/answerer/trained"), 4.0);
}

#[test]
fn mappo_trains_a_value_head_and_resumes_it_exactly() {
    let s = setup();
    let cfg = s.config("mappo", false, "");
    let cfg = cfg.to_str().unwrap();
    let reference = s.data.path().join("mappo");
    ok(run(&["train", "--config", cfg, "--out", reference.to_str().unwrap(), "--set", "task.val_every=0"]));
    let m = metrics(&reference);
    assert_eq!(m.len(), 3);
    for r in &m {
        // G independent trajectories per question, every output trained, no group baseline.
        for role in ["rewriter", "reranker", "answerer"] {
            assert_eq!(get(r, &format!("search/{role}/trained")), 4.0, "{role}: {r}");
        }
        // Each output's reward is its trajectory's F1 plus its own penalty only.
        let rate = |role: &str| get(r, &format!("search/{role}/penalty_rate"));
        let reward = |role: &str| get(r, &format!("search/{role}/reward"));
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} vs {b} in {r}");
        close(reward("reranker"), get(r, "search/f1") - rate("reranker"));
        close(reward("rewriter"), get(r, "search/f1") - 0.5 * rate("rewriter"));
        assert!(get(r, "critic/vf_loss").is_finite());
        assert!(get(r, "critic/vf_explained_var").is_finite());
    }
    // The value head starts at zero and learns: the value loss changes between steps.
    assert!(m.windows(2).any(|w| get(&w[0], "critic/vf_loss") != get(&w[1], "critic/vf_loss")), "{m:?}");
    let state = |run: &Path| -> Value {
        let path = run.join("checkpoints/step-000003/trainer_state.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let head = &state(&reference)["value_heads"][0];
    assert!(head["weight"].as_array().unwrap().iter().any(|w| w.as_f64() != Some(0.0)), "{head}");
    // By default the head reads the policy's trunk (TRL 0.9): no value model of its own.
    assert!(!reference.join("checkpoints/step-000003/agent-0-critic").exists());
    assert!(m.iter().all(|r| r["data"].get("critic/grad_norm").is_none()), "{m:?}");

    // Killed after step 2, resumed: the value head and its moments come back bit for bit.
    let killed = s.data.path().join("mappo-killed");
    assert_eq!(killed_and_resumed(&["--config", cfg, "--set", "task.val_every=0"], &killed), m);

    // A value model of its own, saved beside the policy and trained by its own optimizer (its
    // first step has no gradient: the head starts at zero). A different run, resumed exactly
    // too: the value model, the head and their moments come back bit for bit.
    let own = ["--config", cfg, "--set", "task.val_every=0", "--set", "algo.mappo.shared_trunk=false"];
    let separate = s.data.path().join("mappo-own");
    let mut args = vec!["train", "--out", separate.to_str().unwrap()];
    args.extend(own);
    ok(run(&args));
    let mo = metrics(&separate);
    assert_eq!(state(&separate)["value_trunks"], true);
    let ckpt = separate.join("checkpoints/step-000003");
    assert!(ckpt.join("agent-0-critic/model.safetensors").is_file());
    assert!(ckpt.join("agent-0-critic.optim.safetensors").is_file());
    assert!(mo.iter().any(|r| get(r, "critic/grad_norm") > 0.0), "{mo:?}");
    assert_ne!(get(&mo[1], "critic/vf_loss"), get(&m[1], "critic/vf_loss"));
    assert_eq!(killed_and_resumed(&own, &s.data.path().join("mappo-own-killed")), mo);
    // A checkpoint of one kind does not resume as the other.
    let err = run(&["train", "--resume", separate.to_str().unwrap(), "--set", "algo.mappo.shared_trunk=true"]);
    assert!(!err.status.success());
}

#[test]
fn passages_that_do_not_fit_the_prompt_limit_are_dropped_not_fatal() {
    let s = setup();
    let cfg = s.config("mhgpo-fof", false, "");
    let out_dir = s.data.path().join("tight");
    // Room for the Rewriter's prompt, not for the Reranker's six passages: training and the
    // held-out evaluation both show fewer passages instead of stopping.
    let args = ["--steps", "1", "--set", "rollout.max_prompt_tokens=140"];
    let mut all = vec!["train", "--config", cfg.to_str().unwrap(), "--out", out_dir.to_str().unwrap()];
    all.extend(args);
    ok(run(&all));
    let r = &metrics(&out_dir)[0];
    assert!(get(r, "search/dropped_passages") > 0.0, "{r}");
    assert!((0.0..=1.0).contains(&get(r, "val/f1")), "{r}");
}

#[test]
fn a_study_compares_mhgpo_with_mappo_by_held_out_f1() {
    let s = setup();
    let cfg = s.config("mhgpo-fof", false, "");
    let out = s.data.path().join("study");
    let o = ok(run(&[
        "study",
        "--config",
        cfg.to_str().unwrap(),
        "--algos",
        "mhgpo-rr,mappo",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]));
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(table.starts_with("Held-out F1 after training"), "{table}");
    for variant in ["| mhgpo-rr |", "| mappo |"] {
        assert!(table.contains(variant), "{table}\n{}", text(&o));
    }
    assert!(table.contains("s/step") && table.contains("peak GB"), "{table}");
    // Each run trained in a process of its own, which measured its own peak memory.
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    for line in csv.lines().skip(1) {
        let peak: f64 = line.rsplit(',').next().unwrap().parse().unwrap_or_else(|_| panic!("{csv}"));
        assert!(peak > 0.0, "{csv}");
        // Every output of a tree counts, all three roles: more than the 2 questions × G = 2.
        let rollouts: u64 = line.split(',').nth(6).unwrap().parse().unwrap_or_else(|_| panic!("{csv}"));
        assert!(rollouts > 4, "{csv}");
    }
    assert!(out.join("plans/mappo-seed-0.toml").exists());
}

#[test]
fn bad_search_input_gets_clear_errors() {
    let s = setup();
    let out = s.data.path().join("bad");
    let out = out.to_str().unwrap();
    let edit = |from: &str, to: &str, name: &str| {
        let cfg = std::fs::read_to_string(s.config("mhgpo-fof", true, "")).unwrap();
        assert!(cfg.contains(from), "{from}");
        let path = s.data.path().join(name);
        std::fs::write(&path, cfg.replace(from, to)).unwrap();
        path.display().to_string()
    };
    // A role mapped to a policy that does not exist.
    let cfg = edit("policies = [\"llama\"]", "policies = [\"mistral\"]", "unknown.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["roles[2].policies", "mistral"]);
    // A role that is not the pipeline's.
    let cfg = edit("name = \"answerer\"", "name = \"solver\"", "solver.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["rewriter, reranker, answerer", "solver"]);
    // An algorithm that does not train trees, and the QA task without the search workload.
    let cfg = edit("name = \"mhgpo-fof\"", "name = \"grpo\"", "grpo.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["mhgpo-is, mhgpo-fof, mhgpo-rr or mappo"]);
    let cfg = edit("kind = \"search\"", "kind = \"exchange\"", "exchange.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["kind = \"search\""]);
    // A corpus with a malformed line, an empty corpus, a question without an answer.
    std::fs::write(s.data.path().join("bad.jsonl"), "{\"id\": \"0\", \"title\": \"A\", \"text\": \"a\"}\n{\"id\": 1\n")
        .unwrap();
    let cfg = edit(&s.path("corpus.jsonl"), &s.path("bad.jsonl"), "badcorpus.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["bad.jsonl", "line 2"]);
    std::fs::write(s.data.path().join("empty.jsonl"), "").unwrap();
    let cfg = edit(&s.path("corpus.jsonl"), &s.path("empty.jsonl"), "empty.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["no passages"]);
    std::fs::write(s.data.path().join("noanswer.jsonl"), "{\"id\": \"1\", \"question\": \"Who?\", \"answers\": []}\n")
        .unwrap();
    let cfg = edit(&s.path("questions.jsonl"), &s.path("noanswer.jsonl"), "noanswer.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["has no answer"]);
    // Prompts longer than the limit are refused, not cut.
    let cfg = edit("max_prompt_tokens = 1024", "max_prompt_tokens = 16", "short.toml");
    rejects(&["train", "--config", &cfg, "--out", out], &["rollout.max_prompt_tokens = 16"]);
    assert!(!Path::new(out).join("checkpoints/latest").exists());
}

/// The tiny-search study's config as a user first runs it: its agent is pre-trained into an
/// empty cache (a short budget here: the recipe's own takes about 6 minutes), and the team trains
/// a step on the generated knowledge base, scored on held-out questions before and after.
#[test]
fn the_tiny_search_config_pretrains_its_agent_and_trains() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let o = ok(hacpo(&[
        "train",
        "--config",
        "configs/tiny-search.toml",
        "--steps",
        "1",
        "--out",
        dir.to_str().unwrap(),
        "--set",
        "task.val_limit=8",
        "--set",
        "pretrain.max_steps=10",
        "--set",
        "algo.prompts_per_step=4",
        "--set",
        "algo.minibatch_prompts=4",
    ])
    .env("HACPO_CACHE", cache.path())
    .output()
    .unwrap());
    let log = text(&o);
    assert!(log.contains("pre-training tiny-searcher") && log.contains("pre-trained tiny-searcher"), "{log}");
    assert!(log.contains("held-out F1"), "{log}");
    let m = metrics(&dir);
    let data = &m[0]["data"];
    for key in
        ["search/f1", "search/retrieval_recall", "search/answerer/group_similarity", "search/rewriter/response_length"]
    {
        assert!(data[key].is_number(), "{key} missing: {data}");
    }
}

/// The search agent's pre-training runs its curriculum stage by stage (a short budget here, the
/// stages scaled down with it) and leaves a loadable agent with its record.
#[test]
fn the_search_agents_pretraining_runs_its_curriculum_stage_by_stage() {
    let out = tempfile::tempdir().unwrap();
    let o = ok(hacpo(&[
        "pretrain",
        "--config",
        "configs/tiny-search.toml",
        "--set",
        "pretrain.max_steps=3",
        "--out",
        out.path().to_str().unwrap(),
    ])
    .output()
    .unwrap());
    let log = text(&o);
    assert!(log.contains("stage 1/2: 2 steps") && log.contains("stage 2/2: 1 steps"), "{log}");
    assert!(log.contains("pre-trained tiny-searcher") && log.contains("right: rewriter"), "{log}");
    let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&dir).join("pretrain.json")).unwrap()).unwrap();
    assert_eq!(record["report"]["steps"], 3, "{record}");
    assert_eq!(record["spec"]["corpus"]["search"]["stages"].as_array().unwrap().len(), 2, "{record}");
    assert!(Path::new(&dir).join("model.safetensors").exists());
}
