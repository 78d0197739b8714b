//! `hacpo eval --workload search`: the search pipeline run greedily by one model.

use std::time::Instant;

use hacpo::backend::DeviceSpec;
use hacpo::search::corpus::{QaSet, load_files};
use hacpo::search::pipeline::{self, Role};
use hacpo::search::retriever::Bm25;
use hacpo::search::roles::Penalties;
use hacpo::tokenizer::Message;
use hacpo::{Error, Result, with_backend};

use super::eval::EvalArgs;

/// New tokens per role, capped by --max-new-tokens: sub-queries, a list of ids, a short answer.
fn role_budget(role: Role, cap: usize) -> usize {
    let budget = match role {
        Role::Rewriter => 128,
        Role::Reranker => 64,
        Role::Answerer => 64,
    };
    budget.min(cap)
}

pub fn run(args: &EvalArgs) -> Result<()> {
    if !args.bench.is_empty() {
        return Err(Error::InvalidArgument(
            "--bench is for the math workload; the search workload takes --data".into(),
        ));
    }
    if args.samples != 1 || args.temperature != 0.0 {
        return Err(Error::InvalidArgument(
            "the search workload is evaluated greedily: leave out --samples and --temperature".into(),
        ));
    }
    if args.limit == Some(0) {
        return Err(Error::InvalidArgument("--limit 0 evaluates nothing; give at least 1 or leave it out".into()));
    }
    super::eval::check_sampling(args)?;
    if args.top_p != 1.0 {
        return Err(Error::InvalidArgument("the search workload is evaluated greedily: leave out --top-p".into()));
    }
    if let Some(out) = &args.out {
        hacpo::error::check_writable(out)?;
    }
    let data = args.data.as_deref().ok_or_else(|| {
        Error::InvalidArgument(
            "the search workload needs --data hotpotqa, musique or questions.jsonl (with --corpus)".into(),
        )
    })?;
    let tiny_kb = data == hacpo::search::task::TINY_KB;
    let (mut questions, corpus) = match (QaSet::parse(data), &args.corpus) {
        // The generated knowledge base of configs/tiny-search.toml: its held-out questions.
        (None, None) if tiny_kb => {
            let kb = hacpo::search::kb::generate(&Default::default())?;
            (hacpo::search::kb::Kb::questions(&kb.heldout), kb.documents)
        }
        (Some(set), None) => set.load()?,
        (Some(_), Some(_)) => {
            return Err(Error::InvalidArgument(format!("--data {data} brings its own passages; leave out --corpus")));
        }
        (None, Some(corpus)) => load_files(std::path::Path::new(data), corpus)?,
        (None, None) => {
            return Err(Error::InvalidArgument(format!(
                "--data {data} is not a built-in set (hotpotqa, musique, tiny-kb); a questions file needs --corpus \
                 passages.jsonl"
            )));
        }
    };
    if let Some(n) = args.limit {
        questions.truncate(n);
    }
    if questions.is_empty() {
        return Err(Error::InvalidArgument(format!("--data {data} holds no questions; check the file")));
    }
    // A batch's KV caches live together; a prompt shows a question and up to ten passages.
    let mut passages: Vec<usize> = corpus.iter().map(|d| d.title.len() + d.text.len()).collect();
    passages.sort_unstable_by(|a, b| b.cmp(a));
    let longest_question = questions.iter().map(|q| q.question.len()).max().unwrap_or(0);
    let load = hacpo::memory_plan::CommandLoad {
        sequences: args.batch_size,
        prompt: longest_question + passages.iter().take(10).sum::<usize>() + super::generate::TEMPLATE_TOKENS,
        new: role_budget(Role::Rewriter, args.max_new_tokens),
        ..Default::default()
    };
    let ways = [format!("smaller batches (--batch-size {})", (args.batch_size / 4).max(1))];
    args.model.check_memory("eval", load, &ways)?;
    let device = DeviceSpec::parse(&args.model.device)?;
    with_backend!(device, |B, dev| run_on::<B>(args, data, &questions, &corpus, &dev))
}

fn run_on<B: burn::tensor::backend::Backend>(
    args: &EvalArgs,
    data: &str,
    questions: &[hacpo::search::corpus::Question],
    corpus: &[hacpo::search::corpus::Document],
    device: &B::Device,
) -> Result<()> {
    let index_started = Instant::now();
    let retriever = Bm25::new(corpus)?;
    eprintln!("indexed {} passages in {:.1} s", corpus.len(), index_started.elapsed().as_secs_f64());
    let agent = args.model.load::<B>(device)?;
    let context = agent.model.config.max_position_embeddings;
    let started = Instant::now();
    let progress = hacpo::progress::Progress::new("eval search", 3);
    let mut generate = |role: Role, prompts: &[Vec<Message>]| -> Result<Vec<String>> {
        progress.set_message(role.name());
        let max_new = role_budget(role, args.max_new_tokens);
        let ids: Vec<Vec<u32>> = prompts
            .iter()
            .map(|m| {
                let ids = agent.tokenizer.encode_chat(m, true)?;
                if ids.len() + max_new > context {
                    return Err(Error::InvalidArgument(format!(
                        "a {} prompt has {} tokens; with {max_new} new tokens it exceeds the model's context of \
                         {context}: use a model with a longer context or a corpus with shorter passages",
                        role.name(),
                        ids.len()
                    )));
                }
                Ok(ids)
            })
            .collect::<Result<_>>()?;
        let out = hacpo::generate::greedy_responses(
            &agent.model,
            &agent.tokenizer,
            &agent.eos_token_ids,
            &ids,
            max_new,
            args.batch_size,
        )?;
        progress.inc(1);
        Ok(out)
    };
    // Prompts are checked against the model's context above, with every passage shown.
    let traces =
        pipeline::run(&mut generate, &retriever, corpus, questions, &Penalties::default(), &pipeline::show_all)?;
    progress.finish();
    let seconds = started.elapsed().as_secs_f64();
    let s = pipeline::summarize(&traces);
    println!(
        "{:<10} {:>5} {:>7} {:>7} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "data", "n", "EM", "F1", "rewr pen", "rank pen", "ans pen", "recall", "s/quest"
    );
    println!(
        "{:<10} {:>5} {:>6.1}% {:>6.1}% {:>8.1}% {:>8.1}% {:>8.1}% {:>7.1}% {:>9.2}",
        data.chars().take(10).collect::<String>(),
        s.questions,
        100.0 * s.em,
        100.0 * s.f1,
        100.0 * s.rewriter_penalty_rate,
        100.0 * s.reranker_penalty_rate,
        100.0 * s.answerer_penalty_rate,
        100.0 * s.retrieval_recall,
        seconds / s.questions.max(1) as f64
    );
    if let Some(path) = &args.out {
        let json = serde_json::json!({
            "workload": "search", "model": args.model.model, "data": data, "summary": s,
            "seconds": seconds, "seconds_per_question": seconds / s.questions.max(1) as f64, "questions": traces,
        });
        hacpo::error::write_atomic(path, serde_json::to_string_pretty(&json).expect("json").as_bytes())?;
        eprintln!("report written to {}", path.display());
    }
    Ok(())
}
