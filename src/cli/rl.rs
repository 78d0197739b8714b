//! `hacpo rl …`: tools for the RL algorithm core.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use hacpo::rl::inspect::Input;
use hacpo::rl::{mgrpo, mhgpo};
use hacpo::{Error, Result};

#[derive(Args, Debug)]
pub struct RlArgs {
    #[command(subcommand)]
    pub command: RlCommand,
}

#[derive(Subcommand, Debug)]
pub enum RlCommand {
    /// Explain what HACPO does to one learner's mini-batch: advantages, ω, ratios, clips,
    /// objectives and gradient weights per response.
    Inspect(InspectArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "Input (JSON; all fields but samples optional, defaults from docs/algorithms.md):\n  \
    {\"learner\": 0, \"capabilities\": [0.6, 0.3], \"alpha\": 1.0, \"delta\": 0.2, \"delta_step\": 0.025,\n   \
    \"eps_low\": 0.0003, \"eps_high\": 0.0004, \"minibatch_index\": 0,\n   \
    \"samples\": [{\"agent\": 0, \"prompt\": \"p0\", \"reward\": 1.0, \"mean_logp_target\": -1.2, \"mean_logp_source\": -1.0}]}\n\
    Switches for ablations may appear too: capability_baseline, discrepancy_coef, exp_is, stepwise, naive.\n\n\
    Example (the worked example of docs/algorithms.md §2.12, all four mini-batch indices):\n  \
    hacpo rl inspect --input tests/fixtures/rl/worked_example.json --minibatch-index 0,1,2,3\n\n\
    An MHGPO batch ({\"algorithm\": \"mhgpo\", \"questions\": [{\"id\", \"nodes\": [...]}]}, docs/mhgpo-batch.md)\n\
    prints each output's propagated reward, advantage and loss mask:\n  \
    hacpo rl inspect --input tests/fixtures/rl/mhgpo_tree.json\n\n\
    An M-GRPO batch ({\"algorithm\": \"mgrpo\", \"questions\": [{\"id\", \"rollouts\": [...]}]}, docs/mgrpo-batch.md)\n\
    prints each main and sub-trajectory's reward, aligned copies and advantage:\n  \
    hacpo rl inspect --input tests/fixtures/rl/mgrpo_batch.json")]
pub struct InspectArgs {
    /// The batch file (`-` for standard input).
    #[arg(short, long)]
    pub input: PathBuf,
    /// Mini-batch update indices to evaluate, comma-separated (default: the file's).
    #[arg(long, value_delimiter = ',')]
    pub minibatch_index: Vec<usize>,
    #[arg(long, value_enum, default_value_t = InspectFormat::Table)]
    pub format: InspectFormat,
}

/// `table` is the human view; `json` one report object per line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum InspectFormat {
    Table,
    Json,
}

pub fn run(args: RlArgs) -> Result<()> {
    match args.command {
        RlCommand::Inspect(a) => inspect(a),
    }
}

fn inspect(args: InspectArgs) -> Result<()> {
    let text = if args.input.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| Error::io("read", std::path::Path::new("stdin"), e))?
    } else {
        std::fs::read_to_string(&args.input).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound {
                what: "rl inspect input".into(),
                path: args.input.clone(),
                hint: "Pass a JSON batch file (see `hacpo rl inspect --help`).".into(),
            },
            _ => Error::io("read", &args.input, e),
        })?
    };
    let peek: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::config(args.input.display().to_string(), format!("not valid JSON: {e}")))?;
    match peek.get("algorithm").and_then(|a| a.as_str()) {
        // Each output's propagated reward, advantage and whether it is in the loss.
        Some("mhgpo") => {
            return inspect_batch(
                &args,
                peek,
                "an MHGPO batch (docs/mhgpo-batch.md)",
                mhgpo::Batch::report,
                mhgpo::table,
            );
        }
        // Each main and sub-trajectory's reward, aligned copies and advantage.
        Some("mgrpo") => {
            return inspect_batch(
                &args,
                peek,
                "an M-GRPO batch (docs/mgrpo-batch.md)",
                mgrpo::Batch::report,
                mgrpo::table,
            );
        }
        _ => {}
    }
    let mut input = Input::parse(&text)?;
    let indices = if args.minibatch_index.is_empty() { vec![input.minibatch_index] } else { args.minibatch_index };
    for (i, m) in indices.into_iter().enumerate() {
        input.minibatch_index = m;
        let report = input.report()?;
        match args.format {
            InspectFormat::Json => println!("{}", serde_json::to_string(&report).expect("json")),
            InspectFormat::Table => {
                if i > 0 {
                    println!();
                }
                print!("{}", report.table());
            }
        }
    }
    Ok(())
}

/// Reads a multi-agent batch `what`, reports it row by row as a table or JSON lines.
fn inspect_batch<T: serde::de::DeserializeOwned, R: serde::Serialize>(
    args: &InspectArgs,
    value: serde_json::Value,
    what: &str,
    report: fn(&T) -> std::result::Result<Vec<R>, String>,
    table: fn(&[R]) -> String,
) -> Result<()> {
    let file = args.input.display().to_string();
    let batch: T =
        serde_json::from_value(value).map_err(|e| Error::config(file.clone(), format!("not {what}: {e}")))?;
    let rows = report(&batch).map_err(|e| Error::config(file, e))?;
    match args.format {
        InspectFormat::Json => {
            for r in &rows {
                println!("{}", serde_json::to_string(r).expect("json"));
            }
        }
        InspectFormat::Table => print!("{}", table(&rows)),
    }
    Ok(())
}
