//! The one place where keyfence's errors become JavaScript errors.
//!
//! Every error the core returns ([`Coded`]) becomes an instance of
//! `KeyfenceError` (the class `index.js` defines and registers here at load
//! time), with `code` set to [`ErrorCode::name`] and, for a policy that
//! does not parse, `position` set to the byte offset of the fault. Messages are the core's,
//! which never contain key material.

use keyfence::{Coded, ErrorCode};
use napi::bindgen_prelude::{FnArgs, Function, FunctionRef, Unknown};
use napi::{Env, Status};

/// A keyfence error on its way to JavaScript: what every binding function
/// produces before it has an `Env` to build the JS object with (tasks
/// compute on the libuv pool, signatures complete on engine threads).
#[derive(Debug)]
pub struct KfError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    pub(crate) position: Option<usize>,
}

/// The result of binding code that has not touched JavaScript yet.
pub(crate) type KfResult<T> = std::result::Result<T, KfError>;

impl KfError {
    /// An error with this code and message, without a policy position.
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        KfError { code, message: message.into(), position: None }
    }

    /// Builds the `KeyfenceError` instance.
    ///
    /// # Errors
    /// When JavaScript refuses to build it (out of memory, a pending
    /// exception); the caller then throws a plain error instead.
    pub(crate) fn to_js<'env>(&self, env: &'env Env) -> napi::Result<Unknown<'env>> {
        let class = env
            .get_instance_data::<ErrorClass>()?
            .ok_or_else(|| napi::Error::new(Status::GenericFailure, "KeyfenceError is not registered"))?;
        let ctor = class.0.borrow_back(env)?;
        let position = self.position.and_then(|p| u32::try_from(p).ok());
        ctor.new_instance(FnArgs::from((self.message.clone(), self.code.name().to_string(), position)))
    }

    /// The error as napi-rs throws it: the `KeyfenceError` instance, or, if
    /// that cannot be built, a plain `Error` whose message starts with the
    /// code.
    pub(crate) fn into_napi(self, env: &Env) -> napi::Error {
        match self.to_js(env) {
            Ok(obj) => napi::Error::from(obj),
            Err(_) => napi::Error::new(Status::GenericFailure, format!("{}: {}", self.code.name(), self.message)),
        }
    }
}

/// Turns a binding result into what a `#[napi]` function returns.
pub(crate) fn js<T>(env: &Env, r: KfResult<T>) -> napi::Result<T> {
    r.map_err(|e| e.into_napi(env))
}

/// Every core error: its code, its message and, for a policy that does not
/// parse, the byte position.
impl<E: Coded> From<E> for KfError {
    fn from(e: E) -> Self {
        KfError { code: e.code(), position: e.policy_position(), message: e.to_string() }
    }
}

/// `new KeyfenceError(message, code, position)`.
type ErrorCtor = FunctionRef<FnArgs<(String, String, Option<u32>)>, Unknown<'static>>;

/// The registered `KeyfenceError` class, kept per Node environment (the
/// main thread and each worker load the addon separately).
pub(crate) struct ErrorClass(ErrorCtor);

/// Registers the `KeyfenceError` class; `index.js` calls it once when it
/// loads the addon, before anything else can fail.
#[napi_derive::napi(js_name = "__registerErrorClass", skip_typescript)]
pub fn register_error_class(env: Env, class: Function<FnArgs<(String, String, Option<u32>)>, Unknown<'static>>) -> napi::Result<()> {
    env.set_instance_data(ErrorClass(class.create_ref()?), (), |_| {})
}
