//! `keyfence provider-check`: whether OpenSSL's configuration loads
//! keyfence's provider, and whether the servers already running did.
//!
//! The mistake it catches is the quiet one: after the `.include` is added,
//! `nginx -t` passes (a new process reads the new `openssl.cnf`) and
//! `systemctl reload nginx` returns 0, but the running master read the
//! configuration before the provider was in it and keeps that reading
//! across a reload, so its workers fail every key file. The same holds for
//! a server that still maps the library an upgrade replaced. Both are seen
//! in `/proc/PID/maps`, and both are fixed by a restart, which the check
//! names (with the server's systemd unit when it has one).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::exit;

/// `keyfence provider-check`.
#[derive(Args)]
pub struct ProviderCheckArgs {
    /// The OpenSSL configuration to read (default: `OPENSSL_CONF`, else
    /// /etc/ssl/openssl.cnf, which Debian's OpenSSL reads). Its `.include`
    /// lines are followed.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The provider module the configuration must name (default: any
    /// module whose file name starts with `keyfence`).
    #[arg(long)]
    module: Option<PathBuf>,
    /// A running server's process (nginx's or Apache's master, from its
    /// pid file) that must have loaded the module; repeat for each.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
}

/// A `module = PATH` line, and where it was read.
struct ModuleLine {
    path: PathBuf,
    file: PathBuf,
    line: usize,
}

/// Includes deeper than this are refused: OpenSSL itself stops far
/// earlier, and a cycle must end.
const MAX_DEPTH: usize = 16;

/// Runs the check: exit 0 when every part holds, 1 when one does not
/// (each problem on standard error, with its fix), 2 when the
/// configuration cannot be read.
pub fn provider_check(args: ProviderCheckArgs) -> Result<ExitCode> {
    let config = match &args.config {
        Some(c) => c.clone(),
        None => std::env::var_os("OPENSSL_CONF").map(PathBuf::from).unwrap_or_else(|| "/etc/ssl/openssl.cnf".into()),
    };
    let mut modules = Vec::new();
    let mut seen = HashSet::new();
    read_config(&config, 0, &mut seen, &mut modules)?;
    let wanted = |m: &ModuleLine| match &args.module {
        Some(want) => same_file(&m.path, want),
        None => m.path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("keyfence")),
    };
    let mut problems = Vec::new();
    let module = match modules.into_iter().find(wanted) {
        Some(m) => m,
        None => {
            let which = args.module.as_ref().map(|m| format!(" ({})", m.display())).unwrap_or_default();
            eprintln!(
                "keyfence: {} does not load keyfence's provider{which}: add `.include /etc/keyfence/openssl-include.cnf` \
                 (written by `keyfence provider-config --include`) at its end, then restart the servers that use key files",
                config.display()
            );
            return Ok(ExitCode::from(exit::NO));
        }
    };
    let at = format!("{}:{}", module.file.display(), module.line);
    if module.path.is_file() {
        println!("ok: {} loads keyfence's provider {} ({at})", config.display(), module.path.display());
    } else {
        problems.push(format!(
            "{at} names the module {}, which is not there (was the package removed?): install it, or take the `.include` out",
            module.path.display()
        ));
    }
    for &pid in &args.pids {
        match check_process(pid, &module.path) {
            Ok(line) => println!("ok: {line}"),
            Err(problem) => problems.push(problem),
        }
    }
    for p in &problems {
        eprintln!("keyfence: {p}");
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(exit::NO) })
}

/// Collects the `module` lines of `path` and of what it includes.
fn read_config(path: &Path, depth: usize, seen: &mut HashSet<PathBuf>, out: &mut Vec<ModuleLine>) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(exit::input(format!("{}: includes nested deeper than {MAX_DEPTH}", path.display())));
    }
    if path.is_dir() {
        // OpenSSL includes a directory's `.cnf` and `.conf` files, in
        // name order.
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| exit::input(format!("cannot read the directory {}: {e}", path.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "cnf" || x == "conf"))
            .collect();
        files.sort();
        for f in files {
            read_config(&f, depth + 1, seen, out)?;
        }
        return Ok(());
    }
    if !seen.insert(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())) {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).map_err(|e| exit::input(format!("cannot read {}: {e}", path.display())))?;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if let Some(rest) = line.strip_prefix(".include") {
            let target = rest.trim_start_matches([' ', '\t', '=']).trim();
            if target.is_empty() {
                continue;
            }
            let target = PathBuf::from(target);
            // Relative includes are OpenSSL's: against OPENSSL_CONF_INCLUDE
            // when it is set, else the working directory.
            let target = match std::env::var_os("OPENSSL_CONF_INCLUDE") {
                Some(base) if target.is_relative() => Path::new(&base).join(target),
                _ => target,
            };
            if !target.exists() {
                return Err(exit::input(format!("{}:{} includes {}, which is not there", path.display(), n + 1, target.display())));
            }
            read_config(&target, depth + 1, seen, out)?;
        } else if let Some((key, value)) = line.split_once('=') {
            if key.trim() == "module" {
                out.push(ModuleLine { path: PathBuf::from(value.trim()), file: path.to_path_buf(), line: n + 1 });
            }
        }
    }
    Ok(())
}

/// Whether two paths name one file (by device and inode where both
/// exist, else by their text).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => a == b,
    }
}

/// Whether process `pid` maps `module` as it is now: what holds, or the
/// problem with its fix.
fn check_process(pid: u32, module: &Path) -> Result<String, String> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let comm = std::fs::read_to_string(proc_dir.join("comm")).map(|c| c.trim().to_string());
    let Ok(comm) = comm else {
        return Err(format!("no process {pid}"));
    };
    let who = format!("pid {pid} ({comm})");
    let maps = std::fs::read_to_string(proc_dir.join("maps"))
        .map_err(|e| format!("cannot read /proc/{pid}/maps ({e}): run the check as root or as the server's user"))?;
    let canonical = std::fs::canonicalize(module).unwrap_or_else(|_| module.to_path_buf());
    let name = module.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (mut current, mut deleted) = (false, false);
    for line in maps.lines() {
        // The path is the sixth field; it may hold spaces.
        let Some(mapped) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else { continue };
        if let Some(gone) = mapped.strip_suffix(" (deleted)") {
            deleted |= Path::new(gone) == canonical || Path::new(gone) == module || gone.ends_with(&format!("/{name}"));
        } else if Path::new(mapped) == canonical || Path::new(mapped) == module {
            current = true;
        }
    }
    let restart = restart_command(pid, &comm);
    if deleted && !current {
        return Err(format!("{who} still runs the keyfence provider an upgrade replaced (its file is deleted): restart it: {restart}"));
    }
    if !current {
        return Err(format!(
            "{who} has not loaded keyfence's provider: it read OpenSSL's configuration before the provider was in it, \
             and a reload keeps that process; a restart, not a reload: {restart}"
        ));
    }
    Ok(format!("{who} has loaded {}", module.display()))
}

/// How to restart process `pid`: its systemd unit's restart when it runs
/// in one (from its cgroup), else in words.
fn restart_command(pid: u32, comm: &str) -> String {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let unit = cgroup
        .lines()
        .filter_map(|l| l.rsplit('/').find(|part| part.ends_with(".service")))
        .find(|u| !u.starts_with("user@") && !u.starts_with("session-"));
    match unit {
        Some(u) => format!("systemctl restart {u}"),
        None => format!("stop {comm} (pid {pid}) and start it again"),
    }
}
