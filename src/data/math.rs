//! Math benchmark readers: GSM8K, MATH-500, MATH train, AIME24, AIME25, AMC23, Minerva,
//! OlympiadBench.
//!
//! A benchmark is loaded from, in order: an explicit path (`--bench math500=/data/test.jsonl`
//! or `=hf://datasets/<repo>[@<revision>]/<file>`), `$HACPO_DATA_DIR/<file>`,
//! `$HACPO_SHARED/data/math/<file>`, or the benchmark's JSON Lines file on the Hugging Face hub
//! ([`Benchmark::hub_file`]): from the hub cache (`$HF_HOME/hub`), else downloaded unless
//! `HF_HUB_OFFLINE=1`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::reward::extract::last_box;

/// One problem with its gold answer (LaTeX or plain text).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MathProblem {
    pub id: String,
    pub question: String,
    pub answer: String,
}

/// The supported benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Benchmark {
    Gsm8k,
    Math500,
    MathTrain,
    Aime24,
    Aime25,
    Amc23,
    Minerva,
    Olympiad,
}

impl Benchmark {
    pub const ALL: [Benchmark; 8] = [
        Benchmark::Gsm8k,
        Benchmark::Math500,
        Benchmark::MathTrain,
        Benchmark::Aime24,
        Benchmark::Aime25,
        Benchmark::Amc23,
        Benchmark::Minerva,
        Benchmark::Olympiad,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Benchmark::Gsm8k => "gsm8k",
            Benchmark::Math500 => "math500",
            Benchmark::MathTrain => "math_train",
            Benchmark::Aime24 => "aime24",
            Benchmark::Aime25 => "aime25",
            Benchmark::Amc23 => "amc23",
            Benchmark::Minerva => "minerva",
            Benchmark::Olympiad => "olympiad",
        }
    }

    pub fn parse(name: &str) -> Result<Self> {
        let n = name.to_lowercase().replace('-', "_");
        Benchmark::ALL
            .into_iter()
            .find(|b| {
                b.name() == n
                    || (n == "math_500" && *b == Benchmark::Math500)
                    || (n == "olympiadbench" && *b == Benchmark::Olympiad)
            })
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown benchmark {name:?}; known: {}",
                    Benchmark::ALL.map(|b| b.name()).join(", ")
                ))
            })
    }

    /// The file name in a data directory (the names of `tests/shared/data/math`).
    pub fn file_name(self) -> &'static str {
        match self {
            Benchmark::Gsm8k => "gsm8k_test.jsonl",
            Benchmark::Math500 => "math500_test.jsonl",
            Benchmark::MathTrain => "math_train_answers.json",
            Benchmark::Aime24 => "aime24_test.jsonl",
            Benchmark::Aime25 => "aime25_test.jsonl",
            Benchmark::Amc23 => "amc23_test.jsonl",
            Benchmark::Minerva => "minerva_math_test.jsonl",
            Benchmark::Olympiad => "olympiadbench_test.jsonl",
        }
    }

    /// The benchmark's JSON Lines file on the Hugging Face hub, with the schema [`Self::row`]
    /// reads. Copies of the Qwen2.5-Math evaluation data (`HuggingFaceTB/math_tasks`, the files
    /// of `tests/shared/data/math` byte for byte, except GSM8K's extra `idx`) are pinned to the
    /// revision lighteval pins; `math_train` there is MATH's train split with solutions (answers
    /// from the last `\boxed{}`: about 7,500 rows where rllm's file has 7,474).
    pub fn hub_file(self) -> HubFile {
        const MATH_TASKS: (&str, Option<&str>) =
            ("HuggingFaceTB/math_tasks", Some("3d34f1076f279000b9315583dcdacfd288898283"));
        let ((repo, revision), file) = match self {
            Benchmark::Gsm8k => (MATH_TASKS, "data/gsm8k/test.jsonl"),
            Benchmark::Math500 => (("HuggingFaceH4/MATH-500", None), "test.jsonl"),
            Benchmark::MathTrain => (MATH_TASKS, "data/math/train.jsonl"),
            Benchmark::Aime24 => (MATH_TASKS, "data/aime24/test.jsonl"),
            Benchmark::Aime25 => (("math-ai/aime25", Some("563bb8404243c5f09de6ec262f2db674fe5bce9b")), "test.jsonl"),
            Benchmark::Amc23 => (MATH_TASKS, "data/amc23/test.jsonl"),
            Benchmark::Minerva => (("svc-huggingface/minerva-math", None), "test.jsonl"),
            Benchmark::Olympiad => (MATH_TASKS, "data/olympiadbench/test.jsonl"),
        };
        HubFile { repo: repo.into(), file: file.into(), revision: revision.map(String::from) }
    }

    /// Whether decimal golds are approximate (physics answers): grade at the gold's precision.
    pub fn approximate_answers(self) -> bool {
        self == Benchmark::Minerva
    }

    /// The problem of one row; errors name the missing field.
    fn row(self, v: &Value, index: usize) -> std::result::Result<MathProblem, String> {
        let field = |k: &str| v.get(k).filter(|x| !x.is_null());
        let text = |k: &str| -> std::result::Result<String, String> {
            match field(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!("field {k:?} is not a string ({other})")),
                None => Err(format!("field {k:?} is missing")),
            }
        };
        let id = field("id")
            .or(field("unique_id"))
            .or(field("idx"))
            .map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string()))
            .unwrap_or_else(|| index.to_string());
        let question = match self {
            Benchmark::Gsm8k | Benchmark::Olympiad => text("question")?,
            Benchmark::Amc23 | Benchmark::Aime24 => text("problem").or_else(|_| text("question"))?,
            _ => text("problem")?,
        };
        let answer = match self {
            Benchmark::Gsm8k => {
                let a = text("answer")?;
                let (_, last) = a.rsplit_once("####").ok_or("field \"answer\" has no \"#### N\" line")?;
                last.trim().replace(',', "")
            }
            Benchmark::Math500 | Benchmark::MathTrain => match text("answer") {
                Ok(a) => a,
                Err(e) => last_box(&text("solution").map_err(|_| e)?).ok_or("no \\boxed{} in field \"solution\"")?,
            },
            Benchmark::Aime24 | Benchmark::Aime25 => match field("answer") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => return Err("field \"answer\" is missing".into()),
            },
            Benchmark::Amc23 => match field("answer") {
                Some(Value::Number(n)) => format_number(n.as_f64().ok_or("field \"answer\" is not a number")?),
                Some(Value::String(s)) => s.parse::<f64>().map(format_number).unwrap_or_else(|_| s.clone()),
                _ => return Err("field \"answer\" is missing".into()),
            },
            Benchmark::Minerva => last_box(&text("solution")?).ok_or("no \\boxed{} in field \"solution\"")?,
            Benchmark::Olympiad => match field("final_answer") {
                Some(Value::Array(items)) if !items.is_empty() => items
                    .iter()
                    .map(|x| x.as_str().map(|s| s.trim().trim_matches('$').trim().to_string()))
                    .collect::<Option<Vec<_>>>()
                    .ok_or("field \"final_answer\" must be a list of strings")?
                    .join(", "),
                _ => return Err("field \"final_answer\" is missing or empty".into()),
            },
        };
        let question = match (self, field("context").and_then(Value::as_str)) {
            (Benchmark::Olympiad, Some(ctx)) if ctx != "None" && !ctx.trim().is_empty() => format!("{ctx}\n{question}"),
            _ => question,
        };
        Ok(MathProblem { id, question, answer })
    }
}

/// `27.0` → `27`, `2.5` → `2.5`.
fn format_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 { format!("{}", x as i64) } else { x.to_string() }
}

/// A file of a dataset repository on the Hugging Face hub.
#[derive(Clone, Debug, PartialEq)]
pub struct HubFile {
    pub repo: String,
    pub file: String,
    /// A branch, tag or commit; `main` when `None`.
    pub revision: Option<String>,
}

impl std::fmt::Display for HubFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.revision {
            Some(r) => write!(f, "hf://datasets/{}@{r}/{}", self.repo, self.file),
            None => write!(f, "hf://datasets/{}/{}", self.repo, self.file),
        }
    }
}

/// Where a benchmark's file comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Path(PathBuf),
    Hub(HubFile),
}

impl Source {
    /// `hf://datasets/<owner>/<name>[@<revision>]/<file>` or a path.
    pub fn parse(s: &str) -> Result<Self> {
        let Some(rest) = s.strip_prefix("hf://datasets/") else { return Ok(Source::Path(PathBuf::from(s))) };
        let mut parts = rest.splitn(3, '/');
        let (owner, name, file) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (name, revision) = match name.split_once('@') {
            Some((n, r)) => (n, Some(r.to_string())),
            None => (name, None),
        };
        if owner.is_empty() || name.is_empty() || file.is_empty() || revision.as_deref() == Some("") {
            return Err(Error::InvalidArgument(format!(
                "{s:?} is not a hub file; write hf://datasets/<owner>/<name>/<file> \
                 (optionally <name>@<revision>), e.g. hf://datasets/HuggingFaceH4/MATH-500/test.jsonl"
            )));
        }
        Ok(Source::Hub(HubFile { repo: format!("{owner}/{name}"), file: file.into(), revision }))
    }
}

/// The local copies searched before the hub: `$HACPO_DATA_DIR/<file>`, then
/// `$HACPO_SHARED/data/math/<file>`.
fn local_copy(bench: Benchmark) -> Option<PathBuf> {
    ["HACPO_DATA_DIR", "HACPO_SHARED"].into_iter().find_map(|var| {
        let dir = PathBuf::from(std::env::var_os(var)?);
        let dir = if var == "HACPO_SHARED" { dir.join("data/math") } else { dir };
        let p = dir.join(bench.file_name());
        p.is_file().then_some(p)
    })
}

/// The cached copy of `hub` (hf-hub's cache layout, shared with Python's `huggingface_hub`),
/// else a download unless `HF_HUB_OFFLINE` is set.
fn fetch_hub(bench: Option<Benchmark>, hub: &HubFile) -> Result<PathBuf> {
    let cache = hf_hub::Cache::from_env();
    let revision = hub.revision.clone().unwrap_or_else(|| "main".into());
    let dataset = hf_hub::Repo::with_revision(hub.repo.clone(), hf_hub::RepoType::Dataset, revision.clone());
    if let Some(p) = cache.repo(dataset.clone()).get(&hub.file) {
        return Ok(p);
    }
    // Python's huggingface_hub writes no ref for a commit revision: look in its snapshot.
    let snapshot = cache
        .path()
        .join(format!("datasets--{}", hub.repo.replace('/', "--")))
        .join("snapshots")
        .join(&revision)
        .join(&hub.file);
    if snapshot.is_file() {
        return Ok(snapshot);
    }
    let local = match bench {
        Some(b) => format!(
            "put {} in the directory named by HACPO_DATA_DIR, or name a local file \
             (`hacpo eval --bench {n}=/path/to/file.jsonl`, `hacpo train --set task.train={n}=/path/to/file.jsonl`)",
            b.file_name(),
            n = b.name()
        ),
        None => "name a local file instead of the hub file".into(),
    };
    let err = |reason: String| Error::Download {
        repo: format!("datasets/{}", hub.repo),
        reason,
        cache: cache.path().clone(),
        download: format!(
            "huggingface-cli download --repo-type dataset {}{} {}",
            hub.repo,
            hub.revision.as_ref().map(|r| format!(" --revision {r}")).unwrap_or_default(),
            hub.file
        ),
        local: local.clone(),
    };
    if crate::model::zoo::hub_offline() {
        return Err(err(format!("{hub} is not in the hub cache and HF_HUB_OFFLINE is set")));
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env().with_progress(true).build().map_err(|e| err(e.to_string()))?;
    let _progress = crate::progress::Progress::in_logs_only(format!("downloading {hub}"), 0);
    api.repo(dataset).get(&hub.file).map_err(|e| err(format!("{hub}: {e}")))
}

/// Loads a benchmark from `source` (or its default), keeping the first `limit` problems.
pub fn load_benchmark(bench: Benchmark, source: Option<&str>, limit: Option<usize>) -> Result<Vec<MathProblem>> {
    let path = match source.map(Source::parse).transpose()? {
        Some(Source::Path(p)) => p,
        Some(Source::Hub(hub)) => fetch_hub(None, &hub)?,
        None => match local_copy(bench) {
            Some(p) => p,
            None => fetch_hub(Some(bench), &bench.hub_file())?,
        },
    };
    let problems = read_file(bench, &path)?;
    Ok(match limit {
        Some(n) => problems.into_iter().take(n).collect(),
        None => problems,
    })
}

/// Reads a JSONL file (one object per line) or a JSON array.
pub fn read_file(bench: Benchmark, path: &Path) -> Result<Vec<MathProblem>> {
    let text = crate::error::read_to_string(path)?;
    let file = path.display().to_string();
    let bad =
        |line: usize, m: String| Error::config(file.clone(), format!("row {line}: {m} (benchmark {})", bench.name()));
    let rows: Vec<(usize, Value)> = if text.trim_start().starts_with('[') {
        let v: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| Error::config(file.clone(), format!("not a JSON array: {e}")))?;
        v.into_iter().enumerate().map(|(i, x)| (i + 1, x)).collect()
    } else {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map(|v| (i + 1, v)).map_err(|e| bad(i + 1, format!("not valid JSON: {e}")))
            })
            .collect::<Result<_>>()?
    };
    // Rows whose answer is present but null or empty (4 in MATH train) cannot be graded: skip
    // them with a warning. A missing field means the wrong file, which is an error.
    let mut problems = Vec::with_capacity(rows.len());
    let mut skipped = 0;
    for (line, v) in &rows {
        if answer_is_blank(bench, v) {
            skipped += 1;
            continue;
        }
        problems.push(bench.row(v, *line - 1).map_err(|m| bad(*line, m))?);
    }
    if skipped > 0 {
        tracing::warn!(file = %file, skipped, "rows without an answer were skipped");
    }
    Ok(problems)
}

/// The answer field exists but is null or an empty string.
fn answer_is_blank(bench: Benchmark, v: &Value) -> bool {
    let key = match bench {
        Benchmark::Olympiad => "final_answer",
        Benchmark::Minerva => "solution",
        _ => "answer",
    };
    match v.as_object().and_then(|o| o.get(key)) {
        Some(Value::Null) => true,
        Some(Value::String(s)) => s.trim().is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answer_fields_per_benchmark() {
        let g = Benchmark::Gsm8k.row(&json!({"question": "q", "answer": "work\n#### 1,018"}), 0).unwrap();
        assert_eq!(g.answer, "1018");
        let a = Benchmark::Amc23.row(&json!({"question": "q", "answer": 27.0}), 0).unwrap();
        assert_eq!(a.answer, "27");
        let m = Benchmark::Minerva.row(&json!({"problem": "q", "solution": "so \\boxed{4.5e33}."}), 0).unwrap();
        assert_eq!(m.answer, "4.5e33");
        let o = Benchmark::Olympiad
            .row(&json!({"question": "q", "final_answer": ["$69$", "$84$"], "context": "None"}), 0)
            .unwrap();
        assert_eq!(o.answer, "69, 84");
        let e = Benchmark::Gsm8k.row(&json!({"question": "q", "solution": "x"}), 0).unwrap_err();
        assert!(e.contains("\"answer\" is missing"), "{e}");
    }
}
