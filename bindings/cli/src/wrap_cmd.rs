//! `keyfence authority ...` and `keyfence machine ...`: policy-key wrapping
//! on the embedded file store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use keyfence::policy::Attributes;
use keyfence::wrap::{Authority, CacheConfig, FileStore, GenerationState, Machine, MachineKey, Store};

use crate::abe_cmd::write_private;

#[derive(Subcommand)]
pub enum AuthorityCmd {
    /// Create an authority (first master generation) in a store directory.
    Init {
        /// Store directory.
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
        /// Output key file (written owner-readable only).
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
        /// The secret (e.g. a PEM private key).
        #[arg(long = "in")]
        input: PathBuf,
        /// The envelope.
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
    /// Open an envelope with a machine key.
    Open {
        /// Store directory (for the sealed policy keys).
        #[arg(long)]
        store: PathBuf,
        /// Machine key file.
        #[arg(long)]
        key: PathBuf,
        /// The envelope.
        #[arg(long = "in")]
        input: PathBuf,
        /// The secret (written owner-readable only).
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
        /// The envelope.
        #[arg(long = "in")]
        input: PathBuf,
    },
}

fn store(dir: &Path) -> Result<Arc<dyn Store>> {
    Ok(Arc::new(FileStore::open(dir).with_context(|| format!("cannot open store {}", dir.display()))?))
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))
}

pub fn authority(cmd: AuthorityCmd) -> Result<ExitCode> {
    match cmd {
        AuthorityCmd::Init { store: dir } => {
            Authority::init(store(&dir)?)?;
            println!("authority created in {} (master generation 1)", dir.display());
        }
        AuthorityCmd::Issue { store: dir, attrs, out } => {
            let a = Authority::open(store(&dir)?)?;
            let attrs: Attributes = attrs.parse().context("invalid --attrs")?;
            let key = a.issue(&attrs)?;
            write_private(&out, &key.to_bytes())?;
            println!("issued a key for {{{attrs}}} (generations {:?})", key.generations());
        }
        AuthorityCmd::Wrap { store: dir, policy, input, out } => {
            let mut a = Authority::open(store(&dir)?)?;
            let env = match a.wrap(&policy, &read(&input)?) {
                Ok(e) => e,
                Err(keyfence::wrap::WrapError::Abe(keyfence::abe::AbeError::Policy(e))) => {
                    eprintln!("{}", e.render(&policy));
                    return Ok(ExitCode::from(1));
                }
                Err(e) => return Err(e.into()),
            };
            std::fs::write(&out, env.to_bytes()).with_context(|| format!("cannot write {}", out.display()))?;
            println!("wrapped under `{}` (policy key version {})", env.policy, env.key_version);
        }
        AuthorityCmd::Rotate { store: dir } => {
            let mut a = Authority::open(store(&dir)?)?;
            let r = a.rotate_master()?;
            println!(
                "master generation {} is active; re-sealed {} policy key(s); {}",
                r.new_generation,
                r.resealed,
                r.retired.map_or("nothing retired".into(), |g| format!("generation {g} retired"))
            );
        }
        AuthorityCmd::RotatePolicy { store: dir, policy } => {
            let mut a = Authority::open(store(&dir)?)?;
            let r = a.rotate_policy_key(&policy)?;
            println!("policy key version {}; re-wrapped {} envelope(s)", r.version, r.rewrapped);
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
                println!("generation {g}: {st}");
            }
            println!("policies: {}\npolicy keys: {}\nenvelopes: {}", s.policies, s.policy_keys, s.envelopes);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn open_machine(dir: &Path, key: &Path) -> Result<Machine> {
    let key = MachineKey::from_bytes(&read(key)?).context("machine key")?;
    Ok(Machine::new(key, store(dir)?, CacheConfig::default()))
}

pub fn machine(cmd: MachineCmd) -> Result<ExitCode> {
    match cmd {
        MachineCmd::Open { store: dir, key, input, out } => {
            let m = open_machine(&dir, &key)?;
            match m.open(&read(&input)?) {
                Ok(secret) => write_private(&out, &secret)?,
                Err(e) => {
                    eprintln!("keyfence: cannot open {}: {e}", input.display());
                    return Ok(ExitCode::from(1));
                }
            }
        }
        MachineCmd::CouldOpen { store: dir, key, input } => {
            let m = open_machine(&dir, &key)?;
            let env = keyfence::wrap::Envelope::parse(&read(&input)?)?;
            if m.could_open(&env) {
                println!("yes: {{{}}} satisfies `{}`", m.attributes(), env.policy);
                return Ok(ExitCode::SUCCESS);
            }
            println!("no: this machine's attributes do not satisfy `{}`", env.policy);
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}
