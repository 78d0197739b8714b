//! The tests every GPU backend runs (`tests/wgpu_backend.rs` on wgpu, `tests/cuda_backend.rs` on
//! CUDA): the models against transformers and the CPU, training steps against the CPU's, and
//! hacpo's own kernels (`src/backend/cube_fused.rs`) against burn's generic ops on the same
//! device. The including test crate names the backend (`Gpu`, and `GPU` as `--device` spells
//! it) and its `device()`, which fails with what to install when there is none.

use burn::tensor::{Int, Tensor, TensorData};
use hacpo::generate::{GenerateRequest, SamplingParams, generate};
use hacpo::model::{CausalLm, load_model_dir};

use crate::common::{self, Reference, fixture, full_logits_on, max_abs_diff, reference};
use crate::{GPU, Gpu, HAS_BF16, TF32_PRODUCTS, device};

/// A Qwen3, a Llama-3.1 and a Qwen2 (biased q/k/v projections) tiny random checkpoint with
/// transformers' reference numbers.
const FIXTURES: [&str; 3] = ["qwen3-tiny", "llama31-tiny", "qwen2-tiny"];
/// How far f32 logits and log-probabilities may be from transformers' and the CPU's: 1e-4 where
/// the backend's products are f32; on CUDA they run in TF32 (cubek's matmul rounds f32 operands
/// to 10-bit mantissas for the tensor cores), measured on an H200 at 0.012 from transformers'
/// logits and 0.02 on a log-probability over a 151k vocabulary.
const TOLERANCE: f32 = if TF32_PRODUCTS { 3e-2 } else { 1e-4 };

/// What TF32 products add to half precision's bounds, where the f32 parts (the LM head, f16's
/// attention) run in TF32: measured 0.006–0.014 on an H200.
const TF32_SLACK: f32 = if TF32_PRODUCTS { 2e-2 } else { 0.0 };

fn load(name: &str) -> CausalLm<Gpu> {
    load_model_dir(&fixture(&format!("models/{name}")), &device()).unwrap()
}

/// Each policy's per-step work runs on the same device stream every step (cubecl keeps a memory
/// pool per stream; a new stream per step's thread ran an H100 out of memory by step 17 of the
/// embedded default): `per_policy` puts policy k's item on lane k, also when a stage runs only
/// some policies (a cluster host's), and the lane outlives the thread.
#[test]
fn per_policy_work_runs_on_one_stream_per_policy_step_after_step() {
    let current = || cubecl_common::stream_id::StreamId::current().value;
    for step in 0..4 {
        let policies: Vec<u64> = if step % 2 == 0 { vec![0, 1, 2] } else { vec![1, 2] };
        let items = policies.into_iter().map(|k| (k as usize, k));
        let lanes = hacpo::policy::per_policy(items, "test", |k| {
            // Work on the device, as a rollout does, then the stream it ran on.
            let x = Tensor::<Gpu, 1>::from_data(TensorData::from([1.0f32, 2.0]), &device());
            Ok((k, x.sum().into_scalar(), current()))
        });
        for lane in lanes {
            let (k, sum, stream) = lane.unwrap();
            assert_eq!((sum, stream), (3.0, 64 + k), "policy {k}");
        }
    }
}

#[test]
fn forward_matches_transformers() {
    for name in FIXTURES {
        let model = load(name);
        let r = reference(name);
        let diff = max_abs_diff(&full_logits_on(&model, &r.prompt_a, &device()).concat(), &r.logits_a);
        assert!(diff < TOLERANCE, "{name}: {GPU} logits differ from transformers' by {diff}");
    }
}

/// Weights stored in f16 (`frozen_dtype = "f16"`, what the KL reference and a LoRA base use)
/// give the CPU's f16-stored logits on the GPU backend: the same rounding, cast back to f32 where used.
#[test]
fn f16_stored_weights_give_the_cpus_logits() {
    use hacpo::dtype::FrozenDtype;
    use hacpo::model::precision::store_frozen;
    for name in FIXTURES {
        let r = reference(name);
        let gpu = store_frozen(load(name), FrozenDtype::F16);
        let cpu = store_frozen(
            load_model_dir::<hacpo::backend::Cpu>(&fixture(&format!("models/{name}")), &Default::default()).unwrap(),
            FrozenDtype::F16,
        );
        let ours = full_logits_on(&gpu, &r.prompt_a, &device()).concat();
        let diff = max_abs_diff(&ours, &full_logits_on(&cpu, &r.prompt_a, &Default::default()).concat());
        assert!(diff < TOLERANCE, "{name}: f16-stored logits differ from the CPU's by {diff}");
        // f16 rounding moves the logits, but not far.
        let rounding = max_abs_diff(&ours, &r.logits_a);
        assert!(rounding > 0.0 && rounding < 0.05, "{name}: f16 storage moved logits by {rounding}");
    }
}

/// f16 matmuls (`algo.compute_dtype = "f16"`), and bf16 where the backend has it, reading the
/// rollout copy as sampling does: close to the CPU's half-precision compute (whose fused
/// attention stays f32) and to transformers' f32 logits, and not f32 in disguise. bf16 keeps
/// three fewer bits than f16: on an H200 the tiny Qwen3's bf16 logits were 0.078 from the CPU's
/// bf16 and 0.098 from transformers' f32 (f16: 0.009 and 0.011).
#[test]
fn half_compute_stays_close_to_the_cpu_and_to_transformers() {
    use hacpo::dtype::ComputeDtype;
    use hacpo::model::precision::{rollout_copy, set_compute};
    fn half<B: burn::tensor::backend::Backend>(m: CausalLm<B>, compute: ComputeDtype) -> CausalLm<B> {
        rollout_copy(set_compute(m, compute))
    }
    // (compute, bound from the CPU's logits, bound from transformers')
    let bf16 = HAS_BF16.then_some((ComputeDtype::Bf16, 0.15, 0.4));
    for (compute, from_cpu, from_f32) in [(ComputeDtype::F16, 5e-3 + TF32_SLACK, 0.05)].into_iter().chain(bf16) {
        for name in FIXTURES {
            let r = reference(name);
            let gpu = half(load(name), compute);
            let dir = fixture(&format!("models/{name}"));
            let cpu = half(load_model_dir::<hacpo::backend::Cpu>(&dir, &Default::default()).unwrap(), compute);
            let ours = full_logits_on(&gpu, &r.prompt_a, &device()).concat();
            let diff = max_abs_diff(&ours, &full_logits_on(&cpu, &r.prompt_a, &Default::default()).concat());
            let rounding = max_abs_diff(&ours, &r.logits_a);
            eprintln!("{name}: {compute:?} compute, {GPU} vs CPU {diff}, vs transformers f32 {rounding}");
            assert!(diff < from_cpu, "{name}: {compute:?}-compute logits differ from the CPU's by {diff}");
            assert!(rounding > 0.0 && rounding < from_f32, "{name}: {compute:?} compute moved logits by {rounding}");
        }
    }
}

/// LoRA adapters on some projections (queries, values, the MLP's down) with the rest plain, in
/// f16 compute: on the GPU the plain products' results stay in f16 while the adapters read
/// their inputs in f32, as on the CPU, so the two agree as closely as without adapters.
#[test]
fn f16_compute_with_some_adapters_stays_close_to_the_cpu() {
    use burn::module::Param;
    use hacpo::dtype::ComputeDtype;
    use hacpo::model::lora::{LoraConfig, attach};
    use hacpo::model::precision::{rollout_copy, set_compute};
    fn adapted<B: burn::tensor::backend::Backend>(m: CausalLm<B>) -> CausalLm<B> {
        let targets = ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec();
        let config = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, target_modules: targets };
        let mut m = attach(m, &config, 7);
        for (i, layer) in m.layers.iter_mut().enumerate() {
            let (a, mlp) = (&mut layer.self_attn, &mut layer.mlp);
            for (j, linear) in [&mut a.q_proj, &mut a.v_proj, &mut mlp.down_proj].into_iter().enumerate() {
                let adapter = linear.lora.as_mut().expect("targeted");
                // B is zero when attached: give it values, or the adapters add nothing.
                let [r, out] = adapter.b.dims();
                let values: Vec<f32> = (0..r * out).map(|e| 0.05 * ((e * 7 + i * 3 + j) as f32 * 0.37).sin()).collect();
                let device = adapter.b.val().device();
                adapter.b = Param::from_tensor(Tensor::from_data(TensorData::new(values, [r, out]), &device));
            }
        }
        rollout_copy(set_compute(m, ComputeDtype::F16))
    }
    for name in FIXTURES {
        let r = reference(name);
        let gpu = adapted(load(name));
        let cpu = adapted(
            load_model_dir::<hacpo::backend::Cpu>(&fixture(&format!("models/{name}")), &Default::default()).unwrap(),
        );
        let ours = full_logits_on(&gpu, &r.prompt_a, &device()).concat();
        let theirs = full_logits_on(&cpu, &r.prompt_a, &Default::default()).concat();
        let diff = max_abs_diff(&ours, &theirs);
        let moved = max_abs_diff(&theirs, &r.logits_a);
        eprintln!("{name}: f16 compute with adapters, {GPU} vs CPU {diff}, adapters moved logits by {moved}");
        assert!(diff < 5e-3 + TF32_SLACK, "{name}: with adapters, f16-compute logits differ from the CPU's by {diff}");
        assert!(moved > 0.05, "{name}: the adapters barely moved the logits ({moved})");
    }
}

#[test]
fn batched_greedy_generation_matches_transformers() {
    for name in FIXTURES {
        let model = load(name);
        let greedy = reference(name).greedy;
        let prompts: Vec<Vec<u32>> = greedy.iter().map(|(p, _)| p.clone()).collect();
        let mut req = GenerateRequest::new(&prompts, SamplingParams::greedy(32));
        req.num_samples = 2;
        let (out, _) = generate(&model, &req).unwrap();
        assert_eq!(out.len(), 2 * prompts.len());
        for c in &out {
            assert_eq!(
                c.token_ids, greedy[c.prompt_index].1,
                "{name}: prompt {} sample {}",
                c.prompt_index, c.sample_index
            );
        }
    }
}

#[test]
fn scoring_matches_transformers_log_softmax() {
    for name in FIXTURES {
        let model = load(name);
        let Reference { prompt_a, logits_a, .. } = reference(name);
        let vocab = logits_a.len() / prompt_a.len();
        let (prompt, response) = prompt_a.split_at(10);
        let got =
            hacpo::generate::score::score(&model, &[(prompt.to_vec(), response.to_vec())], 1.0).unwrap().remove(0);
        for (j, &tok) in response.iter().enumerate() {
            let row = &logits_a[(9 + j) * vocab..(10 + j) * vocab];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let want = row[tok as usize] - (row.iter().map(|z| (z - max).exp()).sum::<f32>().ln() + max);
            assert!((got[j] - want).abs() < TOLERANCE, "{name}: token {j}: {} vs {want}", got[j]);
        }
    }
}

/// The training log-prob op's custom backward (chunked over the vocabulary) against burn's own
/// autodiff through a full log-softmax, both on the GPU backend: values and both gradients.
#[test]
fn chunked_logprob_backward_matches_autodiff() {
    // One chunk, and (vocabulary × rows above CHUNK_ELEMENTS) several.
    check_chunked_logprobs(13, 16, 3000);
    check_chunked_logprobs(150, 8, 150_000); // 111 rows a chunk; the full reference stays under lavapipe's 128 MiB buffers
}

fn check_chunked_logprobs(n: usize, d: usize, vocab: usize) {
    use burn::backend::Autodiff;
    use burn::tensor::activation::log_softmax;
    type Ad = Autodiff<Gpu>;
    let dev = device();
    // Deterministic host data, so a failure reproduces.
    let data = |len: usize, seed: u32, scale: f32| -> Vec<f32> {
        (0..len as u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .map(|x| x * scale)
            .collect()
    };
    let tensor =
        |v: Vec<f32>, shape: [usize; 2]| Tensor::<Ad, 2>::from_data(TensorData::new(v, shape), &dev).require_grad();
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 377 + 5) % vocab as u32).collect();
    let coef = Tensor::<Ad, 1>::from_data(TensorData::new(data(n, 7, 1.0), [n]), &dev);
    let run = |chunked: bool| -> [Vec<f32>; 3] {
        let h = tensor(data(n * d, 1, 1.0), [n, d]);
        let w = tensor(data(vocab * d, 2, 0.5), [vocab, d]);
        let lp = if chunked {
            hacpo::generate::score::token_logprobs_autodiff(h.clone(), w.clone(), &targets, 1.0 / 0.7)
        } else {
            let idx = Tensor::<Ad, 2, Int>::from_data(
                TensorData::new(targets.iter().map(|&x| x as i64).collect::<Vec<_>>(), [n, 1]),
                &dev,
            );
            log_softmax(h.clone().matmul(w.clone().transpose()).mul_scalar(1.0 / 0.7), 1).gather(1, idx).reshape([n])
        };
        let grads = (lp.clone() * coef.clone()).sum().backward();
        [values(lp.inner()), values(h.grad(&grads).unwrap()), values(w.grad(&grads).unwrap())]
    };
    let (got, want) = (run(true), run(false));
    for (what, g, w) in
        [("values", &got[0], &want[0]), ("d hidden", &got[1], &want[1]), ("d weight", &got[2], &want[2])]
    {
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        let err = max_abs_diff(g, w);
        assert!(err / scale < 1e-4, "{n}×{vocab}: {what}: max error {err} (scale {scale})");
    }
}

/// The packed tokens' row gathers (`backend::gather`, a custom autodiff op generic over the
/// inner backend) on the GPU backend: the CPU's values and gradients, and the gradient of an output row
/// that input row 0 read but `back` does not name is dropped where `select` would add it.
#[test]
fn row_gathers_take_their_gradient_by_gathering() {
    fn grads<B: burn::tensor::backend::AutodiffBackend>(dev: &B::Device) -> [Vec<f32>; 3] {
        let x: Vec<f32> = (0..40).map(|i| (i * 7 % 11) as f32 * 0.25 - 1.0).collect();
        let x = Tensor::<B, 2>::from_data(TensorData::new(x, [8, 5]), dev).require_grad();
        let ints = |v: &[i64]| Tensor::<B, 1, Int>::from_data(TensorData::new(v.to_vec(), [v.len()]), dev);
        let (index, back) = (ints(&[3, 0, 6, 0, 7, 1]), ints(&[1, 5, 6, 0, 6, 6, 2, 4]));
        let w: Vec<f32> = (0..30).map(|i| (i % 4) as f32 - 1.5).collect();
        let w = Tensor::<B, 2>::from_data(TensorData::new(w, [6, 5]), dev);
        let out = hacpo::backend::gather::gather_rows(x.clone(), index.clone(), back);
        let ours = x.grad(&(out.clone() * w.clone()).sum().backward()).unwrap();
        let select = x.grad(&(x.clone().select(0, index) * w).sum().backward()).unwrap();
        [values(out.inner()), values(ours), values(select)]
    }
    let on_gpu = grads::<burn::backend::Autodiff<Gpu>>(&device());
    assert_eq!(on_gpu, grads::<burn::backend::Autodiff<hacpo::backend::Cpu>>(&Default::default()));
    let [_, ours, select] = on_gpu;
    // Output row 3 read row 0 as padding would: only row 0's gradient differs, by row 3's weight.
    assert_ne!(ours[..5], select[..5]);
    assert_eq!(ours[5..], select[5..]);
}

/// A reward that differs between responses of different lengths (the tiny agents favour
/// "1", "2" and EOS), so that advantages are not all zero and the policy loss has a gradient.
struct ByLength {
    prompts: Vec<hacpo::task::TaskPrompt>,
}

impl hacpo::task::Task for ByLength {
    fn name(&self) -> &str {
        "by-length"
    }
    fn train(&self) -> &[hacpo::task::TaskPrompt] {
        &self.prompts
    }
    fn validation(&self) -> &[hacpo::task::TaskPrompt] {
        &[]
    }
    fn reward(&self, _: &hacpo::task::TaskPrompt, response: &str) -> f64 {
        (response.len() % 3) as f64 / 2.0
    }
}

/// Each step's metrics, by agent.
type StepMetrics = Vec<Vec<(String, std::collections::BTreeMap<String, f64>)>>;

/// The metrics of every step of two HACPO steps of `agents` on backend `B`.
fn two_hacpo_steps<B: burn::tensor::backend::Backend>(
    agents: &[&std::path::Path],
    device: B::Device,
    compute: hacpo::dtype::ComputeDtype,
) -> StepMetrics {
    hacpo_steps::<B>(agents, device, compute, |_| {})
}

/// [`two_hacpo_steps`] with the run's config as `adjust` leaves it (`run.steps` steps).
fn hacpo_steps<B: burn::tensor::backend::Backend>(
    agents: &[&std::path::Path],
    device: B::Device,
    compute: hacpo::dtype::ComputeDtype,
    adjust: impl FnOnce(&mut hacpo::config::TrainConfig),
) -> StepMetrics {
    let run = tempfile::tempdir().unwrap();
    let mut cfg = hacpo::config::TrainConfig::default();
    cfg.run.out_dir = run.path().to_path_buf();
    cfg.run.seed = 3;
    cfg.run.steps = 2;
    cfg.run.checkpoint_every = 0;
    cfg.algo.name = "hacpo".into();
    cfg.algo.group_size = 4;
    cfg.algo.prompts_per_step = 2;
    cfg.algo.minibatch_prompts = 2;
    cfg.algo.micro_batch_sequences = 8;
    cfg.algo.optimizer.lr = 3e-3;
    cfg.algo.kl_coef = 0.01; // the reference models load and score too
    cfg.algo.compute_dtype = compute;
    // The tiny models' gradients are large: at the default 2^16 the scaled ones overflow f16,
    // and which step overflows may differ between backends. 16 still runs the scaler's
    // multiply and divide.
    cfg.algo.f16_loss_scale = 16.0;
    // A cool temperature keeps the sampled tokens off near-ties, so both backends sample the
    // same tokens from logits that differ in the sixth digit.
    cfg.rollout.temperature = 0.5;
    cfg.rollout.max_new_tokens = 4;
    cfg.rollout.batch_prompts = 2;
    cfg.policies = agents.iter().map(|p| hacpo::config::PolicyConfig::new(p.to_str().unwrap())).collect();
    adjust(&mut cfg);
    let steps = cfg.run.steps;
    let questions = ["What is 1 + 1?", "Name a number.", "What is 5 - 3?", "Count to two."];
    let prompts = questions
        .iter()
        .enumerate()
        .map(|(i, q)| hacpo::task::TaskPrompt {
            id: i.to_string(),
            messages: vec![hacpo::tokenizer::Message::user(*q)],
            gold: String::new(),
        })
        .collect();
    let task = std::sync::Arc::new(ByLength { prompts });
    let inputs = hacpo::trainer::Inputs::as_given(&cfg, task, vec![device; agents.len()]);
    let mut trainer = hacpo::trainer::Trainer::<B>::start(cfg, inputs).unwrap();
    (0..steps)
        .map(|_| {
            trainer.train_step().unwrap();
            trainer.last_metrics.clone()
        })
        .collect()
}

/// Two HACPO steps of a Qwen3-tokenizer and a Llama-3.1-tokenizer agent (so samples cross
/// tokenizers, and the KL reference scores) on the GPU backend give the CPU run's losses: sampling,
/// scoring, retokenisation, the update's forward and backward and AdamW, on the generic path.
#[test]
fn two_hacpo_steps_match_the_cpu_run() {
    // TF32 products (CUDA): the first step's losses measured 0.8% from the CPU's on an H200;
    // f16's bounds (below) held there for the updated step.
    let (first, updated) = if TF32_PRODUCTS { (2e-2, 5e-2) } else { (1e-4, 1e-3) };
    compare_two_hacpo_steps(hacpo::dtype::ComputeDtype::F32, first, updated);
}

/// Offloaded on a device whose memory is not the host's: the KL reference copied in for each
/// scoring pass, every backward pass's gradients summed in host memory, AdamW's moments there
/// and each parameter's brought to the device for its update. Every number of both steps is
/// the resident run's, to the bit.
#[test]
fn offloaded_hacpo_steps_give_the_resident_runs_numbers() {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, &["1", "2"]);
    let agents = [qwen.path(), llama.path()];
    let f32 = hacpo::dtype::ComputeDtype::F32;
    let resident = two_hacpo_steps::<Gpu>(&agents, device(), f32);
    let offloaded = hacpo_steps::<Gpu>(&agents, device(), f32, |cfg| {
        cfg.policies.iter_mut().for_each(|p| p.offload = true);
    });
    let numbers = |steps: &StepMetrics| {
        let kept = |(k, v): (&String, &f64)| {
            (!k.starts_with("timing") && !k.starts_with("perf")).then(|| (k.clone(), v.to_bits()))
        };
        let agents = |step: &Vec<(String, std::collections::BTreeMap<String, f64>)>| {
            step.iter().map(|(a, m)| (a.clone(), m.iter().filter_map(kept).collect::<Vec<_>>())).collect::<Vec<_>>()
        };
        steps.iter().map(agents).collect::<Vec<_>>()
    };
    let (a, b) = (numbers(&resident), numbers(&offloaded));
    assert!(a[1][0].1.iter().any(|(k, _)| k == "actor/kl_loss"), "{a:?}");
    assert_eq!(a, b);
}

/// Where the old policy's log-probs come from the scoring stage (here GRPO's, asked for apart;
/// HACPO's shared samples always), the update divides by what the scoring pass computed from the
/// same weights: a step's first update should see ratios of 1. On the CPU they were the
/// update's values to the bit (tests/train_smoke.rs). On a GPU the scoring pass runs hacpo's
/// inference kernels and the update burn's autodiff graph; `actor/ppo_kl` (their mean log-prob
/// difference) shows how far apart that leaves them.
#[test]
fn a_steps_first_update_sees_the_scoring_pass_log_probs() {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, &["1", "2"]);
    let f32 = hacpo::dtype::ComputeDtype::F32;
    let steps = hacpo_steps::<Gpu>(&[qwen.path(), llama.path()], device(), f32, |cfg| {
        cfg.run.steps = 1;
        cfg.algo.name = "grpo".into();
        cfg.algo.score_old_separately = true;
    });
    // The two passes sum in other orders, so they agree to the log-probs' bound, not to the
    // bit (lavapipe: −7.6e-6 for the Qwen3 agent, 0 for the Llama); with TF32 products, a
    // difference in f32's last bits can become one of TF32's rounding (not measured yet).
    let bound = f64::from(TOLERANCE);
    for (agent, m) in &steps[0] {
        assert!(m["timing_s/old_log_prob"] > 0.0, "{agent}: the scoring stage's pass did not run");
        let ppo_kl = m["actor/ppo_kl"];
        eprintln!("{GPU}, {agent}: the first update's ppo_kl {ppo_kl:e}");
        assert!(ppo_kl.abs() <= bound, "{agent}: the scoring pass and the update differ by {ppo_kl:e} on {GPU}");
    }
}

/// The same with f16 matmuls (`algo.compute_dtype = "f16"`): the trainer's mixed-precision
/// path (rollout copy, casts in the update's graph, f32 gradients and AdamW) on the generic
/// backend. The CPU's attention stays f32, so the tolerance is f16's.
#[test]
fn two_hacpo_steps_in_f16_compute_match_the_cpu_run() {
    compare_two_hacpo_steps(hacpo::dtype::ComputeDtype::F16, 1e-2, 3e-2);
}

fn compare_two_hacpo_steps(compute: hacpo::dtype::ComputeDtype, first_tolerance: f64, updated_tolerance: f64) {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let llama = common::tiny_agent_favouring("llama3.1", "llama", 40, 2, &["1", "2"]);
    let agents = [qwen.path(), llama.path()];
    let cpu = two_hacpo_steps::<hacpo::backend::Cpu>(&agents, common::device(), compute);
    let gpu = two_hacpo_steps::<Gpu>(&agents, device(), compute);
    let mut varied = false;
    for (step, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        for ((agent, cm), (_, gm)) in c.iter().zip(g) {
            // The same tokens were sampled: the rewards are equal, not close.
            assert_eq!(cm["critic/score/mean"], gm["critic/score/mean"], "step {step}, {agent}: rewards");
            for key in [
                "actor/pg_loss",
                "actor/kl_loss",
                "actor/grad_norm",
                "critic/advantages/mean",
                "hacpo/cross_ratio_mean",
            ] {
                let (a, b) = (cm[key], gm[key]);
                // AdamW's first update moves every weight by about ±lr whatever its gradient's
                // size, so a gradient near 0 whose sign differs in the last digits between
                // backends moves a weight a whole lr the other way: after one update the numbers
                // agree to 1e-3 in f32 (measured: gradient norms 4.0e-4, losses 1.3e-4, with
                // the GPU's RMSNorm as an autodiff op, whose weight gradients are closer to the
                // CPU's than burn's graph gives, but rounded differently), the first step's to
                // 1e-4.
                let tolerance = if step > 0 { updated_tolerance } else { first_tolerance };
                assert!(a.is_finite(), "step {step}, {agent}: {key} = {a}");
                assert!(
                    (a - b).abs() <= tolerance * a.abs().max(1.0),
                    "step {step}, {agent}: {key} cpu {a} vs {GPU} {b}"
                );
            }
            varied |= cm["actor/pg_loss"] != 0.0;
        }
    }
    assert!(varied, "some update had a policy loss: the comparison covers its backward pass");
}

/// A tokenizer-sized vocabulary of odd width (151 669, the Qwen tokenizer's) whose largest
/// logits sit at its end, where the special tokens are: wgpu's long row reductions once
/// dropped that tail and gave positive log-probabilities (backend/reduce.rs).
#[test]
fn scoring_over_an_odd_151k_vocabulary_matches_the_cpu() {
    let qwen = common::tiny_agent_favouring("qwen3", "qwen3", 32, 1, &["1", "2"]);
    let cpu: CausalLm<hacpo::backend::Cpu> = load_model_dir(qwen.path(), &common::device()).unwrap();
    let gpu: CausalLm<Gpu> = load_model_dir(qwen.path(), &device()).unwrap();
    assert_eq!(gpu.config.vocab_size % 2, 1, "an odd width: one element per vector line");
    let requests = vec![(vec![151644u32, 872, 198, 3838, 374], vec![16u32, 17, 151645])];
    for temperature in [1.0, 0.5] {
        let want = hacpo::generate::score::score(&cpu, &requests, temperature).unwrap().concat();
        let got = hacpo::generate::score::score(&gpu, &requests, temperature).unwrap().concat();
        assert!(got.iter().all(|&x| x <= 0.0), "log-probabilities above 0: {got:?}");
        // Logits divided by the temperature carry TF32's rounding along (CUDA: 0.036 at 0.5).
        let bound = if TF32_PRODUCTS { TOLERANCE / temperature } else { TOLERANCE };
        assert!(max_abs_diff(&got, &want) < bound, "T {temperature}: {GPU} {got:?} vs cpu {want:?}");
    }
}

/// `hacpo generate` of the model in `dir`, greedy, on the prompt "hello", with `args` added.
pub(crate) fn generate_command(dir: &tempfile::TempDir, args: &[&str]) -> std::process::Command {
    let model = dir.path().to_str().unwrap();
    let mut all = vec!["generate", "--model", model, "--prompt", "hello", "--greedy"];
    all.extend_from_slice(args);
    common::hacpo_command(&all)
}

/// `--device <this backend>` from the command line: greedy generation gives the CPU's text, in
/// f32 and with f16 matmuls.
#[test]
fn the_command_line_generates_as_on_the_cpu() {
    let _ = device(); // fails with what to install when the backend has no device
    let dir = common::tiny_model_dir("qwen3-tiny");
    let run = |device: &str, dtype: &str| {
        let out = generate_command(&dir, &["--max-new-tokens", "8", "--device", device, "--compute-dtype", dtype])
            .output()
            .unwrap();
        assert!(out.status.success(), "{device} {dtype}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(run(GPU, "f32"), run("cpu", "f32"));
    assert_eq!(run(GPU, "f16"), run("cpu", "f16"));
}

// --- hacpo's own inference kernels on the GPU backends (src/backend/cube_fused.rs) -----------

/// A deterministic tensor of `dims` on the GPU backend, values spread over about ±`scale`, in `dtype`.
fn spread<const D: usize>(dims: [usize; D], seed: u32, scale: f32, dtype: burn::tensor::DType) -> Tensor<Gpu, D> {
    let n: usize = dims.iter().product();
    let values: Vec<f32> =
        (0..n).map(|i| scale * ((i as f32 * 0.7311 + seed as f32 * 1.93).sin() * 1.7).sin()).collect();
    Tensor::<Gpu, D>::from_data(TensorData::new(values, dims), &device()).cast(dtype)
}

/// `t`'s values in f32, on the host (any backend, any float dtype).
fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(burn::tensor::DType::F32).into_data().to_vec::<f32>().unwrap()
}

/// Each kernel gives burn's generic ops' result on the same device (the generic ops run with
/// the fast paths off), in f32 and f16, at sizes below, at and above one cube's 256 units, and
/// with more rows than a grid's x dimension holds (65,535).
#[test]
fn rms_norm_and_swiglu_kernels_match_the_generic_ops() {
    use burn::tensor::DType::{BF16, F16, F32};
    use hacpo::backend::{cube_fused, flex_fast::without_fast_paths, fused};
    let bf16 = HAS_BF16.then_some((BF16, 3e-2));
    for (dtype, tolerance) in [(F32, 2e-6), (F16, 4e-3)].into_iter().chain(bf16) {
        for (rows, n) in [(15, 40), (15, 64), (15, 256), (15, 1536), (70_000, 8)] {
            let (x, w) = (spread([rows / 5, 5, n], 1, 3.0, dtype), spread([n], 2, 1.0, dtype));
            check_rms_norm(x, w, tolerance * 3.0, &format!("{dtype:?} {rows} rows of {n}"));
        }
        // Gates far into both tails of the sigmoid.
        let gate = spread([4, 7, 384], 3, 30.0, dtype);
        let up = spread([4, 7, 384], 4, 2.0, dtype);
        let kernel = cube_fused::swiglu(gate.clone(), up.clone()).unwrap_or_else(|_| panic!("not taken"));
        let generic = without_fast_paths(|| fused::swiglu(gate, up));
        let diff = max_abs_diff(&values(kernel), &values(generic));
        assert!(diff < tolerance * 60.0, "swiglu {dtype:?}: {diff}");
    }
}

/// Training's SwiGLU on the GPU backend (`Autodiff<Gpu>`: the kernel as an autodiff op, with a backward
/// kernel) gives the generic graph's output and both gradients, gates far into the sigmoid's
/// tails included, and a gate that is a strided view.
#[test]
fn swiglu_gradients_match_the_generic_graph() {
    use burn::tensor::DType::F32;
    use hacpo::backend::{cube_fused, flex_fast::without_fast_paths, fused};
    type Ad = burn::backend::Autodiff<Gpu>;
    let gate = Tensor::<Ad, 3>::from_inner(spread([3, 384, 7], 40, 30.0, F32)).swap_dims(1, 2).require_grad();
    let up = Tensor::<Ad, 3>::from_inner(spread([3, 7, 384], 41, 2.0, F32)).require_grad();
    let weights = Tensor::<Ad, 3>::from_inner(spread([3, 7, 384], 42, 1.0, F32));
    assert!(cube_fused::swiglu(gate.clone(), up.clone()).is_ok(), "the autodiff op not taken");
    let run = |fast: bool| {
        let forward = || fused::swiglu(gate.clone(), up.clone());
        let out = if fast { forward() } else { without_fast_paths(forward) };
        let grads = (out.clone() * weights.clone()).sum().backward();
        [out.inner(), gate.grad(&grads).unwrap(), up.grad(&grads).unwrap()].map(values)
    };
    let (kernel, generic) = (run(true), run(false));
    for (name, (a, b)) in ["output", "d gate", "d up"].iter().zip(kernel.iter().zip(&generic)) {
        let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(a, b);
        assert!(diff < 1e-5 * scale, "swiglu {name}: {diff} (largest {scale})");
    }
}

/// Training's RMSNorm on the GPU backend (`Autodiff<Gpu>`: the kernel as an autodiff op, its backward a
/// kernel and a sum over rows) gives the generic graph's output and both gradients, for rows
/// of 40 and of 1536 (several elements a unit), a strided input, and a weight stored in f16
/// (its gradient through the cast, in f16).
#[test]
fn rms_norm_gradients_match_the_generic_graph() {
    use burn::tensor::DType::{F16, F32};
    use hacpo::backend::{cube_fused, flex_fast::without_fast_paths, fused};
    type Ad = burn::backend::Autodiff<Gpu>;
    for (n, w_dtype) in [(40, F32), (1536, F32), (64, F16)] {
        let x = Tensor::<Ad, 3>::from_inner(spread([4, n, 6], 43, 3.0, F32)).swap_dims(1, 2).require_grad();
        let w = Tensor::<Ad, 1>::from_inner(spread([n], 44, 1.0, w_dtype)).require_grad();
        let weights = Tensor::<Ad, 3>::from_inner(spread([4, 6, n], 45, 1.0, F32));
        assert!(cube_fused::rms_norm(x.clone(), w.clone(), 1e-6).is_ok(), "the autodiff op not taken");
        let run = |fast: bool| {
            let forward = || fused::rms_norm(x.clone(), w.clone(), 1e-6);
            let out = if fast { forward() } else { without_fast_paths(forward) };
            let grads = (out.clone() * weights.clone()).sum().backward();
            let dw = w.grad(&grads).unwrap();
            assert_eq!(dw.dtype(), w_dtype, "the weight's gradient in its dtype");
            [values(out.inner()), values(x.grad(&grads).unwrap()), values(dw)]
        };
        let (kernel, generic) = (run(true), run(false));
        for (name, (a, b)) in ["output", "dx", "dw"].iter().zip(kernel.iter().zip(&generic)) {
            let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            let tolerance = if w_dtype == F16 && *name == "dw" { 2e-3 } else { 2e-5 };
            let diff = max_abs_diff(a, b);
            assert!(
                diff < tolerance * scale,
                "rms_norm {name}, rows of {n}, weight {w_dtype:?}: {diff} (largest {scale})"
            );
        }
    }
}

/// The RMSNorm kernel against burn's ops (the fast paths off) on `x` and `w`, within `tolerance`.
fn check_rms_norm<const D: usize>(x: Tensor<Gpu, D>, w: Tensor<Gpu, 1>, tolerance: f32, what: &str) {
    use hacpo::backend::{cube_fused, flex_fast::without_fast_paths, fused};
    let kernel = cube_fused::rms_norm(x.clone(), w.clone(), 1e-6).unwrap_or_else(|_| panic!("not taken"));
    let generic = without_fast_paths(|| fused::rms_norm(x, w, 1e-6));
    let diff = max_abs_diff(&values(kernel), &values(generic));
    assert!(diff < tolerance, "rms_norm {what}: {diff}");
}

/// The softmax kernel against burn's `softmax(scores + mask)`, the mask's rows repeating over
/// the scores viewed as rows of the mask's length, within `tolerance`.
fn check_softmax(scores: Tensor<Gpu, 4>, mask: Option<&Tensor<Gpu, 2>>, tolerance: f32, what: &str) {
    let kernel = hacpo::backend::cube_fused::softmax(scores.clone(), mask).unwrap_or_else(|_| panic!("not taken"));
    let masked = match mask {
        Some(m) => {
            let (dims, per) = (scores.dims(), m.dims()[1]);
            (scores.reshape([dims.iter().product::<usize>() / per, per]) + m.clone()).reshape(dims)
        }
        None => scores,
    };
    let diff = max_abs_diff(&values(kernel), &values(burn::tensor::activation::softmax(masked, 3)));
    assert!(diff < tolerance, "softmax, {what}: {diff}");
}

/// burn's generic attention of `[q, k, v]` on the CPU, whose products are exact f32: the
/// reference for the GPU's attention kernel (burn's own products there may run in TF32).
fn attention_on_cpu(
    [q, k, v]: [&Tensor<Gpu, 4>; 3],
    bias: Option<&Tensor<Gpu, 2>>,
    compute: hacpo::dtype::ComputeDtype,
) -> Vec<f32> {
    use hacpo::backend::{Cpu, attention::attention, flex_fast::without_fast_paths};
    let on_cpu = |t: &Tensor<Gpu, 4>| Tensor::<Cpu, 4>::from_data(t.to_data(), &Default::default());
    let bias = bias.map(|b| Tensor::<Cpu, 2>::from_data(b.to_data(), &Default::default()));
    values(without_fast_paths(|| attention(on_cpu(q), on_cpu(k), on_cpu(v), bias.as_ref(), compute)))
}

/// A causal mask over the last `t` of `keys` slots (−∞ above the diagonal), `rows` rows of
/// `per` elements.
fn causal_mask(t: usize, keys: usize, rows: usize, per: usize) -> Tensor<Gpu, 2> {
    let mask: Vec<f32> = (0..rows * per)
        .map(|i| {
            let (query, key) = ((i % (t * keys)) / keys, i % keys);
            if key > keys - t + query { f32::NEG_INFINITY } else { 0.0 }
        })
        .collect();
    Tensor::<Gpu, 2>::from_data(TensorData::new(mask, [rows, per]), &device())
}

/// RoPE's kernel is `x·cos + swap(x)·sin` per head, with tables shared by the batch or one per
/// sequence. The softmax kernel gives burn's `softmax(scores + mask)` with no mask (one query),
/// a mask shared by every sequence and head, one per sequence, and more rows than a grid's x
/// holds; the attention built on it gives the CPU's generic ops' output, with grouped heads and
/// more keys than a cube has units.
#[test]
fn rope_and_attention_kernels_match_the_generic_ops() {
    use burn::tensor::DType::F32;
    use hacpo::backend::{attention::attention, cube_fused, flex_fast::without_fast_paths};
    use hacpo::dtype::ComputeDtype;
    let [b, t, h, d] = [3, 5, 4, 32];
    for rows in [1, b] {
        let x = spread([b, t, h, d], 5, 2.0, F32);
        let cos = spread([rows, t * h * d], 6, 1.0, F32);
        let sin = spread([rows, t * h * d], 7, 1.0, F32);
        let kernel = cube_fused::rope(x.clone(), &cos, &sin).unwrap_or_else(|_| panic!("not taken"));
        let (xs, cs, ss) = (values(x), values(cos), values(sin));
        let expected: Vec<f32> = (0..xs.len())
            .map(|i| {
                let j = i % d;
                let partner = if j < d / 2 { i + d / 2 } else { i - d / 2 };
                let k = i % cs.len();
                xs[i] * cs[k] + xs[partner] * ss[k]
            })
            .collect();
        assert!(max_abs_diff(&values(kernel), &expected) < 1e-5, "rope with {rows} table rows");
    }
    let (kvh, keys) = (2, 300);
    for (t, bias_rows) in [(1, None), (4, Some(1)), (4, Some(b))] {
        let q = spread([b, h, t, d], 8, 1.0, F32);
        let k = spread([b, kvh, keys, d], 9, 1.0, F32);
        let v = spread([b, kvh, keys, d], 10, 1.0, F32);
        let bias = bias_rows.map(|rows| causal_mask(t, keys, rows, if rows == 1 { t * keys } else { h * t * keys }));
        // The softmax as the attention calls it: scores [b, kv heads, group·t, keys].
        let scores = q.clone().reshape([b, kvh, h / kvh * t, d]).matmul(k.clone().transpose());
        check_softmax(scores, bias.as_ref(), 1e-6, &format!("{t} queries, mask rows {bias_rows:?}"));
        let want = attention_on_cpu([&q, &k, &v], bias.as_ref(), ComputeDtype::F32);
        let run = || attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), ComputeDtype::F32);
        let diff = max_abs_diff(&values(run()), &want);
        assert!(diff < 1e-5, "attention, {t} queries, mask rows {bias_rows:?}: {diff}");
        // burn's ops on this device (HACPO_GPU_KERNELS=off's path): its products may be TF32.
        let diff = max_abs_diff(&values(without_fast_paths(run)), &want);
        let bound = if TF32_PRODUCTS { TOLERANCE } else { 1e-5 };
        assert!(diff < bound, "burn's attention, {t} queries, mask rows {bias_rows:?}: {diff}");
    }
    // Rows stored apart (a view of the first columns, as CUDA's padded rows): read in place.
    let (t, keys, pad) = (3, 20, 12);
    let wide = spread([2, 4, t, keys + pad], 12, 4.0, F32);
    let scores = wide.slice([0..2, 0..4, 0..t, 0..keys]);
    let mask = causal_mask(t, keys, 2, 4 * t * keys + pad).slice([0..2, 0..4 * t * keys]);
    check_softmax(scores, Some(&mask), 1e-6, "padded rows");
    let x = spread([6, 40 + pad], 13, 3.0, F32).slice([0..6, 0..40]);
    check_rms_norm(x, spread([40], 14, 1.0, F32), 1e-5, "padded rows");
    // 70,000 rows: the grid's y dimension.
    let (t, keys) = (7, 10);
    let scores = spread([1, 10_000, t, keys], 11, 4.0, F32);
    let mask = causal_mask(t, keys, 1, t * keys);
    check_softmax(scores, Some(&mask), 1e-6, "70,000 rows");
}

/// `x` (rows of the bias's length) plus the bias, if any, on the host.
fn plus_bias(x: Vec<f32>, bias: Option<Tensor<Gpu, 1>>) -> Vec<f32> {
    let Some(bias) = bias.map(values) else { return x };
    x.iter().enumerate().map(|(i, e)| e + bias[i % bias.len()]).collect()
}

/// RMSNorm (with `w`) and RoPE of each head of `x` (`[b, t, heads, d]` in row-major order), on
/// the host: what the heads kernel writes, in the source's order.
fn heads_on_host(x: &[f32], w: Option<&[f32]>, cos: &[f32], sin: &[f32], d: usize) -> Vec<f32> {
    let normed: Vec<f32> = x
        .chunks(d)
        .flat_map(|head| {
            let scale = w.map_or(1.0, |_| 1.0 / (head.iter().map(|e| e * e).sum::<f32>() / d as f32 + 1e-6).sqrt());
            head.iter().enumerate().map(move |(i, e)| e * scale * w.map_or(1.0, |w| w[i])).collect::<Vec<_>>()
        })
        .collect();
    (0..normed.len())
        .map(|i| {
            let partner = if i % d < d / 2 { i + d / 2 } else { i - d / 2 };
            let k = i % cos.len();
            normed[i] * cos[k] + normed[partner] * sin[k]
        })
        .collect()
}

/// The residual add with the next RMSNorm gives the add and burn's norm (a padded operand
/// read in place; a half-precision operand and weight added to an f32 residual, the norm
/// written in half precision). The heads kernel gives the host's bias, RMSNorm and RoPE,
/// head-major: queries into a new buffer (with and without the norm and the projection's bias,
/// tables shared or per sequence, rows stored apart), keys into an f16 KV cache from its third
/// slot with the values copied beside them (with and without f16 biases on both), the cache's
/// other slots untouched, and a cache buffer something else still holds copied rather than
/// overwritten.
#[test]
fn residual_norm_and_heads_kernels_match_the_generic_ops() {
    use burn::tensor::DType::{BF16, F16, F32};
    use hacpo::backend::{cube_fused, flex_fast::without_fast_paths, fused};
    let bf16 = HAS_BF16.then_some((BF16, 1e-1));
    for (dtype, tolerance) in [(F32, 1e-5), (F16, 2e-2)].into_iter().chain(bf16) {
        let x = spread([6, 5, 96], 20, 3.0, dtype);
        let delta = spread([6, 5, 96 + 32], 21, 2.0, dtype).slice([0..6, 0..5, 0..96]);
        let w = spread([96], 22, 1.0, dtype);
        let (sum, normed) = cube_fused::add_rms_norm(x.clone(), delta.clone(), w.clone(), 1e-6, None)
            .unwrap_or_else(|_| panic!("not taken"));
        let (want_sum, want_normed) = without_fast_paths(|| fused::add_rms_norm(x, delta, w, 1e-6, None));
        assert!(max_abs_diff(&values(sum), &values(want_sum)) < tolerance, "residual add, {dtype:?}");
        assert!(max_abs_diff(&values(normed), &values(want_normed)) < tolerance, "norm after the add, {dtype:?}");
    }
    // A half-precision product's output and weight added to the f32 residual, the norm written
    // in half precision for the next products: the f32 sum, the f32 norm rounded once.
    let x = spread([6, 5, 96], 20, 3.0, F32);
    let (delta, w) = (spread([6, 5, 96], 21, 2.0, F16), spread([96], 22, 1.0, F16));
    let (sum, normed) = cube_fused::add_rms_norm(x.clone(), delta.clone(), w.clone(), 1e-6, Some(F16))
        .unwrap_or_else(|_| panic!("not taken"));
    assert_eq!((sum.dtype(), normed.dtype()), (F32, F16));
    let (want_sum, want_normed) = without_fast_paths(|| fused::add_rms_norm(x, delta, w, 1e-6, Some(F16)));
    assert_eq!(want_normed.dtype(), F16);
    assert!(max_abs_diff(&values(sum), &values(want_sum)) < 1e-5, "residual add of a half-precision output");
    assert!(max_abs_diff(&values(normed), &values(want_normed)) < 4e-3, "norm written in half precision");

    let [b, t, h, d] = [3, 4, 4, 32];
    for (table_rows, norm, pad, biased) in [(1, true, 0, false), (b, false, 0, true), (b, true, 24, true)] {
        let x = spread([b * t, h * d + pad], 23, 2.0, F32).slice([0..b * t, 0..h * d]);
        let bias = biased.then(|| spread([h * d], 34, 1.0, F32));
        let w = spread([d], 24, 1.0, F32);
        let cos = spread([table_rows, t * h * d], 25, 1.0, F32);
        let sin = spread([table_rows, t * h * d], 26, 1.0, F32);
        let want = heads_on_host(
            &plus_bias(values(x.clone()), bias.clone()),
            norm.then(|| values(w.clone())).as_deref(),
            &values(cos.clone()),
            &values(sin.clone()),
            d,
        );
        let norm_weight = norm.then_some((w, 1e-6));
        let heads = cube_fused::Heads { x, dims: [b, t, h, d], bias, norm: norm_weight, cos: &cos, sin: &sin };
        assert!(heads.fit(None, None));
        let (out, none) = cube_fused::heads(heads, None, cube_fused::Dest::New(F32));
        assert!(none.is_none());
        let out = values(out.swap_dims(1, 2));
        let diff = max_abs_diff(&out, &want);
        assert!(diff < 1e-5, "queries, table rows {table_rows}, norm {norm}, pad {pad}, bias {biased}: {diff}");
    }

    // Keys and values into an f16 cache of 9 slots, from slot 2, with f16 biases (Qwen2's
    // projections); heads of 48 halves too (96 bytes: rows CUDA's allocator would pad).
    for (d, biased) in [(32, false), (48, true)] {
        let (kvh, cap, start) = (2, 9, 2);
        let k = spread([b * t, kvh * d], 27, 2.0, F32);
        let v = spread([b * t, kvh * d], 28, 2.0, F32);
        let [k_bias, v_bias] = [35, 36].map(|seed| biased.then(|| spread([kvh * d], seed, 1.0, F16)));
        let w = spread([d], 29, 1.0, F32);
        let cos = spread([1, t * kvh * d], 30, 1.0, F32);
        let sin = spread([1, t * kvh * d], 31, 1.0, F32);
        let (cos_v, sin_v, w_v) = (values(cos.clone()), values(sin.clone()), values(w.clone()));
        let want_k = heads_on_host(&plus_bias(values(k.clone()), k_bias.clone()), Some(&w_v), &cos_v, &sin_v, d);
        let want_v = plus_bias(values(v.clone()), v_bias.clone());
        for shared in [false, true] {
            let (k_cache, v_cache) = (spread([b, kvh, cap, d], 32, 1.0, F16), spread([b, kvh, cap, d], 33, 1.0, F16));
            let before = (values(k_cache.clone()), values(v_cache.clone()));
            let held = shared.then(|| (k_cache.clone(), v_cache.clone()));
            let heads = cube_fused::Heads {
                x: k.clone(),
                dims: [b, t, kvh, d],
                bias: k_bias.clone(),
                norm: Some((w.clone(), 1e-6)),
                cos: &cos,
                sin: &sin,
            };
            assert!(heads.fit(Some((&v, v_bias.as_ref())), Some([cap, start])));
            assert!(!heads.fit(Some((&v, v_bias.as_ref())), Some([start + t - 1, start])), "past the buffer's slots");
            let values_in = Some((v.clone(), v_bias.clone()));
            let (k_out, v_out) =
                cube_fused::heads(heads, values_in, cube_fused::Dest::Cache([k_cache, v_cache], start));
            let (k_out, v_out) = (values(k_out), values(v_out.expect("values written")));
            for (got, want, old, what) in [(&k_out, &want_k, &before.0, "keys"), (&v_out, &want_v, &before.1, "values")]
            {
                for (i, g) in got.iter().enumerate() {
                    let (slot, row) = ((i / d) % cap, i / (d * cap));
                    let (seq, head) = (row / kvh, row % kvh);
                    let expected = if (start..start + t).contains(&slot) {
                        want[((seq * t + slot - start) * kvh + head) * d + i % d]
                    } else {
                        old[i]
                    };
                    assert!(
                        (g - expected).abs() < 2e-2,
                        "{what} at {i} (slot {slot}, shared {shared}): {g} vs {expected}"
                    );
                }
            }
            if let Some((k_held, v_held)) = held {
                assert_eq!(values(k_held), before.0, "a held key buffer was overwritten");
                assert_eq!(values(v_held), before.1, "a held value buffer was overwritten");
            }
        }
    }
}

/// A mask for `t` queries over `keys` slots, per sequence and head (`[b, heads·t·keys]`):
/// sequence `i` has its first `pads[i]` slots masked (left padding) and, among the last `t`,
/// the causal order.
fn padded_mask(pads: &[usize], heads: usize, t: usize, keys: usize) -> Tensor<Gpu, 2> {
    let per = heads * t * keys;
    let mask: Vec<f32> = (0..pads.len() * per)
        .map(|i| {
            let (pad, query, key) = (pads[i / per], (i % (t * keys)) / keys, i % keys);
            if key < pad || key > keys - t + query { f32::NEG_INFINITY } else { 0.0 }
        })
        .collect();
    Tensor::<Gpu, 2>::from_data(TensorData::new(mask, [pads.len(), per]), &device())
}

/// The attention kernel (decoding's few queries: scores, softmax and values in one launch)
/// gives the CPU's generic ops' output (exact f32 products): grouped heads, more keys than a
/// tile, no mask, a shared
/// causal mask, left padding longer than a tile (a tile of masked keys), heads of 48 (fewer
/// elements than units) and 64, keys and values read in place from a cache's first slots, f16
/// operands, and f16 compute (whose attention, and so the output, stays f32, unless the output
/// projection reads f16: then written in f16); bf16 operands and bf16 compute where the backend
/// has them.
#[test]
fn attention_kernel_matches_the_generic_ops() {
    use burn::tensor::DType::{F16, F32};
    use hacpo::backend::attention::{attention, attention_read_as};
    use hacpo::backend::cube_fused;
    use hacpo::dtype::ComputeDtype;
    type Case = (usize, usize, usize, usize, &'static [usize], bool);
    let cases: [Case; 5] = [
        // (queries, heads, kv heads, head dim, left pads, causal mask shared by all)
        (1, 4, 2, 32, &[], false),
        (1, 4, 2, 32, &[0, 70, 299], false),
        (4, 4, 2, 32, &[], true),
        (1, 6, 2, 48, &[5, 0], false),
        (2, 3, 3, 64, &[130, 1], false),
    ];
    let bf16 = HAS_BF16.then_some((burn::tensor::DType::BF16, 2e-5));
    for (dtype, tolerance) in [(F32, 1e-5), (F16, 2e-5)].into_iter().chain(bf16) {
        for (t, h, kvh, d, pads, shared) in cases {
            let (b, keys, cap) = (pads.len().max(3), 300, 320);
            // Keys and values as a KV cache hands them: the first slots of larger buffers.
            let k = spread([b, kvh, cap, d], 30, 1.0, dtype).slice([0..b, 0..kvh, 0..keys, 0..d]);
            let v = spread([b, kvh, cap, d], 31, 1.0, dtype).slice([0..b, 0..kvh, 0..keys, 0..d]);
            let q = spread([b, h, t, d], 32, 0.5, dtype);
            let bias = match (pads.is_empty(), shared) {
                (false, _) => Some(padded_mask(pads, h, t, keys)),
                (true, true) => Some(causal_mask(t, keys, 1, t * keys)),
                (true, false) => None,
            };
            let b = if pads.is_empty() { b } else { pads.len() };
            let [q, k, v] = [q, k, v].map(|x| {
                let dims = x.dims();
                x.slice([0..b, 0..dims[1], 0..dims[2], 0..dims[3]])
            });
            let what = format!("{dtype:?}, {t} queries, {h}/{kvh} heads of {d}, pads {pads:?}");
            let kernel = cube_fused::attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), F32)
                .unwrap_or_else(|_| panic!("not taken: {what}"));
            assert_eq!(kernel.dims(), [b, t, h * d], "{what}");
            let generic = attention_on_cpu([&q, &k, &v], bias.as_ref(), ComputeDtype::F32);
            let diff = max_abs_diff(&values(kernel), &generic);
            assert!(diff < tolerance, "attention kernel, {what}: {diff}");
            // Through the attention's entry point, in f16 compute: the kernel's output in f32.
            let fast = attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), ComputeDtype::F16);
            assert_eq!(fast.dtype(), F32, "{what}");
            let slow = attention_on_cpu([&q, &k, &v], bias.as_ref(), ComputeDtype::F16);
            let diff = max_abs_diff(&values(fast), &slow);
            assert!(diff < tolerance, "attention, f16 compute, {what}: {diff}");
            // For an output projection that reads f16: written in f16 (rounded once).
            let read_as =
                attention_read_as(q.clone(), k.clone(), v.clone(), bias.as_ref(), ComputeDtype::F16, Some(F16), None);
            assert_eq!(read_as.dtype(), F16, "{what}");
            let diff = max_abs_diff(&values(read_as), &slow);
            assert!(diff < 1e-3, "attention written in f16, {what}: {diff}");
            // bf16 compute: with hacpo's kernels on, the attention's output is bf16 (burn's ops
            // keep their products in bf16 then too); the kernel computes in f32 and rounds once,
            // within half a bf16 step of the exact output (|out| < 1).
            if HAS_BF16 {
                let fast = attention(q.clone(), k.clone(), v.clone(), bias.as_ref(), ComputeDtype::Bf16);
                assert_eq!(fast.dtype(), burn::tensor::DType::BF16, "{what}");
                let diff = max_abs_diff(&values(fast), &generic);
                assert!(diff < 4e-3, "attention, bf16 compute, {what}: {diff}");
            }
        }
    }
}
