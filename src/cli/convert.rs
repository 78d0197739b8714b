//! `hacpo convert`: write any loadable model (GGUF, zoo id, directory) as a Hugging Face
//! directory that transformers and vLLM load; with `--merge-lora`, a base model with a PEFT
//! adapter folded into its weights.

use std::path::PathBuf;

use clap::Args;
use hacpo::backend::Cpu;
use hacpo::model::SaveDtype;
use hacpo::{Error, Result};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo convert --model SmolLM2-135M-Instruct.Q4_1.gguf --out ./smollm2-hf --dtype bf16\n  \
    hacpo convert --merge-lora runs/x/checkpoints/step-000100/agent-0 --out ./merged")]
pub struct ConvertArgs {
    /// A Hugging Face model directory, a .gguf file, or a zoo id. With --merge-lora: the base
    /// model (default: the adapter's base_model_name_or_path).
    #[arg(short, long, required_unless_present = "merge_lora")]
    pub model: Option<String>,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) to merge
    /// into the base model's weights.
    #[arg(long, value_name = "ADAPTER_DIR")]
    pub merge_lora: Option<PathBuf>,
    /// Output directory (created; refused when it already holds a model).
    #[arg(short, long)]
    pub out: PathBuf,
    /// Storage dtype of the written weights: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

/// The files of a model directory `convert` writes.
const MODEL_FILES: [&str; 7] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "adapter_model.safetensors",
];

pub fn run(args: ConvertArgs) -> Result<()> {
    let dtype = SaveDtype::parse(&args.dtype)?;
    if args.out.exists() && !args.out.is_dir() {
        return Err(Error::InvalidArgument(format!("--out {} exists and is not a directory", args.out.display())));
    }
    // Never over a model already there (converting a directory into itself would replace its
    // f32 weights by the bf16 copy).
    let held: Vec<String> = std::fs::read_dir(&args.out)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| MODEL_FILES.contains(&n.as_str()) || (n.starts_with("model-") && n.ends_with(".safetensors")))
        .collect();
    if !held.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "--out {} already holds a model ({}); choose a new or empty directory (convert never overwrites one)",
            args.out.display(),
            held.join(", ")
        )));
    }
    let device = Default::default();
    let pretrained = match (&args.merge_lora, &args.model) {
        (Some(adapter), base) => {
            if !hacpo::model::lora::is_adapter_dir(adapter) {
                return Err(Error::InvalidArgument(format!(
                    "--merge-lora {}: no adapter_config.json there; give the directory PEFT (or a hacpo LoRA \
                     checkpoint's agent-N) wrote",
                    adapter.display()
                )));
            }
            hacpo::model::load_adapter_dir::<Cpu>(adapter, base.as_deref(), &device)?
        }
        (None, Some(model)) => hacpo::model::load::<Cpu>(model, &device)?,
        (None, None) => unreachable!("clap requires --model without --merge-lora"),
    };
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
