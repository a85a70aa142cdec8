//! `keyfence authority ...` and `keyfence machine ...`: policy-key wrapping
//! on a store named by `--store`: a directory (the embedded file store) or
//! `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (`keyfence::wrap::open_store`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use keyfence::policy::Attributes;
use keyfence::wrap::{
    create_store, open_store, Authority, CacheConfig, FileStore, GenerationState, Machine, MachineInfo, MachineKey, Skipped, Store,
    StoreError,
};

use crate::abe_cmd::parse_policy;
use crate::exit;
use crate::files::{outln, read, read_secret, Output};

#[derive(Subcommand)]
pub enum AuthorityCmd {
    /// Create an authority (first master generation) in a store.
    /// The only command that creates a store; the master secret keys in
    /// DIR/authority/ are written mode 600 (docs/wrapping.md).
    Init {
        /// Store: a directory (created if missing) or
        /// etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=PATH&cert=PATH&key=PATH].
        #[arg(long)]
        store: PathBuf,
    },
    /// Issue a machine key (one CP-ABE key per live generation).
    Issue {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// The machine's attributes, label=value,label=value.
        #[arg(long)]
        attrs: String,
        /// Output key file (a secret: written mode 600; `-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Wrap a secret under a policy; the envelope also goes to the store.
    Wrap {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// The policy.
        #[arg(long)]
        policy: String,
        /// The secret (e.g. a PEM private key; `-`: standard input).
        #[arg(long = "in")]
        input: PathBuf,
        /// The envelope (`-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Rotate the master key; re-seals only the policy keys. Refused when
    /// it would retire the newest generation machines of the inventory
    /// hold keys of (they would open nothing): issue them new keys first.
    Rotate {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// Rotate even if it strands machines of the inventory (they are
        /// named on standard error).
        #[arg(long)]
        force: bool,
    },
    /// The machines the authority issued keys to (id, attributes, issue
    /// time, generations, revocation), kept in the authority's part of
    /// the store; `--import FILE` adds a fleet issued before.
    Inventory(crate::where_cmd::InventoryArgs),
    /// Where a key wrapped under a policy can be used: the live machines
    /// of the inventory that satisfy it (attributes evaluated, nothing
    /// decrypted), by group, and with --traffic the remote signing load
    /// it puts on the groups that can open it. Exits 1 when no machine
    /// satisfies it.
    Where(crate::where_cmd::WhereArgs),
    /// Replace one policy's key and re-wrap its envelopes in the store. The
    /// old key stays decrypt-only (envelopes written with `wrap --out`
    /// still open) until `retire-policy-key`; envelopes it cannot re-wrap
    /// are listed on standard error, and do not stop it.
    RotatePolicy {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// The policy.
        #[arg(long)]
        policy: String,
    },
    /// Delete one policy's old (decrypt-only) keys after re-wrapping the
    /// store's envelopes still sealed to them. Envelopes elsewhere that are
    /// sealed to an old key stop opening: replace them first.
    RetirePolicyKey {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// The policy.
        #[arg(long)]
        policy: String,
    },
    /// Revoke a machine: record its id (signed, for machines), give every
    /// policy a new key sealed so that it cannot open it, re-wrap the
    /// store's envelopes to them and retire the old keys, so the policy
    /// keys it cached open nothing the store serves. Envelopes outside the
    /// store (`wrap --out`) stop opening: fetch them again. Run it again
    /// after an interruption to finish; `issue` refuses the id from then on.
    Revoke {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// The machine id (`keyfence machine info --key FILE` shows it).
        #[arg(long)]
        machine: String,
        /// Do not compact the etcd cluster's history afterwards: its old
        /// revisions keep the envelopes as they were, which the revoked
        /// machine still opens. For a cluster shared with others (etcd's
        /// compaction is the whole cluster's); compact it on their schedule.
        #[arg(long)]
        keep_history: bool,
        /// Print the report as one JSON object (the envelopes that open
        /// nowhere now under "skipped"), as the bindings return it.
        #[arg(long)]
        json: bool,
    },
    /// Make or bring up to date a servers' copy of the store: what
    /// machines read (the signed lists, the sealed policy keys, the
    /// envelopes) and nothing of the authority's (`authority/`: the master
    /// secret keys, the policy private keys, the signing key). Servers and
    /// their agents read the copy (docs/deploy.md); run it again after each
    /// change (issue, wrap, rotate, retire, revoke). A server brings its
    /// agent's store up to date from a copy it received the same way
    /// (`--store` the copy): objects before the lists that name them,
    /// deletions last.
    Export {
        /// The authority's store, or a copy of it: a directory or
        /// etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
        /// The copy: a directory (made if missing) or an etcd prefix; never
        /// a store that holds an authority's state.
        #[arg(long)]
        to: PathBuf,
    },
    /// Show generations, policy keys and envelopes.
    Status {
        /// Store: a directory or etcd://HOST:PORT[,...]/PREFIX.
        #[arg(long)]
        store: PathBuf,
    },
}

#[derive(Subcommand)]
pub enum MachineCmd {
    /// Open an envelope with a machine key. Exits 1 if this machine cannot
    /// open it (attributes, generations), 2 if the envelope or key is
    /// malformed.
    Open {
        #[command(flatten)]
        envelope: EnvelopeArgs,
        /// The secret (written mode 600; `-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Exit 0 if this machine can open the envelope, 1 if not: every check
    /// `open` makes short of decrypting (the authority's signature, the
    /// attributes, a live generation, the policy key in the store); 2 if
    /// the envelope or key is malformed.
    CouldOpen {
        #[command(flatten)]
        envelope: EnvelopeArgs,
    },
    /// Show what a machine key says about itself: its id (the `machine`
    /// attribute the authority set, which `authority revoke --machine`
    /// takes), its attributes and the master generations it holds keys for.
    /// No secret is decoded or printed.
    Info {
        /// Machine key file (`-`: standard input).
        #[arg(long)]
        key: PathBuf,
        /// One JSON object: {"id", "attributes", "generations", "authority"}.
        #[arg(long)]
        json: bool,
    },
}

/// What a machine needs to open an envelope: `open` and `could-open` take
/// the same three.
#[derive(Args)]
pub struct EnvelopeArgs {
    /// Store (for the sealed policy keys): a directory or etcd://HOST:PORT[,...]/PREFIX.
    #[arg(long)]
    store: PathBuf,
    /// Machine key file.
    #[arg(long)]
    key: PathBuf,
    /// The envelope (`-`: standard input).
    #[arg(long = "in")]
    input: PathBuf,
}

/// Every object the authority writes; its presence is what makes a
/// directory a store (a machine's replicated copy has it too).
const STORE_MARK: &str = "public/generations";

/// An existing store. Only `authority init` creates one: a mistyped
/// `--store` must not leave an empty directory behind and then fail
/// with a message about its contents.
pub(crate) fn store(dir: &Path) -> Result<Arc<dyn Store>> {
    if let Some(name) = etcd_name(dir) {
        // Opening refuses a prefix without a store with the core's words;
        // the command line says it as the input error it is.
        let s = match open_store(name) {
            Ok(s) if s.get(STORE_MARK)?.is_some() => Some(s),
            Ok(_) | Err(StoreError::NotAStore { .. }) => None,
            Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot open store {name}"))),
        };
        let Some(s) = s else {
            return Err(exit::input(format!(
                "{name} holds no keyfence store: no authority in this store (`keyfence authority init --store {name}` creates one)"
            )));
        };
        return Ok(s);
    }
    if !dir.join(STORE_MARK).is_file() {
        return Err(exit::input(format!(
            "{} is not a keyfence store: no authority in this store (`keyfence authority init --store {}` creates one)",
            dir.display(),
            dir.display()
        )));
    }
    Ok(Arc::new(FileStore::open(dir).with_context(|| format!("cannot open store {}", dir.display()))?))
}

/// Says on standard error what an operation met from other writers on a
/// store without a lock (etcd), when it met anything: an operator
/// wondering why a rotation took long, or why it says "run it again"
/// after retrying, reads it here.
fn report_conflicts(a: &Authority) {
    let c = a.last_conflicts();
    let mut parts = Vec::new();
    if !c.waited.is_zero() {
        parts.push(format!("waited {:.1} s for another rotation or revocation", c.waited.as_secs_f64()));
    }
    if c.rebased > 0 {
        parts.push(format!("took in {} commit(s) of other writers", c.rebased));
    }
    if c.held_wraps {
        parts.push("made wraps that add a policy wait for it".into());
    }
    if c.retried > 0 {
        parts.push(format!("started over {} time(s) after a conflict", c.retried));
    }
    if !parts.is_empty() {
        eprintln!("keyfence: other writers on this store: {}", parts.join("; "));
    }
}

/// The store name in `--store`, when it names an etcd store rather than
/// a directory.
fn etcd_name(dir: &Path) -> Option<&str> {
    dir.to_str().filter(|s| s.starts_with("etcd://"))
}

/// What a command did, on standard output unless its output went there.
fn report(out: &Output, what: std::fmt::Arguments<'_>) -> Result<()> {
    if out.is_std() {
        eprintln!("{what}");
        return Ok(());
    }
    outln!("{what}");
    Ok(())
}

/// The authority of the store at `dir`, once `policy` has parsed (so a
/// typo is reported with its position before the store is touched).
fn policy_authority(dir: &Path, policy: &str) -> Result<Authority> {
    parse_policy(policy)?;
    Ok(Authority::open(store(dir)?)?)
}

/// Names on standard error each envelope a rotation or retirement left as
/// it was, and counts them for the summary line.
fn report_skipped(skipped: &[Skipped]) -> usize {
    for s in skipped {
        eprintln!("skipped {}: {}", s.name, s.reason);
    }
    skipped.len()
}

pub fn authority(cmd: AuthorityCmd) -> Result<ExitCode> {
    match cmd {
        AuthorityCmd::Init { store: dir } => {
            if let Some(name) = etcd_name(&dir) {
                Authority::init(create_store(name).with_context(|| format!("cannot create store {name}"))?)?;
                outln!("authority created in {name} (master generation 1)");
                return Ok(ExitCode::SUCCESS);
            }
            if dir.exists() && !dir.is_dir() {
                return Err(exit::input(format!("{} exists and is not a directory", dir.display())));
            }
            let name = dir.to_str().ok_or_else(|| exit::input(format!("{} is not UTF-8", dir.display())))?;
            Authority::init(create_store(name).with_context(|| format!("cannot create store {}", dir.display()))?)?;
            outln!("authority created in {} (master generation 1)", dir.display());
        }
        AuthorityCmd::Issue { store: dir, attrs, out } => {
            let out_file = Output::new(&out, &[&dir])?;
            let a = Authority::open(store(&dir)?)?;
            let attrs: Attributes = attrs.parse().context("invalid --attrs")?;
            let key = a.issue(&attrs)?;
            out_file.write_private(&key.to_bytes())?;
            let id = key.id().unwrap_or_default();
            report(&out_file, format_args!("issued a key for {{{attrs}}} as machine {id} (generations {:?})", key.generations()))?;
        }
        AuthorityCmd::Wrap { store: dir, policy, input, out } => {
            parse_policy(&policy)?;
            let out_file = Output::new(&out, &[&input, &dir])?;
            let mut a = Authority::open(store(&dir)?)?;
            let env = a.wrap(&policy, &read_secret(&input)?);
            report_conflicts(&a);
            let env = env?;
            out_file.write_public(env.to_bytes())?;
            crate::where_cmd::warn_if_unusable(&a, &env.policy);
            report(&out_file, format_args!("wrapped under `{}` (policy key version {})", env.policy, env.key_version))?;
        }
        AuthorityCmd::Rotate { store: dir, force } => {
            let mut a = Authority::open(store(&dir)?)?;
            let r = if force {
                let s = a.stranding()?;
                if let (Some(g), false) = (s.generation, s.machines.is_empty()) {
                    eprintln!(
                        "keyfence: warning: --force: retiring generation {g} strands {} machine(s) of the inventory, which open nothing until issued again: {}",
                        s.machines.len(),
                        s.machines.join(", ")
                    );
                }
                a.rotate_master()
            } else {
                a.rotate_master_unless_stranding()
            };
            report_conflicts(&a);
            let r = r?;
            outln!(
                "master generation {} is active; re-sealed {} policy key(s); {}",
                r.new_generation,
                r.resealed,
                r.retired.map_or("nothing retired".into(), |g| format!("generation {g} retired"))
            );
        }
        AuthorityCmd::RotatePolicy { store: dir, policy } => {
            let mut a = policy_authority(&dir, &policy)?;
            let r = a.rotate_policy_key(&policy);
            report_conflicts(&a);
            let r = r?;
            outln!(
                "policy key version {}; re-wrapped {} envelope(s); skipped {}; version(s) {:?} kept decrypt-only until `keyfence authority retire-policy-key`",
                r.version,
                r.rewrapped,
                report_skipped(&r.skipped),
                r.decrypt_only
            );
        }
        AuthorityCmd::RetirePolicyKey { store: dir, policy } => {
            let mut a = policy_authority(&dir, &policy)?;
            let r = a.retire_policy_keys(&policy);
            report_conflicts(&a);
            let r = r?;
            outln!(
                "policy key version {} remains; retired version(s) {:?}; re-wrapped {} envelope(s) first; skipped {}",
                r.version,
                r.retired,
                r.rewrapped,
                report_skipped(&r.skipped)
            );
        }
        AuthorityCmd::Revoke { store: dir, machine, keep_history, json } => {
            let mut a = Authority::open(store(&dir)?)?;
            a.set_compact_after_revoke(!keep_history);
            let r = a.revoke(&machine);
            report_conflicts(&a);
            let r = r?;
            if json {
                outln!("{}", r.to_json());
            } else if r.already {
                outln!("machine {} was already revoked; nothing to do", r.id);
            } else {
                outln!(
                    "machine {} revoked{}; {} policy key(s) replaced; re-wrapped {} envelope(s); retired {} old version(s); skipped {}",
                    r.id,
                    if r.resumed { " (an interrupted revocation finished)" } else { "" },
                    r.rekeyed,
                    r.rewrapped,
                    r.retired,
                    report_skipped(&r.skipped)
                );
            }
            if r.compacted {
                outln!("the store's history was compacted: its old revisions no longer hold what the machine could open");
            }
        }
        AuthorityCmd::Export { store: dir, to } => {
            let from = store(&dir)?;
            let name = to.to_str().ok_or_else(|| exit::input("--to must be UTF-8"))?;
            let copy = keyfence::wrap::create_store(name).with_context(|| format!("the copy {name}"))?;
            let e = keyfence::wrap::export_for_servers(&*from, &*copy)?;
            outln!("{name}: {} written, {} unchanged, {} deleted; no authority state", e.written, e.unchanged, e.deleted);
        }
        AuthorityCmd::Inventory(args) => return crate::where_cmd::inventory(args),
        AuthorityCmd::Where(args) => return crate::where_cmd::where_(args),
        AuthorityCmd::Status { store: dir } => {
            let a = Authority::open(store(&dir)?)?;
            let s = a.status()?;
            for (g, st) in &s.generations {
                let st = match st {
                    GenerationState::Active => "active",
                    GenerationState::DecryptOnly => "decrypt-only",
                    GenerationState::Retired => "retired",
                };
                outln!("generation {g}: {st}");
            }
            outln!("policies: {}\npolicy keys: {}\nenvelopes: {}", s.policies, s.policy_keys, s.envelopes);
            outln!("revoked machines: {}", s.revoked.len());
            for id in &s.pending_revocations {
                outln!("revocation of {id} unfinished: run `keyfence authority revoke --machine {id}` again");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The machine of the key file `key` on the store `dir`, starting from
/// (and keeping) the newest lists beside its key: a store that serves
/// lists older than an earlier run accepted is refused.
pub fn open_machine(dir: &Path, key: &Path) -> Result<Machine> {
    let store = store(dir)?;
    let mk = MachineKey::from_bytes(&read_secret(key)?).context("machine key")?;
    Ok(Machine::new(mk, store, CacheConfig::default()).keep_newest_beside(key)?)
}

pub fn machine(cmd: MachineCmd) -> Result<ExitCode> {
    match cmd {
        MachineCmd::Open { envelope: EnvelopeArgs { store: dir, key, input }, out } => {
            let out = Output::new(&out, &[&key, &input, &dir])?;
            let m = open_machine(&dir, &key)?;
            let secret = m.open(&read(&input)?).with_context(|| format!("cannot open {}", input.display()))?;
            out.write_private(&secret)?;
        }
        MachineCmd::CouldOpen { envelope: EnvelopeArgs { store: dir, key, input } } => {
            let m = open_machine(&dir, &key)?;
            let env = keyfence::wrap::Envelope::parse(&read(&input)?)?;
            // The same checks as `open`, short of decrypting: a yes here is
            // never followed by a refusal `open` could have foreseen.
            match m.can_open(&env) {
                Ok(()) => {
                    outln!("yes: {{{}}} satisfies `{}` and the store holds its policy key", m.attributes(), env.policy);
                    return Ok(ExitCode::SUCCESS);
                }
                Err(e) if exit::for_code(e.code()) == exit::NO => {
                    outln!("no: {e}");
                    return Ok(ExitCode::from(exit::NO));
                }
                Err(e) => return Err(e).with_context(|| format!("cannot check {}", input.display())),
            }
        }
        MachineCmd::Info { key, json } => {
            // The public part only: the attribute keys are skipped, not decoded.
            let info = MachineInfo::from_key_bytes(&read_secret(&key)?).context("machine key")?;
            if json {
                let attrs: serde_json::Map<String, serde_json::Value> =
                    info.attributes().iter().map(|(l, v)| (l.to_owned(), v.into())).collect();
                let hex: String = info.authority().iter().map(|b| format!("{b:02x}")).collect();
                let v = serde_json::json!({
                    "id": info.id(),
                    "attributes": attrs,
                    "generations": info.generations(),
                    "authority": hex,
                });
                outln!("{v}");
            } else {
                outln!("id: {}", info.id().unwrap_or("(none: issued before machine ids; issue it a new key)"));
                outln!("attributes: {}", info.attributes());
                outln!("generations: {:?}", info.generations());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
