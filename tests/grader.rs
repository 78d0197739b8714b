//! The grader against MATH-500's golds (`../shared/data/math/math500_test.jsonl`): every gold
//! matches itself, equivalent re-renderings match, off-by-one integers and other problems'
//! answers do not.

mod common;

use hacpo::reward::{GradeMode, Grader};

fn golds() -> Vec<String> {
    let text = std::fs::read_to_string(common::shared("data/math/math500_test.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["answer"].as_str().unwrap().to_string())
        .collect()
}

/// Top-level `+`/`-` split of a LaTeX sum (outside braces and brackets), signs kept.
fn top_level_terms(s: &str) -> Vec<String> {
    let mut terms = vec![];
    let mut depth = 0i32;
    let mut cur = String::new();
    for (i, c) in s.char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            '+' | '-'
                if depth == 0
                    && i > 0
                    && !s[..i].trim_end().ends_with(['^', '_', '(', ',', '='])
                    && !cur.trim().is_empty() =>
            {
                terms.push(cur.trim().to_string());
                cur = String::new();
            }
            _ => {}
        }
        cur.push(c);
    }
    terms.push(cur.trim().to_string());
    terms
}

/// Equivalent renderings of a gold (each must be graded correct).
fn renderings(gold: &str) -> Vec<String> {
    let mut out = vec![];
    let g = gold.trim();
    if g.contains("\\frac") {
        out.push(g.replace("\\frac", "\\dfrac"));
        out.push(g.replace("\\frac", "\\tfrac"));
    }
    if g.contains(' ') {
        out.push(g.replace(' ', ""));
    }
    out.push(format!("${g}$"));
    // Decimal for a terminating fraction \frac{a}{b}.
    if let Some(rest) = g.strip_prefix("\\frac{").or_else(|| g.strip_prefix("-\\frac{")) {
        let neg = g.starts_with('-');
        if let Some((a, b)) = rest.strip_suffix('}').and_then(|r| r.split_once("}{"))
            && let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>())
        {
            let mut d = b;
            while d % 2 == 0 {
                d /= 2;
            }
            while d % 5 == 0 {
                d /= 5;
            }
            if d == 1 {
                let v = a as f64 / b as f64;
                let s = format!(
                    "{}{}",
                    if neg { "-" } else { "" },
                    format!("{v:.12}").trim_end_matches('0').trim_end_matches('.')
                );
                out.push(s);
                out.push(format!("{}{a}/{b}", if neg { "-" } else { "" }));
            }
        }
    }
    // "x = " prefix on scalar answers.
    if (!g.contains(['=', ',', '\\']) || g.starts_with("\\frac") || g.starts_with("\\sqrt"))
        && !g.contains('=')
        && !g.contains(',')
        && !g.contains("\\text")
    {
        out.push(format!("x = {g}"));
    }
    // Reordered sums.
    let terms = top_level_terms(g);
    if terms.len() > 1
        && !g.contains(['=', ',', '<', '>'])
        && !g.contains("\\pm")
        && !g.contains("\\begin")
        && !g.contains("\\cup")
    {
        let mut rev: Vec<String> = terms.iter().rev().cloned().collect();
        let first = rev[0].clone();
        rev[0] = first.trim_start_matches('+').trim().to_string();
        let mut s = rev[0].clone();
        for t in &rev[1..] {
            if t.starts_with('-') || t.starts_with('+') {
                s.push_str(&format!(" {t}"));
            } else {
                s.push_str(&format!(" + {t}"));
            }
        }
        out.push(s);
    }
    // Reordered products: "3\sqrt{13}" → "\sqrt{13} \cdot 3".
    let digits: String = g.chars().take_while(|c| c.is_ascii_digit()).collect();
    if !digits.is_empty()
        && digits.len() < g.len()
        && g[digits.len()..].starts_with("\\sqrt")
        && !g.contains(['+', '-', ','])
    {
        out.push(format!("{} \\cdot {digits}", g[digits.len()..].trim()));
    }
    // Thousands separators.
    if let Ok(n) = g.parse::<u64>()
        && n >= 10_000
    {
        let s = n.to_string();
        let mut with = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                with.push(',');
            }
            with.push(c);
        }
        out.push(with);
    }
    // \left( … \right) around tuples and intervals.
    if (g.starts_with('(') || g.starts_with('[')) && !g.contains("\\left") && !g.contains("\\cup") {
        let open = &g[..1];
        let close = &g[g.len() - 1..];
        out.push(format!("\\left{open} {} \\right{close}", &g[1..g.len() - 1]));
    }
    out
}

/// A plain number's value (integers, decimals, \frac{a}{b}) for skipping equal pairs.
fn plain_value(g: &str) -> Option<f64> {
    let g = g.trim().replace("\\!", "").replace(",", "").replace("\\dfrac", "\\frac");
    // "x=5" is the value 5.
    let g = match g.split_once('=') {
        Some((lhs, rhs)) if lhs.trim().len() == 1 => rhs.trim().to_string(),
        _ => g,
    };
    if let Ok(v) = g.parse::<f64>() {
        return Some(v);
    }
    let (neg, rest) = g.strip_prefix('-').map(|r| (true, r)).unwrap_or((false, &g));
    let (a, b) = rest.strip_prefix("\\frac{")?.strip_suffix('}')?.split_once("}{")?;
    let v = a.parse::<f64>().ok()? / b.parse::<f64>().ok()?;
    Some(if neg { -v } else { v })
}

#[test]
fn every_gold_matches_itself_in_a_sentence() {
    let g = Grader::default();
    let wrappers: [fn(&str) -> String; 5] = [
        |a| format!("Putting it together, the answer is $\\boxed{{{a}}}$."),
        |a| format!("Therefore, the final answer is ${a}$. I hope it is correct."),
        |a| format!("We simplify step by step.\n\nThe answer is ${a}$."),
        |a| format!("Reasoning...\nAnswer: {a}"),
        |a| format!("<think>scratch work, maybe \\boxed{{0}}</think>\nSo we get $\\boxed{{{a}}}$"),
    ];
    let mut failures = vec![];
    for gold in golds() {
        for (i, wrap) in wrappers.iter().enumerate() {
            if !g.grade(&gold, &wrap(&gold)) {
                failures.push(format!("wrapper {i}: {gold:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} gold/wrapper pairs do not match:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn equivalent_renderings_are_accepted() {
    let g = Grader::default();
    let mut total = 0;
    let mut failures = vec![];
    for gold in golds() {
        for r in renderings(&gold) {
            total += 1;
            if !g.grade(&gold, &format!("So the final answer is \\boxed{{{r}}}.")) {
                failures.push(format!("{gold:?} ← {r:?}"));
            }
        }
    }
    assert!(total > 700, "only {total} renderings");
    assert!(failures.is_empty(), "{} of {total} renderings rejected:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn off_by_one_integers_and_other_answers_are_rejected() {
    let g = Grader::default();
    let golds = golds();
    let mut total = 0;
    let mut failures = vec![];
    for (i, gold) in golds.iter().enumerate() {
        if let Ok(n) = gold.trim().parse::<i64>() {
            for wrong in [n - 1, n + 1] {
                total += 1;
                if g.grade(gold, &format!("\\boxed{{{wrong}}}")) {
                    failures.push(format!("{gold:?} accepted {wrong}"));
                }
            }
        }
        for step in [1, 7, 101] {
            let other = &golds[(i + step) % golds.len()];
            let same_value = matches!((plain_value(gold), plain_value(other)), (Some(a), Some(b)) if a == b);
            let same_text = gold.replace(' ', "") == other.replace(' ', "");
            if same_value || same_text {
                continue;
            }
            total += 1;
            if g.grade(gold, &format!("\\boxed{{{other}}}")) {
                failures.push(format!("{gold:?} accepted {other:?}"));
            }
        }
    }
    assert!(total > 1500, "only {total} negatives");
    assert!(failures.is_empty(), "{} of {total} wrong answers accepted:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn boxed_exact_mode_is_verl_math_reward() {
    let g = Grader::new(GradeMode::BoxedExact);
    // Every gold matches its own box; a \dfrac rendering too; a decimal rendering does not.
    for gold in golds() {
        assert!(g.grade(&gold, &format!("$\\boxed{{{gold}}}$")), "{gold}");
    }
    assert!(g.grade("\\frac{14}{3}", "\\boxed{\\dfrac{14}{3}}"));
    assert!(!g.grade("\\frac{1}{4}", "\\boxed{0.25}"));
    assert!(!g.grade("5", "The answer is 5."));
}

/// Hand-written pairs: (gold, boxed answer, expected verdict).
const CASES: &[(&str, &str, bool)] = &[
    // fractions, decimals, radicals
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", true),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt3}", true),
    ("\\frac{\\sqrt{3}}{3}", "\\sqrt{3}/3", true),
    ("\\frac{3}{56}", "3/56", true),
    ("\\frac{14}{3}", "4\\frac{2}{3}", true),
    ("\\frac{14}{3}", "4.67", false),
    ("1\\frac{4}{5}", "1.8", true),
    ("137 \\frac{1}{2}", "137.5", true),
    ("\\frac{9}{256}", "0.03515625", true),
    ("0.15", "\\frac{3}{20}", true),
    (".0000672", "6.72 \\times 10^{-5}", true),
    ("\\frac{1}{3}", "0.3333", false),
    ("11\\sqrt2", "\\sqrt{242}", true),
    ("3\\sqrt{13}", "\\sqrt{13} \\cdot 3", true),
    ("\\frac{3\\sqrt{3}}{4}", "\\frac{3}{4}\\sqrt{3}", true),
    ("2\\sqrt{113}", "2 \\sqrt {113}", true),
    ("-\\frac{\\pi}{6}", "-\\pi/6", true),
    ("-\\frac{\\pi}{6}", "\\frac{-\\pi}{6}", true),
    ("\\pi", "3.14", false),
    ("288 \\pi", "288\\pi", true),
    ("\\frac{20000}{\\pi}", "20000/\\pi", true),
    // integers, formatting
    ("13535", "13536", false),
    ("10,\\!080", "10080", true),
    ("10,\\!080", "10{,}080", true),
    ("58,500", "58500", true),
    ("\\$32,\\!348", "32348", true),
    ("\\$18.90", "18.9", true),
    ("2000", "2,000", true),
    ("90^\\circ", "90", true),
    ("90^\\circ", "90°", true),
    ("90^\\circ", "90 degrees", true),
    ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}", true),
    ("25\\%", "25", true),
    ("5.4 \\text{ cents}", "5.4", true),
    ("864 \\mbox{ inches}^2", "864", true),
    ("15\\mbox{ cm}^2", "15 \\text{cm}^2", true),
    ("x=5", "5", true),
    ("5", "x=5", true),
    ("4", "x = 4", true),
    // bases
    ("52_8", "52", false),
    ("52_8", "52_{8}", true),
    ("4210_{5}", "4210_5", true),
    ("40_9", "41_9", false),
    // complex numbers
    ("6 - 5i", "-5i + 6", true),
    ("6 - 5i", "6 + 5i", false),
    ("1+2i", "2i+1", true),
    // polynomials and expressions
    ("x^5 - x^4 + x^3 - x^2 + x - 1", "-1 + x - x^2 + x^3 - x^4 + x^5", true),
    ("(a+5)(b+2)", "(b+2)(a+5)", true),
    ("6r^2-4r-24", "2(3r^2-2r-12)", true),
    ("6r^2-4r-24", "6r^2-4r+24", false),
    ("p - q", "-q+p", true),
    ("p - q", "q - p", false),
    ("2k+2", "2(k+1)", true),
    ("\\frac{11+9a}{20}", "\\frac{9a+11}{20}", true),
    ("\\cot x", "\\frac{\\cos x}{\\sin x}", true),
    ("3R^2", "3 R^{2}", true),
    ("8n^2 + 4n + 1", "1+4n+8n^2", true),
    // lists, sets, tuples
    ("1,-2", "-2, 1", true),
    ("1,-2", "1", false),
    ("3, 5, 7", "\\{3, 5, 7\\}", true),
    ("3, 5, 7", "7, 5, 3", true),
    ("(6,31,-1)", "(6, 31, -1)", true),
    ("(6,31,-1)", "(-1, 31, 6)", false),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", true),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)", false),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}", true),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}", false),
    ("\\{1\\pm\\sqrt{5},-2\\}", "-2, 1-\\sqrt5, 1+\\sqrt5", true),
    ("3 \\pm 2 \\sqrt{2}", "3\\pm2\\sqrt2", true),
    ("(1,-16,-4,43)", "(1, -16, -4, 43)", true),
    // intervals
    ("(3,4]", "\\left(3, 4\\right]", true),
    ("(3,4]", "(3,4)", false),
    ("(3,4]", "3 < x \\le 4", false),
    ("(-\\infty, 0]", "(-\\infty,0]", true),
    ("(2,\\infty)", "(2, \\infty)", true),
    ("(0,9) \\cup (9,36)", "(9,36) \\cup (0,9)", true),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(-\\infty,2)\\cup(3,\\infty)", true),
    ("x \\in [-2,7]", "[-2, 7]", true),
    ("\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "[\\pi^2/8, 5\\pi^2/4]", true),
    // matrices and vectors
    (
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        "\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}",
        true,
    ),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{bmatrix} -1 & 0 \\\\ 0 & -1 \\end{bmatrix}", true),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix} 1 & 0 \\\\ 0 & -1 \\end{pmatrix}", false),
    ("\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}", "(-2, -14, -7)", true),
    // equations and inequalities
    ("y = 2x + 3", "y=3+2x", true),
    ("y = 2x + 3", "2x + 3 = y", true),
    ("y = -2x", "y = 2x", false),
    ("5x - 7y + 11z + 4 = 0", "-5x + 7y - 11z - 4 = 0", true),
    ("5x - 7y + 11z + 4 = 0", "5x - 7y + 11z - 4 = 0", false),
    // text and choices
    ("\\text{Evelyn}", "Evelyn", true),
    ("\\text{Evelyn}", "\\text{Navin}", false),
    ("\\text{east}", "\\text{East}", true),
    ("\\text{(C)}", "(C)", true),
    ("\\text{(C)}", "C", true),
    ("\\text{(C)}", "\\text{(E)}", false),
    ("\\text{even}", "\\text{odd}", false),
];

#[test]
fn hand_written_equivalences() {
    let g = Grader::default();
    let failures: Vec<String> = CASES
        .iter()
        .filter(|(gold, answer, want)| g.grade(gold, &format!("The answer is $\\boxed{{{answer}}}$.")) != *want)
        .map(|(gold, answer, want)| format!("{gold:?} vs {answer:?}: expected {want}"))
        .collect();
    assert!(failures.is_empty(), "{} of {} cases wrong:\n{}", failures.len(), CASES.len(), failures.join("\n"));
}

/// Random and adversarial inputs: grading returns (work budgets, no timeouts) and never
/// panics. The slowest case is printed, not asserted: timings belong in benchmarks.
#[test]
fn adversarial_and_random_inputs_never_panic() {
    use rand::{Rng, SeedableRng};
    let g = Grader::default();
    let mut inputs: Vec<String> = vec![
        "\\frac{".repeat(5000) + "1" + &"}".repeat(5000),
        "(".repeat(100_000) + "1" + &")".repeat(100_000),
        "\\sqrt{".repeat(20_000),
        "{".repeat(200_000),
        "2^{2^{2^{2^{2^{100}}}}}".into(),
        "10^{10^{10}}".into(),
        "9999999999!".into(),
        "(10^{400})!".into(),
        "1e999999999".into(),
        "\\binom{100000}{50000}".into(),
        "x^{10^{9}}".into(),
        "1+".repeat(500_000) + "1",
        format!("\\boxed{{{}}}", "x".repeat(1_000_000)),
        "\\boxed{".repeat(100_000),
        "\\boxed{1}".repeat(100_000),
        "\\begin{pmatrix}".repeat(1000) + &"1 & 2 \\\\ ".repeat(1000),
        "\\left(".repeat(10_000),
        "Ω≤≥∞√π±°—\u{0130}\u{1F600}".repeat(1000),
        "final answer is ".repeat(10_000),
        "</think>".repeat(10_000),
        "#### ".repeat(10_000),
    ];
    let atoms = [
        "\\frac",
        "{",
        "}",
        "\\sqrt",
        "^",
        "_",
        "(",
        ")",
        "[",
        "]",
        "\\{",
        "\\}",
        "1",
        "23",
        "0.5",
        "x",
        "y",
        "\\pi",
        "e",
        "i",
        "+",
        "-",
        "\\cdot",
        "/",
        "=",
        "<",
        "\\le",
        ",",
        "\\pm",
        "\\infty",
        "\\cup",
        "\\text{a}",
        "!",
        "|",
        "\\left(",
        "\\right)",
        "\\begin{pmatrix}",
        "\\end{pmatrix}",
        "&",
        "\\\\",
        "\\boxed{",
        "\\sin",
        "\\log_",
        "%",
        "$",
        " ",
        "\\%",
        "°",
        "9^{99999}",
        "e9",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    for _ in 0..20_000 {
        let n = rng.random_range(1..60);
        inputs.push((0..n).map(|_| atoms[rng.random_range(0..atoms.len())]).collect());
    }
    let mut slowest = (0.0, String::new());
    for (i, s) in inputs.iter().enumerate() {
        let other = &inputs[(i * 7919) % inputs.len()];
        let t = std::time::Instant::now();
        let _ = g.grade(s, s);
        let _ = g.grade(s, other);
        let _ = g.grade(other, &format!("\\boxed{{{s}}}"));
        let _ = Grader::new(GradeMode::BoxedExact).grade(s, other);
        let dt = t.elapsed().as_secs_f64();
        if dt > slowest.0 {
            slowest = (dt, s.chars().take(60).collect());
        }
    }
    eprintln!("{} inputs graded; slowest {:.1} ms: {:?}…", inputs.len(), slowest.0 * 1e3, slowest.1);
}
