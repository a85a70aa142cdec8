//! The one way a test skips: loudly, and never where the environment was
//! to provide what it lacks. `./x test` installs etcd, SoftHSM2 and the
//! servers, runs as root on CI, and sets the `KEYFENCE_REQUIRE_*` variable
//! of each; with one set, a test that would skip for want of it fails.
//! Shared by the core's tests and the command line's (included with
//! `#[path]`), and by the support modules that probe the environment.
#![allow(dead_code)]

/// Set by `./x` when it installed etcd: an etcd test may not skip.
pub const REQUIRE_ETCD: &str = "KEYFENCE_REQUIRE_ETCD";

/// Set by `./x` when it installed the servers and SoftHSM2: a PKCS#11
/// test may not skip.
pub const REQUIRE_SERVERS: &str = "KEYFENCE_REQUIRE_SERVERS";

/// Set by `./x test` when it runs as root: a test that runs something as
/// another user may not skip.
pub const REQUIRE_ROOT: &str = "KEYFENCE_REQUIRE_ROOT";

/// Whether the calling test must skip, because `cond` (what it needs)
/// does not hold: then it says `*** SKIPPED <test>: <why> ***` on the
/// process's own stderr, past the harness's capture (which swallows what a
/// passing test prints), and returns `true`. With `require` set it panics
/// instead: the environment was to provide it.
pub fn skip_unless(cond: bool, why: &str, require: &str) -> bool {
    if cond {
        return false;
    }
    // The harness names each test's thread after the test.
    let current = std::thread::current();
    let test = current.name().unwrap_or("a test");
    if std::env::var_os(require).is_some() {
        panic!("{test} cannot run: {why}; {require} is set, so this is a failure, not a skip");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "*** SKIPPED {test}: {why} ***");
    true
}

/// Whether this process runs as root (what running a program as another
/// user needs).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}
