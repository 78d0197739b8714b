//! The benchmark readers on the real files in `tests/shared/data/math`, and every benchmark's
//! golds graded against themselves.

mod common;

use hacpo::data::{Benchmark, load_benchmark};
use hacpo::reward::Grader;

fn load(b: Benchmark) -> Vec<hacpo::data::MathProblem> {
    let path = common::shared(&format!("data/math/{}", b.file_name()));
    load_benchmark(b, Some(path.to_str().unwrap()), None).unwrap()
}

#[test]
fn every_benchmark_reads_with_its_answer_field() {
    let expected = [
        (Benchmark::Gsm8k, 1319),
        (Benchmark::Math500, 500),
        (Benchmark::MathTrain, 7470), // 4 rows have no answer
        (Benchmark::Aime24, 30),
        (Benchmark::Aime25, 30),
        (Benchmark::Amc23, 40),
        (Benchmark::Minerva, 272),
        (Benchmark::Olympiad, 675),
    ];
    for (b, n) in expected {
        let problems = load(b);
        assert_eq!(problems.len(), n, "{}", b.name());
        assert!(problems.iter().all(|p| !p.answer.trim().is_empty() && !p.question.trim().is_empty()), "{}", b.name());
    }
    assert_eq!(load(Benchmark::Gsm8k)[0].answer, "18");
    assert_eq!(load(Benchmark::Amc23)[0].answer, "27");
    // A row of the wrong benchmark names the missing field.
    let gsm = common::shared("data/math/gsm8k_test.jsonl");
    let e = load_benchmark(Benchmark::Olympiad, Some(gsm.to_str().unwrap()), Some(1)).unwrap_err().to_string();
    assert!(e.contains("final_answer") && e.contains("row 1"), "{e}");
}

#[test]
fn every_gold_of_every_benchmark_matches_itself() {
    let g = Grader::default();
    let mut failures = vec![];
    let mut total = 0;
    for b in Benchmark::ALL {
        for p in load(b) {
            total += 1;
            if !g.grade(&p.answer, &format!("Therefore the final answer is $\\boxed{{{}}}$.", p.answer)) {
                failures.push(format!("{}: {:?}", b.name(), p.answer));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} golds do not match themselves:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
