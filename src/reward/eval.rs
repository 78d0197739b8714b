//! Evaluating expression trees: exact complex rationals where possible, complex f64 otherwise.
//!
//! Exactness matters for grading: `13535` and `13536` must never compare equal, and
//! `\frac{\sqrt2}{2}` must equal `\frac{1}{\sqrt2}`. Integers, fractions, decimals, `i`,
//! integer powers and perfect roots stay exact; π, e, irrational roots and functions fall back
//! to floating point. Work is bounded by a step budget and a size limit on exact numbers, so
//! `2^{10^{10}}` costs microseconds (it becomes an approximate ∞ and compares unequal).

use std::collections::HashMap;

use num_bigint::BigInt;
use num_complex::Complex64;
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use super::parse::Expr;

/// An exact complex rational.
#[derive(Clone, Debug, PartialEq)]
pub struct CRat {
    pub re: BigRational,
    pub im: BigRational,
}

impl CRat {
    pub fn real(re: BigRational) -> Self {
        CRat { re, im: BigRational::zero() }
    }

    pub fn is_real(&self) -> bool {
        self.im.is_zero()
    }

    pub fn is_zero(&self) -> bool {
        self.re.is_zero() && self.im.is_zero()
    }

    fn add(&self, o: &CRat) -> CRat {
        CRat { re: &self.re + &o.re, im: &self.im + &o.im }
    }

    fn mul(&self, o: &CRat) -> CRat {
        CRat { re: &self.re * &o.re - &self.im * &o.im, im: &self.re * &o.im + &self.im * &o.re }
    }

    fn neg(&self) -> CRat {
        CRat { re: -&self.re, im: -&self.im }
    }

    fn inv(&self) -> Option<CRat> {
        let d = &self.re * &self.re + &self.im * &self.im;
        if d.is_zero() {
            return None;
        }
        Some(CRat { re: &self.re / &d, im: -&self.im / &d })
    }

    fn bits(&self) -> u64 {
        [&self.re, &self.im].iter().map(|r| r.numer().bits() + r.denom().bits()).sum()
    }

    pub fn to_complex(&self) -> Complex64 {
        Complex64::new(self.re.to_f64().unwrap_or(f64::NAN), self.im.to_f64().unwrap_or(f64::NAN))
    }
}

/// A scalar value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Exact(CRat),
    Approx(Complex64),
}

impl Value {
    pub fn to_complex(&self) -> Complex64 {
        match self {
            Value::Exact(c) => c.to_complex(),
            Value::Approx(z) => *z,
        }
    }

    /// The exact integer this value is, if it is one.
    pub fn as_exact_integer(&self) -> Option<BigInt> {
        match self {
            Value::Exact(c) if c.is_real() && c.re.is_integer() => Some(c.re.to_integer()),
            _ => None,
        }
    }
}

/// Evaluation limits.
#[derive(Clone, Copy, Debug)]
pub struct EvalBudget {
    pub max_steps: usize,
    /// Exact numbers above this many bits fall back to floating point.
    pub max_bits: u64,
}

impl Default for EvalBudget {
    fn default() -> Self {
        EvalBudget { max_steps: 20_000, max_bits: 8192 }
    }
}

/// Evaluates `e` with variables bound by `env`. `None` for undefined results (division by
/// zero, unbound variable, non-scalar expression, exhausted budget).
pub fn eval(e: &Expr, env: &HashMap<String, Value>, budget: &EvalBudget) -> Option<Value> {
    Evaluator { env, steps: 0, budget: *budget }.eval(e)
}

struct Evaluator<'a> {
    env: &'a HashMap<String, Value>,
    steps: usize,
    budget: EvalBudget,
}

fn approx(v: &Value) -> Complex64 {
    v.to_complex()
}

fn int(n: i64) -> BigRational {
    BigRational::from_integer(BigInt::from(n))
}

impl Evaluator<'_> {
    fn bound(&self, c: CRat) -> Value {
        if c.bits() > self.budget.max_bits { Value::Approx(c.to_complex()) } else { Value::Exact(c) }
    }

    fn eval(&mut self, e: &Expr) -> Option<Value> {
        self.steps += 1;
        if self.steps > self.budget.max_steps {
            return None;
        }
        Some(match e {
            Expr::Num(r) => Value::Exact(CRat::real(r.clone())),
            Expr::Float(f) => Value::Approx(Complex64::new(*f, 0.0)),
            Expr::Sym(s) => self.env.get(s)?.clone(),
            Expr::Pi => Value::Approx(Complex64::new(std::f64::consts::PI, 0.0)),
            Expr::E => Value::Approx(Complex64::new(std::f64::consts::E, 0.0)),
            Expr::I => Value::Exact(CRat { re: BigRational::zero(), im: BigRational::one() }),
            Expr::Add(terms) => {
                let mut acc = Value::Exact(CRat::real(BigRational::zero()));
                for t in terms {
                    let v = self.eval(t)?;
                    acc = match (acc, v) {
                        (Value::Exact(a), Value::Exact(b)) => self.bound(a.add(&b)),
                        (a, b) => Value::Approx(approx(&a) + approx(&b)),
                    };
                }
                acc
            }
            Expr::Mul(factors) => {
                let mut acc = Value::Exact(CRat::real(BigRational::one()));
                for f in factors {
                    let v = self.eval(f)?;
                    acc = match (acc, v) {
                        (Value::Exact(a), Value::Exact(b)) => self.bound(a.mul(&b)),
                        (a, b) => Value::Approx(approx(&a) * approx(&b)),
                    };
                }
                acc
            }
            Expr::Neg(x) => match self.eval(x)? {
                Value::Exact(c) => Value::Exact(c.neg()),
                Value::Approx(z) => Value::Approx(-z),
            },
            Expr::Div(n, d) => {
                let (n, d) = (self.eval(n)?, self.eval(d)?);
                match (n, d) {
                    (Value::Exact(a), Value::Exact(b)) => self.bound(a.mul(&b.inv()?)),
                    (a, b) => {
                        let b = approx(&b);
                        if b.norm() == 0.0 {
                            return None;
                        }
                        Value::Approx(approx(&a) / b)
                    }
                }
            }
            Expr::Pow(b, x) => {
                let (b, x) = (self.eval(b)?, self.eval(x)?);
                self.pow(b, x)?
            }
            Expr::Factorial(n) => {
                let n = self.eval(n)?.as_exact_integer()?;
                let n = n.to_u64().filter(|&n| n <= 1000)?;
                let mut acc = BigInt::one();
                for k in 2..=n {
                    acc *= k;
                }
                self.bound(CRat::real(BigRational::from_integer(acc)))
            }
            Expr::Based { digits, base } => {
                let v = BigInt::parse_bytes(digits.as_bytes(), *base)?;
                Value::Exact(CRat::real(BigRational::from_integer(v)))
            }
            Expr::Func(name, args) => {
                let vals: Vec<Value> = args.iter().map(|a| self.eval(a)).collect::<Option<_>>()?;
                self.func(name, &vals)?
            }
            Expr::Inf
            | Expr::PlusMinus(..)
            | Expr::Tuple(_)
            | Expr::List(_)
            | Expr::Set(_)
            | Expr::Interval { .. }
            | Expr::Union(_)
            | Expr::Matrix(_)
            | Expr::Relation(..)
            | Expr::Text(_) => return None,
        })
    }

    fn pow(&mut self, b: Value, x: Value) -> Option<Value> {
        if let (Value::Exact(base), Value::Exact(exp)) = (&b, &x)
            && exp.is_real()
        {
            let (p, q) = (exp.re.numer().clone(), exp.re.denom().clone());
            // Exact integer powers within the size budget.
            if q.is_one() {
                let n = p.to_i64().filter(|n| n.abs() <= 100_000);
                if let Some(n) = n
                    && (base.bits().max(1) as i128) * (n.unsigned_abs() as i128) <= self.budget.max_bits as i128
                {
                    let mut acc = CRat::real(BigRational::one());
                    let mut sq = if n < 0 { base.inv()? } else { base.clone() };
                    let mut k = n.unsigned_abs();
                    while k > 0 {
                        if k & 1 == 1 {
                            acc = acc.mul(&sq);
                        }
                        sq = sq.mul(&sq);
                        k >>= 1;
                    }
                    return Some(self.bound(acc));
                }
            } else if base.is_real()
                && let (Some(q), Some(p)) = (q.to_u32().filter(|&q| q <= 64), p.to_i64().filter(|p| p.abs() <= 64))
            {
                // Perfect roots stay exact: 4^(1/2) = 2, (-8)^(1/3) = -2, (9/4)^(3/2) = 27/8.
                let r = &base.re;
                let neg = r.is_negative();
                if !neg || q % 2 == 1 {
                    let (num, den) = (r.numer().abs(), r.denom().clone());
                    let (rn, rd) = (num.nth_root(q), den.nth_root(q));
                    if num::pow(&rn, q) == num && num::pow(&rd, q) == den {
                        let root = BigRational::new(if neg { -rn } else { rn }, rd);
                        let root = CRat::real(root);
                        return self.pow(Value::Exact(root), Value::Exact(CRat::real(int(p))));
                    }
                }
                // Odd roots of negative reals are real (the principal complex root is not).
                if neg && q % 2 == 1 {
                    let v = -(-r.to_f64()?).powf(1.0 / q as f64);
                    return Some(Value::Approx(Complex64::new(v.powi(p as i32), 0.0)));
                }
            }
        }
        // Beyond the exact budget an exact base goes to f64, whose rounding (relative 1e-16) the
        // exponent multiplies: `(1+10^{-16})^{10^{16}}` would become 1^(10^16) = 1. When the
        // exponent is large enough for that error to show, the value is unknown, not a number.
        // (Bases 0, 1 and -1 are exact in f64 and stay.)
        if let Value::Exact(base) = &b {
            let trivial = base.is_real() && (base.re.is_zero() || base.re.abs().is_one());
            if !trivial && approx(&x).norm() > 1e6 {
                return None;
            }
        }
        let (b, x) = (approx(&b), approx(&x));
        if b.norm() == 0.0 {
            return if x.re > 0.0 { Some(Value::Approx(Complex64::new(0.0, 0.0))) } else { None };
        }
        let r = b.powc(x);
        // A power that underflowed to 0 (`e^{-1000}`), overflowed, or rounded to exactly 1 from a
        // base and exponent that are not trivial (`e^{10^{-17}}`) has lost its value.
        let lost = r.norm() == 0.0
            || !r.re.is_finite()
            || !r.im.is_finite()
            || (r == Complex64::new(1.0, 0.0) && x.norm() != 0.0 && b != Complex64::new(1.0, 0.0));
        (!lost).then_some(Value::Approx(r))
    }

    fn func(&mut self, name: &str, vals: &[Value]) -> Option<Value> {
        let one = |vals: &[Value]| (vals.len() == 1).then(|| approx(&vals[0]));
        let z = match name {
            "sin" => one(vals)?.sin(),
            "cos" => one(vals)?.cos(),
            "tan" => one(vals)?.tan(),
            "cot" => one(vals)?.tan().inv(),
            "sec" => one(vals)?.cos().inv(),
            "csc" => one(vals)?.sin().inv(),
            "arcsin" => one(vals)?.asin(),
            "arccos" => one(vals)?.acos(),
            "arctan" => one(vals)?.atan(),
            "sinh" => one(vals)?.sinh(),
            "cosh" => one(vals)?.cosh(),
            "tanh" => one(vals)?.tanh(),
            "ln" => one(vals)?.ln(),
            "lg" => one(vals)?.log10(),
            "exp" => one(vals)?.exp(),
            "log" => match vals {
                [x] => approx(x).ln(),
                [x, base] => approx(x).ln() / approx(base).ln(),
                _ => return None,
            },
            "abs" => match vals {
                [Value::Exact(c)] if c.is_real() => return Some(Value::Exact(CRat::real(c.re.abs()))),
                [v] => Complex64::new(approx(v).norm(), 0.0),
                _ => return None,
            },
            "floor" | "ceil" => match vals {
                [Value::Exact(c)] if c.is_real() => {
                    let r = if name == "floor" { c.re.floor() } else { c.re.ceil() };
                    return Some(Value::Exact(CRat::real(r)));
                }
                [v] => {
                    let x = approx(v).re;
                    Complex64::new(if name == "floor" { x.floor() } else { x.ceil() }, 0.0)
                }
                _ => return None,
            },
            "binom" => {
                let (n, k) = (vals.first()?.as_exact_integer()?, vals.get(1)?.as_exact_integer()?);
                let (n, k) = (n.to_u64().filter(|&n| n <= 5000)?, k.to_u64()?);
                if k > n {
                    return Some(Value::Exact(CRat::real(BigRational::zero())));
                }
                let mut acc = BigInt::one();
                for i in 0..k.min(n - k) {
                    acc = acc * (n - i) / (i + 1);
                }
                return Some(self.bound(CRat::real(BigRational::from_integer(acc))));
            }
            "gcd" | "lcm" => {
                let ints: Vec<BigInt> = vals.iter().map(Value::as_exact_integer).collect::<Option<_>>()?;
                let r = ints.into_iter().reduce(|a, b| if name == "gcd" { a.gcd(&b) } else { a.lcm(&b) })?;
                return Some(Value::Exact(CRat::real(BigRational::from_integer(r))));
            }
            "max" | "min" => {
                let reals: Vec<f64> = vals.iter().map(|v| approx(v).re).collect();
                let m = if name == "max" {
                    reals.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                } else {
                    reals.iter().cloned().fold(f64::INFINITY, f64::min)
                };
                // Return the exact argument that attains it.
                return vals.iter().find(|v| approx(v).re == m).cloned();
            }
            _ => return None,
        };
        z.is_finite().then_some(Value::Approx(z))
    }
}

/// How close two approximate values must be.
pub const REL_TOLERANCE: f64 = 1e-9;

/// Whether two values are equal: exactly when both are exact, else within [`REL_TOLERANCE`]
/// relative, and never two different integers (an exact integer only matches a value within
/// 0.5 of it, so no tolerance can equate 13535 and 13536).
pub fn values_equal(a: &Value, b: &Value, rel: f64) -> bool {
    if let (Value::Exact(x), Value::Exact(y)) = (a, b) {
        return x == y;
    }
    let (x, y) = (a.to_complex(), b.to_complex());
    if !(x.is_finite() && y.is_finite()) {
        return false;
    }
    let scale = 1f64.max(x.norm()).max(y.norm());
    if (x - y).norm() > rel * scale {
        return false;
    }
    for (int, other) in [(a, y), (b, x)] {
        if let Some(n) = int.as_exact_integer()
            && let Some(n) = n.to_f64()
            && (other - Complex64::new(n, 0.0)).norm() >= 0.5
        {
            return false;
        }
    }
    true
}

mod num {
    pub fn pow(b: &num_bigint::BigInt, e: u32) -> num_bigint::BigInt {
        num_traits::pow(b.clone(), e as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::parse::{Budget, parse};

    fn v(s: &str) -> Value {
        eval(&parse(s, &Budget::default()).unwrap(), &HashMap::new(), &EvalBudget::default()).unwrap()
    }

    #[test]
    fn exact_where_possible() {
        assert_eq!(v("\\frac{6}{4}"), v("1.5"));
        assert_eq!(v("\\sqrt{16}"), v("4"));
        assert_eq!(v("\\sqrt[3]{-8}"), v("-2"));
        assert_eq!(v("(2+i)(2-i)"), v("5"));
        assert_eq!(v("2^{10}"), v("1024"));
        assert_eq!(v("5!"), v("120"));
        assert_eq!(v("52_8"), v("42"));
        assert_eq!(v("\\binom{6}{2}"), v("15"));
        assert!(matches!(v("\\sqrt2"), Value::Approx(_)));
    }

    #[test]
    fn equality_never_merges_distinct_integers() {
        let tol = REL_TOLERANCE;
        assert!(!values_equal(&v("13535"), &v("13536"), tol));
        assert!(!values_equal(&v("1234567890123"), &v("1234567890124"), tol));
        assert!(values_equal(&v("\\frac{\\sqrt2}{2}"), &v("\\frac{1}{\\sqrt2}"), tol));
        assert!(values_equal(&v("\\log_2 8"), &v("3"), tol));
        assert!(!values_equal(&v("\\frac13"), &v("0.333333"), tol));
    }

    #[test]
    fn huge_numbers_fall_back_to_floating_point_or_are_unknown() {
        let none =
            |s: &str| eval(&parse(s, &Budget::default()).unwrap(), &HashMap::new(), &EvalBudget::default()).is_none();
        assert!(matches!(v("e^{100}"), Value::Approx(_)));
        // Beyond f64 (overflow, underflow) or where f64 rounding decides the value: unknown,
        // never a number that would equal another (`2^{10^{10}}` = `3^{10^{10}}` = inf).
        assert!(none("2^{10^{10}}") && none("10^{100000}") && none("e^{-1000}"));
        assert!(none("(1+10^{-16})^{10^{16}}") && none("e^{10^{-17}}"));
        assert!(matches!(v("1^{10^{16}}"), Value::Exact(_)) || matches!(v("1^{10^{16}}"), Value::Approx(_)));
        // 1000! is exact but too large to take a factorial of again.
        assert!(
            eval(&parse("(1000!)!", &Budget::default()).unwrap(), &HashMap::new(), &EvalBudget::default()).is_none()
        );
    }
}
