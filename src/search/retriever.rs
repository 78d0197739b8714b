//! Retrieval for the search pipeline: the [`Retriever`] trait (a dense retriever can be added
//! beside BM25) and BM25 over an in-RAM tantivy index of the corpus.
//!
//! Built once at start, single-threaded, so document order and scores are the same on every
//! run; ties are broken by corpus order. Model-written queries are free text: every character
//! that tantivy's query syntax would read (`:`, `"`, `(`, `-`, `^`, …) becomes a space, so no
//! query can fail to parse or address a field.

use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{FAST, Field, STORED, Schema, TEXT, Value};
use tantivy::{Index, IndexReader, TantivyDocument, doc};

use super::corpus::Document;
use super::roles::{RETRIEVAL_BUDGET, split_budget};
use crate::error::{Error, Result};

/// Finds passages for a query.
pub trait Retriever: Send + Sync {
    /// Corpus positions of the best `k` passages for `query`, best first.
    fn search(&self, query: &str, k: usize) -> Result<Vec<usize>>;
}

/// Okapi BM25 (tantivy's scorer, k1 = 1.2, b = 0.75) over title and text.
pub struct Bm25 {
    reader: IndexReader,
    parser: QueryParser,
    position: Field,
}

fn search_error(e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("retrieval index: {e}"))
}

impl Bm25 {
    pub fn new(corpus: &[Document]) -> Result<Self> {
        if corpus.is_empty() {
            return Err(Error::InvalidArgument("the corpus is empty: retrieval needs passages".into()));
        }
        let mut schema = Schema::builder();
        let title = schema.add_text_field("title", TEXT);
        let text = schema.add_text_field("text", TEXT);
        let position = schema.add_u64_field("position", FAST | STORED);
        let index = Index::create_in_ram(schema.build());
        // One thread: one segment, documents in corpus order, the same index on every run.
        let mut writer = index.writer_with_num_threads::<TantivyDocument>(1, 50_000_000).map_err(search_error)?;
        for (i, d) in corpus.iter().enumerate() {
            writer
                .add_document(doc!(title => d.title.as_str(), text => d.text.as_str(), position => i as u64))
                .map_err(search_error)?;
        }
        writer.commit().map_err(search_error)?;
        let reader = index.reader().map_err(search_error)?;
        let parser = QueryParser::for_index(&index, vec![title, text]);
        Ok(Bm25 { reader, parser, position })
    }
}

/// Free text as plain terms: anything but letters and digits is a separator.
fn plain_terms(query: &str) -> String {
    let s: String = query.chars().map(|c| if c.is_alphanumeric() { c } else { ' ' }).collect();
    // Words the parser reads as operators.
    s.split_whitespace().filter(|w| !matches!(*w, "AND" | "OR" | "NOT" | "IN")).collect::<Vec<_>>().join(" ")
}

impl Retriever for Bm25 {
    fn search(&self, query: &str, k: usize) -> Result<Vec<usize>> {
        let terms = plain_terms(query);
        if terms.is_empty() || k == 0 {
            return Ok(vec![]);
        }
        let (query, _) = self.parser.parse_query_lenient(&terms);
        let searcher = self.reader.searcher();
        let hits = searcher.search(&query, &TopDocs::with_limit(k)).map_err(search_error)?;
        let mut scored = Vec::with_capacity(hits.len());
        for (score, address) in hits {
            let d: TantivyDocument = searcher.doc(address).map_err(search_error)?;
            let pos = d.get_first(self.position).and_then(|v| v.as_u64()).ok_or_else(|| search_error("no position"))?;
            scored.push((score, pos as usize));
        }
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(scored.into_iter().map(|(_, p)| p).collect())
    }
}

/// The candidates for the Reranker: the sub-queries' results under the budget split
/// ({1: [10], 2: [5, 5], 3: [4, 3, 3], 4: [3, 3, 2, 2]}), each passage once (a later query's
/// share is filled with its next results). Places the sub-queries leave empty (no query, or
/// queries matching too little) are filled with the question's own results, so the Reranker
/// always sees a full list when the corpus has one.
pub fn candidates(retriever: &dyn Retriever, question: &str, queries: &[String]) -> Result<Vec<usize>> {
    let budget = split_budget(queries.len());
    let mut chosen: Vec<usize> = vec![];
    let take = |query: &str, share: usize, chosen: &mut Vec<usize>| -> Result<()> {
        let hits = retriever.search(query, share + chosen.len())?;
        let new: Vec<usize> = hits.into_iter().filter(|h| !chosen.contains(h)).take(share).collect();
        chosen.extend(new);
        Ok(())
    };
    for (q, &share) in queries.iter().zip(budget) {
        take(q, share, &mut chosen)?;
    }
    if chosen.len() < RETRIEVAL_BUDGET {
        take(question, RETRIEVAL_BUDGET - chosen.len(), &mut chosen)?;
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::search::corpus::jaws_corpus as corpus;

    #[test]
    fn bm25_ranks_the_matching_passages_first_and_the_same_every_time() {
        let c = corpus();
        let r = Bm25::new(&c).unwrap();
        assert_eq!(r.search("Where was Steven Spielberg born?", 1).unwrap(), [1]);
        let a = r.search("Jaws shark film", 5).unwrap();
        assert_eq!(a[0], 0, "{a:?}");
        assert!(a.contains(&4) && a.contains(&3));
        for _ in 0..3 {
            assert_eq!(Bm25::new(&c).unwrap().search("Jaws shark film", 5).unwrap(), a, "stable across builds");
        }
        assert!(r.search("zebra", 3).unwrap().is_empty());
    }

    #[test]
    fn hostile_query_text_never_errors() {
        let r = Bm25::new(&corpus()).unwrap();
        for q in [
            "title:Jaws",
            "\"unclosed phrase",
            "(Jaws AND",
            "Jaws^10 OR -shark",
            "text:[a TO z]",
            "*",
            "",
            "   ",
            "::::",
            "Spielberg~2",
            "NOT",
            "Документ 東京",
            "a\u{0}b",
        ] {
            let hits = r.search(q, 3).unwrap();
            assert!(hits.len() <= 3, "{q:?}");
        }
        assert_eq!(r.search("title:Jaws", 5).unwrap(), r.search("title Jaws", 5).unwrap());
    }

    #[test]
    fn candidates_follow_the_split_and_never_repeat() {
        let c = corpus();
        let r = Bm25::new(&c).unwrap();
        let one = candidates(&r, "q", &["Jaws".to_string()]).unwrap();
        assert!(one.len() <= 10 && one.contains(&0) && one.contains(&4));
        let two = candidates(&r, "q", &["Jaws film".to_string(), "Spielberg born".to_string()]).unwrap();
        let mut sorted = two.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), two.len(), "no passage twice: {two:?}");
        assert!(two.contains(&1));
        // No sub-query, or one that matches nothing: the question's results fill the list.
        assert_eq!(candidates(&r, "Spielberg born Cincinnati", &[]).unwrap()[0], 1);
        assert_eq!(candidates(&r, "Spielberg born Cincinnati", &["zebra".to_string()]).unwrap()[0], 1);
        assert!(Bm25::new(&[]).is_err());
    }
}
