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
    hacpo grade --input cases.jsonl --mode boxed-exact > graded.jsonl\n  \
    hacpo grade --task qa --gold 'Steven Spielberg' --gold Spielberg --response 'spielberg'\n  \
    hacpo grade --task qa --input predictions.jsonl > scored.jsonl\n\n\
    Math: each input line is {\"gold\": …, \"response\": …}; the output line gains \"correct\".\n\
    QA (HotpotQA/SQuAD EM and F1, best over the aliases): each line is {\"prediction\": …,\n\
    \"answers\": […]}; the output line gains \"em\" and \"f1\". Other fields are copied; a summary\n\
    goes to stderr.")]
pub struct GradeArgs {
    /// math (a final answer against a LaTeX gold) or qa (a short answer against gold aliases).
    #[arg(long, default_value = "math")]
    pub task: String,
    /// The gold answer (LaTeX); with --task qa, repeat it for each alias.
    #[arg(long, requires = "response", conflicts_with = "input")]
    pub gold: Vec<String>,
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
    match args.task.as_str() {
        "math" => {}
        "qa" => return run_qa(&args),
        other => return Err(Error::InvalidArgument(format!("unknown --task {other:?}; use math or qa"))),
    }
    let grader = Grader::new(GradeMode::parse(&args.mode)?);
    match (args.gold.as_slice(), &args.response, &args.input) {
        ([g], Some(r), None) => {
            println!("{}", if grader.grade(g, r) { "correct" } else { "incorrect" });
            Ok(())
        }
        ([], None, Some(path)) => grade_file(&grader, path),
        ([_, _, ..], _, _) => Err(Error::InvalidArgument("a math answer has one --gold".into())),
        _ => Err(Error::InvalidArgument("give --gold and --response, or --input FILE".into())),
    }
}

fn run_qa(args: &GradeArgs) -> Result<()> {
    match (args.gold.as_slice(), &args.response, &args.input) {
        ([_, ..], Some(r), None) => {
            let s = hacpo::search::metric::score(r, &args.gold);
            println!("em {} f1 {:.4}", s.em, s.f1);
            Ok(())
        }
        ([], None, Some(path)) => grade_qa_file(path),
        _ => Err(Error::InvalidArgument("give --gold (one per alias) and --response, or --input FILE".into())),
    }
}

/// Opens `--input` (a file, or `-` for standard input).
fn open_input(path: &PathBuf) -> Result<Box<dyn BufRead>> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(std::io::BufReader::new(std::io::stdin())));
    }
    if path.is_dir() {
        return Err(Error::InvalidArgument(format!("--input {} is a directory; give a JSONL file", path.display())));
    }
    Ok(Box::new(std::io::BufReader::new(std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?)))
}

/// An input with no line to grade: a score of 0% would read as a result.
fn empty_input(name: &str, what: &str) -> Error {
    Error::InvalidArgument(format!("{name} holds no {what} (every line is blank); nothing was scored"))
}

fn line_error(name: &str, index: usize, message: String) -> Error {
    Error::config(name.to_string(), format!("line {}: {message}", index + 1))
}

/// Line `index` of an input file as a JSON object; `None` for a blank line.
fn json_object(
    name: &str,
    path: &std::path::Path,
    index: usize,
    line: std::io::Result<Vec<u8>>,
) -> Result<Option<serde_json::Map<String, Value>>> {
    let line = line.map_err(|e| Error::io("read", path, e))?;
    let line = String::from_utf8(line).map_err(|_| line_error(name, index, "not valid UTF-8".into()))?;
    if line.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str(&line).map_err(|e| line_error(name, index, format!("not valid JSON: {e}")))? {
        Value::Object(obj) => Ok(Some(obj)),
        _ => Err(line_error(name, index, "expected a JSON object".into())),
    }
}

/// A string field of an input line, or the error naming it.
fn string_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    field: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<&'a str> {
    match obj.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(bad(format!("field {field:?} must be a string, found {other}"))),
        None => Err(bad(format!("field {field:?} is missing"))),
    }
}

/// QA predictions, one line at a time (constant memory).
fn grade_qa_file(path: &PathBuf) -> Result<()> {
    let name = path.display().to_string();
    let reader = open_input(path)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let (mut n, mut em, mut f1) = (0usize, 0.0, 0.0);
    for (i, line) in reader.split(b'\n').enumerate() {
        let bad = |m: String| line_error(&name, i, m);
        let Some(mut obj) = json_object(&name, path, i, line)? else { continue };
        let prediction = string_field(&obj, "prediction", &bad)?.to_string();
        let answers: Vec<String> = match obj.get("answers") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|x| x.as_str().map(String::from))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("field \"answers\" must be a list of strings".into()))?,
            Some(Value::String(s)) => vec![s.clone()],
            _ => return Err(bad("field \"answers\" is missing or empty: give the gold answers as a list".into())),
        };
        let s = hacpo::search::metric::score(&prediction, &answers);
        obj.insert("em".into(), s.em.into());
        obj.insert("f1".into(), s.f1.into());
        writeln!(out, "{}", Value::Object(obj)).map_err(|e| Error::io("write", std::path::Path::new("stdout"), e))?;
        n += 1;
        em += s.em;
        f1 += s.f1;
    }
    out.flush().map_err(|e| Error::io("write", std::path::Path::new("stdout"), e))?;
    if n == 0 {
        return Err(empty_input(&name, "predictions"));
    }
    let d = n as f64;
    eprintln!("scored {n} predictions: EM {:.1}%, F1 {:.1}%", 100.0 * em / d, 100.0 * f1 / d);
    Ok(())
}

/// Cases graded together: the file streams through in blocks of this many lines, so memory
/// stays bounded whatever its size.
const BLOCK: usize = 4096;

fn grade_file(grader: &Grader, path: &PathBuf) -> Result<()> {
    let name = path.display().to_string();
    let reader = open_input(path)?;
    let started = Instant::now();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let (mut n, mut correct) = (0usize, 0usize);
    let mut rows: Vec<serde_json::Map<String, Value>> = Vec::with_capacity(BLOCK);
    let mut lines = reader.split(b'\n').enumerate().peekable();
    while lines.peek().is_some() {
        rows.clear();
        for (i, line) in lines.by_ref() {
            let bad = |m: String| line_error(&name, i, m);
            let Some(obj) = json_object(&name, path, i, line)? else { continue };
            for field in ["gold", "response"] {
                string_field(&obj, field, &bad)?;
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
    if n == 0 {
        return Err(empty_input(&name, "cases"));
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "graded {n} cases: {correct} correct ({:.1}%) in {:.3} s ({:.0} cases/s)",
        100.0 * correct as f64 / n as f64,
        seconds,
        n as f64 / seconds.max(1e-9)
    );
    Ok(())
}
