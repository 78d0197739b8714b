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

/// `eval` checks what it can before loading anything; `grade --input` names a bad line.
#[test]
fn eval_and_grade_refuse_bad_input_before_working() {
    let dir = tempfile::tempdir().unwrap();
    let shared = common::shared("").to_str().unwrap().to_string();
    let env = [("HACPO_SHARED", shared.as_str())];
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", "--model", "/no/model/needed/yet", "--bench", "gsm8k"];
        args.extend_from_slice(extra);
        hacpo(&args, &env)
    };
    let check = |out: std::process::Output, needle: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{needle}: {err}");
    };
    check(eval(&["--limit", "0"]), "--limit 0");
    check(eval(&["--out", dir.path().to_str().unwrap()]), "is a directory");
    check(eval(&["--out", "/no/such/dir/report.json"]), "does not exist");
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    check(eval(&["--bench", &format!("gsm8k={}", empty.display())]), "no problems");

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, b"{\"gold\": \"1\", \"response\": \"1\"}\n{\"gold\": \"\xff\", \"response\": \"2\"}\n")
        .unwrap();
    check(hacpo(&["grade", "--input", bad.to_str().unwrap()], &[]), "line 2: not valid UTF-8");
    check(hacpo(&["grade", "--input", dir.path().to_str().unwrap()], &[]), "is a directory");
}

#[test]
fn grade_qa_scores_em_and_f1_per_line_and_names_bad_lines() {
    let out = hacpo(
        &["grade", "--task", "qa", "--gold", "President Barack Obama", "--gold", "Obama", "--response", "Barack Obama"],
        &[],
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "em 0 f1 0.8000\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.jsonl");
    std::fs::write(
        &path,
        "{\"prediction\": \"the Eiffel Tower\", \"answers\": [\"Eiffel Tower\"], \"id\": 7}\n\
         {\"prediction\": \"yes it is\", \"answers\": [\"yes\"]}\n",
    )
    .unwrap();
    let out = hacpo(&["grade", "--task", "qa", "--input", path.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        (lines[0]["em"].as_f64(), lines[0]["f1"].as_f64(), lines[0]["id"].as_i64()),
        (Some(1.0), Some(1.0), Some(7))
    );
    assert_eq!((lines[1]["em"].as_f64(), lines[1]["f1"].as_f64()), (Some(0.0), Some(0.0)));
    assert!(String::from_utf8_lossy(&out.stderr).contains("EM 50.0%, F1 50.0%"));

    std::fs::write(&path, "{\"prediction\": \"x\", \"answers\": [\"x\"]}\n{\"prediction\": \"x\"}\n").unwrap();
    let out = hacpo(&["grade", "--task", "qa", "--input", path.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("answers"), "{err}");
    let out = hacpo(&["grade", "--task", "chess", "--gold", "1", "--response", "1"], &[]);
    assert_eq!(out.status.code(), Some(2));
}
