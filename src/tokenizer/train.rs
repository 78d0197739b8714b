//! Training small tokenizers on a task's own text, for the embedded tiny agents.
//!
//! Both kinds are byte-level BPE pipelines (the GPT-2 / Llama-3 / Qwen byte mapping), so any
//! text one agent writes can be encoded by the other: **char** keeps only the 256 byte symbols
//! (one token per character of ASCII text); **bpe** adds merges up to a vocabulary size, so
//! numbers and words become multi-character tokens. Two agents with the two kinds split the
//! same response differently, which makes cross-agent retokenisation real.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, TokenizerBuilder,
};

use super::Tokenizer;
use crate::error::{Error, Result};

/// Which tokenizer to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// The 256 byte symbols, no merges.
    Char,
    /// Byte-level BPE with merges up to `vocab_size`.
    Bpe,
}

/// Chat formats for the tiny agents, each with its own special tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatFormat {
    /// Qwen's ChatML: `<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n`.
    Chatml,
    /// Llama 3's headers: `<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n…<|eot_id|>`.
    Llama3,
}

impl ChatFormat {
    /// Special tokens; the first is the end of an assistant turn.
    pub fn special_tokens(self) -> &'static [&'static str] {
        match self {
            ChatFormat::Chatml => &["<|im_end|>", "<|im_start|>", "<|endoftext|>"],
            ChatFormat::Llama3 => &["<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"],
        }
    }

    fn template(self) -> &'static str {
        match self {
            ChatFormat::Chatml => {
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                 {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
            }
            ChatFormat::Llama3 => {
                "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n\
                 {{ m.content }}<|eot_id|>{% endfor %}\
                 {% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
            }
        }
    }
}

/// Trains a tokenizer on `texts` and attaches the chat format's template and special tokens.
pub fn train(kind: TokenizerKind, vocab_size: usize, format: ChatFormat, texts: &[String]) -> Result<Tokenizer> {
    let specials = format.special_tokens();
    let alphabet = ByteLevel::alphabet();
    let alphabet_len = alphabet.len();
    let target = match kind {
        TokenizerKind::Char => alphabet_len + specials.len(),
        TokenizerKind::Bpe => vocab_size.max(alphabet_len + specials.len()),
    };
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(target)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(alphabet.into_iter().collect())
        .special_tokens(specials.iter().map(|s| AddedToken::from(s.to_string(), true)).collect())
        .build()
        .into();
    let fail = |e: tokenizers::Error| Error::Tokenizer(format!("training a {kind:?} tokenizer: {e}"));
    let mut pipeline = TokenizerBuilder::<
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default().into())
    .with_pre_tokenizer(Some(ByteLevel::new(false, true, true).into()))
    .with_decoder(Some(ByteLevel::default().into()))
    .build()
    .map_err(fail)?;
    pipeline.train(&mut trainer, texts.iter()).map_err(fail)?;
    let inner: tokenizers::Tokenizer = pipeline.into();
    let mut special = Map::new();
    special.insert("eos_token".into(), Value::String(specials[0].into()));
    special.insert("pad_token".into(), json!(specials[0]));
    Tokenizer::from_parts(inner, Some(format.template()), special)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Message;

    fn corpus() -> Vec<String> {
        (0..300)
            .map(|i| format!("Ann has {i} apples. {i} + 12 = {}. The answer is \\boxed{{{}}}.", i + 12, i + 12))
            .collect()
    }

    #[test]
    fn char_and_bpe_round_trip_and_split_differently() {
        let texts = corpus();
        let char_tok = train(TokenizerKind::Char, 0, ChatFormat::Llama3, &texts).unwrap();
        let bpe = train(TokenizerKind::Bpe, 400, ChatFormat::Chatml, &texts).unwrap();
        assert_eq!(char_tok.vocab_size(), 256 + 4);
        assert!(bpe.vocab_size() > 300 && bpe.vocab_size() <= 400, "{}", bpe.vocab_size());
        let s = "Ben has 17 marbles. 17 * 3 = 51. The answer is \\boxed{51}. ü€";
        let (a, b) = (char_tok.encode(s, false).unwrap(), bpe.encode(s, false).unwrap());
        assert_eq!(a.len(), s.len(), "one token per byte");
        assert!(b.len() * 3 < a.len() * 2, "merges shorten the text: {} vs {}", b.len(), a.len());
        assert_eq!(char_tok.decode(&a, true).unwrap(), s);
        assert_eq!(bpe.decode(&b, true).unwrap(), s);

        let msgs = [Message::user("What is 2 + 2?")];
        let chatml = bpe.apply_chat_template(&msgs, true, &Default::default()).unwrap();
        assert_eq!(chatml, "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n");
        let ids = bpe.encode_chat(&msgs, true).unwrap();
        assert_eq!(ids.iter().filter(|&&i| Some(i) == bpe.token_to_id("<|im_start|>")).count(), 2);
        let llama = char_tok.apply_chat_template(&msgs, true, &Default::default()).unwrap();
        assert!(
            llama.starts_with("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|>")
        );
    }
}
