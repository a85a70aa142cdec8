//! The key process's seccomp sandbox, installed once it has started and
//! before it reads its first request: a call that opens a network
//! connection, runs a program or reads another process kills it (the
//! engine then starts it again). The key process needs none of them: it
//! speaks to its parent over the socket pair it inherited, reads key
//! files, and is sent the store's objects rather than opening a store
//! (`docs/security.md`, "The key process"). OpenSSH's privilege-separated
//! child sandboxes itself the same way.
//!
//! A deny list rather than an allow list: BoringSSL, the allocator and
//! the standard library make calls that change between their versions
//! and libc's, and a list of everything they may call would turn each
//! upgrade into a crash; the calls denied here are the ones an attacker
//! holding the key process would need to move the keys elsewhere.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};

/// The calls that kill the key process. `socket` kills too, but for a
/// local (`AF_UNIX`) socket, which fails with `EACCES` instead: a PKCS#11
/// module the key process loads may log through `syslog()` (SoftHSM2 does
/// when it refuses a PIN), whose first call opens one; with `socket`
/// refused the message is dropped and the module goes on, where a kill
/// would lose every operation in flight. Without a socket nothing
/// connects, so nothing leaves either way.
const DENIED: &[(i64, &str)] = &[
    (libc::SYS_socket, "socket"),
    (libc::SYS_connect, "connect"),
    (libc::SYS_bind, "bind"),
    (libc::SYS_listen, "listen"),
    (libc::SYS_accept, "accept"),
    (libc::SYS_accept4, "accept4"),
    (libc::SYS_execve, "execve"),
    (libc::SYS_execveat, "execveat"),
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
];

/// Installs the filter on every thread of this process (and the threads
/// it starts later), with `no_new_privs` set.
///
/// # Errors
/// The kernel's refusal (a kernel without seccomp), or an architecture
/// this filter is not written for.
pub(crate) fn install() -> io::Result<()> {
    let arch = if cfg!(target_arch = "x86_64") {
        TargetArch::x86_64
    } else if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        return Err(io::Error::other("no seccomp filter for this architecture"));
    };
    let local = |op| -> io::Result<Vec<SeccompRule>> {
        let c = SeccompCondition::new(0, SeccompCmpArgLen::Dword, op, libc::AF_UNIX as u64)
            .map_err(|e| io::Error::other(format!("seccomp rule: {e}")))?;
        Ok(vec![SeccompRule::new(vec![c]).map_err(|e| io::Error::other(format!("seccomp rule: {e}")))?])
    };
    let mut kill: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|(nr, _)| (*nr, Vec::new())).collect();
    kill.insert(libc::SYS_socket, local(SeccompCmpOp::Ne)?);
    let refuse: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_socket, local(SeccompCmpOp::Eq)?)].into_iter().collect();
    // Two filters: the kernel applies the strictest answer of all, so a
    // local socket gets EACCES (the second) and any other the kill.
    for (rules, action) in [(refuse, SeccompAction::Errno(libc::EACCES as u32)), (kill, SeccompAction::KillProcess)] {
        let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch)
            .map_err(|e| io::Error::other(format!("seccomp filter: {e}")))?;
        let program: BpfProgram = filter.try_into().map_err(|e| io::Error::other(format!("seccomp filter: {e:?}")))?;
        seccompiler::apply_filter_all_threads(&program)
            .map_err(|e| io::Error::other(format!("installing the seccomp filter: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// docs/security.md names every call the sandbox denies.
    #[test]
    fn the_security_page_lists_the_denied_calls() {
        let page = include_str!("../../../../docs/security.md");
        for (_, name) in super::DENIED {
            assert!(page.contains(&format!("`{name}`")), "docs/security.md does not name `{name}`");
        }
    }
}
