//! Judges of a sub-agent's research: the r_expert term of M-GRPO's sub-agent reward (§4.2,
//! `R_S = β1·format + β2·main correct + β3·r_expert`). The paper asks an LLM to grade how well
//! the subtask was executed; hacpo has a [`Judge`] trait and one judge that needs no model:
//! [`Grounded`], the share of the findings that the sub-agent read in the tools' replies. A
//! finding it did not read (a guess, a name invented or remembered) scores nothing, whatever
//! the main agent then makes of it.

use serde::{Deserialize, Serialize};

use super::protocol;
use crate::search::metric::normalize_answer;
use crate::tokenizer::Message;

/// `[workload.delegate] judge`: which judge scores r_expert.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JudgeKind {
    /// No judge: the β3 term is 0 (the released code's reward has none either).
    #[default]
    None,
    /// [`Grounded`].
    Grounded,
}

impl JudgeKind {
    pub fn build(self) -> Option<Box<dyn Judge>> {
        match self {
            JudgeKind::None => None,
            JudgeKind::Grounded => Some(Box::new(Grounded)),
        }
    }
}

/// One sub-agent's research as a judge reads it.
pub struct Report<'a> {
    /// The task the main agent delegated.
    pub task: &'a str,
    /// What it reported (its `<result>`).
    pub findings: &'a str,
    /// The tools' replies it read, in order (search hit lists, opened passages).
    pub evidence: Vec<&'a str>,
}

impl<'a> Report<'a> {
    /// The research a sub-agent conversation's `messages` hold (system prompt, task, then its
    /// turns and the tools' replies) and its `findings`; `None` when there is no task.
    pub fn of(messages: &'a [Message], findings: &'a str) -> Option<Self> {
        let task = messages.iter().find(|m| m.role == "user")?.content.as_str();
        let evidence = messages
            .iter()
            .filter(|m| m.role == "user")
            .filter_map(|m| protocol::tool_response_text(&m.content))
            .collect();
        Some(Report { task, findings, evidence })
    }
}

/// Scores a sub-agent's research in [0, 1].
pub trait Judge: Send + Sync {
    fn score(&self, research: &Report<'_>) -> f64;
}

/// The share of the findings' content words (SQuAD-normalised, function words such as `was`
/// or `by` left out: they say nothing about where a finding came from) that occur in the
/// tools' replies the sub-agent read; 0 for findings without one.
pub struct Grounded;

/// Words that carry no finding of their own.
const FUNCTION_WORDS: &[&str] = &[
    "is", "was", "are", "were", "be", "been", "by", "of", "in", "on", "at", "to", "for", "with", "from", "as", "and",
    "or", "it", "its", "he", "she", "they", "his", "her", "their", "this", "that", "which", "who",
];

impl Judge for Grounded {
    fn score(&self, research: &Report<'_>) -> f64 {
        let read: std::collections::HashSet<String> = research
            .evidence
            .iter()
            .flat_map(|e| normalize_answer(e).split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect();
        let findings = normalize_answer(research.findings);
        let words: Vec<&str> = findings.split_whitespace().filter(|w| !FUNCTION_WORDS.contains(w)).collect();
        if words.is_empty() {
            return 0.0;
        }
        words.iter().filter(|w| read.contains(**w)).count() as f64 / words.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(findings: &str, replies: &[&str]) -> f64 {
        let mut messages = vec![Message::system("Research the task."), Message::user("Who wrote The Glass Road?")];
        for r in replies {
            messages.push(Message::assistant("<tool_call>…</tool_call>"));
            messages.push(Message::user(protocol::tool_response(r)));
        }
        let r = Report::of(&messages, findings).unwrap();
        assert_eq!(r.task, "Who wrote The Glass Road?");
        assert_eq!(r.evidence, replies);
        Grounded.score(&r)
    }

    #[test]
    fn findings_score_the_share_of_their_words_the_sub_agent_read() {
        let hits = "p1: The Glass Road\np7: Glass Houses";
        let passage = "The Glass Road: The Glass Road is a novel written by Ann Lee.";
        assert_eq!(report("The Glass Road was written by Ann Lee.", &[hits, passage]), 1.0);
        // Reported from the hit list alone: the author was never read.
        assert!((report("The Glass Road was written by Ann Lee.", &[hits]) - 2.0 / 5.0).abs() < 1e-12);
        assert_eq!(report("Bob Stone", &[hits, passage]), 0.0);
        assert_eq!(report("", &[passage]), 0.0);
        assert_eq!(report("It was by", &[passage]), 0.0, "no content word, no finding");
        assert_eq!(report("Ann Lee", &[]), 0.0, "nothing read, nothing grounded");
    }

    #[test]
    fn no_judge_by_default() {
        assert!(JudgeKind::default().build().is_none());
        assert!(JudgeKind::Grounded.build().is_some());
    }
}
