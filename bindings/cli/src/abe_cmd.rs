//! `keyfence abe ...`: CP-ABE on files in CIRCL's formats.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use keyfence::abe;
use keyfence::policy::Attributes;

use crate::exit::{self, Exit};
use crate::files::{create_private_dir, outln, read, read_secret, Output};

#[derive(Subcommand)]
pub enum AbeCmd {
    /// Create an authority: writes DIR/pk.bin and DIR/msk.bin (the master
    /// secret key, mode 600). Refuses to replace an existing msk.bin
    /// unless --force: every key issued from it would be orphaned.
    Setup {
        /// Output directory (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing master secret key.
        #[arg(long)]
        force: bool,
    },
    /// Issue an attribute key (a secret, written mode 600).
    Keygen {
        /// Master secret key file (`-`: standard input).
        #[arg(long)]
        msk: PathBuf,
        /// Attributes, label=value,label=value (docs/policy-language.md).
        #[arg(long)]
        attrs: String,
        /// Output key file (`-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Encrypt a file under a policy.
    Encrypt {
        /// Public key file.
        #[arg(long)]
        pk: PathBuf,
        /// The policy, e.g. 'region: EU and not country: FR'
        /// (docs/policy-language.md).
        #[arg(long)]
        policy: String,
        /// Plaintext file (`-`: standard input).
        #[arg(long = "in")]
        input: PathBuf,
        /// Ciphertext output (`-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Decrypt a file with an attribute key. Exits 1 if the key's
    /// attributes do not satisfy the policy, 2 if the ciphertext or key is
    /// malformed.
    Decrypt {
        /// Attribute key file.
        #[arg(long)]
        key: PathBuf,
        /// Ciphertext file (`-`: standard input).
        #[arg(long = "in")]
        input: PathBuf,
        /// Plaintext output, mode 600 (`-`: standard output).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a ciphertext's policy.
    Inspect {
        /// Ciphertext file (`-`: standard input); or give it as --in.
        #[arg(required_unless_present = "input", conflicts_with = "input")]
        file: Option<PathBuf>,
        /// Ciphertext file (`-`: standard input).
        #[arg(long = "in")]
        input: Option<PathBuf>,
    },
}

/// Parses a policy, printing the error with its caret (exit 2).
pub fn parse_policy(policy: &str) -> Result<keyfence::policy::Policy> {
    keyfence::policy::parse(policy).map_err(|e| {
        eprintln!("{}", e.render(policy));
        Exit::Reported(exit::INPUT).into()
    })
}

pub fn run(cmd: AbeCmd) -> Result<ExitCode> {
    match cmd {
        AbeCmd::Setup { out, force } => {
            let msk_path = out.join("msk.bin");
            // A device or a FIFO where msk.bin goes holds no key to orphan.
            if !force && std::fs::metadata(&msk_path).is_ok_and(|m| m.is_file()) {
                return Err(exit::input(format!(
                    "{} already exists: replacing it would orphan every key issued from it (use --force to replace it)",
                    msk_path.display()
                )));
            }
            // --force is about msk.bin; a master key found where pk.bin goes
            // (a copy, a link) is never replaced.
            let pk_out = Output::new(&out.join("pk.bin"), &[])?;
            let msk_out = if force { Output::replacing_master_key(&msk_path, &[])? } else { Output::new(&msk_path, &[])? };
            create_private_dir(&out)?;
            let (pk, msk) = abe::setup()?;
            pk_out.write_public(&pk.to_bytes())?;
            msk_out.write_private(&msk.to_bytes())?;
            if pk_out.is_std() || msk_out.is_std() {
                eprintln!("wrote {} and {}", pk_out.path().display(), msk_path.display());
            } else {
                outln!("wrote {} and {}", pk_out.path().display(), msk_path.display());
            }
        }
        AbeCmd::Keygen { msk, attrs, out } => {
            let out = Output::new(&out, &[&msk])?;
            let msk = abe::MasterSecretKey::from_bytes(&read_secret(&msk)?).context("master secret key")?;
            let attrs: Attributes = attrs.parse().context("invalid --attrs")?;
            let key = abe::keygen(&msk, &attrs)?;
            out.write_private(&key.to_bytes())?;
        }
        AbeCmd::Encrypt { pk, policy, input, out } => {
            let out = Output::new(&out, &[&pk, &input])?;
            let pk = abe::PublicKey::from_bytes(&read(&pk)?).context("public key")?;
            let p = parse_policy(&policy)?;
            let ct = abe::encrypt_policy(&pk, &p, &read(&input)?)?;
            out.write_public(&ct)?;
        }
        AbeCmd::Decrypt { key, input, out } => {
            let out = Output::new(&out, &[&key, &input])?;
            let key = abe::AttributeKey::from_bytes(&read_secret(&key)?).context("attribute key")?;
            let pt = abe::decrypt(&key, &read(&input)?).with_context(|| format!("cannot decrypt {}", input.display()))?;
            out.write_private(&pt)?;
        }
        AbeCmd::Inspect { file, input } => {
            let Some(file) = input.or(file) else {
                return Err(exit::input("abe inspect needs a ciphertext: FILE or --in FILE"));
            };
            let p = abe::policy_of(&read(&file)?).with_context(|| format!("{}", file.display()))?;
            outln!("{p}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
