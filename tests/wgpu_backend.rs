//! The generic (non-CPU) code path on burn's wgpu backend, run on Mesa's software Vulkan driver
//! (lavapipe) where there is no GPU: the same burn code as CUDA, so a CPU-only shortcut shows up
//! here. Needs a Vulkan device: `apt-get install -y mesa-vulkan-drivers` on Debian/Ubuntu.
#![cfg(feature = "wgpu")]

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::{Reference, fixture, full_logits_on, max_abs_diff, reference};
use hacpo::backend::Wgpu;
use hacpo::generate::{GenerateRequest, SamplingParams, generate};
use hacpo::model::{CausalLm, load_model_dir};

/// A Qwen3 and a Llama-3.1 tiny random checkpoint with transformers' reference numbers.
const FIXTURES: [&str; 2] = ["qwen3-tiny", "llama31-tiny"];
const TOLERANCE: f32 = 1e-4;

/// The wgpu device, or a failure that says what to install (never a silent skip).
fn device() -> burn::backend::wgpu::WgpuDevice {
    let has_vulkan = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"]
        .iter()
        .any(|d| std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some()));
    assert!(
        has_vulkan,
        "no Vulkan driver found: the wgpu tests need one; install Mesa's software driver with \
         `apt-get install -y mesa-vulkan-drivers` (Debian/Ubuntu) or run on a machine with a GPU"
    );
    burn::backend::wgpu::WgpuDevice::default()
}

fn load(name: &str) -> CausalLm<Wgpu> {
    load_model_dir(&fixture(&format!("models/{name}")), &device()).unwrap()
}

#[test]
fn forward_matches_transformers_on_wgpu() {
    for name in FIXTURES {
        let model = load(name);
        let r = reference(name);
        let diff = max_abs_diff(&full_logits_on(&model, &r.prompt_a, &device()).concat(), &r.logits_a);
        assert!(diff < TOLERANCE, "{name}: wgpu logits differ from transformers' by {diff}");
    }
}

#[test]
fn batched_greedy_generation_matches_transformers_on_wgpu() {
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
fn scoring_matches_transformers_log_softmax_on_wgpu() {
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
/// autodiff through a full log-softmax, both on wgpu: values and both gradients.
#[test]
fn chunked_logprob_backward_matches_autodiff_on_wgpu() {
    use burn::backend::Autodiff;
    use burn::tensor::activation::log_softmax;
    type Ad = Autodiff<Wgpu>;
    let dev = device();
    let (n, d, vocab) = (13, 16, 3000);
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
        let v = |x: Tensor<Wgpu, 2>| x.into_data().convert::<f32>().into_vec::<f32>().unwrap();
        [
            lp.inner().into_data().convert::<f32>().into_vec().unwrap(),
            v(h.grad(&grads).unwrap()),
            v(w.grad(&grads).unwrap()),
        ]
    };
    let (got, want) = (run(true), run(false));
    for (what, g, w) in
        [("values", &got[0], &want[0]), ("d hidden", &got[1], &want[1]), ("d weight", &got[2], &want[2])]
    {
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        let err = max_abs_diff(g, w);
        assert!(err / scale < 1e-4, "{what}: max error {err} (scale {scale})");
    }
}
