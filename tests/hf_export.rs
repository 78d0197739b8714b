//! The reverse direction of HF compatibility: transformers loads what hacpo writes. The
//! fixture (`scripts/make_hf_export_fixture.py`, transformers 5.23) loaded the shipped tiny
//! agents, directories hacpo's `save_pretrained` wrote (Qwen3 + byte-level BPE + ChatML; Llama +
//! characters + Llama-3 headers), and recorded transformers' chat prompt ids, greedy
//! continuation and last-position log-softmax. hacpo must agree on all three, and writing the
//! loaded agents again must give the same bytes, so what transformers read is what hacpo writes.

mod common;

use std::path::Path;

use hacpo::backend::Cpu;
use hacpo::model::{SaveDtype, save_pretrained};
use hacpo::tokenizer::Message;
use serde_json::Value;

#[test]
fn transformers_reads_hacpo_written_agents_as_hacpo_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(common::fixture("hf_export.json")).unwrap()).unwrap();
    let question = fixture["question"].as_str().unwrap();
    let agents = fixture["agents"].as_object().unwrap();
    assert_eq!(agents.len(), 2);
    for (name, want) in agents {
        let dir = root.join("models/tiny/pretrained").join(name);
        assert!(dir.is_dir(), "{} is gone: re-run scripts/make_hf_export_fixture.py", dir.display());
        let agent = hacpo::model::load::<Cpu>(dir.to_str().unwrap(), &common::device()).unwrap();

        // The chat prompt: hacpo's tokenizer and template against transformers'.
        let ids = agent.tokenizer.encode_chat(&[Message::user(question)], true).unwrap();
        let want_ids: Vec<u32> =
            want["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, want_ids, "{name}: prompt ids");

        // The next-token distribution.
        let logits = common::full_logits(&agent.model, &ids);
        let last = logits.last().unwrap();
        let max = last.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
        let lse = max + last.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
        let want_lsm: Vec<f64> =
            want["last_log_softmax"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(last.len(), want_lsm.len(), "{name}: vocabulary");
        let worst = last.iter().zip(&want_lsm).map(|(x, w)| ((x - lse) as f64 - w).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "{name}: log-softmax differs by {worst}");

        // Greedy decoding, as many tokens as transformers generated.
        let n = want["greedy_ids"].as_array().unwrap().len();
        let text =
            hacpo::generate::greedy_responses(&agent.model, &agent.tokenizer, &agent.eos_token_ids, &[ids], n, 1)
                .unwrap()
                .remove(0);
        assert_eq!(text, want["greedy_text"].as_str().unwrap(), "{name}: greedy continuation");

        // Writing the agent again gives the bytes transformers read.
        let out = tempfile::tempdir().unwrap();
        save_pretrained(&agent.model, &agent.tokenizer, &agent.eos_token_ids, out.path(), SaveDtype::F32).unwrap();
        for f in
            ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
        {
            let (a, b) = (std::fs::read(dir.join(f)).unwrap(), std::fs::read(out.path().join(f)).unwrap());
            assert!(a == b, "{name}/{f}: hacpo now writes different bytes; re-run scripts/make_hf_export_fixture.py");
        }
    }
}
