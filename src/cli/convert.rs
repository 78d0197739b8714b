//! `hacpo convert`: write any loadable model (GGUF, zoo id, directory) as a Hugging Face
//! directory that transformers and vLLM load.

use std::path::PathBuf;

use clap::Args;
use hacpo::backend::Cpu;
use hacpo::model::SaveDtype;
use hacpo::{Error, Result};

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  \
    hacpo convert --model SmolLM2-135M-Instruct.Q4_1.gguf --out ./smollm2-hf --dtype bf16")]
pub struct ConvertArgs {
    /// A Hugging Face model directory, a .gguf file, or a zoo id.
    #[arg(short, long)]
    pub model: String,
    /// Output directory (created; existing model files in it are replaced).
    #[arg(short, long)]
    pub out: PathBuf,
    /// Storage dtype of the written weights: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: ConvertArgs) -> Result<()> {
    let dtype = SaveDtype::parse(&args.dtype)?;
    let pretrained = hacpo::model::load::<Cpu>(&args.model, &Default::default())?;
    if args.out.exists() && !args.out.is_dir() {
        return Err(Error::InvalidArgument(format!("--out {} exists and is not a directory", args.out.display())));
    }
    hacpo::model::save_pretrained(
        &pretrained.model,
        &pretrained.tokenizer,
        &pretrained.eos_token_ids,
        &args.out,
        dtype,
    )?;
    eprintln!(
        "wrote {} ({} parameters, {})",
        args.out.display(),
        pretrained.model.config.num_parameters(),
        dtype.torch_name()
    );
    Ok(())
}
