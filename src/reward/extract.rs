//! Finding the final answer in a model's response.
//!
//! Strategies are tried in a configurable order and the first that finds something wins:
//! the last `\boxed{…}`/`\fbox{…}` (brace-matched; also `\boxed 5`), "final answer is …",
//! "Answer: …", GSM8K's `#### N`, the text after `</think>`, the last inline math `$…$`
//! (its right-hand side when it is an equation), and the last number (only for numeric
//! golds). When a response has a `</think>`, only the text after it is searched:
//! a reasoning trace is not an answer.

use serde::{Deserialize, Serialize};

use super::normalize::matching_brace;

/// One way to find an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    Boxed,
    FinalAnswerIs,
    AnswerColon,
    Gsm8kHashes,
    AfterThink,
    LastMath,
    LastNumber,
}

/// The default priority.
pub const DEFAULT_ORDER: [Strategy; 7] = [
    Strategy::Boxed,
    Strategy::FinalAnswerIs,
    Strategy::AnswerColon,
    Strategy::Gsm8kHashes,
    Strategy::AfterThink,
    Strategy::LastMath,
    Strategy::LastNumber,
];

/// Contents of every `\boxed{…}` / `\fbox{…}` in order (brace-matched; `\boxed 5` too).
/// Linear in the length of `text`.
pub fn boxes(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    // Next match of each pattern at or after `from`, recomputed only once passed, so many
    // boxes do not mean many scans of the whole text.
    let mut next = [None::<usize>; 2];
    let patterns = ["\\boxed", "\\fbox"];
    let locate = |p: &str, from: usize| text[from..].find(p).map(|k| from + k);
    for (i, p) in patterns.iter().enumerate() {
        next[i] = locate(p, 0);
    }
    while from < text.len() {
        for (i, p) in patterns.iter().enumerate() {
            if next[i].is_some_and(|k| k < from) {
                next[i] = locate(p, from);
            }
        }
        let Some((start, len)) = next.iter().zip(patterns).filter_map(|(k, p)| k.map(|k| (k, p.len()))).min() else {
            break;
        };
        let after = start + len;
        let rest = &text[after..];
        if rest.starts_with('{') {
            if let Some(end) = matching_brace(text, after) {
                out.push(text[after + 1..end - 1].trim().to_string());
                from = end;
                continue;
            }
            break;
        } else if let Some(r) = rest.strip_prefix(' ') {
            // `\boxed 5`: up to the end of the math or the next whitespace.
            let word: String = r.trim_start().chars().take_while(|c| !c.is_whitespace() && *c != '$').collect();
            if !word.is_empty() {
                out.push(word);
            }
        }
        from = after;
    }
    out
}

/// The last box, or `None`.
pub fn last_box(text: &str) -> Option<String> {
    boxes(text).pop()
}

fn after_phrase(text: &str, phrases: &[&str]) -> Option<String> {
    let lower = text.to_lowercase();
    let (pos, len) = phrases.iter().filter_map(|p| lower.rfind(p).map(|k| (k, p.len()))).max()?;
    // `to_lowercase` can change byte lengths only for non-ASCII text; fall back safely.
    let rest = text.get(pos + len..)?;
    let rest = rest.trim_start_matches([':', ' ', '\t']).trim_start();
    let rest = rest.strip_prefix("is").map(str::trim_start).unwrap_or(rest);
    let line = rest.lines().next()?.trim();
    // Up to the end of the sentence: a period followed by a space or the end of the line.
    let mut end = line.len();
    for (i, c) in line.char_indices() {
        if c == '.' && line[i + 1..].starts_with([' ', '\n']) {
            end = i;
            break;
        }
    }
    let mut answer = line[..end].trim().trim_end_matches('.').trim();
    // "… is 14/3, which is about 4.67": the clause after the answer is not part of it.
    for stop in [", which", " which ", ", since", " because ", ", as ", ", so ", ", i.e."] {
        if let Some(k) = answer.find(stop) {
            answer = answer[..k].trim();
        }
    }
    if let Some(b) = last_box(answer) {
        return Some(b);
    }
    (!answer.is_empty()).then(|| answer.to_string())
}

/// The last `$…$` (or `\(…\)`, `\[…\]`) of the text; for an equation, its last side.
fn last_math(text: &str) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for (open, close) in [("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
        let Some(end) = text.rfind(close) else { continue };
        let Some(start) = text[..end].rfind(open) else { continue };
        if best.as_ref().is_none_or(|(e, _)| end > *e) {
            best = Some((end, text[start + open.len()..end].to_string()));
        }
    }
    let (_, math) = best?;
    let math = math.trim();
    // Top-level "a = b = c": the last side.
    let mut depth = 0i32;
    let mut last_eq = None;
    for (i, c) in math.char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            '=' if depth == 0 => last_eq = Some(i),
            _ => {}
        }
    }
    let answer = match last_eq {
        Some(i) => math[i + 1..].trim(),
        None => math,
    };
    (!answer.is_empty()).then(|| answer.to_string())
}

fn gsm8k_hashes(text: &str) -> Option<String> {
    let pos = text.rfind("####")?;
    let line = text[pos + 4..].lines().next()?.trim();
    (!line.is_empty()).then(|| line.replace(',', ""))
}

fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = chars.len();
    while i > 0 {
        i -= 1;
        if chars[i].is_ascii_digit() {
            let end = i + 1;
            let mut start = i;
            while start > 0 && (chars[start - 1].is_ascii_digit() || chars[start - 1] == '.' || chars[start - 1] == ',')
            {
                start -= 1;
            }
            while start < end && !chars[start].is_ascii_digit() {
                start += 1;
            }
            if start > 0 && chars[start - 1] == '-' {
                start -= 1;
            }
            let n: String = chars[start..end].iter().filter(|c| **c != ',').collect();
            return Some(n);
        }
    }
    None
}

/// The answer found by `order`, searching after `</think>` when there is one.
pub fn extract(response: &str, order: &[Strategy], numeric_gold: bool) -> Option<String> {
    let region = match response.rfind("</think>") {
        Some(k) => &response[k + "</think>".len()..],
        None => response,
    };
    for s in order {
        let found = match s {
            Strategy::Boxed => last_box(region),
            Strategy::FinalAnswerIs => after_phrase(region, &["final answer is", "final answer:"]),
            Strategy::AnswerColon => after_phrase(region, &["answer:", "the answer is"]),
            Strategy::Gsm8kHashes => gsm8k_hashes(region),
            Strategy::AfterThink => {
                let tail = region.trim();
                (response.contains("</think>") && !tail.is_empty() && tail.len() <= 200).then(|| tail.to_string())
            }
            Strategy::LastMath => last_math(region),
            Strategy::LastNumber => {
                if numeric_gold {
                    last_number(region)
                } else {
                    None
                }
            }
        };
        if let Some(a) = found.filter(|a| !a.trim().is_empty()) {
            return Some(a);
        }
    }
    // A short response that is only an answer ("42", "\frac{1}{2}") is its own answer.
    let t = region.trim();
    (!t.is_empty() && t.len() <= 40 && !t.contains('\n')).then(|| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_with_nested_braces_and_spaces() {
        assert_eq!(last_box("so $\\boxed{\\frac{1}{2}}$."), Some("\\frac{1}{2}".into()));
        assert_eq!(boxes("\\boxed{1} and \\boxed{-2}"), vec!["1", "-2"]);
        assert_eq!(last_box("the answer is $\\boxed 5$"), Some("5".into()));
        assert_eq!(last_box("\\fbox{7}"), Some("7".into()));
        assert_eq!(last_box("\\boxed{unclosed"), None);
    }

    #[test]
    fn strategies_in_order() {
        let o = DEFAULT_ORDER;
        assert_eq!(extract("... so the final answer is 42. Done", &o, true), Some("42".into()));
        assert_eq!(extract("Reasoning.\nAnswer: $\\frac{3}{4}$", &o, false), Some("$\\frac{3}{4}$".into()));
        assert_eq!(extract("She makes 9 * 2 = 18.\n#### 1,018", &o, true), Some("1018".into()));
        assert_eq!(extract("<think>maybe \\boxed{3}</think> It is 4.", &o, true), Some("It is 4.".into()));
        assert_eq!(extract("I think it costs 12 dollars, maybe -3.5 in the end", &o, true), Some("-3.5".into()));
        assert_eq!(extract("I think it costs 12 dollars, in the end we get x", &o, false), None);
        assert_eq!(extract("\\frac{1}{2}", &o, false), Some("\\frac{1}{2}".into()));
        assert_eq!(extract("So we get $x = \\frac{14}{3}$.", &o, false), Some("\\frac{14}{3}".into()));
        assert_eq!(extract("The answer is 14/3, which is about 4.67.", &o, false), Some("14/3".into()));
    }
}
