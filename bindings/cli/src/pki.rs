//! A throwaway certificate authority for `bench remote`: a CA, one server
//! certificate and one client certificate, made with AWS-LC's X.509
//! builder into a scratch directory that the bench deletes. Never for
//! production: `docs/remote.md` shows how to issue real ones.

use std::path::Path;

use anyhow::Result;
use keyfence::sign::remote::TlsFiles;
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
use openssl::x509::{X509Name, X509};

fn key() -> Result<PKey<Private>> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    Ok(PKey::from_ec_key(EcKey::generate(&group)?)?)
}

fn name(cn: &str) -> Result<X509Name> {
    let mut n = X509Name::builder()?;
    n.append_entry_by_nid(Nid::COMMONNAME, cn)?;
    Ok(n.build())
}

/// A certificate for `cn` (with `cn` as its DNS name unless it is a CA),
/// signed by `issuer` (itself when `None`).
fn cert(cn: &str, key: &PKey<Private>, issuer: Option<(&X509, &PKey<Private>)>, serial: u32) -> Result<X509> {
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let serial = BigNum::from_u32(serial)?.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    let subject = name(cn)?;
    b.set_subject_name(&subject)?;
    b.set_pubkey(key)?;
    let (from, until) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(2)?);
    b.set_not_before(&from)?;
    b.set_not_after(&until)?;
    match issuer {
        None => {
            b.set_issuer_name(&subject)?;
            let ca = BasicConstraints::new().critical().ca().build()?;
            b.append_extension(ca)?;
            b.sign(key, MessageDigest::sha256())?;
        }
        Some((ca, ca_key)) => {
            b.set_issuer_name(ca.subject_name())?;
            let san = SubjectAlternativeName::new().dns(cn).build(&b.x509v3_context(Some(ca), None))?;
            b.append_extension(san)?;
            b.sign(ca_key, MessageDigest::sha256())?;
        }
    }
    Ok(b.build())
}

/// Writes a CA and a certificate for each of `names` into `dir`; returns
/// each name's files.
pub fn make(dir: &Path, names: &[&str]) -> Result<Vec<TlsFiles>> {
    let ca_key = key()?;
    let ca = cert("keyfence bench CA", &ca_key, None, 1)?;
    let ca_path = dir.join("ca.pem");
    crate::files::create_new(&ca_path, &ca.to_pem()?)?;
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let k = key()?;
            let c = cert(n, &k, Some((&ca, &ca_key)), i as u32 + 2)?;
            let files = TlsFiles { cert: dir.join(format!("{n}.pem")), key: dir.join(format!("{n}.key")), ca: ca_path.clone() };
            crate::files::create_new(&files.cert, &c.to_pem()?)?;
            crate::files::create_new(&files.key, &zeroize::Zeroizing::new(k.private_key_to_pem_pkcs8()?))?;
            Ok(files)
        })
        .collect()
}
