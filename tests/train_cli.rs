//! `hacpo train` as a user runs it: a math task from a GSM8K-format file, two tiny agents
//! around the real Qwen3 and Llama-3.1 tokenizers, checkpoints, SIGKILL and `--resume`, a NaN
//! loss, and the errors (exit code 2) for bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::deterministic_metrics;

/// Two tiny agents that favour the tokens of short answers, and a small GSM8K-format train set
/// whose answers they can write.
struct Setup {
    _agents: [tempfile::TempDir; 2],
    data: tempfile::TempDir,
    config: PathBuf,
}

fn setup(steps: usize) -> Setup {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, &["1", "2"]);
    let data = tempfile::tempdir().unwrap();
    let problems = [
        ("Tom has 3 apples and eats 2. How many are left?", "3 - 2 = 1.\n#### 1"),
        ("Ann has 1 pen and buys 1 more. How many pens does she have?", "1 + 1 = 2.\n#### 2"),
        ("What is 6 times 2?", "6 * 2 = 12.\n#### 12"),
        ("What is 20 plus 1?", "20 + 1 = 21.\n#### 21"),
        ("What is 4 minus 2?", "4 - 2 = 2.\n#### 2"),
        ("What is 11 plus 1?", "11 + 1 = 12.\n#### 12"),
    ];
    let rows: Vec<String> =
        problems.iter().map(|(q, a)| serde_json::json!({"question": q, "answer": a}).to_string()).collect();
    let train = data.path().join("train.jsonl");
    std::fs::write(&train, rows.join("\n")).unwrap();
    let config = data.path().join("tiny.toml");
    let toml = format!(
        r#"
[run]
seed = 5
steps = {steps}
checkpoint_every = 1

[algo]
name = "hacpo"
group_size = 4
prompts_per_step = 2
minibatch_prompts = 1
micro_batch_sequences = 4
kl_coef = 0.01

[algo.optimizer]
lr = 1e-4

[rollout]
max_new_tokens = 6
batch_prompts = 2
max_prompt_tokens = 128
cross_max_prompt_tokens = 160
max_response_tokens = 8

[task]
train = "gsm8k={train}"
grade_mode = "full"

[[agents]]
model = "{qwen}"
chat_template_kwargs = {{ enable_thinking = false }}

[[agents]]
model = "{llama}"
"#,
        train = train.display(),
        qwen = qwen.path().display(),
        llama = llama.path().display(),
    );
    std::fs::write(&config, toml).unwrap();
    Setup { _agents: [qwen, llama], data, config }
}

fn hacpo(args: &[&str]) -> Command {
    common::hacpo_command(args)
}

fn run(args: &[&str]) -> Output {
    hacpo(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn latest(run_dir: &Path) -> Option<String> {
    std::fs::read_to_string(run_dir.join("checkpoints/latest")).ok().map(|s| s.trim().to_string())
}

/// Waits (polling every 2 ms, at most 300 s) until the running `child`'s `latest` pointer
/// satisfies `reached`; fails if the run ends first.
fn wait_for_checkpoint(
    child: &mut std::process::Child,
    run_dir: &Path,
    reached: impl Fn(Option<&str>) -> bool,
    what: &str,
) {
    let started = Instant::now();
    while !reached(latest(run_dir).as_deref()) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before {what}");
        assert!(started.elapsed() < Duration::from_secs(300), "no {what} after 300 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Trains `s`'s config with `args` twice: uninterrupted into `NAME-whole`, and SIGKILLed right
/// after its first checkpoint into `NAME-killed`, then resumed. Asserts that the resumed run
/// gives the uninterrupted run's metrics; returns that run's directory and metrics.
fn resumed_equals_uninterrupted(s: &Setup, name: &str, args: &[&str]) -> (PathBuf, Vec<serde_json::Value>) {
    let (whole, reference, _) = resumed_equals_uninterrupted_saying(s, name, args);
    (whole, reference)
}

/// [`resumed_equals_uninterrupted`], with what the uninterrupted run wrote on stderr.
fn resumed_equals_uninterrupted_saying(
    s: &Setup,
    name: &str,
    args: &[&str],
) -> (PathBuf, Vec<serde_json::Value>, String) {
    let cfg = s.config.to_str().unwrap();
    let (whole, killed) = (s.data.path().join(format!("{name}-whole")), s.data.path().join(format!("{name}-killed")));
    let out = run(&[&["train", "--config", cfg][..], args, &["--out", whole.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    let reference = deterministic_metrics(&whole);
    common::train_killed_after_checkpoint(
        &[&["train", "--config", cfg][..], args, &["--out", killed.to_str().unwrap()]].concat(),
        1,
    );
    let out = run(&["train", "--resume", killed.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(deterministic_metrics(&killed), reference);
    (whole, reference, said)
}

#[test]
fn sigkill_and_resume_equals_an_uninterrupted_run() {
    let s = setup(5);
    let cfg = s.config.to_str().unwrap();

    let whole = s.data.path().join("whole");
    let out = run(&["train", "--config", cfg, "--out", whole.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = deterministic_metrics(&whole);
    let steps: Vec<u64> = reference.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    let scores: Vec<f64> = reference.iter().map(|l| l["data"]["critic/score/mean"].as_f64().unwrap()).collect();
    assert!(scores.iter().any(|&x| x > 0.0), "the tiny agents never solved a problem: {scores:?}");

    // The same run, killed (abort: no clean-up, the lock left behind) right after its second
    // checkpoint is written, then resumed.
    let killed = s.data.path().join("killed");
    common::train_killed_after_checkpoint(&["train", "--config", cfg, "--out", killed.to_str().unwrap()], 2);
    assert_eq!(latest(&killed).as_deref(), Some("step-000002"));
    let interrupted = deterministic_metrics(&killed);
    assert!(interrupted.len() >= 4, "metrics of steps 1 and 2 were written before the checkpoint");

    let out = run(&["train", "--resume", killed.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("step 2"), "says where it resumes: {}", stderr(&out));
    // No step lost or repeated, and the numbers are those of the uninterrupted run.
    assert_eq!(deterministic_metrics(&killed), reference);
    assert_eq!(latest(&killed).as_deref(), Some("step-000005"));

    // A finished run resumed again has nothing left to do.
    let out = run(&["train", "--resume", killed.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(deterministic_metrics(&killed), reference);
}

/// `--offload`: each agent's KL reference, AdamW moments and summed gradients wait in host
/// memory between uses. On the CPU that only adds copies, and the run is the resident run to
/// the bit: its metrics, and every checkpoint's weights and optimizer state; it records the
/// choice and resumes after SIGKILL to the same numbers.
#[test]
fn an_offloaded_run_is_the_resident_run_to_the_bit() {
    let s = setup(3);
    let cfg = s.config.to_str().unwrap();
    let resident = s.data.path().join("resident");
    let out = run(&["train", "--config", cfg, "--out", resident.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("offload"), "{}", stderr(&out));
    let (offloaded, metrics, said) = resumed_equals_uninterrupted_saying(&s, "offload", &["--offload", "-v"]);
    for agent in ["agent0", "agent1"] {
        let line = said.lines().find(|l| l.contains("offloaded: the ") && l.contains(agent));
        assert!(line.is_some_and(|l| l.contains("reference, AdamW moments and summed gradients")), "{agent}: {said}");
    }
    assert!(said.contains("offload on the CPU saves no memory"), "{said}");
    assert_eq!(metrics, deterministic_metrics(&resident));
    let config = std::fs::read_to_string(offloaded.join("config.toml")).unwrap();
    assert_eq!(config.matches("offload = true").count(), 2, "{config}");
    let checkpoints = |dir: &Path| {
        let mut files: Vec<String> = walk(&dir.join("checkpoints"))
            .into_iter()
            .filter(|f| f.ends_with(".safetensors"))
            .map(|f| f.strip_prefix(dir.to_str().unwrap()).unwrap().to_string())
            .collect();
        files.sort();
        files
    };
    let files = checkpoints(&resident);
    assert_eq!(files.iter().filter(|f| f.contains(".optim.")).count(), 6, "{files:?}");
    assert_eq!(files, checkpoints(&offloaded));
    for f in &files {
        let read = |dir: &Path| std::fs::read(format!("{}{f}", dir.display())).unwrap();
        assert!(read(&resident) == read(&offloaded), "{f} differs");
    }
}

/// LoRA adapters on both agents (`--lora 4`), one base stored in bf16: the first step's KL
/// against the base is zero
/// (a fresh adapter is the identity), checkpoints hold PEFT adapters and no base weights, a
/// SIGKILLed run resumes to the uninterrupted run's numbers, and `convert --merge-lora`
/// writes a loadable merged model.
#[test]
fn a_lora_run_resumes_after_sigkill_and_checkpoints_peft_adapters() {
    let s = setup(3);
    // Agent 0's frozen base in bf16, agent 1's in f32.
    let (whole, reference) =
        resumed_equals_uninterrupted(&s, "lora", &["--lora", "4", "--set", "agents.0.frozen_dtype=\"bf16\""]);
    let first_kl = reference[0]["data"]["actor/kl_loss"].as_f64().unwrap();
    assert!(first_kl.abs() < 1e-6, "a fresh adapter is the base, so the first KL is 0: {first_kl}");
    let later_kl = reference.last().unwrap()["data"]["actor/kl_loss"].as_f64().unwrap();
    assert!(later_kl.abs() > 0.0, "after updates the adapter moves the policy off the base");

    let agent = whole.join("checkpoints/step-000003/agent-0");
    for f in ["adapter_config.json", "adapter_model.safetensors", "tokenizer.json"] {
        assert!(agent.join(f).is_file(), "{f} in a LoRA checkpoint");
    }
    assert!(!agent.join("model.safetensors").exists(), "the frozen base is not copied into checkpoints");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(agent.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!((config["r"].as_u64(), config["lora_alpha"].as_f64()), (Some(4), Some(8.0)));
    assert!(Path::new(config["base_model_name_or_path"].as_str().unwrap()).is_absolute());

    let merged = s.data.path().join("merged");
    let out = run(&["convert", "--merge-lora", agent.to_str().unwrap(), "--out", merged.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let greedy = |model: &Path| {
        let out = run(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "What is 4 minus 2?",
            "--max-new-tokens",
            "4",
            "--greedy",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        out.stdout
    };
    // The adapter directory itself loads as the merged model.
    assert_eq!(greedy(&merged), greedy(&agent));
}

/// `--compute-dtype bf16` (mixed precision on the CPU): sampling reads the bf16 rollout copy
/// and the update casts the f32 master weights to the same values, so the first step's KL to
/// the (equally rounded) reference is 0; the run resumes after SIGKILL with the setting kept.
#[test]
fn a_bf16_compute_run_starts_at_zero_kl_and_resumes_after_sigkill() {
    let s = setup(2);
    let (whole, reference) = resumed_equals_uninterrupted(&s, "bf16", &["--compute-dtype", "bf16"]);
    let first_kl = reference[0]["data"]["actor/kl_loss"].as_f64().unwrap();
    assert!(first_kl.abs() < 1e-6, "policy and reference read the same bf16 weights: {first_kl}");
    for m in &reference {
        for key in ["actor/pg_loss", "actor/grad_norm", "actor/kl_loss"] {
            assert!(m["data"][key].as_f64().unwrap().is_finite(), "{key}: {m}");
        }
    }
    let saved = std::fs::read_to_string(whole.join("config.toml")).unwrap();
    assert!(saved.contains("compute_dtype = \"bf16\""), "the run's config keeps the setting:\n{saved}");
}

/// `--compute-dtype f16`: the loss scaler halves on every skipped (overflowing) update, its
/// state is saved with the optimizer, and a run SIGKILLed after step 1 resumes with it: the
/// same metrics as the uninterrupted run. It starts at 2^24 so that the scaled gradients
/// certainly overflow f16 at first (at 2^16 one agent overflowed once here).
#[test]
fn an_f16_run_scales_the_loss_and_resumes_with_its_scale_after_sigkill() {
    let s = setup(2);
    let f16 = ["--compute-dtype", "f16", "--set", "algo.f16_loss_scale=16777216"];
    let (whole, reference) = resumed_equals_uninterrupted(&s, "f16", &f16);
    let mut skipped = std::collections::BTreeMap::<String, f64>::new();
    for m in &reference {
        let agent = m["agent"].as_str().unwrap().to_string();
        let total = skipped.entry(agent).or_default();
        *total += m["data"]["actor/skipped_updates"].as_f64().unwrap();
        let scale = m["data"]["actor/loss_scale"].as_f64().unwrap();
        assert_eq!(scale, 16777216.0 / 2f64.powf(*total), "halved once per skipped update: {m}");
        assert!(m["data"]["actor/pg_loss"].as_f64().unwrap().is_finite(), "{m}");
    }
    assert!(skipped.values().all(|&n| n > 0.0), "every agent's scaled gradients overflowed first: {skipped:?}");
    let meta = std::fs::read_to_string(whole.join("checkpoints/step-000002/agent-0.optim.json")).unwrap();
    assert!(meta.contains("loss_scale"), "the scaler is saved with the optimizer: {meta}");
}

#[test]
fn a_diverging_run_stops_naming_agent_and_step_and_keeps_the_last_checkpoint() {
    // GSPO with one update per step: the huge learning rate blows the weights up in step 1's
    // update, and step 2 is the first to see non-finite numbers.
    let s = setup(3);
    let dir = s.data.path().join("diverged");
    let out = run(&[
        "train",
        "--config",
        s.config.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--algo",
        "gspo",
        "--set",
        "algo.minibatch_prompts=2",
        "--set",
        "algo.optimizer.lr=1e30",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("at step 2") && (err.contains("agent agent0-") || err.contains("agent agent1-")), "{err}");
    assert!(err.contains("algo.optimizer.lr"), "says how to fix it: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(latest(&dir).as_deref(), Some("step-000001"));
    assert!(!dir.join("checkpoints/step-000002").exists());
    // The kept checkpoint is complete: it resumes (and diverges again at step 2).
    let out = run(&["train", "--resume", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming") && stderr(&out).contains("at step 2"), "{}", stderr(&out));
}

/// Runs `hacpo train` expecting exit code 2 and an error that contains every one of `needles`.
fn rejects(args: &[&str], needles: &[&str]) {
    let out = run(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: expected {n:?} in: {err}");
    }
}

#[test]
fn bad_input_gets_a_clear_error_and_exit_code_2() {
    let s = setup(1);
    let cfg = s.config.to_str().unwrap();
    let out = s.data.path().join("runs");
    let o = |name: &str| out.join(name).to_str().unwrap().to_string();

    rejects(
        &["train", "--agents", "qwen3-1.7b-base,no-such-model", "--out", &o("a")],
        &["no-such-model", "qwen3-4b-base"],
    );
    rejects(&["train", "--config", cfg, "--algo", "ppo", "--out", &o("b")], &["unknown algorithm", "ppo", "gspo2x"]);
    rejects(
        &["train", "--config", cfg, "--set", "algo.group_size=1", "--out", &o("c")],
        &["algo.group_size", "at least 2"],
    );
    rejects(
        &["train", "--config", cfg, "--set", "algo.minibatch_prompts=3", "--out", &o("d")],
        &["algo.minibatch_prompts", "cannot be split"],
    );
    rejects(
        &["train", "--config", cfg, "--set", "task.train=gsm8k=/no/such/train.jsonl", "--out", &o("e")],
        &["/no/such/train.jsonl"],
    );
    rejects(&["train", "--config", cfg, "--set", "algo.no_such_key=1"], &["no_such_key"]);
    rejects(&["train", "--config", "/no/such/config.toml"], &["/no/such/config.toml"]);

    // An output directory that cannot be created: a path under a regular file.
    let file = s.data.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let under_file = file.join("run");
    rejects(&["train", "--config", cfg, "--out", under_file.to_str().unwrap()], &["cannot write", "--out"]);

    // Resuming: a directory that is not a run, and a run with a different configuration.
    rejects(&["train", "--resume", s.data.path().to_str().unwrap()], &["config.toml"]);
    let done = o("done");
    let ok = run(&["train", "--config", cfg, "--out", &done]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    rejects(
        &["train", "--resume", &done, "--config", cfg, "--set", "algo.hacpo.alpha=2", "--set", "algo.group_size=8"],
        &["different configuration", "algo.hacpo.alpha: 1.0 → 2.0", "algo.group_size: 4 → 8"],
    );
    // Starting a new run over an existing one would mix their checkpoints.
    rejects(&["train", "--config", cfg, "--out", &done], &["--resume"]);
}

fn signal(child: &std::process::Child, name: &str) {
    let ok = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status().unwrap();
    assert!(ok.success(), "kill -{name} failed");
}

/// Run directories never lose data: a second process is refused while one trains, Ctrl-C
/// stops after a step with a checkpoint that resumes exactly, a damaged newest checkpoint
/// falls back to the one before it (deleting nothing), `--resume --steps` continues from the
/// run's own config, a truncated metrics line is repaired, weights are written like every other
/// file of the run.
#[test]
fn run_directories_are_locked_interruptible_and_repaired_on_resume() {
    let s = setup(5);
    let cfg = s.config.to_str().unwrap();
    let whole = s.data.path().join("whole");
    let out = run(&["train", "--config", cfg, "--out", whole.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = deterministic_metrics(&whole);

    // A run in progress holds its directory.
    let stopped = s.data.path().join("stopped");
    let mut child = hacpo(&["train", "--config", cfg, "--out", stopped.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_checkpoint(&mut child, &stopped, |l| l.is_some(), "its first checkpoint");
    let second = run(&["train", "--resume", stopped.to_str().unwrap()]);
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    let pid = child.id().to_string();
    assert!(stderr(&second).contains("in use by another hacpo process") && stderr(&second).contains(&pid));

    // Ctrl-C: the step in progress finishes, a checkpoint is written, exit code 130.
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted after step") && err.contains("--resume"), "{err}");
    let at = latest(&stopped).unwrap();
    let metrics = deterministic_metrics(&stopped);
    let done: u64 = at.trim_start_matches("step-").parse().unwrap();
    assert_eq!(metrics.len() as u64, 2 * done, "the checkpoint is the last step with metrics ({at})");

    // A kill in the middle of writing a metrics line leaves half a line: repaired and said.
    let path = stopped.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"step\": 99, \"agent\": \"agen");
    std::fs::write(&path, text).unwrap();
    let out = run(&["train", "-v", "--resume", stopped.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("cut off mid-write"), "{}", stderr(&out));
    // Logs written to a file carry no colour codes.
    assert!(stderr(&out).contains("INFO") && !stderr(&out).contains('\u{1b}'), "{}", stderr(&out));
    assert_eq!(deterministic_metrics(&stopped), reference, "interrupted + resumed == uninterrupted");

    // Weights are readable like the rest of the run (not the 0600 of a private temp file).
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    let ckpt = whole.join("checkpoints/step-000005");
    assert_eq!(mode(&ckpt.join("agent-0/model.safetensors")), mode(&ckpt.join("agent-0/config.json")));
    assert_eq!(mode(&ckpt.join("agent-0.optim.safetensors")), mode(&ckpt.join("trainer_state.json")));

    // The newest checkpoint damaged: resume falls back to the one before, says so, keeps both,
    // and (with --steps and no --config: the run's own settings) repeats the lost step exactly.
    let weights = ckpt.join("agent-1/model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(len / 2).unwrap();
    let out = run(&["train", "--resume", whole.to_str().unwrap(), "--steps", "5"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("damaged") && err.contains("step-000004"), "{err}");
    assert_eq!(deterministic_metrics(&whole), reference);
    assert!(whole.join("checkpoints/step-000003").exists() && whole.join("checkpoints/step-000004").exists());
    rejects(&["train", "--resume", whole.to_str().unwrap(), "--steps", "2"], &["below the 5 steps", "--steps 2"]);

    // A directory holding checkpoints but no readable `latest` is still a run: refused.
    std::fs::remove_file(whole.join("checkpoints/latest")).unwrap();
    rejects(&["train", "--config", cfg, "--out", whole.to_str().unwrap()], &["already holds a run", "--resume"]);
}

/// No path loses a run's data: a finished run resumed with no step left keeps its summary
/// byte for byte; a new run never starts where a run's (or the user's own) files are, also
/// when the checkpoints were deleted; every command-line value on resume applies or is refused.
#[test]
fn a_run_is_never_overwritten_and_resume_changes_only_what_it_says() {
    let s = setup(2);
    let cfg = s.config.to_str().unwrap();
    let done = s.data.path().join("done");
    let d = done.to_str().unwrap();
    // Held-out scores before and after: a finished run then has a summary to keep.
    let validation = format!("task.validation=\"gsm8k={}\"", s.data.path().join("train.jsonl").display());
    let out = run(&["train", "--config", cfg, "--out", d, "--set", &validation, "--set", "task.val_max_new_tokens=6"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let files = |dir: &Path| {
        ["summary.json", "metrics.jsonl", "config.toml", "before.json"]
            .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
    };
    let kept = files(&done);
    assert!(!kept[0].is_empty());

    // Resumed with nothing left to train: exit 0, it says so, nothing is written.
    let again = run(&["train", "--resume", d]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("already finished its 2 steps"));
    assert_eq!(files(&done), kept, "a finished run's files changed on resume");

    // Every value given with --resume applies or is refused.
    rejects(&["train", "--resume", d, "--seed", "9"], &["different configuration", "run.seed: 5 → 9"]);
    rejects(&["train", "--resume", d, "--task", "arith"], &["different configuration", "task.kind"]);
    rejects(
        &["train", "--resume", d, "--out", s.data.path().join("elsewhere").to_str().unwrap()],
        &["--out", "drop --out"],
    );
    rejects(&["train", "--resume", d, "--steps", "1"], &["below the 2 steps"]);
    let moved = run(&["train", "--resume", d, "--devices", "cpu"]);
    assert!(moved.status.success(), "a device may change on resume: {}", stderr(&moved));
    rejects(&["train", "--resume", done.join("summary.json").to_str().unwrap()], &["is a file, not a run directory"]);

    // Checkpoints deleted to save space: still a run, never overwritten, still finished.
    std::fs::remove_dir_all(done.join("checkpoints")).unwrap();
    rejects(
        &["train", "--config", cfg, "--out", d, "--set", &validation, "--set", "task.val_max_new_tokens=6"],
        &["already holds a run's files", "summary.json", "--resume"],
    );
    let again = run(&["train", "--resume", d]);
    assert!(again.status.success(), "{}", stderr(&again));
    rejects(&["train", "--resume", d, "--steps", "4"], &["no checkpoint to continue from"]);
    assert_eq!(files(&done), kept, "a finished run's files changed");

    // The user's own config in the directory, or any run file alone, is never replaced.
    let mine = s.data.path().join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    let own = format!("# my notes\n{}", std::fs::read_to_string(&s.config).unwrap());
    std::fs::write(mine.join("config.toml"), &own).unwrap();
    let m = mine.join("config.toml");
    rejects(&["train", "--config", m.to_str().unwrap(), "--out", mine.to_str().unwrap()], &["config.toml", "--out"]);
    assert_eq!(std::fs::read_to_string(mine.join("config.toml")).unwrap(), own);
    let only_metrics = s.data.path().join("only-metrics");
    std::fs::create_dir_all(&only_metrics).unwrap();
    std::fs::write(only_metrics.join("metrics.jsonl"), "{\"step\": 1}\n").unwrap();
    rejects(&["train", "--config", cfg, "--out", only_metrics.to_str().unwrap()], &["metrics.jsonl"]);
    assert_eq!(std::fs::read_to_string(only_metrics.join("metrics.jsonl")).unwrap(), "{\"step\": 1}\n");

    // `checkpoints` that is a file is said before a step trains.
    let broken = s.data.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::copy(done.join("config.toml"), broken.join("config.toml")).unwrap();
    std::fs::write(broken.join("checkpoints"), "").unwrap();
    rejects(&["train", "--resume", broken.to_str().unwrap()], &["checkpoints should be a directory"]);

    // Killed before its first checkpoint (a config and no checkpoint): resume trains it from
    // step 0 to the same numbers.
    let early = s.data.path().join("early");
    std::fs::create_dir_all(&early).unwrap();
    std::fs::copy(done.join("config.toml"), early.join("config.toml")).unwrap();
    let out = run(&["train", "--resume", early.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("no checkpoint yet"), "{}", stderr(&out));
    assert_eq!(deterministic_metrics(&early), deterministic_metrics_of(&kept[1]));
}

/// The metrics a run recorded (`metrics.jsonl`'s bytes), as `deterministic_metrics` reads them.
fn deterministic_metrics_of(bytes: &[u8]) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("metrics.jsonl"), bytes).unwrap();
    deterministic_metrics(dir.path())
}

/// Resume passes over any damaged file of the newest checkpoint (a trainer state that is not
/// its directory's step, an unreadable config.json, NaN weights, a missing optimizer file) to
/// the one before, deleting nothing, and trains the lost step again to the same numbers.
#[test]
fn resume_falls_back_past_any_damaged_file_of_the_newest_checkpoint() {
    let s = setup(2);
    let cfg = s.config.to_str().unwrap();
    let whole = s.data.path().join("whole");
    let validation = format!("task.validation=\"gsm8k={}\"", s.data.path().join("train.jsonl").display());
    let out = run(&[
        "train",
        "--config",
        cfg,
        "--out",
        whole.to_str().unwrap(),
        "--set",
        &validation,
        "--set",
        "task.val_max_new_tokens=6",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = deterministic_metrics(&whole);
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 4] = [
        ("a trainer state of another step", |c| {
            let path = c.join("trainer_state.json");
            let text = std::fs::read_to_string(&path).unwrap().replace("\"step\": 2", "\"step\": 1");
            std::fs::write(path, text).unwrap();
        }),
        ("a garbage config.json", |c| std::fs::write(c.join("agent-0/config.json"), "{\"model_type\": 7").unwrap()),
        ("NaN weights", |c| {
            let path = c.join("agent-1/model.safetensors");
            let mut bytes = std::fs::read(&path).unwrap();
            let n = bytes.len();
            bytes[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
            std::fs::write(path, bytes).unwrap();
        }),
        ("a missing optimizer state", |c| std::fs::remove_file(c.join("agent-0.optim.json")).unwrap()),
    ];
    for (what, damage) in damages {
        let dir = s.data.path().join(what.replace(' ', "-"));
        copy_dir(&whole, &dir);
        // Not finished: the summary is what a kill before it would have left missing.
        std::fs::remove_file(dir.join("summary.json")).unwrap();
        damage(&dir.join("checkpoints/step-000002"));
        let out = run(&["train", "--resume", dir.to_str().unwrap()]);
        let err = stderr(&out);
        assert!(out.status.success(), "{what}: {err}");
        assert!(err.contains("passed over") && err.contains("step-000001"), "{what}: {err}");
        assert_eq!(deterministic_metrics(&dir), reference, "{what}");
        assert!(dir.join("summary.json").exists(), "{what}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() == ".lock" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A disk that fills while a checkpoint is written (here: a file-size limit, EFBIG, as a full
/// disk's ENOSPC would) is said as what it is, exit 2, and leaves no half-written file.
#[test]
fn a_full_disk_at_a_checkpoint_is_said_and_leaves_nothing_half_written() {
    use std::os::unix::process::CommandExt;
    let s = setup(1);
    let cfg = s.config.to_str().unwrap();
    let dir = s.data.path().join("full");
    let mut cmd = hacpo(&["train", "--config", cfg, "--out", dir.to_str().unwrap()]);
    // SAFETY: only setrlimit and signal between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("free some space") && !err.contains("cannot read weights"), "{err}");
    let leftovers: Vec<String> =
        walk(&dir).into_iter().filter(|p| p.rsplit('/').next().is_some_and(|name| name.contains(".tmp"))).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(dir.join("config.toml").is_file());
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if p.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}
