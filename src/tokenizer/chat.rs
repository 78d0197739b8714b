//! Chat prompts rendered from the model's own Jinja chat template.
//!
//! Mirrors transformers' `apply_chat_template`: a sandboxed Jinja environment with
//! `trim_blocks` and `lstrip_blocks`, the `raise_exception` and `strftime_now` globals,
//! a `tojson` that writes like Python's `json.dumps` (no HTML escaping, `", "`/`": "`
//! separators), Python string methods (`strip`, `startswith`, `split`, …) and the special
//! tokens (`bos_token`, `eos_token`, …) in the context. The rendered string is tokenized
//! without adding special tokens again, as transformers does.

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value, syntax::SyntaxConfig};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("len", &self.source.len()).finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        ChatTemplate::new(&self.source).expect("template compiled once already")
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported with its line.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters are valid"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| chrono::Local::now().format(&fmt).to_string());
        env.add_filter("tojson", python_tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::ChatTemplate(clipped(&format!("the template does not compile: {e:#}"))))?;
        Ok(ChatTemplate { env, source: source.to_string() })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`. `context` holds the special tokens and any extra template
    /// variables (`enable_thinking`, `date_string`, `tools`, …) as a JSON object.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        context: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx = context.clone();
        ctx.insert("messages".into(), serde_json::to_value(messages).expect("messages serialise"));
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        let tmpl = self.env.get_template("chat").expect("template was added");
        tmpl.render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| Error::ChatTemplate(clipped(&format!("rendering failed: {e:#}"))))
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// sort_keys=False)`.
fn python_tojson(value: Value, indent: Option<usize>) -> std::result::Result<Value, JinjaError> {
    let v: serde_json::Value = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&v, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(k).expect("string"));
                out.push_str(": ");
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        J::Number(n) if n.is_f64() => {
            // Python writes floats with a fractional part: 1.0, not 1.
            let f = n.as_f64().expect("f64");
            if f.fract() == 0.0 && f.is_finite() && f.abs() < 1e16 {
                out.push_str(&format!("{f:.1}"));
            } else {
                out.push_str(&n.to_string());
            }
        }
        other => out.push_str(&serde_json::to_string(other).expect("json")),
    }
}

/// A template error with each line cut to a screen's width: minijinja quotes the template's
/// line, which in a damaged or hostile file can be megabytes long.
fn clipped(message: &str) -> String {
    const WIDTH: usize = 160;
    message
        .lines()
        .map(|l| match l.char_indices().nth(WIDTH) {
            Some((at, _)) => format!("{}…", &l[..at]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_matches_python_json_dumps() {
        let v = Value::from(minijinja::value::Serde(serde_json::json!({"a": [1, 2.0, "é<"], "b": {}})));
        assert_eq!(python_tojson(v.clone(), None).unwrap().to_string(), r#"{"a": [1, 2.0, "é<"], "b": {}}"#);
        assert_eq!(
            python_tojson(v, Some(2)).unwrap().to_string(),
            "{\n  \"a\": [\n    1,\n    2.0,\n    \"é<\"\n  ],\n  \"b\": {}\n}"
        );
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('only user and assistant roles') }}").unwrap();
        let e = t.render(&[], false, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("only user and assistant roles"), "{e}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let e = ChatTemplate::new("{% for m in messages %}").unwrap_err().to_string();
        assert!(e.contains("does not compile"), "{e}");
    }
}
