//! Grading throughput on MATH-500: every gold against its reference solution (answer
//! extraction, normalisation, parsing, equivalence), single-threaded and with rayon.
//! `scripts/bench_math_verify.py` measures Math-Verify on the same cases.
//!
//! Run: `cargo bench --bench grader` (MATH-500 from tests/shared, or `HACPO_SHARED`).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hacpo::reward::Grader;

fn cases() -> Vec<(String, String)> {
    let root =
        std::env::var("HACPO_SHARED").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/shared").into());
    let text = std::fs::read_to_string(format!("{root}/data/math/math500_test.jsonl")).expect("MATH-500 file");
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["answer"].as_str().unwrap().to_string(), v["solution"].as_str().unwrap().to_string())
        })
        .collect()
}

fn grading(c: &mut Criterion) {
    hacpo::alloc::keep_freed_memory();
    let cases = cases();
    let grader = Grader::default();
    let mut group = c.benchmark_group("grade math500");
    group.throughput(Throughput::Elements(cases.len() as u64));
    group.bench_function("sequential", |b| b.iter(|| cases.iter().filter(|(g, r)| grader.grade(g, r)).count()));
    group.bench_function("parallel (rayon)", |b| b.iter(|| grader.grade_batch(&cases)));
    group.finish();
}

criterion_group!(benches, grading);
criterion_main!(benches);
