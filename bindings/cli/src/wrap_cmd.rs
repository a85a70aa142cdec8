//! `keyfence authority ...` and `keyfence machine ...`: policy-key wrapping
//! on the embedded file store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use keyfence::policy::Attributes;
use keyfence::wrap::{Authority, CacheConfig, FileStore, GenerationState, Machine, MachineKey, Store};

use crate::abe_cmd::parse_policy;
use crate::exit;
use crate::files::{is_std, outln, read, write_private, write_public};

#[derive(Subcommand)]
pub enum AuthorityCmd {
    /// Create an authority (first master generation) in a store directory.
    /// The only command that creates a store; the master secret keys in
    /// DIR/authority/ are written mode 600 (docs/wrapping.md).
    Init {
        /// Store directory (created if missing).
        #[arg(long)]
        store: PathBuf,
    },
    /// Issue a machine key (one CP-ABE key per live generation).
    Issue {
        /// Store directory.
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
        /// Store directory.
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
    /// Rotate the master key; re-seals only the policy keys.
    Rotate {
        /// Store directory.
        #[arg(long)]
        store: PathBuf,
    },
    /// Replace one policy's key and re-wrap its envelopes.
    RotatePolicy {
        /// Store directory.
        #[arg(long)]
        store: PathBuf,
        /// The policy.
        #[arg(long)]
        policy: String,
    },
    /// Show generations, policy keys and envelopes.
    Status {
        /// Store directory.
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
        /// Store directory (for the sealed policy keys).
        #[arg(long)]
        store: PathBuf,
        /// Machine key file.
        #[arg(long)]
        key: PathBuf,
        /// The envelope (`-`: standard input).
        #[arg(long = "in")]
        input: PathBuf,
        /// The secret (written mode 600; `-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Exit 0 if this machine's attributes satisfy the envelope's policy,
    /// 1 if not (no cryptography).
    CouldOpen {
        /// Store directory.
        #[arg(long)]
        store: PathBuf,
        /// Machine key file.
        #[arg(long)]
        key: PathBuf,
        /// The envelope (`-`: standard input).
        #[arg(long = "in")]
        input: PathBuf,
    },
}

/// Every object the authority writes; its presence is what makes a
/// directory a store (a machine's replicated copy has it too).
const STORE_MARK: &str = "public/generations";

/// An existing store. Only `authority init` creates one: a mistyped
/// `--store` must not leave an empty directory behind and then fail
/// with a message about its contents.
fn store(dir: &Path) -> Result<Arc<dyn Store>> {
    if !dir.join(STORE_MARK).is_file() {
        return Err(exit::input(format!(
            "{} is not a keyfence store: no authority in this store (`keyfence authority init --store {}` creates one)",
            dir.display(),
            dir.display()
        )));
    }
    Ok(Arc::new(FileStore::open(dir).with_context(|| format!("cannot open store {}", dir.display()))?))
}

/// What a command did, on standard output unless its output went there.
fn report(out: &Path, what: std::fmt::Arguments<'_>) -> Result<()> {
    if is_std(out) {
        eprintln!("{what}");
        return Ok(());
    }
    outln!("{what}");
    Ok(())
}

pub fn authority(cmd: AuthorityCmd) -> Result<ExitCode> {
    match cmd {
        AuthorityCmd::Init { store: dir } => {
            if dir.exists() && !dir.is_dir() {
                return Err(exit::input(format!("{} exists and is not a directory", dir.display())));
            }
            let created = FileStore::open(&dir).with_context(|| format!("cannot create store {}", dir.display()))?;
            Authority::init(Arc::new(created))?;
            outln!("authority created in {} (master generation 1)", dir.display());
        }
        AuthorityCmd::Issue { store: dir, attrs, out } => {
            let a = Authority::open(store(&dir)?)?;
            let attrs: Attributes = attrs.parse().context("invalid --attrs")?;
            let key = a.issue(&attrs)?;
            write_private(&out, &key.to_bytes())?;
            report(&out, format_args!("issued a key for {{{attrs}}} (generations {:?})", key.generations()))?;
        }
        AuthorityCmd::Wrap { store: dir, policy, input, out } => {
            parse_policy(&policy)?;
            let mut a = Authority::open(store(&dir)?)?;
            let env = a.wrap(&policy, &read(&input)?)?;
            write_public(&out, env.to_bytes())?;
            report(&out, format_args!("wrapped under `{}` (policy key version {})", env.policy, env.key_version))?;
        }
        AuthorityCmd::Rotate { store: dir } => {
            let mut a = Authority::open(store(&dir)?)?;
            let r = a.rotate_master()?;
            outln!(
                "master generation {} is active; re-sealed {} policy key(s); {}",
                r.new_generation,
                r.resealed,
                r.retired.map_or("nothing retired".into(), |g| format!("generation {g} retired"))
            );
        }
        AuthorityCmd::RotatePolicy { store: dir, policy } => {
            parse_policy(&policy)?;
            let mut a = Authority::open(store(&dir)?)?;
            let r = a.rotate_policy_key(&policy)?;
            outln!("policy key version {}; re-wrapped {} envelope(s)", r.version, r.rewrapped);
        }
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
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn open_machine(dir: &Path, key: &Path) -> Result<Machine> {
    let store = store(dir)?;
    let key = MachineKey::from_bytes(&read(key)?).context("machine key")?;
    Ok(Machine::new(key, store, CacheConfig::default()))
}

pub fn machine(cmd: MachineCmd) -> Result<ExitCode> {
    match cmd {
        MachineCmd::Open { store: dir, key, input, out } => {
            let m = open_machine(&dir, &key)?;
            let secret = m.open(&read(&input)?).with_context(|| format!("cannot open {}", input.display()))?;
            write_private(&out, &secret)?;
        }
        MachineCmd::CouldOpen { store: dir, key, input } => {
            let m = open_machine(&dir, &key)?;
            let env = keyfence::wrap::Envelope::parse(&read(&input)?)?;
            if m.could_open(&env) {
                outln!("yes: {{{}}} satisfies `{}`", m.attributes(), env.policy);
                return Ok(ExitCode::SUCCESS);
            }
            outln!("no: this machine's attributes do not satisfy `{}`", env.policy);
            return Ok(ExitCode::from(exit::NO));
        }
    }
    Ok(ExitCode::SUCCESS)
}
