//! String-level clean-up of an answer before parsing: the notational noise that carries no
//! mathematical content (`$`, `\left`, spacing, `\dfrac`, degrees, `\%`, `\$`, units, thousands
//! separators, trailing periods, "and"/"or" between solutions).
//!
//! Base-n subscripts (`52_8`) are content and are kept.

/// Removes every occurrence of each pattern.
fn remove_all(mut s: String, patterns: &[&str]) -> String {
    for p in patterns {
        if s.contains(p) {
            s = s.replace(p, "");
        }
    }
    s
}

/// Removes TeX spacing commands (`\!`, `\,`, `\;`, `\:`, `\ `), leaving `\\` (a line
/// break) intact: a naive `replace("\\ ", " ")` would eat the second backslash of `\\ `.
fn remove_spacing(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('\\') => {
                out.push_str("\\\\");
                chars.next();
            }
            Some('!' | ',' | ';' | ':') => {
                chars.next();
            }
            Some(' ') => {
                out.push(' ');
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// Strips one layer of math delimiters around the whole string.
fn strip_delimiters(s: &str) -> &str {
    let s = s.trim();
    for (open, close) in [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
        if s.len() >= open.len() + close.len()
            && let Some(inner) = s.strip_prefix(open).and_then(|r| r.strip_suffix(close))
        {
            return inner.trim();
        }
    }
    s
}

/// The index just after the `{…}` group that starts at byte `open` (which must be `{`).
pub(crate) fn matching_brace(s: &str, open: usize) -> Option<usize> {
    let bytes = s.as_bytes();
    if bytes.get(open) != Some(&b'{') {
        return None;
    }
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

const TEXT_COMMANDS: [&str; 7] = ["\\text", "\\mbox", "\\textrm", "\\textbf", "\\textit", "\\mathrm", "\\textnormal"];

/// Removes a trailing unit in a text command (`5.4 \text{ cents}`, `864 \mbox{ inches}^2`),
/// when something remains before it.
fn strip_trailing_unit(s: &str) -> String {
    let mut s = s.trim_end().to_string();
    for _ in 0..3 {
        // A power on the unit: `\mbox{ cm}^2`, `\text{m}^{3}`.
        let without_power = strip_suffix_power(&s);
        let Some((start, end)) = last_text_command(&without_power) else { break };
        if end != without_power.len() {
            break;
        }
        let head = without_power[..start].trim_end();
        let unit = &without_power[start..end];
        // Only a unit if a number-like part remains and the text is a word, not an answer.
        let inner = unit.split_once('{').map(|(_, r)| r.trim_end_matches('}')).unwrap_or("").trim();
        let is_word = !inner.is_empty() && inner.chars().all(|c| c.is_alphabetic() || c == ' ' || c == '.' || c == '/');
        if head.is_empty() || !is_word || head.ends_with(['+', '-', '=', '(', ',', '{']) {
            break;
        }
        s = head.to_string();
    }
    s
}

fn strip_suffix_power(s: &str) -> String {
    for p in ["^{2}", "^{3}", "^2", "^3"] {
        if let Some(h) = s.strip_suffix(p) {
            return h.to_string();
        }
    }
    s.to_string()
}

/// Byte range of the last `\text{…}`-like command in `s`.
fn last_text_command(s: &str) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for cmd in TEXT_COMMANDS {
        let mut from = 0;
        while let Some(k) = s[from..].find(cmd) {
            let start = from + k;
            let after = start + cmd.len();
            let open = after + s[after..].len() - s[after..].trim_start().len();
            if let Some(end) = matching_brace(s, open)
                && best.is_none_or(|(b, _)| start > b)
            {
                best = Some((start, end));
            }
            from = after;
        }
    }
    best
}

/// Removes plain unit words after a number (`90 degrees`, `5.4 cents`, `12 square units`):
/// a run of alphabetic words of three or more letters, if what precedes it ends in a digit or
/// a closing brace. Text answers ("north east") have no number before them and stay whole.
fn strip_trailing_words(s: &str) -> String {
    let words: Vec<&str> = s.split(' ').collect();
    let is_unit = |w: &str| {
        let w = w.trim_end_matches(['^', '2', '3']);
        w.len() >= 3 && w.chars().all(|c| c.is_ascii_alphabetic())
    };
    let mut keep = words.len();
    while keep > 1 && is_unit(words[keep - 1]) {
        keep -= 1;
    }
    let head = words[..keep].join(" ");
    let head = head.trim_end();
    if keep < words.len() && head.ends_with(|c: char| c.is_ascii_digit() || c == '}') {
        head.to_string()
    } else {
        s.to_string()
    }
}

/// Digit groups with thousands separators (`10,080`, `1,000,000.5`) as a plain number.
/// A comma followed by a space separates list items (`32, 349` is two numbers), and digit
/// groups separated by single spaces are one number (`1 000`, SI style).
fn merge_thousands(s: &str) -> Option<String> {
    if s.contains(", ") {
        return None;
    }
    let spaced: Vec<&str> = s.trim().split(' ').collect();
    if spaced.len() >= 2
        && (1..=3).contains(&spaced[0].trim_start_matches('-').len())
        && spaced[1..].iter().all(|g| g.len() == 3)
        && spaced.iter().all(|g| g.trim_start_matches('-').chars().all(|c| c.is_ascii_digit()) && !g[1..].contains('-'))
    {
        return Some(spaced.concat());
    }
    let t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let (sign, body) = t.strip_prefix('-').map(|b| ("-", b)).unwrap_or(("", &t));
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let groups: Vec<&str> = int.split(',').collect();
    if groups.len() < 2
        || !(1..=3).contains(&groups[0].len())
        || groups[1..].iter().any(|g| g.len() != 3)
        || !groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit()))
        || !frac.chars().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    Some(format!("{sign}{}{}{}", groups.concat(), if frac.is_empty() { "" } else { "." }, frac))
}

/// `a, , b` → `a, b` (after "and" became a comma next to one).
fn collapse_commas(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut last_comma = false;
    for c in s.chars() {
        if c == ',' {
            if last_comma {
                continue;
            }
            last_comma = true;
        } else if !c.is_whitespace() {
            last_comma = false;
        }
        out.push(c);
    }
    out
}

/// Removes explicit thousands separators between digit groups: `29,\!322` and `10{,}000`.
fn remove_thousands_marks(s: &str) -> String {
    let mut out = s.to_string();
    for mark in [",\\!", "{,}", "{, }"] {
        let mut from = 0;
        while let Some(k) = out[from..].find(mark).map(|k| from + k) {
            // `14 {, }916`: spaces before the mark go with it.
            let lead = out[..k].len() - out[..k].trim_end_matches(' ').len();
            let (k, mark_len) = (k - lead, mark.len() + lead);
            let before = out[..k].chars().last().is_some_and(|c| c.is_ascii_digit());
            let spaces = out[k + mark_len..].len() - out[k + mark_len..].trim_start_matches(' ').len();
            let after: String = out[k + mark_len + spaces..].chars().take(3).collect();
            if before && after.len() == 3 && after.chars().all(|c| c.is_ascii_digit()) {
                out.replace_range(k..k + mark_len + spaces, "");
                from = k;
            } else {
                from = k + mark_len;
            }
        }
    }
    out
}

/// Greek letters typed as Unicode, as LaTeX (`π` is also read by the parser).
const GREEK: [(char, &str); 24] = [
    ('α', "\\alpha"),
    ('β', "\\beta"),
    ('γ', "\\gamma"),
    ('δ', "\\delta"),
    ('ε', "\\epsilon"),
    ('ζ', "\\zeta"),
    ('η', "\\eta"),
    ('θ', "\\theta"),
    ('κ', "\\kappa"),
    ('λ', "\\lambda"),
    ('μ', "\\mu"),
    ('ν', "\\nu"),
    ('ξ', "\\xi"),
    ('ρ', "\\rho"),
    ('σ', "\\sigma"),
    ('τ', "\\tau"),
    ('φ', "\\phi"),
    ('χ', "\\chi"),
    ('ψ', "\\psi"),
    ('ω', "\\omega"),
    ('Γ', "\\Gamma"),
    ('Δ', "\\Delta"),
    ('Θ', "\\Theta"),
    ('Ω', "\\Omega"),
];

/// `\mathrm{R}`, `\mathbf{x}`, `\mathit{i}`: a single letter in a font command is that letter.
fn unwrap_font_letters(s: &str) -> String {
    let mut out = s.to_string();
    for cmd in ["\\mathrm{", "\\mathbf{", "\\mathit{", "\\boldsymbol{", "\\operatorname{"] {
        let mut from = 0;
        while let Some(k) = out[from..].find(cmd).map(|k| from + k) {
            let inner = &out[k + cmd.len()..];
            let mut chars = inner.chars();
            match (chars.next(), chars.next()) {
                (Some(c), Some('}')) if c.is_ascii_alphabetic() => {
                    let letter = c.to_string();
                    out.replace_range(k..k + cmd.len() + 2, &letter);
                    from = k + 1;
                }
                _ => from = k + cmd.len(),
            }
        }
    }
    out
}

/// `{1, 2, 3}`: braces around a whole list are a set (models write them without `\{`).
fn braces_as_set(s: &str) -> String {
    let t = s.trim();
    if t.starts_with('{') && matching_brace(t, 0) == Some(t.len()) {
        let inner = &t[1..t.len() - 1];
        let mut depth = 0i32;
        let top_comma = inner.char_indices().any(|(_, c)| {
            match c {
                '{' | '(' | '[' => depth += 1,
                '}' | ')' | ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        });
        if top_comma {
            return format!("\\{{{inner}\\}}");
        }
    }
    s.to_string()
}

/// `_{(5)}` → `_{5}`: only a number in the parentheses.
fn base_in_parentheses(s: &str) -> String {
    let mut out = s.to_string();
    let mut from = 0;
    while let Some(k) = out[from..].find("_{(").map(|k| from + k) {
        let digits: String = out[k + 3..].chars().take_while(|c| c.is_ascii_digit()).collect();
        if !digits.is_empty() && out[k + 3 + digits.len()..].starts_with(")}") {
            out.replace_range(k..k + 3 + digits.len() + 2, &format!("_{{{digits}}}"));
        }
        from = k + 2;
    }
    out
}

/// Cleans an answer string for parsing.
pub fn clean(answer: &str) -> String {
    let mut s = strip_delimiters(answer).replace('\n', " ");
    if !s.is_ascii() {
        for (letter, tex) in GREEK {
            if s.contains(letter) {
                s = s.replace(letter, &format!("{tex} "));
            }
        }
    }
    // `4210_{(5)}`: a base written in parentheses.
    let s = base_in_parentheses(&s);
    let s = braces_as_set(&unwrap_font_letters(&s));
    let s = remove_thousands_marks(&s);
    let s = s.replace("{,}", ",");
    // Spacing commands; `\ ` and `~` are spaces.
    let s = remove_spacing(&s);
    let s = remove_all(s, &["\\quad", "\\qquad", "\\displaystyle"]).replace('~', " ");
    // Degrees, percent and dollar signs carry no value.
    let s = remove_all(s, &["^{\\circ}", "^\\circ", "\\circ", "°", "\\degree", "^{\\prime}", "\\%", "%", "\\$", "$"]);
    let s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac");
    // "or"/"and" between solutions; `\approx` before a value; `\phantom` spacing.
    let mut s = s;
    for (from, to) in [
        ("\\text{, and }", ", "),
        ("\\text{ and }", ", "),
        ("\\text{ or }", ", "),
        ("\\text{or}", ", "),
        ("\\text{and}", ", "),
        (" or ", ", "),
        (" and ", ", "),
        ("\\phantom", ""),
    ] {
        s = s.replace(from, to);
    }
    let s = collapse_commas(s.trim().trim_start_matches("\\approx").trim());
    let s = strip_trailing_unit(s.trim().trim_end_matches('.'));
    let s = s.trim().trim_end_matches(['.', ',']).trim().to_string();
    let s = s.replace("\\text{ degrees}", "").replace("\\text{degrees}", "");
    let s = strip_trailing_words(&s);
    merge_thousands(&s).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_notation() {
        assert_eq!(clean("$10,\\!080$"), "10080");
        assert_eq!(clean("11,\\! 111,\\! 111,\\! 100"), "11111111100");
        assert_eq!(clean("\\$32,\\!348"), "32348");
        assert_eq!(clean("90^\\circ"), "90");
        assert_eq!(clean("5.4 \\text{ cents}"), "5.4");
        assert_eq!(clean("864 \\mbox{ inches}^2"), "864");
        assert_eq!(clean("15\\mbox{ cm}^2"), "15");
        assert_eq!(clean("\\frac{270}7\\text{ degrees}"), "\\frac{270}7");
        assert_eq!(clean("\\text{Evelyn}"), "\\text{Evelyn}");
        assert_eq!(clean("25\\%"), "25");
        assert_eq!(clean("90 degrees"), "90");
        assert_eq!(clean("12 square units"), "12");
        assert_eq!(clean("\\text{east}"), "\\text{east}");
        assert_eq!(clean("north east"), "north east");
        assert_eq!(clean("\\dfrac{1}{29,\\!322,\\!216}"), "\\frac{1}{29322216}");
        assert_eq!(clean("2, 3, \\text{ and } 4").replace(' ', ""), "2,3,4");
        assert_eq!(clean("7\\text{ hours}."), "7");
        assert_eq!(clean("125\\textnormal{ miles}"), "125");
        assert_eq!(clean("\\approx 8.24 \\text{ mph}"), "8.24");
        assert_eq!(clean("1,-2"), "1,-2");
        assert_eq!(clean("3, 5, 7."), "3, 5, 7");
        assert_eq!(clean("52_8"), "52_8");
        assert_eq!(clean("x=1 \\text{ or } x=2").replace(' ', ""), "x=1,x=2");
    }
}
