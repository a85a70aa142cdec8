//! The keys of the scheme and their CIRCL encodings.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use blstrs::{G1Affine, G2Affine, Gt, Scalar};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use super::encoding::{put_bytes16, put_u16, Reader};
use super::error::Result;
use super::group::{self, Wiped};
use super::matrix::{self, Mat, SecretMat};

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
        self.tables.get_or_init(|| super::fixed_base::PublicTables::new(self))
    }
}

impl PublicKey {
    /// The CIRCL encoding of the key.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Matrices of fixed small shape always fit a u16 length.
        let _ = put_bytes16(&mut out, &matrix::encode_g2(&self.b2), "b2");
        let _ = put_bytes16(&mut out, &matrix::encode_g1(&self.wb1), "wb1");
        let _ = put_bytes16(&mut out, &matrix::encode_gt(&self.btk), "btk");
        out
    }

    /// Decodes a public key.
    ///
    /// # Errors
    /// [`super::AbeError::Malformed`] naming the field that is truncated,
    /// of the wrong shape, or not a valid group element.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const O: &str = "public key";
        let mut r = Reader::new(bytes, O);
        let b2 = matrix::decode_g2(r.bytes16(&|| "b2".into())?, (4, 2), O, "b2")?;
        let wb1 = matrix::decode_g1(r.bytes16(&|| "wb1".into())?, (3, 2), O, "wb1")?;
        let btk = matrix::decode_gt(r.bytes16(&|| "btk".into())?, (2, 1), O, "btk")?;
        r.finish("end")?;
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
        let mut out = Zeroizing::new(Vec::new());
        for m in [&self.a, &self.wta, &self.bstar, &self.bstar12, &self.k] {
            let enc = Zeroizing::new(matrix::encode_zp(&m.map(|w| w.0)));
            let _ = put_bytes16(&mut out, &enc, "matrix");
        }
        // CIRCL's prf key is 16 bytes; a longer one still round-trips.
        let _ = put_bytes16(&mut out, &self.prf_key, "prf key");
        out
    }

    /// Decodes a master secret key.
    ///
    /// # Errors
    /// [`super::AbeError::Malformed`] naming the field at fault.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const O: &str = "master secret key";
        let mut r = Reader::new(bytes, O);
        let mut m = |name: &'static str, shape| -> Result<SecretMat> {
            let b = r.bytes16(&|| name.into())?;
            let z = matrix::decode_zp(b, shape, O, name)?;
            Ok(SecretMat::secret(&z))
        };
        let a = m("a", (3, 2))?;
        let wta = m("wtA", (4, 2))?;
        let bstar = m("bstar", (4, 2))?;
        let bstar12 = m("bstar12", (4, 2))?;
        let k = m("k", (4, 1))?;
        let prf_key = r.bytes16(&|| "prfKey".into())?.to_vec();
        if prf_key.is_empty() || prf_key.len() > 64 {
            return Err(r.err("prfKey", "must be 1 to 64 bytes (BLAKE2b key)"));
        }
        r.finish("end")?;
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
    pub(crate) k1: Mat<G2Affine>,
    pub(crate) k2: Mat<Wiped<G1Affine>>,
    pub(crate) k3: BTreeMap<String, Mat<Wiped<G1Affine>>>,
    pub(crate) k3wild: BTreeMap<String, Mat<Wiped<G1Affine>>>,
}

impl AttributeKey {
    /// The labels this key holds (values are stored hashed and cannot be
    /// listed), without the internal Boneh-Katz label.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.attrs
            .keys()
            .map(String::as_str)
            .filter(|l| *l != keyfence_policy_bk_label())
    }

    /// The CIRCL encoding of the key, in a buffer wiped on drop.
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(Vec::new());
        let mut attrs = Vec::new();
        let _ = put_u16(&mut attrs, self.attrs.len(), "attribute count");
        for (label, a) in &self.attrs {
            let _ = put_bytes16(&mut attrs, label.as_bytes(), "label");
            attrs.push(u8::from(a.wild));
            attrs.extend_from_slice(&a.value.to_bytes_be());
        }
        let _ = put_bytes16(&mut out, &attrs, "attributes");
        let _ = put_bytes16(&mut out, &matrix::encode_g2(&self.k1), "k1");
        let k2 = Zeroizing::new(matrix::encode_g1(&self.k2.map(|w| w.0)));
        let _ = put_bytes16(&mut out, &k2, "k2");
        for map in [&self.k3, &self.k3wild] {
            let _ = put_u16(&mut out, map.len(), "k3 count");
            for (label, m) in map {
                let _ = put_bytes16(&mut out, label.as_bytes(), "label");
                let enc = Zeroizing::new(matrix::encode_g1(&m.map(|w| w.0)));
                let _ = put_bytes16(&mut out, &enc, "k3");
            }
        }
        out
    }

    /// Decodes an attribute key.
    ///
    /// # Errors
    /// [`super::AbeError::Malformed`] naming the field at fault: truncated,
    /// wrong shape, invalid point, duplicate label, or trailing bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const O: &str = "attribute key";
        let mut r = Reader::new(bytes, O);
        let attr_bytes = r.bytes16(&|| "attributes".into())?;
        let mut ar = Reader::new(attr_bytes, O);
        let n = ar.u16(&|| "attributes.count".into())?;
        let mut attrs = BTreeMap::new();
        for i in 0..n {
            let label = utf8(ar.bytes16(&|| format!("attributes[{i}].label"))?, O, &format!("attributes[{i}].label"))?;
            let wild = match ar.u8(&|| format!("attributes[{i}].wild"))? {
                0 => false,
                1 => true,
                _ => return Err(ar.err(format!("attributes[{i}].wild"), "must be 0 or 1")),
            };
            let v = ar.take(32, &|| format!("attributes[{i}].value"))?;
            let value = group::scalar_from_be(v)
                .ok_or_else(|| ar.err(format!("attributes[{i}].value"), "scalar is not below the group order"))?;
            if attrs.insert(label, KeyAttr { wild, value }).is_some() {
                return Err(ar.err(format!("attributes[{i}].label"), "duplicate label"));
            }
        }
        ar.finish("attributes")?;
        let k1 = matrix::decode_g2(r.bytes16(&|| "k1".into())?, (3, 1), O, "k1")?;
        let k2 = matrix::decode_g1(r.bytes16(&|| "k2".into())?, (4, 1), O, "k2")?.map(Wiped);
        let mut maps = [BTreeMap::new(), BTreeMap::new()];
        for (which, map) in ["k3", "k3wild"].iter().zip(maps.iter_mut()) {
            let n = r.u16(&|| format!("{which}.count"))?;
            for i in 0..n {
                let label = utf8(r.bytes16(&|| format!("{which}[{i}].label"))?, O, &format!("{which}[{i}].label"))?;
                let m = matrix::decode_g1(r.bytes16(&|| format!("{which}[{i}]"))?, (4, 1), O, &format!("{which}[{i}]"))?;
                if map.insert(label, m.map(Wiped)).is_some() {
                    return Err(r.err(format!("{which}[{i}].label"), "duplicate label"));
                }
            }
        }
        r.finish("end")?;
        let [k3, k3wild] = maps;
        for (label, a) in &attrs {
            if !k3.contains_key(label) || (a.wild && !k3wild.contains_key(label)) {
                return Err(super::error::malformed(O, format!("k3[{label:?}]"), "missing key material for an attribute"));
            }
        }
        Ok(Self { attrs, k1, k2, k3, k3wild })
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

impl Drop for AttributeKey {
    fn drop(&mut self) {
        self.k2.zeroize();
        for m in self.k3.values_mut().chain(self.k3wild.values_mut()) {
            m.zeroize();
        }
    }
}

impl fmt::Debug for AttributeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttributeKey").field("labels", &self.labels().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}
