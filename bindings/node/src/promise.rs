//! Settling promises from engine threads, with no thread per operation.
//!
//! The signing engine calls a completion callback on one of its own
//! threads. Each [`Completions`] owns one Node-API thread-safe function for
//! an engine: a callback pushes its outcome onto a shared list and, only
//! when that list was empty, wakes the main thread; the main thread then
//! settles every promise on the list in one go. A burst of completions
//! costs one wake-up, not one per promise, and nothing is created per
//! operation but the promise itself.
//!
//! The thread-safe function keeps the event loop alive only while promises
//! are pending (it is referenced when the count leaves zero and
//! unreferenced when it returns to zero), so an idle engine never holds a
//! process open and a pending signature always does.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use keyfence::sign::{flush_later, Flush, Output, SignError};
use napi::bindgen_prelude::{Buffer, ToNapiValue, Unknown};
use napi::{sys, Env, JsValue};

use crate::error::KfError;

/// A promise's resolve/reject handle, carried to an engine thread and back.
struct Deferred(sys::napi_deferred);

// SAFETY: off the main thread the handle is only an opaque token; it is
// used (resolved or rejected) only on the main thread.
unsafe impl Send for Deferred {}

/// An outcome waiting for the main thread.
type Settled = (Deferred, Result<Output, SignError>);

/// The settled operations, and whether the thread-safe function may still
/// be called.
struct State {
    /// Set by the thread-safe function's finalizer (the environment is
    /// going away, or the last `Completions` released it): calling or
    /// releasing it after that would touch freed memory.
    closed: bool,
    ready: Vec<Settled>,
}

/// What the engine threads, the main thread and the finalizer share.
struct Shared {
    state: Mutex<State>,
    /// Promises created and not yet settled. Changed on the main thread
    /// only; atomic so that `Shared` is `Sync`.
    pending: AtomicUsize,
    /// The thread-safe function, set once right after it is created.
    tsfn: AtomicPtr<sys::napi_threadsafe_function__>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock left only a list behind: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tsfn(&self) -> sys::napi_threadsafe_function {
        self.tsfn.load(Ordering::Acquire)
    }

    /// Has the main thread drain the list. Called with the lock held (it
    /// keeps the finalizer from closing the function during the call).
    fn wake(&self, state: &State) {
        if state.closed || state.ready.is_empty() {
            return;
        }
        // SAFETY: not closed, so the function is live; the caller's lock
        // keeps the finalizer from closing it during the call.
        // Non-blocking: the queue is unbounded (size 0).
        unsafe { sys::napi_call_threadsafe_function(self.tsfn(), ptr::null_mut(), sys::ThreadsafeFunctionCallMode::nonblocking) };
    }
}

impl Flush for Shared {
    fn flush(&self) {
        let state = self.lock();
        self.wake(&state);
    }
}

/// One engine's way back to the main thread. The engine and every
/// operation in flight hold an `Arc` of it; the thread-safe function is
/// released when the last is dropped.
pub(crate) struct Completions {
    shared: Arc<Shared>,
    /// `shared`, as what a worker's batch wakes when it ends.
    waker: Arc<dyn Flush>,
}

impl Completions {
    /// Creates the thread-safe function, on the main thread.
    pub(crate) fn new(env: &Env) -> napi::Result<Arc<Self>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { closed: false, ready: Vec::new() }),
            pending: AtomicUsize::new(0),
            tsfn: AtomicPtr::new(ptr::null_mut()),
        });
        let name = env.create_string("keyfence.sign")?;
        // The finalizer owns this reference and gives it back.
        let context = Arc::into_raw(shared.clone()) as *mut c_void;
        let mut tsfn = ptr::null_mut();
        // SAFETY: a live environment (this is a call from JavaScript); no
        // JavaScript function, which N-API 5+ allows with a call_js
        // callback; `context` stays valid until `finalize` takes it back.
        let status = unsafe {
            sys::napi_create_threadsafe_function(
                env.raw(),
                ptr::null_mut(),
                ptr::null_mut(),
                name.raw(),
                0,
                1,
                context,
                Some(finalize),
                context,
                Some(call_js),
                &mut tsfn,
            )
        };
        if status != sys::Status::napi_ok {
            // SAFETY: the function does not exist, so its finalizer will
            // never run: take the reference back here.
            drop(unsafe { Arc::from_raw(context as *const Shared) });
            return Err(napi::Error::new(napi::Status::from(status), "cannot create the engine's completion channel"));
        }
        shared.tsfn.store(tsfn, Ordering::Release);
        // SAFETY: main thread, live function. An idle engine must not keep
        // the event loop alive.
        unsafe { sys::napi_unref_threadsafe_function(env.raw(), tsfn) };
        let waker: Arc<dyn Flush> = shared.clone();
        Ok(Arc::new(Completions { shared, waker }))
    }

    /// Creates a promise for an operation about to be submitted, on the
    /// main thread: the promise, and the token that settles it.
    pub(crate) fn begin<'env>(&self, env: &'env Env) -> napi::Result<(Pending, Unknown<'env>)> {
        let mut deferred = ptr::null_mut();
        let mut promise = ptr::null_mut();
        // SAFETY: a live environment; both out-pointers are valid.
        napi::check_status!(unsafe { sys::napi_create_promise(env.raw(), &mut deferred, &mut promise) })?;
        if self.shared.pending.fetch_add(1, Ordering::Relaxed) == 0 {
            // SAFETY: main thread; the function is live (its finalizer runs
            // only after the last `Completions` releases it, and `self` is
            // one).
            unsafe { sys::napi_ref_threadsafe_function(env.raw(), self.shared.tsfn()) };
        }
        // SAFETY: `promise` was just created in this environment.
        let promise = unsafe { Unknown::from_raw_unchecked(env.raw(), promise) };
        Ok((Pending(Deferred(deferred)), promise))
    }

    /// Settles `pending` from any thread: queued for the main thread,
    /// which is woken if it was not already due to drain the list.
    pub(crate) fn complete(&self, pending: Pending, result: Result<Output, SignError>) {
        let mut state = self.shared.lock();
        if state.closed {
            // The environment is gone: there is no promise left to settle.
            return;
        }
        let wake = state.ready.is_empty();
        state.ready.push((pending.0, result));
        // An engine worker with more operations waiting wakes the main
        // thread once, when it has run them (at most 32, or 400 µs).
        if wake && !flush_later(&self.waker) {
            self.shared.wake(&state);
        }
    }

    /// Settles `pending` now, on the main thread (a submission refused at
    /// once).
    pub(crate) fn reject_now(&self, env: &Env, pending: Pending, err: KfError) {
        settle(env, &self.shared, vec![(pending.0, Err(err))]);
    }
}

impl Drop for Completions {
    fn drop(&mut self) {
        let state = self.shared.lock();
        if !state.closed {
            // SAFETY: not closed, so the function is live; releasing the
            // one thread count lets Node finalize it after the queued calls.
            unsafe { sys::napi_release_threadsafe_function(self.shared.tsfn(), sys::ThreadsafeFunctionReleaseMode::release) };
        }
    }
}

/// A promise waiting for its operation.
pub(crate) struct Pending(Deferred);

/// Settles promises on the main thread and drops the loop reference when
/// none is left pending.
fn settle<E: Into<KfError>>(env: &Env, shared: &Shared, done: Vec<(Deferred, Result<Output, E>)>) {
    let n = done.len();
    for (deferred, result) in done {
        let value = match result {
            // SAFETY: main thread, live environment.
            Ok(sig) => unsafe { Buffer::to_napi_value(env.raw(), Buffer::from(sig.to_vec())) }.map(|v| (v, true)),
            Err(e) => {
                let e: KfError = e.into();
                e.to_js(env).map(|o| (o.raw(), false))
            }
        };
        // SAFETY: main thread; each deferred is settled exactly once (it
        // was moved out of the list), with a value of this environment.
        unsafe {
            match value {
                Ok((v, true)) => sys::napi_resolve_deferred(env.raw(), deferred.0, v),
                Ok((v, false)) => sys::napi_reject_deferred(env.raw(), deferred.0, v),
                Err(e) => {
                    let fallback = env.create_string(&e.reason).map(|s| s.raw()).unwrap_or(ptr::null_mut());
                    sys::napi_reject_deferred(env.raw(), deferred.0, fallback)
                }
            }
        };
    }
    let before = shared.pending.fetch_sub(n, Ordering::Relaxed);
    if before == n {
        // SAFETY: main thread; the function is live while it dispatches or
        // while a `Completions` exists.
        unsafe { sys::napi_unref_threadsafe_function(env.raw(), shared.tsfn()) };
    }
}

/// The thread-safe function's main-thread callback: drains the list.
unsafe extern "C" fn call_js(env: sys::napi_env, _js: sys::napi_value, context: *mut c_void, _data: *mut c_void) {
    // SAFETY: `context` is the `Shared` the finalizer keeps alive until
    // after the last dispatch.
    let shared = unsafe { &*(context as *const Shared) };
    let done = std::mem::take(&mut shared.lock().ready);
    if env.is_null() {
        // The environment is shutting down: nothing can be settled.
        return;
    }
    if !done.is_empty() {
        settle(&Env::from_raw(env), shared, done);
    }
}

/// The thread-safe function's finalizer, on the main thread: marks it
/// closed so no engine thread calls it again, and gives back the reference
/// taken at creation.
unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` is the `Arc` handed over in `Completions::new`.
    let shared = unsafe { Arc::from_raw(data as *const Shared) };
    let mut state = shared.lock();
    state.closed = true;
    // Promises of an environment that is going away cannot be settled.
    state.ready.clear();
}
