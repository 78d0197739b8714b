//! Benchmark evaluation: generate answers with the model's chat template and the standard
//! math prompt, grade them, and report accuracy (avg@K), pass@K, response length and time.

use std::time::Instant;

use burn::tensor::backend::Backend;
use rayon::prelude::*;
use serde::Serialize;

use crate::data::MathProblem;
use crate::error::Result;
use crate::generate::{GenerateRequest, SamplingParams, generate};
use crate::model::Pretrained;
use crate::reward::{GradeConfig, Grader};
use crate::tokenizer::Message;

pub use crate::task::MATH_PROMPT;

/// How to evaluate.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// Samples per problem (K).
    pub samples: usize,
    /// 0 = greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub max_new_tokens: usize,
    /// Problems per generation batch.
    pub batch_prompts: usize,
    pub seed: u64,
    pub grader: GradeConfig,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            samples: 1,
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 2048,
            batch_prompts: 16,
            seed: 0,
            grader: GradeConfig::default(),
        }
    }
}

/// One problem's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct ProblemResult {
    pub id: String,
    pub gold: String,
    pub correct: Vec<bool>,
    pub response_tokens: Vec<usize>,
    /// The first sample's response text.
    pub response: String,
}

/// One benchmark's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub bench: String,
    pub problems: usize,
    pub samples: usize,
    /// Mean correctness over all samples (avg@K; accuracy for K = 1).
    pub accuracy: f64,
    /// Fraction of problems with at least one correct sample.
    pub pass_at_k: f64,
    pub mean_response_tokens: f64,
    pub seconds: f64,
    pub results: Vec<ProblemResult>,
}

/// The user message for a problem.
pub fn prompt_text(question: &str) -> String {
    crate::task::math_prompt_text(question)
}

/// Generates and grades `problems`; `on_progress(done)` is called after each batch.
pub fn evaluate<B: Backend>(
    pretrained: &Pretrained<B>,
    bench: &str,
    problems: &[MathProblem],
    opts: &EvalOptions,
    on_progress: &mut dyn FnMut(usize),
) -> Result<BenchReport> {
    let started = Instant::now();
    let tok = &pretrained.tokenizer;
    let grader = Grader { config: opts.grader.clone() };
    let params = SamplingParams {
        temperature: opts.temperature,
        top_p: opts.top_p,
        top_k: 0,
        max_new_tokens: opts.max_new_tokens,
        seed: opts.seed,
    };
    let mut results = Vec::with_capacity(problems.len());
    for chunk in problems.chunks(opts.batch_prompts.max(1)) {
        let prompts: Vec<Vec<u32>> = chunk
            .iter()
            .map(|p| {
                let text = prompt_text(&p.question);
                if tok.chat_template().is_some() {
                    tok.encode_chat(&[Message::user(text)], true)
                } else {
                    tok.encode(&text, true)
                }
            })
            .collect::<Result<_>>()?;
        let mut req = GenerateRequest::new(&prompts, params.clone());
        req.num_samples = opts.samples;
        req.stop_token_ids = pretrained.eos_token_ids.clone();
        let (completions, _) = generate(&pretrained.model, &req)?;
        let texts: Vec<String> = completions.iter().map(|c| tok.decode(&c.token_ids, true)).collect::<Result<_>>()?;
        let cases: Vec<(&str, &str)> =
            completions.iter().zip(&texts).map(|(c, t)| (chunk[c.prompt_index].answer.as_str(), t.as_str())).collect();
        let verdicts: Vec<bool> = cases.par_iter().map(|(g, r)| grader.grade(g, r)).collect();
        for (i, p) in chunk.iter().enumerate() {
            let idx: Vec<usize> = (0..completions.len()).filter(|&j| completions[j].prompt_index == i).collect();
            results.push(ProblemResult {
                id: p.id.clone(),
                gold: p.answer.clone(),
                correct: idx.iter().map(|&j| verdicts[j]).collect(),
                response_tokens: idx.iter().map(|&j| completions[j].token_ids.len()).collect(),
                response: idx.first().map(|&j| texts[j].clone()).unwrap_or_default(),
            });
        }
        on_progress(results.len());
    }
    let total: usize = results.iter().map(|r| r.correct.len()).sum();
    let correct: usize = results.iter().map(|r| r.correct.iter().filter(|&&c| c).count()).sum();
    let tokens: usize = results.iter().map(|r| r.response_tokens.iter().sum::<usize>()).sum();
    let n = results.len().max(1) as f64;
    Ok(BenchReport {
        bench: bench.to_string(),
        problems: results.len(),
        samples: opts.samples,
        accuracy: correct as f64 / total.max(1) as f64,
        pass_at_k: results.iter().filter(|r| r.correct.iter().any(|&c| c)).count() as f64 / n,
        mean_response_tokens: tokens as f64 / total.max(1) as f64,
        seconds: started.elapsed().as_secs_f64(),
        results,
    })
}
