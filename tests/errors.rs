//! Bad input gets one clear paragraph on stderr and exit code 2, never a panic.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{fixture, hacpo_bin, shared, tiny_model_dir};
use serde_json::Value;

fn hacpo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(hacpo_bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Asserts a user error: exit code 2, an `error:` paragraph mentioning every `needles`, no panic.
/// Progress lines (long work in a log, e.g. weight loading on a busy machine) may come first.
fn assert_user_error(out: &Output, needles: &[&str]) {
    let all = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code; stderr:\n{all}");
    let start = all.find("error: ").unwrap_or_else(|| panic!("no error paragraph:\n{all}"));
    assert!(all[..start].lines().all(|l| l.contains(" elapsed")), "only progress lines before the error:\n{all}");
    let stderr = &all[start..];
    assert!(!all.contains("panicked") && !all.contains("RUST_BACKTRACE"), "panic:\n{stderr}");
    assert!(stderr.lines().count() <= 6, "more than one paragraph:\n{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}:\n{stderr}");
    }
}

fn generate(model: &Path) -> Output {
    hacpo(&["generate", "--model", model.to_str().unwrap(), "--prompt", "hi", "--max-new-tokens", "2"], &[])
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn the_tiny_model_dir_works_so_failures_below_are_the_edits() {
    let dir = tiny_model_dir("qwen3-tiny");
    let out = hacpo(
        &[
            "generate",
            "--model",
            dir.path().to_str().unwrap(),
            "--chat",
            "--prompt",
            "hi",
            "--max-new-tokens",
            "3",
            "--format",
            "json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completions"][0]["ids"].as_array().unwrap().len(), 3);
}

#[test]
fn missing_config_json() {
    let dir = tiny_model_dir("qwen3-tiny");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert_user_error(&generate(dir.path()), &["config.json not found", "model directory holds"]);
}

#[test]
fn malformed_config_json() {
    let dir = tiny_model_dir("qwen3-tiny");
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"qwen3\", ").unwrap();
    assert_user_error(&generate(dir.path()), &["config.json", "not valid JSON"]);
}

#[test]
fn config_with_a_wrong_value_names_the_key() {
    let dir = tiny_model_dir("qwen3-tiny");
    edit_config(dir.path(), |v| v["num_hidden_layers"] = "two".into());
    assert_user_error(&generate(dir.path()), &["num_hidden_layers", "integer"]);
}

#[test]
fn unsupported_architecture() {
    let dir = tiny_model_dir("qwen3-tiny");
    edit_config(dir.path(), |v| v["model_type"] = "gpt2".into());
    assert_user_error(&generate(dir.path()), &["unsupported architecture \"gpt2\"", "qwen3"]);
}

#[test]
fn weight_with_the_wrong_shape_names_tensor_and_shapes() {
    let dir = tiny_model_dir("qwen3-tiny");
    edit_config(dir.path(), |v| v["intermediate_size"] = 96.into());
    assert_user_error(&generate(dir.path()), &["model.layers.0.mlp.gate_proj.weight", "[128, 64]", "[96, 64]"]);
}

#[test]
fn missing_weight() {
    use hacpo::model::safetensors_io::{SafetensorsSource, write_safetensors};
    use hacpo::model::{SaveDtype, weights::WeightSource};
    let dir = tiny_model_dir("qwen3-tiny");
    let mut src = SafetensorsSource::open_file(&dir.path().join("model.safetensors")).unwrap();
    let missing = "model.layers.1.mlp.down_proj.weight";
    let tensors: Vec<_> =
        src.names().into_iter().filter(|n| n != missing).map(|n| (n.clone(), src.take(&n).unwrap().unwrap())).collect();
    drop(src);
    write_safetensors(dir.path(), tensors, SaveDtype::F32, usize::MAX).unwrap();
    assert_user_error(&generate(dir.path()), &[missing, "missing"]);
}

#[test]
fn truncated_safetensors() {
    let dir = tiny_model_dir("qwen3-tiny");
    let path = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1000).unwrap();
    assert_user_error(&generate(dir.path()), &["model.safetensors", "truncated"]);
}

#[test]
fn missing_shard() {
    let dir = tiny_model_dir("qwen2-tiny");
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_user_error(&generate(dir.path()), &["model-00002-of-00002.safetensors"]);
}

#[test]
fn tokenizer_of_another_model() {
    let dir = tiny_model_dir("qwen3-tiny");
    std::fs::copy(shared("assets/tokenizers/gpt2/tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    assert_user_error(&generate(dir.path()), &["50257 tokens", "512 rows"]);
}

#[test]
fn unknown_zoo_id() {
    let out = hacpo(&["generate", "--model", "qwen-42b", "--prompt", "hi"], &[]);
    assert_user_error(&out, &["unknown model \"qwen-42b\"", "hacpo models"]);
}

#[test]
fn offline_without_cache_names_the_repo() {
    let home = tempfile::tempdir().unwrap();
    let out = hacpo(
        &["generate", "--model", "qwen-0.5b", "--prompt", "hi"],
        &[("HF_HOME", home.path().to_str().unwrap()), ("HF_HUB_OFFLINE", "1")],
    );
    assert_user_error(&out, &["Qwen/Qwen2.5-0.5B-Instruct", "HF_HUB_OFFLINE", "--model /path/to/dir"]);
}

#[test]
fn no_network_and_no_cache_names_the_repo() {
    let home = tempfile::tempdir().unwrap();
    let out = hacpo(
        &["generate", "--model", "qwen3-0.6b", "--prompt", "hi"],
        &[("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", "http://127.0.0.1:9")],
    );
    assert_user_error(&out, &["Qwen/Qwen3-0.6B", "not in the local cache"]);
}

#[test]
fn prompt_longer_than_the_context() {
    let dir = tiny_model_dir("llama31-tiny");
    edit_config(dir.path(), |v| v["max_position_embeddings"] = 64.into());
    let prompt = "x".repeat(100);
    let out = hacpo(&["generate", "--model", dir.path().to_str().unwrap(), "--prompt", &prompt], &[]);
    assert_user_error(&out, &["100 tokens", "context is 64"]);
    let out = hacpo(&["score", "--model", dir.path().to_str().unwrap(), "--prompt", "ab", "--response", &prompt], &[]);
    assert_user_error(&out, &["102 tokens", "context is 64"]);
}

#[test]
fn truncated_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.gguf");
    let bytes = std::fs::read(fixture("models/qwen3-tiny/model.safetensors")).unwrap();
    std::fs::write(&path, &bytes[..100]).unwrap();
    assert_user_error(&generate(&path), &["broken.gguf", "not a GGUF file"]);
    let mut gguf = b"GGUF".to_vec();
    gguf.extend_from_slice(&3u32.to_le_bytes());
    gguf.extend_from_slice(&5u64.to_le_bytes());
    std::fs::write(&path, &gguf).unwrap();
    assert_user_error(&generate(&path), &["broken.gguf", "truncated"]);
    let mut future = b"GGUF".to_vec();
    future.extend_from_slice(&7u32.to_le_bytes());
    future.extend_from_slice(&[0u8; 16]);
    std::fs::write(&path, &future).unwrap();
    assert_user_error(&generate(&path), &["broken.gguf", "GGUF version 7"]);
}

#[test]
fn cuda_device_without_cuda_build_and_bad_sampling_values() {
    let dir = tiny_model_dir("qwen3-tiny");
    let m = dir.path().to_str().unwrap();
    if !cfg!(feature = "cuda") {
        assert_user_error(
            &hacpo(&["generate", "--model", m, "--prompt", "hi", "--device", "cuda:0"], &[]),
            &["--features cuda"],
        );
    }
    assert_user_error(
        &hacpo(&["generate", "--model", m, "--prompt", "hi", "--device", "tpu"], &[]),
        &["unknown device \"tpu\""],
    );
    assert_user_error(&hacpo(&["generate", "--model", m, "--prompt", "hi", "--top-p", "1.5"], &[]), &["top-p"]);
    assert_user_error(&hacpo(&["generate", "--model", m, "--prompt", "hi", "--temperature", "0"], &[]), &["--greedy"]);
    assert_user_error(&hacpo(&["convert", "--model", m, "--out", "/tmp/x", "--dtype", "int4"], &[]), &["int4"]);
}

#[test]
fn a_cpu_kernels_level_that_names_none_is_refused_and_the_others_run() {
    let dir = tiny_model_dir("qwen3-tiny");
    let args = ["-v", "generate", "--model", dir.path().to_str().unwrap(), "--prompt", "hi", "--max-new-tokens", "2"];
    assert_user_error(
        &hacpo(&args, &[("HACPO_CPU_KERNELS", "avx3")]),
        &["HACPO_CPU_KERNELS", "avx512, avx2, baseline"],
    );
    // Every level runs (one above the CPU's caps nothing), and -v says which kernels do.
    for (value, says) in [
        ("baseline", "CPU kernels: baseline"),
        (" AVX2 ", "CPU kernels: "),
        ("avx512", "CPU kernels: "),
        ("", "CPU kernels: "),
    ] {
        let out = hacpo(&args, &[("HACPO_CPU_KERNELS", value)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{value}: {stderr}");
        assert!(stderr.contains(says), "{value}: {stderr}");
    }
}

#[test]
fn generate_without_chat_template() {
    let dir = tiny_model_dir("qwen3-tiny");
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
    let out = hacpo(&["generate", "--model", dir.path().to_str().unwrap(), "--chat", "--prompt", "hi"], &[]);
    assert_user_error(&out, &["no chat template"]);
}

#[test]
fn non_finite_weights_are_named_at_load() {
    use hacpo::model::safetensors_io::{SafetensorsSource, write_safetensors};
    use hacpo::model::{SaveDtype, weights::WeightSource};
    let dir = tiny_model_dir("qwen3-tiny");
    let mut src = SafetensorsSource::open_file(&dir.path().join("model.safetensors")).unwrap();
    let poisoned = "model.layers.0.mlp.up_proj.weight";
    let tensors: Vec<_> = src
        .names()
        .into_iter()
        .map(|n| {
            let mut t = src.take(&n).unwrap().unwrap();
            if n == poisoned {
                t.data[3] = f32::NAN;
            }
            (n.clone(), t)
        })
        .collect();
    drop(src);
    write_safetensors(dir.path(), tensors, SaveDtype::F32, usize::MAX).unwrap();
    assert_user_error(&generate(dir.path()), &[poisoned, "non-finite"]);
}

/// Requests that would exhaust memory or run into the context are refused before any work.
#[test]
fn oversized_and_empty_requests_are_refused_up_front() {
    let dir = tiny_model_dir("llama31-tiny");
    edit_config(dir.path(), |v| v["max_position_embeddings"] = 64.into());
    let m = dir.path().to_str().unwrap();
    let generate_with = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", m, "--prompt", "hi"];
        args.extend_from_slice(extra);
        hacpo(&args, &[])
    };
    assert_user_error(&generate_with(&["--max-new-tokens", "100"]), &["--max-new-tokens", "context of 64"]);
    assert_user_error(&generate_with(&["--num-samples", "1000000"]), &["--num-samples", "1024"]);
    assert_user_error(&generate_with(&["--stop", ""]), &["--stop"]);
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--model", m];
        args.extend_from_slice(extra);
        hacpo(&args, &[])
    };
    assert_user_error(&bench(&["--prefill-len", "65"]), &["--prefill-len", "context of 64"]);
    assert_user_error(&bench(&["--reps", "0"]), &["--reps"]);
    assert_user_error(&bench(&["--decode-batch", "0"]), &["--decode-batch"]);
    assert_user_error(&bench(&["--decode-samples", "0"]), &["--decode-samples"]);
    assert_user_error(&bench(&["--decode-batch", "8,12", "--decode-samples", "8"]), &["--decode-batch 12", "multiple"]);
}

/// A GGUF header: magic, version 3, tensor and key-value counts.
fn gguf_header(tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&tensors.to_le_bytes());
    b.extend_from_slice(&kvs.to_le_bytes());
    b
}

/// Small crafted files that used to overflow the stack or reserve gigabytes are refused,
/// cheaply, with what is wrong.
#[test]
fn crafted_gguf_files_are_refused_without_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crafted.gguf");
    // 100,000 nested metadata arrays (1.2 MB): a stack overflow before.
    let mut nested = gguf_header(0, 1);
    nested.extend_from_slice(&1u64.to_le_bytes());
    nested.push(b'a');
    nested.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100_000 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    std::fs::write(&path, &nested).unwrap();
    assert_user_error(&generate(&path), &["crafted.gguf", "nested deeper"]);
    // A tensor of 2^31 dimensions in a 100-byte file: a 16 GB reservation and an abort before.
    let mut dims = gguf_header(1, 0);
    dims.extend_from_slice(&1u64.to_le_bytes());
    dims.push(b't');
    dims.extend_from_slice(&(1u32 << 31).to_le_bytes());
    dims.resize(100, 0);
    std::fs::write(&path, &dims).unwrap();
    assert_user_error(&generate(&path), &["crafted.gguf", "2147483648 dimensions"]);
    // Counts the file cannot hold, and an array of 2^60 elements.
    std::fs::write(&path, gguf_header(1 << 40, 1 << 40)).unwrap();
    assert_user_error(&generate(&path), &["crafted.gguf", "bytes left"]);
    let mut huge = gguf_header(0, 1);
    huge.extend_from_slice(&1u64.to_le_bytes());
    huge.push(b'a');
    huge.extend_from_slice(&9u32.to_le_bytes());
    huge.extend_from_slice(&4u32.to_le_bytes());
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    std::fs::write(&path, &huge).unwrap();
    assert_user_error(&generate(&path), &["crafted.gguf", "array element count"]);
}

/// A config.json with sizes no model has, or numbers the forward pass cannot use, is refused
/// before any weight is read (10.6 GB were reserved for a million layers; a negative
/// `rope_theta` gave garbage text with exit 0).
#[test]
fn implausible_model_configs_are_refused_before_loading() {
    for (key, value, needles) in [
        ("num_hidden_layers", serde_json::json!(1_000_000), vec!["num_hidden_layers", "1000000", "1024"]),
        ("hidden_size", serde_json::json!(0), vec!["hidden_size", "between 1"]),
        ("rope_theta", serde_json::json!(-1.0), vec!["rope_theta", "above 1"]),
        ("rms_norm_eps", serde_json::json!(-1.0), vec!["rms_norm_eps", "above 0"]),
        ("vocab_size", serde_json::json!(1u64 << 40), vec!["vocab_size"]),
        ("eos_token_id", serde_json::json!(1u64 << 40), vec!["eos_token_id"]),
    ] {
        let dir = tiny_model_dir("qwen3-tiny");
        // The fixture is in transformers 5's layout: RoPE's theta lives in rope_parameters.
        edit_config(dir.path(), |v| match key {
            "rope_theta" => v["rope_parameters"][key] = value.clone(),
            _ => v[key] = value.clone(),
        });
        let started = std::time::Instant::now();
        assert_user_error(&generate(dir.path()), &needles);
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "{key}: slow refusal");
    }
}

/// Zero or absurd sizes for `bench` and `generate`, and requests whose memory estimate exceeds
/// the machine, are refused before anything is allocated (they panicked or took hundreds of GB).
#[test]
fn zero_sizes_and_oversized_requests_are_refused_before_allocating() {
    for flags in [
        vec!["--prefill-len", "0", "--no-train"],
        vec!["--prefill-batch", "0"],
        vec!["--train-batch", "0"],
        vec!["--new-tokens", "0"],
        vec!["--prompt-len", "0"],
        vec!["--train-len", "0"],
        vec!["--trainer", "--hidden", "0"],
        vec!["--trainer", "--layers", "0"],
        vec!["--trainer", "--steps", "0"],
    ] {
        let mut args = vec!["bench"];
        args.extend_from_slice(&flags);
        assert_user_error(&hacpo(&args, &[]), &[flags[flags.len() - 2]]);
    }
    // The memory plan of a command that does not train, against a stated 1 GB device.
    let tight = ["--device-memory", "1GB"];
    assert_user_error(
        &hacpo(&[&["bench", "--decode-batch", "100000"][..], &tight].concat(), &[]),
        &["memory plan does not fit", "`hacpo bench` needs about", "--decode-batch"],
    );
    assert_user_error(
        &hacpo(&[&["bench", "--random-shape", "llama-8b"][..], &tight].concat(), &[]),
        &["memory plan does not fit", "llama-8b"],
    );
    let dir = tiny_model_dir("qwen3-tiny");
    let m = dir.path().to_str().unwrap();
    let out = hacpo(
        &[
            &["generate", "--model", m, "--prompt", "hi", "--num-samples", "1024", "--max-new-tokens", "4000"][..],
            &["--device-memory", "10MB"],
        ]
        .concat(),
        &[],
    );
    assert_user_error(&out, &["memory plan does not fit", "`hacpo generate`", "--num-samples 256"]);
    // --skip-memory-check runs anyway (a warning).
    let out = hacpo(
        &[
            "generate",
            "--model",
            m,
            "--prompt",
            "hi",
            "--max-new-tokens",
            "2",
            "--device-memory",
            "1MB",
            "--skip-memory-check",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: --skip-memory-check"));
}

/// Numbers that overflow or mean nothing are refused, not printed as `null` or `0.0%`.
#[test]
fn inputs_that_give_silent_wrong_results_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch.json");
    std::fs::write(
        &batch,
        r#"{"learner": 0, "samples": [
            {"agent": 0, "prompt": "p", "reward": 1.7e308, "mean_logp_target": -1, "mean_logp_source": -1},
            {"agent": 0, "prompt": "p", "reward": -1.7e308, "mean_logp_target": -1, "mean_logp_source": -1}]}"#,
    )
    .unwrap();
    assert_user_error(
        &hacpo(&["rl", "inspect", "--input", batch.to_str().unwrap()], &[]),
        &["samples[0].reward", "out of range"],
    );
    std::fs::write(&batch, r#"{"learner": 4000000000, "samples": [{"agent": 0, "prompt": "p", "reward": 1, "mean_logp_target": -1, "mean_logp_source": -1}]}"#).unwrap();
    assert_user_error(
        &hacpo(&["rl", "inspect", "--input", batch.to_str().unwrap()], &[]),
        &["learner", "out of range"],
    );
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n\n").unwrap();
    assert_user_error(
        &hacpo(&["grade", "--task", "qa", "--input", empty.to_str().unwrap()], &[]),
        &["holds no predictions"],
    );
    assert_user_error(&hacpo(&["grade", "--input", empty.to_str().unwrap()], &[]), &["holds no cases"]);
}

/// Files the user names but cannot read, and places that are files where a directory belongs,
/// are the user's to fix: exit code 2, not 1.
#[test]
fn unreadable_files_and_files_for_directories_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let f = file.to_str().unwrap();
    assert_user_error(&hacpo(&["train", "--resume", f], &[]), &["is a file, not a run directory"]);
    assert_user_error(&hacpo(&["report", f], &[]), &["is a file, not a run directory"]);
    assert_user_error(&hacpo(&["study", "--out", f, "--seeds", "1"], &[]), &["is a file"]);
    let not_utf8 = dir.path().join("latin1.json");
    std::fs::write(&not_utf8, b"{\"a\": \"\xff\"}").unwrap();
    assert_user_error(&hacpo(&["rl", "inspect", "--input", not_utf8.to_str().unwrap()], &[]), &["latin1.json"]);
}

/// `convert` never writes over a model (converting a directory into itself replaced its f32
/// weights with the bf16 copy).
#[test]
fn convert_refuses_a_directory_that_holds_a_model() {
    let dir = tiny_model_dir("qwen3-tiny");
    let m = dir.path().to_str().unwrap();
    let before = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    assert_user_error(
        &hacpo(&["convert", "--model", m, "--out", m, "--dtype", "bf16"], &[]),
        &["already holds a model"],
    );
    assert_eq!(std::fs::read(dir.path().join("model.safetensors")).unwrap(), before);
}

/// Every setting is checked where it is read, with its key, before anything loads (`--dry-run`
/// loads nothing): values that trained nothing, raised the learning rate or failed only after
/// the weights loaded.
#[test]
fn settings_that_would_train_wrongly_or_fail_late_are_refused_with_their_key() {
    for (set, key) in [
        ("algo.max_abs_log_ratio=inf", "algo.max_abs_log_ratio"),
        ("algo.adv_epsilon=inf", "algo.adv_epsilon"),
        ("algo.schedule.min_ratio=5", "algo.schedule.min_ratio"),
        ("algo.optimizer.beta1=1", "algo.optimizer.beta1"),
        ("algo.optimizer.eps=-1", "algo.optimizer.eps"),
        ("algo.optimizer.lr=inf", "algo.optimizer.lr"),
        ("algo.kl_coef=inf", "algo.kl_coef"),
        ("algo.capability.ratio_min=20", "algo.capability"),
        ("algo.capability.window=0", "algo.capability"),
        ("algo.hacpo.alpha=inf", "alpha"),
        ("rollout.temperature=nan", "rollout.temperature"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
        ("rollout.max_prompt_tokens=0", "rollout.max_prompt_tokens"),
        ("task.val_max_new_tokens=0", "task.val_max_new_tokens"),
        ("task.val_limit=0", "task.val_limit"),
        ("task.arith.max_multiplier=1000000", "max_multiplier"),
    ] {
        let out = hacpo(&["train", "--set", set, "--dry-run"], &[]);
        assert_user_error(&out, &[key]);
    }
}
