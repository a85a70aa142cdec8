//! A three-member etcd cluster on 127.0.0.1 for the tests: ports the OS
//! hands out, data in a temporary directory, members started as child
//! processes and killed by pid when the [`Cluster`] is dropped (a test
//! that panics included). `etcd` comes from Debian's `etcd-server`, which
//! `./x` installs; a machine without it skips the etcd tests loudly, and
//! with `KEYFENCE_REQUIRE_ETCD=1` (set by `./x`) fails them instead.
#![allow(dead_code)]

// Included by path, not used from `crate::common`: the command line's
// tests include this module too, and store_etcd.rs has no `common`. A
// test file with both compiles these files twice, which is harmless
// (functions and constants, no state).
#[allow(clippy::duplicate_mod)]
#[path = "../common/openssl_cli.rs"]
mod openssl_cli;
#[allow(clippy::duplicate_mod)]
#[path = "../common/skip.rs"]
mod skip;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::wrap::{EtcdConfig, EtcdStore, Store};

/// How long a cluster may take to elect its first leader.
const START_WAIT: Duration = Duration::from_secs(60);

/// The `etcd` binary, or `None` when the calling test must skip (said
/// loudly, and a failure instead when `KEYFENCE_REQUIRE_ETCD` is set).
fn etcd_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file());
    if skip::skip_unless(found.is_some(), "no `etcd` on PATH (apt-get install etcd-server, or ./x)", skip::REQUIRE_ETCD) {
        return None;
    }
    found
}

/// A port for a member to listen on: drawn below Linux's ephemeral range
/// (32768 and up), so that no connection made meanwhile (the tests make
/// many on loopback) is handed it by the OS, and free when drawn. Another
/// program may still take it before the member binds it: then the member
/// exits, and [`Cluster::start`] starts the whole cluster again on other
/// ports.
fn free_port() -> u16 {
    use rand_core::RngCore;
    loop {
        let port = 20_000 + (rand_core::OsRng.next_u32() % 12_768) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// How many times a cluster whose port was taken is started again.
const START_ATTEMPTS: usize = 5;

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// A running three-member cluster, killed when dropped.
pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    members: Vec<Member>,
    initial: String,
    token: String,
    /// With TLS on the client port: the directory of `ca.pem`,
    /// `server.{pem,key}` and `client.{pem,key}` (made with `openssl`).
    tls: Option<PathBuf>,
}

/// A throwaway CA and, signed by it, `server` (for 127.0.0.1) and `client`
/// certificates with their keys, in `dir`. The server's is for client
/// authentication too: etcd's JSON gateway dials the member's own gRPC
/// port with it.
fn make_pki(dir: &Path) {
    openssl_cli::make_ca(dir, "ca", "/CN=etcd test CA");
    for (name, ext) in
        [("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"), ("client", "extendedKeyUsage=clientAuth")]
    {
        openssl_cli::issue_cert_ext(dir, "ca", name, &format!("/CN={name}"), ext);
    }
}

impl Cluster {
    /// Starts three members and waits (bounded) until they serve.
    /// `None` when etcd is not installed and the calling test must skip
    /// (see [`etcd_binary`]: it said so).
    pub fn start() -> Option<Cluster> {
        Self::start_with(false, None)
    }

    /// Like [`Cluster::start`], with member 0's client port `taken` on the
    /// first attempt (a port the caller holds): for the test that a taken
    /// port makes the cluster start again elsewhere.
    pub fn start_on_taken_port(taken: u16) -> Option<Cluster> {
        Self::start_with(false, Some(taken))
    }

    /// Like [`Cluster::start`], with TLS and client certificates required
    /// on the client port (`--client-cert-auth`).
    pub fn start_tls() -> Option<Cluster> {
        Self::start_with(true, None)
    }

    fn start_with(tls: bool, taken: Option<u16>) -> Option<Cluster> {
        let bin = etcd_binary()?;
        for attempt in 1..=START_ATTEMPTS {
            let mut c = Self::spawn_cluster(bin.clone(), tls, taken.filter(|_| attempt == 1));
            match c.try_wait_ready(START_WAIT) {
                Ok(()) => return Some(c),
                Err(logs) if logs.contains("address already in use") && attempt < START_ATTEMPTS => {
                    eprintln!("etcd_support: a member's port was taken; starting the cluster again on other ports");
                }
                Err(logs) => panic!("etcd cluster did not start\n{logs}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Three members on new ports (member 0's client port `first`, if
    /// given) in a new directory, not yet waited for.
    fn spawn_cluster(bin: PathBuf, tls: bool, first: Option<u16>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut members: Vec<Member> =
            (0..3).map(|i| Member { name: format!("m{i}"), client: free_port(), peer: free_port(), child: None }).collect();
        if let Some(port) = first {
            members[0].client = port;
        }
        let initial = members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer)).collect::<Vec<_>>().join(",");
        let token = format!("keyfence-{}-{}", std::process::id(), members[0].client);
        let tls = tls.then(|| {
            let p = dir.path().join("pki");
            std::fs::create_dir(&p).unwrap();
            make_pki(&p);
            p
        });
        let mut c = Cluster { bin, dir, members, initial, token, tls };
        for i in 0..3 {
            c.spawn(i, "new");
        }
        c
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let m = &self.members[i];
        let data = self.dir.path().join(&m.name);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log(i)).unwrap();
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut cmd = Command::new(&self.bin);
        if let Some(p) = &self.tls {
            cmd.arg("--cert-file")
                .arg(p.join("server.pem"))
                .arg("--key-file")
                .arg(p.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(p.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen-client-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", m.client))
            .arg("--advertise-client-urls")
            .arg(format!("{scheme}://127.0.0.1:{}", m.client))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{}", m.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{}", m.peer))
            .arg("--initial-cluster")
            .arg(&self.initial)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg(&self.token)
            // Fast elections on loopback: a killed leader is replaced in
            // about a second, not ten.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.members[i].child = Some(child);
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("{}.log", self.members[i].name))
    }

    /// The last lines of every member's log, for a failure message.
    pub fn logs(&self) -> String {
        (0..3)
            .map(|i| {
                let text = std::fs::read_to_string(self.log(i)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!("--- {} ---\n{}", self.members[i].name, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every member's `127.0.0.1:PORT`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("127.0.0.1:{}", m.client)).collect()
    }

    /// The store name of this cluster with `prefix` (and, with TLS, the
    /// CA and client certificate options).
    pub fn name(&self, prefix: &str) -> String {
        let tls = self.tls.as_ref().map_or(String::new(), |p| {
            let f = |n: &str| p.join(n).display().to_string();
            format!("?cacert={}&cert={}&key={}", f("ca.pem"), f("client.pem"), f("client.key"))
        });
        format!("etcd://{}/{prefix}{tls}", self.endpoints().join(","))
    }

    /// The configuration of a store on this cluster under `prefix`.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        self.config_of(self.endpoints(), prefix)
    }

    fn config_of(&self, endpoints: Vec<String>, prefix: &str) -> EtcdConfig {
        let mut c = EtcdConfig::new(endpoints, prefix);
        if let Some(p) = &self.tls {
            c.ca_pem = Some(std::fs::read(p.join("ca.pem")).unwrap());
            c.client_pem = Some((std::fs::read(p.join("client.pem")).unwrap(), std::fs::read(p.join("client.key")).unwrap().into()));
        }
        c
    }

    /// The directory of the TLS files, when the cluster uses TLS.
    pub fn pki(&self) -> Option<&Path> {
        self.tls.as_deref()
    }

    /// A store on this cluster under `prefix`.
    pub fn store(&self, prefix: &str) -> Arc<dyn Store> {
        Arc::new(EtcdStore::open(self.config(prefix)).unwrap())
    }

    fn member_store(&self, i: usize, retry: Duration) -> EtcdStore {
        let mut c = self.config_of(vec![format!("127.0.0.1:{}", self.members[i].client)], "health");
        c.retry_for = retry;
        c.request_timeout = Duration::from_secs(2);
        EtcdStore::open(c).unwrap()
    }

    /// Waits until every running member answers a linearizable read
    /// (which needs a leader).
    pub fn wait_ready(&mut self, wait: Duration) {
        if let Err(logs) = self.try_wait_ready(wait) {
            panic!("{logs}");
        }
    }

    /// [`Cluster::wait_ready`], with what went wrong and the logs as the
    /// error (a member that exited, or no answer in time).
    fn try_wait_ready(&mut self, wait: Duration) -> Result<(), String> {
        let start = Instant::now();
        for i in 0..3 {
            if self.members[i].child.is_none() {
                continue;
            }
            loop {
                if let Some(status) = self.members[i].child.as_mut().unwrap().try_wait().unwrap() {
                    return Err(format!("etcd member {i} exited ({status}) while starting\n{}", self.logs()));
                }
                if self.member_store(i, Duration::ZERO).get("probe").is_ok() {
                    break;
                }
                if start.elapsed() >= wait {
                    return Err(format!("etcd cluster not ready after {wait:?}\n{}", self.logs()));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The index of the current leader, asked of the members in turn
    /// (a cluster without TLS).
    pub fn leader(&self) -> usize {
        assert!(self.tls.is_none(), "leader() speaks plain HTTP");
        let start = Instant::now();
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                if let Some(v) = status(m.client) {
                    let me = v.pointer("/header/member_id").cloned();
                    if me.is_some() && v.get("leader").cloned() == me {
                        return i;
                    }
                }
            }
            assert!(start.elapsed() < START_WAIT, "no leader\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs member `i` (by its pid) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to member `i` by its pid.
    pub fn signal(&self, i: usize, signal: &str) {
        let pid = self.members[i].child.as_ref().expect("a running member").id();
        let ok = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap().success();
        assert!(ok, "kill -{signal} {pid}");
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none());
        self.spawn(i, "existing");
    }

    /// Where the members keep their data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A stopped member dies of SIGKILL all the same.
            self.kill(i);
        }
    }
}

/// `POST /v3/maintenance/status` on one member: its id and the leader's.
fn status(port: u16) -> Option<serde_json::Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(1))).build().new_agent();
    let mut r = agent.post(format!("http://127.0.0.1:{port}/v3/maintenance/status")).send("{}").ok()?;
    serde_json::from_slice(&r.body_mut().read_to_vec().ok()?).ok()
}
