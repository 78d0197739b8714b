//! The collaborative trainer end to end on CPU: tiny random models around the *real* Qwen3,
//! Llama-3.1 (and GPT-2) tokenizers, so rollouts cross tokenizer families.

mod common;

use std::path::Path;
use std::sync::Arc;

use hacpo::backend::Cpu;
use hacpo::config::{PolicyConfig, TrainConfig};
use hacpo::model::weights::export;
use hacpo::rl::Capabilities;
use hacpo::rl::hacpo::{self as algo, HacpoConfig};
use hacpo::rl::records::{PoolSample, SampleTerms};
use hacpo::task::{Task, TaskPrompt};
use hacpo::tokenizer::Message;
use hacpo::trainer::{Inputs, Trainer};

/// A verifiable task on GSM8K questions whose reward reads the response alone (the Task trait
/// is the plug-in point for any checkable reward).
struct ResponseTask {
    name: &'static str,
    prompts: Vec<TaskPrompt>,
    reward: fn(&str) -> f64,
}

impl ResponseTask {
    fn new(name: &'static str, n: usize, reward: fn(&str) -> f64) -> Self {
        let text = std::fs::read_to_string(common::shared("data/math/gsm8k_test.jsonl")).unwrap();
        let prompts = text
            .lines()
            .take(n)
            .enumerate()
            .map(|(i, l)| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                TaskPrompt {
                    id: i.to_string(),
                    messages: vec![Message::user(v["question"].as_str().unwrap())],
                    gold: String::new(),
                }
            })
            .collect();
        ResponseTask { name, prompts, reward }
    }

    /// Reward 1 if the response contains a digit: random models sometimes write one.
    fn contains_digit(n: usize) -> Self {
        Self::new("contains-digit", n, |r| if r.chars().any(|c| c.is_ascii_digit()) { 1.0 } else { 0.0 })
    }

    /// A reward that differs between any two different responses (a hash of the text in
    /// [0, 1)): every group holding two different samples gets non-zero advantages, whatever an
    /// untrained model writes, so a test of gradient flow does not hang on sampling luck.
    fn text_hash(n: usize) -> Self {
        Self::new("text-hash", n, |r| (hacpo::stable_hash::hash_bytes(r.as_bytes()) % 1000) as f64 / 1000.0)
    }

    /// Reward 1 when the response starts with "2": the tiny agents write "1"s and "2"s, so
    /// about half their responses earn it, and the policy gradient must push that share up.
    fn starts_with_two(n: usize) -> Self {
        Self::new("starts-with-two", n, |r| if r.trim_start().starts_with('2') { 1.0 } else { 0.0 })
    }
}

impl Task for ResponseTask {
    fn name(&self) -> &str {
        self.name
    }
    fn train(&self) -> &[TaskPrompt] {
        &self.prompts
    }
    fn validation(&self) -> &[TaskPrompt] {
        &[]
    }
    fn reward(&self, _: &TaskPrompt, response: &str) -> f64 {
        (self.reward)(response)
    }
}

/// The trainer's inputs for `cfg`'s models as given (fixture paths), on the test device.
fn given(cfg: &TrainConfig, task: impl Task + 'static, policies: usize) -> Inputs<Cpu> {
    Inputs::as_given(cfg, Arc::new(task), vec![common::device(); policies])
}

fn config(run: &Path, agents: &[&Path], algo_name: &str) -> TrainConfig {
    let mut cfg = TrainConfig::default();
    cfg.run.out_dir = run.to_path_buf();
    cfg.run.seed = 3;
    cfg.run.steps = 2;
    cfg.run.checkpoint_every = 1;
    cfg.run.dump_batches = true;
    cfg.run.dump_rollouts = true;
    cfg.algo.name = algo_name.into();
    cfg.algo.group_size = 4;
    cfg.algo.prompts_per_step = 2;
    cfg.algo.minibatch_prompts = 1;
    cfg.algo.micro_batch_sequences = 4;
    cfg.algo.optimizer.lr = 1e-3;
    cfg.rollout.max_new_tokens = 12;
    cfg.rollout.batch_prompts = 2;
    cfg.policies = agents.iter().map(|p| PolicyConfig::new(p.to_str().unwrap())).collect();
    cfg
}

/// Checks every dumped mini-batch against the RL core: advantages recomputed from the pool,
/// each response's terms from its log-probs, and the loss as their negative mean.
fn check_dumps_against_rl_core(run: &Path, agents: usize) -> usize {
    let mut checked = 0;
    let mut crossed = vec![false; agents];
    for entry in std::fs::read_dir(run.join("batches")).unwrap() {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap()).unwrap();
        let learner = v["learner"].as_u64().unwrap() as usize;
        let cfg: HacpoConfig = serde_json::from_value(v["config"].clone()).unwrap();
        let caps = Capabilities::fixed(serde_json::from_value(v["capabilities"].clone()).unwrap());
        let m = v["minibatch_index"].as_u64().unwrap() as usize;
        let pool: Vec<PoolSample> = v["pool"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| PoolSample {
                agent: p["agent"].as_u64().unwrap() as usize,
                group: p["prompt"].as_u64().unwrap() as usize,
                reward: p["reward"].as_f64().unwrap(),
            })
            .collect();
        let advantages = algo::advantages(&pool, learner, &caps, &cfg).unwrap();
        let mut objectives = Vec::new();
        for s in v["minibatch"].as_array().unwrap() {
            let i = s["pool_index"].as_u64().unwrap() as usize;
            let dumped: SampleTerms = serde_json::from_value(s["terms"].clone()).unwrap();
            let (tgt, src) = (s["mean_logp_target"].as_f64().unwrap(), s["mean_logp_source"].as_f64().unwrap());
            let core = algo::sample_terms(pool[i].agent, learner, advantages[i], tgt, src, m, &caps, &cfg);
            assert_eq!(dumped, core, "learner {learner}, mini-batch {m}, sample {i}");
            assert_eq!(core.cross, pool[i].agent != learner);
            if core.cross {
                crossed[learner] = true;
            }
            objectives.push(core.objective);
        }
        let want = -objectives.iter().sum::<f64>() / objectives.len() as f64;
        let got = v["pg_loss"].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "pg_loss {got} vs RL core {want}");
        checked += 1;
    }
    assert!(crossed.iter().all(|&c| c), "every learner trained on other agents' rollouts: {crossed:?}");
    checked
}

fn run_and_check(agents: &[&Path], expected_dumps: usize) {
    let run = tempfile::tempdir().unwrap();
    let cfg = config(run.path(), agents, "hacpo");
    let before: Vec<_> = agents
        .iter()
        .map(|p| hacpo::model::load_model_dir::<Cpu>(p, &common::device()).unwrap())
        .map(|m| export(&m))
        .collect();
    let mut trainer =
        Trainer::<Cpu>::start(cfg.clone(), given(&cfg, ResponseTask::contains_digit(8), agents.len())).unwrap();
    let summary = trainer.run().unwrap();
    assert_eq!(summary.steps, 2);

    // Both (all) models' weights changed.
    for (k, agent) in trainer.policies.iter().enumerate() {
        let after = export(&agent.inference_model());
        let changed = before[k].iter().zip(&after).filter(|((_, a), (_, b))| a.data != b.data).count();
        assert!(changed > after.len() / 2, "agent {k}: only {changed} of {} tensors changed", after.len());
    }
    // Metrics: one line per step and agent, with verl-style and HACPO names.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run.path().join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2 * agents.len());
    for key in [
        "critic/score/mean",
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/grad_norm",
        "response_length/mean",
        "timing_s/gen",
        "timing_s/update",
        "perf/throughput",
        "perf/micro_batches",
        "hacpo/capability",
        "hacpo/omega_mean",
        "hacpo/cross_clip_frac",
        "hacpo/cross_ratio_mean",
    ] {
        assert!(lines.iter().all(|l| l["data"][key].is_number()), "metric {key} missing: {}", lines[0]);
    }
    // Checkpoints: HF layout per agent, optimizer state, trainer state; `latest` → step 2.
    let latest = std::fs::read_to_string(run.path().join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-000002");
    let ckpt = run.path().join("checkpoints/step-000002");
    for k in 0..agents.len() {
        for f in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"] {
            assert!(ckpt.join(format!("agent-{k}/{f}")).exists(), "agent-{k}/{f}");
        }
        assert!(ckpt.join(format!("agent-{k}.optim.safetensors")).exists());
    }
    assert!(ckpt.join("trainer_state.json").exists());
    assert!(run.path().join("config.toml").exists());
    // Advantages and losses are the RL core's.
    assert_eq!(check_dumps_against_rl_core(run.path(), agents.len()), expected_dumps);
    check_rollout_dumps(run.path(), agents.len());
}

/// `run.dump_rollouts`: one file per step, one line per sample (2 prompts × 4 per agent), each
/// reward the task's reward of the dumped response.
fn check_rollout_dumps(run: &Path, agents: usize) {
    let task = ResponseTask::contains_digit(8);
    for step in 1..=2 {
        let text = std::fs::read_to_string(run.join(format!("rollouts/step-{step:06}.jsonl"))).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2 * 4 * agents, "step {step}");
        for l in &lines {
            assert_eq!(l["step"], step);
            assert!(l["messages"].as_array().is_some_and(|m| !m.is_empty()), "{l}");
            let response = l["response"].as_str().unwrap();
            assert_eq!(l["reward"].as_f64().unwrap(), (task.reward)(response), "{l}");
        }
        let policies: std::collections::BTreeSet<u64> = lines.iter().map(|l| l["policy"].as_u64().unwrap()).collect();
        assert_eq!(policies.len(), agents);
    }
}

#[test]
fn two_agents_qwen3_and_llama31_tokenizers() {
    let qwen = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let llama = common::tiny_agent("llama3.1", "llama", 40, 2);
    // 2 steps × 2 learners × 4 mini-batches (2 prompts × 4 × 2 agents / (1 prompt × 4)).
    run_and_check(&[qwen.path(), llama.path()], 2 * 2 * 4);
}

#[test]
fn three_agents_three_tokenizer_families() {
    let qwen = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let llama = common::tiny_agent("llama3.1", "llama", 40, 2);
    let gpt2 = common::tiny_agent("gpt2", "qwen2", 48, 3);
    run_and_check(&[qwen.path(), llama.path(), gpt2.path()], 2 * 3 * 6);
}

/// The loop learns: sampled reward rises over a few HACPO steps for both agents (CPU runs
/// are deterministic, so this is not a flaky threshold).
#[test]
fn hacpo_raises_a_learnable_reward_for_both_agents() {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, &["1", "2"]);
    let run = tempfile::tempdir().unwrap();
    let mut cfg = config(run.path(), &[qwen.path(), llama.path()], "hacpo");
    cfg.run.steps = 8;
    cfg.run.checkpoint_every = 0;
    cfg.run.dump_batches = false;
    cfg.algo.group_size = 8;
    cfg.algo.prompts_per_step = 4;
    cfg.algo.minibatch_prompts = 4;
    cfg.algo.micro_batch_sequences = 16;
    cfg.algo.optimizer.lr = 3e-3;
    cfg.algo.optimizer.weight_decay = 0.0;
    cfg.algo.kl_coef = 0.0;
    cfg.rollout.max_new_tokens = 4;
    cfg.rollout.batch_prompts = 4;
    let task = ResponseTask::starts_with_two(8);
    let mut trainer = Trainer::<Cpu>::start(cfg.clone(), given(&cfg, task, 2)).unwrap();
    let mut scores: Vec<Vec<f64>> = vec![vec![]; 2];
    for _ in 0..8 {
        trainer.train_step().unwrap();
        for (k, (_, m)) in trainer.last_metrics.iter().enumerate() {
            scores[k].push(m["critic/score/mean"]);
        }
    }
    for (k, s) in scores.iter().enumerate() {
        eprintln!("agent {k}: sampled reward per step {s:?}");
        let first = (s[0] + s[1]) / 2.0;
        let last = (s[6] + s[7]) / 2.0;
        assert!(last >= first + 0.2, "agent {k}: reward {first:.2} → {last:.2} ({s:?})");
    }
}

/// Every algorithm of the registry runs through the one trainer (KL term on, so the reference
/// models load and score): finite losses, non-zero gradients, a checkpoint.
#[test]
fn every_registered_algorithm_trains_through_the_same_trainer() {
    let qwen = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let llama = common::tiny_agent("llama3.1", "llama", 40, 2);
    // The algorithms of single-stage workloads; MHGPO's tree algorithms train the search
    // pipeline (tests/search_train.rs), the turn-wise ones the planning teams
    // (tests/turns_train.rs).
    let single_stage = hacpo::workload::WorkloadKind::Exchange.algorithms();
    for name in single_stage {
        let run = tempfile::tempdir().unwrap();
        let mut cfg = config(run.path(), &[qwen.path(), llama.path()], name);
        cfg.run.steps = 1;
        cfg.run.dump_batches = false;
        cfg.algo.minibatch_prompts = 2;
        cfg.algo.kl_coef = 0.01;
        let mut trainer = Trainer::<Cpu>::start(cfg.clone(), given(&cfg, ResponseTask::text_hash(4), 2)).unwrap();
        assert_eq!(trainer.algorithm_name(), name);
        trainer.run().unwrap();
        for (agent, m) in &trainer.last_metrics {
            for key in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean"] {
                assert!(m[key].is_finite(), "{name}, {agent}: {key} = {}", m[key]);
            }
            assert!(m["actor/grad_norm"] > 0.0, "{name}, {agent}: no gradient");
        }
        assert!(run.path().join("checkpoints/step-000001/trainer_state.json").exists(), "{name}");
    }
}

/// `actor/ppo_kl` (verl's name) is the mean old − new log-prob over a learner's own tokens in
/// each mini-batch that holds some, averaged over those: 0 in a step's first update, which runs
/// on the weights that sampled, and in each later one what its dumped own responses give (their
/// mean log-probs under the sampling weights and the updated ones, weighted by their tokens).
/// GRPO learns from its own samples only; HACPO also from the other agent's, whose rows must
/// stay out (their log-probs are of another tokenizer's tokens); micro-batches of 2 sequences
/// sum the mini-batches' parts.
#[test]
fn ppo_kl_is_how_far_each_update_has_moved_from_the_sampling_policy() {
    let qwen = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let llama = common::tiny_agent("llama3.1", "llama", 40, 2);
    for name in ["grpo", "hacpo"] {
        let run = tempfile::tempdir().unwrap();
        let mut cfg = config(run.path(), &[qwen.path(), llama.path()], name);
        cfg.run.steps = 1;
        cfg.algo.micro_batch_sequences = 2;
        // Own and the other agent's samples in every mini-batch.
        cfg.algo.hacpo.minibatch_order = hacpo::rl::MinibatchOrder::Interleaved;
        let mut trainer = Trainer::<Cpu>::start(cfg.clone(), given(&cfg, ResponseTask::text_hash(4), 2)).unwrap();
        trainer.run().unwrap();
        for (learner, (agent, metrics)) in trainer.last_metrics.iter().enumerate() {
            let drift = own_drift_by_minibatch(run.path(), learner);
            assert!(drift.len() >= 2, "{name}, {agent}: {drift:?}");
            assert!(drift[0].abs() < 1e-6, "{name}, {agent}: the first update's ratios are not 1: {drift:?}");
            assert!(drift[1..].iter().all(|d| d.abs() > 1e-5), "{name}, {agent}: an update did not move: {drift:?}");
            let expected = drift.iter().sum::<f64>() / drift.len() as f64;
            let got = metrics["actor/ppo_kl"];
            let close = (got - expected).abs() <= 1e-6 + 1e-4 * expected.abs();
            assert!(close, "{name}, {agent}: ppo_kl {got}, the dumps give {expected} ({drift:?})");
        }
    }
}

/// Each dumped mini-batch's mean old − new log-prob over `learner`'s own responses, weighted by
/// their tokens, in mini-batch order.
fn own_drift_by_minibatch(run: &Path, learner: usize) -> Vec<f64> {
    (0..)
        .map(|m| run.join(format!("batches/step-000001-learner-{learner}-mb-{m}.json")))
        .take_while(|path| path.exists())
        .map(|path| {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let (mut sum, mut tokens) = (0.0, 0.0);
            for r in v["minibatch"].as_array().unwrap() {
                let sample = &v["pool"][r["pool_index"].as_u64().unwrap() as usize];
                if sample["agent"].as_u64().unwrap() as usize != learner {
                    continue;
                }
                let n = r["tokens"].as_f64().unwrap();
                sum += n * (r["mean_logp_source"].as_f64().unwrap() - r["mean_logp_target"].as_f64().unwrap());
                tokens += n;
            }
            sum / tokens
        })
        .collect()
}

/// DAPO's dynamic sampling (`algo.filter_groups`): a step trains only on groups whose rewards
/// differ (the dumped pools hold no flat group), draws more prompts while it has fewer than
/// `prompts_per_step` with signal, and reports the draws, the flat shares and the entropy.
#[test]
fn dynamic_sampling_trains_only_on_groups_with_signal() {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, &["1", "2"]);
    let run = tempfile::tempdir().unwrap();
    let mut cfg = config(run.path(), &[qwen.path(), llama.path()], "hacpo");
    cfg.run.steps = 3;
    cfg.algo.group_size = 2;
    cfg.algo.prompts_per_step = 4;
    cfg.algo.minibatch_prompts = 4;
    cfg.algo.filter_groups = true;
    cfg.algo.filter_max_draws = 6;
    cfg.rollout.max_new_tokens = 4;
    let mut trainer = Trainer::<Cpu>::start(cfg.clone(), given(&cfg, ResponseTask::starts_with_two(16), 2)).unwrap();
    trainer.run().unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run.path().join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // With G = 2 and about half the responses rewarded, about half the groups are flat: more
    // than one rollout per step is needed for four prompts with signal.
    assert!(lines.iter().any(|l| l["data"]["groups/draws"].as_f64().unwrap() > 1.0), "{}", lines[0]);
    for l in &lines {
        for key in ["groups/flat_share", "groups/solver/flat_share", "groups/prompts_with_signal", "actor/entropy"] {
            assert!(l["data"][key].is_number(), "{key} missing: {l}");
        }
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(run.path().join("batches")).unwrap() {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap()).unwrap();
        let mut rewards: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
        for p in v["pool"].as_array().unwrap() {
            rewards.entry(p["prompt"].as_u64().unwrap()).or_default().push(p["reward"].as_f64().unwrap());
        }
        for (group, r) in rewards {
            assert!(r.iter().any(|&x| x != r[0]), "a flat group was trained on: group {group} {r:?}");
            checked += 1;
        }
    }
    assert!(checked > 0);
}

/// One update per step (GRPO with one mini-batch, KL on): the trainer takes the old log-probs
/// from the update's own pass and skips the scoring stage's (`timing_s/old_log_prob` is 0), and
/// the step's numbers are those of a run that scores them apart (`algo.score_old_separately`):
/// losses, gradient norms, the sampled entropy (read from the log-probs the update handed back)
/// and the dumped source log-probs, to rounding.
#[test]
fn a_step_with_one_update_takes_its_old_log_probs_from_the_update() {
    let qwen = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let llama = common::tiny_agent("llama3.1", "llama", 40, 2);
    let step = |separately: bool| {
        let run = tempfile::tempdir().unwrap();
        let mut cfg = config(run.path(), &[qwen.path(), llama.path()], "grpo");
        cfg.run.steps = 1;
        cfg.algo.minibatch_prompts = 2;
        cfg.algo.kl_coef = 0.01;
        cfg.algo.score_old_separately = separately;
        let mut trainer = Trainer::<Cpu>::start(cfg.clone(), given(&cfg, ResponseTask::text_hash(4), 2)).unwrap();
        trainer.run().unwrap();
        let mut dumped: Vec<f64> = Vec::new();
        let mut names: Vec<_> =
            std::fs::read_dir(run.path().join("batches")).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        for path in names {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            dumped.extend(v["minibatch"].as_array().unwrap().iter().map(|r| r["mean_logp_source"].as_f64().unwrap()));
        }
        (trainer.last_metrics.clone(), dumped)
    };
    let ((apart, apart_dumps), (in_update, update_dumps)) = (step(true), step(false));
    // Relative, or absolute near 0: a group's policy loss is a sum of ratio × advantage whose
    // advantages cancel, so rounding in the ratios (1e-7) is all that is left of it.
    let close = |a: f64, b: f64, what: &str| assert!((a - b).abs() <= 1e-5 * a.abs().max(0.1), "{what}: {a} vs {b}");
    assert_eq!(apart.len(), 2);
    for ((agent, a), (_, u)) in apart.iter().zip(&in_update) {
        assert!(a["timing_s/old_log_prob"] > 0.0, "{agent}: the separate pass did not run");
        assert_eq!(u["timing_s/old_log_prob"], 0.0, "{agent}: the scoring stage ran its old-policy pass");
        for key in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean"] {
            close(a[key], u[key], &format!("{agent}: {key}"));
        }
        // The ratios' denominators: the update's own values, or the scoring pass's, which runs
        // the same weights through the inference path.
        assert_eq!(u["actor/ppo_kl"], 0.0, "{agent}");
        assert!(a["actor/ppo_kl"].abs() < 1e-6, "{agent}: {}", a["actor/ppo_kl"]);
    }
    assert_eq!(apart_dumps.len(), update_dumps.len());
    assert!(!apart_dumps.is_empty());
    for (a, u) in apart_dumps.iter().zip(&update_dumps) {
        close(*a, *u, "a dumped source log-prob");
    }
}
