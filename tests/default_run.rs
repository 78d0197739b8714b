//! `hacpo train` with no arguments: generated arithmetic problems, two tiny agents with
//! tokenizers trained by the project (BPE and character level), shipped pre-trained (or
//! pre-trained and cached in `HACPO_CACHE` when the settings differ), HACPO steps, before/after
//! held-out accuracy in `summary.json`, progress lines in a log.

mod common;

use std::process::{Command, Output};

use serde_json::Value;

/// Shortened: a short pre-training, a small held-out set, small steps.
const SHORT: &[(&str, &str)] = &[
    ("--set", "pretrain.max_steps=30"),
    ("--set", "task.arith.train_size=2000"),
    ("--set", "task.arith.heldout_size=24"),
    ("--set", "algo.prompts_per_step=4"),
    ("--set", "algo.minibatch_prompts=2"),
    ("--set", "run.checkpoint_every=1"),
];

fn train(cache: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec!["train", "--steps", "2", "--out", out.to_str().unwrap()];
    for (k, v) in SHORT {
        args.extend([*k, *v]);
    }
    args.extend_from_slice(extra);
    Command::new(common::hacpo_bin()).args(&args).env("HACPO_CACHE", cache).output().unwrap()
}

fn assert_png(path: &std::path::Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "{}", path.display());
}

#[test]
fn the_embedded_default_pretrains_once_then_trains_and_reports_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let out = train(&cache, &dir.path().join("run"), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("pre-training tiny-qwen") && stderr.contains("pre-training tiny-llama"), "{stderr}");

    // Both agents pre-trained and cached in Hugging Face layout, with their own tokenizers.
    let cached: Vec<_> = std::fs::read_dir(cache.join("tiny")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(cached.len(), 2, "{cached:?}");
    let mut vocabs = vec![];
    for d in &cached {
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "pretrain.json"] {
            assert!(d.join(f).exists(), "{} lacks {f}", d.display());
        }
        let tok = hacpo::tokenizer::Tokenizer::from_dir(d).unwrap();
        vocabs.push(tok.vocab_size());
    }
    vocabs.sort();
    assert_eq!(vocabs[0], 260, "the character-level tokenizer: 256 bytes + 4 special tokens");
    assert!(vocabs[1] > 300, "the BPE tokenizer has merges: {vocabs:?}");

    // The run: metrics for both agents and both steps, a summary with before and after.
    let run = dir.path().join("run");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 2);
    let agents = summary["agents"].as_object().unwrap();
    assert_eq!(agents.len(), 2, "{summary}");
    // (The values themselves are checked against measured ones with the shipped agents below.)
    for (name, a) in agents {
        for k in ["before", "after"] {
            a[k].as_f64().unwrap_or_else(|| panic!("{name}.{k} in {summary}"));
        }
    }
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4, "2 steps × 2 agents");
    // Cross-agent samples went through retokenisation: HACPO reports their ratios.
    assert!(lines.iter().all(|l| l["data"]["hacpo/cross_ratio_mean"].as_f64().is_some_and(f64::is_finite)));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("held-out accuracy") && stdout.contains("points"), "{stdout}");

    // `hacpo report` reads the run back: the table, results and per-step curves.
    let report = Command::new(common::hacpo_bin()).args(["report", run.to_str().unwrap()]).output().unwrap();
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let table = String::from_utf8_lossy(&report.stdout);
    for name in agents.keys() {
        assert!(table.contains(name.as_str()), "{table}");
    }
    let curves = std::fs::read_to_string(run.join("curves.csv")).unwrap();
    assert_eq!(curves.lines().count(), 1 + 4, "{curves}");
    let results = std::fs::read_to_string(run.join("results.csv")).unwrap();
    // 2 steps × 4 prompts × G=8 own rollouts per agent.
    assert!(results.lines().skip(1).all(|l| l.ends_with(",64")), "{results}");
    // And the figures, as PNG files.
    for f in ["reward.png", "heldout.png", "accuracy.png", "capability.png"] {
        assert_png(&run.join(f));
    }

    // A second run reuses the cache.
    let again = train(&cache, &dir.path().join("run2"), &[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(!stderr.contains("pre-training tiny"), "{stderr}");

    // `hacpo study`: a matrix of variants × seeds, then one table; re-running skips finished runs.
    let study_dir = dir.path().join("study");
    let study = |extra: &[&str]| {
        let mut args = vec![
            "study",
            "--algos",
            "hacpo,gspo",
            "--ablate",
            "exp_is",
            "--seeds",
            "1",
            "--steps",
            "1",
            "--out",
            study_dir.to_str().unwrap(),
        ];
        for (k, v) in SHORT {
            args.extend([*k, *v]);
        }
        args.extend_from_slice(extra);
        Command::new(common::hacpo_bin()).args(&args).env("HACPO_CACHE", &cache).output().unwrap()
    };
    let first = study(&[]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let table = std::fs::read_to_string(study_dir.join("results.md")).unwrap();
    for variant in ["| hacpo |", "| gspo |", "| hacpo-no-exp_is |"] {
        assert!(table.contains(variant), "{table}");
    }
    let csv = std::fs::read_to_string(study_dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * 2, "3 variants × 2 agents: {csv}");
    for f in ["reward.png", "heldout.png", "accuracy.png", "capability.png"] {
        assert_png(&study_dir.join(f));
    }
    let again = study(&[]);
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stderr).matches("done, skipping").count(), 3);
    // A study directory made with other settings is not silently reused.
    let other = study(&["--set", "algo.optimizer.lr=1e-3"]);
    assert_eq!(other.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(stderr.contains("algo.optimizer.lr") && stderr.contains("--out"), "{stderr}");
    let bad = study(&["--ablate", "no_such_mechanism"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("stepwise"));

    // Tiny agents need the task they were pre-trained on.
    let wrong = train(&cache, &dir.path().join("run3"), &["--set", "task.kind=math"]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("arith"));
}

/// The first run of the real default: the shipped agents are installed (no pre-training), their
/// held-out accuracy before training is the one measured when they were made (56.0% and 45.5%
/// on the 200 held-out problems, greedy), and a log that is not a terminal gets progress lines.
#[test]
fn the_first_run_installs_the_shipped_agents_and_measures_their_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let run = dir.path().join("run");
    let out = Command::new(common::hacpo_bin())
        .args(["train", "--steps", "1", "--out", run.to_str().unwrap()])
        .args(["--set", "algo.prompts_per_step=2", "--set", "algo.minibatch_prompts=2", "--set", "task.val_every=0"])
        .env("HACPO_CACHE", &cache)
        // Lines every 10 ms: work reported only when it outlasts the interval, and a held-out
        // pass of the tiny agents took under 0.5 s on a 2-core AMD EPYC Zen 4.
        .env("HACPO_PROGRESS_SECS", "0.01")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("installed the shipped pre-trained tiny-qwen"), "{stderr}");
    assert!(stderr.contains("installed the shipped pre-trained tiny-llama"), "{stderr}");
    assert!(!stderr.contains("pre-training"), "{stderr}");
    // Not a terminal: plain progress lines, no bar drawing or colour codes.
    assert!(stderr.lines().any(|l| l.starts_with("held-out accuracy ") && l.contains(" elapsed")), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "escape codes in a log: {stderr}");

    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let before = |agent: &str| summary["agents"][agent]["before"].as_f64().unwrap_or_else(|| panic!("{summary}"));
    // Greedy decoding may flip a near-tie on another CPU: allow four of the 200 problems.
    for (agent, measured) in [("agent0-tiny-qwen", 0.56), ("agent1-tiny-llama", 0.455)] {
        assert!((before(agent) - measured).abs() <= 0.02 + 1e-9, "{agent}: {} vs {measured}", before(agent));
    }
}

/// `hacpo pretrain` (what made the shipped agents) gives the same bytes twice, and refuses to
/// replace an agent that exists.
#[test]
fn pretrain_is_reproducible_bit_for_bit_and_never_replaces_an_agent() {
    let dir = tempfile::tempdir().unwrap();
    let pretrain = |out: &std::path::Path| {
        Command::new(common::hacpo_bin())
            .args(["pretrain", "--out", out.to_str().unwrap()])
            .args(["--set", "pretrain.max_steps=4", "--set", "task.arith.train_size=600"])
            .args(["--set", "task.arith.heldout_size=20"])
            .output()
            .unwrap()
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for out in [&a, &b] {
        let o = pretrain(out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let names = |d: &std::path::Path| {
        let mut v: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&a).len(), 2);
    assert_eq!(names(&a), names(&b));
    for agent in names(&a) {
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            let (x, y) = (a.join(&agent).join(f), b.join(&agent).join(f));
            assert!(std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(), "{} differs", x.display());
        }
        // The record differs only in its wall time.
        let record = |d: &std::path::Path| {
            let mut v: Value =
                serde_json::from_str(&std::fs::read_to_string(d.join(&agent).join("pretrain.json")).unwrap()).unwrap();
            v["report"]["wall_s"] = Value::Null;
            v
        };
        assert_eq!(record(&a), record(&b));
    }
    let again = pretrain(&a);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}
