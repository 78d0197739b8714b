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
        let gold_clean = normalize::clean(gold);
        let numeric_gold = matches!(
            parse::parse(&gold_clean, &Budget::default()),
            Some(Expr::Num(_)) | Some(Expr::Float(_))
        ) || matches!(parse::parse(&gold_clean, &Budget::default()), Some(Expr::Neg(ref x)) if matches!(**x, Expr::Num(_)));
        let Some(answer) = extract::extract(response, &self.config.extraction, numeric_gold) else { return false };
        if self.answer_matches(gold, &answer) {
            return true;
        }
        // Several boxes may together hold a list answer ("\boxed{1}, \boxed{-2}").
        let all = extract::boxes(response);
        (2..=16).contains(&all.len()) && self.answer_matches(gold, &all.join(", "))
    }

    /// Whether an already extracted `answer` matches `gold`.
    pub fn answer_matches(&self, gold: &str, answer: &str) -> bool {
        let (g, a) = (normalize::clean(gold), normalize::clean(answer));
        if g.is_empty() || a.is_empty() {
            return false;
        }
        if let Some(letter) = choice_letter(&g, true) {
            return choice_letter(&a, false) == Some(letter);
        }
        if is_text_answer(&g) {
            return equiv::text_key(&strip_text(&g)) == equiv::text_key(&strip_text(&a));
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

/// Replaces `\text{X}` (and `\textbf`, `\mbox`, `\mathrm`, `\textit`) by X.
fn strip_text(s: &str) -> String {
    let mut out = s.to_string();
    for cmd in ["\\text", "\\textbf", "\\mbox", "\\mathrm", "\\textit", "\\textrm"] {
        while let Some(k) = out.find(&format!("{cmd}{{")) {
            let open = k + cmd.len();
            let Some(end) = normalize::matching_brace(&out, open) else { break };
            out = format!("{}{}{}", &out[..k], &out[open + 1..end - 1], &out[end..]);
        }
    }
    out
}

/// A gold written as text (`\text{Evelyn}`, `\text{east}`): words, no math.
fn is_text_answer(g: &str) -> bool {
    if !(g.contains("\\text") || g.contains("\\mbox")) {
        return false;
    }
    let inner = strip_text(g);
    inner.chars().any(|c| c.is_alphabetic()) && !inner.chars().any(|c| c.is_ascii_digit() || "+-*/^=<>\\".contains(c))
}

/// A multiple-choice letter: `(C)`, `\text{(C)}`, `C)` (and a bare `C` for responses).
fn choice_letter(s: &str, gold: bool) -> Option<char> {
    let t = strip_text(s);
    let t = t.trim();
    let parenthesised = t.starts_with('(') && t.ends_with(')');
    let inner = t.trim_start_matches('(').trim_end_matches(')').trim();
    let mut chars = inner.chars();
    let c = chars.next()?;
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
