//! `keyfence bench fleet`: a fleet of data centers simulated on one
//! machine, every operation with its real cryptography: issuing the
//! machine keys (CP-ABE keygen, on every core), wrapping customer keys
//! under Geo Key Manager-like policies, a master rotation, a policy-key
//! rotation and a revocation with their propagation to one following
//! cache per data center, the bytes stored against wrapping every key for
//! every data center separately, and one data center's share.
//!
//! What is scaled (docs/benchmarks.md, "A fleet"): the number of data
//! centers, machines per data center and envelopes, never the work per
//! item. One cache per data center stands for the data center (its
//! machines share it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Args;
use keyfence::policy::Attributes;
use keyfence::wrap::{create_store, Authority, Batch, CacheConfig, Envelope, FileStore, Machine, MachineKey, Op, Store};

use crate::files::outln;

/// `keyfence bench fleet` options.
#[derive(Args)]
pub struct FleetArgs {
    /// JSON lines, one per phase, whose keys name what they measure.
    #[arg(long)]
    json: bool,
    /// A small fleet (10 data centers x 5 machines, 1,000 envelopes) that
    /// runs in well under a minute.
    #[arg(long)]
    quick: bool,
    /// Data centers (one following cache each).
    #[arg(long, default_value_t = 500)]
    dcs: usize,
    /// Machines per data center (each issued its own key).
    #[arg(long, default_value_t = 50)]
    machines: usize,
    /// Customer keys wrapped, spread over the 20 policies.
    #[arg(long, default_value_t = 100_000)]
    envelopes: usize,
    /// The store: a fresh directory (default) or etcd://HOST:PORT[,...]/PREFIX
    /// (a sub-store `PREFIX/bench-...`, deleted afterwards).
    #[arg(long)]
    store: Option<String>,
}

const REGIONS: [(&str, [&str; 4]); 5] = [
    ("EU", ["DE", "FR", "NL", "PL"]),
    ("NA", ["US", "CA", "MX", "US"]),
    ("APAC", ["JP", "SG", "AU", "CN"]),
    ("LATAM", ["BR", "AR", "CL", "CO"]),
    ("AF", ["ZA", "NG", "KE", "EG"]),
];

/// Policies of the kind Geo Key Manager customers write: regions,
/// countries with negation, compliance tags.
const POLICIES: [&str; 20] = [
    "region: EU",
    "region: NA",
    "region: APAC",
    "region: EU or region: NA",
    "country: DE",
    "country: US",
    "country: JP",
    "region: EU and not country: FR",
    "region: NA and not country: CA",
    "region: APAC and not country: CN",
    "pci: yes",
    "region: EU and pci: yes",
    "region: NA and fips: yes",
    "(region: EU or region: NA) and tier: gold",
    "not country: CN and not country: RU",
    "country: DE or country: FR or country: NL",
    "tier: gold",
    "fips: yes and not region: APAC",
    "region: LATAM or region: AF",
    "region: EU and tier: gold and pci: yes",
];

/// Data center `d`'s attributes shared by its machines.
fn dc_attrs(d: usize) -> Vec<(String, String)> {
    let (region, countries) = REGIONS[d % REGIONS.len()];
    let country = countries[(d / REGIONS.len()) % countries.len()];
    let tier = if d.is_multiple_of(3) { "gold" } else { "silver" };
    vec![
        ("region".into(), region.into()),
        ("country".into(), country.into()),
        ("dc".into(), format!("dc{d}")),
        ("tier".into(), tier.into()),
    ]
}

/// Machine `m` of data center `d`: the data center's attributes and its
/// compliance tags (the authority adds the machine id).
fn machine_attrs(d: usize, m: usize) -> Attributes {
    let mut a = dc_attrs(d);
    a.push(("pci".into(), if (d + m).is_multiple_of(2) { "yes" } else { "no" }.into()));
    a.push(("fips".into(), if (d + m).is_multiple_of(3) { "yes" } else { "no" }.into()));
    Attributes::from_pairs(a)
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Waits (up to 300 s) until every cache has counted one more
/// propagation than `before`, and returns the p50 and p99 of the delays in
/// milliseconds.
fn propagated(caches: &[Arc<Machine>], before: &[u64]) -> Result<(f64, f64)> {
    let start = Instant::now();
    while caches.iter().zip(before).any(|(c, b)| c.cache_stats().propagations <= *b) {
        ensure!(start.elapsed() < Duration::from_secs(300), "the change did not reach every cache in 300 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut ms: Vec<f64> = caches.iter().map(|c| c.cache_stats().propagation_last.as_secs_f64() * 1e3).collect();
    Ok((percentile(&mut ms, 0.5), percentile(&mut ms, 0.99)))
}

fn counts(caches: &[Arc<Machine>]) -> Vec<u64> {
    caches.iter().map(|c| c.cache_stats().propagations).collect()
}

/// Total bytes of every object in the store (names and values).
fn stored_bytes(store: &dyn Store) -> Result<u64> {
    let mut total = 0u64;
    for prefix in ["authority/", "public/", "sealed/", "envelopes/"] {
        let names = store.list(prefix)?;
        for chunk in names.chunks(128) {
            for (n, v) in chunk.iter().zip(store.get_many(chunk)?) {
                total += (n.len() + v.map_or(0, |v| v.len())) as u64;
            }
        }
    }
    Ok(total)
}

/// Runs the fleet benchmark.
pub fn run(args: FleetArgs) -> Result<()> {
    let (dcs, per_dc, envelopes) = if args.quick { (10, 5, 1_000) } else { (args.dcs, args.machines, args.envelopes) };
    ensure!(dcs >= 1 && per_dc >= 2 && envelopes >= POLICIES.len(), "at least 1 data center, 2 machines each, 20 envelopes");
    let scratch;
    let (kind, store): (&str, Arc<dyn Store>) = match &args.store {
        Some(name) if name.starts_with("etcd://") => ("etcd", create_store(&crate::files::scratch_store(name))?),
        _ => {
            scratch = crate::files::scratch_dir("bench-fleet")?;
            ("file", Arc::new(FileStore::open(scratch.path())?))
        }
    };
    let result = measure(&args, kind, store.clone(), dcs, per_dc, envelopes);
    if kind == "etcd" {
        for prefix in ["authority/", "public/", "sealed/", "envelopes/"] {
            for chunk in store.list(prefix)?.chunks(100) {
                store.commit(&Batch { expect: vec![], ops: chunk.iter().map(|k| Op::Delete(k.clone())).collect() })?;
            }
        }
    }
    result
}

fn measure(args: &FleetArgs, kind: &str, store: Arc<dyn Store>, dcs: usize, per_dc: usize, envelopes: usize) -> Result<()> {
    let emit = |v: serde_json::Value| -> Result<()> {
        if args.json {
            outln!("{v}");
        } else {
            let line: Vec<String> = v.as_object().into_iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
            outln!("{}", line.join(" "));
        }
        Ok(())
    };
    let size =
        serde_json::json!({"store": kind, "dcs": dcs, "machines_per_dc": per_dc, "envelopes": envelopes, "policies": POLICIES.len()});
    let with = |phase: &str, extra: serde_json::Value| {
        let mut v = size.clone();
        v["phase"] = phase.into();
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        v
    };
    let mut auth = Authority::init(store.clone())?;

    // Issue every machine key, on every core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let t = Instant::now();
    let total = dcs * per_dc;
    let kept: Vec<(usize, usize, MachineKey)> = std::thread::scope(|s| {
        let auth = &auth;
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                s.spawn(move || -> Result<Vec<(usize, usize, MachineKey)>> {
                    let mut kept = Vec::new();
                    for i in (w..total).step_by(threads) {
                        let (d, m) = (i / per_dc, i % per_dc);
                        let key = auth.issue(&machine_attrs(d, m))?;
                        // Machine 0 of each data center is its cache; machine 1
                        // of data center 0 is the one revoked, and machine 1
                        // of the last the one revoked with no cache following.
                        if m == 0 || (m == 1 && (d == 0 || d == dcs - 1)) {
                            kept.push((d, m, key));
                        }
                    }
                    Ok(kept)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("an issuing thread panicked"))?).collect::<Result<Vec<_>>>()
    })?
    .into_iter()
    .flatten()
    .collect();
    let issue_s = t.elapsed().as_secs_f64();
    emit(with("issue", serde_json::json!({"keys": total, "threads": threads, "issue_s": issue_s, "keys_per_s": total as f64 / issue_s})))?;

    // Wrap the customer keys (a P-256 PEM is about 240 bytes), in bulk.
    let secret = vec![0x5a_u8; 241];
    let t = Instant::now();
    let mut all: Vec<Envelope> = Vec::with_capacity(envelopes);
    let mut firsts: Vec<Envelope> = Vec::new();
    for (i, p) in POLICIES.iter().enumerate() {
        let n = envelopes / POLICIES.len() + usize::from(i < envelopes % POLICIES.len());
        let secrets: Vec<&[u8]> = vec![&secret[..]; n];
        let made = auth.wrap_many(p, &secrets)?;
        firsts.push(made[0].clone());
        all.extend(made);
    }
    let wrap_s = t.elapsed().as_secs_f64();
    emit(with("wrap", serde_json::json!({"wrap_s": wrap_s, "wraps_per_s": envelopes as f64 / wrap_s})))?;

    // Storage, against one copy per data center that may hold the key.
    let storage_bytes = stored_bytes(&*store)?;
    // A data center holds a key when one of its machines may (their tags
    // repeat every six machines).
    let holders: Vec<u64> = firsts
        .iter()
        .map(|e| (0..dcs).filter(|d| (0..per_dc.min(6)).any(|m| e.policy.eval(&machine_attrs(*d, m)))).count() as u64)
        .collect();
    let mut per_dc_bytes = 0u64;
    for e in &all {
        let p = firsts.iter().position(|f| f.policy_id == e.policy_id).unwrap_or(0);
        per_dc_bytes += holders[p] * e.to_bytes().len() as u64;
    }
    emit(with(
        "storage",
        serde_json::json!({"storage_bytes": storage_bytes, "per_dc_wrapping_bytes": per_dc_bytes, "ratio": per_dc_bytes as f64 / storage_bytes as f64}),
    ))?;

    // One cache per data center, following the store, warmed with its share.
    let caches: Vec<Arc<Machine>> = kept
        .iter()
        .filter(|(_, m, _)| *m == 0)
        .map(|(_, _, k)| Arc::new(Machine::new(k.clone(), store.clone(), CacheConfig::default())))
        .collect();
    let mut share = (0usize, 0u64);
    for (i, c) in caches.iter().enumerate() {
        for e in firsts.iter().filter(|e| c.could_open(e)) {
            c.open_envelope(e)?;
        }
        if i == 0 {
            for e in all.iter().filter(|e| c.could_open(e)) {
                share.0 += 1;
                share.1 += e.to_bytes().len() as u64;
            }
        }
    }
    let entries = caches[0].cache_stats().entries;
    // A cache entry: the policy id, version, private key and bookkeeping.
    let entry_bytes = 32 + 4 + 32 + 48;
    emit(with(
        "dc_share",
        serde_json::json!({"dc_envelopes": share.0, "dc_envelope_bytes": share.1, "dc_cache_entries": entries, "dc_cache_key_bytes": entries * entry_bytes}),
    ))?;
    let followers = caches.iter().map(|c| c.follow()).collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(Duration::from_secs(2));

    let before = counts(&caches);
    let t = Instant::now();
    auth.rotate_master()?;
    let rotate_s = t.elapsed().as_secs_f64();
    let (p50, p99) = propagated(&caches, &before)?;
    emit(with("rotate_master", serde_json::json!({"rotate_master_s": rotate_s, "propagation_p50_ms": p50, "propagation_p99_ms": p99})))?;

    let before = counts(&caches);
    let t = Instant::now();
    let r = auth.rotate_policy_key(POLICIES[0])?;
    let rotate_policy_s = t.elapsed().as_secs_f64();
    let (p50, p99) = propagated(&caches, &before)?;
    emit(with(
        "rotate_policy_key",
        serde_json::json!({"rotate_policy_key_s": rotate_policy_s, "rewrapped": r.rewrapped, "propagation_p50_ms": p50, "propagation_p99_ms": p99}),
    ))?;

    let victim = kept.iter().find(|(d, m, _)| *d == 0 && *m == 1).map(|(_, _, k)| k.clone()).context("the revoked machine's key")?;
    let id = victim.id().context("machine id")?.to_owned();
    let before = counts(&caches);
    let t = Instant::now();
    let r = auth.revoke(&id)?;
    let revoke_s = t.elapsed().as_secs_f64();
    let (p50, p99) = propagated(&caches, &before)?;
    emit(with(
        "revoke",
        serde_json::json!({"revoke_s": revoke_s, "rekeyed_after_s": r.rekeyed_after.as_secs_f64(), "compacted": r.compacted, "revoke_to_wrap": revoke_s / wrap_s, "rekeyed": r.rekeyed, "rewrapped": r.rewrapped, "propagation_p50_ms": p50, "propagation_p99_ms": p99}),
    ))?;
    drop(followers);

    // A second revocation with no cache following: the authority's own
    // time. Above, the 500 simulated data centers open each re-keyed
    // policy key ahead of use (6,000 CP-ABE decryptions at the full size)
    // on the cores the authority and etcd use, which a real fleet does on
    // its own machines. The machine revoked is machine 1 of the last data
    // center (none with a single data center).
    let second = kept.iter().find(|(d, m, _)| *m == 1 && *d != 0).and_then(|(_, _, k)| k.id().map(str::to_owned));
    if let Some(second) = second {
        let t = Instant::now();
        let r2 = auth.revoke(&second)?;
        let alone_s = t.elapsed().as_secs_f64();
        emit(with(
            "revoke_alone",
            serde_json::json!({"revoke_s": alone_s, "rekeyed_after_s": r2.rekeyed_after.as_secs_f64(), "revoke_to_wrap": alone_s / wrap_s, "rewrapped": r2.rewrapped}),
        ))?;
    }

    // The revoked machine opens nothing the store serves; its neighbour does.
    let revoked = Machine::new(victim, store.clone(), CacheConfig::default());
    let sample: Vec<String> = store.list("envelopes/")?.into_iter().step_by((envelopes / 50).max(1)).collect();
    for n in &sample {
        let env = Envelope::parse(&store.get(n)?.context("envelope")?)?;
        if revoked.could_open(&env) {
            ensure!(revoked.open_envelope(&env).is_err(), "the revoked machine opened {n}");
        }
        if caches[0].could_open(&env) {
            caches[0].open_envelope(&env)?;
        }
    }
    Ok(())
}
