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
    box_spans(text).into_iter().map(|b| b.content).collect()
}

/// A box: where it starts and ends in the text, and what it holds.
struct BoxSpan {
    start: usize,
    end: usize,
    content: String,
}

fn box_spans(text: &str) -> Vec<BoxSpan> {
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
                out.push(BoxSpan { start, end, content: text[after + 1..end - 1].trim().to_string() });
                from = end;
                continue;
            }
            break;
        } else if let Some(r) = rest.strip_prefix(' ') {
            // `\boxed 5`: up to the end of the math or the next whitespace.
            let lead = r.len() - r.trim_start().len();
            let word: String = r.trim_start().chars().take_while(|c| !c.is_whitespace() && *c != '$').collect();
            if !word.is_empty() {
                out.push(BoxSpan { start, end: after + 1 + lead + word.len(), content: word });
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

/// The last box together with the boxes just before it that only connectors separate
/// (`\boxed{1} and \boxed{-2}`, `x = \boxed{3}, \quad \boxed{4}`), joined by commas: one
/// answer. So a hedge (`\boxed{4} or \boxed{3}`) is the answer "4, 3", not the last box alone.
pub fn last_box_group(text: &str) -> Option<String> {
    let members = last_box_group_members(text);
    (!members.is_empty()).then(|| members.join(", "))
}

/// The boxes of [`last_box_group`], one by one.
pub fn last_box_group_members(text: &str) -> Vec<String> {
    let spans = box_spans(text);
    let Some(last) = spans.len().checked_sub(1) else { return vec![] };
    let mut first = last;
    // (`\boxed 5`-style boxes can overlap the next one: `\boxed \boxed{3}`; that is no gap.)
    while first > 0 && text.get(spans[first - 1].end..spans[first].start).is_some_and(is_connector) {
        first -= 1;
    }
    spans[first..].iter().map(|b| b.content.clone()).collect()
}

/// The part of a response that holds its answer: after `</think>` when there is one.
pub fn answer_region(response: &str) -> &str {
    match response.rfind("</think>") {
        Some(k) => &response[k + "</think>".len()..],
        None => response,
    }
}

/// Text that only joins answers: spacing, punctuation, math delimiters, "and"/"or", and a
/// variable being assigned (`x =`).
fn is_connector(gap: &str) -> bool {
    if gap.len() > 80 {
        return false;
    }
    let mut g = gap.to_string();
    for t in ["\\text{", "\\quad", "\\qquad", "\\[", "\\]", "\\(", "\\)", "\\,", "\\;", "\\!", "\\\\", "}", "{"] {
        g = g.replace(t, " ");
    }
    g.split(|c: char| c.is_whitespace() || "$,;.&=".contains(c))
        .filter(|w| !w.is_empty())
        .all(|w| matches!(w, "and" | "or") || (w.chars().count() == 1 && w.chars().all(|c| c.is_ascii_alphabetic())))
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
    // A sentence ("The largest $n$ is 34", "The volume of $ABCD$ is 120"): what it says is.
    if answer.starts_with(|c: char| c.is_ascii_uppercase())
        && answer.split_whitespace().next().is_some_and(|w| w.len() >= 2 && w.chars().all(|c| c.is_alphabetic()))
        && let Some(k) = answer.rfind(" is ")
    {
        answer = answer[k + 4..].trim();
    }
    (!answer.is_empty()).then(|| answer.to_string())
}

/// The last `$…$` (or `\(…\)`, `\[…\]`) of the text; for an equation, its last side unless
/// `whole` (the gold is itself an equation).
fn last_math(text: &str, whole: bool) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for (open, close) in [("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
        let Some(mut end) = text.rfind(close) else { continue };
        let (open, close) = if open == "$" && text[..end].ends_with('$') {
            // Display math `$$…$$`: the pair of `$` inside the closing `$$` holds nothing.
            end -= 1;
            ("$$", "$$")
        } else {
            (open, close)
        };
        let Some(start) = text[..end].rfind(open) else { continue };
        let _ = close;
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
        Some(i) if !whole => math[i + 1..].trim(),
        _ => math,
    };
    (!answer.is_empty()).then(|| answer.to_string())
}

fn gsm8k_hashes(text: &str) -> Option<String> {
    let pos = text.rfind("####")?;
    let line = text[pos + 4..].lines().next()?.trim();
    (!line.is_empty()).then(|| line.replace(',', ""))
}

/// The last number that stands alone: not part of a word (`AZYUK2A`, `x5`), with its sign only
/// when the minus is not a subtraction (`3-5` is not -5), and a leading point kept (`.4`).
fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = chars.len();
    while i > 0 {
        i -= 1;
        if !chars[i].is_ascii_digit() {
            continue;
        }
        let end = i + 1;
        let mut start = i;
        while start > 0 && (chars[start - 1].is_ascii_digit() || chars[start - 1] == '.' || chars[start - 1] == ',') {
            start -= 1;
        }
        while start < end && chars[start] == ',' {
            start += 1;
        }
        // SI digit groups: `1 000`, `12 345 678`.
        while end - start >= 3
            && start >= 2
            && chars[start - 1] == ' '
            && chars[start - 2].is_ascii_digit()
            && chars[start..].iter().take_while(|c| c.is_ascii_digit()).count() == 3
        {
            let mut s2 = start - 1;
            while s2 > 0 && chars[s2 - 1].is_ascii_digit() && start - 1 - (s2 - 1) <= 3 {
                s2 -= 1;
            }
            if start - 1 - s2 > 3 || (s2 > 0 && chars[s2 - 1].is_ascii_digit()) {
                break;
            }
            start = s2;
        }
        // A trailing part of a word or symbol is not a number.
        if start > 0 && (chars[start - 1].is_alphabetic() || chars[start - 1] == '_') {
            i = start;
            continue;
        }
        // Digits glued to a capital are a code or label (`2A`); "5cm" is a number with a unit.
        if chars.get(end).is_some_and(|c| c.is_ascii_uppercase()) {
            i = start;
            continue;
        }
        let mut body: String = chars[start..end].iter().filter(|c| **c != ',' && **c != ' ').collect();
        if body.starts_with('.') {
            body.insert(0, '0');
        }
        let before = start.checked_sub(1).map(|k| chars[k]);
        let before_sign = start.checked_sub(2).map(|k| chars[k]);
        let negative = before == Some('-') && before_sign.is_none_or(|c| c.is_whitespace() || "(=[{,:$".contains(c));
        return Some(if negative { format!("-{body}") } else { body });
    }
    None
}

/// What the gold looks like, which decides how far extraction goes.
#[derive(Clone, Copy, Debug, Default)]
pub struct GoldKind {
    /// A plain number: the last number of the text may be the answer.
    pub numeric: bool,
    /// An equation or inequality: inline math is kept whole, not cut to its right side.
    pub relation: bool,
}

/// The answer found by `order`, searching after `</think>` when there is one.
pub fn extract(response: &str, order: &[Strategy], gold: GoldKind) -> Option<String> {
    let numeric_gold = gold.numeric;
    let region = answer_region(response);
    // "Final Answer: The final answer is $X$." written after the last box is the answer; the
    // boxes before it were intermediate results (Minerva's format).
    let lower = region.to_lowercase();
    let final_line = lower.rfind("final answer is").or_else(|| lower.rfind("final answer:"));
    let last_box_start = region.rfind("\\boxed").or_else(|| region.rfind("\\fbox"));
    let final_after_box = matches!((final_line, last_box_start), (Some(f), Some(b)) if f > b);
    for s in order {
        let found = match s {
            Strategy::Boxed if final_after_box => {
                after_phrase(region, &["final answer is", "final answer:"]).or_else(|| last_box_group(region))
            }
            Strategy::Boxed => last_box_group(region),
            Strategy::FinalAnswerIs => after_phrase(region, &["final answer is", "final answer:"]),
            Strategy::AnswerColon => after_phrase(region, &["answer:", "the answer is"]),
            Strategy::Gsm8kHashes => gsm8k_hashes(region),
            Strategy::AfterThink => {
                let tail = region.trim();
                (response.contains("</think>") && !tail.is_empty() && tail.len() <= 200).then(|| tail.to_string())
            }
            Strategy::LastMath => last_math(region, gold.relation),
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

    const NUMERIC: GoldKind = GoldKind { numeric: true, relation: false };
    const OTHER: GoldKind = GoldKind { numeric: false, relation: false };

    #[test]
    fn strategies_in_order() {
        let o = DEFAULT_ORDER;
        assert_eq!(extract("... so the final answer is 42. Done", &o, NUMERIC), Some("42".into()));
        assert_eq!(extract("Reasoning.\nAnswer: $\\frac{3}{4}$", &o, OTHER), Some("$\\frac{3}{4}$".into()));
        assert_eq!(extract("She makes 9 * 2 = 18.\n#### 1,018", &o, NUMERIC), Some("1018".into()));
        assert_eq!(extract("<think>maybe \\boxed{3}</think> It is 4.", &o, NUMERIC), Some("It is 4.".into()));
        assert_eq!(extract("I think it costs 12 dollars, maybe -3.5 in the end", &o, NUMERIC), Some("-3.5".into()));
        assert_eq!(extract("I think it costs 12 dollars, in the end we get x", &o, OTHER), None);
        assert_eq!(extract("\\frac{1}{2}", &o, OTHER), Some("\\frac{1}{2}".into()));
        assert_eq!(extract("So we get $x = \\frac{14}{3}$.", &o, OTHER), Some("\\frac{14}{3}".into()));
        assert_eq!(extract("The answer is 14/3, which is about 4.67.", &o, OTHER), Some("14/3".into()));
    }
}
