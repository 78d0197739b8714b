//! `hacpo eval --workload search`: the whole pipeline (Rewriter → BM25 → Reranker → Answerer)
//! on the real HotpotQA-100 passages with a tiny random model and a real tokenizer, and the
//! bad inputs a user can give it.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn hacpo(args: &[&str]) -> Output {
    let shared = common::shared("data/qa");
    let root = shared.parent().unwrap().parent().unwrap();
    Command::new(common::hacpo_bin())
        .args(args)
        .env("HACPO_SHARED", root)
        .env_remove("HACPO_DATA_DIR")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_pipeline_runs_end_to_end_with_a_tiny_model_on_hotpotqa() {
    let agent = common::tiny_agent("qwen3", "qwen3", 32, 5);
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("search.json");
    let out = hacpo(&[
        "eval",
        "--workload",
        "search",
        "--model",
        agent.path().to_str().unwrap(),
        "--data",
        "hotpotqa",
        "--limit",
        "3",
        "--max-new-tokens",
        "12",
        "--out",
        report.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("EM") && stdout.contains("hotpotqa"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["summary"]["questions"], 3);
    let traces = v["questions"].as_array().unwrap();
    assert_eq!(traces.len(), 3);
    for t in traces {
        // The retriever fills the budget from 994 passages (the question's own results fill what
        // a random model's queries leave): 10 distinct candidates.
        let c: Vec<u64> = t["candidates"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let mut d = c.clone();
        d.sort();
        d.dedup();
        assert_eq!((c.len(), d.len()), (10, 10), "{t}");
        assert!(c.iter().all(|&i| i < 994));
        // Whatever a random model writes, the readers give a verdict and a bounded score.
        let f1 = t["score"]["f1"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&f1) && t["score"]["em"].as_f64().unwrap() <= f1 + 1e-12);
        for k in ["rewriter_penalty", "reranker_penalty", "answerer_penalty"] {
            assert!([0.0, -0.5, -1.0].contains(&t[k].as_f64().unwrap()), "{k}: {t}");
        }
    }
}

#[test]
fn bad_search_inputs_are_user_errors() {
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("q.jsonl");
    let c = dir.path().join("c.jsonl");
    std::fs::write(&q, "{\"id\": \"1\", \"question\": \"Who?\", \"answers\": [\"Ann\"]}\n").unwrap();
    std::fs::write(&c, "{\"id\": \"d\", \"title\": \"Ann\", \"text\": \"Ann.\"}\nnot json\n").unwrap();
    let model = "/nonexistent-model";
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", "--workload", "search", "--model", model];
        args.extend_from_slice(extra);
        hacpo(&args)
    };
    let check = |o: Output, needles: &[&str]| {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let e = stderr(&o);
        for n in needles {
            assert!(e.contains(n), "{n:?} missing from: {e}");
        }
    };
    check(eval(&["--data", q.to_str().unwrap(), "--corpus", c.to_str().unwrap()]), &["line 2", "passage"]);
    std::fs::write(&c, "").unwrap();
    check(eval(&["--data", q.to_str().unwrap(), "--corpus", c.to_str().unwrap()]), &["no passages"]);
    check(eval(&["--data", q.to_str().unwrap()]), &["--corpus"]);
    std::fs::write(&c, "{\"id\": \"d\", \"title\": \"Ann\", \"text\": \"Ann.\"}\n").unwrap();
    std::fs::write(&q, "{\"id\": \"1\", \"question\": \"Who?\", \"answers\": [\"\"]}\n").unwrap();
    check(eval(&["--data", q.to_str().unwrap(), "--corpus", c.to_str().unwrap()]), &["has no answer"]);
    check(eval(&[]), &["--data"]);
    check(eval(&["--data", "hotpotqa", "--bench", "gsm8k"]), &["--bench"]);
    check(eval(&["--data", "hotpotqa", "--limit", "0"]), &["--limit"]);
    check(hacpo(&["eval", "--workload", "chess", "--model", model]), &["math or search"]);
    assert!(Path::new(model).metadata().is_err());
}
