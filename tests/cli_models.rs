//! What README promises about configs and models that no other test covers: every file in
//! `configs/` validates, `hacpo models` lists the zoo and what is cached, a zoo id resolves
//! from a local hub cache with no network, and `hacpo convert --dtype bf16` writes bf16 weights
//! that load back as the model rounded to bf16, and `hacpo bench` names the machine it measured.

mod common;

use std::path::Path;
use std::process::Command;

use hacpo::backend::Cpu;
use hacpo::config::TrainConfig;

fn hacpo(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut c = Command::new(common::hacpo_bin());
    c.args(args).env_remove("HF_HOME").env("HF_HUB_OFFLINE", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn every_config_file_parses_and_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut seen = vec![];
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let cfg = TrainConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!cfg.policies.is_empty(), "{} names no policies", path.display());
            cfg.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(hacpo::rl::registry::names().contains(&cfg.algo.name.as_str()), "{}", path.display());
            seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "atgrpo-plan-path-qwen3-1.7b.toml",
            "atgrpo-sokoban-qwen3-1.7b.toml",
            "atgrpo-sudoku-qwen3-1.7b.toml",
            "hacpo-math.toml",
            "mgrpo-qwen3.toml",
            "mhgpo-hotpotqa.toml",
            "qwen1.5b-llama8b.toml",
            "search-smollm2.toml",
            "tiny-delegate.toml",
            "tiny-duo.toml",
            "tiny-planpath.toml",
            "tiny-search.toml"
        ],
        "a new config is checked here too"
    );
}

/// A hub cache holding `repo` as hf-hub and huggingface_hub lay it out, with `files` from `src`.
fn fake_hub_snapshot(hf_home: &Path, repo: &str, src: &Path) {
    let dir = hf_home.join("hub").join(format!("models--{}", repo.replace('/', "--")));
    let commit = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::fs::write(dir.join("refs/main"), commit).unwrap();
    let snapshot = dir.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    for f in std::fs::read_dir(src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, snapshot.join(f.file_name().unwrap())).unwrap();
    }
}

#[test]
fn models_lists_the_zoo_and_a_zoo_id_resolves_from_the_hub_cache_offline() {
    let hf_home = tempfile::tempdir().unwrap();
    let env = [("HF_HOME", hf_home.path())];
    let list = |env: &[(&str, &Path)]| {
        let out = hacpo(&["models", "--format", "json"], env);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap()
    };
    let rows = list(&env);
    let entries = hacpo::model::zoo::entries();
    assert_eq!(rows.len(), entries.len());
    for (row, e) in rows.iter().zip(&entries) {
        assert_eq!((row["id"].as_str(), row["repo"].as_str()), (Some(e.id.as_str()), Some(e.repo.as_str())));
        assert_eq!(row["cached"], false, "{} in an empty cache", e.id);
    }
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    for id in ["qwen-1.5b", "llama-8b", "qwen3-1.7b-base", "smollm2-135m"] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    let text = hacpo(&["models"], &env);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.starts_with("ID") && text.contains("Qwen/Qwen2.5-1.5B-Instruct"), "{text}");

    // Offline and not cached: an error naming the repo and the cache.
    let out = hacpo(&["generate", "--model", "qwen-1.5b", "--prompt", "hi", "--max-new-tokens", "2"], &env);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Qwen/Qwen2.5-1.5B-Instruct") && err.contains("HF_HUB_OFFLINE"), "{err}");

    // The same id once its files are in the cache: loaded from there, no network.
    let agent = common::tiny_agent("qwen3", "qwen2", 32, 3);
    fake_hub_snapshot(hf_home.path(), "Qwen/Qwen2.5-1.5B-Instruct", agent.path());
    let rows = list(&env);
    let cached: Vec<&str> = rows.iter().filter(|r| r["cached"] == true).map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(cached, ["qwen-1.5b"]);
    let args = ["generate", "--model", "qwen-1.5b", "--prompt", "hi", "--max-new-tokens", "3", "--greedy"];
    let out = hacpo(&args, &env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let by_path = hacpo(
        &["generate", "--model", agent.path().to_str().unwrap(), "--prompt", "hi", "--max-new-tokens", "3", "--greedy"],
        &[],
    );
    assert_eq!(out.stdout, by_path.stdout, "the cached snapshot is the model");
}

/// The dtype of every tensor in a safetensors file (from its JSON header).
fn safetensors_dtypes(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(_, v)| v["dtype"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn convert_to_bf16_writes_bf16_weights_that_load_as_the_rounded_model() {
    let agent = common::tiny_agent("qwen3", "qwen3", 32, 4);
    let out_dir = tempfile::tempdir().unwrap();
    let (f32_dir, bf16_dir) = (out_dir.path().join("f32"), out_dir.path().join("bf16"));
    for (dir, dtype) in [(&f32_dir, "f32"), (&bf16_dir, "bf16")] {
        let args =
            ["convert", "--model", agent.path().to_str().unwrap(), "--out", dir.to_str().unwrap(), "--dtype", dtype];
        let out = hacpo(&args, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(safetensors_dtypes(&f32_dir.join("model.safetensors")).iter().all(|d| d == "F32"));
    let dtypes = safetensors_dtypes(&bf16_dir.join("model.safetensors"));
    assert!(!dtypes.is_empty() && dtypes.iter().all(|d| d == "BF16"), "{dtypes:?}");
    let size = |d: &Path| std::fs::metadata(d.join("model.safetensors")).unwrap().len() as f64;
    assert!((size(&bf16_dir) / size(&f32_dir) - 0.5).abs() < 0.01, "bf16 halves the file");

    // f32 round-trips exactly; bf16 is every weight rounded to 8 bits of mantissa, so the logits
    // move by about 2^-8 of their size and no more.
    let load = |d: &Path| hacpo::model::load::<Cpu>(d.to_str().unwrap(), &common::device()).unwrap();
    let (orig, same, half) = (load(agent.path()), load(&f32_dir), load(&bf16_dir));
    let ids = orig.tokenizer.encode("The answer is 42.", false).unwrap();
    let a = common::full_logits(&orig.model, &ids);
    assert_eq!(a, common::full_logits(&same.model, &ids));
    let b = common::full_logits(&half.model, &ids);
    let scale = a.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
    let worst = a.iter().flatten().zip(b.iter().flatten()).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst > 0.0, "bf16 changed nothing: the weights were not rounded");
    assert!(worst < 0.05 * scale, "bf16 logits differ by {worst} (scale {scale})");
}

/// A figure is only comparable with its CPU beside it: `hacpo bench` names the CPU
/// `/proc/cpuinfo` gives, and the cores.
#[test]
fn bench_names_the_machine_it_measured() {
    let dir = common::tiny_model_dir("qwen3-tiny");
    let args = ["bench", "--model", dir.path().to_str().unwrap(), "--reps", "1", "--no-train"];
    let small = ["--prefill-batch", "1", "--prefill-len", "4", "--decode-batch", "1", "--new-tokens", "1"];
    let out = hacpo(&[&args[..], &small, &["--format", "json"]].concat(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("machine: "), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench --format json prints JSON");
    let machine = &report["machine"];
    assert!(machine["cores"].as_u64().is_some_and(|n| n >= 1), "{machine}");
    assert!(machine["flags"].is_array(), "{machine}");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model_name = cpuinfo.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == "model name"));
    if let Some((_, name)) = model_name {
        assert_eq!(machine["cpu"], name.trim(), "{machine}");
    }
}
