//! A client of a key agent that loads one token key, run as another user
//! (`nobody`) by pkcs11.rs's `an_agent_grants_token_keys_per_user_or_group`:
//! not a test itself, a program (`cargo build -p keyfence --example
//! token-grant-probe`; `cargo test` builds it).
//!
//! It loads `KEYFENCE_PROBE_URI` through the agent on
//! `KEYFENCE_PROBE_SOCKET` and prints `PROBE: LOADED`, or
//! `PROBE: REFUSED <the error>`.

use keyfence::sign::key_process::KeySource;
use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};

fn main() {
    let socket = std::env::var_os("KEYFENCE_PROBE_SOCKET").expect("KEYFENCE_PROBE_SOCKET");
    let uri = std::env::var("KEYFENCE_PROBE_URI").expect("KEYFENCE_PROBE_URI");
    let mut config = ManagedConfig::default();
    config.isolation = Isolation::Agent(socket.into());
    let loaded = ManagedEngine::start(config)
        .map_err(|e| e.to_string())
        .and_then(|e| e.load(KeySource::Pkcs11(uri)).map(|_| ()).map_err(|e| e.to_string()));
    match loaded {
        Ok(()) => println!("PROBE: LOADED"),
        Err(e) => println!("PROBE: REFUSED {e}"),
    }
}
