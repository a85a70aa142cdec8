//! What this process has open: each module once per path, loaded and
//! initialized here, and the tokens of those modules, each once, so that
//! every key of a token shares one session pool and one login. A token is
//! kept by its keys; the registry holds it weakly, so it goes when its
//! last key does.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use cryptoki::context::{CInitializeArgs, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};

use super::token::Token;
use crate::sign::types::SignError;

/// A module loaded and initialized in this process.
pub(super) struct Module {
    pub(super) ctx: Pkcs11,
    pub(super) path: PathBuf,
}

/// The modules and tokens this process has open, so every key of a token
/// shares one session pool and one login. Entries of another process
/// (before a `fork`) are never reused: PKCS#11 needs `C_Initialize` again
/// in a child.
pub(super) struct Registry {
    pid: u32,
    modules: Vec<Arc<Module>>,
    pub(super) tokens: Vec<Weak<Token>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// Runs `f` on this process's registry: a fresh one in a child after a
/// `fork`.
pub(super) fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if guard.as_ref().is_none_or(|r| r.pid != pid) {
        // A parent's modules: forgotten, never finalized here (the parent
        // owns them); a fresh load initializes the module for this process.
        if let Some(old) = guard.take() {
            std::mem::forget(old);
        }
        *guard = Some(Registry { pid, modules: Vec::new(), tokens: Vec::new() });
    }
    f(guard.get_or_insert_with(|| Registry { pid, modules: Vec::new(), tokens: Vec::new() }))
}

/// Loads (or reuses) the module at `path`. With `discreet` (a signer with
/// fixed settings: an agent, answering its clients), errors do not name
/// the module's path: the dynamic loader's message, which does, is left out.
pub(super) fn load_module(path: &Path, discreet: bool) -> Result<Arc<Module>, SignError> {
    let shown = if discreet { "this signer's PKCS#11 module".to_string() } else { format!("the PKCS#11 module {}", path.display()) };
    let canonical = std::fs::canonicalize(path).map_err(|e| SignError::Config(format!("{shown} cannot be opened: {e}")))?;
    with_registry(|r| {
        if let Some(m) = r.modules.iter().find(|m| m.path == canonical) {
            return Ok(m.clone());
        }
        let ctx = Pkcs11::new(&canonical).map_err(|e| match discreet {
            true => SignError::Config(format!("{shown} cannot be loaded")),
            false => SignError::Config(format!("{shown} cannot be loaded: {e}")),
        })?;
        match ctx.initialize(CInitializeArgs::OsThreads) {
            Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
            Err(e) => return Err(SignError::Config(format!("{shown} failed to initialize: {}", rv(&e)))),
        }
        let m = Arc::new(Module { ctx, path: canonical });
        r.modules.push(m.clone());
        Ok(m)
    })
}

/// A short name for a PKCS#11 error: the `CKR_` code's name where there
/// is one (never a PIN or key material: the module reports codes).
pub(super) fn rv(e: &CkError) -> String {
    match e {
        CkError::Pkcs11(code, function) => format!("{function:?} returned {code:?}"),
        other => other.to_string(),
    }
}
