//! `hacpo cluster …`: the runs whose policies live in several processes, as the NATS server
//! holds them.

use clap::{Args, Subcommand};
use hacpo::Result;
use hacpo::cluster::store::RunStatus;

use super::Format;

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The run's hosts: the process of each, its policies, the step it reached, its last heartbeat.
    Status(RunArgs),
    /// Delete a finished run's records, claims and weight snapshots from the server.
    Remove(RunArgs),
}

#[derive(Args, Debug)]
#[command(after_help = "Example:\n  hacpo cluster status --nats nats://127.0.0.1:4222 --run tiny-trio")]
pub struct RunArgs {
    /// The NATS server (cluster.nats of the run's config).
    #[arg(long, value_name = "URL")]
    pub nats: String,
    /// The run's name (cluster.run).
    #[arg(long)]
    pub run: String,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

pub fn run(args: ClusterArgs) -> Result<()> {
    match args.command {
        ClusterCommand::Status(a) => {
            let status = hacpo::cluster::store::status(&a.nats, &a.run)?;
            match a.format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&status).expect("status serialises")),
                Format::Text => print!("{}", table(&status)),
            }
            Ok(())
        }
        ClusterCommand::Remove(a) => {
            hacpo::cluster::store::remove(&a.nats, &a.run)?;
            eprintln!("removed run {} from {}", a.run, a.nats);
            Ok(())
        }
    }
}

/// One line per host: the config's hosts first (joined or not), then any other claim.
fn table(status: &RunStatus) -> String {
    let here = hacpo::cluster::machine_name();
    let mut out = format!("run {}: {} host(s)\n", status.run, status.hosts.len());
    out += &format!("{:<16} {:<28} {:<24} {:>6}  {}\n", "host", "policies", "process", "step", "state");
    let mut names: Vec<&String> = status.hosts.iter().collect();
    names.extend(status.claims.iter().map(|c| &c.host).filter(|h| !status.hosts.contains(h)));
    for host in names {
        match status.claims.iter().find(|c| &c.host == host) {
            Some(c) => {
                // On another machine, the heartbeat's age is by two clocks: a hint, not a verdict.
                let running = c.holds_here(status.read_ms, &here).unwrap_or(c.age_s(status.read_ms) <= 15.0);
                let state = if running {
                    format!("running, heartbeat {:.0} s ago", c.age_s(status.read_ms))
                } else {
                    format!("not running (last heard {:.0} s ago)", c.age_s(status.read_ms))
                };
                out += &format!("{host:<16} {:<28} {:<24} {:>6}  {state}\n", c.policies.join(","), c.process(), c.step);
            }
            None => out += &format!("{host:<16} {:<28} {:<24} {:>6}  not joined\n", "", "", ""),
        }
    }
    out
}
