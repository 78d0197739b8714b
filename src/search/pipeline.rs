//! One pass of questions through the pipeline: Rewriter → retriever → Reranker → Answerer.
//!
//! Each stage runs for all questions at once (one batch per role), through a caller-given
//! `generate` function: greedy decoding with one model for `hacpo eval --workload search`, a
//! role's policy sampling during training. What happened to each question is kept in a
//! [`Trace`]: the outputs, the passages, the penalties and the score.

use serde::{Deserialize, Serialize};

use super::corpus::{Document, Question};
use super::metric::{QaScore, normalize_answer, score};
use super::retriever::{Retriever, candidates};
use super::roles::{Passage, Penalties, prompts, read_answerer, read_reranker, read_rewriter};
use crate::error::{Error, Result};
use crate::tokenizer::Message;

/// The pipeline's roles, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Rewriter,
    Reranker,
    Answerer,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Rewriter, Role::Reranker, Role::Answerer];

    /// Its position in the pipeline (0 = Rewriter).
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Rewriter => "rewriter",
            Role::Reranker => "reranker",
            Role::Answerer => "answerer",
        }
    }
}

/// Passage text shown in prompts is cut here (characters), so ten passages fit a small
/// model's context.
pub const PASSAGE_CHARS: usize = 800;

/// What the pipeline did with one question.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trace {
    pub question_id: String,
    pub rewriter_output: String,
    pub sub_queries: Vec<String>,
    pub rewriter_penalty: f64,
    /// Corpus positions of the Reranker's candidates.
    pub candidates: Vec<usize>,
    pub reranker_output: String,
    /// Indices into `candidates`.
    pub selected: Vec<usize>,
    pub reranker_penalty: f64,
    pub answerer_output: String,
    pub answer: String,
    pub answerer_penalty: f64,
    pub score: QaScore,
    /// Candidate passages (as shown) that contain a gold answer (normalised).
    pub candidates_with_answer: usize,
    /// Whether a candidate passage contains a gold answer, and a selected one.
    pub candidates_recall: bool,
    pub selected_recall: bool,
}

/// Generates one output per prompt for `role`.
pub type Generate<'a> = dyn FnMut(Role, &[Vec<Message>]) -> Result<Vec<String>> + 'a;

/// How many of `passages` (the first ones) a `role` prompt for a question can show.
pub type Fit<'a> = dyn Fn(Role, &str, &[usize]) -> Result<usize> + 'a;

/// Every passage is shown ([`Fit`] for a model whose context the caller checks).
pub fn show_all(_: Role, _: &str, passages: &[usize]) -> Result<usize> {
    Ok(passages.len())
}

/// The messages `role` sees for `question`: the Reranker with `passages` as its candidates,
/// the Answerer with them as its chosen passages (corpus positions); the Rewriter with none.
pub fn messages(role: Role, question: &str, corpus: &[Document], passages: &[usize]) -> Vec<Message> {
    let docs = || -> Vec<Passage> { passages.iter().map(|&i| passage(&corpus[i])).collect() };
    let (system, user) = match role {
        Role::Rewriter => (prompts::REWRITER_SYSTEM, prompts::rewriter(question)),
        Role::Reranker => (prompts::RERANKER_SYSTEM, prompts::reranker(question, &docs())),
        Role::Answerer => (prompts::ANSWERER_SYSTEM, prompts::answerer(question, &docs())),
    };
    vec![Message::system(system), Message::user(user)]
}

fn passage(d: &Document) -> Passage {
    let text: String = d.text.chars().take(PASSAGE_CHARS).collect();
    Passage { id: d.id.clone(), title: d.title.clone(), text }
}

/// Whether the passage as the model is shown it contains a gold answer (normalised).
pub(crate) fn contains_answer(d: &Document, answers: &[String]) -> bool {
    let shown = passage(d);
    let text = format!(" {} ", normalize_answer(&format!("{} {}", shown.title, shown.text)));
    answers.iter().map(|a| normalize_answer(a)).any(|a| !a.is_empty() && text.contains(&format!(" {a} ")))
}

fn checked(role: Role, outputs: Vec<String>, n: usize) -> Result<Vec<String>> {
    if outputs.len() != n {
        return Err(Error::Internal(format!("{}: {} outputs for {n} prompts", role.name(), outputs.len())));
    }
    Ok(outputs)
}

/// Runs `questions` through the pipeline.
pub fn run(
    generate: &mut Generate<'_>,
    retriever: &dyn Retriever,
    corpus: &[Document],
    questions: &[Question],
    penalties: &Penalties,
    fit: &Fit<'_>,
) -> Result<Vec<Trace>> {
    let n = questions.len();
    let rewrites: Vec<Vec<Message>> =
        questions.iter().map(|q| messages(Role::Rewriter, &q.question, corpus, &[])).collect();
    let rewriter_out = checked(Role::Rewriter, generate(Role::Rewriter, &rewrites)?, n)?;

    let mut found = Vec::with_capacity(n);
    for (q, out) in questions.iter().zip(&rewriter_out) {
        let (queries, penalty) = read_rewriter(out, penalties);
        let mut cands = candidates(retriever, &q.question, &queries)?;
        cands.truncate(fit(Role::Reranker, &q.question, &cands)?);
        found.push((queries, penalty, cands));
    }
    let reranks: Vec<Vec<Message>> =
        questions.iter().zip(&found).map(|(q, (_, _, c))| messages(Role::Reranker, &q.question, corpus, c)).collect();
    let reranker_out = checked(Role::Reranker, generate(Role::Reranker, &reranks)?, n)?;

    let chosen: Vec<(Vec<usize>, f64)> =
        found.iter().zip(&reranker_out).map(|((_, _, c), out)| read_reranker(out, c.len(), penalties)).collect();
    let answers: Vec<Vec<Message>> = questions
        .iter()
        .zip(found.iter().zip(&chosen))
        .map(|(q, ((_, _, c), (sel, _)))| {
            let mut chosen: Vec<usize> = sel.iter().map(|&k| c[k]).collect();
            chosen.truncate(fit(Role::Answerer, &q.question, &chosen)?);
            Ok(messages(Role::Answerer, &q.question, corpus, &chosen))
        })
        .collect::<Result<_>>()?;
    let answerer_out = checked(Role::Answerer, generate(Role::Answerer, &answers)?, n)?;

    let mut traces = Vec::with_capacity(n);
    for (i, q) in questions.iter().enumerate() {
        let (queries, rewriter_penalty, cands) = &found[i];
        let (selected, reranker_penalty) = &chosen[i];
        let (answer, answerer_penalty) = read_answerer(&answerer_out[i], penalties);
        traces.push(Trace {
            question_id: q.id.clone(),
            rewriter_output: rewriter_out[i].clone(),
            sub_queries: queries.clone(),
            rewriter_penalty: *rewriter_penalty,
            candidates: cands.clone(),
            reranker_output: reranker_out[i].clone(),
            selected: selected.clone(),
            reranker_penalty: *reranker_penalty,
            answerer_output: answerer_out[i].clone(),
            score: score(&answer, &q.answers),
            answer,
            answerer_penalty,
            candidates_with_answer: cands.iter().filter(|&&c| contains_answer(&corpus[c], &q.answers)).count(),
            candidates_recall: cands.iter().any(|&c| contains_answer(&corpus[c], &q.answers)),
            selected_recall: selected.iter().any(|&k| contains_answer(&corpus[cands[k]], &q.answers)),
        });
    }
    Ok(traces)
}

/// Means over a set of traces.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub questions: usize,
    pub em: f64,
    pub f1: f64,
    /// Share of outputs with a format penalty, per role.
    pub rewriter_penalty_rate: f64,
    pub reranker_penalty_rate: f64,
    pub answerer_penalty_rate: f64,
    /// Share of questions whose candidates (selected passages) contain a gold answer.
    pub retrieval_recall: f64,
    pub selected_recall: f64,
    /// Mean number of candidate passages that contain a gold answer.
    pub mean_candidates_with_answer: f64,
    pub mean_sub_queries: f64,
}

pub fn summarize(traces: &[Trace]) -> Summary {
    let n = traces.len().max(1) as f64;
    let share = |f: &dyn Fn(&Trace) -> bool| traces.iter().filter(|t| f(t)).count() as f64 / n;
    Summary {
        questions: traces.len(),
        em: traces.iter().map(|t| t.score.em).sum::<f64>() / n,
        f1: traces.iter().map(|t| t.score.f1).sum::<f64>() / n,
        rewriter_penalty_rate: share(&|t| t.rewriter_penalty < 0.0),
        reranker_penalty_rate: share(&|t| t.reranker_penalty < 0.0),
        answerer_penalty_rate: share(&|t| t.answerer_penalty < 0.0),
        retrieval_recall: share(&|t| t.candidates_recall),
        selected_recall: share(&|t| t.selected_recall),
        mean_candidates_with_answer: traces.iter().map(|t| t.candidates_with_answer as f64).sum::<f64>() / n,
        mean_sub_queries: traces.iter().map(|t| t.sub_queries.len() as f64).sum::<f64>() / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::retriever::Bm25;

    use crate::search::corpus::jaws_corpus as corpus;

    /// A scripted team: the Rewriter asks two queries, the Reranker picks what the prompt lists
    /// as Document 0 and 1, the Answerer reads the passage it was given.
    #[test]
    fn a_scripted_team_answers_a_two_hop_question() {
        let c = corpus();
        let r = Bm25::new(&c).unwrap();
        let q = vec![Question {
            id: "q".into(),
            question: "Where was the director of Jaws born?".into(),
            answers: vec!["Cincinnati".into(), "Cincinnati, Ohio".into()],
        }];
        let mut seen = vec![];
        let mut generate = |role: Role, prompts: &[Vec<Message>]| -> Result<Vec<String>> {
            seen.push((role, prompts[0][1].content.clone()));
            Ok(match role {
                Role::Rewriter => vec!["Who directed Jaws?\nWhere was Steven Spielberg born?".into()],
                Role::Reranker => vec!["Document0,Document1".into()],
                Role::Answerer => vec!["**Cincinnati, Ohio**".into()],
            })
        };
        let t = run(&mut generate, &r, &c, &q, &Penalties::default(), &show_all).unwrap().remove(0);
        assert_eq!(t.sub_queries.len(), 2);
        assert_eq!((t.rewriter_penalty, t.reranker_penalty, t.answerer_penalty), (0.0, 0.0, 0.0));
        assert_eq!(t.score, QaScore { em: 1.0, f1: 1.0 });
        assert!(t.candidates_recall && t.candidates.contains(&1));
        assert_eq!(t.selected, [0, 1]);
        // The Answerer saw exactly the selected passages, the Reranker all candidates.
        let answerer_prompt = &seen[2].1;
        assert!(
            answerer_prompt.contains(&c[t.candidates[0]].title) && answerer_prompt.contains(&c[t.candidates[1]].title)
        );
        assert_eq!(seen[1].1.matches("Document ").count(), t.candidates.len());
        let s = summarize(&[t]);
        assert_eq!((s.em, s.f1, s.retrieval_recall, s.mean_sub_queries), (1.0, 1.0, 1.0, 2.0));
    }

    #[test]
    fn a_generator_that_loses_outputs_is_an_internal_error() {
        let c = corpus();
        let r = Bm25::new(&c).unwrap();
        let q = vec![Question { id: "q".into(), question: "Jaws?".into(), answers: vec!["x".into()] }];
        let mut generate = |_: Role, _: &[Vec<Message>]| -> Result<Vec<String>> { Ok(vec![]) };
        assert!(run(&mut generate, &r, &c, &q, &Penalties::default(), &show_all).is_err());
    }
}
