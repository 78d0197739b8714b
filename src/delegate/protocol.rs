//! What a main agent or a sub-agent may write in one turn, and the reader of it.
//!
//! A turn is optional reasoning (free text, or inside `<think>…</think>`) followed by exactly
//! one action, and nothing but whitespace after it:
//!
//! ```text
//! <tool_call>{"name": "delegate", "arguments": {"task": "Who directed Alien?"}}</tool_call>
//! <result>Ridley Scott</result>
//! ```
//!
//! A tool call names one of the turn's tools and gives its single string argument; the
//! environment answers it in the next message inside `<tool_response>…</tool_response>`, a tag a
//! model never writes. Anything else is a format failure with a reason, never a panic: the
//! trajectory that contains it gets the format reward 0 (docs/algorithms.md §4.2).

use serde_json::Value;

/// A tool of the protocol: its name and its one string argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    pub name: &'static str,
    pub argument: &'static str,
}

/// The main agent's tool: hand a task to a sub-agent.
pub const DELEGATE: Tool = Tool { name: "delegate", argument: "task" };
/// The sub-agent's tools: BM25 search over the corpus, and a passage's full text.
pub const SEARCH: Tool = Tool { name: "search", argument: "query" };
pub const OPEN: Tool = Tool { name: "open", argument: "id" };

/// An opening and a closing tag.
type Tag = (&'static str, &'static str);

const THINK: Tag = ("<think>", "</think>");
const CALL: Tag = ("<tool_call>", "</tool_call>");
const RESULT: Tag = ("<result>", "</result>");
const RESPONSE: Tag = ("<tool_response>", "</tool_response>");

/// The longest argument or result a turn may carry, in characters: past it the model is
/// rambling, and the next prompt would grow without bound.
pub const MAX_ARGUMENT_CHARS: usize = 2_000;

/// What a well-formed turn does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Call `tool` with its argument.
    Call { tool: Tool, argument: String },
    /// End the trajectory with this result (the main agent's answer, a sub-agent's findings).
    Result(String),
}

/// Why a turn broke the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// No `<tool_call>` and no `<result>`.
    NoAction,
    /// More than one action in one turn.
    SeveralActions,
    /// An opened tag that is never closed, or a closing tag with no opening.
    Unbalanced(&'static str),
    /// Text after the action.
    TrailingText,
    /// The model wrote the environment's `<tool_response>`.
    EnvironmentTag,
    /// The call is not `{"name": …, "arguments": {…}}` JSON.
    BadCall(String),
    /// A tool this agent does not have.
    UnknownTool(String),
    /// The call lacks its argument, gives it as something else than a non-empty string, or adds
    /// others.
    BadArgument { tool: &'static str, reason: String },
    /// An empty result.
    EmptyResult,
    /// An argument or result longer than [`MAX_ARGUMENT_CHARS`].
    TooLong,
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::NoAction => write!(f, "no <tool_call> and no <result>"),
            FormatError::SeveralActions => write!(f, "more than one action in a turn"),
            FormatError::Unbalanced(tag) => write!(f, "{tag} is not balanced"),
            FormatError::TrailingText => write!(f, "text after the action"),
            FormatError::EnvironmentTag => write!(f, "the model wrote <tool_response>, the environment's tag"),
            FormatError::BadCall(e) => write!(f, "the tool call is not {{\"name\", \"arguments\"}} JSON: {e}"),
            FormatError::UnknownTool(name) => write!(f, "no tool named {name:?}"),
            FormatError::BadArgument { tool, reason } => write!(f, "{tool}: {reason}"),
            FormatError::EmptyResult => write!(f, "an empty <result>"),
            FormatError::TooLong => write!(f, "an argument or result over {MAX_ARGUMENT_CHARS} characters"),
        }
    }
}

/// Reads one turn of an agent that has `tools`.
pub fn parse_turn(text: &str, tools: &[Tool]) -> Result<Action, FormatError> {
    if text.contains(RESPONSE.0) || text.contains(RESPONSE.1) {
        return Err(FormatError::EnvironmentTag);
    }
    let rest = skip_reasoning(text)?;
    let (tag, body, after) = match (rest.find(CALL.0), rest.find(RESULT.0)) {
        (None, None) => {
            return Err(match [CALL.1, RESULT.1].iter().find(|t| rest.contains(*t)) {
                Some(t) => FormatError::Unbalanced(t),
                None => FormatError::NoAction,
            });
        }
        (Some(c), Some(r)) if c < r => enclosed(&rest[c..], CALL)?,
        (Some(c), None) => enclosed(&rest[c..], CALL)?,
        (_, Some(r)) => enclosed(&rest[r..], RESULT)?,
    };
    // Whatever reasoning came before the action must not carry protocol tags of its own.
    let before = &rest[..rest.find(tag.0).expect("found above")];
    if [CALL.1, RESULT.1, THINK.0, THINK.1].iter().any(|t| before.contains(t)) {
        return Err(FormatError::Unbalanced(tag.1));
    }
    if [CALL.0, RESULT.0].iter().any(|t| after.contains(t)) {
        return Err(FormatError::SeveralActions);
    }
    if !after.trim().is_empty() {
        return Err(FormatError::TrailingText);
    }
    if tag == RESULT {
        let result = body.trim();
        return match result.chars().count() {
            0 => Err(FormatError::EmptyResult),
            n if n > MAX_ARGUMENT_CHARS => Err(FormatError::TooLong),
            _ => Ok(Action::Result(result.to_string())),
        };
    }
    parse_call(body, tools)
}

/// The text after an optional leading `<think>…</think>` (whose content is free).
fn skip_reasoning(text: &str) -> Result<&str, FormatError> {
    let trimmed = text.trim_start();
    if !trimmed.starts_with(THINK.0) {
        return Ok(text);
    }
    match trimmed.find(THINK.1) {
        Some(end) => Ok(&trimmed[end + THINK.1.len()..]),
        None => Err(FormatError::Unbalanced(THINK.0)),
    }
}

/// The tag pair, the body between them, and the text after the closing tag of `text`, which
/// starts with the opening tag.
fn enclosed(text: &str, tag: Tag) -> Result<(Tag, &str, &str), FormatError> {
    let inner = &text[tag.0.len()..];
    let end = inner.find(tag.1).ok_or(FormatError::Unbalanced(tag.0))?;
    let body = &inner[..end];
    if body.contains(CALL.0) || body.contains(RESULT.0) {
        return Err(FormatError::SeveralActions);
    }
    Ok((tag, body, &inner[end + tag.1.len()..]))
}

fn parse_call(body: &str, tools: &[Tool]) -> Result<Action, FormatError> {
    let value: Value = serde_json::from_str(body.trim()).map_err(|e| FormatError::BadCall(e.to_string()))?;
    let Some(object) = value.as_object() else { return Err(FormatError::BadCall("not an object".into())) };
    if let Some(extra) = object.keys().find(|k| *k != "name" && *k != "arguments") {
        return Err(FormatError::BadCall(format!("unexpected key {extra:?}")));
    }
    let Some(name) = object.get("name").and_then(Value::as_str) else {
        return Err(FormatError::BadCall("no \"name\" string".into()));
    };
    let tool = *tools.iter().find(|t| t.name == name).ok_or_else(|| FormatError::UnknownTool(name.to_string()))?;
    let bad = |reason: String| FormatError::BadArgument { tool: tool.name, reason };
    let Some(arguments) = object.get("arguments").and_then(Value::as_object) else {
        return Err(bad("no \"arguments\" object".into()));
    };
    if let Some(extra) = arguments.keys().find(|k| *k != tool.argument) {
        return Err(bad(format!("unexpected argument {extra:?}; it takes only {:?}", tool.argument)));
    }
    let argument = match arguments.get(tool.argument) {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(Value::String(_)) => return Err(bad(format!("{:?} is empty", tool.argument))),
        Some(other) => return Err(bad(format!("{:?} must be a string, found {other}", tool.argument))),
        None => return Err(bad(format!("missing {:?}", tool.argument))),
    };
    if argument.chars().count() > MAX_ARGUMENT_CHARS {
        return Err(FormatError::TooLong);
    }
    Ok(Action::Call { tool, argument })
}

/// A tool's answer as the next message shows it.
pub fn tool_response(text: &str) -> String {
    format!("{}{text}{}", RESPONSE.0, RESPONSE.1)
}

/// The text inside a tool response (`None` for a message that is not one).
pub fn tool_response_text(content: &str) -> Option<&str> {
    content.strip_prefix(RESPONSE.0)?.strip_suffix(RESPONSE.1)
}

/// A well-formed call, as a demonstration or a test writes it.
pub fn tool_call(tool: Tool, argument: &str) -> String {
    let call = serde_json::json!({"name": tool.name, "arguments": {tool.argument: argument}});
    format!("{}{call}{}", CALL.0, CALL.1)
}

/// A well-formed result.
pub fn result(text: &str) -> String {
    format!("{}{text}{}", RESULT.0, RESULT.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: &[Tool] = &[DELEGATE];
    const SUB: &[Tool] = &[SEARCH, OPEN];

    #[test]
    fn well_formed_turns_are_read() {
        let call = |tool, arg: &str| Ok(Action::Call { tool, argument: arg.into() });
        assert_eq!(
            parse_turn(&tool_call(DELEGATE, "Who directed Alien?"), MAIN),
            call(DELEGATE, "Who directed Alien?")
        );
        assert_eq!(
            parse_turn(
                "<think>two hops</think>\n<tool_call> {\"name\":\"search\",\"arguments\":{\"query\":\"Alien 1979\"}} </tool_call>\n",
                SUB
            ),
            call(SEARCH, "Alien 1979")
        );
        assert_eq!(
            parse_turn(
                "I need the passage.\n<tool_call>{\"name\":\"open\",\"arguments\":{\"id\":\"p12\"}}</tool_call>",
                SUB
            ),
            call(OPEN, "p12")
        );
        assert_eq!(parse_turn("<result> Ridley Scott </result>", MAIN), Ok(Action::Result("Ridley Scott".into())));
        assert_eq!(parse_turn(&result("ünïcode ✓"), SUB), Ok(Action::Result("ünïcode ✓".into())));
    }

    #[test]
    fn hostile_turns_are_format_failures_with_a_reason() {
        use FormatError::*;
        let long = "x".repeat(MAX_ARGUMENT_CHARS + 1);
        let cases: Vec<(String, &[Tool], FormatError)> = vec![
            ("".into(), MAIN, NoAction),
            ("just an answer".into(), MAIN, NoAction),
            ("<result>a".into(), MAIN, Unbalanced("<result>")),
            ("a</result>".into(), MAIN, Unbalanced("</result>")),
            ("<think>never closed <result>a</result>".into(), MAIN, Unbalanced("<think>")),
            ("<result>a</result><result>b</result>".into(), MAIN, SeveralActions),
            (format!("{}{}", tool_call(DELEGATE, "t"), result("a")), MAIN, SeveralActions),
            ("<result>a <tool_call>{}</tool_call></result>".into(), MAIN, SeveralActions),
            ("<result>a</result> and more".into(), MAIN, TrailingText),
            ("<tool_response>fake</tool_response><result>a</result>".into(), MAIN, EnvironmentTag),
            ("<result></result>".into(), MAIN, EmptyResult),
            ("<result>  \n </result>".into(), MAIN, EmptyResult),
            (result(&long), MAIN, TooLong),
            (tool_call(DELEGATE, &long), MAIN, TooLong),
            (tool_call(SEARCH, "q"), MAIN, UnknownTool("search".into())),
            (tool_call(DELEGATE, "t"), SUB, UnknownTool("delegate".into())),
            ("<tool_call>[1, 2]</tool_call>".into(), MAIN, BadCall("not an object".into())),
            ("<tool_call>{\"arguments\": {}}</tool_call>".into(), MAIN, BadCall("no \"name\" string".into())),
            (
                "<tool_call>{\"name\": \"delegate\", \"arguments\": {\"task\": \"t\"}, \"id\": 1}</tool_call>".into(),
                MAIN,
                BadCall("unexpected key \"id\"".into()),
            ),
            (
                "<tool_call>{\"name\": \"delegate\"}</tool_call>".into(),
                MAIN,
                BadArgument { tool: "delegate", reason: "no \"arguments\" object".into() },
            ),
            (
                "<tool_call>{\"name\": \"delegate\", \"arguments\": {}}</tool_call>".into(),
                MAIN,
                BadArgument { tool: "delegate", reason: "missing \"task\"".into() },
            ),
            (
                "<tool_call>{\"name\": \"delegate\", \"arguments\": {\"task\": 3}}</tool_call>".into(),
                MAIN,
                BadArgument { tool: "delegate", reason: "\"task\" must be a string, found 3".into() },
            ),
            (
                "<tool_call>{\"name\": \"delegate\", \"arguments\": {\"task\": \" \"}}</tool_call>".into(),
                MAIN,
                BadArgument { tool: "delegate", reason: "\"task\" is empty".into() },
            ),
            (
                "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"q\", \"k\": 5}}</tool_call>".into(),
                SUB,
                BadArgument { tool: "search", reason: "unexpected argument \"k\"; it takes only \"query\"".into() },
            ),
        ];
        for (text, tools, want) in cases {
            assert_eq!(parse_turn(&text, tools), Err(want), "{text:?}");
        }
        // Truncated JSON, control bytes, a lone tag: errors, never a panic.
        for text in [
            "<tool_call>{\"name\": \"del",
            "<tool_call>\u{0}\u{7f}</tool_call>",
            "<tool_call>",
            "</tool_call>",
            "<think>",
            "<",
            "\u{feff}<result>x</result>",
        ] {
            let _ = parse_turn(text, MAIN);
        }
        assert!(matches!(parse_turn("<tool_call>{\"name\": \"del</tool_call>", MAIN), Err(BadCall(_))));
    }

    #[test]
    fn any_byte_soup_is_read_without_panicking() {
        use rand::{Rng, SeedableRng};
        let pieces = [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<result>",
            "</result>",
            "{",
            "}",
            "\"",
            "name",
            ":",
            "delegate",
            " ",
            "é",
            "\n",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for _ in 0..5000 {
            let n = rng.random_range(0..12);
            let text: String = (0..n).map(|_| pieces[rng.random_range(0..pieces.len())]).collect();
            if let Ok(Action::Result(r)) = parse_turn(&text, MAIN) {
                assert!(!r.is_empty() && !r.contains("<result>"), "{text:?}");
            }
        }
    }
}
