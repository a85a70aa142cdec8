//! The key process of the command line: this very binary, started as
//! `keyfence key-process`, so the command line needs no other program.

use anyhow::{Context, Result};
use keyfence::sign::key_process::{KeyProcess, KeyProcessConfig};

/// A key process running this very binary (`keyfence key-process`), with
/// `threads` RSA and `threads` EC workers; `partial`: started even with
/// part of its sandbox missing (`--unsafe-partial-sandbox`), which it
/// otherwise refuses.
pub fn key_process(threads: usize, partial: bool) -> Result<KeyProcess> {
    Ok(KeyProcess::start(key_process_config(threads, partial)?)?)
}

/// The configuration [`key_process`] starts.
pub fn key_process_config(threads: usize, partial: bool) -> Result<KeyProcessConfig> {
    let exe = std::env::current_exe().context("finding the keyfence binary to start the key process")?;
    let mut config = KeyProcessConfig::with_command([exe.into_os_string(), "key-process".into()]);
    config.rsa_threads = threads;
    config.ec_threads = threads;
    config.unsafe_partial_sandbox |= partial;
    Ok(config)
}
