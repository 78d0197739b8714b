//! Parity with Hugging Face transformers on tiny random checkpoints of every family
//! (fixtures and reference numbers from `scripts/make_model_fixtures.py`).

mod common;

use common::{device, fixture, full_logits, max_abs_diff, reference};
use hacpo::backend::Cpu;
use hacpo::generate::{Completion, FinishReason, GenerateRequest, SamplingParams, generate, score};
use hacpo::model::{CausalLm, SaveDtype, load_model_dir, save_model};

const FIXTURES: [&str; 4] = ["llama31-tiny", "llama32-tiny", "qwen2-tiny", "qwen3-tiny"];
const TOLERANCE: f32 = 1e-4;

fn load(name: &str) -> CausalLm<Cpu> {
    load_model_dir(&fixture(&format!("models/{name}")), &device()).unwrap()
}

#[test]
fn logits_match_transformers() {
    for name in FIXTURES {
        let model = load(name);
        let r = reference(name);
        let ours: Vec<f32> = full_logits(&model, &r.prompt_a).concat();
        let diff = max_abs_diff(&ours, &r.logits_a);
        assert!(diff < TOLERANCE, "{name}: prompt_a logits differ by {diff}");
        let ours_b = full_logits(&model, &r.prompt_b).pop().unwrap();
        let diff = max_abs_diff(&ours_b, &r.logits_b_last);
        assert!(diff < TOLERANCE, "{name}: 700-token prompt last logits differ by {diff}");
    }
}

#[test]
fn greedy_continuations_match_transformers_alone_and_batched() {
    for name in FIXTURES {
        let model = load(name);
        let r = reference(name);
        let params = SamplingParams::greedy(32);
        for (prompt, want) in &r.greedy {
            let prompts = vec![prompt.clone()];
            let (out, _) = generate(&model, &GenerateRequest::new(&prompts, params.clone())).unwrap();
            assert_eq!(&out[0].token_ids, want, "{name}: greedy continuation of a {}-token prompt", prompt.len());
            assert_eq!(out[0].finish_reason, FinishReason::Length);
        }
        // Ragged prompts (5, 13 and 1 tokens) left-padded into one batch, two samples each.
        let prompts: Vec<Vec<u32>> = r.greedy.iter().map(|(p, _)| p.clone()).collect();
        let mut req = GenerateRequest::new(&prompts, params.clone());
        req.num_samples = 2;
        let (out, stats) = generate(&model, &req).unwrap();
        assert_eq!(out.len(), 6);
        for c in &out {
            assert_eq!(
                c.token_ids, r.greedy[c.prompt_index].1,
                "{name}: batched prompt {} sample {}",
                c.prompt_index, c.sample_index
            );
        }
        assert_eq!(stats.generated_tokens, 6 * 32);
        // Prefill in chunks of one prompt gives the same result.
        req.prefill_token_budget = 1;
        let (chunked, _) = generate(&model, &req).unwrap();
        for (a, b) in chunked.iter().zip(&out) {
            assert_eq!(a.token_ids, b.token_ids, "{name}: chunked prefill");
            assert!(max_abs_diff(&a.logprobs, &b.logprobs) < 1e-5, "{name}: chunked prefill log-probs");
        }
    }
}

#[test]
fn prompts_that_repeat_or_begin_alike_generate_what_each_does_alone() {
    for name in FIXTURES {
        let model = load(name);
        let r = reference(name);
        // Two tasks' episodes at their next turn: the same prompt, or the prompt followed by what
        // an earlier turn generated (whose greedy continuation is the rest of the reference's),
        // beside an unrelated prompt. The tasks' prompts differ in length, so the shorter
        // task's cache rows are widened where their pads begin.
        let turn =
            |(p, cont): &(Vec<u32>, Vec<u32>), k: usize| ([p.as_slice(), &cont[..k]].concat(), cont[k..].to_vec());
        let (a, b) = (&r.greedy[1], &r.greedy[0]);
        let cases = [
            turn(a, 0),
            turn(b, 2),
            turn(a, 3),
            r.greedy[2].clone(),
            turn(b, 0),
            turn(a, 0),
            turn(a, 6),
            turn(b, 3),
            turn(a, 3),
        ];
        let prompts: Vec<Vec<u32>> = cases.iter().map(|(p, _)| p.clone()).collect();
        let new = 32 - 6;
        let (out, stats) = generate(&model, &GenerateRequest::new(&prompts, SamplingParams::greedy(new))).unwrap();
        let distinct: std::collections::HashSet<&Vec<u32>> = prompts.iter().collect();
        let longest = prompts.iter().map(Vec::len).max().unwrap();
        assert!(
            stats.prefill_slots < distinct.len() * longest / 2,
            "{name}: the prefill ran {} slots, not each distinct prompt and shared beginning once",
            stats.prefill_slots
        );
        for c in &out {
            assert_eq!(c.token_ids, cases[c.prompt_index].1[..new], "{name}: prompt {}", c.prompt_index);
        }
        // Sampled, the log-probs are those of each prompt generated alone.
        let mut req = GenerateRequest::new(&prompts, sampling(8, 5));
        req.num_samples = 2;
        sample_as_scored(&model, &req, name);
    }
}

/// Sampling at temperature 0.8 with `max_new_tokens` and `seed`.
fn sampling(max_new_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_p: 1.0, top_k: 0, max_new_tokens, seed }
}

/// Generates `req` and checks each sample's log-probs against teacher-forced scoring.
fn sample_as_scored(model: &CausalLm<Cpu>, req: &GenerateRequest<'_>, name: &str) -> Vec<Completion> {
    let (out, _) = generate(model, req).unwrap();
    let pairs: Vec<(Vec<u32>, Vec<u32>)> =
        out.iter().map(|c| (req.prompts[c.prompt_index].clone(), c.token_ids.clone())).collect();
    let scored = score::score(model, &pairs, req.params.temperature).unwrap();
    for (c, s) in out.iter().zip(&scored) {
        let d = max_abs_diff(&c.logprobs, s);
        assert!(d < 1e-4, "{name}: prompt {} sample {}: log-probs differ by {d}", c.prompt_index, c.sample_index);
    }
    out
}

#[test]
fn scoring_matches_reference_log_softmax() {
    for name in FIXTURES {
        let model = load(name);
        let r = reference(name);
        let vocab = r.logits_a.len() / r.prompt_a.len();
        let (prompt, response) = r.prompt_a.split_at(10);
        let got = score::score(&model, &[(prompt.to_vec(), response.to_vec())], 1.0).unwrap().remove(0);
        assert_eq!(got.len(), response.len());
        for (j, &tok) in response.iter().enumerate() {
            let row = &r.logits_a[(9 + j) * vocab..(10 + j) * vocab];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let lse = row.iter().map(|z| (z - max).exp()).sum::<f32>().ln() + max;
            let want = row[tok as usize] - lse;
            assert!((got[j] - want).abs() < TOLERANCE, "{name}: token {j}: {} vs {want}", got[j]);
        }
    }
}

#[test]
fn generation_logprobs_agree_with_scoring() {
    let model = load("qwen3-tiny");
    let prompts = vec![vec![5u32, 17, 99, 3], vec![42u32]];
    let mut req = GenerateRequest::new(&prompts, sampling(12, 3));
    req.num_samples = 3;
    let out = sample_as_scored(&model, &req, "qwen3-tiny");
    // Same seed → same samples; another seed → different ones.
    let (again, _) = generate(&model, &req).unwrap();
    assert_eq!(again, out);
    req.params.seed = 4;
    let (other, _) = generate(&model, &req).unwrap();
    assert_ne!(other, out);
}

#[test]
fn stop_tokens_end_sequences() {
    let model = load("llama31-tiny");
    let r = reference("llama31-tiny");
    let (prompt, cont) = &r.greedy[1];
    let prompts = vec![prompt.clone()];
    let mut req = GenerateRequest::new(&prompts, SamplingParams::greedy(32));
    req.stop_token_ids = vec![cont[4]];
    let (out, _) = generate(&model, &req).unwrap();
    let first = cont.iter().position(|&t| t == cont[4]).unwrap();
    assert_eq!(out[0].token_ids, cont[..=first].to_vec());
    assert_eq!(out[0].finish_reason, FinishReason::Eos);
}

#[test]
fn save_and_reload_gives_identical_logits() {
    for name in FIXTURES {
        let model = load(name);
        let dir = tempfile::tempdir().unwrap();
        save_model(&model, &model.config.eos_token_ids.clone(), dir.path(), SaveDtype::F32).unwrap();
        let back: CausalLm<Cpu> = load_model_dir(dir.path(), &device()).unwrap();
        assert_eq!(back.config, hacpo::model::ModelConfig { dtype: Some("float32".into()), ..model.config.clone() });
        let ids = reference(name).prompt_a;
        assert_eq!(full_logits(&model, &ids), full_logits(&back, &ids), "{name}");
    }
}
