//! `keyfence provider-key` and `keyfence provider-config`: the key file
//! OpenSSL programs load through the provider (docs/openssl.md) and the
//! openssl.cnf that loads it. The provider itself is tested by
//! bindings/openssl/tests against OpenSSL.

mod common;

use common::{keyfence as run, ok, openssl, Dir};

/// The body of a `KEYFENCE KEY` PEM file.
fn body(pem: &str) -> Vec<u8> {
    let b64: String = pem
        .lines()
        .skip_while(|l| *l != "-----BEGIN KEYFENCE KEY-----")
        .skip(1)
        .take_while(|l| *l != "-----END KEYFENCE KEY-----")
        .collect();
    // Decoded by openssl, an implementation other than the one that wrote it.
    let d = Dir::new("b64");
    std::fs::write(d.p("in"), b64).unwrap();
    openssl(&d, &["base64", "-d", "-A", "-in", &d.p("in")])
}

/// The fields of a version-1 body, in order: (tag, value).
fn fields(body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    assert_eq!(&body[..5], b"KFKEY");
    assert_eq!(body[5], 1, "version");
    let mut out = Vec::new();
    let mut i = 6;
    while i < body.len() {
        let n = u32::from_be_bytes(body[i + 1..i + 5].try_into().unwrap()) as usize;
        out.push((body[i], body[i + 5..i + 5 + n].to_vec()));
        i += 5 + n;
    }
    assert_eq!(i, body.len());
    out
}

#[test]
fn provider_key_names_the_envelope_and_carries_the_public_key() {
    let d = Dir::new("pk");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "country=US", "--out", &d.p("us.key")]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "country=FR", "--out", &d.p("fr.key")]);
    let pem = openssl(&d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]);
    std::fs::write(d.p("k.pem"), &pem).unwrap();
    ok(&["authority", "wrap", "--store", &s, "--policy", "country: US", "--in", &d.p("k.pem"), "--out", &d.p("k.env")]);
    ok(&["provider-key", "--envelope", &d.p("k.env"), "--store", &s, "--machine-key", &d.p("us.key"), "--out", &d.p("k.kfk")]);

    let text = std::fs::read_to_string(d.p("k.kfk")).unwrap();
    assert!(text.starts_with("-----BEGIN KEYFENCE KEY-----\n") && text.ends_with("-----END KEYFENCE KEY-----\n"));
    assert!(!text.contains("PRIVATE"), "the key file holds no private key");
    let f = fields(&body(&text));
    let get = |tag: u8| f.iter().find(|(t, _)| *t == tag).map(|(_, v)| v.clone());
    assert_eq!(get(1), Some(vec![0]), "local mode");
    let spki = openssl(&d, &["pkey", "-in", &d.p("k.pem"), "-pubout", "-outform", "DER"]);
    assert_eq!(get(2), Some(spki), "the public key is the wrapped key's");
    assert_eq!(get(3), Some(std::fs::read(d.p("k.env")).unwrap()), "the envelope");
    let store = std::fs::canonicalize(&s).unwrap();
    assert_eq!(get(4), Some(store.to_str().unwrap().as_bytes().to_vec()), "the store, absolute");
    let mk = std::fs::canonicalize(d.p("us.key")).unwrap();
    assert_eq!(get(5), Some(mk.to_str().unwrap().as_bytes().to_vec()), "the machine key, absolute");

    // A machine that may not open the envelope gets no key file.
    let o = run(&["provider-key", "--envelope", &d.p("k.env"), "--store", &s, "--machine-key", &d.p("fr.key"), "--out", &d.p("fr.kfk")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot open the envelope"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!std::path::Path::new(&d.p("fr.kfk")).exists());
    // Local or remote: one of them.
    let o = run(&["provider-key", "--envelope", &d.p("k.env"), "--out", &d.p("x.kfk")]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn provider_config_loads_default_then_keyfence() {
    let d = Dir::new("pc");
    std::fs::write(d.p("keyfence.so"), b"").unwrap();
    std::fs::create_dir(d.p("store")).unwrap();
    std::fs::write(d.p("m.key"), b"").unwrap();
    let cnf =
        ok(&["provider-config", "--module", &d.p("keyfence.so"), "--store", &d.p("store"), "--machine-key", &d.p("m.key"), "--isolated"]);
    let module = std::fs::canonicalize(d.p("keyfence.so")).unwrap();
    assert!(cnf.contains(&format!("module = {}\n", module.display())), "{cnf}");
    assert!(cnf.contains("isolated = yes\n"), "{cnf}");
    assert!(cnf.contains("machine-key = "), "{cnf}");
    let default_at = cnf.find("default = default_sect").expect("default provider");
    let keyfence_at = cnf.find("keyfence = keyfence_sect").expect("keyfence provider");
    assert!(default_at < keyfence_at, "the default provider comes first (OpenSSL fetches from the first)");
    assert!(cnf.contains("[default_sect]\nactivate = 1"), "{cnf}");
    let plain = ok(&["provider-config", "--module", &d.p("keyfence.so")]);
    assert!(plain.contains("isolated = no\n") && !plain.contains("store ="), "{plain}");
    let o = run(&["provider-config", "--module", &d.p("missing.so")]);
    assert_eq!(o.status.code(), Some(2));
}

/// A process that maps a file while it runs, as a server maps the
/// provider: the file (a copy of `sleep`) is its executable.
struct Held(std::process::Child);

impl Held {
    fn run(program: &std::path::Path) -> Held {
        // Another test's fork may briefly hold the copy's write descriptor
        // (ETXTBSY) between its fork and exec.
        for _ in 0..100 {
            match std::process::Command::new(program).arg("60").spawn() {
                Ok(child) => {
                    // The kernel lets the parent go on before the new program
                    // is mapped: wait until it is.
                    let exe = std::fs::canonicalize(program).unwrap();
                    let maps = format!("/proc/{}/maps", child.id());
                    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
                    while !std::fs::read_to_string(&maps).unwrap_or_default().contains(exe.to_str().unwrap()) {
                        assert!(std::time::Instant::now() < until, "{} never mapped {}", child.id(), exe.display());
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    return Held(child);
                }
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(e) => panic!("{}: {e}", program.display()),
            }
        }
        panic!("{} stayed busy", program.display());
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn provider_check_names_the_restart_a_reload_does_not_give() {
    let d = Dir::new("check");
    let module = d.0.join("keyfence.so");
    std::fs::copy("/bin/sleep", &module).unwrap();
    let include = d.p("openssl-include.cnf");
    std::fs::write(&include, ok(&["provider-config", "--module", module.to_str().unwrap(), "--include"])).unwrap();
    let cnf = d.p("openssl.cnf");
    std::fs::write(&cnf, format!("openssl_conf = openssl_init\n\n# the system's own\n.include {include}\n")).unwrap();
    let check = |extra: &[&str]| run(&[&["provider-check", "--config", &cnf][..], extra].concat());

    // The configuration alone.
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert!(common::stdout(&o).contains("loads keyfence's provider"), "{}", common::stdout(&o));
    // A configuration without the include: the line to add.
    let bare = d.p("bare.cnf");
    std::fs::write(&bare, "openssl_conf = openssl_init\n[openssl_init]\n").unwrap();
    let o = run(&["provider-check", "--config", &bare]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains(".include /etc/keyfence/openssl-include.cnf"), "{}", common::stderr(&o));

    // A server that read OpenSSL's configuration before the include (the
    // control: it never mapped the module) is told to restart.
    let before = Held::run(std::path::Path::new("/bin/sleep"));
    let o = check(&["--pid", &before.pid()]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("has not loaded keyfence's provider"), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("a restart, not a reload"), "{}", common::stderr(&o));
    // One that loaded it passes, beside the other's problem.
    let loaded = Held::run(&module);
    let o = check(&["--pid", &loaded.pid()]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    // (Its name is not asserted: the kernel may set it after the program
    // is mapped.)
    let says = common::stdout(&o);
    assert!(says.contains(&format!("ok: pid {} (", loaded.pid())) && says.contains(") has loaded"), "{says}");
    let o = check(&["--pid", &loaded.pid(), "--pid", &before.pid()]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    // An upgrade replaces the file under it.
    std::fs::remove_file(&module).unwrap();
    std::fs::copy("/bin/sleep", &module).unwrap();
    let o = check(&["--pid", &loaded.pid()]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("an upgrade replaced"), "{}", common::stderr(&o));
    // The package removed, the include left behind.
    std::fs::remove_file(&module).unwrap();
    let o = check(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(common::stderr(&o).contains("which is not there"), "{}", common::stderr(&o));
    // A process that is not there; a configuration that cannot be read.
    let o = check(&["--pid", "999999999"]);
    assert!(o.status.code() == Some(1) && common::stderr(&o).contains("no process 999999999"), "{}", common::stderr(&o));
    let o = run(&["provider-check", "--config", &d.p("missing.cnf")]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
}
