//! An agent's multi-turn conversation kept as one token sequence: the prompt, then each turn's
//! generated ids (trained) and what the environment wrote before the next turn (a tool's
//! response and the chat template's turn markers: masked out of the loss). Every turn is
//! generated from exactly the ids the trainer later scores, so the sampled and the trained
//! sequence are the same tokens (verl's multi-turn `response_mask`, slime's `loss_mask`).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::tokenizer::{Message, Tokenizer};

/// How an agent's text becomes tokens: its tokenizer, chat-template variables and EOS ids.
#[derive(Clone, Copy)]
pub struct Speech<'a> {
    pub tokenizer: &'a Tokenizer,
    pub chat_kwargs: &'a Map<String, Value>,
    pub eos_token_ids: &'a [u32],
}

impl Speech<'_> {
    fn render(&self, messages: &[Message], generation_prompt: bool) -> Result<String> {
        self.tokenizer.apply_chat_template(messages, generation_prompt, self.chat_kwargs)
    }
}

/// Where a conversation stands.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum State {
    /// Waiting for the agent's next turn.
    Open,
    /// Ended with the agent's result.
    Done(String),
    /// Ended without one (a format failure, a limit reached), and why.
    Failed(String),
}

/// One agent's conversation.
#[derive(Clone, Debug)]
pub struct Conversation {
    /// The messages so far (the prompt's, then the agent's turns and the tool responses).
    pub messages: Vec<Message>,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    /// Per response id: the agent's own (true) or the environment's (false).
    pub loss_mask: Vec<bool>,
    /// The agent's turns so far.
    pub turns: usize,
    pub state: State,
}

impl Conversation {
    /// A conversation that starts with `messages` (rendered with the generation prompt).
    pub fn start(speech: Speech<'_>, messages: Vec<Message>) -> Result<Self> {
        let prompt_ids = match speech.tokenizer.chat_template() {
            Some(_) => speech.tokenizer.encode(&speech.render(&messages, true)?, false)?,
            None => {
                let text: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
                speech.tokenizer.encode(&(text.join("\n") + "\n"), true)?
            }
        };
        Ok(Conversation { messages, prompt_ids, response_ids: vec![], loss_mask: vec![], turns: 0, state: State::Open })
    }

    /// A conversation held by another process, known here only by how it ended (a team split
    /// between processes: what this side's rewards and metrics read of the other's).
    pub fn ended_elsewhere(state: State) -> Self {
        Conversation { messages: vec![], prompt_ids: vec![], response_ids: vec![], loss_mask: vec![], turns: 0, state }
    }

    /// The ids the next turn is generated from.
    pub fn sequence(&self) -> Vec<u32> {
        let mut ids = self.prompt_ids.clone();
        ids.extend(&self.response_ids);
        ids
    }

    /// Every token so far.
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.response_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_open(&self) -> bool {
        self.state == State::Open
    }

    /// Appends the agent's turn: its generated ids (with the EOS it ended on, if any) and their
    /// text (decoded without special tokens).
    pub fn push_turn(&mut self, ids: &[u32], text: &str) {
        self.response_ids.extend(ids);
        self.loss_mask.extend(std::iter::repeat_n(true, ids.len()));
        self.messages.push(Message::assistant(text.trim()));
        self.turns += 1;
    }

    /// The ids of the environment's reply `content` (a user message) after the agent's last
    /// turn, ready for the next: the chat template's end of the agent's turn (unless the EOS
    /// it ended on already was), the reply, and the next turn's header.
    pub fn reply_ids(&self, speech: Speech<'_>, content: &str) -> Result<Vec<u32>> {
        speech.tokenizer.encode(&self.reply_text(speech, content)?, false)
    }

    /// Appends a reply (its `ids` from [`Conversation::reply_ids`]), out of the loss.
    pub fn push_reply(&mut self, ids: Vec<u32>, content: String) {
        self.loss_mask.extend(std::iter::repeat_n(false, ids.len()));
        self.response_ids.extend(ids);
        self.messages.push(Message::user(content));
    }

    /// The text between the agent's last turn and its next: what the template renders after
    /// the turn's content when the reply follows. The content is stood in for by a marker, so
    /// the tail is found whatever the template does to the turn's text (Qwen3 rewrites an
    /// earlier turn's reasoning block); the tokens already generated stay as they were.
    fn reply_text(&self, speech: Speech<'_>, content: &str) -> Result<String> {
        if speech.tokenizer.chat_template().is_none() {
            return Ok(format!("\n{content}\n"));
        }
        const MARKER: &str = "\u{E000}hacpo-turn\u{E000}";
        let mut with_reply = self.messages.clone();
        if let Some(last) = with_reply.last_mut() {
            last.content = MARKER.into();
        }
        with_reply.push(Message::user(content));
        let after = speech.render(&with_reply, true)?;
        let Some(at) = after.rfind(MARKER) else {
            return Err(Error::ChatTemplate(
                "the chat template does not render an agent's turn before the reply that follows it, so a \
                 multi-turn trajectory cannot be kept as one token sequence"
                    .into(),
            ));
        };
        let tail = &after[at + MARKER.len()..];
        // The EOS the turn ended on already closed it: the template's copy is not repeated.
        let eos_text = match self.response_ids.last() {
            Some(&t) if speech.eos_token_ids.contains(&t) => speech.tokenizer.decode(&[t], false)?,
            _ => String::new(),
        };
        Ok(match tail.strip_prefix(eos_text.as_str()) {
            Some(rest) if !eos_text.is_empty() => rest.to_string(),
            _ => tail.to_string(),
        })
    }

    /// Ends the conversation.
    pub fn end(&mut self, state: State) {
        self.state = state;
    }
}
