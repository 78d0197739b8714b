//! verl's `math_reward` (the Hendrycks MATH `is_equiv`): last `\boxed{}`, string
//! normalisation, exact string match. The HACPO paper's rewards used it, so reproducing its
//! numbers needs exactly these semantics, quirks included: a normalisation step that would
//! raise in Python (two `\text{ ` units, an empty `\frac`) falls back to comparing the raw
//! strings, and any other failure scores 0.

/// The content of the last box as verl extracts it (`\boxed ` with a space ends at `$`).
fn verl_last_boxed(s: &str) -> Option<String> {
    if let Some(k) = s.rfind("\\boxed ") {
        let tail = &s[k + "\\boxed ".len()..];
        return Some(tail.split('$').next().unwrap_or("").to_string());
    }
    let idx = s.rfind("\\boxed").or_else(|| s.rfind("\\fbox"))?;
    let mut depth = 0i64;
    for (i, c) in s[idx..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    let boxed = &s[idx..idx + i + 1];
                    // remove_boxed asserts a `\boxed{` prefix (a `\fbox{` fails → score 0).
                    return boxed.strip_prefix("\\boxed{").map(|b| b[..b.len() - 1].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

fn fix_fracs(s: &str) -> Option<String> {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or("").to_string();
    for sub in parts {
        out.push_str("\\frac");
        let mut chars = sub.chars();
        let first = chars.next()?; // an empty piece raises in Python
        if first == '{' {
            out.push_str(sub);
            continue;
        }
        let second = chars.next()?;
        let post: String = chars.collect();
        if second != '{' {
            out.push_str(&format!("{{{first}}}{{{second}}}{post}"));
        } else {
            out.push_str(&format!("{{{first}}}{second}{post}"));
        }
    }
    Some(out)
}

fn fix_a_slash_b(s: &str) -> String {
    let parts: Vec<&str> = s.split('/').collect();
    if parts.len() != 2 {
        return s.to_string();
    }
    match (parts[0].parse::<i64>(), parts[1].parse::<i64>()) {
        (Ok(a), Ok(b)) if s == format!("{a}/{b}") => format!("\\frac{{{a}}}{{{b}}}"),
        _ => s.to_string(),
    }
}

fn fix_sqrt(s: &str) -> Option<String> {
    if !s.contains("\\sqrt") {
        return Some(s.to_string());
    }
    let mut parts = s.split("\\sqrt");
    let mut out = parts.next().unwrap_or("").to_string();
    for sub in parts {
        let first = sub.chars().next()?; // an empty piece raises in Python
        if first != '{' {
            out.push_str(&format!("\\sqrt{{{first}}}{}", &sub[first.len_utf8()..]));
        } else {
            out.push_str("\\sqrt");
            out.push_str(sub);
        }
    }
    Some(out)
}

/// Hendrycks' `strip_string`; `None` where the Python raises.
fn strip_string(s: &str) -> Option<String> {
    let mut s = s.replace('\n', "").replace("\\!", "").replace("\\\\", "\\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac");
    s = s.replace("\\left", "").replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "");
    s = s.replace("\\$", "");
    if s.contains("\\text{ ") {
        let parts: Vec<&str> = s.split("\\text{ ").collect();
        if parts.len() != 2 {
            return None;
        }
        s = parts[0].to_string();
    }
    s = s.replace("\\\\%", "").replace("\\%", "");
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s = format!("0{s}");
    }
    let eq: Vec<&str> = s.split('=').collect();
    if eq.len() == 2 && eq[0].chars().count() <= 2 {
        s = eq[1].to_string();
    }
    s = fix_sqrt(&s)?;
    s = s.replace(' ', "");
    s = fix_fracs(&s)?;
    if s == "0.5" {
        s = "\\frac{1}{2}".into();
    }
    Some(fix_a_slash_b(&s))
}

/// `is_equiv`: normalised strings equal (raw strings when normalisation fails).
pub fn is_equiv(a: &str, b: &str) -> bool {
    match (strip_string(a), strip_string(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// verl's `compute_score` as a boolean.
pub fn grade(gold: &str, response: &str) -> bool {
    verl_last_boxed(response).is_some_and(|answer| is_equiv(&answer, gold))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_verl_semantics() {
        assert!(grade("\\frac{1}{2}", "so \\boxed{\\dfrac12}"));
        assert!(grade("\\frac{1}{2}", "\\boxed{0.5}"));
        assert!(grade("10", "\\boxed{x=10}"));
        assert!(grade("2\\sqrt{3}", "\\boxed{2\\sqrt3}"));
        assert!(!grade("3\\sqrt{13}", "\\boxed{3\\sqrt13}")); // fix_sqrt takes one character
        assert!(grade("\\frac{1}{2}", "\\boxed{1/2}"));
        assert!(!grade("0.25", "\\boxed{\\frac14}"));
        assert!(!grade("5", "the answer is 5"));
        assert!(grade("5", "\\boxed 5$ done"));
        assert!(grade("90", "\\boxed{90^\\circ}"));
    }
}
