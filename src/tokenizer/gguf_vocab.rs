//! A `tokenizers` pipeline rebuilt from the vocabulary embedded in a GGUF file.
//!
//! GGUF stores a byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`) as tokens,
//! merges and token types, and names the pre-tokenizer (`tokenizer.ggml.pre`) instead of
//! storing it. We map each known name to the exact `tokenizer.json` pipeline of the original
//! Hugging Face tokenizer (the same table llama.cpp keeps), and fail clearly on names we do not
//! know rather than tokenizing subtly differently.

use serde_json::{Value, json};

use crate::error::{Error, Result};

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The tokenizer fields of a GGUF file.
#[derive(Clone, Debug, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`
    pub model: String,
    /// `tokenizer.ggml.pre`
    pub pre: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub add_bos_token: bool,
}

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": use_regex})
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

impl GgufVocab {
    /// Builds the `tokenizers` pipeline; `source` names the file in errors.
    pub fn to_tokenizer(&self, source: &str) -> Result<tokenizers::Tokenizer> {
        let err = |m: String| Error::Tokenizer(format!("{source}: {m}"));
        if self.model != "gpt2" {
            return Err(err(format!(
                "tokenizer model {:?} is not supported for GGUF import (only byte-level BPE, \"gpt2\"); \
                 use the model's Hugging Face directory with tokenizer.json instead",
                self.model
            )));
        }
        // (normalizer, pre-tokenizer, ignore_merges) of the original tokenizer.json.
        let (normalizer, pre_tokenizer, ignore_merges) = match self.pre.as_str() {
            "default" | "gpt2" | "" => (Value::Null, byte_level(true), false),
            "llama-bpe" | "llama3" => (
                Value::Null,
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
                true,
            ),
            "qwen2" => (
                json!({"type": "NFC"}),
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}),
                false,
            ),
            "smollm" | "starcoder" | "refact" | "codeshell" => (
                Value::Null,
                json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
                false,
            ),
            other => {
                return Err(err(format!(
                    "pre-tokenizer {other:?} is not supported for GGUF import (supported: gpt2, \
                     llama-bpe, qwen2, smollm); use the model's Hugging Face directory instead"
                )));
            }
        };
        if self.token_types.len() != self.tokens.len() && !self.token_types.is_empty() {
            return Err(err("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length".into()));
        }

        let vocab: serde_json::Map<String, Value> =
            self.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
        let added: Vec<Value> = self
            .token_types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == TOKEN_TYPE_CONTROL || **t == TOKEN_TYPE_USER_DEFINED)
            .map(|(i, t)| {
                json!({"id": i, "content": self.tokens[i], "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": *t != TOKEN_TYPE_CONTROL,
                       "special": *t == TOKEN_TYPE_CONTROL})
            })
            .collect();

        let post_processor = match (self.add_bos_token, self.bos_token_id) {
            (true, Some(bos)) => {
                let tok = self.tokens.get(bos as usize).ok_or_else(|| err(format!("bos id {bos} out of range")))?;
                json!({"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                {"SpecialToken": {"id": tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {tok.as_str(): {"id": tok, "ids": [bos], "tokens": [tok]}}})
            }
            _ => byte_level(false),
        };

        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": byte_level(true),
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": self.merges},
        });
        spec.to_string()
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| err(format!("cannot build tokenizer from GGUF vocabulary: {e}")))
    }
}
