//! A policy private key sealed under CP-ABE with its policy, for one
//! master generation: the object machines fetch and open.

use zeroize::Zeroizing;

use super::error::{codec, malformed, Result, WrapError};
use super::format::{check_policy, check_signed, reader, suite, writer, SEALED_EXCLUDING_MAGIC, SEALED_MAGIC, SUITE_X25519_CHACHA};
use super::policy::{policy_id, CanonicalPolicy};
use super::revocation;
use super::signing::{AuthorityKey, SEALED_CONTEXT, SIGNATURE_LEN};
use crate::abe::{self, AbeError, AttributeKey, PublicKey};

/// Prefix of the CP-ABE plaintext, before the repeated header fields.
const CONTEXT: &[u8] = b"keyfence/v2 policy key";

/// A parsed sealed policy key.
pub(crate) struct SealedKey {
    pub(crate) authority: [u8; 32],
    pub(crate) policy_id: [u8; 32],
    pub(crate) version: u32,
    pub(crate) generation: u32,
    pub(crate) policy: String,
    /// Revoked machine ids the CP-ABE policy excludes
    /// (`policy and not machine: ID ...`), sorted; empty in a `KFP2` copy.
    pub(crate) excluded: Vec<String>,
    pub(crate) public: [u8; 32],
    pub(crate) abe_ct: Vec<u8>,
    /// Everything before the signature, and the signature.
    signed: Vec<u8>,
    signature: [u8; SIGNATURE_LEN],
}

fn plaintext(policy_id: &[u8; 32], version: u32, generation: u32, public: &[u8; 32], private: &[u8; 32]) -> Zeroizing<Vec<u8>> {
    let mut p = Zeroizing::new(Vec::with_capacity(CONTEXT.len() + 104));
    p.extend_from_slice(CONTEXT);
    p.extend_from_slice(policy_id);
    p.extend_from_slice(&version.to_le_bytes());
    p.extend_from_slice(&generation.to_le_bytes());
    p.extend_from_slice(public);
    p.extend_from_slice(private);
    p
}

/// Seals `private` under `policy` with generation `generation`'s key, so
/// that none of the `excluded` machine ids (sorted) can open it, and signs
/// the result with `signer`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn seal(
    signer: &AuthorityKey, abe_pk: &PublicKey, generation: u32, policy: &CanonicalPolicy, version: u32, public: &[u8; 32],
    private: &[u8; 32], excluded: &[String],
) -> Result<Zeroizing<Vec<u8>>> {
    check_policy(policy)?;
    let pt = plaintext(policy.id(), version, generation, public, private);
    let sealing = revocation::restricted(policy, excluded)?;
    // The policy goes in already parsed.
    let ct = abe::encrypt_policy(abe_pk, sealing.circuit(), &pt)?;
    let mut bytes = unsigned(&signer.public(), policy.id(), version, generation, policy.as_bytes(), excluded, public, &ct);
    let signature = signer.sign(SEALED_CONTEXT, &bytes);
    bytes.extend_from_slice(&signature);
    Ok(bytes)
}

/// What a sealed copy's signature covers: `KFP2` when it excludes no
/// machine, else `KFP3` with the excluded ids.
#[allow(clippy::too_many_arguments)]
fn unsigned(
    authority: &[u8; 32], policy_id: &[u8; 32], version: u32, generation: u32, policy: &[u8], excluded: &[String], public: &[u8; 32],
    abe_ct: &[u8],
) -> Zeroizing<Vec<u8>> {
    let mut w = writer(if excluded.is_empty() { SEALED_MAGIC } else { SEALED_EXCLUDING_MAGIC });
    w.u16(SUITE_X25519_CHACHA).raw(authority).raw(policy_id).u32(version).u32(generation);
    w.bytes16(policy);
    if !excluded.is_empty() {
        // Ids are checked (at most 64 bytes) before they are revoked; the
        // CP-ABE policy already bounds their number.
        w.len16(excluded.len());
        for id in excluded {
            w.bytes16(id.as_bytes());
        }
    }
    // The policy was checked; a CP-ABE ciphertext under a policy the
    // parser accepts is far below 4 GiB.
    w.bytes16(public).bytes32(abe_ct);
    w.into_bytes()
}

impl SealedKey {
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self> {
        const O: &str = "sealed policy key";
        let excluding = bytes.starts_with(SEALED_EXCLUDING_MAGIC);
        let mut r = reader(bytes, O, if excluding { SEALED_EXCLUDING_MAGIC } else { SEALED_MAGIC })?;
        suite(&mut r, O)?;
        let authority = r.array("authority key").map_err(codec(O))?;
        let policy_id = r.array("policy id").map_err(codec(O))?;
        let version = r.u32("key version").map_err(codec(O))?;
        let generation = r.u32("generation").map_err(codec(O))?;
        let policy = r.text16("policy").map_err(codec(O))?.to_owned();
        let mut excluded: Vec<String> = Vec::new();
        if excluding {
            let n = r.u16("excluded count").map_err(codec(O))?;
            if n == 0 {
                return Err(malformed(O, "a KFP3 copy excludes at least one machine (KFP2 excludes none)"));
            }
            for i in 0..n {
                let id = r.text16(|| format!("excluded[{i}]")).map_err(codec(O))?;
                // Sorted and unique: one sealing, one encoding.
                if excluded.last().is_some_and(|p| p.as_str() >= id) {
                    return Err(malformed(O, format!("excluded id {id:?} is out of order or repeated")));
                }
                excluded.push(id.to_owned());
            }
        }
        let public: [u8; 32] =
            r.bytes16("public key").map_err(codec(O))?.try_into().map_err(|_| malformed(O, "public key is not 32 bytes"))?;
        let abe_ct = r.bytes32("CP-ABE ciphertext").map_err(codec(O))?.to_vec();
        let signed = bytes[..bytes.len() - r.remaining()].to_vec();
        let signature = r.array("signature").map_err(codec(O))?;
        r.finish().map_err(codec(O))?;
        // The machine already holds the envelope's parsed policy and checks
        // this id against it, so the text is not parsed again here.
        if policy_id != self::policy_id(&policy) {
            return Err(malformed(O, "policy id does not match the policy"));
        }
        Ok(Self { authority, policy_id, version, generation, policy, excluded, public, abe_ct, signed, signature })
    }

    /// The copy written again from what was read (for the fuzzers: one
    /// copy, one encoding).
    #[cfg(feature = "testing")]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = unsigned(
            &self.authority,
            &self.policy_id,
            self.version,
            self.generation,
            self.policy.as_bytes(),
            &self.excluded,
            &self.public,
            &self.abe_ct,
        );
        bytes.extend_from_slice(&self.signature);
        bytes.to_vec()
    }

    /// Checks that the authority whose public key is `trusted` made this
    /// sealed key, before any CP-ABE work: a forged ciphertext never
    /// reaches the decryption.
    ///
    /// # Errors
    /// [`WrapError::WrongAuthority`], [`WrapError::Tampered`].
    pub(crate) fn verify(&self, trusted: &[u8; 32]) -> Result<()> {
        check_signed("sealed policy key", SEALED_CONTEXT, trusted, &self.authority, &self.signed, &self.signature)
    }

    /// Opens with a machine's attribute key for this generation, checking
    /// that the sealed context matches the header and the key pair.
    pub(crate) fn open(&self, key: &AttributeKey) -> Result<Zeroizing<[u8; 32]>> {
        let tampered = || WrapError::Tampered { object: "sealed policy key" };
        let pt = match abe::decrypt(key, &self.abe_ct) {
            Ok(pt) => pt,
            Err(AbeError::NotSatisfied) => return Err(WrapError::NotAuthorized { policy: self.policy.clone() }),
            Err(_) => return Err(tampered()),
        };
        if pt.len() != CONTEXT.len() + 104 {
            return Err(tampered());
        }
        let mut private = Zeroizing::new([0u8; 32]);
        private.copy_from_slice(&pt[pt.len() - 32..]);
        let expect = plaintext(&self.policy_id, self.version, self.generation, &self.public, &private);
        let ok: bool = subtle::ConstantTimeEq::ct_eq(&expect[..], &pt[..]).into();
        if !ok || super::hpke::public_of(&private)? != self.public {
            return Err(tampered());
        }
        // The CP-ABE policy must be the one the header names, with the
        // negations of the machines it excludes.
        let expect = if self.excluded.is_empty() {
            self.policy.clone()
        } else {
            let header = CanonicalPolicy::parse(&self.policy).map_err(|_| tampered())?;
            revocation::restricted(&header, &self.excluded).map_err(|_| tampered())?.as_str().to_owned()
        };
        if abe::policy_of(&self.abe_ct).map(|p| p.to_string()).ok().as_deref() != Some(expect.as_str()) {
            return Err(tampered());
        }
        Ok(private)
    }
}
