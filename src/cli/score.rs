//! `hacpo score`: per-token log-probabilities of a response given a prompt.

use clap::Args;
use hacpo::backend::DeviceSpec;
use hacpo::{Result, with_backend};
use serde_json::json;

use super::{Format, ModelArgs, encode_prompt};

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  \
    hacpo score --model smollm2-135m --chat --prompt 'What is the capital of France?' \\\n      \
    --response 'The capital of France is Paris.' --format json")]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(short, long)]
    pub prompt: String,
    /// The response whose tokens are scored (encoded without special tokens).
    #[arg(short, long)]
    pub response: String,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message before the prompt (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
}

pub fn run(args: ScoreArgs) -> Result<()> {
    let device = DeviceSpec::parse(&args.model.device)?;
    with_backend!(device, |B, dev| run_on::<B>(&args, &dev))
}

fn run_on<B: burn::tensor::backend::Backend>(args: &ScoreArgs, device: &B::Device) -> Result<()> {
    let pretrained = args.model.load::<B>(device)?;
    let tok = &pretrained.tokenizer;
    let prompt_ids = encode_prompt(tok, &args.prompt, args.chat, args.system.as_deref())?;
    let response_ids = tok.encode(&args.response, false)?;
    let logprobs =
        hacpo::generate::score::score(&pretrained.model, &[(prompt_ids.clone(), response_ids.clone())], 1.0)?.remove(0);
    match args.format {
        Format::Json => {
            let out = json!({"prompt_ids": prompt_ids, "response_ids": response_ids, "logprobs": logprobs});
            println!("{}", serde_json::to_string(&out).expect("json"));
        }
        Format::Text => {
            for (id, lp) in response_ids.iter().zip(&logprobs) {
                let piece = tok.decode(&[*id], false)?;
                println!("{id:>8} {lp:>10.4}  {piece:?}");
            }
            println!("total {:.4} over {} tokens", logprobs.iter().sum::<f32>(), logprobs.len());
        }
    }
    Ok(())
}
