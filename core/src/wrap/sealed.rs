//! A policy private key sealed under CP-ABE with its policy, for one
//! master generation: the object machines fetch and open.

use zeroize::Zeroizing;

use super::error::{malformed, Result, WrapError};
use super::format::{put16, put32, Cursor, SEALED_MAGIC, SUITE_X25519_CHACHA};
use crate::abe::{self, AbeError, AttributeKey, PublicKey};

/// Prefix of the CP-ABE plaintext, before the repeated header fields.
const CONTEXT: &[u8] = b"keyfence/v1 policy key";

/// A parsed sealed policy key.
pub(crate) struct SealedKey {
    pub(crate) policy_id: [u8; 32],
    pub(crate) version: u32,
    pub(crate) generation: u32,
    pub(crate) policy: String,
    pub(crate) public: [u8; 32],
    pub(crate) abe_ct: Vec<u8>,
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

/// Seals `private` under `policy` with generation `generation`'s key.
pub(crate) fn seal(
    abe_pk: &PublicKey,
    generation: u32,
    policy_id: &[u8; 32],
    version: u32,
    policy: &str,
    public: &[u8; 32],
    private: &[u8; 32],
) -> Result<Vec<u8>> {
    let p = keyfence_policy::parse(policy).map_err(AbeError::from)?;
    let pt = plaintext(policy_id, version, generation, public, private);
    let ct = abe::encrypt_policy(abe_pk, &p, &pt)?;
    let mut out = Vec::with_capacity(60 + policy.len() + ct.len());
    out.extend_from_slice(SEALED_MAGIC);
    out.extend_from_slice(&SUITE_X25519_CHACHA.to_le_bytes());
    out.extend_from_slice(policy_id);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    put16(&mut out, policy.as_bytes())?;
    put16(&mut out, public)?;
    put32(&mut out, &ct)?;
    Ok(out)
}

impl SealedKey {
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self> {
        const O: &str = "sealed policy key";
        let mut c = Cursor::new(bytes, O, SEALED_MAGIC)?;
        c.suite()?;
        let policy_id = c.array("policy id")?;
        let version = c.u32("key version")?;
        let generation = c.u32("generation")?;
        let policy = c.text16("policy")?.to_owned();
        let public: [u8; 32] = c.bytes16("public key")?.try_into().map_err(|_| malformed(O, "public key is not 32 bytes"))?;
        let abe_ct = c.bytes32("CP-ABE ciphertext")?.to_vec();
        c.finish()?;
        if policy_id != super::format::policy_id(&policy) {
            return Err(malformed(O, "policy id does not match the policy"));
        }
        Ok(Self { policy_id, version, generation, policy, public, abe_ct })
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
        // The CP-ABE policy must be the one the header names.
        if abe::policy_of(&self.abe_ct).map(|p| p.to_string()).ok().as_deref() != Some(self.policy.as_str()) {
            return Err(tampered());
        }
        Ok(private)
    }
}
