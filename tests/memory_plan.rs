//! The memory plan from the command line: `hacpo train --dry-run` prints it without loading
//! anything (no weights, no download, no GPU, any build), and a run that does not fit is
//! refused before it starts.

mod common;

use std::process::Output;

use common::hacpo_command;

/// `hacpo ARGS` offline with an empty hub cache: a plan that tried to download or read a
/// model's files would fail.
fn hacpo_offline(args: &[&str], home: &std::path::Path) -> Output {
    hacpo_command(args).env("HF_HOME", home).env("HF_HUB_CACHE", home.join("hub")).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A full fine-tune of llama-8b on one 40 GB GPU fits no batch size, even with its state in
/// host memory: refused before anything loads, with the numbers and the ways out.
#[test]
fn full_fine_tuning_of_llama_8b_on_one_40_gb_gpu_is_refused_before_anything_loads() {
    let home = tempfile::tempdir().unwrap();
    let out = hacpo_offline(
        &["train", "--agents", "llama-8b", "--devices", "cuda:0", "--device-memory", "40GB", "--dry-run"],
        home.path(),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The plan on stdout, the verdict and the ways out on stderr.
    assert!(stdout.contains("memory plan") && stdout.contains("8.03B") && stdout.contains("DOES NOT FIT"), "{stdout}");
    for part in ["does not fit cuda:0", "agent0-llama-8b (llama-8b)", "weights 32.1 GB", "AdamW moments 64.2 GB"] {
        assert!(stderr.contains(part), "{part:?} missing:\n{stderr}");
    }
    for part in [
        "40.0 GB (--device-memory)",
        "with the last three in host memory (offload = true",
        "LoRA adapters for agent0-llama-8b",
        "--offload",
        "gradient_checkpointing=true",
        "micro_batch_sequences=1",
        "all of these",
        "--skip-memory-check",
    ] {
        assert!(stderr.contains(part), "{part:?} missing:\n{stderr}");
    }
}

/// The headline command with no preset: `hacpo train --agents qwen-1.5b,llama-8b` on two 80 GB
/// GPUs, both fully fine-tuned in f32. hacpo chooses the micro-batch, recomputation and
/// rollout batch, and keeps llama-8b's reference, moments and summed gradients in host memory
/// (its 160.6 GB of state fit no GPU), says so, and the plan fits; all without a GPU or a
/// download.
#[test]
fn the_headline_pair_fits_two_80_gb_gpus_by_itself() {
    let home = tempfile::tempdir().unwrap();
    let out = hacpo_offline(
        &[
            "train",
            "--agents",
            "qwen-1.5b,llama-8b",
            "--devices",
            "cuda:0,cuda:1",
            "--device-memory",
            "80GB",
            "--dry-run",
        ],
        home.path(),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for part in [
        "agent0-qwen-1.5b",
        "1.54B",
        "agent1-llama-8b",
        "offloaded (agent1-llama-8b): 128.5 GB",
        "dry run: the plan fits",
    ] {
        assert!(stdout.contains(part), "{part:?} missing:\n{stdout}");
    }
    assert!(stdout.contains("cuda:0: needs") && stdout.contains("cuda:1: needs") && !stdout.contains("DOES NOT FIT"));
    for part in ["algo.gradient_checkpointing = true", "offload = true for agent1-llama-8b", "the same update"] {
        assert!(stderr.contains(part), "{part:?} missing:\n{stderr}");
    }
    assert!(!home.path().join("hub").exists(), "nothing downloaded or cached");
}

/// The preset makes the pair fit two 80 GB GPUs (LoRA on a bf16 llama-8b base, gradient
/// checkpointing, one sequence per micro-batch), and the plan says so without a GPU or a download.
#[test]
fn the_headline_preset_fits_two_80_gb_gpus() {
    let home = tempfile::tempdir().unwrap();
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/qwen1.5b-llama8b.toml");
    let out = hacpo_offline(
        &[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--devices",
            "cuda:0,cuda:1",
            "--device-memory",
            "80GB",
            "--dry-run",
        ],
        home.path(),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for part in [
        "agent1-llama-8b (LoRA r16, bf16)",
        "gradient checkpointing",
        "cuda:0: needs",
        "cuda:1: needs",
        "dry run: the plan fits",
    ] {
        assert!(stdout.contains(part), "{part:?} missing:\n{stdout}");
    }
    assert!(!stdout.contains("DOES NOT FIT"), "{stdout}");
    assert!(!home.path().join("hub").exists(), "nothing downloaded or cached");
}

/// The command-line way to the same: LoRA on a bf16 base, checkpointing, one sequence per
/// micro-batch, for llama-8b alone on one 80 GB GPU.
#[test]
fn llama_8b_fits_one_80_gb_gpu_with_lora_a_bf16_base_and_checkpointing() {
    let home = tempfile::tempdir().unwrap();
    let out = hacpo_offline(
        &[
            "train",
            "--agents",
            "llama-8b",
            "--devices",
            "cuda:0",
            "--lora",
            "16",
            "--frozen-dtype",
            "bf16",
            "--set",
            "algo.gradient_checkpointing=true",
            "--set",
            "algo.micro_batch_sequences=1",
            "--set",
            "rollout.batch_prompts=1",
            "--device-memory",
            "80GB",
            "--dry-run",
        ],
        home.path(),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("agent0-llama-8b (LoRA r16, bf16)") && stdout.contains("fits"), "{stdout}");
    let out = hacpo_offline(&["train", "--agents", "llama-8b", "--frozen-dtype", "bf8", "--dry-run"], home.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn the_dry_run_of_the_default_prints_a_plan_that_fits_and_writes_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = hacpo_offline(&["train", "--dry-run", "--out", run.to_str().unwrap()], dir.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for part in ["agent0-tiny-qwen", "agent1-tiny-llama", "cpu: needs", "available RAM: fits", "dry run: the plan fits"]
    {
        assert!(stdout.contains(part), "{part:?} missing:\n{stdout}");
    }
    assert!(!run.exists(), "a dry run writes no run directory");
}

#[test]
fn a_device_memory_without_a_unit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = hacpo_offline(&["train", "--dry-run", "--device-memory", "80"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("e.g. 80GB"), "{}", text(&out.stderr));
}

/// A new run that does not fit gets the micro-batch (and, when that is not enough, gradient
/// checkpointing: `memory_plan`'s unit test) that makes it fit: the same update. It says so, trains with them and
/// records them in the run's config; `--skip-memory-check` keeps the settings as given.
#[test]
fn a_run_that_does_not_fit_chooses_the_micro_batch_that_does() {
    let dir = tempfile::tempdir().unwrap();
    let out = hacpo_offline(&["train", "--dry-run", "--device-memory", "800MB"], dir.path());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("chose algo.micro_batch_sequences = 16 (was 64)"), "{stderr}");
    assert!(stderr.contains("the same update, gradients accumulated over smaller micro-batches"), "{stderr}");
    assert!(stdout.contains("micro-batch 16 × 352 tokens") && stdout.contains("dry run: the plan fits"), "{stdout}");
    // A run trains with the choice and records it.
    let run = dir.path().join("run");
    let out = hacpo_offline(
        &[
            "train",
            "--device-memory",
            "800MB",
            "--steps",
            "1",
            "--set",
            "task.val_every=0",
            "--out",
            run.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("micro_batch_sequences = 16"), "{config}");
    // What cannot fit with the same update says so, and what would.
    let out = hacpo_offline(&["train", "--dry-run", "--device-memory", "20MB"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("one prompt per rollout batch (the same run) needs 0.07 GB.\n"), "{stderr}");
    let out = hacpo_offline(&["train", "--dry-run", "--device-memory", "800MB", "--skip-memory-check"], dir.path());
    assert!(text(&out.stdout).contains("micro-batch 64 × 352 tokens"), "{}", text(&out.stdout));
}

/// A token budget (`algo.micro_batch_tokens`) trains; a run that does not fit gets the largest
/// budget that does (to about an eighth), says so and records it; a budget below the run's
/// longest sequence is refused before anything loads, with the least that holds it.
#[test]
fn a_token_budget_trains_and_shrinks_to_fit() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let budget = ["--set", "algo.micro_batch_tokens=22528"];
    let args = ["train", "--device-memory", "1GB", "--steps", "1", "--set", "task.val_every=0", "--out"];
    let out = hacpo_offline(&[&args[..], &[run.to_str().unwrap()], &budget].concat(), dir.path());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("chose algo.micro_batch_tokens = ") && stderr.contains(" (was 22528)"), "{stderr}");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let chosen: usize = config
        .lines()
        .find_map(|l| l.strip_prefix("micro_batch_tokens = "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no budget recorded:\n{config}"));
    assert!((352..22528).contains(&chosen), "{chosen}");
    assert!(std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().lines().count() >= 1);
    let out = hacpo_offline(&["train", "--dry-run", "--set", "algo.micro_batch_tokens=100"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("algo.micro_batch_tokens: 100 is below this run's longest sequence (up to 352 tokens"),
        "{stderr}"
    );
    assert!(stderr.contains("set 352 or more, or 0 to cut micro-batches by algo.micro_batch_sequences"), "{stderr}");
}

/// On the CPU the plan is what the process holds: `hacpo bench`'s train step (tiny-5m, random
/// weights) at shapes where the tokens, the attention and one long sequence dominate holds no
/// more than the plan says above what the process held before the model was built, and more
/// than half of it (burn's generic ops keep about twice what the CPU's fused kernels do: a
/// plan of theirs here would refuse runs that fit).
#[test]
fn the_cpu_plan_covers_what_a_train_step_holds() {
    for (batch, len) in [("16", "256"), ("4", "1024"), ("1", "2048")] {
        let out = hacpo_command(&[
            "bench",
            "--format",
            "json",
            "--prefill-batch",
            "1",
            "--prefill-len",
            "16",
            "--decode-batch",
            "1",
            "--new-tokens",
            "2",
            "--prompt-len",
            "8",
            "--train-batch",
            batch,
            "--train-len",
            len,
            "--reps",
            "1",
        ])
        .output()
        .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let memory = &report["memory"];
        let bytes = |key: &str| memory[key].as_u64().unwrap_or_else(|| panic!("memory.{key} in {report}")) as f64;
        let held = bytes("peak") - bytes("at_start");
        let planned = bytes("planned");
        assert!(held <= planned && planned < 2.0 * held, "{batch} × {len}: held {held:.3e}, planned {planned:.3e}");
    }
}
