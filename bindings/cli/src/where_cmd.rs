//! `keyfence authority inventory` and `keyfence authority where`: the
//! machines the authority issued keys to, and where a policy can be used
//! among them, with the remote signing load it would draw
//! (docs/wrapping.md, "Where can this key be used?").

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use keyfence::wrap::{parse_inventory, Authority, Envelope, InventoryMachine, Latencies, Traffic, WhereQuery, WhereReport};

use crate::abe_cmd::parse_policy;
use crate::exit;
use crate::files::{outln, read, Output};
use crate::where_svg;

/// `keyfence authority inventory` options.
#[derive(Args)]
pub struct InventoryArgs {
    /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
    #[arg(long)]
    store: PathBuf,
    /// Add machines already issued (a store made before the inventory, a
    /// fleet issued elsewhere): one a line, the machine id (32 hex digits,
    /// or the `machine=` id it was issued with), a tab, its attributes as
    /// `issue --attrs` takes them. Blank and `#` lines are skipped.
    #[arg(long, value_name = "FILE")]
    import: Option<PathBuf>,
    /// One JSON object: {"machines": [{"id", "attributes", "issued",
    /// "generations", "imported", "revoked", "revoked_at"}], "total", "live"}.
    #[arg(long)]
    json: bool,
}

/// `keyfence authority where` options.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["policy", "envelope"])))]
pub struct WhereArgs {
    /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
    #[arg(long)]
    store: PathBuf,
    /// The policy a key would be wrapped under.
    #[arg(long)]
    policy: Option<String>,
    /// An envelope: its policy (`-`: standard input).
    #[arg(long)]
    envelope: Option<PathBuf>,
    /// Group the machines by this label's values (e.g. dc, region).
    #[arg(long, value_name = "LABEL")]
    by: Option<String>,
    /// Handshakes per second by group: CSV lines `group,rps`. Each group
    /// that cannot open the key sends its handshakes to the nearest group
    /// that can, as the key server forwards.
    #[arg(long, value_name = "FILE", requires = "by")]
    traffic: Option<PathBuf>,
    /// Latencies between groups: CSV lines `from,to,milliseconds` (a pair
    /// given one way holds both ways; a pair not given is the farthest).
    /// Ties go to the group whose value sorts first.
    #[arg(long, value_name = "FILE", requires = "traffic")]
    latency: Option<PathBuf>,
    /// Without --latency: a group is near the satisfying groups with its
    /// value of this label (e.g. region); else the nearest is the
    /// satisfying group that sorts first.
    #[arg(long, value_name = "LABEL", requires = "traffic")]
    near: Option<String>,
    /// Warn about a group that would receive more than this many times
    /// its own traffic.
    #[arg(long, default_value_t = 4.0, value_name = "RATIO")]
    warn_ratio: f64,
    /// Draw the groups and the projected load on each to this SVG file.
    #[arg(long, value_name = "OUT", requires = "by")]
    svg: Option<PathBuf>,
    /// List the matching machines' ids too.
    #[arg(long)]
    machines: bool,
    /// One JSON object: {"total", "matching", "remote_share", "groups":
    /// [{"value", "total", "matching", "own_rps", "received_rps",
    /// "warning", ...}], ...}.
    #[arg(long)]
    json: bool,
}

/// A file's text, for the readers that name the file and line.
fn text(path: &Path) -> Result<String> {
    String::from_utf8(read(path)?)
        .map_err(|e| exit::input(format!("{}: not UTF-8 text (byte {})", path.display(), e.utf8_error().valid_up_to())))
}

/// Unix seconds as a UTC date and time, for people.
fn date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

fn machine_json(m: &InventoryMachine) -> serde_json::Value {
    let attrs: serde_json::Map<String, serde_json::Value> = m.attributes.iter().map(|(l, v)| (l.to_owned(), v.into())).collect();
    serde_json::json!({
        "id": m.id,
        "attributes": attrs,
        "issued": m.issued,
        "generations": m.generations,
        "imported": m.imported,
        "revoked": m.revoked,
        "revoked_at": m.revoked_at,
    })
}

/// `keyfence authority inventory`.
pub fn inventory(args: InventoryArgs) -> Result<ExitCode> {
    let a = Authority::open(crate::wrap_cmd::store(&args.store)?)?;
    if let Some(file) = &args.import {
        let name = file.display().to_string();
        let machines = parse_inventory(&name, &text(file)?)?;
        let done = a.import_inventory(&machines)?;
        let line = format!("imported {name}: {} added, {} updated, {} unchanged", done.added, done.updated, done.unchanged);
        if args.json {
            eprintln!("{line}");
        } else {
            outln!("{line}");
            return Ok(ExitCode::SUCCESS);
        }
    }
    let machines = a.inventory()?;
    let live = machines.iter().filter(|m| !m.revoked).count();
    if args.json {
        let v =
            serde_json::json!({"total": machines.len(), "live": live, "machines": machines.iter().map(machine_json).collect::<Vec<_>>()});
        outln!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    for m in &machines {
        let mut flags = String::new();
        if m.revoked {
            flags.push_str(" revoked");
            if let Some(t) = m.revoked_at {
                flags.push_str(&format!(" {}", date(t)));
            }
        }
        if m.imported {
            flags.push_str(" imported");
        }
        outln!("{}  {}  generations {:?}{}  {{{}}}", m.id, date(m.issued), m.generations, flags, m.attributes);
    }
    outln!("{} machine(s), {} live, {} revoked", machines.len(), live, machines.len() - live);
    Ok(ExitCode::SUCCESS)
}

/// The policy `where` is asked about: given, or an envelope's.
fn asked_policy(args: &WhereArgs) -> Result<keyfence::wrap::CanonicalPolicy> {
    if let Some(p) = &args.policy {
        parse_policy(p)?;
        return Ok(keyfence::wrap::CanonicalPolicy::parse(p)?);
    }
    let path = args.envelope.as_ref().ok_or_else(|| exit::input("give --policy or --envelope"))?;
    let env = Envelope::parse(&read(path)?).with_context(|| format!("{} is not an envelope", path.display()))?;
    Ok(env.policy)
}

/// `keyfence authority where`.
pub fn where_(args: WhereArgs) -> Result<ExitCode> {
    let policy = asked_policy(&args)?;
    let svg_out = args.svg.as_ref().map(|p| Output::new(p, &[&args.store])).transpose()?;
    let mut q = WhereQuery::new(policy);
    q.by = args.by.clone();
    q.near = args.near.clone();
    q.warn_ratio = args.warn_ratio;
    q.list_machines = args.machines;
    if let Some(f) = &args.traffic {
        q.traffic = Some(Traffic::parse_csv(&f.display().to_string(), &text(f)?)?);
    }
    if let Some(f) = &args.latency {
        q.latency = Some(Latencies::parse_csv(&f.display().to_string(), &text(f)?)?);
    }
    let a = Authority::open(crate::wrap_cmd::store(&args.store)?)?;
    let r = a.where_usable(&q)?;
    if let Some(out) = &svg_out {
        out.write_public(where_svg::draw(&r).as_bytes())?;
    }
    if args.json {
        outln!("{}", r.to_json());
    } else {
        print_report(&r, args.machines)?;
    }
    Ok(if r.matching == 0 { ExitCode::from(exit::NO) } else { ExitCode::SUCCESS })
}

/// A rate for people.
fn rps(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}/s")
    } else {
        format!("{x:.1}/s")
    }
}

fn print_report(r: &WhereReport, machines: bool) -> Result<()> {
    outln!(
        "`{}`: {} of {} live machine(s) satisfy it{}",
        r.policy,
        r.matching,
        r.total,
        if r.revoked > 0 { format!(" ({} revoked left out)", r.revoked) } else { String::new() }
    );
    if r.total == 0 {
        outln!("the inventory is empty: `keyfence authority issue` records machines, `keyfence authority inventory --import FILE` adds a fleet issued before");
    }
    if let Some(by) = &r.by {
        let sat = r.groups.iter().filter(|g| g.satisfies()).count();
        outln!("by {by}: {sat} of {} group(s) satisfy it", r.groups.len());
        for g in r.groups.iter().filter(|g| g.satisfies() || g.warning.is_some()) {
            let mut line = format!("  {}  {}/{} machine(s)", g.value, g.matching, g.total);
            if let (Some(own), Some(rec)) = (g.own_rps, g.received_rps) {
                line.push_str(&format!("  own {}  receives {} from {} group(s)  load {}", rps(own), rps(rec), g.senders, rps(own + rec)));
            }
            outln!("{line}");
            if let Some(w) = &g.warning {
                outln!("    warning: {} {w}", g.value);
            }
        }
        let others = r.groups.iter().filter(|g| !g.satisfies()).count();
        if others > 0 {
            outln!(
                "  ({others} group(s) cannot open it{})",
                if r.total_rps.is_some() { ": their handshakes go to the nearest that can" } else { "" }
            );
        }
        if r.ungrouped > 0 {
            outln!("  {} machine(s) without `{by}` ({} satisfy it) are in no group", r.ungrouped, r.ungrouped_matching);
        }
    }
    if let (Some(total), Some(remote), Some(unserved), Some(share)) = (r.total_rps, r.remote_rps, r.unserved_rps, r.remote_share) {
        outln!(
            "remote: {:.1}% of {} signed in another group ({}); {} with nowhere to go",
            share * 100.0,
            rps(total),
            rps(remote),
            rps(unserved)
        );
    }
    if machines {
        for id in &r.matching_machines {
            outln!("{id}");
        }
    }
    Ok(())
}

/// After `authority wrap`: a warning on standard error when the policy
/// matches no machine of the inventory (the key wraps all the same: a
/// machine may be issued later).
pub fn warn_if_unusable(a: &Authority, policy: &keyfence::wrap::CanonicalPolicy) {
    match a.where_usable(&WhereQuery::new(policy.clone())) {
        Ok(r) if r.matching > 0 => {}
        Ok(r) if r.total == 0 => eprintln!(
            "keyfence: warning: the inventory holds no machine, so nothing says where `{policy}` can be used \
             (`keyfence authority inventory --import FILE` adds a fleet issued before it)"
        ),
        Ok(r) => eprintln!(
            "keyfence: warning: no machine of the inventory ({} live) satisfies `{policy}`: nothing can open this key until one is issued \
             (`keyfence authority where --policy ...` shows where a policy can be used)",
            r.total
        ),
        Err(e) => eprintln!("keyfence: warning: could not read the inventory to check where `{policy}` can be used: {e}"),
    }
}
