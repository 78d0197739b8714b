//! The embedded default spread over two processes (`[cluster]`, one agent each, a real
//! `nats-server`): the same metrics, held-out scores and checkpoints, bit for bit, as one
//! process; also when one process is SIGKILLed after its first checkpoint and resumed while
//! the other waits (saying for whom, refusing a second process on its host and one with
//! another config), and when the server is killed and restarted mid-run. And the command
//! line's refusals, before anything loads.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::nats_server::NatsServer;
use common::{deterministic_metrics, hacpo_command, output_text, run_hacpo};

/// Short runs of configs/tiny-duo.toml (the task settings stay, so the shipped agents serve).
const SETS: &[&str] = &[
    "run.steps=3",
    "run.checkpoint_every=1",
    "algo.prompts_per_step=4",
    "algo.minibatch_prompts=4",
    "task.val_every=3",
];

fn default_config() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tiny-duo.toml")).unwrap()
}

/// The embedded default with a `[cluster]` table: host a trains tiny-qwen, host b tiny-llama.
fn clustered(dir: &Path, url: &str, run: &str) -> PathBuf {
    let path = dir.join(format!("{run}.toml"));
    let table = format!(
        "\n[cluster]\nnats = \"{url}\"\nrun = \"{run}\"\ntimeout_s = 300\n\
         [[cluster.hosts]]\nname = \"a\"\npolicies = [\"agent0-tiny-qwen\"]\n\
         [[cluster.hosts]]\nname = \"b\"\npolicies = [\"agent1-tiny-llama\"]\n"
    );
    std::fs::write(&path, default_config() + &table).unwrap();
    path
}

fn args<'a>(config: &'a str, out: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train", "--config", config, "--out", out];
    for s in SETS {
        a.extend(["--set", s]);
    }
    a.extend(more);
    a
}

fn spawn(args: &[&str], log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    hacpo_command(args).stdout(Stdio::null()).stderr(log).spawn().unwrap()
}

fn wait_ok(mut child: Child, log: &Path, what: &str) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{what} failed: {}", std::fs::read_to_string(log).unwrap_or_default());
}

/// The one-process run's records of `agent`.
fn records_of(metrics: &[serde_json::Value], agent: &str) -> Vec<serde_json::Value> {
    metrics.iter().filter(|r| r["agent"] == agent).cloned().collect()
}

/// Host `dir` (agent `k`, named `agent`) ended where the one-process run `one` did.
fn same_as_one_process(one: &Path, dir: &Path, k: usize, agent: &str) {
    let reference = deterministic_metrics(one);
    let mine = deterministic_metrics(dir);
    assert_eq!(mine.len(), 3, "{}: one record per step", dir.display());
    assert_eq!(mine, records_of(&reference, agent), "{agent}: metrics");
    let before = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("before.json")).unwrap()).unwrap()
    };
    assert_eq!(before(dir)[agent], before(one)[agent], "{agent}: held-out accuracy before training");
    let checkpoint = |d: &Path| d.join("checkpoints/step-000003");
    for file in [format!("agent-{k}/model.safetensors"), format!("agent-{k}.optim.safetensors")] {
        let (a, b) = (checkpoint(one).join(&file), checkpoint(dir).join(&file));
        assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "{agent}: {file} differs");
    }
    // The other agent's part is in the other process's checkpoints only.
    assert!(!checkpoint(dir).join(format!("agent-{}", 1 - k)).exists());
}

/// Waits (at most 120 s) until `path` exists and `ready` holds for its text.
fn wait_for_text(path: &Path, what: &str, ready: impl Fn(&str) -> bool) {
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(path).is_ok_and(|t| ready(&t)) {
        assert!(started.elapsed().as_secs() < 120, "no {what} in {} after 120 s", path.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn two_processes_train_as_one_bit_for_bit_through_a_kill_and_a_server_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let base = tmp.path().join("base.toml");
    std::fs::write(&base, default_config()).unwrap();
    let (base, one) = (base.to_str().unwrap().to_string(), out("one"));
    let o = run_hacpo(&args(&base, &one, &[]));
    assert!(o.status.success(), "{}", output_text(&o));

    let server = NatsServer::start();
    // Uninterrupted: each agent in its own process.
    let config = clustered(tmp.path(), &server.url(), "duo");
    let config = config.to_str().unwrap();
    let (a, b) = (out("a"), out("b"));
    let (log_a, log_b) = (tmp.path().join("a.log"), tmp.path().join("b.log"));
    let host_a = spawn(&args(config, &a, &["--host", "a"]), &log_a);
    let host_b = spawn(&args(config, &b, &["--host", "b"]), &log_b);
    wait_ok(host_a, &log_a, "host a");
    wait_ok(host_b, &log_b, "host b");
    same_as_one_process(Path::new(&one), Path::new(&a), 0, "agent0-tiny-qwen");
    same_as_one_process(Path::new(&one), Path::new(&b), 1, "agent1-tiny-llama");
    // Each process loads only its host's policy.
    let log = std::fs::read_to_string(&log_a).unwrap();
    assert!(log.contains("with agent0-tiny-qwen for 3 steps"), "{log}");

    // Host b is killed after its step-1 checkpoint; host a waits at step 2 and goes on once b
    // resumes (it replays nothing: a's parts of the lost steps are on the server).
    let config = clustered(tmp.path(), &server.url(), "duo-killed");
    let config = config.to_str().unwrap();
    let (a, b) = (out("ka"), out("kb"));
    let host_a = hacpo_command(&args(config, &a, &["--host", "a"]))
        .env("HACPO_PROGRESS_SECS", "0.5")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_a).unwrap())
        .spawn()
        .unwrap();
    let killed = hacpo_command(&args(config, &b, &["--host", "b"]))
        .env("HACPO_TEST_KILL_AFTER_CHECKPOINT", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!killed.success(), "host b was not killed");
    // While host a waits: it says for whom; a second process on host a, and one with another
    // config, are refused; the status shows who runs.
    wait_for_text(&log_a, "waiting line", |t| t.contains("waiting for host b"));
    let o = run_hacpo(&args(config, &out("dup"), &["--host", "a"]));
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(output_text(&o).contains("already hosted by process"), "{}", output_text(&o));
    let o = run_hacpo(&args(config, &out("other"), &["--host", "b", "--set", "run.seed=1"]));
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(output_text(&o).contains("run.seed: the run has 0, this process 1"), "{}", output_text(&o));
    let o = run_hacpo(&["cluster", "status", "--nats", &server.url(), "--run", "duo-killed"]);
    let status = output_text(&o);
    assert!(o.status.success(), "{status}");
    let line = |host: &str| status.lines().find(|l| l.starts_with(&format!("{host} "))).unwrap_or("").to_string();
    assert!(line("a").contains("agent0-tiny-qwen") && line("a").contains("running,"), "{status}");
    assert!(line("b").contains("not running"), "{status}");
    let o = run_hacpo(&["train", "--resume", &b, "--host", "b"]);
    assert!(o.status.success(), "{}", output_text(&o));
    wait_ok(host_a, &log_a, "host a (b killed and resumed)");
    same_as_one_process(Path::new(&one), Path::new(&a), 0, "agent0-tiny-qwen");
    same_as_one_process(Path::new(&one), Path::new(&b), 1, "agent1-tiny-llama");

    // The server is killed after step 1 and restarted on its file store: the run goes on.
    let mut server = server;
    let config = clustered(tmp.path(), &server.url(), "duo-restart");
    let config = config.to_str().unwrap();
    let (a, b) = (out("ra"), out("rb"));
    let host_a = spawn(&args(config, &a, &["--host", "a"]), &log_a);
    let host_b = spawn(&args(config, &b, &["--host", "b"]), &log_b);
    wait_for_text(&Path::new(&a).join("metrics.jsonl"), "step 1", |t| t.lines().count() >= 1);
    server.kill();
    std::thread::sleep(std::time::Duration::from_millis(700));
    server.restart();
    wait_ok(host_a, &log_a, "host a (server restarted)");
    wait_ok(host_b, &log_b, "host b (server restarted)");
    same_as_one_process(Path::new(&one), Path::new(&a), 0, "agent0-tiny-qwen");
    same_as_one_process(Path::new(&one), Path::new(&b), 1, "agent1-tiny-llama");
}

#[test]
fn the_command_line_is_checked_before_anything_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x");
    let out = out.to_str().unwrap();
    let config = clustered(tmp.path(), "nats://127.0.0.1:9", "checks");
    let config = config.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["train", "--out", out, "--host", "a"], "has no [cluster] table"),
        (vec!["train", "--config", config, "--out", out], "pass --host NAME"),
        (vec!["train", "--config", config, "--out", out, "--host", "c"], "the run's hosts are a, b"),
        (
            vec!["train", "--config", config, "--out", out, "--host", "a", "--set", "algo.filter_groups=true"],
            "algo.filter_groups",
        ),
        // Nothing listens on port 9: the server is named, with how to start one.
        (vec!["train", "--config", config, "--out", out, "--host", "a"], "cannot reach the NATS server"),
    ];
    for (args, expected) in cases {
        let o = run_hacpo(&args);
        let text = output_text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains(expected), "{args:?}: expected {expected:?} in {text}");
    }
    // A host's memory plan counts only the policies it trains (no server needed to plan).
    let o = run_hacpo(&["train", "--config", config, "--out", out, "--host", "b", "--dry-run"]);
    let text = output_text(&o);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("agent1-tiny-llama") && !text.contains("agent0-tiny-qwen"), "{text}");
    assert!(!Path::new(out).join("checkpoints").exists(), "nothing trained");
}
