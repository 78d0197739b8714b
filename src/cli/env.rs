//! `hacpo env …`: the planning environments of the turn-wise workloads (`src/env/`): print
//! generated instances with a solution, or play one in the terminal.

use std::io::{BufRead, Write};

use clap::{Args, Subcommand, ValueEnum};
use hacpo::env::{EnvKind, Instance, Split};
use hacpo::{Error, Result};
use serde_json::json;

#[derive(Args, Debug)]
pub struct EnvArgs {
    #[command(subcommand)]
    pub command: EnvCommand,
}

#[derive(Subcommand, Debug)]
pub enum EnvCommand {
    /// Print generated instances with a solution (BFS-optimal moves, the Sokoban solver's
    /// moves, the Sudoku's unique solution as fill steps).
    Sample(SampleArgs),
    /// Play an instance in the terminal: type moves, see the state and the rewards.
    Play(PlayArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    hacpo env sample --env plan-path --n 5\n  \
    hacpo env sample --env sudoku --n 100 --split held-out --format json > sudoku-heldout.jsonl\n\n\
    Instance i of a split is the same on every machine; train and held-out instances never\n\
    coincide. JSON lines carry the instance's state, its rendering, a solution and the optimal\n\
    length (moves; empty cells for a Sudoku).")]
pub struct SampleArgs {
    /// plan-path, sokoban or sudoku.
    #[arg(long = "env")]
    pub env: String,
    /// How many instances.
    #[arg(long, default_value_t = 5)]
    pub n: u64,
    /// Index of the first instance.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// train or held-out.
    #[arg(long, default_value = "train")]
    pub split: String,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Args, Debug)]
#[command(after_help = "Type moves as letters (U R R D) or as the models write them ([\"U\", \"R\"]);\n\
    a Sudoku takes `row column digit` (0-based row and column) or a list of fills or the full grid.\n\
    `hint` prints a solution from where you are, `q` quits. Reads standard input, so\n\
    `echo 'R R D' | hacpo env play --env plan-path` works too.")]
pub struct PlayArgs {
    /// plan-path, sokoban or sudoku.
    #[arg(long = "env")]
    pub env: String,
    /// Which instance.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// train or held-out.
    #[arg(long, default_value = "train")]
    pub split: String,
}

pub fn run(args: EnvArgs) -> Result<()> {
    match args.command {
        EnvCommand::Sample(a) => sample(a),
        EnvCommand::Play(a) => play(a),
    }
}

fn sample(args: SampleArgs) -> Result<()> {
    let kind = EnvKind::parse(&args.env)?;
    let split = Split::parse(&args.split)?;
    if args.n == 0 {
        return Err(Error::InvalidArgument("--n 0 prints nothing; give --n 1 or more".into()));
    }
    let Some(end) = args.seed.checked_add(args.n) else {
        return Err(Error::InvalidArgument(format!("--seed {} + --n {} overflows", args.seed, args.n)));
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for index in args.seed..end {
        let inst = Instance::generate(kind, split, index);
        let solution = inst.solution().unwrap_or_default();
        let line = match args.format {
            Format::Json => json!({
                "env": kind.name(),
                "split": args.split,
                "index": index,
                "render": inst.render(),
                "solution": solution,
                "optimal_length": inst.optimal_length(),
                "state": inst,
            })
            .to_string(),
            Format::Text => format!(
                "{kind} {} #{index} (optimal: {})\n{}\nsolution: #### {solution}\n",
                args.split,
                inst.optimal_length(),
                inst.render()
            ),
        };
        // A closed pipe (`| head`) ends the listing quietly.
        if writeln!(out, "{line}").is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// A line typed by a person as the answer text the environment reads.
fn typed_answer(kind: EnvKind, line: &str) -> String {
    if line.contains('[') {
        return line.to_string();
    }
    let words: Vec<&str> = line.split(|c: char| c.is_whitespace() || c == ',').filter(|w| !w.is_empty()).collect();
    match kind {
        EnvKind::Sudoku => format!("[[{}]]", words.join(", ")),
        // `URRD` as well as `U R R D`.
        EnvKind::PlanPath | EnvKind::Sokoban
            if words.len() == 1 && words[0].chars().all(|c| "UDLRudlr".contains(c)) =>
        {
            let letters: Vec<String> = words[0].chars().map(String::from).collect();
            format!("[{}]", letters.join(", "))
        }
        EnvKind::PlanPath | EnvKind::Sokoban => format!("[{}]", words.join(", ")),
    }
}

fn play(args: PlayArgs) -> Result<()> {
    let kind = EnvKind::parse(&args.env)?;
    let split = Split::parse(&args.split)?;
    let mut inst = Instance::generate(kind, split, args.seed);
    let optimal = inst.optimal_length();
    let (mut answers, mut total) = (0usize, 0.0);
    println!("{kind} {} #{} (optimal: {optimal})\n{}", args.split, args.seed, inst.render());
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        print!("> ");
        std::io::stdout().flush().ok();
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| Error::InvalidArgument(format!("cannot read standard input: {e}")))?;
        let line = line.trim();
        match line {
            "" => continue,
            "q" | "quit" | "exit" => break,
            "hint" => {
                match inst.solution() {
                    Some(s) => println!("a solution from here: {s}"),
                    None => println!("no solution from here: the box is stuck"),
                }
                continue;
            }
            _ => {}
        }
        let outcome = inst.apply(&typed_answer(kind, line));
        answers += 1;
        total += outcome.reward;
        println!("{}\n{}", inst.describe(&outcome), inst.render());
        if outcome.done {
            break;
        }
    }
    let verdict = if inst.solved() { "solved" } else { "not solved" };
    println!("{verdict} after {answers} answers; total reward {total:.2}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_moves_become_the_models_list_format() {
        assert_eq!(typed_answer(EnvKind::PlanPath, "U R r"), "[U, R, r]");
        assert_eq!(typed_answer(EnvKind::Sokoban, "URRD"), "[U, R, R, D]");
        assert_eq!(typed_answer(EnvKind::Sokoban, "up, left"), "[up, left]");
        assert_eq!(typed_answer(EnvKind::Sudoku, "0 1 3"), "[[0, 1, 3]]");
        assert_eq!(typed_answer(EnvKind::Sudoku, "[[0,1,3]]"), "[[0,1,3]]");
    }
}
