//! LoRA adapters in PEFT's layout: adapters written by `peft` itself (fixtures from
//! `scripts/make_lora_fixture.py`) load onto the tiny fixture models and give peft's logits,
//! unmerged and merged; and the directory loads as a model by itself.

mod common;

use common::{device, fixture, full_logits, max_abs_diff, reference};
use hacpo::backend::Cpu;
use hacpo::model::lora;
use hacpo::model::safetensors_io::SafetensorsSource;
use hacpo::model::weights::WeightSource;
use hacpo::model::{CausalLm, load_model_dir};

const TOLERANCE: f32 = 1e-4;

/// (adapter fixture, base fixture)
const ADAPTERS: [(&str, &str); 2] = [("qwen3-lora", "qwen3-tiny"), ("llama-rslora", "llama31-tiny")];

fn peft_logits(adapter: &str) -> Vec<f32> {
    let path = fixture(&format!("lora/{adapter}/reference.safetensors"));
    SafetensorsSource::open_file(&path).unwrap().take("logits_a").unwrap().unwrap().data
}

fn base(name: &str) -> CausalLm<Cpu> {
    load_model_dir(&fixture(&format!("models/{name}")), &device()).unwrap()
}

#[test]
fn peft_adapters_give_peft_logits_unmerged_and_merged() {
    for (adapter, base_name) in ADAPTERS {
        let dir = fixture(&format!("lora/{adapter}"));
        let prompt = reference(base_name).prompt_a;
        let expected = peft_logits(adapter);
        let plain = full_logits(&base(base_name), &prompt).concat();
        assert!(max_abs_diff(&plain, &expected) > 1e-2, "{adapter}: the fixture's adapter changes the logits");

        let adapted = lora::load_adapter(base(base_name), &dir).unwrap();
        assert!(lora::has_adapters(&adapted));
        let diff = max_abs_diff(&full_logits(&adapted, &prompt).concat(), &expected);
        assert!(diff < TOLERANCE, "{adapter}: adapter forward differs from peft by {diff}");

        let merged = lora::merge(adapted);
        let diff = max_abs_diff(&full_logits(&merged, &prompt).concat(), &expected);
        assert!(diff < TOLERANCE, "{adapter}: merged weights differ from peft by {diff}");
    }
}

#[test]
fn rslora_scaling_is_read_from_the_config() {
    let info = lora::read_adapter_info(&fixture("lora/llama-rslora")).unwrap();
    assert_eq!(info.rank, 2);
    assert!((info.scale - 4.0 / 2f64.sqrt()).abs() < 1e-12, "α/√r with use_rslora: {}", info.scale);
    assert_eq!(info.base, "../../models/llama31-tiny");
    let info = lora::read_adapter_info(&fixture("lora/qwen3-lora")).unwrap();
    assert_eq!((info.rank, info.scale), (4, 2.0));
}

/// What hacpo cannot apply is refused with the key named, never applied wrongly.
#[test]
fn unsupported_adapters_are_refused_with_the_reason() {
    let src = fixture("lora/qwen3-lora");
    for (key, value, needle) in [
        ("use_dora", serde_json::json!(true), "use_dora"),
        ("rank_pattern", serde_json::json!({"q_proj": 8}), "rank_pattern"),
        ("peft_type", serde_json::json!("IA3"), "only LORA"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let path = dir.path().join("adapter_config.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v[key] = value;
        std::fs::write(&path, v.to_string()).unwrap();
        let e = lora::load_adapter(base("qwen3-tiny"), dir.path()).unwrap_err();
        assert!(e.to_string().contains(needle), "{key}: {e}");
        assert_eq!(e.exit_code(), 2, "{key}: a user error");
    }
    // An adapter for another model: the shapes do not fit.
    let e = lora::load_adapter(base("llama31-tiny"), &src).unwrap_err().to_string();
    assert!(e.contains("shape"), "{e}");
}
