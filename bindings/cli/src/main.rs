//! `keyfence`: the command line of the keyfence library.

mod demo;
mod policy_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "keyfence", version, about = "Keep private keys inside a policy")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with policies.
    #[command(subcommand)]
    Policy(policy_cmd::PolicyCmd),
    /// Run the end-to-end demonstration.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(cmd) => policy_cmd::run(cmd),
        Command::Demo => demo::run(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("keyfence: {e:#}");
            ExitCode::from(2)
        }
    }
}
