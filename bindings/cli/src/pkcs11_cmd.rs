//! `keyfence pkcs11`: make a key in a PKCS#11 token, and read a token
//! key's public half (docs/pkcs11.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use keyfence::sign::pkcs11::{self, Pkcs11Settings};
use keyfence::sign::KeyKind;

use crate::exit;
use crate::files::Output;

/// `keyfence pkcs11 ...`.
#[derive(Subcommand)]
pub enum Pkcs11Cmd {
    /// Generate a key pair in the token the URI names, labelled with its
    /// `object` (and `id`): the private key sensitive and not extractable.
    /// Writes the public key (PEM).
    Keygen(KeygenArgs),
    /// Write the public key (PEM) of the token key the URI names, read
    /// from the token, for a certificate request or a client's
    /// `--public-key`.
    Public(PublicArgs),
}

/// `keyfence pkcs11 keygen`.
#[derive(Args)]
pub struct KeygenArgs {
    /// The new key's RFC 7512 URI (`pkcs11:token=edge;object=tls-p256`);
    /// module and PIN as for `keyfence sign --key`.
    #[arg(long)]
    uri: String,
    /// ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096 or ed25519.
    #[arg(long = "type")]
    kind: String,
    /// Where to write the public key (`-`: standard output).
    #[arg(long, default_value = "-")]
    out: PathBuf,
}

/// `keyfence pkcs11 public`.
#[derive(Args)]
pub struct PublicArgs {
    /// The key's RFC 7512 URI.
    #[arg(long)]
    uri: String,
    /// Where to write the public key (`-`: standard output).
    #[arg(long, default_value = "-")]
    out: PathBuf,
}

/// Runs `keyfence pkcs11 ...`.
pub fn run(cmd: Pkcs11Cmd) -> Result<ExitCode> {
    let settings = Pkcs11Settings::from_env();
    let (der, out) = match cmd {
        Pkcs11Cmd::Keygen(a) => {
            let kind = match a.kind.as_str() {
                "ec-p256" => KeyKind::EcP256,
                "ec-p384" => KeyKind::EcP384,
                "rsa-2048" => KeyKind::Rsa { bits: 2048 },
                "rsa-3072" => KeyKind::Rsa { bits: 3072 },
                "rsa-4096" => KeyKind::Rsa { bits: 4096 },
                "ed25519" => KeyKind::Ed25519,
                other => {
                    return Err(exit::input(format!(
                        "unknown key type `{other}`; known: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096, ed25519"
                    )))
                }
            };
            let out = Output::new(&a.out, &[])?;
            (pkcs11::generate(&a.uri, kind, &settings).context("generating the key in the token")?, out)
        }
        Pkcs11Cmd::Public(a) => {
            let out = Output::new(&a.out, &[])?;
            (pkcs11::load(&a.uri, &settings).context("loading the token's key")?.public_key_der()?, out)
        }
    };
    let pem = boring::pkey::PKey::public_key_from_der(&der).and_then(|k| k.public_key_to_pem()).context("encoding the public key")?;
    out.write_public(&pem)?;
    Ok(ExitCode::SUCCESS)
}
