//! The trainer's stages one at a time, on tiny random models around the real Qwen3 and
//! Llama-3.1 tokenizers: retokenised views (routing stage) and micro-batch accumulation
//! (update stage). Routing itself is unit-tested in `src/trainer/routing.rs`.

mod common;

use std::path::Path;

use hacpo::backend::{Cpu, CpuAutodiff};
use hacpo::generate::FinishReason;
use hacpo::generate::score::score;
use hacpo::generate::shared_prompt::slots;
use hacpo::policy::Policy;
use hacpo::rl::{Routing, registry};
use hacpo::sample::{GroupKey, Sample};
use hacpo::tokenizer::Message;
use hacpo::train::optim::{AdamWConfig, LrSchedule};
use hacpo::trainer::micro_batches::MicroBatching::{self, Sequences, Tokens};
use hacpo::trainer::routing::{route, views};
use hacpo::trainer::update::{LearnerBatch, UpdateSettings, update_policy};

fn policy(k: usize, dir: &Path) -> Policy<Cpu> {
    let pretrained = hacpo::model::load_hf_dir::<CpuAutodiff>(dir, &common::device()).unwrap();
    Policy::new(
        k,
        format!("p{k}"),
        dir.display().to_string(),
        common::device(),
        pretrained,
        None,
        Default::default(),
        AdamWConfig { lr: 1e-3, ..Default::default() },
    )
}

fn sample(policy: &Policy<Cpu>, group: &str, text: &str, sample_index: usize) -> Sample {
    let messages = vec![Message::user(format!("What is {group}?"))];
    let prompt_ids = policy.encode_prompt(&messages, 256).unwrap();
    let response_ids =
        if text.is_empty() { vec![policy.eos().unwrap()] } else { policy.tokenizer.encode(text, false).unwrap() };
    let token_logps =
        score(&policy.inference_model(), &[(prompt_ids.clone(), response_ids.clone())], 1.0).unwrap().remove(0);
    Sample {
        id: 0,
        policy: policy.index,
        role: "solver".into(),
        group: GroupKey(group.into()),
        parent: None,
        turn: 0,
        prompt: 0,
        sample_index,
        messages,
        text: text.into(),
        prompt_ids,
        response_ids,
        token_logps,
        values: vec![],
        reward: Some((sample_index % 2) as f64),
        penalty: 0.0,
        score: None,
        train: true,
        policy_version: 0,
        finish_reason: FinishReason::Stop,
        loss_mask: vec![],
    }
}

/// One update of one mini-batch at temperature 1, no clipping to speak of, old log-probs from
/// the scoring stage.
fn update_settings(micro_batches: MicroBatching, gradient_checkpointing: bool, kl_coef: f64) -> UpdateSettings {
    UpdateSettings {
        step: 1,
        total_updates: 1,
        minibatches: 1,
        micro_batches,
        gradient_checkpointing,
        inv_temperature: 1.0,
        kl_coef,
        value_lr: None,
        grad_clip: 1e9,
        schedule: LrSchedule::default(),
        norm_length: 32,
        dump_dir: None,
        old_logps_from_pass: false,
    }
}

#[test]
fn views_reuse_own_ids_and_retokenise_other_policies_samples() {
    let (q, l) = (common::tiny_agent("qwen3", "qwen3", 32, 1), common::tiny_agent("llama3.1", "llama", 40, 2));
    let (qwen, llama) = (policy(0, q.path()), policy(1, l.path()));
    let samples = vec![
        sample(&qwen, "2+3", "so the answer is 5", 0),
        sample(&llama, "2+3", "2 + 3 = 5, answer 5", 0),
        sample(&llama, "2+3", "", 1),
    ];
    let v = views(&qwen, &samples, &[0, 1, 2], 512, 4).unwrap();
    assert_eq!(
        (v[0].prompt_ids.clone(), v[0].response_ids.clone()),
        (samples[0].prompt_ids.clone(), samples[0].response_ids.clone())
    );
    // Another tokenizer family: the learner's template and tokenizer, the response truncated.
    assert_eq!(v[1].prompt_ids, qwen.encode_prompt(&samples[1].messages, 512).unwrap());
    assert_ne!(v[1].prompt_ids, samples[1].prompt_ids, "Llama-3 and ChatML prompts differ");
    let full = qwen.tokenizer.encode("2 + 3 = 5, answer 5", false).unwrap();
    assert!(full.len() > 4);
    assert_eq!(v[1].response_ids, full[..4].to_vec());
    // An EOS-only response becomes the learner's EOS.
    assert_eq!(v[2].response_ids, vec![qwen.eos().unwrap()]);
    // The cross prompt is rendered with the learner's own limit (keeping the last tokens).
    let short = views(&qwen, &samples, &[1], 3, 64).unwrap();
    assert_eq!(short[0].prompt_ids, v[1].prompt_ids[v[1].prompt_ids.len() - 3..].to_vec());
}

/// Splitting a mini-batch into micro-batches, of sequences or by a token budget, must not
/// change the update: the losses add up and the accumulated gradient (its norm) is the one-pass
/// gradient, for the sequence-level (HACPO with cross samples), token-level (GRPO) and
/// constant-length (Dr. GRPO) losses, with the KL term on.
#[test]
fn micro_batches_and_gradient_checkpointing_give_the_one_pass_update() {
    let (q, l) = (common::tiny_agent("qwen3", "qwen3", 32, 1), common::tiny_agent("llama3.1", "llama", 40, 2));
    for name in ["hacpo", "grpo", "drgrpo"] {
        let settings = hacpo::config::AlgoConfig { kl_coef: 0.05, ..Default::default() };
        let mut algo = registry::build::<CpuAutodiff>(name, &settings.settings()).unwrap();
        let llama = policy(1, l.path());
        let base = policy(0, q.path());
        let mut samples = Vec::new();
        for (g, group) in ["2+3", "4*5"].iter().enumerate() {
            for i in 0..4 {
                samples.push(sample(&base, group, &format!("answer {}", i * 7 + g), i));
                samples.push(sample(&llama, group, &format!("it is {}", i * 3 + g), i));
            }
        }
        samples.sort_by_key(|s| (s.policy, s.group.clone(), s.sample_index));
        let pool: Vec<_> =
            samples.iter().map(|s| hacpo::rl::PoolSample { agent: s.policy, group: 0, reward: s.reward() }).collect();
        algo.observe(&pool, 2);
        let routed = route(&samples, 0, algo.routing());
        assert_eq!(routed.indices.len(), if algo.routing() == Routing::Shared { 16 } else { 8 });
        let advantages = algo.advantages(&routed.pool, 0).unwrap();
        // Reference log-probs: the old ones shifted, so the KL term is not zero.
        let refs: Vec<Option<Vec<f32>>> =
            samples.iter().map(|s| (s.policy == 0).then(|| s.token_logps.iter().map(|x| x - 0.3).collect())).collect();
        let mut metrics = Vec::new();
        // One pass, micro-batches, and both again with gradient checkpointing; a token budget
        // of a third of the mini-batch's slots (micro-batches of several sequences), and of
        // one token (every sequence alone).
        let whole = Sequences(routed.indices.len());
        let v = views(&base, &samples, &routed.indices, 512, 64).unwrap();
        let sequence = |j: usize| (v[j].prompt_ids.as_slice(), v[j].response_ids.as_slice());
        let positions: Vec<usize> = (0..v.len()).collect();
        let third = Tokens(
            slots(&positions.iter().map(|&j| (v[j].prompt_ids.clone(), v[j].response_ids.clone())).collect::<Vec<_>>())
                / 3,
        );
        let cut = third.cut(&positions, sequence);
        assert!(cut.len() > 2 && cut.iter().any(|m| m.len() > 1), "{name}: {cut:?}");
        let budgets = [(third, false), (Tokens(1), false), (third, true)];
        let cuts = [(whole, false), (Sequences(3), false), (Sequences(1), false), (whole, true), (Sequences(3), true)];
        for (micro, checkpointing) in cuts.into_iter().chain(budgets) {
            let mut p = policy(0, q.path());
            let batch = LearnerBatch {
                indices: routed.indices.clone(),
                pool: routed.pool.clone(),
                advantages: advantages.clone(),
                views: views(&p, &samples, &routed.indices, 512, 64).unwrap(),
                samples: &samples,
                ref_logps: &refs,
                tokens: None,
            };
            let settings = update_settings(micro, checkpointing, 0.05);
            metrics.push(update_policy(&mut p, algo.as_ref(), &batch, &settings).unwrap().metrics);
            assert_eq!(p.version, 1);
        }
        for m in &metrics[1..] {
            for key in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm"] {
                let (a, b) = (metrics[0][key], m[key]);
                assert!((a - b).abs() <= 1e-4 * a.abs().max(1e-3), "{name} {key}: one pass {a} vs {b}");
            }
        }
        assert!(metrics[0]["actor/kl_loss"] > 0.0 && metrics[0]["actor/grad_norm"] > 0.0, "{name}: {:?}", metrics[0]);
    }
}

/// With one mini-batch per step the update's forward pass runs on the old weights, so the old
/// log-probs it reads from itself are the scoring stage's numbers: the same losses, gradient
/// norm and weights after the step as with the separate scoring pass, to rounding (the two
/// passes batch and pad differently), for token-level (GRPO, Dr. GRPO) and sequence-level
/// (GSPO) losses, with the KL term, micro-batches and gradient checkpointing; and the
/// log-probs it hands back for the samples are the scored ones.
#[test]
fn old_log_probs_from_the_update_pass_give_the_separately_scored_update() {
    let q = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let base = policy(0, q.path());
    let samples: Vec<Sample> = (0..6)
        .map(|i| sample(&base, ["2+3", "4*5"][i / 3], &format!("so it is {} and {}", i * 13, i + 2), i % 3))
        .collect();
    let requests: Vec<(Vec<u32>, Vec<u32>)> =
        samples.iter().map(|s| (s.prompt_ids.clone(), s.response_ids.clone())).collect();
    // Reference log-probs: the old ones shifted, so the KL term is not zero.
    let refs: Vec<Option<Vec<f32>>> =
        samples.iter().map(|s| Some(s.token_logps.iter().map(|x| x - 0.3).collect())).collect();
    // Relative, or absolute near 0: a group's policy loss is a sum of ratio × advantage whose
    // advantages cancel, so rounding in the ratios (1e-7) is all that is left of it.
    let close = |a: f64, b: f64, what: &str| assert!((a - b).abs() <= 1e-5 * a.abs().max(0.1), "{what}: {a} vs {b}");
    for name in ["grpo", "drgrpo", "gspo"] {
        let settings = hacpo::config::AlgoConfig { kl_coef: 0.05, ..Default::default() };
        let algo = registry::build::<CpuAutodiff>(name, &settings.settings()).unwrap();
        let routed = route(&samples, 0, Routing::Own);
        let advantages = algo.advantages(&routed.pool, 0).unwrap();
        assert!(advantages.iter().any(|&a| a != 0.0), "{name}: no signal");
        // And micro-batches cut by a token budget of half the samples' slots.
        let half = Tokens(slots(&requests) / 2);
        for (micro, checkpointing) in
            [(Sequences(6), false), (Sequences(4), false), (Sequences(6), true), (half, false)]
        {
            let update = |from_pass: bool| {
                let mut p = policy(0, q.path());
                let mut given = samples.clone();
                if from_pass {
                    // Nothing scored them: the update must not read the samples' log-probs.
                    given.iter_mut().for_each(|s| s.token_logps.clear());
                }
                let batch = LearnerBatch {
                    indices: routed.indices.clone(),
                    pool: routed.pool.clone(),
                    advantages: advantages.clone(),
                    views: views(&p, &given, &routed.indices, 512, 64).unwrap(),
                    samples: &given,
                    ref_logps: &refs,
                    tokens: None,
                };
                let settings =
                    UpdateSettings { old_logps_from_pass: from_pass, ..update_settings(micro, checkpointing, 0.05) };
                let report = update_policy(&mut p, algo.as_ref(), &batch, &settings).unwrap();
                (report, score(&p.inference_model(), &requests, 1.0).unwrap())
            };
            let case = format!("{name}, micro-batch {micro:?}, checkpointing {checkpointing}");
            let ((scored, scored_after), (pass, pass_after)) = (update(false), update(true));
            assert!(scored.old_logps.is_empty(), "{case}");
            // Every own sample's, in the order the micro-batches ran them.
            let mut given: Vec<usize> = pass.old_logps.iter().map(|(i, _)| *i).collect();
            given.sort_unstable();
            assert_eq!(given, routed.indices, "{case}");
            for (i, logps) in &pass.old_logps {
                assert_eq!(logps.len(), samples[*i].token_logps.len(), "{case}");
                for (&a, &b) in samples[*i].token_logps.iter().zip(logps) {
                    close(a as f64, b as f64, &format!("{case}: old log-prob of sample {i}"));
                }
            }
            for key in ["actor/pg_loss", "actor/kl_loss", "actor/grad_norm"] {
                close(scored.metrics[key], pass.metrics[key], &format!("{case}: {key}"));
            }
            assert!(scored.metrics["actor/grad_norm"] > 0.0 && scored.metrics["actor/kl_loss"] > 0.0, "{case}");
            // Every weight that a log-prob reads, after the step.
            for (a, b) in scored_after.iter().flatten().zip(pass_after.iter().flatten()) {
                close(*a as f64, *b as f64, &format!("{case}: a log-prob after the step"));
            }
            let before = samples.iter().flat_map(|s| &s.token_logps);
            assert!(scored_after.iter().flatten().zip(before).any(|(a, b)| (a - b).abs() > 1e-4), "{case}: no change");
        }
    }
}

/// A multi-turn trajectory's environment tokens (tool responses between its turns) stay out of
/// the loss: what their old log-probs say changes nothing, what a trained token's says does;
/// a mask of all trues is no mask; and another tokenizer cannot re-encode such a sample.
#[test]
fn environment_tokens_between_turns_stay_out_of_the_loss() {
    let q = common::tiny_agent("qwen3", "qwen3", 32, 1);
    let base = policy(0, q.path());
    let mut samples: Vec<Sample> =
        (0..4).map(|i| sample(&base, "2+3", &format!("call {i} then the tool said {} so 5", i * 11), i)).collect();
    // The middle third of each response is the environment's.
    for s in &mut samples {
        let n = s.response_ids.len();
        s.loss_mask = (0..n).map(|t| !(n / 3..2 * n / 3).contains(&t)).collect();
        assert!(s.loss_mask.iter().any(|m| !m) && s.loss_mask.iter().filter(|&&m| m).count() > 1);
    }
    let algo = registry::build::<CpuAutodiff>("grpo", &hacpo::config::AlgoConfig::default().settings()).unwrap();
    let update = |samples: &[Sample]| -> (std::collections::BTreeMap<String, f64>, Vec<f32>) {
        let mut p = policy(0, q.path());
        let no_reference = vec![None; samples.len()];
        let routed = route(samples, 0, Routing::Own);
        let batch = LearnerBatch {
            indices: routed.indices.clone(),
            pool: routed.pool.clone(),
            advantages: algo.advantages(&routed.pool, 0).unwrap(),
            views: views(&p, samples, &routed.indices, 512, 64).unwrap(),
            samples,
            ref_logps: &no_reference,
            tokens: None,
        };
        let settings = update_settings(Sequences(2), false, 0.0);
        let metrics = update_policy(&mut p, algo.as_ref(), &batch, &settings).unwrap().metrics;
        let after =
            score(&p.inference_model(), &[(samples[0].prompt_ids.clone(), samples[0].response_ids.clone())], 1.0)
                .unwrap()
                .remove(0);
        (metrics.into_iter().collect(), after)
    };
    // Old log-probs that differ from the current policy's, so the ratios (and clips) matter.
    let shift = |samples: &mut [Sample], masked: bool, by: f32| {
        for s in samples.iter_mut() {
            for (lp, &m) in s.token_logps.iter_mut().zip(&s.loss_mask) {
                if m != masked {
                    *lp += by;
                }
            }
        }
    };
    let (reference, weights) = update(&samples);
    let mut env_shifted = samples.clone();
    shift(&mut env_shifted, true, -2.0);
    let (m, w) = update(&env_shifted);
    assert_eq!(m["actor/pg_loss"], reference["actor/pg_loss"]);
    assert_eq!(w, weights, "environment tokens' old log-probs moved the update");
    let mut trained_shifted = samples.clone();
    shift(&mut trained_shifted, false, -0.5);
    let (m, w) = update(&trained_shifted);
    assert_ne!(m["actor/pg_loss"], reference["actor/pg_loss"]);
    assert_ne!(w, weights, "a trained token's old log-prob must move the update");
    // All true is the same as no mask; and no mask trains on the environment's tokens too.
    let mut all_true = samples.clone();
    let mut unmasked = samples.clone();
    for (a, u) in all_true.iter_mut().zip(&mut unmasked) {
        a.loss_mask = vec![true; a.response_ids.len()];
        u.loss_mask.clear();
    }
    assert_eq!(update(&all_true), update(&unmasked));
    assert_ne!(update(&unmasked).1, weights);
    // A mask of the wrong length, and a re-encoding for another tokenizer, are refused.
    let mut bad = samples.clone();
    bad[0].loss_mask.pop();
    assert!(views(&base, &bad, &[0], 512, 64).is_err());
    let l = common::tiny_agent("llama3.1", "llama", 40, 2);
    let llama = policy(1, l.path());
    let err = views(&llama, &samples, &[0], 512, 64).unwrap_err().to_string();
    assert!(err.contains("environment tokens"), "{err}");
}
