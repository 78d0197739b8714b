//! `hacpo grade`: grade one response, or a JSONL file of cases.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use hacpo::reward::{GradeMode, Grader};
use hacpo::{Error, Result};
use serde_json::Value;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo grade --gold '\\frac{14}{3}' --response 'so the answer is $\\boxed{\\dfrac{14}{3}}$'\n  \
    hacpo grade --input cases.jsonl --mode boxed-exact > graded.jsonl\n\n\
    Each input line is {\"gold\": …, \"response\": …}; other fields are copied to the output line,\n\
    which gains \"correct\": true|false. A summary goes to stderr.")]
pub struct GradeArgs {
    /// The gold answer (LaTeX).
    #[arg(long, requires = "response", conflicts_with = "input")]
    pub gold: Option<String>,
    /// The model's response (the answer is extracted from it).
    #[arg(long, requires = "gold")]
    pub response: Option<String>,
    /// A JSONL file of cases (`-` for standard input).
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// full (extraction + mathematical equivalence) or boxed-exact (verl math_reward).
    #[arg(long, default_value = "full")]
    pub mode: String,
}

pub fn run(args: GradeArgs) -> Result<()> {
    let grader = Grader::new(GradeMode::parse(&args.mode)?);
    match (&args.gold, &args.response, &args.input) {
        (Some(g), Some(r), None) => {
            println!("{}", if grader.grade(g, r) { "correct" } else { "incorrect" });
            Ok(())
        }
        (None, None, Some(path)) => grade_file(&grader, path),
        _ => Err(Error::InvalidArgument("give --gold and --response, or --input FILE".into())),
    }
}

/// Cases graded together: the file streams through in blocks of this many lines, so memory
/// stays bounded whatever its size.
const BLOCK: usize = 4096;

fn grade_file(grader: &Grader, path: &PathBuf) -> Result<()> {
    let name = path.display().to_string();
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        if path.is_dir() {
            return Err(Error::InvalidArgument(format!("--input {name} is a directory; give a JSONL file")));
        }
        Box::new(std::io::BufReader::new(std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?))
    };
    let started = Instant::now();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let (mut n, mut correct) = (0usize, 0usize);
    let mut rows: Vec<serde_json::Map<String, Value>> = Vec::with_capacity(BLOCK);
    let mut lines = reader.split(b'\n').enumerate().peekable();
    while lines.peek().is_some() {
        rows.clear();
        for (i, line) in lines.by_ref() {
            let bad = |m: String| Error::config(name.clone(), format!("line {}: {m}", i + 1));
            let line = line.map_err(|e| Error::io("read", path, e))?;
            let line = String::from_utf8(line).map_err(|_| bad("not valid UTF-8".into()))?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| bad(format!("not valid JSON: {e}")))?;
            let Value::Object(obj) = v else { return Err(bad("expected a JSON object".into())) };
            for field in ["gold", "response"] {
                match obj.get(field) {
                    Some(Value::String(_)) => {}
                    Some(other) => return Err(bad(format!("field {field:?} must be a string, found {other}"))),
                    None => return Err(bad(format!("field {field:?} is missing"))),
                }
            }
            rows.push(obj);
            if rows.len() == BLOCK {
                break;
            }
        }
        let cases: Vec<(&str, &str)> = rows
            .iter()
            .map(|o| (o["gold"].as_str().unwrap_or_default(), o["response"].as_str().unwrap_or_default()))
            .collect();
        let verdicts = grader.grade_batch(&cases);
        for (row, ok) in rows.iter_mut().zip(&verdicts) {
            row.insert("correct".into(), Value::Bool(*ok));
            writeln!(out, "{}", Value::Object(std::mem::take(row)))
                .map_err(|e| Error::io("write", std::path::Path::new("stdout"), e))?;
        }
        n += verdicts.len();
        correct += verdicts.iter().filter(|&&c| c).count();
    }
    out.flush().map_err(|e| Error::io("write", std::path::Path::new("stdout"), e))?;
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "graded {n} cases: {correct} correct ({:.1}%) in {:.3} s ({:.0} cases/s)",
        100.0 * correct as f64 / n.max(1) as f64,
        seconds,
        n as f64 / seconds.max(1e-9)
    );
    Ok(())
}
