//! `keyfence sign`, run as a user would, its signatures checked by the
//! `openssl` command line (keys made by `openssl` too, in the encodings
//! people have: PKCS#8 and PKCS#1/SEC1, PEM and DER).

mod common;

use std::process::{Command, Output};

use common::{keyfence, openssl, openssl_output, Dir};

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

/// Makes a key with openssl; returns the private key path and its public key
/// (PEM) path.
fn make_key(d: &Dir, name: &str, genargs: &[&str], der: bool) -> (String, String) {
    let pem = d.p(&format!("{name}.pem"));
    let mut args = genargs.to_vec();
    args.extend(["-out", &pem]);
    openssl(d, &args);
    let public = d.p(&format!("{name}.pub.pem"));
    openssl(d, &["pkey", "-in", &pem, "-pubout", "-out", &public]);
    if der {
        let der_path = d.p(&format!("{name}.der"));
        // `-traditional` keeps PKCS#1 / SEC1 rather than PKCS#8.
        let mut a = vec!["pkey", "-in", &pem, "-outform", "DER", "-out", &der_path];
        if !name.starts_with("ed") {
            a.push("-traditional");
        }
        openssl(d, &a);
        return (der_path, public);
    }
    (pem, public)
}

#[test]
fn signatures_verify_with_openssl() {
    let d = Dir::new("sign-openssl");
    let msg = d.p("msg");
    std::fs::write(&msg, b"keyfence sign, checked by openssl\n").unwrap();
    let rsa = make_key(&d, "rsa", &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], false);
    let rsa_der = make_key(&d, "rsa1", &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072"], true);
    let p256 = make_key(&d, "p256", &["ecparam", "-name", "prime256v1", "-genkey", "-noout"], false); // SEC1 PEM
    let p384 = make_key(&d, "p384", &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], true);
    let ed = make_key(&d, "ed25519", &["genpkey", "-algorithm", "ED25519"], false);
    let cases: [(&str, &(String, String), &[&str]); 8] = [
        ("rsa-pkcs1-sha256", &rsa, &["dgst", "-sha256"]),
        ("rsa-pkcs1-sha384", &rsa, &["dgst", "-sha384"]),
        ("rsa-pss-sha256", &rsa, &["dgst", "-sha256", "-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:32"]),
        ("rsa-pkcs1-sha256", &rsa_der, &["dgst", "-sha256"]),
        ("rsa-pss-sha256", &rsa_der, &["dgst", "-sha256", "-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:32"]),
        ("ecdsa-p256-sha256", &p256, &["dgst", "-sha256"]),
        ("ecdsa-p384-sha384", &p384, &["dgst", "-sha384"]),
        ("ed25519", &ed, &["pkeyutl", "-rawin"]),
    ];
    for (i, (alg, (key, public), verify)) in cases.into_iter().enumerate() {
        let sig = d.p(&format!("sig{i}"));
        ok(&keyfence(&["sign", "--key", key, "--alg", alg, "--in", &msg, "--out", &sig]), &format!("keyfence sign {alg}"));
        let mut args = verify.to_vec();
        if verify[0] == "dgst" {
            args.extend(["-verify", public, "-signature", &sig, &msg]);
        } else {
            args.extend(["-verify", "-pubin", "-inkey", public, "-sigfile", &sig, "-in", &msg]);
        }
        let out = openssl(&d, &args);
        assert!(String::from_utf8_lossy(&out).contains("Verified"), "{alg} with {key}: {}", String::from_utf8_lossy(&out));

        // A flipped message byte must not verify: the check is real.
        let tampered = d.p("tampered");
        let mut m = std::fs::read(&msg).unwrap();
        m[0] ^= 1;
        std::fs::write(&tampered, m).unwrap();
        // The message path is the last argument in both forms.
        let n = args.len();
        args[n - 1] = &tampered;
        assert!(!openssl_output(&d, &args).status.success(), "{alg}: a tampered message verified");
    }

    // --digest: sign a digest made by openssl; the signature is the same
    // RSA PKCS#1 v1.5 signature (deterministic) as signing the message.
    let digest = d.p("digest");
    openssl(&d, &["dgst", "-sha256", "-binary", "-out", &digest, &msg]);
    let (s1, s2) = (d.p("by-msg"), d.p("by-digest"));
    ok(&keyfence(&["sign", "--key", &rsa.0, "--alg", "rsa-pkcs1-sha256", "--in", &msg, "--out", &s1]), "sign msg");
    ok(&keyfence(&["sign", "--key", &rsa.0, "--alg", "rsa-pkcs1-sha256", "--in", &digest, "--out", &s2, "--digest"]), "sign digest");
    assert_eq!(std::fs::read(&s1).unwrap(), std::fs::read(&s2).unwrap());
}

#[test]
fn errors_are_clear_and_exit_non_zero() {
    let d = Dir::new("sign-errors");
    let msg = d.p("msg");
    std::fs::write(&msg, b"m").unwrap();
    let (p256, _) = make_key(&d, "p256", &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"], false);
    let out = d.p("sig");
    let err = |o: &Output| {
        assert!(!o.status.success());
        assert!(!std::path::Path::new(&out).exists(), "no signature file on failure");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let e = err(&keyfence(&["sign", "--key", &p256, "--alg", "rsa-pss-sha256", "--in", &msg, "--out", &out]));
    assert!(e.contains("rsa-pss-sha256 cannot be used with a P-256 ECDSA key"), "{e}");
    let e = err(&keyfence(&["sign", "--key", &p256, "--alg", "ecdsa-p384-sha384", "--in", &msg, "--out", &out]));
    assert!(e.contains("cannot be used with a P-256 ECDSA key"), "{e}");
    let e = err(&keyfence(&["sign", "--key", &p256, "--alg", "dsa-sha1", "--in", &msg, "--out", &out]));
    assert!(e.contains("unknown signature algorithm `dsa-sha1`"), "{e}");
    let e = err(&keyfence(&["sign", "--key", &msg, "--alg", "ed25519", "--in", &msg, "--out", &out]));
    assert!(e.contains("not a private key"), "{e}");
    let e = err(&keyfence(&["sign", "--key", &d.p("missing"), "--alg", "ed25519", "--in", &msg, "--out", &out]));
    assert!(e.contains("reading") && e.contains("missing"), "{e}");
    let e = err(&keyfence(&["sign", "--key", &p256, "--alg", "ecdsa-p256-sha256", "--in", &msg, "--out", &out, "--digest"]));
    assert!(e.contains("expects a 32-byte digest, got 1 bytes"), "{e}");
    // The key never appears in an error.
    let pem = std::fs::read_to_string(&p256).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!e.contains(&body[..20]));
}

#[test]
fn bench_sign_prints_one_json_object_per_algorithm_and_path() {
    let o = keyfence(&["bench", "sign", "--json", "--seconds", "0.2", "--case", "ecdsa-p256-sha256", "--case", "ed25519"]);
    ok(&o, "keyfence bench sign");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let expected: Vec<(&str, &str)> = ["ecdsa-p256-sha256", "ed25519"]
        .into_iter()
        .flat_map(|alg| ["raw", "engine", "isolated", "offload-sim"].map(|path| (alg, path)))
        .collect();
    assert_eq!(lines.len(), expected.len());
    for (v, (alg, path)) in lines.iter().zip(expected) {
        assert_eq!(v["alg"], alg);
        assert_eq!(v["path"], path);
        for k in ["ops_per_s", "p50_us", "p99_us", "cpu_us_per_op"] {
            assert!(v[k].as_f64().unwrap() > 0.0, "{v}");
        }
        assert!(v["p50_us"].as_f64() <= v["p99_us"].as_f64());
    }
    // --path narrows the run (raw stays: the others are compared with it).
    let o = keyfence(&["bench", "sign", "--json", "--seconds", "0.2", "--case", "ed25519", "--path", "isolated"]);
    ok(&o, "keyfence bench sign --path isolated");
    let paths: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["raw", "isolated"]);
    let o = keyfence(&["bench", "sign", "--path", "gpu"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unknown path gpu"));
}

/// `bench sign --path multibuffer --path isolated-multibuffer` on the
/// stand-in crypto_mb (vectors/crypto-mb-stand-in/), which runs on every
/// CPU: one row each; where crypto_mb says it cannot sign here, the run
/// fails saying so instead of measuring software under the device's name.
#[test]
fn bench_sign_measures_the_multibuffer_paths_or_says_why_not() {
    let d = Dir::new("bench-multibuffer");
    let lib = d.p("libcrypto_mb_stand_in.so");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../../vectors/crypto-mb-stand-in/crypto_mb_stand_in.c");
    let built = Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o", &lib, src, "-lcrypto"]).status().unwrap();
    assert!(built.success(), "building the stand-in crypto_mb");
    let args = [
        "bench",
        "sign",
        "--json",
        "--seconds",
        "0.2",
        "--case",
        "ecdsa-p256-sha256",
        "--case",
        "rsa2048-pss-sha256",
        "--path",
        "multibuffer",
        "--path",
        "isolated-multibuffer",
        "--crypto-mb",
        &lib,
    ];
    let o = keyfence(&args);
    ok(&o, "keyfence bench sign --path multibuffer");
    let rows: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| (v["alg"].as_str().unwrap().to_string(), v["path"].as_str().unwrap().to_string()))
        .collect();
    let expected: Vec<(String, String)> = ["rsa2048-pss-sha256", "ecdsa-p256-sha256"]
        .into_iter()
        .flat_map(|a| ["raw", "multibuffer", "isolated-multibuffer"].map(|p| (a.to_string(), p.to_string())))
        .collect();
    assert_eq!(rows, expected);
    for path in ["multibuffer", "isolated-multibuffer"] {
        let o = Command::new(env!("CARGO_BIN_EXE_keyfence"))
            .args(["bench", "sign", "--seconds", "0.1", "--case", "ed25519", "--path", path, "--crypto-mb", &lib])
            .env("KF_MB_MODE", "unsupported")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(path) && err.contains("AVX-512 IFMA"), "{path}: {err}");
    }
}

/// `keyfence offload probe`: the library's own answer, as JSON or words,
/// with an exit status a script can branch on (0 runs, 1 runs nothing on
/// this CPU, 3 cannot be opened).
#[test]
fn offload_probe_says_what_crypto_mb_runs_here() {
    let d = Dir::new("offload-probe");
    let lib = d.p("libcrypto_mb_stand_in.so");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../../vectors/crypto-mb-stand-in/crypto_mb_stand_in.c");
    assert!(Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o", &lib, src, "-lcrypto"]).status().unwrap().success());
    let probe = |mode: Option<&str>, lib: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_keyfence"));
        c.args(["offload", "probe", "--json", "--crypto-mb", lib]);
        if let Some(m) = mode {
            c.env("KF_MB_MODE", m);
        }
        c.output().unwrap()
    };
    let o = probe(None, &lib);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["algorithms"]["RSA-2048"], true);
    assert_eq!(v["algorithms"]["ECDSA P-256"], true);
    let o = probe(Some("unsupported"), &lib);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["applicable"], false);
    assert!(v["algorithms"].as_object().unwrap().values().all(|r| r == false), "{v}");
    let o = probe(None, &d.p("no-such-libcrypto_mb.so"));
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("could not be opened"));
}

/// `bench sign --per-cpu`: by default P-256, Ed25519 and RSA-2048 (PSS),
/// each through raw AWS-LC, the engine, the key process and a key server
/// on loopback, one row each with its signatures per CPU-second, its ratio
/// to raw's (raw's own is 1) and issue 29's target. No figure is asserted
/// on: only the shape, and that each ratio is the quotient of the figures.
#[test]
fn bench_sign_per_cpu_prints_every_path_against_raw() {
    let o = keyfence(&["bench", "sign", "--json", "--per-cpu", "--seconds", "0.05", "--threads", "1"]);
    ok(&o, "keyfence bench sign --per-cpu");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let expected: Vec<(&str, &str)> = ["rsa2048-pss-sha256", "ecdsa-p256-sha256", "ed25519"]
        .into_iter()
        .flat_map(|alg| ["raw", "engine", "isolated", "remote"].map(|path| (alg, path)))
        .collect();
    let got: Vec<(&str, &str)> = rows.iter().map(|v| (v["alg"].as_str().unwrap(), v["path"].as_str().unwrap())).collect();
    assert_eq!(got, expected);
    for chunk in rows.chunks(4) {
        let raw = chunk[0]["per_cpu_second"].as_f64().unwrap();
        assert_eq!(chunk[0]["vs_raw"].as_f64(), Some(1.0), "{}", chunk[0]);
        for v in chunk {
            let per_cpu = v["per_cpu_second"].as_f64().unwrap();
            assert!(per_cpu > 0.0, "{v}");
            let vs_raw = v["vs_raw"].as_f64().unwrap();
            // Both rounded in the row: the figure to the unit, the ratio to 0.001.
            assert!((vs_raw - per_cpu / raw).abs() <= 0.0005 + 1.0 / raw, "{v}: raw {raw}");
            let cheap = v["alg"] != "rsa2048-pss-sha256";
            let target = match v["path"].as_str().unwrap() {
                "engine" if cheap => Some(0.97),
                "isolated" if cheap => Some(0.9),
                "remote" if cheap => Some(0.85),
                _ => None,
            };
            assert_eq!(v["target"].as_f64(), target, "{v}");
            for k in ["ops_per_s", "p50_us", "p99_us", "cpu_us_per_op"] {
                assert!(v[k].as_f64().unwrap() > 0.0, "{v}");
            }
        }
    }
    // A path can be asked for alone, remote included; raw stays.
    let o =
        keyfence(&["bench", "sign", "--json", "--per-cpu", "--seconds", "0.05", "--threads", "1", "--case", "ed25519", "--path", "remote"]);
    ok(&o, "keyfence bench sign --per-cpu --path remote");
    let paths: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, ["raw", "remote"]);
}

#[test]
fn isolated_signing_verifies_and_reports_key_process_errors() {
    let d = Dir::new("sign-isolated");
    let msg = d.p("msg");
    std::fs::write(&msg, b"signed in a separate key process\n").unwrap();
    let (rsa, rsa_pub) = make_key(&d, "rsa", &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], false);
    let (p256, p256_pub) = make_key(&d, "p256", &["ecparam", "-name", "prime256v1", "-genkey", "-noout"], false);
    for (alg, key, public, digest) in [("rsa-pss-sha256", &rsa, &rsa_pub, true), ("ecdsa-p256-sha256", &p256, &p256_pub, false)] {
        let sig = d.p(&format!("{alg}.sig"));
        ok(
            &keyfence(&["sign", "--isolated", "--key", key, "--alg", alg, "--in", &msg, "--out", &sig]),
            &format!("keyfence sign --isolated {alg}"),
        );
        let mut args = vec!["dgst", "-sha256"];
        if digest {
            args.extend(["-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:32"]);
        }
        args.extend(["-verify", public, "-signature", &sig, &msg]);
        openssl(&d, &args);
    }
    // The key process reads the file, and its error names it.
    let o = keyfence(&["sign", "--isolated", "--key", &d.p("missing.pem"), "--alg", "ed25519", "--in", &msg, "--out", &d.p("x")]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("missing.pem") && e.contains("isolated"), "{e}");
}

/// Issue 19: a message over the key process's 1 MiB frame used to end the
/// connection ("the key process died") and leave the orphaned key process
/// printing after the command had exited. Now RSA and ECDSA messages are
/// hashed on the caller's side and just work; Ed25519 is refused up front,
/// and nothing else reaches the terminal. `output()` reads standard error
/// until every writer (the key process too) has closed it, so a late line
/// from the key process would be caught here.
#[test]
fn isolated_signing_of_a_message_over_the_frame_limit_works_or_is_refused_cleanly() {
    let d = Dir::new("sign-isolated-big");
    let msg = d.p("big");
    std::fs::write(&msg, vec![b'x'; 2 << 20]).unwrap();
    let (p256, p256_pub) = make_key(&d, "p256", &["ecparam", "-name", "prime256v1", "-genkey", "-noout"], false);
    let (rsa, rsa_pub) = make_key(&d, "rsa", &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], false);
    for (alg, key, public) in [("ecdsa-p256-sha256", &p256, &p256_pub), ("rsa-pkcs1-sha256", &rsa, &rsa_pub)] {
        let sig = d.p(&format!("{alg}.sig"));
        let o = keyfence(&["sign", "--isolated", "--key", key, "--alg", alg, "--in", &msg, "--out", &sig]);
        ok(&o, &format!("sign --isolated {alg} of 2 MiB"));
        assert!(o.stderr.is_empty(), "nothing on standard error: {}", String::from_utf8_lossy(&o.stderr));
        openssl(&d, &["dgst", "-sha256", "-verify", public, "-signature", &sig, &msg]);
    }
    let (ed, _) = make_key(&d, "ed25519", &["genpkey", "-algorithm", "ED25519"], false);
    let o = keyfence(&["sign", "--isolated", "--key", &ed, "--alg", "ed25519", "--in", &msg, "--out", &d.p("ed.sig")]);
    assert_eq!(o.status.code(), Some(2), "bad input, not a failure");
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.lines().count(), 1, "one line, nothing from the key process: {e}");
    assert!(e.contains("Ed25519 signs whole messages") && e.contains("1048552"), "{e}");
    assert!(!e.contains("died") && !e.contains("frame length"), "{e}");
    assert!(!std::path::Path::new(&d.p("ed.sig")).exists());
}

/// Issue 59.6: `--timeout-ms` bounds the key's load too: a token module
/// whose C_Initialize hangs ends the command at its timeout with a
/// timeout (exit 3), in process and in the key process alike.
#[test]
fn the_timeout_bounds_a_key_load_that_hangs() {
    let d = Dir::new("sign-load-timeout");
    let src = d.0.join("hang.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\n\
         typedef unsigned long CK_RV;\n\
         typedef CK_RV (*CK_FN)(void *);\n\
         struct CK_FUNCTION_LIST { unsigned char major, minor; CK_FN fns[68]; };\n\
         static CK_RV initialize(void *a) { (void)a; sleep(30); return 0; }\n\
         static struct CK_FUNCTION_LIST list = {2, 40, {initialize}};\n\
         CK_RV C_GetFunctionList(struct CK_FUNCTION_LIST **out) { *out = &list; return 0; }\n",
    )
    .unwrap();
    let module = d.0.join("hang.so");
    let built = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&module).arg(&src).status().expect("cc");
    assert!(built.success());
    std::fs::write(d.0.join("msg"), b"m").unwrap();
    let uri = format!("pkcs11:token=t;object=k;type=private?module-path={}", module.display());
    for isolated in [false, true] {
        let mut args = vec!["sign", "--key", &uri, "--alg", "ecdsa-p256-sha256", "--in", "msg", "--out", "sig", "--timeout-ms", "1500"];
        if isolated {
            args.push("--isolated");
        }
        let t = std::time::Instant::now();
        let out =
            Command::new(env!("CARGO_BIN_EXE_keyfence")).args(&args).env("KEYFENCE_PKCS11_PIN", "0000").current_dir(&d.0).output().unwrap();
        let took = t.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "isolated={isolated}: {err}");
        assert!(err.contains("--timeout-ms 1500"), "isolated={isolated}: {err}");
        assert!(took < std::time::Duration::from_secs(6), "isolated={isolated}: the command took {took:?} with --timeout-ms 1500");
    }
}
