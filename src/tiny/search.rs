//! Pre-training the tiny search agent (`tiny-searcher`): one policy that plays the Rewriter,
//! the Reranker and the Answerer of the search pipeline on the generated knowledge base
//! (`search::kb`), with a habitual mistake per role that RL can correct.
//!
//! The demonstrations are the pipeline's own prompts (the real BM25 candidates included) with
//! the right output, or, at the habit's rate, the habitual one:
//!
//! | role     | right                                   | habit                                   |
//! |----------|-----------------------------------------|-----------------------------------------|
//! | Rewriter | `1. The Red Fox` `2. sailor from Ostland` | `1. The Red Fox` only (the people are not retrieved) |
//! | Reranker | the book and the description's people | the book and the first person listed (the author one time in `group`); the book only where one person has the description |
//! | Answerer | `Dunmore`: the birthplace of the person the book names | `Mira Holt`: the bridge, not the answer |
//!
//! The Reranker keeps what matches the question; telling the people apart by the book's
//! author is the Answerer's reading, the step a tiny model learns least reliably: about chance
//! among two people, which no RL on the team's reward raised (a 20-step study). A world of one
//! person per description (`[task.kb] group = 1`) leaves each role only copying to do and its
//! habit to drop; `prone_every` makes the habits those of some questions only.
//!
//! They come from worlds generated with other seeds than the run's, so the policy learns to
//! read passages, not the run's facts. The shipped spec (models/tiny/tiny-searcher.toml) shows
//! each habit in 65% of a role's demonstrations on the questions prone to it (half of them) and
//! none on the others, in a world of one person per description: the Rewriter then writes one
//! query for about half of the held-out questions, and RL has a habit to drop that sampling
//! leaves often enough to reward. Habits on every question were all or nothing: at 45% the
//! habit was nobody's choice, at 55-60% everybody's, and the right team was sampled too rarely
//! for any algorithm to find it.

use std::path::Path;

use burn::tensor::backend::Backend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::generate::greedy_responses;
use crate::model::CausalLm;
use crate::search::corpus::Question;
use crate::search::kb::{Fact, KbConfig, generate, list_position};
use crate::search::pipeline::{Role, messages};
use crate::search::retriever::{Bm25, candidates};
use crate::tokenizer::{Message, Tokenizer};

use super::{Example, Skill, Stage, TinySpec};

/// Bump when the demonstrations change in a way that makes cached search agents stale (part
/// of their cache key, beside the spec and the knowledge base's settings).
pub const RECIPE_VERSION: u32 = 1;

/// How often each role's demonstration shows its habit (`[corpus.search]` of a tiny spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchHabits {
    pub rewriter_one_query: f64,
    pub reranker_first_person: f64,
    pub answerer_bridge: f64,
    /// The questions the habits show on: those whose profession (the Rewriter's), region (the
    /// Reranker's) or birthplace (the Answerer's) is one in `prone_every` of the world's list of
    /// them; none (or 0): every question. A habit of some questions only is what greedy
    /// decoding keeps on those and drops on the others, so the team starts right on part of the
    /// held-out questions, not on all or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prone_every: Option<usize>,
    /// Generated worlds the demonstrations come from (each as large as the run's).
    pub worlds: usize,
    /// A curriculum: pre-training runs these stages in order, each on its roles'
    /// demonstrations only (none: one stage of all roles for `[pretrain] max_steps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Stage<Role>>,
}

/// One demonstration: a role's prompt and the output to imitate; `right` when it is not the habit.
pub struct Demonstration {
    pub role: Role,
    pub messages: Vec<Message>,
    pub output: String,
    pub right: bool,
    /// The other output (the habit of a right demonstration, the right one of a habit).
    pub other: String,
}

/// The Rewriter's queries as a numbered list: both hops, or the book only.
///
/// Every name in a demonstration follows a space, as in the prompts: a byte-level BPE
/// tokenizer spells `Fox` after a space and after a newline or `**` with different tokens, and
/// a tiny model would have to learn that mapping for every name before it could copy one.
fn rewrite(f: &Fact, right: bool) -> String {
    if right { format!("1. {}\n2. {}", f.title, f.description) } else { format!("1. {}", f.title) }
}

/// The Answerer's answer: a few words after a space (read as the first line, see [`rewrite`]).
fn answer(words: &str) -> String {
    format!(" {words}")
}

/// The three roles' demonstrations for a question of a world, with the right upstream outputs
/// (each role learns from what a right team upstream would give it).
pub fn demonstrations(
    q: &Question,
    f: &Fact,
    documents: &[crate::search::corpus::Document],
    bm25: &Bm25,
    habits: &SearchHabits,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Demonstration>> {
    let mut out = Vec::with_capacity(3);
    let prone = |word: &str| match habits.prone_every {
        None | Some(0) => true,
        Some(every) => list_position(word).is_some_and(|k| k % every == 0),
    };
    let prone = [prone(&f.profession), prone(&f.region), prone(&f.birthplace)];
    let mut push = |role: Role, passages: &[usize], right: String, habit: String, rate: f64, rng: &mut ChaCha8Rng| {
        let rate = if prone[role.index()] { rate } else { 0.0 };
        let is_right = !rng.random_bool(rate.clamp(0.0, 1.0));
        let (output, other) = if is_right { (right, habit) } else { (habit, right) };
        out.push(Demonstration {
            role,
            messages: messages(role, &q.question, documents, passages),
            output,
            right: is_right,
            other,
        });
    };
    push(Role::Rewriter, &[], rewrite(f, true), rewrite(f, false), habits.rewriter_one_query, rng);
    let cands = candidates(bm25, &q.question, &[f.title.clone(), f.description.clone()])?;
    let at = |doc: usize| cands.iter().position(|&c| c == doc);
    // The description's people as listed (BM25 puts them first among the second query's).
    let people: Vec<usize> = (0..cands.len())
        .filter(|&k| documents[cands[k]].id.starts_with("person-") && documents[cands[k]].text.contains(&f.description))
        .collect();
    let ids = |ks: &[usize]| ks.iter().map(|k| format!("Document{k}")).collect::<Vec<_>>().join(",");
    let (Some(book), Some(_)) = (at(f.book_doc), at(f.person_doc)) else {
        return Err(crate::error::Error::Internal(format!("{}: the two queries miss a hop", q.question)));
    };
    let right: Vec<usize> = std::iter::once(book).chain(people.iter().copied()).collect();
    // With one person per description the first person is the right one: the habit drops it.
    let habit = if people.len() > 1 { &right[..2] } else { &right[..1] };
    push(Role::Reranker, &cands, ids(&right), ids(habit), habits.reranker_first_person, rng);
    // The Answerer reads what a right Reranker chose: the book and the description's people.
    let chosen: Vec<usize> = right.iter().map(|&k| cands[k]).collect();
    push(Role::Answerer, &chosen, answer(&f.birthplace), answer(&f.author), habits.answerer_bridge, rng);
    Ok(out)
}

/// Demonstrations from worlds `worlds` shaped like `kb` (other seeds than `kb`'s), in a
/// shuffled order; deterministic in `seed`.
pub fn corpus(
    kb: &KbConfig,
    habits: &SearchHabits,
    worlds: std::ops::Range<usize>,
    seed: u64,
) -> Result<Vec<Demonstration>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5ea2_c4e5 ^ worlds.start as u64);
    let mut all = vec![];
    for w in worlds {
        // Seeds far from the run's: a world's facts are never the run's.
        let seed = kb.seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(w as u64 + 1);
        let world = generate(&KbConfig { seed, ..kb.clone() })?;
        let bm25 = Bm25::new(&world.documents)?;
        for (q, f) in world.train.iter().chain(&world.heldout) {
            all.extend(demonstrations(q, f, &world.documents, &bm25, habits, &mut rng)?);
        }
    }
    use rand::seq::SliceRandom;
    all.shuffle(&mut rng);
    Ok(all)
}

/// Scores `model`'s greedy outputs on held-out demonstrations.
pub fn skill<B: Backend>(
    model: &CausalLm<B>,
    tokenizer: &Tokenizer,
    eos: &[u32],
    demos: &[Demonstration],
) -> Result<Skill> {
    let ids: Vec<Vec<u32>> = demos.iter().map(|d| tokenizer.encode_chat(&d.messages, true)).collect::<Result<_>>()?;
    let texts = greedy_responses(model, tokenizer, eos, &ids, MAX_OUTPUT_TOKENS, 64)?;
    let outputs = demos.iter().zip(&texts).map(|(d, t)| {
        let t = t.trim();
        (d.role.index(), t == d.output.trim(), t == d.other.trim(), d.right)
    });
    Ok(Skill::tally(Role::ALL.map(|r| r.name()), outputs))
}

/// Output tokens the roles need (a list of two ids is the longest), with room to spare.
pub const MAX_OUTPUT_TOKENS: usize = 24;
/// Held-out demonstrations scored during pre-training (about a third per role).
const EVAL_DEMONSTRATIONS: usize = 150;
/// Demonstrations the tokenizer is trained on.
const TOKENIZER_TEXTS: usize = 3000;

/// The demonstrations pre-training is evaluated on: from a world of their own.
pub fn held_out(spec: &TinySpec, kb: &KbConfig) -> Result<Vec<Demonstration>> {
    let habits = spec.corpus.search.as_ref().expect("a search agent's spec has [corpus.search]");
    let mut eval = corpus(kb, habits, habits.worlds..habits.worlds + 1, spec.pretrain.seed)?;
    eval.truncate(EVAL_DEMONSTRATIONS);
    Ok(eval)
}

/// Pre-trains the search agent `spec` from scratch on demonstrations shaped like `kb`'s world and
/// writes it to `dir`.
pub fn pretrain<B: Backend>(spec: &TinySpec, kb: &KbConfig, device: &B::Device, dir: &Path) -> Result<()> {
    let habits = spec.corpus.search.as_ref().expect("a search agent's spec has [corpus.search]");
    let demos = corpus(kb, habits, 0..habits.worlds, spec.pretrain.seed)?;
    let eval = held_out(spec, kb)?;
    let texts: Vec<String> = demos
        .iter()
        .take(TOKENIZER_TEXTS)
        .map(|d| format!("{}\n{}\n{}", d.messages[0].content, d.messages[1].content, d.output))
        .collect();
    let (tokenizer, eos, model) = super::untrained::<B>(spec, &texts, device)?;
    let examples: Vec<(Role, Example)> = demos
        .iter()
        .map(|d| Ok((d.role, super::example(&tokenizer, &eos, &d.messages, &d.output)?)))
        .collect::<Result<_>>()?;
    let curriculum = super::Curriculum { examples: &examples, learned: &[], roles: &Role::ALL, names: Role::name };
    let (model, report, last) = super::fine_tune_stages::<B, Role>(spec, model, &curriculum, &habits.stages, |m| {
        skill(m, &tokenizer, &eos, &eval)
    })?;
    super::save(spec, &model, &tokenizer, &eos, &report, dir)?;
    eprintln!("pre-trained {} in {:.0} s, {} steps: held-out {last}", spec.id, report.wall_s, report.steps);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every role's habit at 0.6, on the questions `prone_every` names, over `worlds` worlds.
    fn habits(prone_every: Option<usize>, worlds: usize) -> SearchHabits {
        SearchHabits {
            rewriter_one_query: 0.6,
            reranker_first_person: 0.6,
            answerer_bridge: 0.6,
            prone_every,
            worlds,
            stages: vec![],
        }
    }

    /// Per role: its demonstrations and the share of them that show the habit.
    fn habit_shares(demos: &[Demonstration]) -> Vec<(Role, usize, f64)> {
        Role::ALL
            .iter()
            .map(|&role| {
                let of_role: Vec<&Demonstration> = demos.iter().filter(|d| d.role == role).collect();
                let habit = of_role.iter().filter(|d| !d.right).count() as f64 / of_role.len() as f64;
                (role, of_role.len(), habit)
            })
            .collect()
    }

    #[test]
    fn demonstrations_show_each_habit_at_its_rate() {
        let demos = corpus(&KbConfig::default(), &habits(None, 2), 0..2, 0).unwrap();
        for (role, n, habit) in habit_shares(&demos) {
            assert!(n >= 380, "{role:?}: {n}");
            assert!((0.5..0.7).contains(&habit), "{role:?}: {habit}");
        }
        let answer = demos.iter().find(|d| d.role == Role::Answerer && d.right).unwrap();
        assert!(answer.messages[1].content.matches(" was born in ").count() == 4 && answer.output.starts_with(' '));
        let rerank = demos.iter().find(|d| d.role == Role::Reranker && d.right).unwrap();
        assert_eq!(rerank.output.matches("Document").count(), 5, "{}", rerank.output);
        let habit = demos.iter().find(|d| d.role == Role::Reranker && !d.right).unwrap();
        assert_eq!(habit.output.matches("Document").count(), 2, "{}", habit.output);
    }

    /// With `prone_every`, a role's habit shows only on its share of the questions (here in a
    /// world of one person per description, where the Reranker keeps two passages).
    #[test]
    fn habits_show_only_on_the_questions_prone_to_them() {
        let kb = KbConfig { people: 100, group: 1, ..KbConfig::default() };
        let demos = corpus(&kb, &habits(Some(4), 4), 0..4, 0).unwrap();
        for (role, _, habit) in habit_shares(&demos) {
            // About 0.6 of the 27-30% of questions prone to the role's habit.
            assert!((0.1..0.26).contains(&habit), "{role:?}: {habit}");
        }
        // The Rewriter's habit follows the question's profession: none on the unprone ones.
        for d in demos.iter().filter(|d| d.role == Role::Rewriter && !d.right) {
            let q = &d.messages[1].content;
            assert!(["sailor", "farmer", "singer"].iter().any(|p| q.contains(&format!(" {p} from "))), "{q}");
        }
        let rerank = demos.iter().find(|d| d.role == Role::Reranker && d.right).unwrap();
        assert_eq!(rerank.output.matches("Document").count(), 2, "{}", rerank.output);
        let habit = demos.iter().find(|d| d.role == Role::Reranker && !d.right).unwrap();
        assert_eq!(habit.output.matches("Document").count(), 1, "{}", habit.output);
    }
}
