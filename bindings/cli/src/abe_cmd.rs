//! `keyfence abe ...`: CP-ABE on files in CIRCL's formats.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use keyfence::abe;
use keyfence::policy::Attributes;

#[derive(Subcommand)]
pub enum AbeCmd {
    /// Create an authority: writes DIR/pk.bin and DIR/msk.bin.
    Setup {
        /// Output directory (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue an attribute key.
    Keygen {
        /// Master secret key file.
        #[arg(long)]
        msk: PathBuf,
        /// Attributes, label=value,label=value.
        #[arg(long)]
        attrs: String,
        /// Output key file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Encrypt a file under a policy.
    Encrypt {
        /// Public key file.
        #[arg(long)]
        pk: PathBuf,
        /// The policy, e.g. 'region: EU and not country: FR'.
        #[arg(long)]
        policy: String,
        /// Plaintext file.
        #[arg(long = "in")]
        input: PathBuf,
        /// Ciphertext output.
        #[arg(long)]
        out: PathBuf,
    },
    /// Decrypt a file with an attribute key.
    Decrypt {
        /// Attribute key file.
        #[arg(long)]
        key: PathBuf,
        /// Ciphertext file.
        #[arg(long = "in")]
        input: PathBuf,
        /// Plaintext output.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a ciphertext's policy.
    Inspect {
        /// Ciphertext file.
        file: PathBuf,
    },
}

fn read(p: &Path) -> Result<Vec<u8>> {
    fs::read(p).with_context(|| format!("cannot read {}", p.display()))
}

/// Writes secrets owner-readable only.
pub fn write_private(p: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    o.mode(0o600);
    let mut f = o.open(p).with_context(|| format!("cannot write {}", p.display()))?;
    f.write_all(data).with_context(|| format!("cannot write {}", p.display()))
}

pub fn run(cmd: AbeCmd) -> Result<ExitCode> {
    match cmd {
        AbeCmd::Setup { out } => {
            fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
            let (pk, msk) = abe::setup()?;
            fs::write(out.join("pk.bin"), pk.to_bytes())?;
            write_private(&out.join("msk.bin"), &msk.to_bytes())?;
            println!("wrote {} and {}", out.join("pk.bin").display(), out.join("msk.bin").display());
        }
        AbeCmd::Keygen { msk, attrs, out } => {
            let msk = abe::MasterSecretKey::from_bytes(&read(&msk)?).context("master secret key")?;
            let attrs: Attributes = attrs.parse().context("invalid --attrs")?;
            let key = abe::keygen(&msk, &attrs)?;
            write_private(&out, &key.to_bytes())?;
        }
        AbeCmd::Encrypt { pk, policy, input, out } => {
            let pk = abe::PublicKey::from_bytes(&read(&pk)?).context("public key")?;
            let p = match keyfence::policy::parse(&policy) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{}", e.render(&policy));
                    return Ok(ExitCode::from(1));
                }
            };
            let ct = abe::encrypt_policy(&pk, &p, &read(&input)?)?;
            fs::write(&out, ct).with_context(|| format!("cannot write {}", out.display()))?;
        }
        AbeCmd::Decrypt { key, input, out } => {
            let key = abe::AttributeKey::from_bytes(&read(&key)?).context("attribute key")?;
            match abe::decrypt(&key, &read(&input)?) {
                Ok(pt) => write_private(&out, &pt)?,
                Err(e) => {
                    eprintln!("keyfence: cannot decrypt {}: {e}", input.display());
                    return Ok(ExitCode::from(1));
                }
            }
        }
        AbeCmd::Inspect { file } => {
            let p = abe::policy_of(&read(&file)?).with_context(|| format!("{}", file.display()))?;
            println!("{p}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
