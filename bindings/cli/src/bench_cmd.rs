//! `keyfence bench ...`: the performance figures the issues set targets for.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Subcommand;
use keyfence::abe;
use keyfence::policy::{parse, Attributes};

use crate::files::outln;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// CP-ABE on CIRCL's benchmark shapes: median keygen, encrypt and
    /// decrypt times and the ciphertext overhead.
    Abe {
        /// One JSON object per line: case, keygen_ms, encrypt_ms,
        /// decrypt_ms, decrypt_cold_ms, the same three operations on two
        /// threads (keygen_ms_2threads, encrypt_ms_2threads,
        /// decrypt_ms_2threads: `*_with_threads(.., 2)`, alternated with
        /// the one-thread runs in the same iterations), decrypt_floor_ms
        /// (the primitives decryption cannot skip, timed in the same run:
        /// `keyfence::bench::decrypt_floor`), decrypt_floor_pairing_ms (its
        /// pairing part alone), ct_overhead.
        #[arg(long)]
        json: bool,
        /// Iterations per operation.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Threads for the keygen_ms, encrypt_ms, decrypt_ms and
        /// decrypt_cold_ms columns (default 1, the library's default).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Signing: the engine against AWS-LC called directly, per algorithm
    /// (operations per second with every core busy, p50/p99 latency).
    Sign(crate::sign_cmd::BenchSignArgs),
    /// Remote signing: ECDSA P-256 and RSA-2048 signatures per core through
    /// a key server on loopback (TLS and framing included) against the
    /// in-process engine, and the latency the hop adds.
    Remote(crate::remote_cmd::BenchRemoteArgs),
    /// Wrapping: a machine opening an envelope whose policy key it has
    /// cached (the common case on a busy server), median microseconds; the
    /// baseline the language bindings are compared with.
    Wrap {
        /// One JSON object: op, iters, median_us.
        #[arg(long)]
        json: bool,
        /// Iterations.
        #[arg(long, default_value_t = 2000)]
        iters: usize,
    },
    /// A store against the file store, in the same run: wraps per second
    /// (each one commit), envelope fetches with a cached open per second,
    /// the bytes stored per envelope, and how long one master rotation
    /// takes to reach `--watchers` machines following the store (p50, p99,
    /// max: from the commit time signed into the generation list to each
    /// machine having verified it). Works in a fresh sub-store of
    /// `--store` (for etcd, `PREFIX/bench-...`, deleted afterwards).
    Store {
        /// The store to measure: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: String,
        /// One JSON object per line: store, op, ops, per_s (or bytes).
        #[arg(long)]
        json: bool,
        /// Wraps (and then fetches) per store.
        #[arg(long, default_value_t = 300)]
        ops: usize,
        /// Machines following the store for the propagation figure (0: not
        /// measured).
        #[arg(long, default_value_t = 500)]
        watchers: usize,
    },
    /// A fleet of data centers simulated at size, with its real
    /// cryptography: issuing, wrapping, a master rotation, a policy-key
    /// rotation and a revocation with their propagation to one following
    /// cache per data center, storage against per-data-center wrapping,
    /// one data center's share (docs/benchmarks.md, "A fleet").
    Fleet(crate::fleet::FleetArgs),
    /// Where a key can be used, at the seeds' size: 500 data centers x 50
    /// machines imported into a fresh store, then `where` for an EU-only
    /// policy grouped by data center with every one's traffic, near by
    /// region and by latencies; import and where times, median of --runs
    /// (docs/benchmarks.md, "Where a key can be used").
    Where(crate::where_bench::WhereBenchArgs),
    /// Load and faults for a bounded time: signing through the engine and
    /// a key process killed every few seconds, wrap and open on
    /// one store; prints one JSON object (operations, failures by kind,
    /// lost keys and envelopes, peak memory, late calls) and exits 3 if
    /// anything was lost or late (docs/reliability.md).
    Soak(crate::soak::SoakArgs),
    /// A PKCS#11 token key: signatures per CPU-second through the engine
    /// against the same token called directly, alternated in one run
    /// (docs/benchmarks.md, "Token keys").
    Pkcs11(crate::pkcs11_cmd::BenchPkcs11Args),
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(cmd: BenchCmd) -> Result<ExitCode> {
    match cmd {
        BenchCmd::Sign(args) => return crate::sign_cmd::bench(args),
        BenchCmd::Remote(args) => return crate::remote_cmd::bench(args),
        BenchCmd::Wrap { json, iters } => bench_wrap(json, iters)?,
        BenchCmd::Store { store, json, ops, watchers } => bench_store(&store, json, ops, watchers)?,
        BenchCmd::Soak(args) => return crate::soak::soak(args),
        BenchCmd::Pkcs11(args) => return crate::pkcs11_cmd::bench(args),
        BenchCmd::Fleet(args) => crate::fleet::run(args)?,
        BenchCmd::Where(args) => crate::where_bench::run(args)?,
        BenchCmd::Abe { json, iters, threads } => bench_abe(json, iters, threads.unwrap_or(1))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `keyfence bench abe`: every operation on one thread (or `threads`) and
/// on two, alternated within each iteration (which goes first swaps from
/// one iteration to the next), so that both see the same machine.
fn bench_abe(json: bool, iters: usize, threads: usize) -> Result<()> {
    let msg = b"a 23-byte test message!";
    let (pk, msk) = abe::setup()?;
    if !json {
        outln!(
            "{:<12} {:>10} {:>10} {:>11} {:>11} {:>11} {:>11} {:>10} {:>10} {:>12}",
            "case",
            "keygen_ms",
            "keygen_2t",
            "encrypt_ms",
            "encrypt_2t",
            "decrypt_ms",
            "decrypt_2t",
            "cold_ms",
            "floor_ms",
            "ct_overhead"
        );
    }
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    for (name, policy, attrs) in keyfence::bench::abe_cases() {
        let p = parse(&policy)?;
        // [variant][sample]: variant 0 on `threads` threads, 1 on two.
        let (mut kg, mut en, mut de) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        let (mut fl, mut fp, mut cold) = (Vec::new(), Vec::new(), Vec::new());
        let mut overhead = 0;
        // Decryption runs with a key loaded once, as a machine holds its
        // key: the key's precomputation (done when it is decoded) is not
        // paid per decryption. Each variant has its own copy, decrypting
        // once an iteration, so that both reach the decryption at which a
        // key builds its Boneh-Katz tables (the 16th) in the same
        // iteration, as the one-thread figure always has.
        let key_bytes = zeroize::Zeroizing::new(abe::keygen(&msk, &attrs)?.to_bytes());
        let loaded = [abe::AttributeKey::from_bytes(&key_bytes)?, abe::AttributeKey::from_bytes(&key_bytes)?];
        for i in 0..iters.max(1) {
            let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
            let on = |v: usize| [threads, 2][v];
            for v in order {
                let start = Instant::now();
                let key = abe::keygen_with_threads(&msk, &attrs, on(v))?;
                kg[v].push(ms(start));
                drop(key);
            }
            let mut cts = [Vec::new(), Vec::new()];
            for v in order {
                let start = Instant::now();
                cts[v] = abe::encrypt_policy_with_threads(&pk, &p, msg, on(v))?;
                en[v].push(ms(start));
            }
            // Each variant decrypts the other's ciphertext.
            for v in order {
                let start = Instant::now();
                let pt = abe::decrypt_with_threads(&loaded[v], &cts[1 - v], on(v))?;
                de[v].push(ms(start));
                anyhow::ensure!(pt[..] == msg[..], "{name}: wrong plaintext on {} threads", on(v));
            }
            let ct = &cts[0];
            // From a cold key, as a process that loads a key to decrypt
            // once pays: decoding and precomputation too.
            let start = Instant::now();
            let fresh = abe::AttributeKey::from_bytes(&key_bytes)?;
            let pt = abe::decrypt_with_threads(&fresh, ct, threads)?;
            cold.push(ms(start));
            anyhow::ensure!(pt[..] == msg[..], "{name}: wrong plaintext from a cold key");
            drop(fresh);
            // The bound, timed right after, in the same conditions.
            let floor = keyfence::bench::decrypt_floor(&loaded[0], ct)?;
            fl.push(floor.total().as_secs_f64() * 1e3);
            fp.push(floor.pairing.as_secs_f64() * 1e3);
            overhead = ct.len() - msg.len();
        }
        let (floor, floor_pairing, cold) = (median_ms(fl), median_ms(fp), median_ms(cold));
        let [kg, kg2] = kg.map(median_ms);
        let [en, en2] = en.map(median_ms);
        let [de, de2] = de.map(median_ms);
        if json {
            outln!(
                "{}",
                serde_json::json!({
                    "case": name, "keygen_ms": kg, "encrypt_ms": en, "decrypt_ms": de, "decrypt_cold_ms": cold,
                    "keygen_ms_2threads": kg2, "encrypt_ms_2threads": en2, "decrypt_ms_2threads": de2,
                    "decrypt_floor_ms": floor, "decrypt_floor_pairing_ms": floor_pairing, "ct_overhead": overhead,
                })
            );
        } else {
            outln!(
                "{name:<12} {kg:>10.3} {kg2:>10.3} {en:>11.3} {en2:>11.3} {de:>11.3} {de2:>11.3} {cold:>10.3} {floor:>10.3} {overhead:>12}"
            );
        }
    }
    Ok(())
}

/// The cached `Machine::open` a binding is measured against: a file store
/// in a temporary directory, one envelope, a machine that has opened it once.
fn bench_wrap(json: bool, iters: usize) -> Result<()> {
    use keyfence::wrap::{Authority, CacheConfig, FileStore, Machine};
    use std::sync::Arc;

    let dir = crate::files::scratch_dir("bench-wrap")?;
    let result = (|| -> Result<f64> {
        let store: Arc<FileStore> = Arc::new(FileStore::open(dir.path())?);
        let mut auth = Authority::init(store.clone())?;
        let env = auth.wrap("region: EU", &[7u8; 32])?.to_bytes().to_vec();
        let machine = Machine::new(auth.issue(&Attributes::from_pairs([("region", "EU")]))?, store, CacheConfig::default());
        machine.open(&env)?;
        let mut us = Vec::with_capacity(iters.max(1));
        for _ in 0..iters.max(1) {
            let t = Instant::now();
            let s = machine.open(&env)?;
            us.push(t.elapsed().as_secs_f64() * 1e6);
            anyhow::ensure!(s.len() == 32, "wrong secret");
        }
        Ok(median_ms(us))
    })();
    drop(dir);
    let median_us = result?;
    if json {
        outln!("{}", serde_json::json!({"op": "machine_open_cached", "iters": iters, "median_us": median_us}));
    } else {
        outln!("machine_open_cached  median {median_us:.2} us over {iters} iterations");
    }
    Ok(())
}

/// Wraps, fetches and sizes on one store (see `BenchCmd::Store`).
fn measure_store(kind: &str, store: std::sync::Arc<dyn keyfence::wrap::Store>, json: bool, ops: usize, watchers: usize) -> Result<()> {
    use keyfence::wrap::{Authority, CacheConfig, Machine};
    let mut auth = Authority::init(store.clone())?;
    let secret = [7u8; 1024];
    auth.wrap("region: EU", &secret)?;
    let ops = ops.max(1);
    let t = Instant::now();
    let mut ids = Vec::with_capacity(ops);
    for _ in 0..ops {
        ids.push(auth.wrap("region: EU", &secret)?.secret_id);
    }
    let wrap_s = ops as f64 / t.elapsed().as_secs_f64();
    let machine = Machine::new(auth.issue(&Attributes::from_pairs([("region", "EU")]))?, store.clone(), CacheConfig::default());
    let names: Vec<String> =
        ids.iter().map(|id| format!("envelopes/{}", id.iter().map(|b| format!("{b:02x}")).collect::<String>())).collect();
    machine.open(&store.get(&names[0])?.ok_or_else(|| anyhow::anyhow!("envelope missing"))?)?;
    let t = Instant::now();
    let mut bytes = 0;
    for n in &names {
        let env = store.get(n)?.ok_or_else(|| anyhow::anyhow!("envelope {n} missing"))?;
        bytes += env.len() + n.len();
        anyhow::ensure!(machine.open(&env)?.len() == secret.len(), "wrong secret");
    }
    let open_s = ops as f64 / t.elapsed().as_secs_f64();
    let per_envelope = bytes / ops;
    if json {
        outln!("{}", serde_json::json!({"store": kind, "op": "wrap", "ops": ops, "per_s": wrap_s}));
        outln!("{}", serde_json::json!({"store": kind, "op": "fetch_open_cached", "ops": ops, "per_s": open_s}));
        outln!("{}", serde_json::json!({"store": kind, "op": "bytes_per_envelope", "secret_bytes": secret.len(), "bytes": per_envelope}));
    } else {
        outln!("{kind:<6} wrap {wrap_s:>9.1}/s   fetch+open (cached) {open_s:>9.1}/s   {per_envelope} bytes per envelope (1 KiB secret)");
    }
    if watchers > 0 {
        let (p50, p99, max) = propagation(&mut auth, &machine, &store, watchers)?;
        if json {
            outln!(
                "{}",
                serde_json::json!({"store": kind, "op": "watch_propagation", "watchers": watchers, "p50_ms": p50, "p99_ms": p99, "max_ms": max})
            );
        } else {
            outln!("{kind:<6} one rotation reaches {watchers} following machines: p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms");
        }
    }
    Ok(())
}

/// Starts `n` machines (with `machine`'s key) following `store`, rotates
/// the master key once, waits (up to 120 s) until every one has verified
/// the new generation list, and returns the p50, p99 and max of their
/// propagation delays, in milliseconds.
fn propagation(
    auth: &mut keyfence::wrap::Authority, machine: &keyfence::wrap::Machine, store: &std::sync::Arc<dyn keyfence::wrap::Store>, n: usize,
) -> Result<(f64, f64, f64)> {
    use keyfence::wrap::{CacheConfig, Machine};
    use std::sync::Arc;
    let key = auth.issue(machine.attributes())?;
    let machines: Vec<Arc<Machine>> = (0..n).map(|_| Arc::new(Machine::new(key.clone(), store.clone(), CacheConfig::default()))).collect();
    let followers = machines.iter().map(|m| m.follow()).collect::<Result<Vec<_>, _>>()?;
    // Every watch connected (an etcd watch starts from the revision of its
    // call, but its stream connects afterwards) before the change.
    std::thread::sleep(Duration::from_secs(2));
    auth.rotate_master()?;
    let start = Instant::now();
    while machines.iter().any(|m| m.cache_stats().propagations == 0) {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(120), "the rotation did not reach every machine in 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut ms: Vec<f64> = machines.iter().map(|m| m.cache_stats().propagation_last.as_secs_f64() * 1e3).collect();
    drop(followers);
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok((at(0.5), at(0.99), ms[ms.len() - 1]))
}

fn bench_store(name: &str, json: bool, ops: usize, watchers: usize) -> Result<()> {
    use keyfence::wrap::{create_store, Batch, FileStore, Op};
    let dir = crate::files::scratch_dir("bench-store")?;
    measure_store("file", std::sync::Arc::new(FileStore::open(dir.path())?), json, ops, watchers)?;
    drop(dir);
    if !name.starts_with("etcd://") {
        let sub = crate::files::scratch_store(name);
        let result = measure_store("dir", create_store(&sub)?, json, ops, watchers);
        let _ = std::fs::remove_dir_all(&sub);
        return result;
    }
    let store = create_store(&crate::files::scratch_store(name))?;
    let result = measure_store("etcd", store.clone(), json, ops, watchers);
    // Leave nothing behind: the sub-store's objects, in commits of 100.
    for prefix in ["authority/", "public/", "sealed/", "envelopes/"] {
        for chunk in store.list(prefix)?.chunks(100) {
            store.commit(&Batch { expect: vec![], ops: chunk.iter().map(|k| Op::Delete(k.clone())).collect() })?;
        }
    }
    result
}
