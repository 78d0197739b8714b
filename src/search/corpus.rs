//! Questions and the passages to search: the built-in multi-hop sets (HotpotQA-100 and
//! MuSiQue-100 with their paragraphs, `$HACPO_SHARED/data/qa` or `$HACPO_DATA_DIR`) and user
//! files in JSON Lines: a corpus of `{"id", "title", "text"}` and questions
//! `{"id", "question", "answers": [...]}`. Errors name the file and line.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// A passage of the corpus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub text: String,
}

/// A question with its gold answers (aliases).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    pub id: String,
    pub question: String,
    pub answers: Vec<String>,
}

/// The built-in question sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QaSet {
    HotpotQa,
    Musique,
}

impl QaSet {
    pub const ALL: [QaSet; 2] = [QaSet::HotpotQa, QaSet::Musique];

    pub fn name(self) -> &'static str {
        match self {
            QaSet::HotpotQa => "hotpotqa",
            QaSet::Musique => "musique",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        QaSet::ALL.into_iter().find(|s| s.name() == name.to_lowercase())
    }

    /// File names of the questions and the corpus in a data directory.
    fn files(self) -> (&'static str, &'static str) {
        match self {
            QaSet::HotpotQa => ("hotpotqa_100.json", "hotpotqa_100_corpus.json"),
            QaSet::Musique => ("musique_100.json", "musique_100_corpus.json"),
        }
    }

    /// The directory holding the set: `$HACPO_DATA_DIR`, else `$HACPO_SHARED/data/qa`.
    fn locate(self) -> Result<PathBuf> {
        let (questions, _) = self.files();
        for var in ["HACPO_DATA_DIR", "HACPO_SHARED"] {
            if let Some(d) = std::env::var_os(var) {
                let d = if var == "HACPO_SHARED" { PathBuf::from(d).join("data/qa") } else { PathBuf::from(d) };
                if d.join(questions).is_file() {
                    return Ok(d);
                }
            }
        }
        Err(Error::NotFound {
            what: format!("the {} question set", self.name()),
            path: PathBuf::from(questions),
            hint: "Put it (with its _corpus.json) in the directory named by HACPO_DATA_DIR, set \
                   HACPO_SHARED to the shared assets, or give your own files as JSON Lines: \
                   --data questions.jsonl --corpus corpus.jsonl."
                .into(),
        })
    }

    /// The questions and the passages of the set.
    pub fn load(self) -> Result<(Vec<Question>, Vec<Document>)> {
        let dir = self.locate()?;
        let (qf, cf) = self.files();
        let (qpath, cpath) = (dir.join(qf), dir.join(cf));
        let questions = json_file(&qpath)?;
        let corpus = json_file(&cpath)?;
        let bad = |path: &Path, m: String| Error::config(path.display().to_string(), m);
        let rows = questions.as_array().ok_or_else(|| bad(&qpath, "not a JSON array".into()))?;
        let questions = rows
            .iter()
            .enumerate()
            .map(|(i, r)| self.question(r, i).map_err(|m| bad(&qpath, format!("item {}: {m}", i + 1))))
            .collect::<Result<Vec<_>>>()?;
        let documents = match (self, &corpus) {
            // HotpotQA: {title: [sentences]}.
            (QaSet::HotpotQa, Value::Object(map)) => map
                .iter()
                .map(|(title, sentences)| {
                    let text = sentences
                        .as_array()
                        .and_then(|s| s.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
                        .ok_or_else(|| bad(&cpath, format!("{title:?}: not a list of sentences")))?
                        .concat();
                    Ok(Document { id: title.clone(), title: title.clone(), text: text.trim().to_string() })
                })
                .collect::<Result<Vec<_>>>()?,
            // MuSiQue: [{title, text}].
            (QaSet::Musique, Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let field = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
                    match (field("title"), field("text")) {
                        (Some(title), Some(text)) => Ok(Document { id: i.to_string(), title, text }),
                        _ => Err(bad(&cpath, format!("item {}: needs \"title\" and \"text\"", i + 1))),
                    }
                })
                .collect::<Result<Vec<_>>>()?,
            _ => return Err(bad(&cpath, "not the corpus layout of this set".into())),
        };
        check_not_empty(&questions, &documents, &qpath, &cpath)?;
        Ok((questions, documents))
    }

    fn question(self, r: &Value, index: usize) -> std::result::Result<Question, String> {
        let text =
            |k: &str| r.get(k).and_then(Value::as_str).map(String::from).ok_or(format!("field {k:?} is missing"));
        let id = text("_id").or_else(|_| text("id")).unwrap_or_else(|_| index.to_string());
        let mut answers = vec![text("answer")?];
        if let Some(aliases) = r.get("answer_aliases").and_then(Value::as_array) {
            answers.extend(aliases.iter().filter_map(Value::as_str).map(String::from));
        }
        Ok(Question { id, question: text("question")?, answers })
    }
}

fn json_file(path: &Path) -> Result<Value> {
    let text = crate::error::read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| Error::config(path.display().to_string(), format!("not valid JSON: {e}")))
}

fn check_not_empty(questions: &[Question], documents: &[Document], qpath: &Path, cpath: &Path) -> Result<()> {
    if questions.is_empty() {
        return Err(Error::config(qpath.display().to_string(), "holds no questions".to_string()));
    }
    if documents.is_empty() {
        return Err(Error::config(
            cpath.display().to_string(),
            "holds no passages: retrieval needs a corpus".to_string(),
        ));
    }
    Ok(())
}

/// Reads JSON Lines of `T`; an error names the line. Blank lines are skipped.
fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path, what: &str) -> Result<Vec<T>> {
    let text = crate::error::read_to_string(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| Error::config(path.display().to_string(), format!("line {}: not a {what}: {e}", i + 1)))
        })
        .collect()
}

/// A user corpus and question file (JSON Lines).
pub fn load_files(questions: &Path, corpus: &Path) -> Result<(Vec<Question>, Vec<Document>)> {
    Ok((read_questions(questions)?, read_corpus(corpus)?))
}

/// A user question file (JSON Lines `{"id", "question", "answers": [...]}`): not empty, and
/// every question with an answer that has a word in it.
pub fn read_questions(questions: &Path) -> Result<Vec<Question>> {
    let qs: Vec<Question> = read_jsonl(questions, r#"question {"id", "question", "answers": [...]}"#)?;
    let no_answer = |q: &Question| q.answers.iter().all(|a| super::metric::normalize_answer(a).is_empty());
    if let Some((i, q)) = qs.iter().enumerate().find(|(_, q)| no_answer(q)) {
        return Err(Error::config(
            questions.display().to_string(),
            format!(
                "question {} (id {:?}) has no answer: \"answers\" needs at least one string with a word in it",
                i + 1,
                q.id
            ),
        ));
    }
    if qs.is_empty() {
        return Err(Error::config(questions.display().to_string(), "holds no questions".to_string()));
    }
    Ok(qs)
}

/// A user corpus (JSON Lines `{"id", "title", "text"}`), not empty.
pub fn read_corpus(corpus: &Path) -> Result<Vec<Document>> {
    let docs: Vec<Document> = read_jsonl(corpus, r#"passage {"id", "title", "text"}"#)?;
    if docs.is_empty() {
        return Err(Error::config(
            corpus.display().to_string(),
            "holds no passages: retrieval needs a corpus".to_string(),
        ));
    }
    Ok(docs)
}

/// A five-passage corpus for the search modules' unit tests: a two-hop chain (Jaws → its
/// director → his birthplace) and distractors.
#[cfg(test)]
pub(crate) fn jaws_corpus() -> Vec<Document> {
    let d = |id: &str, title: &str, text: &str| Document { id: id.into(), title: title.into(), text: text.into() };
    vec![
        d("0", "Jaws (film)", "Jaws is a 1975 thriller film directed by Steven Spielberg."),
        d("1", "Steven Spielberg", "Steven Spielberg was born in Cincinnati, Ohio, in 1946."),
        d("2", "Cincinnati", "Cincinnati is a city in Ohio on the Ohio River."),
        d("3", "Shark", "Sharks are fish with a cartilaginous skeleton."),
        d("4", "Jaws (novel)", "Jaws is a 1974 novel by Peter Benchley about a shark."),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The QA sets' root: `$HACPO_SHARED` when it holds them, else the repository's copy.
    fn shared() -> PathBuf {
        std::env::var_os("HACPO_SHARED")
            .map(PathBuf::from)
            .filter(|root| root.join("data/qa/hotpotqa_100.json").exists())
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shared"))
    }

    #[test]
    fn user_files_with_bad_lines_no_answers_or_no_passages_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let q = dir.path().join("q.jsonl");
        let c = dir.path().join("c.jsonl");
        std::fs::write(&q, "{\"id\": \"1\", \"question\": \"Who?\", \"answers\": [\"Ann\"]}\n").unwrap();
        std::fs::write(&c, "{\"id\": \"d1\", \"title\": \"Ann\", \"text\": \"Ann did it.\"}\n\n{\"id\": 2}\n").unwrap();
        let e = load_files(&q, &c).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("passage"), "{e}");
        std::fs::write(&c, "").unwrap();
        assert!(load_files(&q, &c).unwrap_err().to_string().contains("no passages"));
        std::fs::write(&c, "{\"id\": \"d1\", \"title\": \"Ann\", \"text\": \"Ann did it.\"}\n").unwrap();
        let (qs, docs) = load_files(&q, &c).unwrap();
        assert_eq!((qs.len(), docs.len(), qs[0].answers[0].as_str()), (1, 1, "Ann"));
        std::fs::write(&q, "{\"id\": \"1\", \"question\": \"Who?\", \"answers\": []}\n").unwrap();
        assert!(load_files(&q, &c).unwrap_err().to_string().contains("has no answer"));
    }

    #[test]
    fn the_built_in_sets_load_from_the_shared_files() {
        // Read through an explicit data directory rather than the environment.
        for (set, n_docs) in [(QaSet::HotpotQa, 994), (QaSet::Musique, 1890)] {
            let dir = shared().join("data/qa");
            let (qf, cf) = set.files();
            assert!(dir.join(qf).is_file(), "{} is missing: set HACPO_SHARED", dir.join(qf).display());
            let questions = json_file(&dir.join(qf)).unwrap();
            let q = set.question(&questions[0], 0).unwrap();
            assert!(!q.question.is_empty() && !q.answers[0].is_empty());
            let corpus = json_file(&dir.join(cf)).unwrap();
            let n = match &corpus {
                Value::Object(m) => m.len(),
                Value::Array(a) => a.len(),
                _ => 0,
            };
            assert_eq!(n, n_docs, "{}", set.name());
        }
        // MuSiQue's aliases are answers too.
        let dir = shared().join("data/qa");
        let questions = json_file(&dir.join("musique_100.json")).unwrap();
        let q = QaSet::Musique.question(&questions[0], 0).unwrap();
        assert_eq!(q.answers, ["G. Stanley Hall", "Stanley Hall"]);
    }
}
