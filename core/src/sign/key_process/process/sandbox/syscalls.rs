//! The key process's system calls: an allow-list compiled to seccomp-bpf
//! (rust-vmm's `seccompiler`, which Firecracker's jailer uses).
//!
//! Four filters, because one seccomp filter has one action for what it
//! matches; the kernel takes the strictest answer of all of them:
//!
//! - the allow-list ([`allowed`]): what the key process, the standard
//!   library, AWS-LC and a file-based PKCS#11 module (SoftHSM2) call;
//!   any other call fails with `EPERM`, so a new libc that tries a new
//!   call first degrades instead of crashing;
//! - two answers of their own: `clone3` fails with `ENOSYS`, so glibc
//!   starts threads with `clone`, whose flags a filter can read (`clone3`
//!   passes them in memory); a local (`AF_UNIX`) `socket` fails with
//!   `EACCES`, which a module's `syslog()` takes quietly;
//! - the calls that only an attacker makes ([`KILL`]): they kill the
//!   process, so an attempt is a crash the supervisor logs and restarts,
//!   never a silent failure an attacker can retry around.
//!
//! The list was taken from `strace -f` of the key process's tests (file,
//! envelope and SoftHSM2 keys, privilege drops, restarts), then each call
//! was checked against what it could carry out of the process: see the
//! comments in [`allowed`].

use std::collections::BTreeMap;
use std::io;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};

/// Calls that kill the key process. Each is a way out (a connection, a
/// program, another process's memory or descriptors, a kernel channel
/// other processes read) or a way around the rest of this list (io_uring
/// makes `socket` and `connect` in the kernel, where no filter sees them).
/// `socket` kills too, unless it is local (see the module's comment).
pub(crate) const KILL: &[(i64, &str)] = &[
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
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
    (libc::SYS_pidfd_getfd, "pidfd_getfd"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_unshare, "unshare"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
];

/// A rule on argument `arg` (64 bits wide: a pointer) compared with `op`
/// to `value`.
fn qarg(arg: u8, op: SeccompCmpOp, value: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(|e| io::Error::other(format!("seccomp rule: {e}")))
}

/// A rule on argument `arg` (32 bits wide) compared with `op` to `value`.
fn arg(arg: u8, op: SeccompCmpOp, value: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| io::Error::other(format!("seccomp rule: {e}")))
}

/// One rule per value: argument `at` equal to any of `values`.
fn any_of(at: u8, values: &[u64]) -> io::Result<Vec<SeccompRule>> {
    values
        .iter()
        .map(|v| SeccompRule::new(vec![arg(at, SeccompCmpOp::Eq, *v)?]).map_err(|e| io::Error::other(format!("seccomp rule: {e}"))))
        .collect()
}

fn rule(conditions: Vec<SeccompCondition>) -> io::Result<Vec<SeccompRule>> {
    Ok(vec![SeccompRule::new(conditions).map_err(|e| io::Error::other(format!("seccomp rule: {e}")))?])
}

/// The allow-list: each call with the arguments it may have (an empty
/// rule list allows any). `files_confined`: Landlock confines the file
/// system (`files.rs`), so calls that create, rename or remove files are
/// allowed and Landlock decides where; without it, nothing is opened for
/// writing and nothing is created, renamed or removed anywhere.
///
/// Left out on purpose, so they fail with `EPERM`: `chmod`, `chown`,
/// the `xattr` calls and `utimensat` (they need ownership, not write
/// access, so a file opened read-only, or the key file being loaded,
/// could be made readable by other users or carry data in an attribute);
/// `link` and `symlink`; System V IPC and POSIX message queues (channels
/// to other processes of the same user that no file rule covers);
/// `memfd_create`, `socketpair`, `fork`, `vfork`, `clone` without
/// `CLONE_THREAD`, `seccomp` and the `landlock_*` calls.
pub(crate) fn allowed(files_confined: bool, pid: u32) -> io::Result<BTreeMap<i64, Vec<SeccompRule>>> {
    let mut m: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let any = |m: &mut BTreeMap<i64, Vec<SeccompRule>>, calls: &[i64]| {
        for c in calls {
            m.insert(*c, Vec::new());
        }
    };
    // Memory, threads, time, signals to itself.
    any(
        &mut m,
        &[
            libc::SYS_brk,
            libc::SYS_mmap,
            libc::SYS_munmap,
            libc::SYS_mprotect,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_msync,
            libc::SYS_futex,
            libc::SYS_set_robust_list,
            libc::SYS_get_robust_list,
            libc::SYS_rseq,
            libc::SYS_set_tid_address,
            libc::SYS_gettid,
            libc::SYS_getpid,
            libc::SYS_getppid,
            libc::SYS_exit,
            libc::SYS_exit_group,
            libc::SYS_sched_yield,
            libc::SYS_sched_getaffinity,
            libc::SYS_getcpu,
            libc::SYS_nanosleep,
            libc::SYS_clock_nanosleep,
            libc::SYS_clock_gettime,
            libc::SYS_clock_getres,
            libc::SYS_gettimeofday,
            libc::SYS_restart_syscall,
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigreturn,
            libc::SYS_sigaltstack,
            libc::SYS_getrandom,
            libc::SYS_uname,
            libc::SYS_sysinfo,
            libc::SYS_getrusage,
            libc::SYS_times,
            libc::SYS_umask,
        ],
    );
    // A thread, never a process: the flags must hold CLONE_THREAD.
    m.insert(libc::SYS_clone, rule(vec![arg(0, SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64), libc::CLONE_THREAD as u64)?])?);
    // Signals to itself only: glibc's setuid signals each of its threads
    // (tgkill), abort() raises one. Another process is outside.
    m.insert(libc::SYS_tgkill, any_of(0, &[u64::from(pid)])?);
    m.insert(libc::SYS_kill, any_of(0, &[u64::from(pid)])?);
    // Its own limits (0 or its pid), never another process's, and never
    // raising its core-dump limit (a core file holds the keys): any
    // resource may be read, any but RLIMIT_CORE set.
    let core = libc::RLIMIT_CORE as u64;
    let mut limits = Vec::new();
    for pid in [0, u64::from(pid)] {
        let own = arg(0, SeccompCmpOp::Eq, pid)?;
        limits.extend(rule(vec![own.clone(), arg(1, SeccompCmpOp::Ne, core)?])?);
        limits.extend(rule(vec![own, qarg(2, SeccompCmpOp::Eq, 0)?])?);
    }
    m.insert(libc::SYS_prlimit64, limits);
    // prctl: reading the dumpable flag and setting it to 0 (a privilege
    // drop sets it again), no_new_privs, glibc's naming of anonymous
    // mappings (seen only by the process's own user, in its maps), and
    // reading the seccomp mode and capability bounding set; nothing else.
    // Not PR_SET_DUMPABLE 1 (a core dump or a debugger would read the
    // keys) and not PR_SET_NAME: thread names are in /proc/PID/task/*/comm,
    // which every user reads, a channel out of the sandbox.
    let mut prctl = any_of(
        0,
        &[
            libc::PR_GET_DUMPABLE as u64,
            libc::PR_GET_NAME as u64,
            libc::PR_GET_SECCOMP as u64,
            libc::PR_CAPBSET_READ as u64,
            libc::PR_SET_NO_NEW_PRIVS as u64,
            libc::PR_GET_NO_NEW_PRIVS as u64,
            PR_SET_VMA,
        ],
    )?;
    prctl.extend(rule(vec![arg(0, SeccompCmpOp::Eq, libc::PR_SET_DUMPABLE as u64)?, qarg(1, SeccompCmpOp::Eq, 0)?])?);
    m.insert(libc::SYS_prctl, prctl);
    // Ids: reading them, and dropping privileges (KeyProcess::drop_privileges):
    // these calls can only give up rights in a process without them.
    any(
        &mut m,
        &[
            libc::SYS_getuid,
            libc::SYS_geteuid,
            libc::SYS_getgid,
            libc::SYS_getegid,
            libc::SYS_getresuid,
            libc::SYS_getresgid,
            libc::SYS_getgroups,
            libc::SYS_setuid,
            libc::SYS_setgid,
            libc::SYS_setgroups,
            libc::SYS_setresuid,
            libc::SYS_setresgid,
            libc::SYS_setreuid,
            libc::SYS_setregid,
            libc::SYS_setfsuid,
            libc::SYS_setfsgid,
            libc::SYS_capget,
            libc::SYS_capset,
        ],
    );
    // The socket pair: the only socket it has (everything else was closed
    // at start, and `socket` is refused).
    any(
        &mut m,
        &[
            libc::SYS_recvfrom,
            libc::SYS_recvmsg,
            libc::SYS_sendto,
            libc::SYS_sendmsg,
            libc::SYS_shutdown,
            libc::SYS_getsockopt,
            libc::SYS_setsockopt,
            libc::SYS_getsockname,
            libc::SYS_getpeername,
            libc::SYS_ppoll,
        ],
    );
    // Descriptors it already has.
    any(
        &mut m,
        &[
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_pread64,
            libc::SYS_pwrite64,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_lseek,
            libc::SYS_close,
            libc::SYS_close_range,
            libc::SYS_dup,
            libc::SYS_dup3,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_fstat,
            libc::SYS_fstatfs,
            libc::SYS_getdents64,
        ],
    );
    // fcntl: descriptor flags and duplicates. Not F_SETOWN/F_SETSIG, which
    // would signal another process, and no locks (nor `flock`): a lock on
    // a file other users can read is seen by them (F_GETLK, /proc/locks),
    // a channel out of the sandbox, and holding another program's lock
    // (the store's, an authority's) makes it wait.
    m.insert(
        libc::SYS_fcntl,
        any_of(
            1,
            &[
                libc::F_DUPFD as u64,
                libc::F_DUPFD_CLOEXEC as u64,
                libc::F_GETFD as u64,
                libc::F_SETFD as u64,
                libc::F_GETFL as u64,
                libc::F_SETFL as u64,
            ],
        )?,
    );
    // ioctl: what isatty() and non-blocking I/O ask; never TIOCSTI, which
    // types into a terminal the process inherited. (The numbers are
    // `c_ulong` on glibc, `c_int` on musl: the casts stay.)
    #[allow(clippy::unnecessary_cast)]
    m.insert(
        libc::SYS_ioctl,
        any_of(1, &[libc::TCGETS as u64, libc::FIONBIO as u64, libc::FIOCLEX as u64, libc::FIONCLEX as u64, libc::FIONREAD as u64])?,
    );
    // Looking at files: stat and friends, and opening.
    any(
        &mut m,
        &[
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_faccessat,
            libc::SYS_faccessat2,
            libc::SYS_readlinkat,
            libc::SYS_getcwd,
            libc::SYS_statfs,
        ],
    );
    #[cfg(target_arch = "x86_64")]
    any(
        &mut m,
        &[
            libc::SYS_stat,
            libc::SYS_lstat,
            libc::SYS_access,
            libc::SYS_readlink,
            libc::SYS_poll,
            libc::SYS_dup2,
            libc::SYS_arch_prctl,
            libc::SYS_getrlimit,
            libc::SYS_time,
        ],
    );
    // The old setrlimit: as prlimit64, never RLIMIT_CORE.
    #[cfg(target_arch = "x86_64")]
    m.insert(libc::SYS_setrlimit, rule(vec![arg(0, SeccompCmpOp::Ne, libc::RLIMIT_CORE as u64)?])?);
    if files_confined {
        // Landlock decides where a file may be opened, made, renamed or
        // removed (files.rs): a token module's folder only.
        any(
            &mut m,
            &[
                libc::SYS_openat,
                libc::SYS_ftruncate,
                libc::SYS_fallocate,
                libc::SYS_renameat,
                libc::SYS_renameat2,
                libc::SYS_unlinkat,
                libc::SYS_mkdirat,
            ],
        );
        #[cfg(target_arch = "x86_64")]
        any(&mut m, &[libc::SYS_open, libc::SYS_rename, libc::SYS_unlink, libc::SYS_mkdir, libc::SYS_rmdir]);
    } else {
        // No Landlock: open for reading only (no O_WRONLY, O_RDWR, O_CREAT
        // or O_TRUNC), so neither another process's `/proc/PID/mem` nor any
        // file is written.
        let write = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;
        m.insert(libc::SYS_openat, rule(vec![arg(2, SeccompCmpOp::MaskedEq(write), 0)?])?);
        #[cfg(target_arch = "x86_64")]
        m.insert(libc::SYS_open, rule(vec![arg(1, SeccompCmpOp::MaskedEq(write), 0)?])?);
    }
    Ok(m)
}

/// `PR_SET_VMA` (Linux 5.17), which the libc crate does not name: glibc
/// names its anonymous mappings with it.
const PR_SET_VMA: u64 = 0x5356_4d41;

/// Installs the four filters on every thread of this process (and those
/// it starts later), with `no_new_privs` set. `files_confined`: Landlock
/// is enforced (see [`allowed`]).
///
/// # Errors
/// The kernel's refusal (a kernel without seccomp), or an architecture
/// this filter is not written for.
pub(crate) fn install(files_confined: bool) -> io::Result<()> {
    let arch = if cfg!(target_arch = "x86_64") {
        TargetArch::x86_64
    } else if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        return Err(io::Error::other("no seccomp filter for this architecture"));
    };
    let local = |op| rule(vec![arg(0, op, libc::AF_UNIX as u64)?]);
    let mut allow = allowed(files_confined, std::process::id())?;
    // Let through here, answered by the filters below.
    allow.insert(libc::SYS_socket, local(SeccompCmpOp::Eq)?);
    allow.insert(libc::SYS_clone3, Vec::new());
    let errors: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_socket, local(SeccompCmpOp::Eq)?)].into_iter().collect();
    let nosys: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_clone3, Vec::new())].into_iter().collect();
    let mut kill: BTreeMap<i64, Vec<SeccompRule>> = KILL.iter().map(|(nr, _)| (*nr, Vec::new())).collect();
    kill.insert(libc::SYS_socket, local(SeccompCmpOp::Ne)?);
    // The allow-list last: it refuses `seccomp` itself, so no filter can
    // follow it. The kernel answers with the strictest action of all
    // filters, so the others' EACCES and ENOSYS (the allow-list lets those
    // two calls through) and kills stand.
    let filters = [
        (errors, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32)),
        (nosys, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32)),
        (kill, SeccompAction::Allow, SeccompAction::KillProcess),
        (allow, SeccompAction::Errno(libc::EPERM as u32), SeccompAction::Allow),
    ];
    for (rules, mismatch, matched) in filters {
        let filter = SeccompFilter::new(rules, mismatch, matched, arch).map_err(|e| io::Error::other(format!("seccomp filter: {e}")))?;
        let program: BpfProgram = filter.try_into().map_err(|e| io::Error::other(format!("seccomp filter: {e:?}")))?;
        seccompiler::apply_filter_all_threads(&program).map_err(|e| io::Error::other(format!("installing the seccomp filter: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// docs/security.md names every call that kills the key process.
    #[test]
    fn the_security_page_lists_the_calls_that_kill() {
        let page = include_str!("../../../../../../docs/security.md");
        for (_, name) in super::KILL {
            assert!(page.contains(&format!("`{name}`")), "docs/security.md does not name `{name}`");
        }
    }

    /// No call is both allowed and a kill (the kill would win, but the
    /// list would then say something it does not do).
    #[test]
    fn no_call_is_allowed_and_killed() {
        for confined in [false, true] {
            let allowed = super::allowed(confined, 1).unwrap();
            for (nr, name) in super::KILL {
                assert!(!allowed.contains_key(nr), "{name} is on both lists");
            }
        }
    }
}
