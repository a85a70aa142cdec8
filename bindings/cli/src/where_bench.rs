//! `keyfence bench where`: issue 61's figures. A fleet of the seeds'
//! shape (500 data centers x 50 machines) imported into a fresh store,
//! then `where` for the outage's policy over it, grouped by data center
//! with every data center's traffic (near by region, and again with
//! latencies between all of them): the import's time and `where`'s, each
//! from a fresh authority handle as a command would open it. `--runs`
//! times over, each on a new store, with the median; docs/benchmarks.md
//! ("Where a key can be used").

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use clap::Args;
use keyfence::wrap::{
    create_store, parse_inventory, Authority, Batch, CanonicalPolicy, FileStore, Latencies, Op, Store, Traffic, WhereQuery,
};

use crate::files::outln;

/// `keyfence bench where` options.
#[derive(Args)]
pub struct WhereBenchArgs {
    /// The store: a fresh directory (default) or etcd://HOST:PORT[,...]/PREFIX
    /// (a sub-store `PREFIX/bench-...` per run, deleted afterwards).
    #[arg(long)]
    store: Option<String>,
    /// Data centers.
    #[arg(long, default_value_t = 500)]
    dcs: usize,
    /// Machines per data center.
    #[arg(long, default_value_t = 50)]
    machines: usize,
    /// Runs, each on a new store; the medians are printed last.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// One JSON object per run and one with the medians.
    #[arg(long)]
    json: bool,
}

/// The region and country of data center `d` of `dcs` (as docs/wrapping.md's
/// example generates them): a fifth EU (one in ten of those GB), a fifth
/// NA, and the rest APAC, LATAM and AF.
fn place(d: usize, dcs: usize) -> (&'static str, &'static str) {
    let f = d * 500 / dcs.max(1);
    match f {
        0..=99 => (
            "EU",
            if d.is_multiple_of(10) {
                "GB"
            } else if !d.is_multiple_of(3) {
                "DE"
            } else {
                "FR"
            },
        ),
        100..=199 => ("NA", if d % 2 == 1 { "CA" } else { "US" }),
        200..=349 => ("APAC", if !d.is_multiple_of(3) { "JP" } else { "SG" }),
        350..=424 => ("LATAM", "BR"),
        _ => ("AF", "ZA"),
    }
}

/// The inventory file, the traffic (200 handshakes/s each) and latencies
/// between every pair (distances on a plane, regions apart).
fn fleet(dcs: usize, per_dc: usize) -> (String, Traffic, Latencies) {
    let mut text = String::with_capacity(dcs * per_dc * 72);
    let mut xy = Vec::with_capacity(dcs);
    for d in 0..dcs {
        let (region, country) = place(d, dcs);
        for m in 0..per_dc {
            let _ = writeln!(text, "{:016x}{:016x}\tdc=dc{d:03},region={region},country={country}", d + 1, m + 1);
        }
        let centre = match region {
            "EU" => (0.0, 0.0),
            "NA" => (-60.0, 10.0),
            "APAC" => (80.0, 20.0),
            "LATAM" => (-40.0, -40.0),
            _ => (10.0, -50.0),
        };
        xy.push((centre.0 + ((d * 7919) % 21) as f64 - 10.0, centre.1 + ((d * 104_729) % 21) as f64 - 10.0));
    }
    let traffic = Traffic::from_pairs((0..dcs).map(|d| (format!("dc{d:03}"), 200.0))).expect("finite rates");
    let mut pairs = Vec::with_capacity(dcs * dcs / 2);
    for a in 0..dcs {
        for b in a + 1..dcs {
            let ms = 1.0 + 2.0 * ((xy[a].0 - xy[b].0).powi(2) + (xy[a].1 - xy[b].1).powi(2)).sqrt();
            pairs.push((format!("dc{a:03}"), format!("dc{b:03}"), ms.floor()));
        }
    }
    (text, traffic, Latencies::from_triples(pairs).expect("finite latencies"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the benchmark.
pub fn run(args: WhereBenchArgs) -> Result<()> {
    ensure!(args.dcs >= 1 && args.machines >= 1 && args.runs >= 1, "at least 1 data center, 1 machine and 1 run");
    let (text, traffic, latency) = fleet(args.dcs, args.machines);
    let policy = CanonicalPolicy::parse("region: EU and not country: GB")?;
    let kind = if args.store.as_deref().is_some_and(|s| s.starts_with("etcd://")) { "etcd" } else { "file" };
    let mut rows: Vec<[f64; 3]> = Vec::new();
    for run in 0..args.runs {
        let scratch;
        let store: Arc<dyn Store> = match &args.store {
            Some(name) if kind == "etcd" => create_store(&crate::files::scratch_store(name))?,
            _ => {
                scratch = crate::files::scratch_dir("bench-where")?;
                Arc::new(FileStore::open(scratch.path())?)
            }
        };
        let result = (|| -> Result<[f64; 3]> {
            Authority::init(store.clone())?;
            let t = Instant::now();
            let a = Authority::open(store.clone())?;
            let machines = parse_inventory("fleet.tsv", &text)?;
            let done = a.import_inventory(&machines)?;
            let import_s = t.elapsed().as_secs_f64();
            ensure!(done.added == args.dcs * args.machines, "imported {} machines, not {}", done.added, args.dcs * args.machines);
            let mut q = WhereQuery::new(policy.clone());
            q.by = Some("dc".into());
            q.near = Some("region".into());
            q.traffic = Some(traffic.clone());
            let t = Instant::now();
            let r = Authority::open(store.clone())?.where_usable(&q)?;
            let where_s = t.elapsed().as_secs_f64();
            ensure!(r.total == args.dcs * args.machines && r.matching > 0, "where counted {} machines", r.total);
            q.latency = Some(latency.clone());
            let t = Instant::now();
            Authority::open(store.clone())?.where_usable(&q)?;
            let latency_s = t.elapsed().as_secs_f64();
            Ok([import_s, where_s, latency_s])
        })();
        if kind == "etcd" {
            for prefix in ["authority/", "public/", "sealed/", "envelopes/"] {
                for chunk in store.list(prefix)?.chunks(100) {
                    store.commit(&Batch { expect: vec![], ops: chunk.iter().map(|k| Op::Delete(k.clone())).collect() })?;
                }
            }
        }
        let row = result?;
        let machines = args.dcs * args.machines;
        if args.json {
            let v = serde_json::json!({"store": kind, "run": run + 1, "dcs": args.dcs, "machines": machines,
                "import_s": row[0], "where_s": row[1], "where_latency_s": row[2]});
            outln!("{v}");
        } else {
            outln!(
                "{kind} run {}: import of {machines} machines {:.3} s; where {:.3} s; where with latencies {:.3} s",
                run + 1,
                row[0],
                row[1],
                row[2]
            );
        }
        rows.push(row);
    }
    let med = |i: usize| median(rows.iter().map(|r| r[i]).collect());
    if args.json {
        let v = serde_json::json!({"store": kind, "median_of": args.runs, "dcs": args.dcs, "machines": args.dcs * args.machines,
            "import_s": med(0), "where_s": med(1), "where_latency_s": med(2)});
        outln!("{v}");
    } else {
        outln!("{kind} median of {}: import {:.3} s; where {:.3} s; where with latencies {:.3} s", args.runs, med(0), med(1), med(2));
    }
    Ok(())
}
