//! Policy-key wrapping on a store named by one string (a directory, or
//! `etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=&cert=&key=]`,
//! `keyfence::wrap::open_store`): the authority (issues machine keys,
//! wraps secrets, rotates) and the machine (opens envelopes, follows the
//! store). Every
//! call that may run CP-ABE or touch the store is a promise computed on
//! the libuv thread pool, with a `*Sync` twin.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use keyfence::wrap::{self as core, CacheConfig, Envelope, Follower, Store};
use keyfence::ErrorCode;
use napi::bindgen_prelude::{AsyncTask, Buffer, Uint8Array};
use napi::Env;
use napi_derive::napi;
use zeroize::Zeroizing;

use crate::abe::secret_buffer;
use crate::error::{js, KfError, KfResult};
use crate::policy;
use crate::task::Job;

/// The store `name` names: a directory or `etcd://...`.
fn store(name: &str) -> KfResult<Arc<dyn Store>> {
    Ok(core::open_store(name)?)
}

/// An authority opened on a store (a directory or `etcd://...`): issues machine keys, wraps
/// secrets, rotates keys. Holds the master keys: `util.inspect` never shows
/// them. Calls on one authority run one at a time.
#[napi(namespace = "wrap")]
pub struct Authority {
    inner: Arc<Mutex<core::Authority>>,
}

fn authority(a: core::Authority) -> Authority {
    Authority { inner: Arc::new(Mutex::new(a)) }
}

fn init_job(dir: String) -> Job<core::Authority, Authority> {
    // The one call that may create the store: opening never does.
    Job::new(move || Ok(core::Authority::init(core::create_store(&dir)?)?), authority)
}

fn open_job(dir: String) -> Job<core::Authority, Authority> {
    Job::new(move || Ok(core::Authority::open(store(&dir)?)?), authority)
}

/// A report of a master-key rotation.
#[napi(object, namespace = "wrap")]
pub struct MasterRotation {
    /// The new active master generation.
    pub generation: u32,
    /// Policy keys re-sealed under it (envelopes are never touched).
    pub resealed: u32,
}

/// A report of a revocation.
#[napi(object, namespace = "wrap")]
pub struct Revocation {
    /// The machine id revoked.
    pub id: String,
    /// Whether the id was already revoked (nothing was done).
    pub already: bool,
    /// Whether this call finished a revocation an earlier one started.
    pub resumed: bool,
    /// Policies given a new key version the machine cannot open.
    pub rekeyed: u32,
    /// Envelopes in the store re-wrapped to those versions.
    pub rewrapped: u32,
    /// Older policy key versions retired.
    pub retired: u32,
    /// Whether the store's history was compacted afterwards (etcd).
    pub compacted: bool,
    /// Milliseconds from the call until every new wrap sealed to a version
    /// the machine cannot open (0 when nothing was re-keyed).
    pub rekeyed_after_ms: f64,
    /// The store's envelopes it could not re-wrap: they open nowhere now.
    pub skipped: Vec<SkippedEnvelope>,
}

/// An envelope in the store a revocation could not re-wrap: sealed to a
/// retired policy key version now, it opens nowhere. Wrap its secret again.
#[napi(object, namespace = "wrap")]
pub struct SkippedEnvelope {
    /// Its name in the store (`envelopes/{secret id}`).
    pub name: String,
    /// Why, by a stable name: 'malformed', 'not_signed', 'retired_version',
    /// 'does_not_open' or 'misnamed'.
    pub reason: String,
    /// Why, in words.
    pub message: String,
}

impl Authority {
    /// Runs `f` on the authority, on whatever thread the job is on.
    fn with<T: Send + 'static, J>(
        &self, f: impl FnOnce(&mut core::Authority) -> KfResult<T> + Send + 'static, to_js: fn(T) -> J,
    ) -> Job<T, J> {
        let inner = self.inner.clone();
        Job::new(
            move || {
                let mut a = inner.lock().map_err(|_| KfError::new(ErrorCode::Internal, "an earlier call on this authority panicked"))?;
                f(&mut a)
            },
            to_js,
        )
    }

    fn issue_job(&self, attrs: HashMap<String, String>) -> Job<Zeroizing<Vec<u8>>, Buffer> {
        self.with(move |a| Ok(a.issue(&policy::attributes(attrs)?)?.to_bytes()), secret_buffer)
    }

    fn wrap_job(&self, policy_text: String, secret: Uint8Array) -> Job<Vec<u8>, Buffer> {
        let secret = Zeroizing::new(secret.to_vec());
        self.with(
            move |a| {
                // Parsed here first so that a syntax error carries its caret.
                policy::parse(&policy_text)?;
                Ok(a.wrap(&policy_text, &secret)?.to_bytes().to_vec())
            },
            Buffer::from,
        )
    }

    fn revoke_job(&self, id: String) -> Job<core::Revocation, Revocation> {
        fn n(x: usize) -> u32 {
            u32::try_from(x).unwrap_or(u32::MAX)
        }
        self.with(
            move |a| Ok(a.revoke(&id)?),
            |r| Revocation {
                id: r.id,
                already: r.already,
                resumed: r.resumed,
                rekeyed: n(r.rekeyed),
                rewrapped: n(r.rewrapped),
                retired: n(r.retired),
                compacted: r.compacted,
                rekeyed_after_ms: r.rekeyed_after.as_secs_f64() * 1000.0,
                skipped: r
                    .skipped
                    .into_iter()
                    .map(|s| SkippedEnvelope { message: s.reason.to_string(), reason: s.reason.kind().to_owned(), name: s.name })
                    .collect(),
            },
        )
    }

    fn rotate_job(&self) -> Job<core::MasterRotation, MasterRotation> {
        self.with(
            |a| Ok(a.rotate_master()?),
            |r| MasterRotation { generation: r.new_generation, resealed: u32::try_from(r.resealed).unwrap_or(u32::MAX) },
        )
    }
}

#[napi(namespace = "wrap")]
impl Authority {
    /// Creates an authority, with its first master generation, in the store
    /// named `dir`: a directory, or
    /// `etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=&cert=&key=]`.
    ///
    /// Rejects with `KeyfenceError` code `AUTHORITY_EXISTS` if the store
    /// already holds one, `STORE_IO` if it cannot be written,
    /// `STORE_CONFLICT` if another authority was created at the same time,
    /// `INVALID_ARGUMENT` for a name that names no store.
    #[napi(ts_return_type = "Promise<Authority>")]
    pub fn init(dir: String) -> AsyncTask<Job<core::Authority, Authority>> {
        init_job(dir).spawn()
    }

    /// `init` on the calling thread.
    #[napi]
    pub fn init_sync(env: Env, dir: String) -> napi::Result<Authority> {
        init_job(dir).run_sync(&env)
    }

    /// Opens the authority in the store named `dir` (a directory or
    /// `etcd://...`, as `init` takes).
    ///
    /// Rejects with `KeyfenceError` code `NO_AUTHORITY` if the store holds
    /// none, `INCONSISTENT_STATE` or `INVALID_ENVELOPE` if its state does
    /// not decode, `STORE_IO`, `INVALID_ARGUMENT` for a name that names no
    /// store.
    #[napi(ts_return_type = "Promise<Authority>")]
    pub fn open(dir: String) -> AsyncTask<Job<core::Authority, Authority>> {
        open_job(dir).spawn()
    }

    /// `open` on the calling thread.
    #[napi]
    pub fn open_sync(env: Env, dir: String) -> napi::Result<Authority> {
        open_job(dir).run_sync(&env)
    }

    /// Issues a machine key for `attrs` (`{ region: 'EU', country: 'DE' }`):
    /// one attribute key per live master generation. A secret for the
    /// machine only.
    ///
    /// Rejects with `KeyfenceError` code `INVALID_ATTRIBUTES`,
    /// `RESERVED_LABEL`, `LIMIT_EXCEEDED`, `STORE_IO`.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn issue(&self, #[napi(ts_arg_type = "Attributes")] attrs: HashMap<String, String>) -> AsyncTask<Job<Zeroizing<Vec<u8>>, Buffer>> {
        self.issue_job(attrs).spawn()
    }

    /// `issue` on the calling thread.
    #[napi]
    pub fn issue_sync(&self, env: Env, #[napi(ts_arg_type = "Attributes")] attrs: HashMap<String, String>) -> napi::Result<Buffer> {
        self.issue_job(attrs).run_sync(&env)
    }

    /// Wraps `secret` under `policy` into an envelope: the secret sealed to
    /// the policy's key (created on first use and sealed under CP-ABE).
    ///
    /// Rejects with `KeyfenceError` code `POLICY_SYNTAX` (with `position`),
    /// `POLICY_TOO_LARGE`, `LIMIT_EXCEEDED`, `STORE_IO`.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn wrap(&self, policy: String, #[napi(ts_arg_type = "Bytes")] secret: Uint8Array) -> AsyncTask<Job<Vec<u8>, Buffer>> {
        self.wrap_job(policy, secret).spawn()
    }

    /// `wrap` on the calling thread.
    #[napi]
    pub fn wrap_sync(&self, env: Env, policy: String, #[napi(ts_arg_type = "Bytes")] secret: Uint8Array) -> napi::Result<Buffer> {
        self.wrap_job(policy, secret).run_sync(&env)
    }

    /// Rotates the master key: a new active generation, policy keys
    /// re-sealed under it; envelopes are never touched.
    ///
    /// Rejects with `KeyfenceError` code `STORE_IO`, `LIMIT_EXCEEDED`.
    #[napi(ts_return_type = "Promise<MasterRotation>")]
    pub fn rotate_master(&self) -> AsyncTask<Job<core::MasterRotation, MasterRotation>> {
        self.rotate_job().spawn()
    }

    /// `rotateMaster` on the calling thread.
    #[napi]
    pub fn rotate_master_sync(&self, env: Env) -> napi::Result<MasterRotation> {
        self.rotate_job().run_sync(&env)
    }

    /// Revokes the machine `id` (its `Machine.id`): records it, gives every
    /// policy a new key sealed so that machine cannot open it, re-wraps the
    /// store's envelopes to them and retires the old keys, so the policy
    /// keys it cached open nothing the store serves. Call again after an
    /// interruption to finish; `issue` refuses the id afterwards
    /// (`MACHINE_REVOKED`).
    ///
    /// Rejects with `KeyfenceError` code `INVALID_ATTRIBUTES` for an id a
    /// policy cannot name, `POLICY_TOO_LARGE` when the negations no longer
    /// fit (rotate the master key twice), `STORE_IO`, `STORE_CONFLICT`.
    #[napi(ts_return_type = "Promise<Revocation>")]
    pub fn revoke(&self, id: String) -> AsyncTask<Job<core::Revocation, Revocation>> {
        self.revoke_job(id).spawn()
    }

    /// `revoke` on the calling thread.
    #[napi]
    pub fn revoke_sync(&self, env: Env, id: String) -> napi::Result<Revocation> {
        self.revoke_job(id).run_sync(&env)
    }
}

/// A machine: its machine key and the store holding the sealed policy
/// keys, with a cache of opened policy keys. Holds secrets: `util.inspect`
/// shows only its attributes' labels.
#[napi(namespace = "wrap")]
pub struct Machine {
    pub(crate) inner: Arc<core::Machine>,
    /// Set by `follow`: the watch, stopped when the machine is collected.
    follower: Arc<Mutex<Option<Follower>>>,
}

/// Options of a machine (`new Machine(machineKey, dir, options)`).
#[napi(object, namespace = "wrap", object_to_js = false)]
pub struct MachineOptions {
    /// A file in which the machine keeps the newest generation and
    /// revocation lists it accepts (its floor), and from which it starts:
    /// a store rolled back to an older list is then refused
    /// (`REPLAYED_OBJECT`) by every process of this machine that names the
    /// file, after a restart too. Usually beside the machine key file,
    /// `KEY.newest`, where the command line, the key process and the agent
    /// keep it (processes of one machine share it). Without it, each
    /// process starts with no floor.
    pub state: Option<String>,
}

/// A machine's cache counters (`Machine.cacheStats`), with what following
/// the store (`Machine.follow`) has done.
#[napi(object, namespace = "wrap")]
pub struct CacheStats {
    /// Opens served from the cache.
    pub hits: f64,
    /// Opens (and openings ahead) that had to open the policy key.
    pub misses: f64,
    /// Keys dropped for capacity or age.
    pub evictions: f64,
    /// Keys held now.
    pub entries: f64,
    /// Store changes applied from the watch.
    pub watch_events: f64,
    /// Full resyncs (the cache cleared after the watch lost changes).
    pub resyncs: f64,
    /// Generation lists (rotations) received through the watch.
    pub propagations: f64,
    /// The last propagation delay, authority commit to this cache, in
    /// microseconds.
    pub propagation_last_us: f64,
    /// The longest propagation delay, in microseconds.
    pub propagation_max_us: f64,
}

#[napi(namespace = "wrap")]
impl Machine {
    /// A machine holding `machineKey` (from `Authority.issue`) that reads
    /// sealed policy keys from the store named `dir` (a directory or
    /// `etcd://...`); with `options.state`, keeping its floor in that file.
    ///
    /// Throws `KeyfenceError` code `INVALID_KEY` if the machine key does not
    /// decode, `STORE_IO` (also when the state file exists but cannot be
    /// read, or its folder cannot take its lock file, `state` + `.lock`),
    /// `INVALID_ENVELOPE` if the state file does not decode (delete it to
    /// start again from the store), `INVALID_ARGUMENT` for a name that
    /// names no store.
    #[napi(constructor)]
    pub fn new(
        env: Env, #[napi(ts_arg_type = "Bytes")] machine_key: Uint8Array, dir: String, options: Option<MachineOptions>,
    ) -> napi::Result<Self> {
        let made = || -> KfResult<Self> {
            let key = core::MachineKey::from_bytes(&machine_key)?;
            let mut machine = core::Machine::new(key, store(&dir)?, CacheConfig::default());
            if let Some(state) = options.and_then(|o| o.state) {
                machine = machine.keep_newest_in(state)?;
            }
            Ok(Machine { inner: Arc::new(machine), follower: Arc::default() })
        };
        js(&env, made())
    }

    /// Requires `lists` (from `newestLists()`, of this process or another
    /// of the same machine) as a floor: from now on this machine refuses a
    /// generation list that goes back on them, or a revocation list that
    /// lacks one of their ids (`open` rejects with `REPLAYED_OBJECT`).
    /// Lists older than those it accepted change nothing. A machine made
    /// with `state` also writes a floor it was raised to into its file.
    ///
    /// Throws `KeyfenceError` code `INVALID_ENVELOPE` if the bytes do not
    /// decode or a list's signature fails, `INCONSISTENT_STATE` for a
    /// malformed list, `WRONG_AUTHORITY` for lists another authority
    /// signed (nothing is required then), `STORE_IO` if the state file
    /// cannot be written.
    #[napi]
    pub fn require(&self, env: Env, #[napi(ts_arg_type = "Bytes")] lists: Uint8Array) -> napi::Result<()> {
        let required = core::NewestLists::from_bytes(&lists).and_then(|l| self.inner.require(&l));
        js(&env, required.map_err(Into::into))
    }

    /// The newest generation and revocation lists this machine has
    /// accepted (or was required to), as the authority signed them,
    /// encoded (not secret): what to hand to another machine of the same
    /// authority with `require`.
    #[napi]
    pub fn newest_lists(&self) -> Buffer {
        self.inner.newest_lists().to_bytes().into()
    }

    /// Whether this machine could open `envelope`, from its policy and the
    /// machine's attributes, without cryptography.
    ///
    /// Throws `KeyfenceError` code `INVALID_ENVELOPE` for bytes that are not
    /// an envelope.
    #[napi]
    pub fn could_open(&self, env: Env, #[napi(ts_arg_type = "Bytes")] envelope: Uint8Array) -> napi::Result<bool> {
        js(&env, Envelope::parse(&envelope).map(|e| self.inner.could_open(&e)).map_err(Into::into))
    }

    /// Opens `envelope`. The first open under a policy decrypts its policy
    /// key with CP-ABE (milliseconds, on the thread pool); later ones hit
    /// the cache.
    ///
    /// Rejects with `KeyfenceError` code `POLICY_NOT_SATISFIED`,
    /// `RETIRED_GENERATION`, `UNKNOWN_POLICY_KEY`, `INVALID_ENVELOPE`
    /// (malformed or tampered), `REPLAYED_OBJECT` (the store put back a
    /// generation list older than one this machine has seen), `STORE_IO`.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn open(&self, #[napi(ts_arg_type = "Bytes")] envelope: Uint8Array) -> AsyncTask<Job<Zeroizing<Vec<u8>>, Buffer>> {
        self.open_job(envelope).spawn()
    }

    /// `open` on the calling thread.
    #[napi]
    pub fn open_sync(&self, env: Env, #[napi(ts_arg_type = "Bytes")] envelope: Uint8Array) -> napi::Result<Buffer> {
        self.open_job(envelope).run_sync(&env)
    }

    /// Follows the store: a watch (etcd's stream, or a poll of a directory
    /// every 100 ms) brings each change to the cache as it is committed: a
    /// retired policy key is forgotten at once, a rotated one opened ahead,
    /// a new generation list verified. Until the machine is collected; a
    /// second call changes nothing. Resolves once the watch has started.
    ///
    /// Rejects with `KeyfenceError` code `STORE_IO` if it cannot start.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn follow(&self) -> AsyncTask<Job<(), ()>> {
        self.follow_job().spawn()
    }

    /// `follow` on the calling thread.
    #[napi]
    pub fn follow_sync(&self, env: Env) -> napi::Result<()> {
        self.follow_job().run_sync(&env)
    }

    /// The cache's counters, and what following the store has done.
    #[napi]
    pub fn cache_stats(&self) -> CacheStats {
        let s = self.inner.cache_stats();
        let us = |d: std::time::Duration| d.as_micros() as f64;
        CacheStats {
            hits: s.hits as f64,
            misses: s.misses as f64,
            evictions: s.evictions as f64,
            entries: s.entries as f64,
            watch_events: s.watch_events as f64,
            resyncs: s.resyncs as f64,
            propagations: s.propagations as f64,
            propagation_last_us: us(s.propagation_last),
            propagation_max_us: us(s.propagation_max),
        }
    }

    /// The machine's id: the `machine` attribute the authority set when it
    /// issued the key, which `Authority.revoke` takes; empty for a key
    /// issued before keyfence had machine ids.
    #[napi(getter)]
    pub fn id(&self) -> String {
        self.inner.id().unwrap_or_default().to_owned()
    }

    /// The attribute labels of the machine key (not secret; for logs).
    #[napi(getter)]
    pub fn labels(&self) -> Vec<String> {
        self.inner.attributes().iter().map(|(l, _)| l.to_owned()).collect()
    }
}

impl Machine {
    fn follow_job(&self) -> Job<(), ()> {
        let (m, follower) = (self.inner.clone(), self.follower.clone());
        Job::new(
            move || {
                let mut f = follower.lock().map_err(|_| KfError::new(ErrorCode::Internal, "an earlier follow panicked"))?;
                if f.is_none() {
                    *f = Some(m.follow()?);
                }
                Ok(())
            },
            |()| (),
        )
    }

    fn open_job(&self, envelope: Uint8Array) -> Job<Zeroizing<Vec<u8>>, Buffer> {
        let m = self.inner.clone();
        let env = envelope.to_vec();
        Job::new(move || Ok(m.open(&env)?), secret_buffer)
    }
}
