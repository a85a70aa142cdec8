//! Keys in a PKCS#11 token (SoftHSM2, vectors/softhsm-fixture.sh) from the
//! command line, as docs/pkcs11.md runs them: `keyfence sign --key
//! 'pkcs11:...'` in process and isolated, through the agent and through a
//! key server, every signature checked by `openssl` against the public key
//! openssl made; `keyfence pkcs11 keygen` and `public`; the errors an
//! operator meets, none of which shows the PIN.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{openssl, pki, skip_unless, stderr, Dir, REQUIRE_SERVERS};

/// Runs the fixture in `d/hsm`; `None` without SoftHSM2, when the calling
/// test must skip (said loudly; a failure instead when
/// `KEYFENCE_REQUIRE_SERVERS` is set).
fn token(d: &Dir) -> Option<Vec<(String, String)>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../vectors/softhsm-fixture.sh");
    let status = Command::new("bash").arg(script).arg(d.0.join("hsm")).status().unwrap();
    let installed = status.code() != Some(77);
    if skip_unless(installed, "no SoftHSM2 (./x installs softhsm2)", REQUIRE_SERVERS) {
        return None;
    }
    assert!(status.success(), "vectors/softhsm-fixture.sh: {status}");
    let env = std::fs::read_to_string(d.0.join("hsm/env")).unwrap();
    Some(env.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

/// `keyfence ARGS` with the token's environment.
fn kf(env: &[(String, String)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyfence")).args(args).envs(env.iter().cloned()).output().unwrap()
}

fn kf_ok(env: &[(String, String)], args: &[&str]) -> String {
    let o = kf(env, args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `openssl` verifies `sig` over `msg` with `alg` and the public key in `public`.
fn verify(d: &Dir, alg: &str, public: &str, msg: &str, sig: &str) {
    let mut args: Vec<&str> = match alg {
        "ed25519" => vec!["pkeyutl", "-verify", "-pubin", "-inkey", public, "-rawin", "-in", msg, "-sigfile", sig],
        a if a.contains("sha384") => vec!["dgst", "-sha384", "-verify", public, "-signature", sig],
        a if a.contains("sha512") => vec!["dgst", "-sha512", "-verify", public, "-signature", sig],
        _ => vec!["dgst", "-sha256", "-verify", public, "-signature", sig],
    };
    if alg.starts_with("rsa-pss") {
        args.extend(["-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:digest"]);
    }
    if alg != "ed25519" {
        args.push(msg);
    }
    openssl(d, &args);
}

const KEYS: [(&str, &[&str]); 4] = [
    ("tls-p256", &["ecdsa-p256-sha256"]),
    ("tls-p384", &["ecdsa-p384-sha384"]),
    ("tls-rsa", &["rsa-pkcs1-sha256", "rsa-pkcs1-sha512", "rsa-pss-sha256", "rsa-pss-sha384"]),
    ("tls-ed", &["ed25519"]),
];

#[test]
fn sign_with_a_token_key_in_process_and_isolated() {
    let d = Dir::new("pkcs11-sign");
    let Some(env) = token(&d) else { return };
    std::fs::write(d.0.join("msg"), b"signed in the token\n").unwrap();
    for (label, algs) in KEYS {
        // The public key openssl wrote when it made the key, not the token's.
        openssl(&d, &["pkey", "-in", &d.p(&format!("hsm/keys/{label}.pem")), "-pubout", "-out", &format!("{label}.pub")]);
        // ...and the one the token gives, which must be the same.
        kf_ok(
            &env,
            &["pkcs11", "public", "--uri", &format!("pkcs11:token=edge;object={label}"), "--out", &d.p(&format!("{label}.tok.pub"))],
        );
        assert_eq!(std::fs::read(d.0.join(format!("{label}.pub"))).unwrap(), std::fs::read(d.0.join(format!("{label}.tok.pub"))).unwrap());
        for alg in algs {
            for isolated in [false, true] {
                let uri = format!("pkcs11:token=edge;object={label};type=private");
                let mut args = vec!["sign", "--key", &uri, "--alg", alg, "--in", "msg", "--out", "msg.sig"];
                if isolated {
                    args.push("--isolated");
                }
                let o =
                    Command::new(env!("CARGO_BIN_EXE_keyfence")).args(&args).envs(env.iter().cloned()).current_dir(&d.0).output().unwrap();
                assert!(o.status.success(), "{label} {alg} isolated={isolated}: {}", stderr(&o));
                verify(&d, alg, &format!("{label}.pub"), "msg", "msg.sig");
            }
        }
    }
    // A key made in the token by keyfence: it signs, openssl verifies
    // against the public key keygen wrote.
    kf_ok(&env, &["pkcs11", "keygen", "--uri", "pkcs11:token=edge;object=made;id=%42", "--type", "ec-p384", "--out", &d.p("made.pub")]);
    let o = kf(&env, &["pkcs11", "keygen", "--uri", "pkcs11:token=edge;object=made", "--type", "ec-p384", "--out", &d.p("x")]);
    assert!(!o.status.success() && stderr(&o).contains("exists already"), "{}", stderr(&o));
    kf_ok(
        &env,
        &["sign", "--key", "pkcs11:token=edge;id=%42", "--alg", "ecdsa-p384-sha384", "--in", &d.p("msg"), "--out", &d.p("made.sig")],
    );
    verify(&d, "ecdsa-p384-sha384", "made.pub", "msg", "made.sig");
    // A key file checked against the certificate the server will present:
    // the token key's own passes, another key's is refused and no file is
    // written.
    openssl(&d, &["req", "-x509", "-new", "-key", &d.p("hsm/keys/tls-p256.pem"), "-subj", "/CN=edge", "-days", "1", "-out", "p256.crt"]);
    openssl(&d, &["req", "-x509", "-new", "-key", &d.p("hsm/keys/tls-p384.pem"), "-subj", "/CN=edge", "-days", "1", "-out", "p384.crt"]);
    kf_ok(&env, &["provider-key", "--pkcs11", "pkcs11:token=edge;object=tls-p256", "--cert", &d.p("p256.crt"), "--out", &d.p("ok.kfk")]);
    let o =
        kf(&env, &["provider-key", "--pkcs11", "pkcs11:token=edge;object=tls-p256", "--cert", &d.p("p384.crt"), "--out", &d.p("bad.kfk")]);
    assert!(!o.status.success() && stderr(&o).contains("the certificate's public key is not the key's"), "{}", stderr(&o));
    assert!(!d.0.join("bad.kfk").exists());
    // The file names the module and PIN file it was made with: a server
    // whose environment is cleared (nginx's workers) still finds them.
    let text = std::fs::read_to_string(d.0.join("ok.kfk")).unwrap();
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = openssl::base64::decode_block(&body).unwrap();
    let file = keyfence::key_file::KeyFile::from_bytes(&der).unwrap();
    match file.location {
        keyfence::key_file::KeyLocation::Pkcs11 { uri, agent: None } => {
            assert!(uri.contains("module-path=/") && uri.contains("pin-source=file:/"), "{uri}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_operators_mistakes_are_clear_and_never_show_the_pin() {
    let d = Dir::new("pkcs11-errors");
    let Some(mut env) = token(&d) else { return };
    let pin = std::fs::read_to_string(d.0.join("hsm/pin")).unwrap().trim().to_string();
    std::fs::write(d.0.join("msg"), b"m").unwrap();
    let sign = |env: &[(String, String)], uri: &str| {
        let start = Instant::now();
        let o = kf(env, &["sign", "--key", uri, "--alg", "ecdsa-p256-sha256", "--in", &d.p("msg"), "--out", &d.p("sig")]);
        assert!(start.elapsed() < Duration::from_secs(20));
        assert!(!o.status.success());
        let e = stderr(&o);
        assert!(!e.contains(&pin), "{e}");
        e
    };
    let e = sign(&env, "pkcs11:token=edge;object=missing");
    assert!(e.contains("no private key with object=missing"), "{e}");
    let e = sign(&env, &format!("pkcs11:token=edge;object=tls-p256?pin-value={pin}"));
    assert!(e.contains("a PIN in the URI is refused"), "{e}");
    let e = sign(&env, "pkcs11:token=edge;object=tls-p256?module-path=/nonexistent/lib.so");
    assert!(e.contains("/nonexistent/lib.so"), "{e}");
    std::fs::write(d.0.join("wrong"), "999999\n").unwrap();
    let e = sign(&env, &format!("pkcs11:token=edge;object=tls-p256?pin-source=file:{}", d.p("wrong")));
    assert!(e.contains("refused the PIN") && e.contains("PinIncorrect"), "{e}");
    env.retain(|(k, _)| k != "KEYFENCE_PKCS11_PIN_FILE");
    let e = sign(&env, "pkcs11:token=edge;object=tls-p256");
    assert!(e.contains("needs a PIN"), "{e}");
    env.retain(|(k, _)| k != "KEYFENCE_PKCS11_MODULE");
    let e = sign(&env, "pkcs11:token=edge;object=tls-p256");
    assert!(e.contains("no PKCS#11 module"), "{e}");
}

/// Kills the child when dropped, whatever happens to the test.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first line of `child`'s standard output that starts with `prefix`,
/// within 30 s.
fn line_starting(child: &mut Child, prefix: &'static str) -> String {
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with(prefix) {
                let _ = tx.send(line);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("the server did not start")
}

#[test]
fn the_agent_and_a_key_server_sign_with_token_keys() {
    let d = Dir::new("pkcs11-servers");
    let Some(env) = token(&d) else { return };
    let module = env.iter().find(|(k, _)| k == "KEYFENCE_PKCS11_MODULE").unwrap().1.clone();
    std::fs::write(d.0.join("msg"), b"through a signer\n").unwrap();
    openssl(&d, &["pkey", "-in", &d.p("hsm/keys/tls-p256.pem"), "-pubout", "-out", "p256.pub"]);
    openssl(&d, &["pkey", "-in", &d.p("hsm/keys/tls-rsa.pem"), "-pubout", "-out", "rsa.pub"]);

    // The agent: it alone loads the module and reads the PIN; the client
    // has neither in its environment.
    let client_env: Vec<(String, String)> = Vec::new();
    kf_ok(&client_env, &["authority", "init", "--store", &d.p("store")]);
    kf_ok(&client_env, &["authority", "issue", "--store", &d.p("store"), "--attrs", "country=US", "--out", &d.p("m.key")]);
    let socket = d.p("agent.sock");
    let mut agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_keyfence"))
            .args(["agent", "--socket", &socket, "--seconds", "120"])
            .args(["--pkcs11-module", &module, "--pkcs11-pin-file", &d.p("hsm/pin")])
            .env("SOFTHSM2_CONF", d.p("hsm/softhsm2.conf"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    line_starting(&mut agent.0, "listening");
    let agent_sign = |key: &str, out: &str| {
        kf(&client_env, &["sign", "--agent", &socket, "--key", key, "--alg", "ecdsa-p256-sha256", "--in", &d.p("msg"), "--out", out])
    };
    let o = agent_sign("pkcs11:token=edge;object=tls-p256", &d.p("agent.sig"));
    assert!(o.status.success(), "{}", stderr(&o));
    verify(&d, "ecdsa-p256-sha256", "p256.pub", "msg", "agent.sig");
    // A client may not make the agent load another library or read
    // another file.
    let o = agent_sign("pkcs11:token=edge;object=tls-p256?module-path=/tmp/evil.so", &d.p("x"));
    assert!(!o.status.success() && stderr(&o).contains("loads only the PKCS#11 module it was started with"), "{}", stderr(&o));
    let o = agent_sign("pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/shadow", &d.p("x"));
    assert!(!o.status.success() && stderr(&o).contains("reads only the PIN file it was started with"), "{}", stderr(&o));
    // A key file for the provider, through the agent.
    kf_ok(&client_env, &["provider-key", "--pkcs11", "pkcs11:token=edge;object=tls-p256", "--agent", &socket, "--out", &d.p("p256.kfk")]);
    assert!(std::fs::read_to_string(d.0.join("p256.kfk")).unwrap().starts_with("-----BEGIN KEYFENCE KEY-----"));
    drop(agent);

    // A key server holding the token keys (isolated: its key process
    // loads the module); a client names a key by its public key.
    pki(&d, &["ks1", "client"]);
    let mut server = Killed(
        Command::new(env!("CARGO_BIN_EXE_keyfence"))
            .args(["serve", "--listen", "127.0.0.1:0", "--name", "ks1", "--seconds", "120", "--isolated"])
            .args(["--cert", &d.p("ks1.pem"), "--key", &d.p("ks1.key"), "--ca", &d.p("ca.pem")])
            .args(["--pkcs11", "pkcs11:token=edge;object=tls-p256", "--pkcs11", "pkcs11:token=edge;object=tls-rsa"])
            .envs(env.iter().cloned())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let addr = line_starting(&mut server.0, "listening ").strip_prefix("listening ").unwrap().to_string();
    let peer = format!("ks1,{addr},role=ks");
    let tls = ["--tls-cert", &d.p("client.pem"), "--tls-key", &d.p("client.key"), "--tls-ca", &d.p("ca.pem")];
    // Through the key server, with a budget: a key it does not hold is
    // refused in time, not waited for.
    let remote_sign = |public: &str, alg: &str, out: &str| {
        let sign = ["sign", "--remote", "--public-key", &d.p(public), "--peer", &peer];
        kf(&client_env, &[&sign[..], &tls, &["--alg", alg, "--in", &d.p("msg"), "--out", out, "--timeout-ms", "10000"]].concat())
    };
    for (alg, public) in [("ecdsa-p256-sha256", "p256.pub"), ("rsa-pss-sha256", "rsa.pub")] {
        let o = remote_sign(public, alg, &d.p("remote.sig"));
        assert!(o.status.success(), "{alg}: {}", stderr(&o));
        verify(&d, alg, public, "msg", "remote.sig");
    }
    // A public key the server does not hold: refused, in time.
    openssl(&d, &["pkey", "-in", &d.p("hsm/keys/tls-p384.pem"), "-pubout", "-out", "p384.pub"]);
    let o = remote_sign("p384.pub", "ecdsa-p384-sha384", &d.p("x"));
    assert!(!o.status.success() && stderr(&o).contains("does not hold that key"), "a key the server does not hold: {}", stderr(&o));
}
