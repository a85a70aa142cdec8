//! A client of a key agent, run by the agent's tests as another user
//! (`nobody`): not a test itself, a program (`cargo test` builds it).
//! It loads the envelope `KEYFENCE_PROBE_ENVELOPE` through the agent on
//! `KEYFENCE_PROBE_SOCKET`, signs with it, and prints `PROBE: SIGNED` or
//! `PROBE: FAILED <why>`.

use keyfence::sign::key_process::KeySource;
use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};

fn main() {
    let (Some(socket), Some(envelope)) = (std::env::var_os("KEYFENCE_PROBE_SOCKET"), std::env::var_os("KEYFENCE_PROBE_ENVELOPE")) else {
        eprintln!("usage: KEYFENCE_PROBE_SOCKET=... KEYFENCE_PROBE_ENVELOPE=... agent-client");
        std::process::exit(2);
    };
    let result = (|| -> Result<(), String> {
        let mut config = ManagedConfig::default();
        config.isolation = Isolation::Agent(socket.into());
        let engine = ManagedEngine::start(config).map_err(|e| e.to_string())?;
        let envelope = std::fs::read(&envelope).map_err(|e| e.to_string())?;
        let key = engine.load(KeySource::agent_envelope(envelope)).map_err(|e| e.to_string())?;
        let req = ManagedEngine::request(key, "ecdsa-p256-sha256", b"through the agent".to_vec(), None).map_err(|e| e.to_string())?;
        engine.submit(req).map_err(|e| e.to_string())?.wait().map_err(|e| e.to_string())?;
        Ok(())
    })();
    match result {
        Ok(()) => println!("PROBE: SIGNED"),
        Err(e) => println!("PROBE: FAILED {e}"),
    }
}
