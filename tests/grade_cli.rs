//! `hacpo grade` and `hacpo eval` on the command line: outputs, exit codes, errors.

mod common;

use std::process::Command;

fn hacpo(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(common::hacpo_bin());
    c.args(args).env_remove("HACPO_SHARED").env_remove("HACPO_DATA_DIR").env("HF_HUB_OFFLINE", "1");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn grade_one_answer() {
    let out = hacpo(&["grade", "--gold", "\\frac{14}{3}", "--response", "so $\\boxed{\\dfrac{14}{3}}$"], &[]);
    assert_eq!((out.status.code(), String::from_utf8(out.stdout).unwrap()), (Some(0), "correct\n".into()));
    let out = hacpo(&["grade", "--gold", "13536", "--response", "\\boxed{13535}"], &[]);
    assert_eq!((out.status.code(), String::from_utf8(out.stdout).unwrap()), (Some(0), "incorrect\n".into()));
    let out = hacpo(&["grade", "--gold", "\\frac14", "--response", "\\boxed{0.25}", "--mode", "boxed-exact"], &[]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "incorrect\n");
}

#[test]
fn grade_a_jsonl_file_of_math500_solutions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.jsonl");
    let rows = std::fs::read_to_string(common::shared("data/math/math500_test.jsonl")).unwrap();
    let cases: Vec<String> = rows
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"gold": v["answer"], "response": v["solution"], "id": v["unique_id"]}).to_string()
        })
        .collect();
    std::fs::write(&path, cases.join("\n")).unwrap();
    let out = hacpo(&["grade", "--input", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 500);
    assert!(lines.iter().all(|l| l["correct"] == true && l["id"].is_string()));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("graded 500 cases: 500 correct"), "{stderr}");
}

#[test]
fn grade_errors_name_the_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, "{\"gold\": \"1\", \"response\": \"1\"}\n{\"gold\": 2, \"response\": \"x\"}\n").unwrap();
    let out = hacpo(&["grade", "--input", path.to_str().unwrap()], &[]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("line 2") && stderr.contains("\"gold\""), "{stderr}");
    let out = hacpo(&["grade", "--gold", "1", "--response", "1", "--mode", "fuzzy"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn eval_errors_before_loading_the_model() {
    let out = hacpo(&["eval", "--model", "no-such-model", "--bench", "gsm9k"], &[]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("unknown benchmark \"gsm9k\""), "{stderr}");
    let empty = tempfile::tempdir().unwrap();
    let out = hacpo(
        &["eval", "--model", "no-such-model", "--bench", "aime25"],
        &[("HACPO_DATA_DIR", empty.path().to_str().unwrap())],
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("aime25_test.jsonl") && stderr.contains("--bench aime25="), "{stderr}");
}
