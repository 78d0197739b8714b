//! The RL core against docs/algorithms.md §1–2: the worked example (§2.12), the guards, singleton
//! groups, three agents, the reductions to GSPO and to naive sharing, `hacpo rl inspect`, and
//! the tensor losses' autodiff gradients against the analytic gradient summary (§2.9).

mod common;

use std::process::Command;

use burn::tensor::{Tensor, TensorData};
use hacpo::backend::{Cpu, CpuAutodiff};
use hacpo::rl::hacpo::{self as algo, HacpoConfig, MinibatchOrder};
use hacpo::rl::objective::{self, LossAggregation};
use hacpo::rl::records::PoolSample;
use hacpo::rl::tensor::{self as rlt, SequenceBatch};
use hacpo::rl::{Capabilities, inspect::Input, stats};
use rand::{Rng, SeedableRng};

fn pool(rewards_by_agent: &[&[f64]]) -> Vec<PoolSample> {
    rewards_by_agent
        .iter()
        .enumerate()
        .flat_map(|(agent, rs)| rs.iter().map(move |&reward| PoolSample { agent, group: 0, reward }))
        .collect()
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b}");
}

#[test]
fn worked_example_of_section_2_12() {
    let samples = pool(&[&[1.0, 0.0, 1.0, 1.0], &[0.0, 0.0, 1.0, 0.0]]);
    let caps = Capabilities::fixed(vec![0.6, 0.3]);
    let cfg = HacpoConfig::default();
    assert_eq!(caps.ratio(0, 1), 2.0); // ω(A,B): B's rewards weigh 2 in A's baseline
    assert_eq!(cfg.coef(1, 0, &caps), 0.5); // ω(B,A) on B's samples
    let adv = algo::advantages(&samples, 0, &caps, &cfg).unwrap();
    close(stats::unbiased_std(&[1., 0., 1., 1., 0., 0., 1., 0.]), 0.534522, 1e-6, "std");
    for (a, s) in adv.iter().zip(&samples) {
        close(*a, if s.reward == 1.0 { 0.701559 } else { -1.169266 }, 1e-6, "advantage");
    }
    // Cross sample B#3 (r = 1): mean_tgt −1.2, mean_src −1.0.
    let rows = [
        (0.800, 0.818731, 0.235135, 0.235135),
        (0.825, 0.825, 0.238749, 0.0),
        (0.850, 0.850, 0.253438, 0.0),
        (0.875, 0.875, 0.268566, 0.0),
    ];
    for (m, (lower, clamped, obj, grad)) in rows.into_iter().enumerate() {
        close(cfg.cross_lower_bound(m), lower, 1e-12, "lower bound");
        let t = algo::sample_terms(1, 0, adv[6], -1.2, -1.0, m, &caps, &cfg);
        close(t.ratio, 0.818731, 1e-6, "s");
        close(t.clipped_ratio, clamped, 1e-6, "clamp(s)");
        close(t.objective, obj, 1e-6, &format!("objective at m={m}"));
        close(t.grad_weight, grad, 1e-6, &format!("gradient at m={m}"));
    }
    // Self sample, A = +0.701559: log-ratio +0.0002 unclipped, +0.0005 clipped at 1.0004.
    let t = algo::sample_terms(0, 0, adv[0], -1.0 + 0.0002, -1.0, 0, &caps, &cfg);
    close(t.objective, 0.701700, 1e-6, "self objective");
    close(t.grad_weight, t.ratio * adv[0], 1e-12, "self gradient");
    let t = algo::sample_terms(0, 0, adv[0], -1.0 + 0.0005, -1.0, 0, &caps, &cfg);
    close(t.objective, 0.701840, 1e-6, "clipped self objective");
    assert_eq!(t.grad_weight, 0.0);
}

#[test]
fn rl_inspect_prints_the_worked_example_table() {
    let fixture = common::fixture("rl/worked_example.json");
    let out = Command::new(common::hacpo_bin())
        .args(["rl", "inspect", "--input", fixture.to_str().unwrap(), "--minibatch-index", "0,1,2,3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = squeeze(&text);
    // The §2.12 table, one row per mini-batch index: lower, clamp(s), objective, gradient.
    for row in [
        "cross lower bound 0.800000",
        "0.818731   0.818731   0.235135   0.235135",
        "cross lower bound 0.825000",
        "0.818731   0.825000   0.238749   0.000000",
        "0.818731   0.850000   0.253438   0.000000",
        "0.818731   0.875000   0.268566   0.000000",
        "1.000200   1.000200   0.701700   0.701700",
        "1.000500   1.000400   0.701840   0.000000",
    ] {
        assert!(flat.contains(&squeeze(row)), "missing {row:?} in\n{text}");
    }
    // JSON output carries the same numbers.
    let out = Command::new(common::hacpo_bin())
        .args(["rl", "inspect", "--input", fixture.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    close(v["samples"][6]["objective"].as_f64().unwrap(), 0.235135, 1e-6, "json objective");
    close(v["samples"][6]["coef"].as_f64().unwrap(), 0.5, 0.0, "json coef");
    assert!(v["loss"].is_number());
}

#[test]
fn inspect_errors_name_the_field() {
    let cases = [
        (
            r#"{"samples": [{"agent": 0, "prompt": "p", "reward": "one", "mean_logp_target": 0, "mean_logp_source": 0}]}"#,
            "samples[0].reward",
        ),
        (r#"{"samples": [{"agent": 0, "prompt": "p", "reward": 1}]}"#, "samples[0].mean_logp_target"),
        (r#"{"capabilities": [0.5, 0], "samples": []}"#, "capabilities[1]"),
        (r#"{"alpha": -1, "samples": []}"#, "alpha"),
        (r#"{"alhpa": 1, "samples": []}"#, "alhpa"),
        (r#"{"learner": 0}"#, "samples"),
        ("[1, 2", "not valid JSON"),
    ];
    for (text, needle) in cases {
        let e = Input::parse(text).unwrap_err().to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
    // And through the CLI: exit code 2, one paragraph.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, cases[0].0).unwrap();
    let out =
        Command::new(common::hacpo_bin()).args(["rl", "inspect", "--input", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("samples[0].reward"));
}

#[test]
fn uniform_reward_guard() {
    // All correct, the other agent weaker: without the guard the weighted baseline exceeds 1.
    let samples = pool(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let caps = Capabilities::fixed(vec![0.8, 0.2]); // B's rewards weigh 4 in A's baseline
    let cfg = HacpoConfig::default();
    assert!(algo::advantages(&samples, 0, &caps, &cfg).unwrap().iter().all(|&a| a == 0.0));
    let off = HacpoConfig { uniform_reward_guard: false, binary_baseline_guard: false, ..cfg.clone() };
    let adv = algo::advantages(&samples, 0, &caps, &off).unwrap();
    // Baseline (2 + 4·2)/4 = 2.5, std 0 → every correct answer pushed down.
    assert!(adv.iter().all(|&a| (a - (1.0 - 2.5) / 1e-6).abs() < 1e-3), "{adv:?}");
}

#[test]
fn binary_baseline_guard() {
    let samples = pool(&[&[1.0, 0.0], &[1.0, 1.0]]);
    let caps = Capabilities::fixed(vec![0.9, 0.1]); // ω(A,B) = 9: weighted baseline (1 + 18)/4 = 4.75 > 1
    let cfg = HacpoConfig::default();
    let adv = algo::advantages(&samples, 0, &caps, &cfg).unwrap();
    let std = stats::unbiased_std(&[1.0, 0.0, 1.0, 1.0]) + 1e-6;
    // Guarded: baseline = A's own mean reward 0.5.
    for (a, s) in adv.iter().zip(&samples) {
        close(*a, (s.reward - 0.5) / std, 1e-12, "guarded advantage");
    }
    let off = HacpoConfig { binary_baseline_guard: false, ..cfg };
    let adv = algo::advantages(&samples, 0, &caps, &off).unwrap();
    close(adv[0], (1.0 - 4.75) / std, 1e-12, "unguarded advantage");
}

#[test]
fn singleton_groups() {
    // One response in the group: HACPO divides by 1 (the baseline is the response itself).
    let samples = vec![PoolSample { agent: 0, group: 3, reward: 1.0 }];
    let adv = algo::advantages(&samples, 0, &Capabilities::fixed(vec![0.5]), &HacpoConfig::default()).unwrap();
    assert_eq!(adv, vec![0.0]);
    // GRPO (verl): mean 0, std 1, so the advantage is the reward.
    assert_eq!(stats::grpo_advantages(&[0.7], &[3], 1e-6, true), vec![0.7]);
}

#[test]
fn three_agents() {
    let samples = pool(&[&[1.0, 0.0], &[1.0, 1.0], &[0.0, 0.0]]);
    let caps = Capabilities::fixed(vec![0.5, 0.8, 0.25]);
    let cfg = HacpoConfig::default();
    // Learner 0: agent 1's rewards weigh 0.5/0.8, agent 2's weigh 2.
    let mu = (1.0 + 0.625 * 2.0 + 2.0 * 0.0) / 6.0;
    let std = stats::unbiased_std(&[1.0, 0.0, 1.0, 1.0, 0.0, 0.0]) + 1e-6;
    let adv = algo::advantages(&samples, 0, &caps, &cfg).unwrap();
    for (a, s) in adv.iter().zip(&samples) {
        close(*a, (s.reward - mu) / std, 1e-12, "3-agent advantage");
    }
    assert_eq!(cfg.coef(1, 0, &caps), 1.6);
    assert_eq!(cfg.coef(2, 0, &caps), 0.5);
    assert_eq!(cfg.coef(0, 0, &caps), 1.0);
    // Learner 2 sees both others as stronger.
    let adv2 = algo::advantages(&samples, 2, &caps, &cfg).unwrap();
    let mu2 = (0.5 * 1.0 + 0.3125 * 2.0) / 6.0;
    close(adv2[2], (1.0 - mu2) / std, 1e-12, "learner 2");
    // Mini-batches: own first, then agent 1, then agent 2 (self_first); or mixed.
    let mb = algo::minibatches(&samples, 1, 3, MinibatchOrder::SelfFirst).unwrap();
    assert_eq!(mb, vec![vec![2, 3], vec![0, 1], vec![4, 5]]);
    let mb = algo::minibatches(&samples, 1, 2, MinibatchOrder::Interleaved).unwrap();
    assert_eq!(mb, vec![vec![2, 0, 1], vec![3, 4, 5]]);
    assert!(algo::minibatches(&samples, 1, 4, MinibatchOrder::SelfFirst).is_err());
    // An unbalanced group is an error.
    let mut bad = samples.clone();
    bad.pop();
    assert!(algo::advantages(&bad, 0, &caps, &cfg).unwrap_err().to_string().contains("same number"));
}

#[test]
fn one_agent_is_gspo_exactly() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let cfg = HacpoConfig::default();
    let caps = Capabilities::fixed(vec![0.37]);
    let samples: Vec<PoolSample> =
        (0..24).map(|i| PoolSample { agent: 0, group: i / 8, reward: rng.random_range(0..2) as f64 }).collect();
    let adv = algo::advantages(&samples, 0, &caps, &cfg).unwrap();
    let groups: Vec<usize> = samples.iter().map(|s| s.group).collect();
    let rewards: Vec<f64> = samples.iter().map(|s| s.reward).collect();
    assert_eq!(adv, stats::grpo_advantages(&rewards, &groups, 1e-6, true));
    let mut clipped = 0;
    for (i, a) in adv.iter().enumerate() {
        let (tgt, src) = (-1.0 + rng.random_range(-8e-4..8e-4), -1.0);
        let t = algo::sample_terms(0, 0, *a, tgt, src, i % 4, &caps, &cfg);
        let (value, grad) = gspo_by_hand(tgt, src, *a);
        close(t.objective, value, 1e-15, "GSPO objective");
        close(t.grad_weight, grad, 1e-15, "GSPO gradient");
        assert!(!t.cross);
        clipped += (grad == 0.0 && *a != 0.0) as usize;
    }
    assert!(clipped > 0 && clipped < adv.len(), "both clipped and unclipped samples: {clipped}");
}

/// GSPO's sequence term written out from docs/algorithms.md §1: `s = exp(mean_new − mean_old)`,
/// value `min(s·A, clip(s, 1−3e-4, 1+4e-4)·A)`, derivative `s·A` where the unclipped term is
/// the minimum, else 0.
fn gspo_by_hand(mean_new: f64, mean_old: f64, a: f64) -> (f64, f64) {
    let s = (mean_new - mean_old).exp();
    let c = s.clamp(1.0 - 3e-4, 1.0 + 4e-4);
    if s * a <= c * a { (s * a, s * a) } else { (c * a, 0.0) }
}

#[test]
fn naive_sharing_is_gspo_over_the_pool_as_own() {
    let samples = pool(&[&[1.0, 0.0, 1.0, 1.0], &[0.0, 0.0, 1.0, 0.0]]);
    let caps = Capabilities::fixed(vec![0.6, 0.3]);
    let naive = HacpoConfig { naive: true, ..Default::default() };
    let adv = algo::advantages(&samples, 0, &caps, &naive).unwrap();
    let rewards: Vec<f64> = samples.iter().map(|s| s.reward).collect();
    assert_eq!(adv, stats::grpo_advantages(&rewards, &[0; 8], 1e-6, true));
    for (s, a) in samples.iter().zip(&adv) {
        let t = algo::sample_terms(s.agent, 0, *a, -1.2, -1.0, 3, &caps, &naive);
        let (value, grad) = gspo_by_hand(-1.2, -1.0, *a);
        close(t.objective, value, 1e-15, "naive objective");
        close(t.grad_weight, grad, 1e-15, "naive gradient");
        assert_eq!((t.coef, t.cross), (1.0, false));
    }
    // Each switch alone.
    let no_baseline = HacpoConfig { capability_baseline: false, ..Default::default() };
    assert_eq!(algo::advantages(&samples, 0, &caps, &no_baseline).unwrap(), adv);
    let no_coef = HacpoConfig { discrepancy_coef: false, ..Default::default() };
    assert_eq!(algo::sample_terms(1, 0, 0.7, -1.1, -1.0, 0, &caps, &no_coef).coef, 1.0);
    let no_is = HacpoConfig { exp_is: false, ..Default::default() };
    let t = algo::sample_terms(1, 0, 0.7, -1.1, -1.0, 0, &caps, &no_is);
    close(t.objective, (-0.1f64).exp() * 0.5 * 0.7, 1e-12, "α = 0");
    let no_step = HacpoConfig { stepwise: false, ..Default::default() };
    assert_eq!(no_step.cross_lower_bound(3), 0.8);
}

// ---- tensor losses vs the analytic gradients ----

type Ad = CpuAutodiff;

fn ad_vector(v: &[f64]) -> Tensor<Ad, 1> {
    let data: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(data, [v.len()]), &Default::default())
}

fn ad_matrix(rows: &[Vec<f64>], len: usize) -> Tensor<Ad, 2> {
    let mut data = vec![0f32; rows.len() * len];
    for (i, r) in rows.iter().enumerate() {
        for (j, &x) in r.iter().enumerate() {
            data[i * len + j] = x as f32;
        }
    }
    Tensor::from_data(TensorData::new(data, [rows.len(), len]), &Default::default())
}

fn host(t: Tensor<Cpu, 1>) -> Vec<f64> {
    t.into_data().into_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

fn host2(t: Tensor<Cpu, 2>) -> Vec<f64> {
    t.into_data().into_vec::<f32>().unwrap().into_iter().map(f64::from).collect()
}

/// Relative error against the largest analytic magnitude (f32 tolerance 1e-3).
fn grads_agree(autodiff: &[f64], analytic: &[f64], what: &str) {
    assert_eq!(autodiff.len(), analytic.len());
    let scale = analytic.iter().fold(1e-6f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in autodiff.iter().zip(analytic).enumerate() {
        assert!((a - b).abs() / scale < 1e-3, "{what}[{i}]: autodiff {a} vs analytic {b} (scale {scale})");
    }
}

#[test]
fn tensor_hacpo_loss_gradients_match_the_analytic_summary() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for trial in 0..40 {
        let n = rng.random_range(2..24);
        let cfg = HacpoConfig {
            alpha: [0.0, 1.0, 2.5][trial % 3],
            naive: trial % 7 == 6,
            discrepancy_coef: trial % 5 != 4,
            ..Default::default()
        };
        let caps = Capabilities::fixed(vec![rng.random_range(0.05..0.95), rng.random_range(0.05..0.95)]);
        let m = rng.random_range(0..5);
        let mut tgt = Vec::new();
        let mut src = Vec::new();
        let mut terms = Vec::new();
        for _ in 0..n {
            let source = rng.random_range(0..2usize);
            let adv: f64 = rng.random_range(-2.0..2.0);
            let s = -rng.random_range(0.5..3.0);
            // Own ratios straddle the GSPO band; cross ratios straddle [lower_m, 1].
            let d = if source == 0 || cfg.naive { rng.random_range(-1e-3..1e-3) } else { rng.random_range(-0.4..0.1) };
            tgt.push(s + d);
            src.push(s);
            terms.push(algo::sample_terms(source, 0, adv, s + d, s, m, &caps, &cfg));
        }
        let x = ad_vector(&tgt).require_grad();
        let batch = SequenceBatch::from_terms(&terms, &src);
        let loss = rlt::hacpo_policy_loss(x.clone(), &batch, m, &cfg);
        close(host(loss.clone().inner())[0], algo::policy_loss(&terms), 1e-5, "loss value");
        let grads = loss.backward();
        let got = host(x.grad(&grads).unwrap());
        let want: Vec<f64> = terms.iter().map(|t| -t.grad_weight / n as f64).collect();
        grads_agree(&got, &want, &format!("trial {trial}: d loss / d mean_logp_target"));
    }
}

/// Random ragged token batch: new log-probs, old (or reference) log-probs, advantages and
/// the padded length.
type TokenBatch = (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<f64>, usize);

fn token_batch(rng: &mut rand_chacha::ChaCha8Rng, spread: f64) -> TokenBatch {
    let n = rng.random_range(2..7);
    let max_len = 9;
    let mut new = Vec::new();
    let mut old = Vec::new();
    for _ in 0..n {
        let len = rng.random_range(1..=max_len);
        let o: Vec<f64> = (0..len).map(|_| -rng.random_range(0.1..4.0)).collect();
        new.push(o.iter().map(|x| x + rng.random_range(-spread..spread)).collect());
        old.push(o);
    }
    let adv = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    (new, old, adv, max_len)
}

fn mask_of(rows: &[Vec<f64>], len: usize) -> Tensor<Ad, 2> {
    ad_matrix(&rows.iter().map(|r| vec![1.0; r.len()]).collect::<Vec<_>>(), len)
}

#[test]
fn tensor_grpo_gspo_and_kl_gradients_match_the_scalar_core() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    for trial in 0..30 {
        let mode =
            [LossAggregation::TokenMean, LossAggregation::SeqMeanTokenMean, LossAggregation::SeqMeanTokenSumNorm]
                [trial % 3];
        let lengths = |rows: &[Vec<f64>]| rows.iter().map(Vec::len).collect::<Vec<_>>();

        // GRPO per-token surrogate (ε 0.2 / 0.28).
        let (new, old, adv, len) = token_batch(&mut rng, 0.4);
        let x = ad_matrix(&new, len).require_grad();
        let adv32: Vec<f32> = adv.iter().map(|&a| a as f32).collect();
        let obj = rlt::grpo_objective(x.clone(), ad_matrix(&old, len), mask_of(&new, len), &adv32, 0.2, 0.28, mode);
        let lens = lengths(&new);
        let mut want_value = 0.0;
        let mut want = vec![0.0; new.len() * len];
        for (i, (n_row, o_row)) in new.iter().zip(&old).enumerate() {
            for (j, (a, b)) in n_row.iter().zip(o_row).enumerate() {
                // The padded width is the constant length of `seq-mean-token-sum-norm`.
                let w = mode.token_weight_norm(n_row.len(), &lens, len);
                let o = objective::clipped_surrogate(a - b, adv[i], 0.2, 0.28);
                want_value += w * o.value;
                want[i * len + j] = w * o.grad;
            }
        }
        close(host(obj.clone().inner())[0], want_value, 1e-4 * want_value.abs().max(1.0), "GRPO value");
        let got = host2(x.grad(&obj.backward()).unwrap());
        grads_agree(&got, &want, &format!("trial {trial}: GRPO"));

        // GSPO-token form == sequence GSPO with mean_tgt = mean over tokens.
        let (new, old, adv, len) = token_batch(&mut rng, 2e-3);
        let x = ad_matrix(&new, len).require_grad();
        let adv32: Vec<f32> = adv.iter().map(|&a| a as f32).collect();
        let obj = rlt::gspo_token_objective(
            x.clone(),
            ad_matrix(&old, len),
            mask_of(&new, len),
            &adv32,
            3e-4,
            4e-4,
            10.0,
            LossAggregation::SeqMeanTokenMean,
        );
        let mut want_value = 0.0;
        let mut want = vec![0.0; new.len() * len];
        for (i, (n_row, o_row)) in new.iter().zip(&old).enumerate() {
            let (mn, mo) = (stats::mean(n_row), stats::mean(o_row));
            let g = objective::gspo_sequence(mn, mo, adv[i], 3e-4, 4e-4, 10.0);
            want_value += g.value / new.len() as f64;
            for j in 0..n_row.len() {
                want[i * len + j] = g.grad / (new.len() * n_row.len()) as f64;
            }
        }
        close(host(obj.clone().inner())[0], want_value, 1e-4 * want_value.abs().max(1.0), "GSPO value");
        let got = host2(x.grad(&obj.backward()).unwrap());
        grads_agree(&got, &want, &format!("trial {trial}: GSPO-token"));

        // KL k3 to a reference.
        let (new, reference, _, len) = token_batch(&mut rng, 0.5);
        let x = ad_matrix(&new, len).require_grad();
        let kl = rlt::kl_k3(x.clone(), ad_matrix(&reference, len), mask_of(&new, len), mode);
        let lens = lengths(&new);
        let mut want = vec![0.0; new.len() * len];
        let mut want_value = 0.0;
        for (i, (n_row, r_row)) in new.iter().zip(&reference).enumerate() {
            for (j, (a, b)) in n_row.iter().zip(r_row).enumerate() {
                let w = mode.token_weight_norm(n_row.len(), &lens, len);
                let k = objective::kl_k3(*a, *b);
                want_value += w * k.value;
                want[i * len + j] = w * k.grad;
            }
        }
        close(host(kl.clone().inner())[0], want_value, 1e-4 * want_value.abs().max(1.0), "KL value");
        let got = host2(x.grad(&kl.backward()).unwrap());
        grads_agree(&got, &want, &format!("trial {trial}: KL"));
    }
}

/// Flat per-token values → padded rows on the device, with the gradient back to the flat
/// values (and none to the padding).
#[test]
fn pad_tokens_lays_out_sequences_and_routes_gradients() {
    let flat: Tensor<Ad, 1> =
        Tensor::from_data(TensorData::new(vec![1f32, 2., 3., 4., 5., 6.], [6]), &Default::default()).require_grad();
    let (padded, mask) = rlt::pad_tokens(flat.clone(), &[2, 3, 1]);
    assert_eq!(host2(padded.clone().inner()), vec![1., 2., 0., 3., 4., 5., 6., 0., 0.]);
    assert_eq!(host2(mask.clone().inner()), vec![1., 1., 0., 1., 1., 1., 1., 0., 0.]);
    // d/dx Σ rows·weights: each flat value gets its own row's weight exactly once.
    let w = ad_matrix(&[vec![1.0; 3], vec![2.0; 3], vec![3.0; 3]], 3);
    let g = flat.grad(&rlt::ordered_sum(padded * w).backward()).unwrap();
    assert_eq!(host(g), vec![1., 1., 2., 2., 2., 3.]);
    // Per-sequence means as device ops.
    let (padded, mask) = rlt::pad_tokens(flat, &[2, 3, 1]);
    assert_eq!(host(rlt::sequence_mean(padded, mask).inner()), vec![1.5, 4.0, 6.0]);
}

/// Gradient accumulation: the micro-batches' scoped aggregates add up to the mini-batch's.
#[test]
fn scoped_aggregation_over_micro_batches_adds_up_to_the_minibatch_aggregate() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for mode in [LossAggregation::TokenMean, LossAggregation::SeqMeanTokenMean, LossAggregation::SeqMeanTokenSumNorm] {
        let (rows, _, _, len) = token_batch(&mut rng, 0.1);
        let whole = host(rlt::aggregate(ad_matrix(&rows, len), mask_of(&rows, len), mode).inner())[0];
        let scope =
            rlt::AggregationScope { sequences: rows.len(), tokens: rows.iter().map(Vec::len).sum(), norm_length: len };
        let split = rows.len() / 2;
        let parts: f64 = [&rows[..split], &rows[split..]]
            .iter()
            .map(|part| host(rlt::aggregate_scoped(ad_matrix(part, len), mask_of(part, len), mode, scope).inner())[0])
            .sum();
        close(parts, whole, 1e-5 * whole.abs().max(1.0), &format!("{mode:?}"));
    }
}

fn settings() -> hacpo::rl::AlgoSettings {
    hacpo::config::AlgoConfig::default().settings()
}

/// The registry knows every algorithm, lists them for an unknown name, and GSPO×2's doubling
/// happens in its entry.
#[test]
fn registry_lists_algorithms_and_reshapes_batches() {
    use hacpo::rl::{BatchShape, registry};
    let names = [
        "hacpo",
        "gspo",
        "grpo",
        "gspo2x",
        "naive",
        "drgrpo",
        "mhgpo-is",
        "mhgpo-fof",
        "mhgpo-rr",
        "mappo",
        "atgrpo",
        "mas-grpo",
        "single-grpo",
        "mgrpo",
        "mgrpo-main-only",
        "search-grpo",
    ];
    assert_eq!(registry::names(), names);
    let e = registry::build::<Ad>("ppo", &settings()).err().unwrap().to_string();
    assert!(e.contains("unknown algorithm") && e.contains(&names.join(", ")), "{e}");
    // Only the search workload's algorithms train rollout trees, only the turn-wise ones roll
    // episodes out over turns, only M-GRPO's delegate, and only MAPPO has a critic.
    let turn_wise = ["atgrpo", "mas-grpo", "single-grpo"];
    for name in names {
        let algo = registry::build::<Ad>(name, &settings()).unwrap();
        let shape = registry::shape(name).unwrap();
        let tree = matches!(shape, registry::RolloutShape::Tree { .. });
        assert_eq!(tree, name.starts_with("mhgpo") || name == "mappo", "{name}");
        assert_eq!(matches!(shape, registry::RolloutShape::Turns(_)), turn_wise.contains(&name), "{name}");
        assert_eq!(algo.value_model().is_some(), name == "mappo", "{name}");
        let delegates = matches!(shape, registry::RolloutShape::Delegate(_));
        assert_eq!(delegates, ["mgrpo", "mgrpo-main-only", "search-grpo"].contains(&name), "{name}");
    }
    // M-GRPO's variants differ in the sub-agent only.
    use hacpo::rl::mgrpo::SubAgent;
    let sub = |n: &str| match registry::shape(n).unwrap() {
        registry::RolloutShape::Delegate(s) => s,
        other => panic!("{n}: {other:?}"),
    };
    assert_eq!(
        [sub("mgrpo"), sub("mgrpo-main-only"), sub("search-grpo")],
        [SubAgent::Trained, SubAgent::Frozen, SubAgent::None]
    );
    // AT-GRPO groups per turn; the baselines whole trajectories, single-grpo without the tool.
    let turns = |n: &str| match registry::shape(n).unwrap() {
        registry::RolloutShape::Turns(t) => t,
        other => panic!("{n}: {other:?}"),
    };
    assert_eq!(turns("atgrpo").grouping, hacpo::rl::atgrpo::Grouping::TurnWise);
    assert_eq!(turns("mas-grpo").grouping, hacpo::rl::atgrpo::Grouping::Trajectory);
    assert!(turns("single-grpo").single_agent && !turns("mas-grpo").single_agent);
    let shape = BatchShape { policies: 2, group_size: 8, minibatch_prompts: 4, norm_length: 96 };
    let doubled = registry::batch_shape("gspo2x", &settings(), shape).unwrap();
    assert_eq!((doubled.group_size, doubled.minibatch_prompts), (16, 2));
    assert_eq!(registry::batch_shape("hacpo", &settings(), shape).unwrap(), shape);
    let odd = BatchShape { minibatch_prompts: 3, ..shape };
    assert!(registry::batch_shape("gspo2x", &settings(), odd).unwrap_err().to_string().contains("even"));
    for name in registry::names() {
        let a = registry::build::<Ad>(name, &settings()).unwrap();
        assert_eq!(a.name(), name);
    }
}

/// Dr. GRPO, added as a registry entry: advantages `r − mean` (no std), and the token-level
/// clipped surrogate summed per response over one constant length, mean over responses.
#[test]
fn drgrpo_advantages_and_loss_match_a_hand_computation() {
    use hacpo::rl::algorithm::MicroBatch;
    use hacpo::rl::{BatchShape, registry};
    let mut s = settings();
    s.drgrpo.norm_length = 16;
    let algo = registry::build::<Ad>("drgrpo", &s).unwrap();
    // The constant length defaults to rollout.max_new_tokens and follows the setting.
    let shape = BatchShape { policies: 1, group_size: 4, minibatch_prompts: 1, norm_length: 96 };
    assert_eq!(algo.shape(shape).unwrap().norm_length, 16);
    let default = registry::build::<Ad>("drgrpo", &settings()).unwrap();
    assert_eq!(default.shape(shape).unwrap().norm_length, 96);

    let samples = pool(&[&[1.0, 0.0, 0.0, 1.0, 1.0]]);
    let adv = algo.advantages(&samples, 0).unwrap();
    for (a, want) in adv.iter().zip([0.4, -0.6, -0.6, 0.4, 0.4]) {
        close(*a, want, 1e-12, "Dr. GRPO advantage");
    }

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let (new, old, adv, len) = token_batch(&mut rng, 0.4);
    let x = ad_matrix(&new, len).require_grad();
    let n = new.len();
    let batch = MicroBatch {
        logp: x.clone() * mask_of(&new, len),
        mask: mask_of(&new, len),
        old_logp: ad_matrix(&old, len),
        mean_logp_source: old.iter().map(|r| stats::mean(r)).collect(),
        advantages: adv.clone(),
        value: None,
        sources: vec![0; n],
        learner: 0,
        minibatch_index: 0,
        scope: rlt::AggregationScope { sequences: n, tokens: new.iter().map(Vec::len).sum(), norm_length: 16 },
    };
    let loss = algo.policy_loss(&batch);
    let mut want_value = 0.0;
    let mut want = vec![0.0; n * len];
    for (i, (n_row, o_row)) in new.iter().zip(&old).enumerate() {
        for (j, (a, b)) in n_row.iter().zip(o_row).enumerate() {
            let o = objective::clipped_surrogate(a - b, adv[i], 0.2, 0.28);
            want_value -= o.value / (n * 16) as f64;
            want[i * len + j] = -o.grad / (n * 16) as f64;
        }
    }
    close(host(loss.clone().inner())[0], want_value, 1e-5 * want_value.abs().max(1.0), "Dr. GRPO loss");
    grads_agree(&host2(x.grad(&loss.backward()).unwrap()), &want, "Dr. GRPO gradient");
}

/// `hacpo rl inspect --format json` on a multi-agent batch: one object per row.
fn inspect_rows(fixture: &std::path::Path) -> Vec<serde_json::Value> {
    let out = Command::new(common::hacpo_bin())
        .args(["rl", "inspect", "--input", fixture.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// An MHGPO batch through `hacpo rl inspect`: rewards propagated by hand (docs/mhgpo-batch.md).
#[test]
fn rl_inspect_explains_an_mhgpo_tree() {
    let fixture = common::fixture("rl/mhgpo_tree.json");
    let rows = inspect_rows(&fixture);
    let rewards: Vec<f64> = rows.iter().map(|r| r["reward"].as_f64().unwrap()).collect();
    let want = [-0.875, -0.75, 0.0, 1.0, -0.5, 0.0];
    assert!(rewards.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{rewards:?}");
    let in_loss: Vec<bool> = rows.iter().map(|r| r["in_loss"].as_bool().unwrap()).collect();
    assert_eq!(in_loss, [false, true, true, true, true, true]);
    let table = Command::new(common::hacpo_bin())
        .args(["rl", "inspect", "--input", fixture.to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("advantage") && table.lines().count() == 7, "{table}");
}

/// An M-GRPO batch through `hacpo rl inspect`: rewards, alignment and advantages by hand
/// (docs/mgrpo-batch.md).
#[test]
fn rl_inspect_explains_an_mgrpo_batch() {
    let fixture = common::fixture("rl/mgrpo_batch.json");
    let rows = inspect_rows(&fixture);
    let main: Vec<&serde_json::Value> = rows.iter().filter(|r| r["sub"].is_null()).collect();
    let subs: Vec<&serde_json::Value> = rows.iter().filter(|r| !r["sub"].is_null()).collect();
    // Main rewards 1, 0.1, 0, 1: mean 0.525, population std sqrt(0.226875).
    let sd = 0.226875f64.sqrt();
    for (r, reward) in main.iter().zip([1.0, 0.1, 0.0, 1.0]) {
        close(r["reward"].as_f64().unwrap(), reward, 1e-12, "main reward");
        close(r["advantage"].as_f64().unwrap(), (reward - 0.525) / (sd + 1e-6), 1e-9, "main advantage");
    }
    // d = 2: rollout 0's one call fills both slots, rollout 3 drops one of its three, rollout 2
    // never delegated (masked, out of the statistics).
    let copies: Vec<u64> = subs.iter().map(|r| r["copies"].as_u64().unwrap()).collect();
    assert_eq!(&copies[..3], &[2, 1, 1]);
    assert_eq!(copies[3..].iter().sum::<u64>(), 2);
    assert_eq!(copies[3..].iter().filter(|&&c| c == 0).count(), 1);
    // The six filled slots: 0.5, 0.5, 0.1, 0, 0.5, 0.5: mean 0.35, population std sqrt(0.275 / 6).
    let sd = (0.275f64 / 6.0).sqrt();
    for (r, &c) in subs.iter().zip(&copies) {
        let reward = r["reward"].as_f64().unwrap();
        let want = if c == 0 { 0.0 } else { (reward - 0.35) / (sd + 1e-6) };
        close(r["advantage"].as_f64().unwrap(), want, 1e-9, "sub advantage");
    }
    let rewards: Vec<f64> = subs.iter().map(|r| r["reward"].as_f64().unwrap()).collect();
    assert_eq!(rewards, [0.5, 0.1, 0.0, 0.5, 0.5, 0.5]);
}
