//! The three roles of the search pipeline (Rewriter → retriever → Reranker → Answerer), in
//! the spirit of MMOA-RAG (docs/algorithms.md §3.2): their prompts, how their outputs are read, and
//! their format penalties. Pure text functions; the retriever sits between Rewriter and
//! Reranker (`search::retriever`).

use serde::{Deserialize, Serialize};

/// Passages retrieved per question, split over the sub-queries.
pub const RETRIEVAL_BUDGET: usize = 10;
/// Sub-queries used; more are dropped (and penalised).
pub const MAX_SUB_QUERIES: usize = 4;

/// Penalty values (config `[workload.search.penalties]`; the defaults are MMOA-RAG's).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Penalties {
    /// Rewriter: more than 4 sub-queries or more than `rewriter_max_chars` characters.
    pub rewriter: f64,
    pub rewriter_max_chars: usize,
    /// Reranker: not `Document<i>,Document<j>,…`, an id outside the candidates, or a repeat.
    pub reranker: f64,
    /// Answerer: more than `answerer_max_words` words.
    pub answerer: f64,
    pub answerer_max_words: usize,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties { rewriter: -0.5, rewriter_max_chars: 300, reranker: -1.0, answerer: -1.0, answerer_max_words: 30 }
    }
}

/// Passages per sub-query for `n` sub-queries (MMOA-RAG's table; more than 4 use the first 4).
pub fn split_budget(n: usize) -> &'static [usize] {
    match n {
        0 => &[],
        1 => &[10],
        2 => &[5, 5],
        3 => &[4, 3, 3],
        _ => &[3, 3, 2, 2],
    }
}

/// A retrieved passage shown to the Reranker and the Answerer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Passage {
    pub id: String,
    pub title: String,
    pub text: String,
}

/// The Rewriter's sub-queries (one per non-empty line, list markers removed, at most 4) and
/// its penalty.
pub fn read_rewriter(output: &str, p: &Penalties) -> (Vec<String>, f64) {
    let lines: Vec<String> =
        output.lines().map(|l| strip_list_marker(l.trim()).trim().to_string()).filter(|l| !l.is_empty()).collect();
    let penalty = if lines.len() > MAX_SUB_QUERIES || output.trim().chars().count() > p.rewriter_max_chars {
        p.rewriter
    } else {
        0.0
    };
    (lines.into_iter().take(MAX_SUB_QUERIES).collect(), penalty)
}

/// `1. `, `2) `, `- `, `* ` at the start of a line.
fn strip_list_marker(line: &str) -> &str {
    let digits = line.chars().take_while(|c| c.is_ascii_digit()).count();
    let rest = &line[digits..];
    // `1. ` and `2) ` only: "2.5 million people" keeps its number.
    if digits > 0 && rest.starts_with(['.', ')']) && rest[1..].starts_with(char::is_whitespace) {
        return &line[digits + 1..];
    }
    line.strip_prefix("- ").or_else(|| line.strip_prefix("* ")).unwrap_or(line)
}

/// The Reranker's chosen candidate indices and its penalty. The strict format is
/// `^(Document\d+,)*(Document\d+)$` with ids in `0..candidates` and no repeats; on a format
/// error the ids that can still be read (in range, first occurrence) are used, so the Answerer
/// still gets what the Reranker meant.
///
/// Surrounding whitespace is ignored (a model's trailing newline is not a format error), and
/// with no candidates at all there is nothing to get wrong: no penalty.
pub fn read_reranker(output: &str, candidates: usize, p: &Penalties) -> (Vec<usize>, f64) {
    if candidates == 0 {
        return (vec![], 0.0);
    }
    let text = output.trim();
    let parts: Vec<&str> = text.split(',').collect();
    let strict: Option<Vec<usize>> = parts
        .iter()
        .map(|part| part.strip_prefix("Document").filter(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit())))
        .map(|d| d.and_then(|d| d.parse::<usize>().ok()))
        .collect();
    if let Some(ids) = &strict {
        let mut seen = std::collections::BTreeSet::new();
        if ids.iter().all(|&i| i < candidates && seen.insert(i)) {
            return (ids.clone(), 0.0);
        }
    }
    // Lenient reading of a malformed answer: every `Document<k>` / `Document <k>` mentioned.
    let mut ids = vec![];
    let mut rest = text;
    while let Some(k) = rest.find("Document") {
        rest = &rest[k + "Document".len()..];
        let digits: String = rest.trim_start().chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(i) = digits.parse::<usize>()
            && i < candidates
            && !ids.contains(&i)
        {
            ids.push(i);
        }
    }
    (ids, p.reranker)
}

/// The Answerer's answer (inside `**…**` when it used that form, else the first line) and its
/// penalty for more than `answerer_max_words` words (counted on the whole output).
pub fn read_answerer(output: &str, p: &Penalties) -> (String, f64) {
    let text = output.trim();
    let answer = match text.find("**") {
        Some(a) => match text[a + 2..].find("**") {
            Some(b) => text[a + 2..a + 2 + b].trim().to_string(),
            None => text[a + 2..].trim().to_string(),
        },
        None => text.lines().next().unwrap_or("").trim().to_string(),
    };
    let penalty = if text.split_whitespace().count() > p.answerer_max_words { p.answerer } else { 0.0 };
    (answer, penalty)
}

/// Prompts in the project's own words.
pub mod prompts {
    use super::Passage;

    pub const REWRITER_SYSTEM: &str = "You turn a complex question into simple search queries.";

    pub fn rewriter(question: &str) -> String {
        format!(
            "Break the question below into at most four short search queries that together find \
             what is needed to answer it. Write one query per line and nothing else. Name things \
             explicitly instead of using pronouns, and do not repeat a query.\n\nQuestion: {question}"
        )
    }

    pub const RERANKER_SYSTEM: &str = "You pick the documents that help answer a question.";

    pub fn reranker(question: &str, candidates: &[Passage]) -> String {
        let mut s = format!("Question: {question}\n\n");
        for (i, p) in candidates.iter().enumerate() {
            s += &format!("Document {i}: {}. {}\n\n", p.title, p.text);
        }
        s + "List the ids of the documents that help answer the question, most helpful first, \
             in exactly this form: Document0,Document4 (no spaces, nothing else)."
    }

    pub const ANSWERER_SYSTEM: &str = "You answer questions from documents as briefly as possible.";

    pub fn answerer(question: &str, passages: &[Passage]) -> String {
        let mut s = String::new();
        for p in passages {
            s += &format!("{}. {}\n\n", p.title, p.text);
        }
        s + &format!(
            "Using the documents above, answer the question in a few words, as **answer**, \
             with no explanation.\n\nQuestion: {question}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_table_is_mmoa_rags() {
        for n in 1..=4 {
            assert_eq!(split_budget(n).len(), n);
            assert_eq!(split_budget(n).iter().sum::<usize>(), RETRIEVAL_BUDGET);
        }
        assert_eq!(split_budget(3), [4, 3, 3]);
        assert_eq!(split_budget(4), [3, 3, 2, 2]);
        assert_eq!(split_budget(9), [3, 3, 2, 2]);
        assert!(split_budget(0).is_empty());
    }

    #[test]
    fn rewriter_penalties() {
        let p = Penalties::default();
        let (q, pen) = read_rewriter("1. Who directed Jaws?\n2) When was he born?\n\n- where?", &p);
        assert_eq!((q, pen), (vec!["Who directed Jaws?".into(), "When was he born?".into(), "where?".into()], 0.0));
        let (q, pen) = read_rewriter("a\nb\nc\nd\ne", &p);
        assert_eq!((q.len(), pen), (4, -0.5), "five queries: the first four, penalised");
        let long = "x".repeat(301);
        assert_eq!(read_rewriter(&long, &p).1, -0.5);
        assert_eq!(read_rewriter(&"x".repeat(300), &p).1, 0.0);
        assert_eq!(read_rewriter("2.5 million people live where?", &p).0, ["2.5 million people live where?"]);
    }

    #[test]
    fn reranker_format_range_and_repeats() {
        let p = Penalties::default();
        assert_eq!(read_reranker("Document0,Document4", 10, &p), (vec![0, 4], 0.0));
        assert_eq!(read_reranker(" Document3 ", 10, &p), (vec![3], 0.0));
        // Out of range, repeated, spaced or wordy: −1, the readable ids still used.
        assert_eq!(read_reranker("Document0,Document10", 10, &p), (vec![0], -1.0));
        assert_eq!(read_reranker("Document2,Document2", 10, &p), (vec![2], -1.0));
        assert_eq!(read_reranker("Document 1, Document 5", 10, &p), (vec![1, 5], -1.0));
        assert_eq!(read_reranker("I think Document7 helps.", 10, &p), (vec![7], -1.0));
        assert_eq!(read_reranker("none", 10, &p), (vec![], -1.0));
        assert_eq!(read_reranker("", 10, &p), (vec![], -1.0));
        assert_eq!(read_reranker("anything", 0, &p), (vec![], 0.0), "no candidates, nothing to choose");
    }

    #[test]
    fn answerer_reads_the_bold_answer_and_counts_words() {
        let p = Penalties::default();
        assert_eq!(read_answerer("**Paris**", &p), ("Paris".into(), 0.0));
        assert_eq!(read_answerer("The answer is **Steven Spielberg**.", &p), ("Steven Spielberg".into(), 0.0));
        assert_eq!(read_answerer("1946\nbecause…", &p), ("1946".into(), 0.0));
        let long = format!("**x** {}", "word ".repeat(30));
        assert_eq!(read_answerer(&long, &p).1, -1.0);
    }

    #[test]
    fn prompts_carry_the_inputs() {
        let docs = vec![Passage { id: "7".into(), title: "Jaws".into(), text: "A 1975 film.".into() }];
        assert!(prompts::reranker("q?", &docs).contains("Document 0: Jaws. A 1975 film."));
        assert!(prompts::answerer("q?", &docs).ends_with("Question: q?"));
        assert!(prompts::rewriter("q?").contains("one query per line"));
    }
}
