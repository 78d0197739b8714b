//! Criterion benchmarks of the model core on the built-in ~5M-parameter config:
//! prefill, batched greedy decoding and a full training step (forward + backward + AdamW).
//! `hacpo bench` reports the same phases as tokens/s, also for real checkpoints.
//!
//! Run: `cargo bench --bench model`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hacpo::backend::{Cpu, CpuAutodiff};
use hacpo::bench::{TrainStep, decode_once, prefill_once, random_ids, tiny_5m_config};
use hacpo::model::weights::{RandomWeights, build};
use rand::SeedableRng;

fn model_core(c: &mut Criterion) {
    hacpo::alloc::keep_freed_memory();
    let config = tiny_5m_config();
    let device = Default::default();
    let model = build::<Cpu>(&config, &mut RandomWeights::new(&config, 0, 0.02), &device).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut group = c.benchmark_group("tiny-5m");
    group.sample_size(10);

    let ids = random_ids(&mut rng, 4 * 256, config.vocab_size);
    group.throughput(Throughput::Elements(4 * 256));
    group.bench_function("prefill 4x256", |b| b.iter(|| prefill_once(&model, &ids, 4, 256)));

    for batch in [1usize, 64] {
        let prompts: Vec<Vec<u32>> = (0..batch).map(|_| random_ids(&mut rng, 32, config.vocab_size)).collect();
        group.throughput(Throughput::Elements(batch as u64 * 64));
        group.bench_function(format!("generate {batch}x64 (prefill 32)"), |b| {
            b.iter(|| decode_once(&model, &prompts, 1, 64))
        });
    }

    let trainable = build::<CpuAutodiff>(&config, &mut RandomWeights::new(&config, 0, 0.02), &device).unwrap();
    let mut step = TrainStep::new(trainable, 8, 128);
    group.throughput(Throughput::Elements(8 * 128));
    group.bench_function("train step 8x128", |b| b.iter(|| step.step()));
    group.finish();
}

criterion_group!(benches, model_core);
criterion_main!(benches);
