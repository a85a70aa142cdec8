//! `keyfence serve` and `keyfence sign --remote`, run as docs/remote.md's
//! loopback example runs them: certificates from the `openssl` command
//! line, a store and envelopes from `keyfence authority`, a server in its
//! own process, a Tokyo client that may not open the US-only key, its
//! signature checked by `openssl`, the metrics endpoint scraped, and the
//! server killed (the next signature fails cleanly, in time).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{keyfence, ok, openssl, pki, stderr, Dir};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_and_sign_remote_on_loopback() {
    let d = Dir::new("remote");
    pki(&d, &["sfo1", "client"]);
    let store = d.p("store");
    ok(&["authority", "init", "--store", &store]);
    ok(&["authority", "issue", "--store", &store, "--attrs", "country=US,region=NA", "--out", &d.p("sfo1.machine")]);
    ok(&["authority", "issue", "--store", &store, "--attrs", "country=JP,region=APAC", "--out", &d.p("nrt1.machine")]);
    openssl(&d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "key.pem"]);
    openssl(&d, &["pkey", "-in", "key.pem", "-pubout", "-out", "key.pub.pem"]);
    ok(&["authority", "wrap", "--store", &store, "--policy", "country: US", "--in", &d.p("key.pem"), "--out", &d.p("key.env")]);
    std::fs::write(d.p("msg"), b"a TLS handshake from Tokyo\n").unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_keyfence"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--name", "sfo1", "--seconds", "60"])
        .args(["--cert", &d.p("sfo1.pem"), "--key", &d.p("sfo1.key"), "--ca", &d.p("ca.pem")])
        .args(["--store", &store, "--machine-key", &d.p("sfo1.machine"), "--envelopes", &d.p("key.env")])
        // The tenant is the client certificate's CN; it may use this key.
        .args(["--allow", &format!("client={}", d.p("key.env"))])
        // What strangers may hold before their certificate is checked.
        .args(["--handshake-timeout", "2.5", "--max-handshakes", "8", "--max-handshakes-per-address", "4"])
        .args(["--max-connections", "16"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let server = Server(child);
    let addr = lines.next().unwrap().unwrap().strip_prefix("listening ").unwrap().to_string();
    let metrics = lines.next().unwrap().unwrap();
    let metrics = metrics.strip_prefix("metrics http://").unwrap().trim_end_matches("/metrics").to_string();

    let peer = format!("sfo1,{addr},country=US,region=NA");
    // The client's certificate, key and CA, as every remote signature here
    // dials.
    let tls = ["--tls-cert", &d.p("client.pem"), "--tls-key", &d.p("client.key"), "--tls-ca", &d.p("ca.pem")];
    let sign = |out: &str| {
        keyfence(
            &[
                &["sign", "--remote", "--envelope", &d.p("key.env"), "--peer", &peer][..],
                &tls,
                &["--store", &store, "--machine-key", &d.p("nrt1.machine"), "--tenant", "42"],
                &["--alg", "ecdsa-p256-sha256", "--in", &d.p("msg"), "--out", out, "--timeout-ms", "2000"],
            ]
            .concat(),
        )
    };
    let o = sign(&d.p("msg.sig"));
    assert!(o.status.success(), "{}", stderr(&o));
    // The remote signature verifies.
    openssl(&d, &["dgst", "-sha256", "-verify", "key.pub.pem", "-signature", "msg.sig", "msg"]);

    // The server's metrics show the signature under the tenant its
    // certificate names, not the id the request carried (42).
    let mut c = TcpStream::connect(&metrics).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    assert!(text.contains("keyfence_remote_server_tenant_requests_total{tenant=\"client\",outcome=\"ok\"} 1"), "{text}");
    assert!(!text.contains("tenant=\"42\""), "{text}");
    assert!(text.contains("keyfence_remote_server_handshakes 0"), "{text}");

    // Usage errors are exit 2.
    let o = keyfence(&[
        "sign",
        "--remote",
        "--envelope",
        &d.p("key.env"),
        "--peer",
        "sfo1",
        "--alg",
        "ecdsa-p256-sha256",
        "--in",
        &d.p("msg"),
        "--out",
        &d.p("x"),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // Allow-lists that cannot be read are usage errors (exit 2), before
    // the server listens.
    let serve_with = |extra: &[&str]| {
        keyfence(
            &[
                &["serve", "--listen", "127.0.0.1:0", "--seconds", "1"][..],
                &["--cert", &d.p("sfo1.pem"), "--key", &d.p("sfo1.key"), "--ca", &d.p("ca.pem")],
                &["--store", &store, "--machine-key", &d.p("sfo1.machine"), "--envelopes", &d.p("key.env")],
                extra,
            ]
            .concat(),
        )
    };
    for bad in [
        &["--allow", "nobody"][..],
        &["--allow", "client=0123456789abcdef"],
        &["--tenant-from", "email"],
        &["--handshake-timeout", "0"],
        &["--handshake-timeout", "nan"],
        &["--max-handshakes", "0"],
        &["--max-handshakes-per-address", "0"],
        &["--max-connections", "0"],
    ] {
        let o = serve_with(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(!String::from_utf8_lossy(&o.stdout).contains("listening"), "{bad:?}");
    }
    // An allow file that lists another tenant only: this client is
    // refused the key (exit 3, saying why).
    std::fs::write(d.p("tenants.allow"), format!("# who may use what\nother = {}\n", d.p("key.env"))).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyfence"))
        .args(["serve", "--listen", "127.0.0.1:0", "--name", "sfo1", "--seconds", "60"])
        .args(["--cert", &d.p("sfo1.pem"), "--key", &d.p("sfo1.key"), "--ca", &d.p("ca.pem")])
        .args(["--store", &store, "--machine-key", &d.p("sfo1.machine"), "--envelopes", &d.p("key.env")])
        .args(["--allow-file", &d.p("tenants.allow")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines2 = BufReader::new(child.stdout.take().unwrap()).lines();
    let strict = Server(child);
    let addr2 = lines2.next().unwrap().unwrap().strip_prefix("listening ").unwrap().to_string();
    let peer2 = format!("sfo1,{addr2},country=US,region=NA");
    let o = keyfence(
        &[
            &["sign", "--remote", "--envelope", &d.p("key.env"), "--peer", &peer2][..],
            &tls,
            &["--alg", "ecdsa-p256-sha256", "--in", &d.p("msg"), "--out", &d.p("refused.sig"), "--timeout-ms", "2000"],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("tenant `client` may not use key"), "{}", stderr(&o));
    drop(strict);

    // Killed: the next remote signature fails with exit 3, within its timeout.
    drop(server);
    let t = Instant::now();
    let o = sign(&d.p("late.sig"));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(stderr(&o).contains("remote"), "{}", stderr(&o));
}

#[test]
fn a_store_named_relative_to_the_current_directory_is_created() {
    // docs/remote.md's example runs `authority init --store store` in a
    // fresh directory.
    let d = Dir::new("relative-store");
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_keyfence")).args(args).current_dir(&d.0).output().unwrap();
    let o = run(&["authority", "init", "--store", "store"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["authority", "issue", "--store", "store", "--attrs", "country=US", "--out", "m.machine"]);
    assert!(o.status.success(), "{}", stderr(&o));
}
