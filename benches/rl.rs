//! The RL core's cost per training step: HACPO advantages, per-response terms and the tensor
//! policy loss (forward + backward) for 2 agents × 128 prompts × 8 responses, both learners.
//!
//! Run: `cargo bench --bench rl`

use burn::tensor::{Tensor, TensorData};
use criterion::{Criterion, criterion_group, criterion_main};
use hacpo::backend::CpuAutodiff;
use hacpo::rl::hacpo::{self as algo, HacpoConfig};
use hacpo::rl::records::PoolSample;
use hacpo::rl::tensor::{SequenceBatch, hacpo_policy_loss};
use hacpo::rl::{Capabilities, MinibatchOrder};
use rand::{Rng, SeedableRng};

fn rl_core(c: &mut Criterion) {
    hacpo::alloc::keep_freed_memory();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let (agents, prompts, g) = (2, 128, 8);
    let pool: Vec<PoolSample> = (0..agents)
        .flat_map(|agent| (0..prompts * g).map(move |i| (agent, i / g)))
        .map(|(agent, group)| PoolSample { agent, group, reward: rng.random_range(0..2) as f64 })
        .collect();
    let mean_src: Vec<f64> = (0..pool.len()).map(|_| -rng.random_range(0.2..2.0)).collect();
    let mean_tgt: Vec<f64> = mean_src.iter().map(|s| s - rng.random_range(-0.2..0.05)).collect();
    let caps = Capabilities::fixed(vec![0.55, 0.35]);
    let cfg = HacpoConfig::default();

    c.bench_function("hacpo step core: 2 agents x 128 prompts x 8", |b| {
        b.iter(|| {
            for learner in 0..agents {
                let adv = algo::advantages(&pool, learner, &caps, &cfg).unwrap();
                for (m, batch) in
                    algo::minibatches(&pool, learner, 4, MinibatchOrder::SelfFirst).unwrap().into_iter().enumerate()
                {
                    let terms: Vec<_> = batch
                        .iter()
                        .map(|&i| {
                            algo::sample_terms(pool[i].agent, learner, adv[i], mean_tgt[i], mean_src[i], m, &caps, &cfg)
                        })
                        .collect();
                    let src: Vec<f64> = batch.iter().map(|&i| mean_src[i]).collect();
                    let x: Vec<f32> = batch.iter().map(|&i| mean_tgt[i] as f32).collect();
                    let x = Tensor::<CpuAutodiff, 1>::from_data(TensorData::new(x, [batch.len()]), &Default::default())
                        .require_grad();
                    let loss = hacpo_policy_loss(x.clone(), &SequenceBatch::from_terms(&terms, &src), m, &cfg);
                    let grads = loss.backward();
                    std::hint::black_box(x.grad(&grads));
                }
            }
        })
    });
}

criterion_group!(benches, rl_core);
criterion_main!(benches);
