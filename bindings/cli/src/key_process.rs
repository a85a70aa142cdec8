//! The key process of the command line: this very binary, started as
//! `keyfence key-process`, so the command line needs no other program.

use anyhow::{Context, Result};
use keyfence::sign::key_process::{KeyProcessConfig, KeyProcess};

/// A key process running this very binary (`keyfence key-process`), with
/// `threads` RSA and `threads` EC workers.
pub fn key_process(threads: usize) -> Result<KeyProcess> {
    let exe = std::env::current_exe().context("finding the keyfence binary to start the key process")?;
    let mut config = KeyProcessConfig::with_command([exe.into_os_string(), "key-process".into()]);
    config.rsa_threads = threads;
    config.ec_threads = threads;
    Ok(KeyProcess::start(config)?)
}
