//! `keyfence`: the command line of the keyfence library.

// Direction, bottom to top (each module uses only those before it): exit,
// journal, files, key_process, offload_paths, offload_cmd, pki; abe_cmd, policy_cmd, wrap_cmd, where_svg, where_cmd (wrap_cmd hands it
// `authority inventory` and `authority where`, it opens stores as wrap_cmd does); then
// remote_cmd, agent_cmd, sign_cmd (which takes remote_cmd's options),
// provider_cmd, soak, demo, where_bench and bench_cmd; this file on top.

mod abe_cmd;
mod agent_cmd;
mod bench_cmd;
mod demo;
mod exit;
mod files;
mod fleet;
mod journal;
mod key_process;
mod offload_cmd;
mod offload_paths;
mod pkcs11_cmd;
mod pki;
mod policy_cmd;
mod provider_check;
mod provider_cmd;
mod remote_cmd;
mod sign_cmd;
mod soak;
mod where_bench;
mod where_cmd;
mod where_svg;
mod wrap_cmd;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Subcommand};

#[derive(clap::Parser)]
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
    /// The authority: master keys, policy keys, wrapping and rotation.
    #[command(subcommand)]
    Authority(wrap_cmd::AuthorityCmd),
    /// A machine: open envelopes, or check whether it could.
    #[command(subcommand)]
    Machine(wrap_cmd::MachineCmd),
    /// Sign a file through the asynchronous signing engine.
    Sign(sign_cmd::SignArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCmd),
    /// Run a key server: sign over mutual TLS with the keys this machine's
    /// attributes allow (docs/remote.md).
    Serve(remote_cmd::ServeArgs),
    /// Run the key agent: hold this machine's keys and sign for the local
    /// users it allows over a Unix socket (servers whose workers are not
    /// root; docs/deploy.md).
    Agent(agent_cmd::AgentArgs),
    /// Write a key file OpenSSL programs load through keyfence's OpenSSL
    /// provider (docs/openssl.md).
    ProviderKey(provider_cmd::ProviderKeyArgs),
    /// Print an openssl.cnf that loads keyfence's OpenSSL provider.
    ProviderConfig(provider_cmd::ProviderConfigArgs),
    /// Check that OpenSSL's configuration loads keyfence's provider and
    /// that running servers loaded it (a reload does not: docs/deploy.md).
    ProviderCheck(provider_check::ProviderCheckArgs),
    /// Keys in a PKCS#11 token: generate one, read its public key
    /// (docs/pkcs11.md).
    #[command(subcommand)]
    Pkcs11(pkcs11_cmd::Pkcs11Cmd),
    /// Offload devices: whether Intel's crypto_mb runs here
    /// (docs/offload.md).
    #[command(subcommand)]
    Offload(offload_cmd::OffloadCmd),
    /// Run the end-to-end demonstration.
    Demo,
}

/// The exit codes and file conventions under every command's help, since
/// a reader of `keyfence abe decrypt --help` may never see the top one.
fn with_conventions(c: clap::Command) -> clap::Command {
    c.after_help(exit::HELP).mut_subcommands(with_conventions)
}

fn main() -> ExitCode {
    // `keyfence key-process`: the key process that `sign
    // --isolated` and `bench sign` start, serving the socket on its
    // standard input. Not for people, so not in the help.
    if std::env::args_os().nth(1).is_some_and(|a| a == "key-process") {
        return keyfence::sign::key_process::key_process_main(std::env::args_os().skip(1));
    }
    // `--alg`'s help lists the library's algorithms, known only at run time.
    let command = with_conventions(Cli::command()).mut_subcommand("sign", |c| c.mut_arg("alg", |a| a.help(sign_cmd::alg_help())));
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Policy(cmd) => policy_cmd::run(cmd),
        Command::Abe(cmd) => abe_cmd::run(cmd),
        Command::Authority(cmd) => wrap_cmd::authority(cmd),
        Command::Machine(cmd) => wrap_cmd::machine(cmd),
        Command::Sign(args) => sign_cmd::sign(args),
        Command::Bench(cmd) => bench_cmd::run(cmd),
        Command::Serve(args) => remote_cmd::serve(args),
        Command::Agent(args) => agent_cmd::agent(args),
        Command::ProviderKey(args) => provider_cmd::provider_key(args),
        Command::ProviderConfig(args) => provider_cmd::provider_config(args),
        Command::ProviderCheck(args) => provider_check::provider_check(args),
        Command::Pkcs11(cmd) => pkcs11_cmd::run(cmd),
        Command::Offload(cmd) => offload_cmd::run(cmd),
        Command::Demo => demo::run(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let (code, print) = exit::classify(&e);
            if print {
                eprintln!("{}keyfence: {e:#}", journal::fatal_prefix());
            }
            ExitCode::from(code)
        }
    }
}
