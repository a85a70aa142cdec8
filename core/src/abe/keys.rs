//! The keys of the scheme and their CIRCL encodings.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use blstrs::{G1Affine, G1Projective, G2Affine, Gt, Scalar};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use super::error::{codec, malformed, Result};
use super::group::{self, Wiped};
use super::matrix::{self, Mat, SecretMat};
use crate::codec::{Order, Reader, Writer};

/// The authority's public key: what encryptors need.
///
/// Encoded as CIRCL's `tkn20.PublicKey`; [`PublicKey::from_bytes`] checks
/// every point is on its curve and in its subgroup.
#[derive(Clone)]
pub struct PublicKey {
    pub(crate) b2: Mat<G2Affine>,
    pub(crate) wb1: Mat<G1Affine>,
    pub(crate) btk: Mat<Gt>,
    /// Fixed-base tables (about 2.2 MB), built on the first encryption.
    pub(crate) tables: std::sync::Arc<OnceLock<super::fixed_base::PublicTables>>,
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.b2 == other.b2 && self.wb1 == other.wb1 && self.btk == other.btk
    }
}

impl Eq for PublicKey {}

impl PublicKey {
    pub(crate) fn new(b2: Mat<G2Affine>, wb1: Mat<G1Affine>, btk: Mat<Gt>) -> Self {
        Self { b2, wb1, btk, tables: Default::default() }
    }

    pub(crate) fn tables(&self) -> &super::fixed_base::PublicTables {
        self.tables.get_or_init(|| super::fixed_base::PublicTables::new(&self.b2.e, &self.btk.e))
    }
}

impl PublicKey {
    /// The CIRCL encoding of the key.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Matrices of fixed small shape always fit a u16 length.
        let mut w = Writer::new(Order::Little);
        w.bytes16(&matrix::encode_g2(&self.b2)).bytes16(&matrix::encode_g1(&self.wb1)).bytes16(&matrix::encode_gt(&self.btk));
        w.into_bytes().to_vec()
    }

    /// Decodes a public key.
    ///
    /// # Errors
    /// [`super::AbeError::Malformed`] naming the field that is truncated,
    /// of the wrong shape, or not a valid group element.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const O: &str = "public key";
        let e = codec(O);
        let mut r = Reader::new(bytes, Order::Little);
        let b2 = matrix::decode_g2(r.bytes16("b2").map_err(&e)?, (4, 2), O, "b2")?;
        let wb1 = matrix::decode_g1(r.bytes16("wb1").map_err(&e)?, (3, 2), O, "wb1")?;
        let btk = matrix::decode_gt(r.bytes16("btk").map_err(&e)?, (2, 1), O, "btk")?;
        r.finish().map_err(&e)?;
        Ok(Self::new(b2, wb1, btk))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PublicKey { .. }")
    }
}

/// The authority's master secret key: issues attribute keys.
///
/// Wiped from memory when dropped; compared in constant time; its `Debug`
/// output shows nothing of it.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MasterSecretKey {
    pub(crate) a: SecretMat,
    pub(crate) wta: SecretMat,
    pub(crate) bstar: SecretMat,
    pub(crate) bstar12: SecretMat,
    pub(crate) k: SecretMat,
    pub(crate) prf_key: Vec<u8>,
}

impl MasterSecretKey {
    /// The CIRCL encoding of the key, in a buffer wiped on drop.
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        // Fixed shapes, and a prf key of at most 64 bytes (checked when
        // built or decoded): every field fits its u16 length.
        let mut w = Writer::new(Order::Little);
        for m in [&self.a, &self.wta, &self.bstar, &self.bstar12, &self.k] {
            let mut plain = m.map(|w| w.0);
            let enc = Zeroizing::new(matrix::encode_zp(&plain));
            plain.wipe();
            w.bytes16(&enc);
        }
        // CIRCL's prf key is 16 bytes; a longer one still round-trips.
        w.bytes16(&self.prf_key);
        w.into_bytes()
    }

    /// Decodes a master secret key.
    ///
    /// # Errors
    /// [`super::AbeError::Malformed`] naming the field at fault.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const O: &str = "master secret key";
        let e = codec(O);
        let mut r = Reader::new(bytes, Order::Little);
        let mut m = |name: &'static str, shape| -> Result<SecretMat> {
            let b = r.bytes16(name).map_err(&e)?;
            let z = matrix::decode_zp(b, shape, O, name)?;
            Ok(SecretMat::secret(&z))
        };
        let a = m("a", (3, 2))?;
        let wta = m("wtA", (4, 2))?;
        let bstar = m("bstar", (4, 2))?;
        let bstar12 = m("bstar12", (4, 2))?;
        let k = m("k", (4, 1))?;
        let prf_key = r.bytes16("prfKey").map_err(&e)?.to_vec();
        if prf_key.is_empty() || prf_key.len() > 64 {
            return Err(malformed(O, "prfKey", "must be 1 to 64 bytes (BLAKE2b key)"));
        }
        r.finish().map_err(&e)?;
        Ok(Self { a, wta, bstar, bstar12, k, prf_key })
    }
}

impl PartialEq for MasterSecretKey {
    /// Constant time in the key material.
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes().ct_eq(&other.to_bytes()).into()
    }
}

impl Eq for MasterSecretKey {}

impl fmt::Debug for MasterSecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterSecretKey { .. }")
    }
}

/// One attribute as a key holds it: the hashed value, or a wildcard (used
/// by the Boneh-Katz transform's internal attribute).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyAttr {
    pub(crate) wild: bool,
    pub(crate) value: Scalar,
}

/// A machine's attribute key: decrypts ciphertexts whose policy its
/// attributes satisfy.
///
/// The key stores its attribute values only as hashes (CIRCL's format), so
/// it can name its labels but not their values. Key material is wiped on
/// drop, compared in constant time and never shown by `Debug`.
#[derive(Clone)]
pub struct AttributeKey {
    pub(crate) attrs: BTreeMap<String, KeyAttr>,
    pub(crate) k1: Mat<Wiped<G2Affine>>,
    pub(crate) k2: Mat<Wiped<G1Affine>>,
    pub(crate) k3: BTreeMap<String, Mat<Wiped<G1Affine>>>,
    pub(crate) k3wild: BTreeMap<String, Mat<Wiped<G1Affine>>>,
    /// Precomputed for decryption (about 450 KB: k1's lines and the
    /// Boneh-Katz tables), shared with clones.
    pub(crate) cache: std::sync::Arc<OnceLock<super::key_cache::KeyCache>>,
}

impl AttributeKey {
    /// The labels this key holds (values are stored hashed and cannot be
    /// listed), without the internal Boneh-Katz label.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.attrs.keys().map(String::as_str).filter(|l| *l != keyfence_policy_bk_label())
    }

    /// The CIRCL encoding of the key, in a buffer wiped on drop.
    ///
    /// Cannot fail: `keygen` and [`AttributeKey::from_bytes`] refuse any
    /// key whose fields would not fit their length prefixes.
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut w = Writer::new(Order::Little);
        w.bytes16(&self.attribute_block());
        w.bytes16(&secret_g2(&self.k1));
        w.bytes16(&secret_g1(&self.k2));
        for map in [&self.k3, &self.k3wild] {
            w.len16(map.len());
            for (label, m) in map {
                w.bytes16(label.as_bytes());
                w.bytes16(&secret_g1(m));
            }
        }
        w.into_bytes()
    }

    /// The `attributes` field: count, then label, wildcard flag and hashed
    /// value of each attribute.
    fn attribute_block(&self) -> Zeroizing<Vec<u8>> {
        let mut w = Writer::new(Order::Little);
        w.len16(self.attrs.len());
        for (label, a) in &self.attrs {
            w.bytes16(label.as_bytes()).u8(u8::from(a.wild)).raw(&a.value.to_bytes_be());
        }
        w.into_bytes()
    }

    /// Bytes of the `attributes` field for these labels (the Boneh-Katz
    /// attribute included), which must fit its 16-bit length.
    pub(crate) fn attribute_block_len<'a>(labels: impl Iterator<Item = &'a str>) -> usize {
        2 + labels.map(|l| 2 + l.len() + 1 + 32).sum::<usize>()
    }

    /// Decodes an attribute key. Its G2 points are checked to be in G2;
    /// its G1 points to be on the curve and not the identity, not to be
    /// in G1, which decryption does not need (docs/abe.md, "Subgroup
    /// checks").
    ///
    /// Labels must come sorted and each once, as CIRCL and
    /// [`AttributeKey::to_bytes`] write them: one key, one encoding.
    ///
    /// # Errors
    /// [`super::AbeError::Malformed`] naming the field at fault: truncated,
    /// wrong shape, invalid point, a label out of order or repeated, or
    /// trailing bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const O: &str = "attribute key";
        let e = codec(O);
        let mut r = Reader::new(bytes, Order::Little);
        let attr_bytes = r.bytes16("attributes").map_err(&e)?;
        let mut ar = Reader::new(attr_bytes, Order::Little);
        let n = ar.u16("attributes.count").map_err(&e)?;
        let mut attrs = BTreeMap::new();
        for i in 0..n {
            let label_bytes = ar.bytes16(|| format!("attributes[{i}].label")).map_err(&e)?;
            let label = utf8(label_bytes, O, &format!("attributes[{i}].label"))?;
            let wild = match ar.u8(|| format!("attributes[{i}].wild")).map_err(&e)? {
                0 => false,
                1 => true,
                _ => return Err(malformed(O, format!("attributes[{i}].wild"), "must be 0 or 1")),
            };
            let v = ar.take(32, || format!("attributes[{i}].value")).map_err(&e)?;
            let value = group::scalar_from_be(v)
                .ok_or_else(|| malformed(O, format!("attributes[{i}].value"), "scalar is not below the group order"))?;
            if attrs.last_key_value().is_some_and(|(p, _)| *p >= label) {
                return Err(malformed(O, format!("attributes[{i}].label"), "label out of order or repeated"));
            }
            attrs.insert(label, KeyAttr { wild, value });
        }
        ar.finish_as("attributes").map_err(&e)?;
        let k1 = matrix::decode_g2(r.bytes16("k1").map_err(&e)?, (3, 1), O, "k1")?.map(Wiped);
        // The key's G1 points are checked to be on the curve, not in G1:
        // decryption only pairs them (through sums) with the ciphertext's
        // G2 points, which it checks, so a component outside G1 changes no
        // result (docs/abe.md, "Subgroup checks"). Those checks were most
        // of the cost of loading a 50-attribute key.
        let k2 = matrix::decode_g1_on_curve(r.bytes16("k2").map_err(&e)?, (4, 1), O, "k2")?.map(Wiped);
        let mut maps = [BTreeMap::new(), BTreeMap::new()];
        for (which, map) in ["k3", "k3wild"].iter().zip(maps.iter_mut()) {
            let n = r.u16(|| format!("{which}.count")).map_err(&e)?;
            for i in 0..n {
                let label_bytes = r.bytes16(|| format!("{which}[{i}].label")).map_err(&e)?;
                let label = utf8(label_bytes, O, &format!("{which}[{i}].label"))?;
                let m = r.bytes16(|| format!("{which}[{i}]")).map_err(&e)?;
                if map.last_key_value().is_some_and(|(p, _)| *p >= label) {
                    return Err(malformed(O, format!("{which}[{i}].label"), "label out of order or repeated"));
                }
                let m = matrix::decode_g1_on_curve(m, (4, 1), O, &format!("{which}[{i}]"))?;
                map.insert(label, m.map(Wiped));
            }
        }
        r.finish().map_err(&e)?;
        let [k3, k3wild] = maps;
        for (label, a) in &attrs {
            if !k3.contains_key(label) || (a.wild && !k3wild.contains_key(label)) {
                return Err(super::error::malformed(O, format!("k3[{label:?}]"), "missing key material for an attribute"));
            }
        }
        let key = Self { attrs, k1, k2, k3, k3wild, cache: Default::default() };
        // A decoded key is a loaded key: compute its lines now, not in the
        // middle of its first decryption.
        key.cache();
        Ok(key)
    }
}

pub(crate) fn keyfence_policy_bk_label() -> &'static str {
    super::policy::BK_LABEL
}

fn utf8(b: &[u8], object: &'static str, field: &str) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|_| super::error::malformed(object, field, "not UTF-8"))
}

impl PartialEq for AttributeKey {
    /// Constant time in the key material.
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes().ct_eq(&other.to_bytes()).into()
    }
}

impl Eq for AttributeKey {}

impl AttributeKey {
    /// The key's precomputed values, built on first use.
    pub(crate) fn cache(&self) -> &super::key_cache::KeyCache {
        self.cache.get_or_init(|| super::key_cache::KeyCache::new(self.k1.e.iter().map(|q| &q.0)))
    }

    /// `id` times each of the Boneh-Katz attribute's `k3` points, from the
    /// cache's tables (from the key's second decryption on); `None` when
    /// the caller should multiply without them.
    pub(crate) fn bk_times(&self, id: &Scalar) -> Option<Vec<G1Projective>> {
        let points = || self.k3.get(super::policy::BK_LABEL).map(|m| m.e.iter().map(|p| &p.0).collect());
        self.cache().bk_times(points, id)
    }

    /// Overwrites the key material: `k1`, `k2` and every `k3`. The hashed
    /// attribute values stay (they are hashes of public labels' values,
    /// and `blstrs` scalars in a map cannot be wiped without taking them
    /// out first).
    pub(crate) fn wipe(&mut self) {
        self.k1.zeroize();
        self.k2.zeroize();
        for m in self.k3.values_mut().chain(self.k3wild.values_mut()) {
            m.zeroize();
        }
        // The cache (secret too) is wiped when its last holder lets go.
        self.cache = Default::default();
    }
}

impl Drop for AttributeKey {
    fn drop(&mut self) {
        self.wipe();
    }
}

/// The encoding of secret points, through a plain temporary that is wiped.
fn secret_g1(m: &Mat<Wiped<G1Affine>>) -> Zeroizing<Vec<u8>> {
    let mut plain = m.map(|w| w.0);
    let enc = Zeroizing::new(matrix::encode_g1(&plain));
    plain.wipe();
    enc
}

fn secret_g2(m: &Mat<Wiped<G2Affine>>) -> Zeroizing<Vec<u8>> {
    let mut plain = m.map(|w| w.0);
    let enc = Zeroizing::new(matrix::encode_g2(&plain));
    plain.wipe();
    enc
}

impl fmt::Debug for AttributeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttributeKey").field("labels", &self.labels().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}
