//! `hacpo env sample` and `hacpo env play` on the command line: the instances are the
//! library's, their solutions solve them, and bad input is exit 2.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn hacpo(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(common::hacpo_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn sampled_instances_are_json_lines_whose_solutions_solve_them() {
    for env in ["plan-path", "sokoban", "sudoku"] {
        let out = hacpo(&["env", "sample", "--env", env, "--n", "4", "--seed", "10", "--format", "json"], "");
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<serde_json::Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 4);
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(line["env"], env);
            assert_eq!(line["index"], 10 + i as u64);
            let state: hacpo::env::Instance = serde_json::from_value(line["state"].clone()).unwrap();
            assert_eq!(state, hacpo::env::Instance::generate(state.kind(), hacpo::env::Split::Train, 10 + i as u64));
            let mut inst = state.clone();
            let outcome = inst.apply(&format!("#### {}", line["solution"].as_str().unwrap()));
            assert!(outcome.solved, "{env} {i}: {outcome:?}");
            assert!(line["optimal_length"].as_u64().unwrap() > 0);
        }
    }
}

#[test]
fn text_samples_show_the_grid_and_the_solution() {
    let out = hacpo(&["env", "sample", "--env", "plan-path", "--n", "2", "--split", "held-out"], "");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text.matches("plan-path held-out #").count(), 2, "{text}");
    assert_eq!(text.matches("solution: #### [").count(), 2);
    assert!(text.contains('S') && text.contains('G'));
}

#[test]
fn playing_the_hint_solves_the_puzzle() {
    for env in ["plan-path", "sokoban", "sudoku"] {
        let sample = hacpo(&["env", "sample", "--env", env, "--n", "1", "--seed", "3", "--format", "json"], "");
        let line: serde_json::Value = serde_json::from_str(stdout(&sample).trim()).unwrap();
        let solution = line["solution"].as_str().unwrap().to_string();
        let out = hacpo(&["env", "play", "--env", env, "--seed", "3"], &format!("hint\n{solution}\n"));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("a solution from here"), "{text}");
        assert!(text.contains("the task is solved") && text.contains("solved after 1 answers"), "{env}:\n{text}");
    }
    // Typed letters work too; a wrong move is reported, not fatal; q ends the game.
    let out = hacpo(&["env", "play", "--env", "sokoban"], "X\nU\nq\n");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("could not be read") && text.contains("not solved after 2 answers"), "{text}");
}

#[test]
fn bad_arguments_are_exit_2_with_a_reason() {
    for (args, needle) in [
        (vec!["env", "sample", "--env", "chess"], "plan-path, sokoban or sudoku"),
        (vec!["env", "sample", "--env", "sudoku", "--n", "0"], "--n 0"),
        (vec!["env", "sample", "--env", "sudoku", "--split", "dev"], "train or held-out"),
        (vec!["env", "sample", "--env", "sudoku", "--seed", "18446744073709551615", "--n", "2"], "overflows"),
        (vec!["env", "play", "--env", "go"], "unknown environment"),
    ] {
        let out = hacpo(&args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
