//! Mathematical equivalence of two parsed answers, gold first.
//!
//! In order: exact rationals (also complex `a+bi`); numbers with a tolerance that never
//! equates distinct integers; expressions with variables by evaluation at random rational
//! points, exactly where possible (Schwartz–Zippel: distinct polynomials and rational
//! functions disagree at random points), numerically for radicals and functions; structure
//! for sets (any order), tuples and matrices (in order), intervals (open/closed must match);
//! equations up to a nonzero factor, inequalities up to a positive factor and flipping.
//!
//! Asymmetric where that prevents reward hacking: a gold interval is not matched by an
//! inequality (the response must commit to the interval), while a gold inequality is matched
//! by the interval it describes.

use std::collections::{BTreeSet, HashMap};

use num_bigint::BigInt;
use num_complex::Complex64;
use num_rational::BigRational;
use rand::{Rng, SeedableRng};

use super::eval::{CRat, EvalBudget, REL_TOLERANCE, Value, eval, values_equal};
use super::parse::{Expr, RelOp};

/// Random points used for expressions with variables.
const POINTS: usize = 6;
/// Points that must evaluate for a verdict.
const MIN_POINTS: usize = 3;
/// Tolerance at random points (looser than for numbers: functions amplify rounding).
const POINT_TOLERANCE: f64 = 1e-8;

/// Whether `response` is equivalent to `gold`.
pub fn equivalent(gold: &Expr, response: &Expr) -> bool {
    let mut ctx = Ctx { budget: EvalBudget::default(), work: 0 };
    ctx.equiv(gold, response)
}

struct Ctx {
    budget: EvalBudget,
    /// Structural comparisons made; bounded so nested sets cannot explode.
    work: usize,
}

const MAX_WORK: usize = 5000;

fn free_symbols(e: &Expr, out: &mut BTreeSet<String>) {
    match e {
        Expr::Sym(s) => {
            out.insert(s.clone());
        }
        Expr::Add(v)
        | Expr::Mul(v)
        | Expr::Tuple(v)
        | Expr::List(v)
        | Expr::Set(v)
        | Expr::Union(v)
        | Expr::Func(_, v) => v.iter().for_each(|x| free_symbols(x, out)),
        Expr::Relation(v, _) => v.iter().for_each(|x| free_symbols(x, out)),
        Expr::Neg(x) | Expr::Factorial(x) => free_symbols(x, out),
        Expr::Div(a, b) | Expr::Pow(a, b) | Expr::PlusMinus(a, b) => {
            free_symbols(a, out);
            free_symbols(b, out);
        }
        Expr::Interval { lo, hi, .. } => {
            free_symbols(lo, out);
            free_symbols(hi, out);
        }
        Expr::Matrix(rows) => rows.iter().flatten().for_each(|x| free_symbols(x, out)),
        _ => {}
    }
}

/// `±` expanded: every combination of signs (at most 16).
fn expand_pm(e: &Expr) -> Vec<Expr> {
    match e {
        Expr::PlusMinus(a, b) => {
            let mut out = vec![];
            for x in expand_pm(a) {
                for y in expand_pm(b) {
                    out.push(Expr::Add(vec![x.clone(), y.clone()]));
                    out.push(Expr::Add(vec![x.clone(), Expr::Neg(Box::new(y))]));
                }
            }
            out.truncate(16);
            out
        }
        Expr::Add(terms) if terms.iter().any(|t| matches!(t, Expr::PlusMinus(..))) => {
            // a + (b ± c) is rare; treat the ± term alone.
            vec![e.clone()]
        }
        _ => vec![e.clone()],
    }
}

/// Elements of a collection answer (list, set, or a single ± expression).
fn elements(e: &Expr) -> Option<Vec<Expr>> {
    match e {
        Expr::List(v) | Expr::Set(v) => Some(v.iter().flat_map(expand_pm).collect()),
        Expr::PlusMinus(..) => Some(expand_pm(e)),
        _ => None,
    }
}

/// `x = rhs` or `x \in rhs` with a single-symbol left side: the right side.
fn assigned_value(e: &Expr) -> Option<&Expr> {
    match e {
        Expr::Relation(terms, ops) if ops.len() == 1 && matches!(ops[0], RelOp::Eq | RelOp::In) => match &terms[0] {
            // A label made only of symbols: `x`, `f(x)`, `(p, q)`, `|AB|`, `\frac{NO}{BO}`, `V_1:V_2`.
            // (Sums and anything with a number are equations, not labels.)
            lhs if only_symbols(lhs) => Some(&terms[1]),
            _ => None,
        },
        _ => None,
    }
}

/// Symbols combined by products, quotients, tuples and function calls, with no number.
fn only_symbols(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Mul(v) | Expr::Tuple(v) => !v.is_empty() && v.iter().all(only_symbols),
        Expr::Func(_, v) => !v.is_empty() && v.iter().all(only_symbols),
        Expr::Div(a, b) => only_symbols(a) && only_symbols(b),
        _ => false,
    }
}

fn inf_sign(e: &Expr) -> Option<i8> {
    match e {
        Expr::Inf => Some(1),
        Expr::Neg(x) if **x == Expr::Inf => Some(-1),
        _ => None,
    }
}

fn rat(n: i64, d: i64) -> BigRational {
    BigRational::new(BigInt::from(n), BigInt::from(d))
}

impl Ctx {
    fn tick(&mut self) -> bool {
        self.work += 1;
        self.work <= MAX_WORK
    }

    fn equiv(&mut self, g: &Expr, r: &Expr) -> bool {
        if !self.tick() {
            return false;
        }
        if g == r {
            return true;
        }
        // "x = 5" against "5" (either way), "x \in [1,2]" against "[1,2]".
        let (g_rel, r_rel) = (matches!(g, Expr::Relation(..)), matches!(r, Expr::Relation(..)));
        if g_rel && r_rel {
            if let (Some(gv), Some(rv)) = (assigned_value(g), assigned_value(r))
                && self.equiv(gv, rv)
            {
                return true;
            }
            // A gold inequality against "x \in [a, b]".
            if let (Some(iv), Expr::Relation(_, ops), Some(rv)) = (inequality_as_interval(g), r, assigned_value(r))
                && ops[0] == RelOp::In
                && self.equiv(&iv, rv)
            {
                return true;
            }
            return self.relation_equiv(g, r);
        }
        if g_rel {
            if let Some(gv) = assigned_value(g) {
                return self.equiv(gv, r);
            }
            // A gold inequality in one variable is matched by its interval.
            if let Some(iv) = inequality_as_interval(g)
                && (matches!(r, Expr::Interval { .. } | Expr::Union(_)) || matches!(r, Expr::Tuple(t) if t.len() == 2))
            {
                return self.equiv(&iv, r);
            }
            return false;
        }
        if r_rel {
            return match assigned_value(r) {
                Some(rv)
                    if !matches!(g, Expr::Interval { .. } | Expr::Union(_))
                        || matches!(r, Expr::Relation(_, o) if o[0] == RelOp::In) =>
                {
                    self.equiv(g, rv)
                }
                _ => false,
            };
        }
        match (g, r) {
            (Expr::Text(a), Expr::Text(b)) => text_key(a) == text_key(b),
            (Expr::Text(_), _) | (_, Expr::Text(_)) => false,
            (Expr::Based { digits: a, base: x }, Expr::Based { digits: b, base: y }) => {
                x == y && BigInt::parse_bytes(a.as_bytes(), *x) == BigInt::parse_bytes(b.as_bytes(), *y)
            }
            // The digits of a base-n gold without the subscript (`52` for `52_8`): the base is
            // the question's, the answer names the same numeral.
            (Expr::Based { digits, .. }, Expr::Num(n)) => {
                n.is_integer()
                    && !num_traits::Signed::is_negative(n)
                    && n.to_integer().to_string() == digits.to_uppercase()
            }
            (Expr::Based { .. }, _) | (_, Expr::Based { .. }) => false,
            (
                Expr::Interval { lo: a, hi: b, lo_closed: c, hi_closed: d },
                Expr::Interval { lo: x, hi: y, lo_closed: z, hi_closed: w },
            ) => c == z && d == w && self.bound_equiv(a, x) && self.bound_equiv(b, y),
            // An open interval and a pair are written alike: "(2, 4)".
            (Expr::Interval { lo, hi, lo_closed: false, hi_closed: false }, Expr::Tuple(t))
            | (Expr::Tuple(t), Expr::Interval { lo, hi, lo_closed: false, hi_closed: false })
                if t.len() == 2 =>
            {
                self.bound_equiv(lo, &t[0]) && self.bound_equiv(hi, &t[1])
            }
            (Expr::Union(a), Expr::Union(b)) => self.match_unordered(a, b),
            (Expr::Tuple(a), Expr::Tuple(b)) | (Expr::Tuple(a), Expr::List(b)) | (Expr::List(a), Expr::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| self.equiv(x, y))
            }
            (Expr::Matrix(a), Expr::Matrix(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(ra, rb)| ra.len() == rb.len() && ra.iter().zip(rb).all(|(x, y)| self.equiv(x, y)))
            }
            // A column (or row) vector written as a tuple.
            (Expr::Matrix(m), Expr::Tuple(t)) | (Expr::Tuple(t), Expr::Matrix(m)) => {
                let flat: Vec<&Expr> = m.iter().flatten().collect();
                (m.len() == 1 || m.iter().all(|row| row.len() == 1))
                    && flat.len() == t.len()
                    && flat.iter().zip(t).all(|(x, y)| self.equiv(x, y))
            }
            _ => match (elements(g), elements(r)) {
                (Some(a), Some(b)) => self.match_unordered(&a, &b),
                (Some(a), None) if a.len() == 1 => self.equiv(&a[0], r),
                (None, Some(b)) if b.len() == 1 => self.equiv(g, &b[0]),
                (Some(_), None) | (None, Some(_)) => false,
                (None, None) => {
                    if is_structure(g) || is_structure(r) {
                        return false;
                    }
                    self.scalar_equiv(g, r)
                }
            },
        }
    }

    fn bound_equiv(&mut self, a: &Expr, b: &Expr) -> bool {
        match (inf_sign(a), inf_sign(b)) {
            (Some(x), Some(y)) => x == y,
            (None, None) => self.equiv(a, b),
            _ => false,
        }
    }

    /// A perfect matching between two multisets under equivalence.
    fn match_unordered(&mut self, a: &[Expr], b: &[Expr]) -> bool {
        if a.len() != b.len() {
            return false;
        }
        let mut used = vec![false; b.len()];
        for x in a {
            let Some(j) = (0..b.len()).find(|&j| !used[j] && self.equiv(x, &b[j])) else { return false };
            used[j] = true;
        }
        true
    }

    /// Numbers and expressions.
    fn scalar_equiv(&mut self, g: &Expr, r: &Expr) -> bool {
        let mut vars = BTreeSet::new();
        free_symbols(g, &mut vars);
        free_symbols(r, &mut vars);
        if vars.is_empty() {
            let env = HashMap::new();
            return match (eval(g, &env, &self.budget), eval(r, &env, &self.budget)) {
                (Some(a), Some(b)) => values_equal(&a, &b, REL_TOLERANCE),
                _ => false,
            };
        }
        let mut agreed = 0;
        for env in random_points(&vars, g, r) {
            match (eval(g, &env, &self.budget), eval(r, &env, &self.budget)) {
                (Some(a), Some(b)) => {
                    if !values_equal(&a, &b, POINT_TOLERANCE) {
                        return false;
                    }
                    agreed += 1;
                }
                (None, None) => {}
                _ => return false,
            }
        }
        agreed >= MIN_POINTS
    }

    /// Equations up to a nonzero factor; inequalities up to a positive factor and flipping;
    /// chains term by term.
    fn relation_equiv(&mut self, g: &Expr, r: &Expr) -> bool {
        let (Expr::Relation(gt, gops), Expr::Relation(rt, rops)) = (g, r) else { return false };
        if gops.len() != rops.len() {
            return false;
        }
        if gops.len() == 1 {
            let (a, b) = (oriented(&gt[0], gops[0], &gt[1]), oriented(&rt[0], rops[0], &rt[1]));
            return match (a, b) {
                (Some((ga, gk)), Some((ra, rk))) if gk == rk => self.proportional(&ga, &ra, gk.positive_factor()),
                _ => {
                    // `x \in S` against `x \in S'`.
                    gops[0] == RelOp::In
                        && rops[0] == RelOp::In
                        && self.equiv(&gt[0], &rt[0])
                        && self.equiv(&gt[1], &rt[1])
                }
            };
        }
        // Chains: the same terms in order, or reversed with flipped operators.
        let same = gops == rops && gt.iter().zip(rt).all(|(x, y)| self.equiv(x, y));
        same || {
            let flipped: Vec<RelOp> = rops.iter().rev().map(|o| flip(*o)).collect();
            &flipped == gops && gt.iter().zip(rt.iter().rev()).all(|(x, y)| self.equiv(x, y))
        }
    }

    /// Whether `d1 = k·d2` for a constant k ≠ 0 (k > 0 when `positive`).
    fn proportional(&mut self, d1: &Expr, d2: &Expr, positive: bool) -> bool {
        let mut vars = BTreeSet::new();
        free_symbols(d1, &mut vars);
        free_symbols(d2, &mut vars);
        let points: Vec<HashMap<String, Value>> =
            if vars.is_empty() { vec![HashMap::new()] } else { random_points(&vars, d1, d2) };
        let mut k: Option<Complex64> = None;
        let mut agreed = 0;
        for env in points {
            let (Some(a), Some(b)) = (eval(d1, &env, &self.budget), eval(d2, &env, &self.budget)) else { continue };
            let (a, b) = (a.to_complex(), b.to_complex());
            let scale = 1f64.max(a.norm()).max(b.norm());
            if b.norm() <= 1e-12 * scale {
                if a.norm() > 1e-9 * scale {
                    return false;
                }
                agreed += 1;
                continue;
            }
            let ratio = a / b;
            match k {
                None => {
                    if ratio.norm() <= 1e-12 || (positive && (ratio.re <= 0.0 || ratio.im.abs() > 1e-9 * ratio.norm()))
                    {
                        return false;
                    }
                    k = Some(ratio);
                }
                Some(k) => {
                    if (ratio - k).norm() > POINT_TOLERANCE * k.norm().max(1.0) {
                        return false;
                    }
                }
            }
            agreed += 1;
        }
        agreed >= if vars.is_empty() { 1 } else { MIN_POINTS }
    }
}

/// Normal form of a relation: (expression, kind) meaning `expression ⋄ 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Eq,
    Ne,
    Pos,
    NonNeg,
}

impl Kind {
    fn positive_factor(self) -> bool {
        matches!(self, Kind::Pos | Kind::NonNeg)
    }
}

fn oriented(lhs: &Expr, op: RelOp, rhs: &Expr) -> Option<(Expr, Kind)> {
    let diff = |a: &Expr, b: &Expr| Expr::Add(vec![a.clone(), Expr::Neg(Box::new(b.clone()))]);
    Some(match op {
        RelOp::Eq => (diff(lhs, rhs), Kind::Eq),
        RelOp::Ne => (diff(lhs, rhs), Kind::Ne),
        RelOp::Gt => (diff(lhs, rhs), Kind::Pos),
        RelOp::Ge => (diff(lhs, rhs), Kind::NonNeg),
        RelOp::Lt => (diff(rhs, lhs), Kind::Pos),
        RelOp::Le => (diff(rhs, lhs), Kind::NonNeg),
        RelOp::In => return None,
    })
}

fn flip(op: RelOp) -> RelOp {
    match op {
        RelOp::Lt => RelOp::Gt,
        RelOp::Gt => RelOp::Lt,
        RelOp::Le => RelOp::Ge,
        RelOp::Ge => RelOp::Le,
        o => o,
    }
}

/// `a < x ≤ b`, `x > 2`, `x ≤ 5` in one variable as an interval.
fn inequality_as_interval(e: &Expr) -> Option<Expr> {
    let Expr::Relation(t, ops) = e else { return None };
    let inf = || Box::new(Expr::Inf);
    let neg_inf = || Box::new(Expr::Neg(Box::new(Expr::Inf)));
    match (t.as_slice(), ops.as_slice()) {
        ([lo, mid, hi], [a, b])
            if only_symbols(mid) && matches!(a, RelOp::Lt | RelOp::Le) && matches!(b, RelOp::Lt | RelOp::Le) =>
        {
            Some(Expr::Interval {
                lo: Box::new(lo.clone()),
                hi: Box::new(hi.clone()),
                lo_closed: *a == RelOp::Le,
                hi_closed: *b == RelOp::Le,
            })
        }
        ([hi, mid, lo], [a, b])
            if only_symbols(mid) && matches!(a, RelOp::Gt | RelOp::Ge) && matches!(b, RelOp::Gt | RelOp::Ge) =>
        {
            Some(Expr::Interval {
                lo: Box::new(lo.clone()),
                hi: Box::new(hi.clone()),
                lo_closed: *b == RelOp::Ge,
                hi_closed: *a == RelOp::Ge,
            })
        }
        ([Expr::Sym(_), v], [op]) | ([v, Expr::Sym(_)], [op]) => {
            let var_left = matches!(t[0], Expr::Sym(_));
            let op = if var_left { *op } else { flip(*op) };
            let v = Box::new(v.clone());
            match op {
                RelOp::Gt => Some(Expr::Interval { lo: v, hi: inf(), lo_closed: false, hi_closed: false }),
                RelOp::Ge => Some(Expr::Interval { lo: v, hi: inf(), lo_closed: true, hi_closed: false }),
                RelOp::Lt => Some(Expr::Interval { lo: neg_inf(), hi: v, lo_closed: false, hi_closed: false }),
                RelOp::Le => Some(Expr::Interval { lo: neg_inf(), hi: v, lo_closed: false, hi_closed: true }),
                _ => None,
            }
        }
        _ => None,
    }
}

fn is_structure(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Tuple(_)
            | Expr::List(_)
            | Expr::Set(_)
            | Expr::Interval { .. }
            | Expr::Union(_)
            | Expr::Matrix(_)
            | Expr::Relation(..)
            | Expr::Inf
    )
}

/// Lower-case letters and digits only: how text answers compare.
pub fn text_key(s: &str) -> String {
    s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()
}

/// Deterministic random rational points for the variables (seeded by the expressions, so a
/// verdict never changes between runs).
fn random_points(vars: &BTreeSet<String>, a: &Expr, b: &Expr) -> Vec<HashMap<String, Value>> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{a:?}|{b:?}").hash(&mut h);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(h.finish());
    (0..POINTS)
        .map(|_| {
            vars.iter()
                .map(|v| {
                    let mut n: i64 = rng.random_range(-30..=30);
                    if n == 0 {
                        n = 31;
                    }
                    let d: i64 = rng.random_range(1..=9);
                    (v.clone(), Value::Exact(CRat::real(rat(n, d))))
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::parse::{Budget, parse};

    fn eq(g: &str, r: &str) -> bool {
        let b = Budget::default();
        equivalent(&parse(g, &b).unwrap(), &parse(r, &b).unwrap())
    }

    #[test]
    fn numbers_and_expressions() {
        assert!(eq("\\frac{14}{3}", "14/3"));
        assert!(eq("0.15", "\\frac{3}{20}"));
        assert!(!eq("13535", "13536"));
        assert!(eq("3\\sqrt{13}", "\\sqrt{117}"));
        assert!(eq("6 - 5i", "-5i+6"));
        assert!(eq("x^3+3x-6", "-6+3x+x^3"));
        assert!(eq("(a+5)(b+2)", "(b+2)(a+5)"));
        assert!(!eq("x^3+3x-6", "x^3+3x+6"));
        assert!(eq("\\frac{11+9a}{20}", "\\frac{9a}{20}+\\frac{11}{20}"));
        assert!(eq("2k+2", "2(k+1)"));
        assert!(!eq("2k+2", "2j+2"));
    }

    #[test]
    fn structures() {
        assert!(eq("1,-2", "-2, 1"));
        assert!(eq("(6,31,-1)", "(6, 31, -1)"));
        assert!(!eq("(6,31,-1)", "(31,6,-1)"));
        assert!(eq("1 \\pm \\sqrt{19}", "1-\\sqrt{19}, 1+\\sqrt{19}"));
        assert!(eq("(3,4]", "(3, 4]"));
        assert!(!eq("(3,4]", "[3,4]"));
        assert!(eq("(-\\infty, 0] \\cup (2,3)", "(2,3) \\cup (-\\infty,0]"));
        assert!(eq(
            "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
            "\\begin{pmatrix} -\\frac13 \\\\ \\frac{2}{3} \\end{pmatrix}"
        ));
        assert!(eq("52_8", "52_{8}"));
        assert!(eq("52_8", "52"), "the numeral without its subscript");
        assert!(!eq("52_8", "42") && !eq("52", "52_8"));
    }

    #[test]
    fn relations() {
        assert!(eq("x=5", "5"));
        assert!(eq("5", "x = 5"));
        assert!(eq("y = 2x + 3", "y=3+2x"));
        assert!(eq("5x - 7y + 11z + 4 = 0", "-10x+14y-22z-8=0"));
        assert!(eq("k \\geqslant 2", "2 \\le k"));
        assert!(!eq("k \\geqslant 2", "k > 2"));
        assert!(eq("x > 2", "(2, \\infty)"));
        assert!(!eq("(2, \\infty)", "x > 2"));
        assert!(eq("x \\in [-2,7]", "[-2,7]"));
    }
}
