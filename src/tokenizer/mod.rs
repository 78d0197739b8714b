//! Tokenizers and chat templates.
//!
//! A [`Tokenizer`] is Hugging Face's `tokenizers` pipeline (read from `tokenizer.json`, or
//! built from a GGUF vocabulary) plus what `tokenizer_config.json` adds: the chat template,
//! the special-token strings the template refers to, and the end-of-sequence ids generation
//! stops on. Plain prompts are encoded with special tokens (Llama's BOS), chat prompts without,
//! because the template already writes them.

mod chat;
pub mod gguf_vocab;
pub mod train;

use std::path::Path;

use serde_json::{Map, Value, json};

pub use chat::{ChatTemplate, Message};

use crate::error::{Error, Result, write_atomic};

/// Special-token fields of `tokenizer_config.json` that templates may refer to.
const SPECIAL_TOKEN_KEYS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// A tokenizer with its chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<ChatTemplate>,
    /// `bos_token`, `eos_token`, … as strings, passed to the chat template.
    special_tokens: Map<String, Value>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from `dir`, plus `tokenizer_config.json` and `chat_template.jinja`
    /// when present.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::NotFound {
                what: "tokenizer.json".into(),
                path,
                hint: "Copy the model's tokenizer.json (and tokenizer_config.json for its chat \
                       template) into the model directory."
                    .into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("cannot read {}: {e}", path.display())))?;

        let config_path = dir.join("tokenizer_config.json");
        let config: Map<String, Value> = if config_path.exists() {
            let text = crate::error::read_to_string(&config_path)?;
            serde_json::from_str(&text)
                .map_err(|e| Error::config(config_path.display().to_string(), format!("not valid JSON: {e}")))?
        } else {
            Map::new()
        };

        let template_file = dir.join("chat_template.jinja");
        let template_source = if template_file.exists() {
            Some(crate::error::read_to_string(&template_file)?)
        } else {
            template_from_config(&config)
        };
        let chat_template = template_source.as_deref().map(ChatTemplate::new).transpose()?;

        let mut special_tokens = Map::new();
        for key in SPECIAL_TOKEN_KEYS {
            if let Some(s) = config.get(key).and_then(token_string) {
                special_tokens.insert(key.into(), s.into());
            }
        }
        Ok(Tokenizer { inner, chat_template, special_tokens })
    }

    /// Wraps an already built `tokenizers` pipeline.
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        chat_template: Option<&str>,
        special_tokens: Map<String, Value>,
    ) -> Result<Self> {
        let chat_template = chat_template.map(ChatTemplate::new).transpose()?;
        Ok(Tokenizer { inner, chat_template, special_tokens })
    }

    /// Number of tokens including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replaces the chat template (e.g. the zoo's template for a base model without one).
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        self.chat_template = Some(ChatTemplate::new(source)?);
        Ok(())
    }

    /// The special-token string for `key` (`"eos_token"`, …), if configured.
    pub fn special_token(&self, key: &str) -> Option<&str> {
        self.special_tokens.get(key).and_then(Value::as_str)
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encodes `text`; `add_special_tokens` applies the post-processor (Llama's BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Tokenizer(format!("cannot encode text: {e}")))
    }

    /// Decodes `ids` to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(format!("cannot decode ids: {e}")))
    }

    /// Renders `messages` with the chat template.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra_context: &Map<String, Value>,
    ) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            Error::ChatTemplate(
                "this tokenizer has no chat template; drop --chat to use the prompt as plain text, \
                 or use an instruct model"
                    .into(),
            )
        })?;
        let mut ctx = self.special_tokens.clone();
        for (k, v) in extra_context {
            ctx.insert(k.clone(), v.clone());
        }
        template.render(messages, add_generation_prompt, &ctx)
    }

    /// Renders and encodes a chat prompt (no special tokens added: the template writes them).
    pub fn encode_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, add_generation_prompt, &Map::new())?;
        self.encode(&text, false)
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` (with the chat template) to `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let json =
            self.inner.to_string(true).map_err(|e| Error::Tokenizer(format!("cannot serialise tokenizer: {e}")))?;
        write_atomic(&dir.join("tokenizer.json"), json.as_bytes())?;
        let mut config = self.special_tokens.clone();
        if let Some(t) = &self.chat_template {
            config.insert("chat_template".into(), t.source().into());
        }
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        write_atomic(
            &dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&Value::Object(config)).expect("json").as_bytes(),
        )
    }
}

/// `chat_template` in `tokenizer_config.json` is a string, or a list of named templates of
/// which "default" is the chat one.
fn template_from_config(config: &Map<String, Value>) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(String::from),
        _ => None,
    }
}

/// A special token written as `"<s>"` or as an AddedToken object `{"content": "<s>", …}`.
fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}
