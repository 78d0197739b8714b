//! A generated knowledge base with two-hop questions: the embedded tiny-search study's task
//! (`task.train = "tiny-kb"`, settings under `[task.kb]`), small enough for a model of a million
//! parameters and real enough to need the whole search team.
//!
//! The world: people, each the author of one book, each with a profession, a home region and a
//! birthplace. Every book and every person is a passage:
//!
//! - `The Red Fox. The Red Fox is a book written by Mira Holt.`
//! - `Mira Holt. Mira Holt was born in Dunmore. Mira Holt is a sailor from Ostland.`
//!
//! A question names a book and describes its author: "Where was the sailor from Ostland who
//! wrote The Red Fox born?" (answer: Dunmore). The answer is in neither the question nor the
//! book's passage, and the person passage that holds it is one of a few: every profession-and-
//! region pair is shared by exactly `group` people (4 by default) born in different places. So
//! the team has to search for both hops (the book, and the description), pick the person the
//! book's passage names, and answer with that person's birthplace: one query misses the people,
//! the wrong one of the group gives a wrong place, and the bridge (the author's name) is not the
//! answer. BM25 finds each hop from the question's own words (the title; the profession and
//! region), so one round of retrieval suffices, as in the pipeline.
//!
//! With `group = 1` the description names one person: the team still needs both queries, the
//! Reranker must keep the person's passage beside the book's, and the Answerer must read the
//! birthplace, not the bridge; but telling a group's people apart by the book's author, a match
//! a model of a million parameters made at chance, is not asked. The tiny-search study's world
//! (configs/tiny-search.toml) is this one.
//!
//! Passages are listed in a shuffled order (BM25 breaks ties by position, so the people of a
//! description come back in no telling order). The held-out questions are about books no
//! training question names; all questions share the one corpus.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::corpus::{Document, Question};
use crate::error::{Error, Result};

const FIRST: &[&str] = &[
    "Mira", "Tomas", "Lena", "Oskar", "Ada", "Felix", "Nora", "Hugo", "Iris", "Jonas", "Clara", "Emil", "Vera",
    "Anton", "Greta", "Paul", "Rosa", "Karl", "Elsa", "Otto",
];
const LAST: &[&str] = &[
    "Holt", "Berg", "Lind", "Moss", "Frey", "Dahl", "Kern", "Voss", "Stark", "Wolf", "Brand", "Falk", "Hahn", "Lange",
    "Roth", "Sommer", "Weber", "Keller", "Vogel", "Winter",
];
const COLORS: &[&str] = &[
    "Red", "Blue", "Green", "Grey", "Black", "White", "Golden", "Silver", "Brown", "Pale", "Dark", "Bright", "Quiet",
    "Lost", "Last", "Little",
];
const ANIMALS: &[&str] = &[
    "Fox", "Owl", "Wolf", "Bear", "Hare", "Crow", "Deer", "Swan", "Lynx", "Seal", "Heron", "Otter", "Raven", "Moth",
    "Eagle", "Trout", "Badger", "Falcon", "Horse", "Goat", "Stag", "Wren", "Boar", "Mole", "Finch",
];
const PROFESSIONS: &[&str] =
    &["sailor", "baker", "painter", "doctor", "farmer", "teacher", "miner", "weaver", "singer", "lawyer"];
const REGIONS: &[&str] = &[
    "Ostland",
    "Westmark",
    "Nordby",
    "Sudvale",
    "Highmoor",
    "Lowfen",
    "Eastwick",
    "Redcliff",
    "Greenhollow",
    "Stonehill",
];
const CITIES: &[&str] = &[
    "Dunmore",
    "Ashby",
    "Corvale",
    "Elmstead",
    "Fairhaven",
    "Glenrock",
    "Harwick",
    "Ivybridge",
    "Kingsley",
    "Larkfield",
    "Marston",
    "Northam",
    "Oakridge",
    "Pembury",
    "Quarrington",
    "Rosewood",
    "Saltmarsh",
    "Thornbury",
    "Upton",
    "Wexford",
    "Yarmouth",
    "Brightwater",
    "Coldstream",
    "Deepdale",
    "Everton",
    "Foxley",
    "Greystone",
    "Hollowell",
    "Millbrook",
    "Westfield",
];

/// Generator settings (`[task.kb]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KbConfig {
    /// People (and books): a multiple of `group`, at most 100 × `group` (and 400).
    pub people: usize,
    /// Questions held out (about books no training question names).
    pub heldout: usize,
    pub seed: u64,
    /// People sharing a description (profession and region), born in `group` different
    /// places: how many person passages the second hop brings back for the team to tell apart
    /// by the book's author (1: the description names the author by itself).
    #[serde(skip_serializing_if = "is_four")]
    pub group: usize,
}

/// The first worlds' group; left out of a serialized config so that their cached agents'
/// keys stay as they were.
fn is_four(group: &usize) -> bool {
    *group == 4
}

impl Default for KbConfig {
    fn default() -> Self {
        KbConfig { people: 200, heldout: 50, seed: 0, group: 4 }
    }
}

impl KbConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::config("task.kb", m));
        let group = self.group;
        if !(1..=8).contains(&group) {
            return bad(format!("group = {group} must be between 1 and 8 (people sharing a description)"));
        }
        let most =
            (FIRST.len() * LAST.len()).min(COLORS.len() * ANIMALS.len()).min(PROFESSIONS.len() * REGIONS.len() * group);
        if self.people < 2 * group || self.people > most || !self.people.is_multiple_of(group) {
            return bad(format!(
                "people = {} must be a multiple of group = {group} between {} and {most}",
                self.people,
                2 * group
            ));
        }
        if self.heldout == 0 || self.heldout >= self.people {
            return bad(format!("heldout = {} must be between 1 and people - 1 = {}", self.heldout, self.people - 1));
        }
        Ok(())
    }
}

/// What a question is made of: what each role should do with it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fact {
    pub title: String,
    pub author: String,
    /// `sailor from Ostland`: the profession and the region.
    pub description: String,
    /// `sailor`: what the Rewriter's habit keys on (`[corpus.search] prone_every`).
    pub profession: String,
    /// `Ostland`: what the Reranker's habit keys on.
    pub region: String,
    pub birthplace: String,
    /// Corpus positions of the book's and the author's passages.
    pub book_doc: usize,
    pub person_doc: usize,
}

/// A generated world: its passages and its questions (train and held-out), with their facts.
pub struct Kb {
    pub documents: Vec<Document>,
    pub train: Vec<(Question, Fact)>,
    pub heldout: Vec<(Question, Fact)>,
}

impl Kb {
    pub fn questions(items: &[(Question, Fact)]) -> Vec<Question> {
        items.iter().map(|(q, _)| q.clone()).collect()
    }
}

/// `n` distinct items of `pool`, in random order.
fn pick<T>(rng: &mut ChaCha8Rng, mut pool: Vec<T>, n: usize) -> Vec<T> {
    pool.shuffle(rng);
    pool.truncate(n);
    pool
}

fn pairs(a: &[&str], b: &[&str], sep: &str) -> Vec<String> {
    a.iter().flat_map(|x| b.iter().map(move |y| format!("{x}{sep}{y}"))).collect()
}

/// The world of `cfg`.
pub fn generate(cfg: &KbConfig) -> Result<Kb> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x6b62_6b62);
    let n = cfg.people;
    let names = pick(&mut rng, pairs(FIRST, LAST, " "), n);
    let titles: Vec<String> =
        pick(&mut rng, pairs(COLORS, ANIMALS, " "), n).into_iter().map(|t| format!("The {t}")).collect();
    let group = cfg.group;
    let professions_regions: Vec<(&str, &str)> =
        PROFESSIONS.iter().flat_map(|p| REGIONS.iter().map(move |r| (*p, *r))).collect();
    let picked = pick(&mut rng, professions_regions, n / group);
    let descriptions: Vec<String> = picked.iter().map(|(p, r)| format!("{p} from {r}")).collect();

    // Person k: description k / group; the people of a description are born in different places.
    let mut birthplaces = Vec::with_capacity(n);
    for _ in 0..n / group {
        let mut cities: Vec<&str> = CITIES.to_vec();
        cities.shuffle(&mut rng);
        birthplaces.extend(cities[..group].iter().map(|c| c.to_string()));
    }
    // Documents 0..n are books (book k by person k), n..2n people; listed shuffled.
    let mut order: Vec<usize> = (0..2 * n).collect();
    order.shuffle(&mut rng);
    let mut position = vec![0; 2 * n];
    let mut documents = Vec::with_capacity(2 * n);
    for (pos, &d) in order.iter().enumerate() {
        position[d] = pos;
        documents.push(if d < n {
            Document {
                id: format!("book-{d}"),
                title: titles[d].clone(),
                text: format!("{} is a book written by {}.", titles[d], names[d]),
            }
        } else {
            let k = d - n;
            let a = indefinite(&descriptions[k / group]);
            Document {
                id: format!("person-{k}"),
                title: names[k].clone(),
                text: format!(
                    "{} was born in {}. {} is {a} {}.",
                    names[k],
                    birthplaces[k],
                    names[k],
                    descriptions[k / group]
                ),
            }
        });
    }
    let mut items: Vec<(Question, Fact)> = (0..n)
        .map(|k| {
            let description = descriptions[k / group].clone();
            let question = Question {
                id: format!("kb-{k}"),
                question: format!("Where was the {description} who wrote {} born?", titles[k]),
                answers: vec![birthplaces[k].clone()],
            };
            let fact = Fact {
                title: titles[k].clone(),
                author: names[k].clone(),
                description,
                profession: picked[k / group].0.to_string(),
                region: picked[k / group].1.to_string(),
                birthplace: birthplaces[k].clone(),
                book_doc: position[k],
                person_doc: position[n + k],
            };
            (question, fact)
        })
        .collect();
    items.shuffle(&mut rng);
    let train = items.split_off(cfg.heldout);
    Ok(Kb { documents, train, heldout: items })
}

/// Where `word` stands in the generator's list of professions, regions or birthplaces (a
/// split of the questions that every world shares, for the tiny searcher's habits).
pub fn list_position(word: &str) -> Option<usize> {
    [PROFESSIONS, REGIONS, CITIES].iter().find_map(|list| list.iter().position(|w| *w == word))
}

/// Where a book title's colour ("The Red Fox") or a person's first name ("Mira Holt") stands
/// in the generator's list of them (a split of the names every world shares, for the tiny
/// delegation team's habits).
pub fn name_position(name: &str) -> Option<usize> {
    match name.strip_prefix("The ") {
        Some(title) => COLORS.iter().position(|w| Some(*w) == title.split(' ').next()),
        None => FIRST.iter().position(|w| Some(*w) == name.split(' ').next()),
    }
}

fn indefinite(phrase: &str) -> &'static str {
    if phrase.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::metric::normalize_answer;
    use crate::search::retriever::{Bm25, Retriever, candidates};

    #[test]
    fn the_world_is_deterministic_and_split_by_book() {
        let cfg = KbConfig::default();
        let a = generate(&cfg).unwrap();
        let b = generate(&cfg).unwrap();
        assert_eq!(a.documents, b.documents);
        assert_eq!(Kb::questions(&a.heldout), Kb::questions(&b.heldout));
        assert_eq!((a.documents.len(), a.train.len(), a.heldout.len()), (400, 150, 50));
        let other = generate(&KbConfig { seed: 1, ..cfg.clone() }).unwrap();
        assert_ne!(a.documents, other.documents);
        for (q, f) in a.train.iter().chain(&a.heldout) {
            assert!(a.documents[f.book_doc].text.contains(&f.author));
            assert!(a.documents[f.person_doc].text.contains(&format!(" was born in {}.", f.birthplace)));
            // The answer is in neither the question nor the book's passage.
            let norm = |s: &str| format!(" {} ", normalize_answer(s));
            let answer = normalize_answer(&q.answers[0]);
            assert!(
                !norm(&q.question).contains(&format!(" {answer} "))
                    && !a.documents[f.book_doc].text.contains(&f.birthplace)
            );
        }
        let titles = |items: &[(Question, Fact)]| items.iter().map(|(_, f)| f.title.clone()).collect::<Vec<_>>();
        assert!(titles(&a.heldout).iter().all(|t| !titles(&a.train).contains(t)));
        assert!(KbConfig { people: 202, ..cfg.clone() }.validate().is_err());
        assert!(KbConfig { heldout: 200, ..cfg.clone() }.validate().is_err());
        // One person per description: a hundred descriptions, so a hundred people at most.
        assert!(KbConfig { group: 1, people: 100, ..cfg.clone() }.validate().is_ok());
        assert!(KbConfig { group: 1, ..cfg.clone() }.validate().is_err());
        assert!(KbConfig { group: 0, ..cfg }.validate().is_err());
    }

    /// Each hop is found from the question's own words; the description's people are born in
    /// different places, so the book's passage is needed to tell which.
    #[test]
    fn two_queries_find_both_hops_and_one_does_not() {
        for (group, people) in [(4, 200), (2, 200), (1, 100)] {
            two_queries_find_both_hops(&KbConfig { group, people, ..KbConfig::default() });
        }
    }

    fn two_queries_find_both_hops(cfg: &KbConfig) {
        let kb = generate(cfg).unwrap();
        let group = cfg.group;
        let bm25 = Bm25::new(&kb.documents).unwrap();
        let mut both = 0;
        for (q, f) in &kb.train {
            let two = candidates(&bm25, &q.question, &[f.title.clone(), f.description.clone()]).unwrap();
            both += (two.contains(&f.book_doc) && two.contains(&f.person_doc)) as usize;
            let one = candidates(&bm25, &q.question, std::slice::from_ref(&f.title)).unwrap();
            assert!(!one.contains(&f.person_doc), "{}", q.question);
            let people = bm25.search(&f.description, group).unwrap();
            let places: std::collections::BTreeSet<&str> = people
                .iter()
                .map(|&d| kb.documents[d].text.split(" born in ").nth(1).unwrap().split('.').next().unwrap())
                .collect();
            assert_eq!(places.len(), group, "{people:?}");
        }
        assert_eq!(both, kb.train.len());
    }
}
