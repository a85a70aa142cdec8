//! What a command may write: never over one of its own inputs (however the
//! path is spelled: `dir/../dir/file`, a symbolic link, a hard link), never
//! over a master secret key, never through a link planted at the output
//! path or in a predictable scratch folder; and the folders it makes for
//! secrets are its owner's only.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{is_root, skip_unless, stderr, Dir, REQUIRE_ROOT};

/// Runs `keyfence` in `cwd` (so relative spellings are relative to it).
fn run_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyfence")).current_dir(cwd).args(args).output().expect("run keyfence")
}

fn ok_in(cwd: &Path, args: &[&str]) {
    let o = run_in(cwd, args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
}

/// The fixture every case uses, in `d` (paths relative to it): an ABE
/// authority in `auth/`, a wrap store in `store/`, a machine key, an
/// envelope, an attribute key, a ciphertext, a message and an Ed25519 key.
fn fixture(d: &Dir) {
    let cwd = &d.0;
    ok_in(cwd, &["abe", "setup", "--out", "auth"]);
    ok_in(cwd, &["authority", "init", "--store", "store"]);
    std::fs::create_dir_all(d.0.join("in")).unwrap();
    std::fs::write(d.0.join("in/msg"), b"a message").unwrap();
    std::fs::write(d.0.join("in/secret"), b"a secret to wrap").unwrap();
    ok_in(cwd, &["abe", "keygen", "--msk", "auth/msk.bin", "--attrs", "region=EU", "--out", "in/user.key"]);
    ok_in(cwd, &["abe", "encrypt", "--pk", "auth/pk.bin", "--policy", "region: EU", "--in", "in/msg", "--out", "in/ct"]);
    ok_in(cwd, &["authority", "issue", "--store", "store", "--attrs", "region=EU", "--out", "in/m.machine"]);
    ok_in(cwd, &["authority", "wrap", "--store", "store", "--policy", "region: EU", "--in", "in/secret", "--out", "in/s.env"]);
    let key = openssl::pkey::PKey::generate_ed25519().unwrap();
    std::fs::write(d.0.join("in/ed.pem"), key.private_key_to_pem_pkcs8().unwrap()).unwrap();
    std::fs::write(d.0.join("in/tls.key"), b"not read before the output is checked").unwrap();
}

/// One command with `--out`: its arguments with `OUT` where the output
/// goes, and the inputs (relative to the fixture) it must not write over.
struct Case {
    args: &'static [&'static str],
    inputs: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case { args: &["abe", "keygen", "--msk", "auth/msk.bin", "--attrs", "region=EU", "--out", "OUT"], inputs: &["auth/msk.bin"] },
    Case {
        args: &["abe", "encrypt", "--pk", "auth/pk.bin", "--policy", "region: EU", "--in", "in/msg", "--out", "OUT"],
        inputs: &["auth/pk.bin", "in/msg"],
    },
    Case { args: &["abe", "decrypt", "--key", "in/user.key", "--in", "in/ct", "--out", "OUT"], inputs: &["in/user.key", "in/ct"] },
    Case { args: &["authority", "issue", "--store", "store", "--attrs", "region=EU", "--out", "OUT"], inputs: &["store"] },
    Case {
        args: &["authority", "wrap", "--store", "store", "--policy", "region: EU", "--in", "in/secret", "--out", "OUT"],
        inputs: &["in/secret"],
    },
    Case {
        args: &["machine", "open", "--store", "store", "--key", "in/m.machine", "--in", "in/s.env", "--out", "OUT"],
        inputs: &["in/m.machine", "in/s.env"],
    },
    Case { args: &["sign", "--key", "in/ed.pem", "--alg", "ed25519", "--in", "in/msg", "--out", "OUT"], inputs: &["in/ed.pem", "in/msg"] },
    // The remote inputs are checked before any server is asked.
    Case {
        args: &[
            "sign",
            "--remote",
            "--envelope",
            "in/s.env",
            "--peer",
            "sfo1,127.0.0.1:9,region=EU",
            "--tls-cert",
            "in/msg",
            "--tls-key",
            "in/tls.key",
            "--tls-ca",
            "in/msg",
            "--alg",
            "ed25519",
            "--in",
            "in/msg",
            "--out",
            "OUT",
        ],
        inputs: &["in/s.env", "in/tls.key"],
    },
];

/// The master secret keys of the fixture: CIRCL's msk and the wrap
/// authority's state.
const MASTERS: &[&str] = &["auth/msk.bin", "store/authority/state"];

fn with_out(args: &[&str], out: &str) -> Vec<String> {
    args.iter().map(|a| if *a == "OUT" { out.to_string() } else { a.to_string() }).collect()
}

/// Everything a file is: its bytes and whether the path is a link.
fn snapshot(p: &Path) -> (Vec<u8>, bool) {
    let link = std::fs::symlink_metadata(p).unwrap().file_type().is_symlink();
    let bytes = if p.is_dir() { Vec::new() } else { std::fs::read(p).unwrap() };
    (bytes, link)
}

/// Runs `case` with `--out spelling`, which must be refused with exit 2,
/// a message naming `spelling` and `named`, and every protected file
/// (`spelling` itself, `protected`) as it was.
fn refused(d: &Dir, case: &Case, spelling: &str, named: &str, protected: &str) {
    let before = (snapshot(&d.0.join(spelling)), snapshot(&d.0.join(protected)));
    let args = with_out(case.args, spelling);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_in(&d.0, &args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?} --out {spelling}: {err}");
    assert!(err.contains(spelling) && err.contains(named), "{args:?}: the message names {spelling} and {named}: {err}");
    let after = (snapshot(&d.0.join(spelling)), snapshot(&d.0.join(protected)));
    assert!(before == after, "{args:?} --out {spelling} changed {protected}");
}

#[test]
fn no_command_writes_over_one_of_its_inputs_however_it_is_spelled() {
    let d = Dir::new("out-inputs");
    fixture(&d);
    std::fs::create_dir_all(d.0.join("links")).unwrap();
    for (i, case) in CASES.iter().enumerate() {
        for input in case.inputs {
            // The input itself, a relative spelling through `..`, a
            // symbolic link to it, a hard link to it (files only).
            let (dir, file) = input.rsplit_once('/').map_or((".", *input), |(d, f)| (d, f));
            let dotdot = if dir == "." { format!("./{file}") } else { format!("{dir}/../{dir}/{file}") };
            let sym = format!("links/sym-{i}-{file}");
            std::os::unix::fs::symlink(d.0.join(input), d.0.join(&sym)).unwrap();
            let mut spellings = vec![input.to_string(), dotdot, sym];
            if d.0.join(input).is_file() {
                let hard = format!("links/hard-{i}-{file}");
                std::fs::hard_link(d.0.join(input), d.0.join(&hard)).unwrap();
                spellings.push(hard);
            }
            for s in &spellings {
                refused(&d, case, s, input, input);
            }
        }
        // The same command with a fresh output works: the refusals above
        // are not some other failure. (Remote signing needs a server.)
        if case.args.contains(&"--remote") {
            continue;
        }
        let fresh = format!("fresh-{i}");
        let args = with_out(case.args, &fresh);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok_in(&d.0, &args);
        assert!(d.0.join(&fresh).is_file(), "{args:?}");
    }
}

#[test]
fn no_command_replaces_a_master_secret_key() {
    let d = Dir::new("out-masters");
    fixture(&d);
    // A copy of each master key under an innocent name: recognised by
    // its contents, not its name or place.
    std::fs::create_dir_all(d.0.join("copies")).unwrap();
    std::fs::copy(d.0.join("auth/msk.bin"), d.0.join("copies/notes.txt")).unwrap();
    std::fs::copy(d.0.join("store/authority/state"), d.0.join("copies/backup")).unwrap();
    std::os::unix::fs::symlink(d.0.join("auth/msk.bin"), d.0.join("copies/link")).unwrap();
    let targets = [MASTERS[0], MASTERS[1], "copies/notes.txt", "copies/backup", "copies/link"];
    for case in CASES {
        for t in targets {
            let protected = if t == "copies/link" { "auth/msk.bin" } else { t };
            refused(&d, case, t, "master secret key", protected);
        }
    }
    // `abe setup` refuses an existing msk.bin without --force, and a
    // master key where pk.bin goes even with it.
    std::fs::create_dir_all(d.0.join("setup")).unwrap();
    std::fs::copy(d.0.join("auth/msk.bin"), d.0.join("setup/pk.bin")).unwrap();
    let before = std::fs::read(d.0.join("setup/pk.bin")).unwrap();
    for force in [false, true] {
        let mut args = vec!["abe", "setup", "--out", "setup"];
        if force {
            args.push("--force");
        }
        let o = run_in(&d.0, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("setup/pk.bin") && stderr(&o).contains("master secret key"), "{}", stderr(&o));
        assert_eq!(std::fs::read(d.0.join("setup/pk.bin")).unwrap(), before);
        assert!(!d.0.join("setup/msk.bin").exists());
    }
    let msk = std::fs::read(d.0.join("auth/msk.bin")).unwrap();
    let o = run_in(&d.0, &["abe", "setup", "--out", "auth"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.0.join("auth/msk.bin")).unwrap(), msk);
    // --force says so: a new authority replaces the old one.
    ok_in(&d.0, &["abe", "setup", "--out", "auth", "--force"]);
    assert_ne!(std::fs::read(d.0.join("auth/msk.bin")).unwrap(), msk);
}

/// The commands whose outputs must land where their links lead: public
/// outputs (a ciphertext, an envelope, a signature) and secret ones.
const LINK_CASES: [&[&str]; 5] = [
    &["abe", "encrypt", "--pk", "auth/pk.bin", "--policy", "region: EU", "--in", "in/msg", "--out", "OUT"],
    &["authority", "wrap", "--store", "store", "--policy", "region: EU", "--in", "in/secret", "--out", "OUT"],
    &["sign", "--key", "in/ed.pem", "--alg", "ed25519", "--in", "in/msg", "--out", "OUT"],
    &["abe", "decrypt", "--key", "in/user.key", "--in", "in/ct", "--out", "OUT"],
    &["abe", "keygen", "--msk", "auth/msk.bin", "--attrs", "region=EU", "--out", "OUT"],
];

/// The temporary files an output left in `dir` (none, when it went well).
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.contains(".tmp-")).collect()
}

#[test]
fn a_link_of_ones_own_is_followed_and_its_target_replaced_whole() {
    let d = Dir::new("out-own-link");
    fixture(&d);
    std::fs::create_dir_all(d.0.join("real")).unwrap();
    let target = d.0.join("real/target");
    for args in LINK_CASES {
        std::fs::write(&target, b"the old contents").unwrap();
        let _ = std::fs::remove_file(d.0.join("link"));
        // A relative link, as `ln -s real/target link` makes.
        std::os::unix::fs::symlink("real/target", d.0.join("link")).unwrap();
        ok_in(&d.0, &with_out(args, "link").iter().map(String::as_str).collect::<Vec<_>>());
        assert!(std::fs::symlink_metadata(d.0.join("link")).unwrap().file_type().is_symlink(), "{args:?}: the link was replaced");
        let now = std::fs::read(&target).unwrap();
        assert!(now != b"the old contents" && !now.is_empty(), "{args:?} did not write what the link names");
        assert!(leftovers(&d.0).is_empty() && leftovers(&d.0.join("real")).is_empty(), "{args:?}");
    }
}

/// Makes `p` belong to `uid` (the link itself, not what it names).
fn lchown(p: &Path, uid: u32) {
    let o = Command::new("chown").arg("-h").arg(uid.to_string()).arg(p).output().expect("chown");
    assert!(o.status.success(), "chown -h {uid} {}: {}", p.display(), stderr(&o));
}

#[test]
fn a_link_planted_in_a_shared_folder_by_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    if skip_unless(is_root(), "making another user's link needs root", REQUIRE_ROOT) {
        return;
    }
    let d = Dir::new("out-planted");
    fixture(&d);
    // A folder like /tmp: sticky and writable by everyone, owned by root.
    let shared = d.0.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = d.0.join("victim");
    for args in LINK_CASES {
        std::fs::write(&victim, b"the victim's file").unwrap();
        let planted = shared.join("planted");
        let _ = std::fs::remove_file(&planted);
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        // Another user's link: refused, nothing written anywhere.
        lchown(&planted, 65534);
        let o = run_in(&d.0, &with_out(args, "shared/planted").iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("shared/planted") && err.contains("protected_symlinks"), "{args:?}: {err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"the victim's file", "{args:?} wrote through the planted link");
        assert!(std::fs::symlink_metadata(&planted).unwrap().file_type().is_symlink(), "{args:?} replaced the link");
        assert!(leftovers(&shared).is_empty(), "{args:?}");
        // The same link in a folder deeper down the path is refused too:
        // the rule holds for every link of the path, not the last alone.
        let _ = std::fs::remove_file(shared.join("dir"));
        std::os::unix::fs::symlink(d.0.join("in"), shared.join("dir")).unwrap();
        lchown(&shared.join("dir"), 65534);
        let o = run_in(&d.0, &with_out(args, "shared/dir/new-file").iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!d.0.join("in/new-file").exists(), "{args:?} wrote through a planted folder link");
        // The user's own link there is followed (as the kernel's rule does).
        lchown(&planted, 0);
        ok_in(&d.0, &with_out(args, "shared/planted").iter().map(String::as_str).collect::<Vec<_>>());
        assert_ne!(std::fs::read(&victim).unwrap(), b"the victim's file", "{args:?}");
    }
    // So is a link that belongs to the folder's owner.
    let theirs = d.0.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    lchown(&theirs, 65534);
    std::fs::write(&victim, b"the victim's file").unwrap();
    std::os::unix::fs::symlink(&victim, theirs.join("link")).unwrap();
    lchown(&theirs.join("link"), 65534);
    ok_in(&d.0, &with_out(LINK_CASES[0], "theirs/link").iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(std::fs::read(&victim).unwrap(), b"the victim's file");
}

/// Every command that writes a file, with `OUT` where its output goes; the
/// second field says whether the same inputs give the same bytes (then the
/// special targets must receive exactly those; otherwise as many).
fn writers() -> Vec<(Vec<&'static str>, bool)> {
    let mut v: Vec<(Vec<&'static str>, bool)> = CASES
        .iter()
        .filter(|c| !c.args.contains(&"--remote"))
        .map(|c| {
            let deterministic = matches!(c.args[..2], ["abe", "decrypt"] | ["machine", "open"] | ["sign", _]);
            (c.args.to_vec(), deterministic)
        })
        .collect();
    v.push((vec!["provider-key", "--envelope", "in/ed.env", "--store", "store", "--machine-key", "in/m.machine", "--out", "OUT"], true));
    v
}

/// What a command writes when `OUT` is a fresh regular file.
fn regular_output(d: &Dir, args: &[&str]) -> Vec<u8> {
    let _ = std::fs::remove_file(d.0.join("regular"));
    ok_in(&d.0, &with_out(args, "regular").iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::read(d.0.join("regular")).unwrap()
}

/// A FIFO at `p` (by `mkfifo`), and a thread that reads it to its end.
fn fifo_with_reader(p: &Path) -> FifoReader {
    let o = Command::new("mkfifo").arg(p).output().expect("mkfifo");
    assert!(o.status.success(), "mkfifo: {}", stderr(&o));
    let (tx, rx) = std::sync::mpsc::channel();
    let path = p.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(path).unwrap());
    });
    FifoReader { path: p.to_path_buf(), rx }
}

/// What a FIFO's reader got.
struct FifoReader {
    path: PathBuf,
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
}

impl FifoReader {
    /// The bytes read; a writer that never came (the FIFO replaced by a
    /// file, say) fails the test in 30 s instead of hanging it.
    fn join(self) -> Vec<u8> {
        self.rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("nothing was written into the FIFO {} in 30 s", self.path.display()))
    }
}

fn is_fifo(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).unwrap().file_type().is_fifo()
}

/// Checks bytes that went to a special target against a regular run's.
fn same_output(what: &str, args: &[&str], got: &[u8], regular: &[u8], deterministic: bool) {
    if deterministic {
        assert!(got == regular, "{args:?} into {what}: other bytes than into a file");
    } else {
        assert_eq!(got.len(), regular.len(), "{args:?} into {what}: {} bytes, a file gets {}", got.len(), regular.len());
    }
}

#[test]
fn outputs_onto_fifos_and_descriptor_links_are_written_in_place() {
    let d = Dir::new("out-special");
    fixture(&d);
    ok_in(&d.0, &["authority", "wrap", "--store", "store", "--policy", "region: EU", "--in", "in/ed.pem", "--out", "in/ed.env"]);
    for (i, (args, deterministic)) in writers().into_iter().enumerate() {
        let regular = regular_output(&d, &args);
        // A FIFO with a reader: the reader gets the bytes, the FIFO stays.
        let fifo = d.0.join(format!("fifo-{i}"));
        let reader = fifo_with_reader(&fifo);
        ok_in(&d.0, &with_out(&args, &format!("fifo-{i}")).iter().map(String::as_str).collect::<Vec<_>>());
        same_output("a FIFO", &args, &reader.join(), &regular, deterministic);
        assert!(is_fifo(&fifo), "{args:?}: the FIFO was replaced");
        // A link to this process's standard output, to `/dev/stdout`, to
        // `/dev/fd/1`: what the command prints is the output; the link
        // stays. (The machine's own `/dev/stdout` is reached through a
        // link here, so a regression replaces the link, not the device.)
        for (name, to) in [("so", "/proc/self/fd/1"), ("devstdout", "/dev/stdout"), ("devfd", "/dev/fd/1")] {
            let link = d.0.join(format!("{name}-{i}"));
            std::os::unix::fs::symlink(to, &link).unwrap();
            let o = run_in(&d.0, &with_out(&args, &format!("{name}-{i}")).iter().map(String::as_str).collect::<Vec<_>>());
            assert!(o.status.success(), "{args:?} --out {name} -> {to}: {}", stderr(&o));
            same_output(to, &args, &o.stdout, &regular, deterministic);
            assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "{args:?}: {name} was replaced");
        }
        // Standard error, through a link to `/dev/stderr`.
        let link = d.0.join(format!("se-{i}"));
        std::os::unix::fs::symlink("/dev/stderr", &link).unwrap();
        let o = run_in(&d.0, &with_out(&args, &format!("se-{i}")).iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{args:?}");
        same_output("/dev/stderr", &args, &o.stderr, &regular, deterministic);
        assert!(leftovers(&d.0).is_empty(), "{args:?}");
    }
    // `abe setup --out DIR` writes two files into DIR: both FIFOs.
    let setup = d.0.join("setup-fifos");
    std::fs::create_dir(&setup).unwrap();
    let (pk, msk) = (fifo_with_reader(&setup.join("pk.bin")), fifo_with_reader(&setup.join("msk.bin")));
    ok_in(&d.0, &["abe", "setup", "--out", "setup-fifos"]);
    let (pk, msk) = (pk.join(), msk.join());
    assert_eq!(
        (pk.len(), msk.len()),
        (std::fs::read(d.0.join("auth/pk.bin")).unwrap().len(), std::fs::read(d.0.join("auth/msk.bin")).unwrap().len())
    );
    assert!(is_fifo(&setup.join("pk.bin")) && is_fifo(&setup.join("msk.bin")));
}

#[test]
fn outputs_onto_devices_are_written_in_place_never_replaced() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if skip_unless(is_root(), "mknod needs root", REQUIRE_ROOT) {
        return;
    }
    let d = Dir::new("out-devices");
    fixture(&d);
    ok_in(&d.0, &["authority", "wrap", "--store", "store", "--policy", "region: EU", "--in", "in/ed.pem", "--out", "in/ed.env"]);
    // A null device of the scratch folder's own (what `--out /dev/null`
    // meets), and a link to it.
    let o = Command::new("mknod").arg(d.0.join("null")).args(["c", "1", "3"]).output().expect("mknod");
    assert!(o.status.success(), "mknod: {}", stderr(&o));
    std::os::unix::fs::symlink("null", d.0.join("to-null")).unwrap();
    let check = |p: &Path, what: &str| {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3), "{what}: the device was replaced: {m:?}");
    };
    let mut all = writers();
    all.push((vec!["abe", "setup", "--out", "OUT"], false));
    for (args, _) in all {
        if args[..2] == ["abe", "setup"] {
            // The two files of `abe setup --out DIR`, devices.
            let dir = d.0.join("setup-devices");
            std::fs::create_dir_all(&dir).unwrap();
            for f in ["pk.bin", "msk.bin"] {
                let _ = std::fs::remove_file(dir.join(f));
                let o = Command::new("mknod").arg(dir.join(f)).args(["c", "1", "3"]).output().unwrap();
                assert!(o.status.success());
            }
            ok_in(&d.0, &["abe", "setup", "--out", "setup-devices"]);
            check(&dir.join("pk.bin"), "abe setup pk.bin");
            check(&dir.join("msk.bin"), "abe setup msk.bin");
            continue;
        }
        for out in ["null", "to-null"] {
            ok_in(&d.0, &with_out(&args, out).iter().map(String::as_str).collect::<Vec<_>>());
            check(&d.0.join("null"), &format!("{args:?} --out {out}"));
        }
        assert!(std::fs::symlink_metadata(d.0.join("to-null")).unwrap().file_type().is_symlink());
        assert!(leftovers(&d.0).is_empty(), "{args:?}");
    }
}

#[test]
fn folders_made_for_secrets_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dir::new("out-modes");
    ok_in(&d.0, &["abe", "setup", "--out", "new/auth"]);
    ok_in(&d.0, &["authority", "init", "--store", "new/store"]);
    for dir in ["new/auth", "new/store", "new/store/authority", "new/store/public"] {
        let mode = std::fs::metadata(d.0.join(dir)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{dir}: {mode:o}");
    }
    let mode = std::fs::metadata(d.0.join("new/auth/msk.bin")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// Starts `keyfence ARGS` from a shell that waits for a line on its
/// standard input before it `exec`s: the pid, and so any name derived from
/// it, is known before keyfence runs.
fn spawn_with_known_pid(tmpdir: &Path, args: &[&str]) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg("read go && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_keyfence"))
        .args(args)
        .env("TMPDIR", tmpdir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh")
}

/// Plants, for a process whose pid is known before it runs, the folder a
/// predictable scratch name would give it, with `file` in it linked to a
/// victim; runs it; checks that the victim and the planted folder are as
/// they were.
fn planted_scratch_is_not_used(name: &str, args: &[&str], file: &str) {
    let d = Dir::new(&format!("scratch-{name}"));
    let tmp = d.0.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let victim = d.0.join("victim");
    std::fs::write(&victim, b"the victim's file").unwrap();
    let mut child = spawn_with_known_pid(&tmp, args);
    let planted: PathBuf = tmp.join(format!("keyfence-{name}-{}", child.id()));
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::symlink(&victim, planted.join(file)).unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    assert_eq!(std::fs::read(&victim).unwrap(), b"the victim's file", "{name} wrote through the planted link");
    assert!(std::fs::symlink_metadata(planted.join(file)).unwrap().file_type().is_symlink(), "{name} used the planted folder");
    // And its own scratch folder is gone.
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().path()).filter(|p| *p != planted).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn bench_sign_does_not_use_a_planted_scratch_folder() {
    planted_scratch_is_not_used(
        "bench-sign",
        &["bench", "sign", "--case", "ed25519", "--path", "isolated", "--seconds", "0.05", "--threads", "1"],
        "ed25519.der",
    );
}

#[test]
fn demo_does_not_use_a_planted_scratch_folder() {
    planted_scratch_is_not_used("demo", &["demo"], "fra1.machine-key");
}

#[test]
fn bench_wrap_does_not_use_a_planted_scratch_folder() {
    // The store in the scratch folder takes its writer lock on `.lock`.
    planted_scratch_is_not_used("bench-wrap", &["bench", "wrap", "--iters", "2"], ".lock");
}

#[test]
fn bench_remote_does_not_use_a_planted_scratch_folder() {
    planted_scratch_is_not_used(
        "bench-remote",
        &["bench", "remote", "--seconds", "0.2", "--in-flight", "4", "--server-threads", "1"],
        "ca.pem",
    );
}
