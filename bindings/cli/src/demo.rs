//! `keyfence demo`: the Geo Key Manager story end to end, on real code and
//! the embedded file store.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::policy::{parse, Attributes};
use keyfence::sign::key_process::KeySource;
use keyfence::sign::{Algorithm, Engine, EngineConfig, PrivateKey};
use keyfence::wrap::{nearest_capable, Authority, CacheConfig, Envelope, FileStore, Machine, Peer, Store};
use rand_core::{OsRng, RngCore};

use crate::files::outln;

/// Data centers: name, attributes, round-trip time from a client in Paris.
const FLEET: &[(&str, &str, u64)] = &[
    ("fra1", "country=DE,region=EU", 9),
    ("cdg1", "country=FR,region=EU", 2),
    ("ams1", "country=NL,region=EU", 8),
    ("lhr1", "country=GB,region=UK", 6),
    ("iad1", "country=US,region=NA", 80),
    ("nrt1", "country=JP,region=APAC", 220),
    // No region attribute: `not region: EU` does not hold for it.
    ("sin1", "country=SG", 160),
];

/// Customers and the policy each chose; two share `region: EU`.
const CUSTOMERS: &[(&str, &str)] = &[
    ("acme", "region: EU"),
    ("globex", "(region: EU)"),
    ("initech", "country: US or (not region: EU)"),
    ("umbrella", "(region: EU or region: UK) and not country: FR"),
];

/// A real Ed25519 private key in PKCS#8 PEM, from a fresh random seed.
fn ed25519_pem() -> String {
    const PKCS8_ED25519_PREFIX: [u8; 16] = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    let mut der = PKCS8_ED25519_PREFIX.to_vec();
    let mut seed = [0u8; 32];
    OsRng.fill_bytes(&mut seed);
    der.extend_from_slice(&seed);
    format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", base64(&der))
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

pub fn run() -> anyhow::Result<ExitCode> {
    let dir = crate::files::scratch_dir("demo")?;
    story(dir.path())
}

fn story(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    outln!("keyfence demo: customer keys that only some data centers may use\n");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(dir)?);
    let t = Instant::now();
    let mut authority = Authority::init(store.clone())?;
    outln!("authority   master generation 1 (CP-ABE, CIRCL-compatible) in {}", ms(t.elapsed()));

    let mut machines = Vec::new();
    let mut peers = Vec::new();
    for (dc, a, rtt) in FLEET {
        let attrs: Attributes = a.parse()?;
        let key = authority.issue(&attrs)?;
        machines.push((*dc, Machine::new(key, store.clone(), CacheConfig::default())));
        peers.push(Peer { name: (*dc).into(), attributes: attrs, latency: Duration::from_millis(*rtt) });
    }
    outln!(
        "fleet       {} data centers issued keys: {}",
        FLEET.len(),
        FLEET.iter().map(|f| format!("{} {{{}}}", f.0, f.1)).collect::<Vec<_>>().join(", ")
    );

    outln!("\ncustomers   wrapping a fresh Ed25519 private key (PKCS#8 PEM) each:");
    let mut wrapped: Vec<(&str, String, Envelope)> = Vec::new();
    for (name, policy) in CUSTOMERS {
        let pem = ed25519_pem();
        let t = Instant::now();
        let env = authority.wrap(policy, pem.as_bytes())?;
        outln!(
            "  {name:<9} `{}`  policy key {}… v{}  ({}, {} byte envelope)",
            env.policy,
            &env.policy_id.iter().take(4).map(|b| format!("{b:02x}")).collect::<String>(),
            env.key_version,
            ms(t.elapsed()),
            env.to_bytes().len()
        );
        wrapped.push((name, pem, env));
    }
    let st = authority.status()?;
    outln!("  {} envelopes under {} policy keys: acme and globex share one (same canonical policy)", st.envelopes, st.policies);

    outln!("\nwho can open what (otherwise: the nearest data center that can, by round-trip time from Paris)");
    print!("  {:<9}", "");
    for (dc, _, _) in FLEET {
        print!(" {dc:<11}");
    }
    outln!();
    let (mut miss_total, mut misses, mut hit_total, mut hits) = (Duration::ZERO, 0u32, Duration::ZERO, 0u32);
    for (name, pem, env) in &wrapped {
        print!("  {name:<9}");
        for (dc, m) in &machines {
            if m.could_open(env) {
                let t = Instant::now();
                let secret = m.open(env.to_bytes())?;
                let first = t.elapsed();
                anyhow::ensure!(secret[..] == *pem.as_bytes(), "{dc} opened {name}'s envelope to the wrong bytes");
                let t = Instant::now();
                m.open(env.to_bytes())?;
                let again = t.elapsed();
                if m.cache_stats().misses > 0 && first > again {
                    miss_total += first;
                    misses += 1;
                }
                hit_total += again;
                hits += 1;
                print!(" {:<11}", "opens");
            } else {
                let to = nearest_capable(env, &peers).map_or("nobody".to_owned(), |p| format!("-> {}", p.name));
                print!(" {to:<11}");
            }
        }
        outln!();
    }
    outln!(
        "  opening: first use of a policy key {} on average (CP-ABE + HPKE), then {} from the cache (HPKE only)",
        ms(miss_total / misses.max(1)),
        us(hit_total / hits.max(1))
    );

    outln!("\nsigning a handshake with an opened key (it never touches disk)");
    let engine = Engine::new(EngineConfig::default())?;
    let (dc, fra1) = &machines[0];
    let pem = fra1.open(wrapped[0].2.to_bytes())?;
    let key = Arc::new(PrivateKey::from_pem(&pem)?);
    let t = Instant::now();
    let signature = engine.sign(&key, Algorithm::Ed25519, b"TLS 1.3, server CertificateVerify")?.wait()?;
    let took = t.elapsed();
    let m = engine.metrics();
    let ec = m.class(keyfence::sign::OpClass::Ec);
    outln!(
        "  {dc} opened acme's envelope and signed through the asynchronous engine: {}-byte Ed25519 signature in {} (EC executor: {} completed, {} errors)",
        signature.len(),
        us(took),
        ec.completed,
        ec.errors.total()
    );

    outln!("\nsigning in a key process (the key never enters the server's memory)");
    // The machine's key and the envelope are files the key process reads;
    // it opens the envelope itself, so the secret exists only there.
    let machine_key = dir.join(format!("{dc}.machine-key"));
    crate::files::create_new(&machine_key, &authority.issue(&FLEET[0].1.parse()?)?.to_bytes()[..])?;
    let envelope = dir.join("acme.envelope");
    crate::files::create_new(&envelope, wrapped[0].2.to_bytes())?;
    let t = Instant::now();
    let keys = crate::key_process::key_process(1, false)?;
    let held = keys.load(KeySource::envelope(std::fs::read(&envelope)?, dir, machine_key))?;
    let loaded = t.elapsed();
    anyhow::ensure!(!held.is_local(), "the key process's key is in this process");
    anyhow::ensure!(held.public_key_der()? == key.public_key_der()?, "the key process opened a different key");
    let t = Instant::now();
    let signature = engine.sign(&held, Algorithm::Ed25519, b"TLS 1.3, server CertificateVerify")?.wait()?;
    let took = t.elapsed();
    outln!(
        "  {dc}'s key process (pid {}) opened acme's envelope itself in {}; this process holds only a handle",
        keys.pid().unwrap_or_default(),
        ms(loaded)
    );
    outln!("  and signed through it: {}-byte Ed25519 signature in {}, the same public key as above", signature.len(), us(took));
    drop((held, keys));

    outln!("\nmaster key rotation");
    let before: Vec<Vec<u8>> =
        store.list("envelopes/")?.iter().map(|k| store.get(k).map(|v| v.unwrap_or_default())).collect::<Result<_, _>>()?;
    let t = Instant::now();
    let r = authority.rotate_master()?;
    let after: Vec<Vec<u8>> =
        store.list("envelopes/")?.iter().map(|k| store.get(k).map(|v| v.unwrap_or_default())).collect::<Result<_, _>>()?;
    outln!(
        "  generation {} active, generation 1 decrypt-only; re-sealed {} policy keys in {}; customer envelopes {}",
        r.new_generation,
        r.resealed,
        ms(t.elapsed()),
        if before == after { "untouched (byte-identical)" } else { "CHANGED" }
    );
    anyhow::ensure!(before == after, "rotation changed customer envelopes");
    let (dc, old_machine) = &machines[0];
    old_machine.clear_cache();
    let acme = &wrapped[0].2;
    old_machine.open(acme.to_bytes())?;
    let fresh = Machine::new(authority.issue(&FLEET[0].1.parse()?)?, store.clone(), CacheConfig::default());
    fresh.open(acme.to_bytes())?;
    outln!("  {dc} opens acme's key with its generation-1 key (decrypt-only) and with a newly issued generation-2 key");

    let bad = "country: US) and region: EU";
    outln!("\na malformed policy is refused with its position (CIRCL would read it as `country: US`):");
    match parse(bad) {
        Ok(_) => anyhow::bail!("malformed policy {bad:?} was accepted"),
        Err(e) => outln!("{}\n", e.render(bad)),
    }
    Ok(ExitCode::SUCCESS)
}
