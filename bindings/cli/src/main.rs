//! `keyfence`: the command line of the keyfence library.

mod abe_cmd;
mod bench_cmd;
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
    /// CP-ABE: setup, keygen, encrypt, decrypt, inspect (CIRCL's formats).
    #[command(subcommand)]
    Abe(abe_cmd::AbeCmd),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCmd),
    /// Run the end-to-end demonstration.
    Demo,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy(cmd) => policy_cmd::run(cmd),
        Command::Abe(cmd) => abe_cmd::run(cmd),
        Command::Bench(cmd) => bench_cmd::run(cmd),
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
