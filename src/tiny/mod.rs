//! The embedded default's tiny agents: model specs in `models/tiny/`, tokenizers trained on
//! the arithmetic task's text, supervised pre-training on worked solutions, and a cache.
//!
//! A tiny agent id (`tiny-qwen`, `tiny-llama`) names an architecture, a tokenizer recipe, a
//! pre-training budget and a pre-training corpus (the task's worked solutions with the family's
//! habitual mistake mixed in, [`CorpusConfig`]). Pre-trained weights live in
//! `$HACPO_CACHE/tiny/<id>-<hash>/` (default `~/.cache/hacpo`), in Hugging Face layout; the
//! hash covers the spec and the task generator's settings, so changing either pre-trains again
//! instead of reusing weights trained for something else. The directory appears only complete
//! (written beside, then renamed).
//!
//! The agents of the embedded default are shipped with the project (`models/tiny/pretrained/`,
//! compiled into the binary, ~4 MB): a first run installs them into the cache instead of
//! pre-training for ten minutes. They are this module's own output (`hacpo pretrain --out
//! models/tiny/pretrained` writes them again), and a test checks that their directory names are
//! the cache keys of the current specs and task settings, so they cannot go stale silently.

use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::data::arith::{ArithProblem, Habit, worked_solution};
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::model::weights::{RandomWeights, build};
use crate::model::{CausalLm, ModelConfig, SaveDtype, save_pretrained};
use crate::reward::Grader;
use crate::tokenizer::train::{ChatFormat, TokenizerKind, train};
use crate::tokenizer::{Message, Tokenizer};
use crate::train::sft::{SftConfig, SftReport, fine_tune, fine_tune_masked};

pub mod delegate;
pub mod planner;
pub mod search;

const SPECS: &[(&str, &str)] = &[
    ("tiny-qwen", include_str!("../../models/tiny/tiny-qwen.toml")),
    ("tiny-llama", include_str!("../../models/tiny/tiny-llama.toml")),
    ("tiny-searcher", include_str!("../../models/tiny/tiny-searcher.toml")),
    ("tiny-planner", include_str!("../../models/tiny/tiny-planner.toml")),
    ("tiny-delegate", include_str!("../../models/tiny/tiny-delegate.toml")),
];

/// Bump when pre-training changes in a way that makes cached weights stale.
const RECIPE_VERSION: u32 = 2;

/// The files of a pre-trained agent directory.
const AGENT_FILES: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "pretrain.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// A shipped agent: its cache directory name (`<id>-<key>`) and its files, in [`AGENT_FILES`]' order.
type Shipped = (&'static str, [&'static [u8]; 6]);

macro_rules! shipped {
    ($dir:literal) => {
        (
            $dir,
            [
                include_bytes!(concat!("../../models/tiny/pretrained/", $dir, "/config.json")),
                include_bytes!(concat!("../../models/tiny/pretrained/", $dir, "/generation_config.json")),
                include_bytes!(concat!("../../models/tiny/pretrained/", $dir, "/model.safetensors")),
                include_bytes!(concat!("../../models/tiny/pretrained/", $dir, "/pretrain.json")),
                include_bytes!(concat!("../../models/tiny/pretrained/", $dir, "/tokenizer.json")),
                include_bytes!(concat!("../../models/tiny/pretrained/", $dir, "/tokenizer_config.json")),
            ],
        )
    };
}

/// The embedded default's agents and the tiny studies', pre-trained (`hacpo pretrain --out
/// models/tiny/pretrained`, with `--config configs/tiny-search.toml`,
/// `configs/tiny-planpath.toml` or `configs/tiny-delegate.toml` for the studies').
const SHIPPED: &[Shipped] = &[
    shipped!("tiny-qwen-4d6251e7ff849352"),
    shipped!("tiny-llama-d0a1f7271ecb55ac"),
    shipped!("tiny-searcher-3dae956920adae18"),
    shipped!("tiny-planner-4a567208cafc3bf5"),
    shipped!("tiny-delegate-6a810890f009fe0c"),
];

/// Names of the shipped agent directories.
pub fn shipped_dirs() -> Vec<&'static str> {
    SHIPPED.iter().map(|(d, _)| *d).collect()
}

/// Problems used to train the tokenizers (more adds nothing: the text is very regular).
const TOKENIZER_TEXTS: usize = 4000;
/// Held-out problems scored during pre-training.
const EVAL_PROBLEMS: usize = 100;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TinySpec {
    pub id: String,
    pub tokenizer: TokenizerKind,
    /// BPE vocabulary size (the char tokenizer has 256 + its special tokens).
    pub vocab_size: usize,
    pub chat_format: ChatFormat,
    /// The model's `config.json` without `vocab_size` and `eos_token_id` (the tokenizer's).
    pub config: serde_json::Map<String, serde_json::Value>,
    pub pretrain: SftConfig,
    #[serde(default)]
    pub corpus: CorpusConfig,
}

/// What the pre-training corpus looks like.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorpusConfig {
    /// The family's habitual mistake, written into `habit_rate` of the worked solutions whose
    /// problem has an operation it applies to.
    pub habit: Option<Habit>,
    pub habit_rate: f64,
    /// A search agent's habits (`[corpus.search]`): it is pre-trained on the generated
    /// knowledge base's pipeline, not on arithmetic. (Left out of the cache key when absent, so
    /// the arithmetic agents' keys are what they were.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<search::SearchHabits>,
    /// A planner's habits (`[corpus.planner]`): it is pre-trained on the turn-wise workload's
    /// Plan-Path prompts (left out of the key when absent, as `search`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planner: Option<planner::PlannerHabits>,
    /// A delegation agent's habits (`[corpus.delegate]`): it is pre-trained on the delegation
    /// workload's episodes over the generated knowledge base (left out of the key when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegate: Option<delegate::DelegateHabits>,
}

impl CorpusConfig {
    /// The worked solutions pre-training imitates: the task's, with the habit's slips mixed in
    /// (deterministically: the same problems slip on every machine).
    pub fn solutions(&self, problems: &[ArithProblem], seed: u64) -> Vec<String> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_c0de);
        problems
            .iter()
            .map(|p| match self.habit {
                Some(h) if rng.random_bool(self.habit_rate.clamp(0.0, 1.0)) => {
                    worked_solution(p.start, &p.ops, Some(h)).0
                }
                _ => p.solution.clone(),
            })
            .collect()
    }
}

/// The spec of a tiny agent id, if it is one.
pub fn find(id: &str) -> Option<TinySpec> {
    SPECS.iter().find(|(k, _)| *k == id).map(|(_, text)| toml::from_str(text).expect("valid built-in tiny spec"))
}

/// [`find`] with the config's pre-training overrides applied.
pub fn find_for(id: &str, overrides: &crate::config::PretrainConfig) -> Option<TinySpec> {
    let mut spec = find(id)?;
    if overrides.max_steps > 0 {
        // A curriculum shrinks or grows with the budget, stage by stage.
        let (from, to) = (spec.pretrain.max_steps, overrides.max_steps);
        if let Some(habits) = spec.corpus.search.as_mut() {
            rescale(&mut habits.stages, from, to);
        }
        if let Some(habits) = spec.corpus.delegate.as_mut() {
            rescale(&mut habits.stages, from, to);
        }
        spec.pretrain.max_steps = overrides.max_steps;
    }
    Some(spec)
}

/// One stage of a pre-training curriculum (`[[corpus.search.stages]]`,
/// `[[corpus.delegate.stages]]`): `steps` on the demonstrations of `roles` only. The stages'
/// steps add up to `[pretrain] max_steps`.
///
/// Why stages: a tiny model learns one role's copying alone in a few hundred steps, but the
/// same copying inside a mixture of roles that each copy from elsewhere much later or never
/// (the measurements are in models/tiny/tiny-searcher.toml and tiny-delegate.toml).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage<K> {
    pub roles: Vec<K>,
    pub steps: usize,
    /// The stage's peak learning rate (default: `[pretrain] lr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
}

/// Scales a curriculum's stages from a budget of `from` steps to `to`, keeping their sum `to`.
fn rescale<K>(stages: &mut [Stage<K>], from: usize, to: usize) {
    for stage in stages.iter_mut() {
        stage.steps = (stage.steps * to / from.max(1)).max(1);
    }
    let short = to.saturating_sub(stages.iter().map(|s| s.steps).sum());
    if let Some(last) = stages.last_mut() {
        last.steps += short;
    }
}

/// A prompt and the response to imitate, as token ids.
pub(crate) type Example = (Vec<u32>, Vec<u32>);

/// Pre-training examples of several roles, each (its role, prompt ids, response ids) and which
/// response tokens are learned (empty: all of every example).
pub(crate) struct Curriculum<'a, K> {
    pub examples: &'a [(K, Example)],
    pub learned: &'a [Vec<bool>],
    /// Every role, in the order a single stage lists them.
    pub roles: &'a [K],
    pub names: fn(K) -> &'static str,
}

/// Fine-tunes `model` through `stages` in order, each on its roles' examples (no stages: one
/// stage of every role for `[pretrain] max_steps`), scoring it with `skill` at each evaluation;
/// returns the model, the whole run's report and the last skill.
pub(crate) fn fine_tune_stages<B: Backend, K: Copy + PartialEq>(
    spec: &TinySpec,
    mut model: CausalLm<Autodiff<B>>,
    curriculum: &Curriculum<K>,
    stages: &[Stage<K>],
    mut skill: impl FnMut(&CausalLm<B>) -> Result<Skill>,
) -> Result<(CausalLm<Autodiff<B>>, SftReport, Skill)> {
    let whole = [Stage { roles: curriculum.roles.to_vec(), steps: spec.pretrain.max_steps, lr: None }];
    let stages = if stages.is_empty() { &whole[..] } else { stages };
    let (mut report, mut last) = (SftReport::default(), None);
    for (k, stage) in stages.iter().enumerate() {
        let chosen: Vec<usize> =
            (0..curriculum.examples.len()).filter(|&i| stage.roles.contains(&curriculum.examples[i].0)).collect();
        let examples: Vec<_> = chosen.iter().map(|&i| curriculum.examples[i].1.clone()).collect();
        let learned: Vec<_> = match curriculum.learned.is_empty() {
            true => vec![],
            false => chosen.iter().map(|&i| curriculum.learned[i].clone()).collect(),
        };
        let names: Vec<&str> = stage.roles.iter().map(|&r| (curriculum.names)(r)).collect();
        eprintln!(
            "{}: stage {}/{}: {} steps on {} examples of {}",
            spec.id,
            k + 1,
            stages.len(),
            stage.steps,
            examples.len(),
            names.join(", ")
        );
        let cfg =
            SftConfig { max_steps: stage.steps, lr: stage.lr.unwrap_or(spec.pretrain.lr), ..spec.pretrain.clone() };
        // fine_tune evaluates at its last step: that evaluation describes the stage's result.
        let (trained, part) = fine_tune_masked::<B>(model, &examples, &learned, &cfg, &spec.id, |m| {
            let s = skill(m)?;
            eprintln!("{}: held-out {s}", spec.id);
            let known = s.known;
            last = Some(s);
            Ok(known)
        })?;
        model = trained;
        report.append(part);
    }
    Ok((model, report, last.expect("fine_tune evaluates at its last step")))
}

pub fn ids() -> Vec<&'static str> {
    SPECS.iter().map(|(k, _)| *k).collect()
}

/// Where `spec` pre-trained on `task` (its generator's settings) is cached.
pub fn cache_dir(spec: &TinySpec, task: &impl Serialize) -> PathBuf {
    let key = serde_json::to_string(&(RECIPE_VERSION, spec, task)).expect("json");
    let h = crate::stable_hash::hash_bytes(key.as_bytes());
    crate::cache::root().join("tiny").join(format!("{}-{h:016x}", spec.id))
}

/// Whether `dir` holds a complete pre-trained agent.
pub fn is_cached(dir: &Path) -> bool {
    dir.join("pretrain.json").exists()
}

/// The chat messages of a problem and its worked solution.
fn messages(p: &ArithProblem) -> Vec<Message> {
    vec![Message::user(p.question.clone())]
}

/// Greedy accuracy of `model` on `problems`.
pub fn accuracy<B: Backend>(
    model: &CausalLm<B>,
    tokenizer: &Tokenizer,
    eos: &[u32],
    problems: &[ArithProblem],
    max_new_tokens: usize,
) -> Result<f64> {
    let grader = Grader::default();
    let ids: Vec<Vec<u32>> =
        problems.iter().map(|p| tokenizer.encode_chat(&messages(p), true)).collect::<Result<_>>()?;
    let texts = greedy_responses(model, tokenizer, eos, &ids, max_new_tokens, 64)?;
    let correct = problems.iter().zip(&texts).filter(|(p, t)| grader.grade(&p.answer, t)).count();
    Ok(correct as f64 / problems.len().max(1) as f64)
}

/// Response tokens needed for the longest worked solution, with room to spare.
pub fn max_solution_tokens(tokenizer: &Tokenizer, problems: &[ArithProblem]) -> Result<usize> {
    let mut longest = 0;
    for p in problems.iter().take(2000) {
        longest = longest.max(tokenizer.encode(&p.solution, false)?.len());
    }
    Ok(longest + longest / 2 + 8)
}

/// Writes the shipped agent whose directory name is `dir`'s, if there is one (beside `dir`,
/// then renamed into place); whether it did.
fn install_shipped(dir: &Path) -> Result<bool> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let Some((_, files)) = SHIPPED.iter().find(|(d, _)| *d == name) else { return Ok(false) };
    let parent = dir.parent().expect("cache dir has a parent");
    std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    for (file, bytes) in AGENT_FILES.iter().zip(files) {
        let path = tmp.join(file);
        std::fs::write(&path, bytes).map_err(|e| Error::io("write", &path, e))?;
    }
    move_into_place(&tmp, dir)?;
    Ok(true)
}

/// Renames a complete agent directory into place. Another process may have finished the same
/// agent first; then its copy stays (it is the same agent) and ours is dropped.
fn move_into_place(tmp: &Path, dir: &Path) -> Result<()> {
    if is_cached(dir) {
        let _ = std::fs::remove_dir_all(tmp);
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(tmp, dir).map_err(|e| Error::io("rename", tmp, e))
}

/// Pre-trains `spec` from scratch and writes it to `dir`.
pub fn pretrain<B: Backend>(
    spec: &TinySpec,
    train: &[ArithProblem],
    heldout: &[ArithProblem],
    device: &B::Device,
    dir: &Path,
) -> Result<()> {
    let solutions = spec.corpus.solutions(train, spec.pretrain.seed);
    let texts: Vec<String> =
        train.iter().zip(&solutions).take(TOKENIZER_TEXTS).map(|(p, s)| format!("{}\n{s}", p.question)).collect();
    let (tokenizer, eos, model) = untrained::<B>(spec, &texts, device)?;
    let examples: Vec<_> =
        train.iter().zip(&solutions).map(|(p, s)| example(&tokenizer, &eos, &messages(p), s)).collect::<Result<_>>()?;
    let eval = &heldout[..heldout.len().min(EVAL_PROBLEMS)];
    let max_new = max_solution_tokens(&tokenizer, train)?;
    let (model, report) =
        fine_tune::<B>(model, &examples, &spec.pretrain, &spec.id, |m| accuracy(m, &tokenizer, &eos, eval, max_new))?;
    save(spec, &model, &tokenizer, &eos, &report, dir)?;
    eprintln!(
        "pre-trained {} in {:.0} s: {} steps, held-out accuracy {:.1}%",
        spec.id,
        report.wall_s,
        report.steps,
        report.accuracy * 100.0
    );
    Ok(())
}

pub(crate) fn train_tokenizer(spec: &TinySpec, texts: &[String]) -> Result<Tokenizer> {
    train(spec.tokenizer, spec.vocab_size, spec.chat_format, texts)
}

/// `spec` before pre-training: its tokenizer trained on `texts`, the end-of-turn id, and the
/// model with random weights.
pub(crate) fn untrained<B: Backend>(
    spec: &TinySpec,
    texts: &[String],
    device: &B::Device,
) -> Result<(Tokenizer, Vec<u32>, CausalLm<Autodiff<B>>)> {
    let tokenizer = train_tokenizer(spec, texts)?;
    let eos = vec![tokenizer.token_to_id(spec.chat_format.special_tokens()[0]).expect("eos is a special token")];
    let config = model_config(spec, tokenizer.vocab_size(), &eos)?;
    let model = build::<Autodiff<B>>(&config, &mut RandomWeights::new(&config, spec.pretrain.seed, 0.02), device)?;
    Ok((tokenizer, eos, model))
}

/// A demonstration as pre-training reads it: the chat prompt's ids, and the response's ids
/// ending with the end-of-turn token.
pub(crate) fn example(
    tokenizer: &Tokenizer,
    eos: &[u32],
    messages: &[Message],
    response: &str,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let prompt = tokenizer.encode_chat(messages, true)?;
    let mut response = tokenizer.encode(response, false)?;
    response.push(eos[0]);
    Ok((prompt, response))
}

/// How a tiny team player's greedy outputs on held-out demonstrations compare with the
/// demonstrated ones, overall and per kind of demonstration (the search roles, the planner's
/// prompts).
pub struct Skill {
    /// Share that is one of the two demonstrated outputs (what pre-training teaches).
    pub known: f64,
    /// Per kind, the same share.
    pub known_by: [f64; 3],
    /// Per kind, the share that is the right output.
    pub right_by: [f64; 3],
    names: [&'static str; 3],
    /// Finer shares, where the kind has them (a delegation agent's, per turn).
    pub(crate) detail: String,
}

impl Skill {
    /// Tallies greedy outputs, each as (its kind's index, it is the demonstrated output, it is
    /// the other one, the demonstrated output is the right one).
    pub(crate) fn tally(
        names: [&'static str; 3],
        outputs: impl IntoIterator<Item = (usize, bool, bool, bool)>,
    ) -> Skill {
        let (mut known, mut right, mut count) = ([0.0; 3], [0.0; 3], [0.0; 3]);
        for (k, is_output, is_other, output_right) in outputs {
            count[k] += 1.0;
            known[k] += f64::from(u8::from(is_output || is_other));
            right[k] += f64::from(u8::from((is_output && output_right) || (is_other && !output_right)));
        }
        let share = |x: [f64; 3]| std::array::from_fn(|k| x[k] / f64::max(count[k], 1.0));
        Skill {
            known: known.iter().sum::<f64>() / count.iter().sum::<f64>().max(1.0),
            known_by: share(known),
            right_by: share(right),
            names,
            detail: String::new(),
        }
    }
}

impl std::fmt::Display for Skill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by = |x: &[f64; 3]| {
            self.names.iter().zip(x).map(|(n, v)| format!("{n} {:.0}%", v * 100.0)).collect::<Vec<_>>().join(", ")
        };
        write!(
            f,
            "{:.1}% of greedy outputs demonstrated ({}); right: {}",
            self.known * 100.0,
            by(&self.known_by),
            by(&self.right_by)
        )?;
        if !self.detail.is_empty() {
            write!(f, "; {}", self.detail)?;
        }
        Ok(())
    }
}

pub(crate) fn model_config(spec: &TinySpec, vocab: usize, eos: &[u32]) -> Result<ModelConfig> {
    let mut v = spec.config.clone();
    v.insert("vocab_size".into(), vocab.into());
    v.insert("eos_token_id".into(), eos.into());
    ModelConfig::from_json(&serde_json::Value::Object(v), &spec.id)
}

/// Writes the agent beside `dir`, then renames it into place.
pub(crate) fn save<B: Backend>(
    spec: &TinySpec,
    model: &CausalLm<Autodiff<B>>,
    tokenizer: &Tokenizer,
    eos: &[u32],
    report: &SftReport,
    dir: &Path,
) -> Result<()> {
    let parent = dir.parent().expect("cache dir has a parent");
    std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
    let tmp = parent.join(format!(".{}.tmp-{}", spec.id, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    save_pretrained(model, tokenizer, eos, &tmp, SaveDtype::F32)?;
    let record = serde_json::json!({"spec": spec, "report": report});
    std::fs::write(tmp.join("pretrain.json"), serde_json::to_string_pretty(&record).expect("json"))
        .map_err(|e| Error::io("write", &tmp, e))?;
    move_into_place(&tmp, dir)
}

/// Where the tiny agent `spec` of `cfg` is cached: keyed by the task it is pre-trained for
/// (the arith generator, or the search knowledge base), which `cfg` must be.
fn agent_dir(spec: &TinySpec, cfg: &crate::config::TrainConfig) -> Result<PathBuf> {
    use crate::config::TaskKind;
    if spec.corpus.planner.is_some() {
        let plan_path = crate::env::EnvKind::PlanPath.name();
        let turns = &cfg.workload.turns;
        if cfg.task.kind != TaskKind::Env
            || cfg.task.train != plan_path
            || turns.tool != crate::workload::turns::ToolKind::Simulate
        {
            return Err(Error::config(
                "training config",
                format!(
                    "{} is pre-trained on the turn-wise workload's Plan-Path prompts with the simulate tool; set \
                     task.kind = \"env\", task.train = \"{plan_path}\" and workload.turns.tool = \"simulate\" \
                     (see configs/tiny-planpath.toml) or use other agents",
                    spec.id
                ),
            ));
        }
        // The prompts name the turn limit, so it is part of the key.
        return Ok(cache_dir(spec, &(planner::RECIPE_VERSION, turns.turns)));
    }
    if spec.corpus.delegate.is_some() {
        let kb = crate::search::task::TINY_KB;
        if cfg.task.kind != TaskKind::Qa
            || cfg.task.train != kb
            || cfg.workload.kind != crate::workload::WorkloadKind::Delegate
        {
            return Err(Error::config(
                "training config",
                format!(
                    "{} is pre-trained on the delegation workload over the generated knowledge base; set \
                     workload.kind = \"delegate\", task.kind = \"qa\" and task.train = \"{kb}\" (see \
                     configs/tiny-delegate.toml) or use other agents",
                    spec.id
                ),
            ));
        }
        // A search's hit list and the system prompts are part of every demonstration.
        let workload = &cfg.workload.delegate;
        let key = (delegate::RECIPE_VERSION, &cfg.task.kb, workload.search_k, workload.instructions);
        return Ok(cache_dir(spec, &key));
    }
    if spec.corpus.search.is_some() {
        let kb = crate::search::task::TINY_KB;
        if cfg.task.kind != TaskKind::Qa || cfg.task.train != kb {
            return Err(Error::config(
                "training config",
                format!(
                    "{} is pre-trained on the generated knowledge base; set task.kind = \"qa\" and task.train = \"{kb}\" \
                     (see configs/tiny-search.toml) or use other agents",
                    spec.id
                ),
            ));
        }
        return Ok(cache_dir(spec, &(search::RECIPE_VERSION, &cfg.task.kb)));
    }
    if cfg.task.kind != TaskKind::Arith {
        return Err(Error::config(
            "training config",
            format!("{} is pre-trained on the arith task; set task.kind = \"arith\" or use other agents", spec.id),
        ));
    }
    Ok(cache_dir(spec, &cfg.task.arith))
}

/// Pre-trains `spec` for `cfg`'s task into `dir`; `arith` holds the arith task's problems once
/// generated (shared by the agents of one config).
fn pretrain_for<B: Backend>(
    spec: &TinySpec,
    cfg: &crate::config::TrainConfig,
    arith: &mut Option<(Vec<ArithProblem>, Vec<ArithProblem>)>,
    device: &B::Device,
    dir: &Path,
) -> Result<()> {
    if spec.corpus.search.is_some() {
        return search::pretrain::<B>(spec, &cfg.task.kb, device, dir);
    }
    if spec.corpus.delegate.is_some() {
        return delegate::pretrain::<B>(spec, &cfg.task.kb, &cfg.workload.delegate, device, dir);
    }
    if spec.corpus.planner.is_some() {
        return planner::pretrain::<B>(spec, &cfg.workload.turns, device, dir);
    }
    if arith.is_none() {
        *arith = Some(crate::data::arith::generate(&cfg.task.arith)?);
    }
    let (train, heldout) = arith.as_ref().expect("generated above");
    pretrain::<B>(spec, train, heldout, device, dir)
}

/// Pre-trains every tiny agent of `cfg` that is not cached yet (on `device`).
pub fn prepare_agents<B: Backend>(cfg: &crate::config::TrainConfig, device: &B::Device) -> Result<()> {
    let Ok(tiny) = tiny_specs(cfg) else { return Ok(()) };
    let mut arith = None;
    for spec in &tiny {
        let dir = agent_dir(spec, cfg)?;
        if is_cached(&dir) {
            continue;
        }
        if install_shipped(&dir)? {
            eprintln!("installed the shipped pre-trained {} in {}", spec.id, dir.display());
            continue;
        }
        eprintln!("pre-training {} (first run only; cached in {})", spec.id, dir.display());
        pretrain_for::<B>(spec, cfg, &mut arith, device, &dir)?;
    }
    Ok(())
}

/// The tiny specs of `cfg` (with its pre-training overrides); an error when there are none.
fn tiny_specs(cfg: &crate::config::TrainConfig) -> Result<Vec<TinySpec>> {
    let mut tiny: Vec<TinySpec> = cfg.policies.iter().filter_map(|a| find_for(&a.model, &cfg.pretrain)).collect();
    // Two policies may start from one agent (the delegation study's main and sub-agent).
    tiny.dedup_by(|a, b| a.id == b.id);
    if tiny.is_empty() {
        return Err(Error::config(
            "training config",
            format!("no tiny agents to pre-train (the tiny agents are {})", ids().join(", ")),
        ));
    }
    Ok(tiny)
}

/// `hacpo pretrain`: pre-trains every tiny agent of `cfg` from scratch (never from the cache or
/// the shipped copies) into `out/<id>-<key>/`; returns the directories. An existing directory
/// is refused, not replaced.
pub fn pretrain_agents<B: Backend>(
    cfg: &crate::config::TrainConfig,
    out: &Path,
    device: &B::Device,
) -> Result<Vec<PathBuf>> {
    let tiny = tiny_specs(cfg)?;
    let dirs: Vec<PathBuf> = tiny
        .iter()
        .map(|s| Ok(out.join(agent_dir(s, cfg)?.file_name().expect("cache dir name"))))
        .collect::<Result<_>>()?;
    if let Some(d) = dirs.iter().find(|d| d.exists()) {
        return Err(Error::InvalidArgument(format!(
            "{} already exists; remove it or choose another --out (pre-training never replaces an agent)",
            d.display()
        )));
    }
    let mut arith = None;
    for (spec, dir) in tiny.iter().zip(&dirs) {
        eprintln!("pre-training {} into {}", spec.id, dir.display());
        pretrain_for::<B>(spec, cfg, &mut arith, device, dir)?;
    }
    Ok(dirs)
}

/// Whether the tiny agent `id` is pre-trained for `cfg`'s task (the error says what to set).
pub fn check_task(id: &str, cfg: &crate::config::TrainConfig) -> Result<()> {
    match find_for(id, &cfg.pretrain) {
        Some(spec) => agent_dir(&spec, cfg).map(|_| ()),
        None => Ok(()),
    }
}

/// What the trainer loads for an agent spec: a tiny id's cached directory, else the spec.
pub fn resolve(spec: &str, cfg: &crate::config::TrainConfig) -> Result<String> {
    let Some(t) = find_for(spec, &cfg.pretrain) else { return Ok(spec.to_string()) };
    let dir = agent_dir(&t, cfg)?;
    if !is_cached(&dir) {
        return Err(Error::NotFound {
            what: format!("pre-trained {spec}"),
            path: dir,
            hint: "`hacpo train` pre-trains tiny agents before training; run it with this config.".into(),
        });
    }
    Ok(dir.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, TrainConfig};
    use crate::data::arith::ArithConfig;

    fn default_config() -> TrainConfig {
        TrainConfig::from_toml(EMBEDDED_DEFAULT, EMBEDDED_DEFAULT_NAME, &[]).unwrap()
    }

    /// The configs whose tiny agents are shipped: the embedded default and the tiny studies.
    fn shipping_configs() -> Vec<TrainConfig> {
        let study = |name: &str| {
            let path = format!("{}/configs/{name}", env!("CARGO_MANIFEST_DIR"));
            TrainConfig::from_toml(&std::fs::read_to_string(&path).unwrap(), &path, &[]).unwrap()
        };
        vec![default_config(), study("tiny-search.toml"), study("tiny-planpath.toml"), study("tiny-delegate.toml")]
    }

    fn record(dir: &str) -> serde_json::Value {
        let (_, files) = SHIPPED.iter().find(|(d, _)| *d == dir).unwrap();
        serde_json::from_slice(files[AGENT_FILES.iter().position(|f| *f == "pretrain.json").unwrap()]).unwrap()
    }

    #[test]
    fn the_shipped_agents_are_the_current_specs_pre_trained_on_their_configs_tasks() {
        let shipped = shipped_dirs();
        let mut expected = vec![];
        for cfg in shipping_configs() {
            for policy in &cfg.policies {
                let spec = find_for(&policy.model, &cfg.pretrain).unwrap();
                let dir = agent_dir(&spec, &cfg).unwrap();
                let name = dir.file_name().unwrap().to_str().unwrap().to_string();
                assert!(
                    shipped.contains(&name.as_str()),
                    "models/tiny/pretrained has no {name}: the spec of {} or its config's task changed. Run \
                     `hacpo pretrain --config <its config> --out models/tiny/pretrained`, name the new \
                     directories in SHIPPED (src/tiny/mod.rs) and delete the old ones",
                    spec.id
                );
                assert_eq!(record(&name)["spec"], serde_json::to_value(&spec).unwrap(), "{name}'s record");
                if !expected.contains(&name) {
                    expected.push(name);
                }
            }
        }
        assert_eq!(shipped.len(), expected.len(), "a shipped agent no config uses: {shipped:?}");
    }

    /// The shipped files are the pre-trained agents their records describe: installed, loaded and
    /// measured again, each reaches its recorded held-out score (the arithmetic agents' accuracy
    /// on 100 problems, far above an untrained model's 0; the search agent's share of greedy
    /// outputs that are demonstrated ones).
    #[test]
    fn the_shipped_agents_install_load_and_score_their_recorded_accuracy() {
        let tmp = tempfile::tempdir().unwrap();
        let mut seen = std::collections::HashSet::new();
        for cfg in shipping_configs() {
            let mut arith = None;
            for policy in &cfg.policies {
                let spec = find_for(&policy.model, &cfg.pretrain).unwrap();
                let name = agent_dir(&spec, &cfg).unwrap().file_name().unwrap().to_str().unwrap().to_string();
                if !seen.insert(name.clone()) {
                    continue;
                }
                let dir = tmp.path().join(&name);
                assert!(install_shipped(&dir).unwrap());
                assert!(is_cached(&dir));
                let agent =
                    crate::model::load::<crate::backend::Cpu>(dir.to_str().unwrap(), &Default::default()).unwrap();
                let (model, tokenizer, eos) = (&agent.model, &agent.tokenizer, &agent.eos_token_ids);
                let (measured, floor, slack) = if spec.corpus.planner.is_some() {
                    let demos = planner::held_out(&spec, &cfg.workload.turns).unwrap();
                    (planner::skill(model, tokenizer, eos, &demos).unwrap().known, 0.5, 0.02)
                } else if spec.corpus.delegate.is_some() {
                    let turns =
                        delegate::held_out(&spec, &cfg.task.kb, tokenizer, eos, &cfg.workload.delegate).unwrap();
                    // 150 turns: allow three near-ties to flip on another CPU.
                    (delegate::skill(model, tokenizer, eos, &turns).unwrap().known, 0.5, 0.02)
                } else if spec.corpus.search.is_some() {
                    let demos = search::held_out(&spec, &cfg.task.kb).unwrap();
                    // 150 outputs: allow three near-ties to flip on another CPU.
                    (search::skill(model, tokenizer, eos, &demos).unwrap().known, 0.5, 0.02)
                } else {
                    let (train, heldout) =
                        arith.get_or_insert_with(|| crate::data::arith::generate(&cfg.task.arith).unwrap());
                    let max_new = max_solution_tokens(tokenizer, train).unwrap();
                    // 100 problems: allow two.
                    (accuracy(model, tokenizer, eos, &heldout[..EVAL_PROBLEMS], max_new).unwrap(), 0.3, 0.02)
                };
                let recorded = record(&name)["report"]["accuracy"].as_f64().unwrap();
                assert!(recorded > floor, "{name} records {recorded}");
                assert!(
                    (measured - recorded).abs() <= slack + 1e-9,
                    "{name}: measured {measured}, recorded {recorded}"
                );
            }
        }
        // Nothing is installed under a name that is not shipped.
        assert!(!install_shipped(&tmp.path().join("tiny-qwen-0000000000000000")).unwrap());
    }

    #[test]
    fn built_in_specs_parse_and_are_about_4x_apart() {
        let q = find("tiny-qwen").unwrap();
        let l = find("tiny-llama").unwrap();
        let pq = model_config(&q, q.vocab_size, &[0]).unwrap().num_parameters() as f64;
        let pl = model_config(&l, l.vocab_size, &[0]).unwrap().num_parameters() as f64;
        assert!((3.0..6.0).contains(&(pq / pl)), "{pq} vs {pl}");
        assert!(find("tiny-gpt").is_none());
        let a = ArithConfig::default();
        // The key covers the task and the pre-training settings (its stability across builds is
        // checked against the shipped directory names).
        assert_ne!(cache_dir(&q, &a), cache_dir(&q, &ArithConfig { max_ops: 3, ..a.clone() }));
        let mut longer = q.clone();
        longer.pretrain.max_steps += 1;
        assert_ne!(cache_dir(&q, &a), cache_dir(&longer, &a));
        let name = cache_dir(&q, &a).file_name().unwrap().to_str().unwrap().to_string();
        let key = name.strip_prefix("tiny-qwen-").unwrap();
        assert!(key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
        // Different families, different habits: each can show the other what it gets wrong.
        assert!(q.corpus.habit.is_some() && l.corpus.habit.is_some() && q.corpus.habit != l.corpus.habit);
    }

    /// The delegation agent is pre-trained for the delegation workload over tiny-kb only, and
    /// its key follows what its demonstrations show (the search's hit count, the instructions).
    #[test]
    fn the_delegation_agent_asks_for_its_workload_and_keys_on_what_its_demonstrations_show() {
        let path = format!("{}/configs/tiny-delegate.toml", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let with = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            TrainConfig::from_toml(&text, &path, &sets).unwrap()
        };
        assert!(check_task("tiny-delegate", &with(&[])).is_ok());
        let err = check_task("tiny-delegate", &with(&["workload.kind=search"])).unwrap_err().to_string();
        assert!(err.contains("workload.kind = \"delegate\"") && err.contains("configs/tiny-delegate.toml"), "{err}");
        let spec = find("tiny-delegate").unwrap();
        let dir = |sets: &[&str]| agent_dir(&spec, &with(sets)).unwrap();
        assert_ne!(dir(&[]), dir(&["workload.delegate.search_k=5"]));
        assert_ne!(dir(&[]), dir(&["workload.delegate.instructions=\"full\""]));
        assert_eq!(dir(&[]), dir(&["workload.delegate.calls=2"]), "the limits are not in the demonstrations' text");
    }

    /// A delegation curriculum's stages name agents (an unknown one is refused) and scale with
    /// a budget as a search one's do.
    #[test]
    fn a_delegation_curriculum_names_agents_and_scales_with_a_budget() {
        use delegate::Agent;
        let stage: Stage<Agent> = toml::from_str("roles = [\"sub\"]\nsteps = 600\n").unwrap();
        assert_eq!(stage.roles, vec![Agent::Sub]);
        assert!(toml::from_str::<Stage<Agent>>("roles = [\"planner\"]\nsteps = 1\n").is_err());
        let mut stages = vec![stage, Stage { roles: Agent::ALL.to_vec(), steps: 900, lr: Some(5e-4) }];
        rescale(&mut stages, 1500, 10);
        assert_eq!(stages.iter().map(|s| s.steps).collect::<Vec<_>>(), vec![4, 6]);
        rescale(&mut stages, 10, 3);
        assert_eq!(stages.iter().map(|s| s.steps).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn the_search_agents_curriculum_adds_up_to_its_budget_and_scales_with_an_override() {
        let steps = |s: &TinySpec| s.corpus.search.as_ref().unwrap().stages.iter().map(|s| s.steps).collect::<Vec<_>>();
        let spec = find("tiny-searcher").unwrap();
        assert!(steps(&spec).len() > 1);
        assert_eq!(steps(&spec).iter().sum::<usize>(), spec.pretrain.max_steps);
        let short = find_for("tiny-searcher", &crate::config::PretrainConfig { max_steps: 10 }).unwrap();
        assert!(
            steps(&short).iter().all(|&s| s >= 1) && steps(&short).iter().sum::<usize>() == 10,
            "{:?}",
            steps(&short)
        );
    }

    #[test]
    fn the_corpus_mixes_in_the_habit_at_its_rate_and_only_where_it_applies() {
        let cfg = ArithConfig { train_size: 4000, heldout_size: 10, ..Default::default() };
        let (train, _) = crate::data::arith::generate(&cfg).unwrap();
        let corpus = CorpusConfig {
            habit: Some(Habit::LossAsGain),
            habit_rate: 0.7,
            search: None,
            planner: None,
            delegate: None,
        };
        let solutions = corpus.solutions(&train, 3);
        assert_eq!(solutions, corpus.solutions(&train, 3), "deterministic");
        let has_loss = |p: &ArithProblem| p.ops.iter().any(|o| matches!(o, crate::data::arith::Op::Loss(_)));
        let (mut applicable, mut slipped) = (0, 0);
        for (p, s) in train.iter().zip(&solutions) {
            if has_loss(p) {
                applicable += 1;
                slipped += (s != &p.solution) as usize;
            } else {
                assert_eq!(s, &p.solution, "no loss, nothing to slip on");
            }
        }
        let rate = slipped as f64 / applicable as f64;
        assert!((0.66..0.74).contains(&rate), "{rate} of {applicable}");
        assert_eq!(
            CorpusConfig::default().solutions(&train, 3),
            train.iter().map(|p| p.solution.clone()).collect::<Vec<_>>()
        );
    }
}
