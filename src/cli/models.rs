//! `hacpo models`: the zoo.

use clap::Args;
use hacpo::Result;
use hacpo::model::zoo;

use super::Format;

#[derive(Args, Debug)]
pub struct ModelsArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

pub fn run(args: ModelsArgs) -> Result<()> {
    let cache = hf_hub::Cache::from_env();
    let entries = zoo::entries();
    match args.format {
        Format::Json => {
            let rows: Vec<_> = entries
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "id": e.id, "repo": e.repo, "family": e.family, "params": e.params,
                        "eos_token_ids": e.eos_token_ids, "description": e.description,
                        "cached": cache.model(e.repo.clone()).get("config.json").is_some(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
        }
        Format::Text => {
            println!("{:<16} {:<38} {:<7} {:>6}  CACHED", "ID", "REPO", "FAMILY", "PARAMS");
            for e in &entries {
                let cached = cache.model(e.repo.clone()).get("config.json").is_some();
                println!(
                    "{:<16} {:<38} {:<7} {:>6}  {}",
                    e.id,
                    e.repo,
                    e.family.model_type(),
                    e.params,
                    if cached { "yes" } else { "no" }
                );
            }
            println!("\nAny Hugging Face directory or .gguf file also works as --model.");
        }
    }
    Ok(())
}
