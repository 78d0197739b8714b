//! `hacpo generate`: sample completions for one prompt.

use clap::Args;
use hacpo::backend::DeviceSpec;
use hacpo::generate::{GenerateRequest, SamplingParams, generate};
use hacpo::{Error, Result, with_backend};
use serde_json::json;

use super::{Format, ModelArgs, encode_prompt};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo generate --model smollm2-135m --chat --greedy --prompt 'What is the capital of France?'\n  \
    hacpo generate --model ./qwen3-0.6b --chat --temperature 0.7 --top-p 0.95 --num-samples 8 --seed 1 \\\n      \
    --prompt 'Solve 12*13.' --format json")]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(short, long)]
    pub prompt: String,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message before the prompt (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Greedy decoding (argmax at every step).
    #[arg(long, conflicts_with_all = ["temperature", "top_p", "top_k"])]
    pub greedy: bool,
    /// Sampling temperature (> 0).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Maximum number of generated tokens per completion.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Number of completions to sample for the prompt.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub num_samples: usize,
    /// Random seed (the same seed gives the same samples).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this string appears in the output (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// The most samples of one prompt `hacpo generate` draws at once (their KV caches live together).
const MAX_SAMPLES: usize = 1024;

pub fn run(args: GenerateArgs) -> Result<()> {
    let device = DeviceSpec::parse(&args.model.device)?;
    if !args.greedy && args.temperature <= 0.0 {
        return Err(Error::InvalidArgument("--temperature must be > 0; use --greedy for argmax decoding".into()));
    }
    let params = SamplingParams {
        temperature: if args.greedy { 0.0 } else { args.temperature },
        top_p: args.top_p,
        top_k: args.top_k,
        max_new_tokens: args.max_new_tokens,
        seed: args.seed,
    };
    params.validate()?;
    if args.stop.iter().any(String::is_empty) {
        return Err(Error::InvalidArgument(
            "--stop \"\" would stop before the first token; give a non-empty string".into(),
        ));
    }
    if args.num_samples == 0 || args.num_samples > MAX_SAMPLES {
        return Err(Error::InvalidArgument(format!(
            "--num-samples must be between 1 and {MAX_SAMPLES} (each sample keeps its own KV cache), got {}",
            args.num_samples
        )));
    }
    // The samples' KV caches live together: estimated before the model loads, with the
    // prompt's tokens bounded by its bytes plus what a chat template adds.
    let load = hacpo::memory_plan::CommandLoad {
        sequences: args.num_samples,
        prompt: args.prompt.len() + args.system.as_deref().map_or(0, str::len) + TEMPLATE_TOKENS,
        new: args.max_new_tokens,
        ..Default::default()
    };
    let ways = [
        format!("fewer samples (--num-samples {})", (args.num_samples / 4).max(1)),
        format!("shorter completions (--max-new-tokens {})", (args.max_new_tokens / 4).max(1)),
    ];
    args.model.check_memory("generate", load, &ways)?;
    with_backend!(device, |B, dev| run_on::<B>(&args, params, &dev))
}

/// An upper bound on the tokens a chat template adds around a prompt.
pub const TEMPLATE_TOKENS: usize = 512;

fn run_on<B: burn::tensor::backend::Backend>(
    args: &GenerateArgs,
    params: SamplingParams,
    device: &B::Device,
) -> Result<()> {
    let pretrained = args.model.load::<B>(device)?;
    let tok = &pretrained.tokenizer;
    let prompt_ids = encode_prompt(tok, &args.prompt, args.chat, args.system.as_deref())?;
    let context = pretrained.model.config.max_position_embeddings;
    if prompt_ids.len() >= context {
        return Err(Error::PromptTooLong { prompt_tokens: prompt_ids.len(), context });
    }
    if prompt_ids.len().saturating_add(args.max_new_tokens) > context {
        return Err(Error::InvalidArgument(format!(
            "the prompt ({} tokens) plus --max-new-tokens {} exceeds the model's context of {context} tokens; \
             lower --max-new-tokens to at most {}",
            prompt_ids.len(),
            args.max_new_tokens,
            context.saturating_sub(prompt_ids.len())
        )));
    }
    let prompts = vec![prompt_ids];
    let mut req = GenerateRequest::new(&prompts, params);
    req.num_samples = args.num_samples;
    req.stop_token_ids = pretrained.eos_token_ids.clone();
    req.stop_strings = args.stop.clone();
    req.tokenizer = Some(tok);

    let progress = hacpo::progress::Progress::new("generating", 0);
    let (completions, stats) = generate(&pretrained.model, &req)?;
    progress.finish();

    let texts: Vec<String> = completions
        .iter()
        .map(|c| {
            let mut text = tok.decode(&c.token_ids, true)?;
            // Like vLLM: the stop string itself is not part of the text.
            if let Some(s) = &c.stop_string
                && let Some(at) = text.find(s.as_str())
            {
                text.truncate(at);
            }
            Ok(text)
        })
        .collect::<Result<_>>()?;

    match args.format {
        Format::Json => {
            let out = json!({
                "prompt_ids": prompts[0],
                "completions": completions.iter().zip(&texts).map(|(c, t)| json!({
                    "ids": c.token_ids,
                    "text": t,
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string(&out).expect("json"));
        }
        Format::Text => {
            for (i, t) in texts.iter().enumerate() {
                if texts.len() > 1 {
                    println!("--- sample {i} ---");
                }
                println!("{t}");
            }
        }
    }
    let decode_tps = stats.generated_tokens as f64 / stats.decode_seconds.max(1e-9);
    tracing::info!(
        prompt_tokens = stats.prompt_tokens,
        generated = stats.generated_tokens,
        prefill_s = format!("{:.3}", stats.prefill_seconds),
        decode_tok_per_s = format!("{decode_tps:.1}"),
        "done"
    );
    Ok(())
}
