//! Short-answer QA scores as the official HotpotQA/SQuAD evaluation computes them: answers are
//! normalised (lower case, punctuation and the articles a/an/the removed, whitespace
//! collapsed), EM is equality of the normalised strings, F1 is the token-overlap F1; a
//! yes/no/noanswer on either side scores only by exact match (HotpotQA's special case); with
//! several gold aliases the best one counts.

use serde::Serialize;

/// Exact match and F1 of one prediction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct QaScore {
    pub em: f64,
    pub f1: f64,
}

/// SQuAD's `normalize_answer`: lower case, ASCII punctuation removed, the words a/an/the
/// replaced by a space wherever they stand between word boundaries (Python's Unicode `\b`,
/// so `“the` loses its article too), whitespace collapsed.
pub fn normalize_answer(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punct: String = lower.chars().filter(|c| !is_punctuation(*c)).collect();
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(no_punct.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in no_punct.chars() {
        if is_word(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Python's `string.punctuation` (ASCII), which the official script strips.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
}

/// EM and F1 of `prediction` against one gold answer.
pub fn score_one(prediction: &str, gold: &str) -> QaScore {
    let (p, g) = (normalize_answer(prediction), normalize_answer(gold));
    let em = (p == g) as u8 as f64;
    let special = ["yes", "no", "noanswer"];
    if (special.contains(&p.as_str()) || special.contains(&g.as_str())) && p != g {
        return QaScore { em, f1: 0.0 };
    }
    let (pt, gt): (Vec<&str>, Vec<&str>) =
        (p.split(' ').filter(|w| !w.is_empty()).collect(), g.split(' ').filter(|w| !w.is_empty()).collect());
    let mut counts: std::collections::HashMap<&str, i64> = Default::default();
    for w in &gt {
        *counts.entry(w).or_default() += 1;
    }
    let mut common = 0i64;
    for w in &pt {
        if let Some(c) = counts.get_mut(w)
            && *c > 0
        {
            *c -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return QaScore { em, f1: 0.0 };
    }
    let precision = common as f64 / pt.len() as f64;
    let recall = common as f64 / gt.len() as f64;
    QaScore { em, f1: 2.0 * precision * recall / (precision + recall) }
}

/// The best EM and the best F1 over the gold aliases (each maximised on its own, as the
/// official scripts do); zero when there is no gold.
/// Aliases that normalise to nothing (`""`, `"the"`, `"."`) are skipped: an empty prediction
/// would match them exactly.
pub fn score(prediction: &str, answers: &[String]) -> QaScore {
    let usable = answers.iter().filter(|a| !normalize_answer(a).is_empty());
    usable
        .map(|a| score_one(prediction, a))
        .fold(QaScore::default(), |best, s| QaScore { em: best.em.max(s.em), f1: best.f1.max(s.f1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn normalisation_is_squads() {
        assert_eq!(normalize_answer("The  Eiffel Tower!"), "eiffel tower");
        assert_eq!(normalize_answer("an apple, a pear and the plum."), "apple pear and plum");
        assert_eq!(normalize_answer("U.S.A."), "usa");
        assert_eq!(normalize_answer("  "), "");
        // Python's `\b` is Unicode-aware: articles next to curly quotes and dashes go too.
        assert_eq!(normalize_answer("“The Godfather”"), "“ godfather”");
        assert_eq!(normalize_answer("the–end"), "–end");
        assert_eq!(normalize_answer("theater"), "theater");
    }

    #[test]
    fn f1_by_hand() {
        // "barack obama" vs "president barack obama": precision 1, recall 2/3 → 0.8.
        let s = score_one("Barack Obama", "President Barack Obama");
        close(s.f1, 0.8);
        assert_eq!(s.em, 0.0);
        let s = score_one("the Barack Obama.", "barack obama");
        assert_eq!((s.em, s.f1), (1.0, 1.0));
        // Repeated tokens count at most as often as in the gold: "a a b" vs "a b".
        close(score_one("x x y", "x y").f1, 2.0 * (2.0 / 3.0) * 1.0 / (2.0 / 3.0 + 1.0));
        assert_eq!(score_one("Paris", "London").f1, 0.0);
        assert_eq!(score_one("", "London").f1, 0.0);
    }

    #[test]
    fn yes_no_score_only_by_exact_match() {
        assert_eq!(score_one("yes", "yes"), QaScore { em: 1.0, f1: 1.0 });
        assert_eq!(score_one("yes it is", "yes"), QaScore { em: 0.0, f1: 0.0 });
        assert_eq!(score_one("no", "no way"), QaScore { em: 0.0, f1: 0.0 });
        assert_eq!(score_one("noanswer", "Paris"), QaScore { em: 0.0, f1: 0.0 });
    }

    #[test]
    fn aliases_take_the_best() {
        let answers = vec!["New York City".to_string(), "NYC".to_string()];
        assert_eq!(score("nyc", &answers), QaScore { em: 1.0, f1: 1.0 });
        close(score("New York", &answers).f1, 0.8);
        assert_eq!(score("anything", &[]), QaScore::default());
        // An alias that normalises to nothing gives nothing away.
        assert_eq!(score("", &["the".to_string(), ".".to_string()]), QaScore::default());
    }
}
