//! Verifiable rewards: the math answer grader.
//!
//! `Grader::grade(gold, response)` extracts the response's final answer ([`extract`]), cleans
//! both answers ([`normalize`]), parses them ([`parse`]) and decides equivalence ([`equiv`]);
//! answers outside the parser's subset are compared as normalised strings. Unparseable input
//! is *incorrect*, never an error, and every stage has a work budget instead of a timeout, so
//! no input can hang a training step. `boxed-exact` mode reproduces verl's `math_reward`
//! ([`boxed_exact`]) for comparing with numbers published with it (the HACPO paper's).
//!
//! Pure Rust, no tensors, no model: grading a batch runs in parallel with rayon.

pub mod boxed_exact;
pub mod equiv;
pub mod eval;
pub mod extract;
pub mod normalize;
pub mod parse;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use extract::Strategy;
use parse::{Budget, Expr};

/// Grading semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GradeMode {
    /// Extraction with fallbacks, normalisation and mathematical equivalence.
    Full,
    /// verl `math_reward`: last box, string normalisation, exact match.
    #[serde(alias = "boxed_exact")]
    BoxedExact,
}

impl GradeMode {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "full" => Ok(GradeMode::Full),
            "boxed-exact" | "boxed_exact" => Ok(GradeMode::BoxedExact),
            other => Err(Error::InvalidArgument(format!("unknown grading mode {other:?}; use full or boxed-exact"))),
        }
    }
}

/// Grader settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GradeConfig {
    pub mode: GradeMode,
    /// Extraction priority (full mode).
    pub extraction: Vec<Strategy>,
    /// Decimal golds (`41.8`, `4.5e33`) accept any answer that rounds to them at their
    /// number of significant digits (physics answers, e.g. Minerva). Off by default.
    pub gold_precision: bool,
}

impl Default for GradeConfig {
    fn default() -> Self {
        GradeConfig { mode: GradeMode::Full, extraction: extract::DEFAULT_ORDER.to_vec(), gold_precision: false }
    }
}

/// A configured grader.
#[derive(Clone, Debug, Default)]
pub struct Grader {
    pub config: GradeConfig,
}

impl Grader {
    pub fn new(mode: GradeMode) -> Self {
        Grader { config: GradeConfig { mode, ..Default::default() } }
    }

    /// Whether `response` (a whole model response) answers `gold` correctly.
    pub fn grade(&self, gold: &str, response: &str) -> bool {
        match self.config.mode {
            GradeMode::BoxedExact => boxed_exact::grade(gold, response),
            GradeMode::Full => self.grade_full(gold, response),
        }
    }

    /// Grades many cases in parallel; results in input order.
    pub fn grade_batch<G: AsRef<str> + Sync, R: AsRef<str> + Sync>(&self, cases: &[(G, R)]) -> Vec<bool> {
        cases.par_iter().map(|(g, r)| self.grade(g.as_ref(), r.as_ref())).collect()
    }

    fn grade_full(&self, gold: &str, response: &str) -> bool {
        // The gold's shape decides how far extraction goes (parsed once: this runs per rollout).
        let gold_expr = parse::parse(&normalize::clean(gold), &Budget::default());
        let numeric_gold = match &gold_expr {
            Some(Expr::Num(_)) | Some(Expr::Float(_)) => true,
            Some(Expr::Neg(x)) => matches!(**x, Expr::Num(_)),
            _ => false,
        };
        // (Boxes joined only by "and", commas or spacing are one answer: `extract::last_box_group`.)
        let gold_is_relation = match &gold_expr {
            Some(Expr::Relation(..)) => true,
            Some(Expr::List(items)) => items.iter().any(|x| matches!(x, Expr::Relation(..))),
            _ => false,
        };
        let kind = extract::GoldKind { numeric: numeric_gold, relation: gold_is_relation };
        let Some(answer) = extract::extract(response, &self.config.extraction, kind) else { return false };
        if self.answer_matches(gold, &answer) {
            return true;
        }
        // The same answer boxed twice in two forms (`\boxed{15\frac{39}{40}}, or
        // \boxed{\frac{639}{40}}`) is not a hedge: every box matches the gold.
        let members = extract::last_box_group_members(extract::answer_region(response));
        members.len() > 1 && members.join(", ") == answer && members.iter().all(|m| self.answer_matches(gold, m))
    }

    /// Whether an already extracted `answer` matches `gold`.
    pub fn answer_matches(&self, gold: &str, answer: &str) -> bool {
        let (g, a) = (normalize::clean(gold), normalize::clean(answer));
        if g.is_empty() || a.is_empty() {
            return false;
        }
        // A gold with a label on the left the parser does not read (`V_{1}:V_{2}=11:21`,
        // `A:B=1`): its right side.
        if let Some((lhs, rhs)) = g.split_once('=')
            && !rhs.contains('=')
            && is_label(lhs)
            && parse::parse(&g, &Budget::default()).is_none()
            && self.answer_matches(rhs, answer)
        {
            return true;
        }
        if let Some(letter) = choice_letter(&g, true) {
            return choice_letter(&a, false) == Some(letter);
        }
        if is_text_answer(&g) || is_word(&g) {
            return equiv::text_key(&strip_text(&g)) == equiv::text_key(&strip_text(&a));
        }
        // `\text{13}`: a number written in a text command is the number.
        let g = match number_in_text(&g) {
            Some(inner) => inner,
            None => g,
        };
        if long_decimal_matches(&g, &a) {
            return true;
        }
        let budget = Budget::default();
        match (parse::parse(&g, &budget), parse::parse(&a, &budget)) {
            (Some(ge), Some(ae)) => {
                (self.config.gold_precision && within_gold_precision(&g, &ae))
                    || equiv::equivalent(&ge, &ae)
                    || compact(&g) == compact(&a)
            }
            _ => compact(&g) == compact(&a),
        }
    }
}

/// Whitespace-free string for answers the parser does not cover.
fn compact(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Replaces `\text{X}` (and the other text and font commands) by X.
fn strip_text(s: &str) -> String {
    let mut out = s.to_string();
    for cmd in [
        "\\text",
        "\\textbf",
        "\\mbox",
        "\\mathrm",
        "\\textit",
        "\\textrm",
        "\\mathbf",
        "\\textsc",
        "\\mathit",
        "\\textnormal",
    ] {
        while let Some(k) = out.find(&format!("{cmd}{{")) {
            let open = k + cmd.len();
            let Some(end) = normalize::matching_brace(&out, open) else { break };
            out = format!("{}{}{}", &out[..k], &out[open + 1..end - 1], &out[end..]);
        }
    }
    out
}

/// A gold written as text (`\text{Evelyn}`, `\mathrm{Even}`): words, no math.
fn is_text_answer(g: &str) -> bool {
    if !(g.contains("\\text") || g.contains("\\mbox") || g.contains("\\mathrm")) {
        return false;
    }
    let inner = strip_text(g);
    inner.chars().any(|c| c.is_alphabetic()) && !inner.chars().any(|c| c.is_ascii_digit() || "+-*/^=<>\\".contains(c))
}

/// Letters, subscripts, `:`, `|` and `/` only: a name for the value on the right of `=`.
fn is_label(lhs: &str) -> bool {
    let mut t = lhs.trim().to_string();
    while let Some(k) = t.find("_{") {
        let Some(end) = normalize::matching_brace(&t, k + 1) else { return false };
        t.replace_range(k..end, "");
    }
    let t: String = t.chars().filter(|c| !(c.is_whitespace())).collect();
    let mut chars = t.chars().peekable();
    let mut letters = 0;
    while let Some(c) = chars.next() {
        match c {
            c if c.is_ascii_alphabetic() => letters += 1,
            '_' if chars.next().is_some_and(|d| d.is_ascii_alphanumeric()) => {}
            ':' | '|' | '/' | '(' | ')' | ',' => {}
            _ => return false,
        }
    }
    letters > 0
}

/// A bare gold word of four or more letters (`Evelyn`, `north east`): compared as text, so
/// `\text{evelyn}` matches it. (Shorter letter runs may be products of variables.)
fn is_word(g: &str) -> bool {
    g.chars().all(|c| c.is_alphabetic() || c == ' ') && g.split(' ').any(|w| w.chars().count() >= 4)
}

/// `\text{13}` → `13`: a text command around a whole number.
fn number_in_text(g: &str) -> Option<String> {
    let inner = strip_text(g);
    (inner != g && !inner.trim().is_empty() && inner.trim().chars().all(|c| c.is_ascii_digit() || ".-".contains(c)))
        .then(|| inner.trim().to_string())
}

/// A decimal answer with at least ten significant digits matches a gold rational that it
/// rounds or truncates (`\frac{1}{12}` ← `0.0833333333333333`): within one unit of its last
/// digit, exactly. Shorter decimals (`0.3333`) still have to be exact.
fn long_decimal_matches(gold: &str, answer: &str) -> bool {
    let a = answer.trim();
    let body = a.trim_start_matches('-');
    let Some((int, frac)) = body.split_once('.') else { return false };
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) || frac.is_empty() {
        return false;
    }
    let significant = format!("{int}{frac}").trim_start_matches('0').len();
    if significant < 10 {
        return false;
    }
    let budget = Budget::default();
    let env = std::collections::HashMap::new();
    let value = |s: &str| {
        let e = parse::parse(s, &budget)?;
        match eval::eval(&e, &env, &eval::EvalBudget::default())? {
            eval::Value::Exact(z) if z.is_real() => Some(z.re),
            _ => None,
        }
    };
    let (Some(g), Some(x)) = (value(gold), value(a)) else { return false };
    let unit = num_rational::BigRational::new(1.into(), num_traits::pow(num_bigint::BigInt::from(10), frac.len()));
    let diff = if g > x { &g - &x } else { &x - &g };
    diff < unit
}

/// A multiple-choice letter: `(C)`, `\text{(C)}`, `C)` (and a bare `C` or `c` for responses).
fn choice_letter(s: &str, gold: bool) -> Option<char> {
    let t = strip_text(s);
    let t = t.trim().trim_start_matches("**").trim_end_matches("**");
    let parenthesised = t.starts_with('(') && t.ends_with(')');
    let inner = t.trim_start_matches('(').trim_end_matches(')').trim();
    let mut chars = inner.chars();
    let c = chars.next()?;
    let c = if gold { c } else { c.to_ascii_uppercase() };
    if chars.next().is_some() || !('A'..='E').contains(&c) {
        return None;
    }
    (parenthesised || !gold || s.contains("\\text")).then_some(c)
}

/// With `gold_precision`: a decimal gold with n significant digits accepts values within
/// half a unit of its last digit.
fn within_gold_precision(gold: &str, answer: &Expr) -> bool {
    let g = gold.trim();
    let (mantissa, exp) = match g.find(['e', 'E']) {
        Some(k) => (&g[..k], g[k + 1..].parse::<i32>().unwrap_or(0)),
        None => (g, 0),
    };
    let m = mantissa.trim_start_matches('-');
    if m.is_empty()
        || !m.chars().all(|c| c.is_ascii_digit() || c == '.')
        || !(m.contains('.') || g.contains(['e', 'E']))
    {
        return false;
    }
    let Ok(value) = g.parse::<f64>() else { return false };
    let frac_digits = m.split_once('.').map_or(0, |(_, f)| f.len()) as i32;
    let unit = 10f64.powi(exp - frac_digits);
    let env = std::collections::HashMap::new();
    let Some(v) = eval::eval(answer, &env, &eval::EvalBudget::default()) else { return false };
    let z = v.to_complex();
    z.im.abs() <= 1e-12 * z.re.abs().max(1.0) && (z.re - value).abs() <= 0.5 * unit * (1.0 + 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_to_end() {
        let g = Grader::default();
        assert!(g.grade("\\frac{14}{3}", "Thus the answer is $\\boxed{\\dfrac{14}{3}}$."));
        assert!(g.grade("\\text{Evelyn}", "The winner is \\boxed{\\text{evelyn}}"));
        assert!(g.grade("\\text{(C)}", "\\boxed{C}"));
        assert!(!g.grade("\\text{(C)}", "\\boxed{D}"));
        assert!(g.grade("1,-2", "The solutions are \\boxed{1} and \\boxed{-2}."));
        assert!(g.grade("18", "She makes 9 * 2 = 18 dollars.\n#### 18"));
        assert!(!g.grade("13536", "\\boxed{13535}"));
        assert!(!g.grade("52", "\\boxed{52_8}"));
        assert!(g.grade("10,\\!080", "\\boxed{10080}"));
        assert!(g.grade("90^\\circ", "\\boxed{90}"));
        assert!(!g.grade("5", "no answer here"));
    }

    #[test]
    fn gold_precision_is_opt_in() {
        let mut g = Grader::default();
        assert!(!g.answer_matches("41.8", "41.83"));
        g.config.gold_precision = true;
        assert!(g.answer_matches("41.8", "41.83"));
        assert!(!g.answer_matches("41.8", "41.86"));
        assert!(g.answer_matches("4.5e33", "4.46 \\times 10^{33}"));
        assert!(!g.answer_matches("13536", "13535.9"));
    }
}
