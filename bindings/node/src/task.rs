//! The shape every CPU-heavy call shares: a job that owns its inputs, runs
//! on the libuv thread pool without touching JavaScript, and is converted
//! on the main thread; the `*Sync` twins run the same job on the calling
//! thread.

use napi::bindgen_prelude::{AsyncTask, ToNapiValue, TypeName};
use napi::{Env, Task};

use crate::error::{js, KfResult};

/// A job producing `T`, shown to JavaScript as `J`.
pub struct Job<T: Send + 'static, J> {
    run: Option<Box<dyn FnOnce() -> KfResult<T> + Send>>,
    to_js: fn(T) -> J,
}

impl<T: Send + 'static, J> Job<T, J> {
    /// A job running `run` and converting its result with `to_js`.
    pub(crate) fn new(run: impl FnOnce() -> KfResult<T> + Send + 'static, to_js: fn(T) -> J) -> Self {
        Job { run: Some(Box::new(run)), to_js }
    }

    /// Runs the job here and now (the `*Sync` twins).
    pub(crate) fn run_sync(mut self, env: &Env) -> napi::Result<J> {
        let out = self.take()();
        js(env, out.map(self.to_js))
    }

    /// The job as a promise computed on the libuv thread pool.
    pub(crate) fn spawn(self) -> AsyncTask<Self>
    where
        J: ToNapiValue + TypeName,
    {
        AsyncTask::new(self)
    }

    fn take(&mut self) -> Box<dyn FnOnce() -> KfResult<T> + Send> {
        // A task is computed once; a second call has nothing left to do.
        self.run.take().unwrap_or_else(|| Box::new(|| Err(crate::error::KfError::new(keyfence::ErrorCode::Internal, "job ran twice"))))
    }
}

impl<T: Send + 'static, J: ToNapiValue + TypeName> Task for Job<T, J> {
    type Output = KfResult<T>;
    type JsValue = J;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        Ok(self.take()())
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<J> {
        js(&env, output.map(self.to_js))
    }
}
