//! The `hacpo` command line. Parsing and user-facing errors live here and in `cli/`; all
//! work is done by library calls.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    hacpo::alloc::keep_freed_memory();
    let args = cli::Cli::parse();
    cli::init_logging(args.verbose);
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
