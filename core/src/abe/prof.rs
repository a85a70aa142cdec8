use group::prime::PrimeCurveAffine;
#[test]
#[ignore]
fn profile_decrypt() {
    use std::time::Instant;
    let (pk, msk) = super::setup().unwrap();
    let key = super::keygen(&msk, &"country=FR,region=EU".parse().unwrap()).unwrap();
    let ct = super::encrypt(&pk, "country: US or region: EU", b"a 23-byte test message!").unwrap();
    for _ in 0..3 { super::decrypt(&key, &ct).unwrap(); }
    let n = 50;
    let t = Instant::now();
    for _ in 0..n { super::decrypt(&key, &ct).unwrap(); }
    println!("decrypt {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { super::bk::parse(&ct).unwrap(); }
    println!("parse {:?}", t.elapsed() / n);
    let g1 = blstrs::G1Affine::generator().to_uncompressed();
    let g2 = blstrs::G2Affine::generator().to_uncompressed();
    let t = Instant::now();
    for _ in 0..n { super::group::g1_from_bytes(&g1).unwrap(); }
    println!("g1 decode+check {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { super::group::g2_from_bytes(&g2).unwrap(); }
    println!("g2 decode+check {:?}", t.elapsed() / n);
    let p1: blst::blst_p1_affine = *blstrs::G1Affine::generator().as_ref();
    let p2: blst::blst_p2_affine = *blstrs::G2Affine::generator().as_ref();
    let ps = vec![p1; 11]; let qs = vec![p2; 11];
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(blst::blst_fp12::miller_loop_n(&qs, &ps)); }
    println!("miller 11 {:?}", t.elapsed() / n);
    let f = blst::blst_fp12::miller_loop_n(&qs, &ps);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(f.final_exp()); }
    println!("final exp {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(super::oracle::hash_value("EU")); }
    println!("hash_value {:?}", t.elapsed() / n);
}

#[test]
#[ignore]
fn profile_decrypt_stages() {
    use std::time::Instant;
    let (pk, msk) = super::setup().unwrap();
    let key = super::keygen(&msk, &"country=FR,region=EU".parse().unwrap()).unwrap();
    let ct = super::encrypt(&pk, "country: US or region: EU", b"a 23-byte test message!").unwrap();
    let n = 50;
    let p = super::bk::parse(&ct).unwrap();
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(super::bk::bk_policy(&p)); }
    println!("bk_policy {:?}", t.elapsed() / n);
    let pol = super::bk::bk_policy(&p);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(super::tkn::decapsulate(&p.header, &pol, &key, 1).unwrap()); }
    println!("decapsulate {:?}", t.elapsed() / n);
    let g = super::tkn::decapsulate(&p.header, &pol, &key, 1).unwrap();
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(super::group::gt_to_bytes(&g)); }
    println!("gt_to_bytes {:?}", t.elapsed() / n);
}

#[test]
#[ignore]
fn profile_decode() {
    use std::time::Instant;
    let (pk, _msk) = super::setup().unwrap();
    let ct = super::encrypt(&pk, "country: US or region: EU", b"a 23-byte test message!").unwrap();
    let p = super::bk::parse(&ct).unwrap();
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(super::matrix::decode_g2(p.header.c1, (4, 1), "x", "c1").unwrap());
    }
    println!("decode c1 (4 G2) {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(super::matrix::decode_g1(p.header.c3[0], (3, 1), "x", "c3").unwrap());
    }
    println!("decode c3 (3 G1) {:?}", t.elapsed() / n);
}

#[test]
#[ignore]
fn profile_encrypt() {
    use std::time::Instant;
    use blstrs::{G2Projective, Scalar, G1Projective};
    use ff::Field;
    use group::Group;
    let (pk, _) = super::setup().unwrap();
    let n = 30;
    let pol = keyfence_policy::parse("country: US or region: EU").unwrap();
    super::encrypt_policy_with_rng(&mut rand_core::OsRng, &pk, &pol, b"x").unwrap();
    let t = Instant::now();
    for _ in 0..n { super::encrypt_policy_with_rng(&mut rand_core::OsRng, &pk, &pol, b"x").unwrap(); }
    println!("encrypt small {:?}", t.elapsed() / n);
    let s = Scalar::random(&mut rand_core::OsRng);
    let g = pk.btk.e[0];
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(g * s); }
    println!("gt exp {:?}", t.elapsed() / n);
    let q = G2Projective::generator();
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(G2Projective::multi_exp(&[q, q.double()], &[s, s.double()])); }
    println!("g2 msm2 {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(q * s); }
    println!("g2 mul {:?}", t.elapsed() / n);
    let p = G1Projective::generator();
    let pts = vec![p; 6]; let sc = vec![s; 6];
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(G1Projective::multi_exp(&pts, &sc)); }
    println!("g1 msm6 {:?}", t.elapsed() / n);
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(p * s); }
    println!("g1 mul {:?}", t.elapsed() / n);
    let pts = vec![p; 50]; let sc = vec![s; 50];
    let t = Instant::now();
    for _ in 0..n { std::hint::black_box(G1Projective::multi_exp(&pts, &sc)); }
    println!("g1 msm50 {:?}", t.elapsed() / n);
}

#[test]
#[ignore]
fn profile_two_cores() {
    use std::time::Instant;
    let p1: blst::blst_p1_affine = *blstrs::G1Affine::generator().as_ref();
    let p2: blst::blst_p2_affine = *blstrs::G2Affine::generator().as_ref();
    let ps = vec![p1; 6]; let qs = vec![p2; 6];
    let work = || { for _ in 0..40 { std::hint::black_box(blst::blst_fp12::miller_loop_n(&qs, &ps)); } };
    let t = Instant::now(); work(); println!("one thread: {:?}", t.elapsed());
    let t = Instant::now();
    std::thread::scope(|s| { s.spawn(work); s.spawn(work); });
    println!("two threads, twice the work: {:?}", t.elapsed());
}

#[test]
#[ignore]
fn profile_and50() {
    use std::time::Instant;
    let (pk, msk) = super::setup().unwrap();
    let attrs: keyfence_policy::Attributes = (0..50).map(|i| (format!("a{i}"), format!("v{i}"))).collect();
    let pol = (0..50).map(|i| format!("a{i}: v{i}")).collect::<Vec<_>>().join(" and ");
    let key = super::keygen(&msk, &attrs).unwrap();
    let ct = super::encrypt(&pk, &pol, b"x").unwrap();
    for t in [1, 2] {
        let s = Instant::now();
        for _ in 0..10 { super::decrypt_with_threads(&key, &ct, t).unwrap(); }
        println!("threads {t}: {:?}", s.elapsed() / 10);
    }
    let p = super::bk::parse(&ct).unwrap();
    let s = Instant::now();
    for _ in 0..10 { for c in &p.header.c3 { std::hint::black_box(super::matrix::decode_g1(c, (3, 1), "x", "c3").unwrap()); } }
    println!("decode 51 c3: {:?}", s.elapsed() / 10);
    let s = Instant::now();
    for _ in 0..10 { std::hint::black_box(super::bk::parse(&ct).unwrap()); }
    println!("parse: {:?}", s.elapsed() / 10);
}
