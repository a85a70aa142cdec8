//! Where the module and the PIN come from ([`Pkcs11Settings`]): the URI,
//! else the settings, which [`Pkcs11Settings::from_env`] reads from the
//! environment; and what a signer with fixed settings (an agent) lets a
//! URI name. Reading the PIN file and p11-kit's module configuration is
//! here too; nothing here loads a module or talks to a token.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::login::{Pin, PinSource};
use super::uri::Pkcs11Uri;
use crate::sign::types::SignError;

/// Where the module and the PIN come from when the URI does not say, and
/// what a URI may name: see [`Pkcs11Settings::from_env`].
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pkcs11Settings {
    /// The module used when the URI names none (`KEYFENCE_PKCS11_MODULE`).
    pub module: Option<PathBuf>,
    /// The file holding the PIN when the URI names none
    /// (`KEYFENCE_PKCS11_PIN_FILE`).
    pub pin_file: Option<PathBuf>,
    /// The PIN itself, when no file is named (`KEYFENCE_PKCS11_PIN`).
    pub pin: Option<Zeroizing<String>>,
    /// Refuse a URI's `module-path`, `module-name` and `pin-source` unless
    /// they name the module and PIN file above: what an agent sets, so a
    /// client cannot make it load a library or read a file of its choice.
    /// Errors then name neither the module's path nor the PIN file's, nor
    /// the labels of tokens other than the one the URI selects: they go to
    /// clients the signer does not trust.
    pub fixed: bool,
}

impl std::fmt::Debug for Pkcs11Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pkcs11Settings")
            .field("module", &self.module)
            .field("pin_file", &self.pin_file)
            .field("pin", &self.pin.as_ref().map(|_| "<set>"))
            .field("fixed", &self.fixed)
            .finish()
    }
}

impl Pkcs11Settings {
    /// Settings from the environment: `KEYFENCE_PKCS11_MODULE` (the
    /// module's file), `KEYFENCE_PKCS11_PIN_FILE` (a file whose first line
    /// is the PIN) and `KEYFENCE_PKCS11_PIN` (the PIN itself; for a
    /// service manager's credential, never typed on a command line).
    pub fn from_env() -> Self {
        let path = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Pkcs11Settings {
            module: path("KEYFENCE_PKCS11_MODULE"),
            pin_file: path("KEYFENCE_PKCS11_PIN_FILE"),
            pin: std::env::var("KEYFENCE_PKCS11_PIN").ok().filter(|p| !p.is_empty()).map(Zeroizing::new),
            fixed: false,
        }
    }

    /// The module file `uri` names, or these settings' module.
    pub(super) fn module_for(&self, uri: &Pkcs11Uri) -> Result<PathBuf, SignError> {
        let named = match (&uri.module_path, &uri.module_name) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(name)) => Some(p11_kit_module(name)?),
            (None, None) => None,
        };
        match (named, &self.module) {
            // The fixed module's path is not the client's to learn.
            (Some(p), Some(fixed)) if self.fixed && !same_file(&p, fixed) => Err(SignError::InvalidArgument(format!(
                "this signer loads only the PKCS#11 module it was started with; the URI names {}",
                p.display()
            ))),
            // The fixed file itself, never the name the client gave: a link
            // the client controls could point elsewhere by the time it is
            // opened.
            (Some(_), Some(fixed)) if self.fixed => Ok(fixed.clone()),
            (Some(_), None) if self.fixed => {
                Err(SignError::InvalidArgument("this signer was started without a PKCS#11 module, and loads none a client names".into()))
            }
            (Some(p), _) => Ok(p),
            (None, Some(m)) => Ok(m.clone()),
            (None, None) => Err(SignError::Config(
                "no PKCS#11 module: name it in the URI (`?module-path=/usr/lib/softhsm/libsofthsm2.so`) or set KEYFENCE_PKCS11_MODULE"
                    .into(),
            )),
        }
    }

    /// The PIN for `uri`: its `pin-source`, else the PIN file, else the
    /// PIN; `None` when none is given.
    pub(super) fn pin_for(&self, uri: &Pkcs11Uri) -> Result<Option<Pin>, SignError> {
        let file = match (&uri.pin_source, &self.pin_file) {
            (Some(p), Some(fixed)) if self.fixed && !same_file(p, fixed) => {
                return Err(SignError::InvalidArgument(
                    "this signer reads only the PIN file it was started with; the URI's pin-source names another".into(),
                ))
            }
            (Some(_), None) if self.fixed => return Err(SignError::InvalidArgument("this signer reads no PIN file a client names".into())),
            (Some(_), Some(fixed)) if self.fixed => Some(fixed),
            (Some(p), _) => Some(p),
            (None, f) => f.as_ref(),
        };
        match file {
            Some(path) => {
                // A fixed PIN file's path is not the client's to learn.
                let shown = if self.fixed { "this signer's PIN file".to_string() } else { format!("the PIN file {}", path.display()) };
                let secret = read_pin(path, &shown)?;
                let source = PinSource::File(std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()));
                Ok(Some(Pin::new(secret, source, shown)))
            }
            None => Ok(self.pin.clone().map(|secret| Pin::new(secret, PinSource::Value, "the PIN setting (KEYFENCE_PKCS11_PIN)".into()))),
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// The first line of `path`, without its line end; `shown` names the
/// file in errors.
fn read_pin(path: &Path, shown: &str) -> Result<Zeroizing<String>, SignError> {
    let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| SignError::InvalidArgument(format!("cannot read {shown}: {e}")))?);
    let text = std::str::from_utf8(&bytes).map_err(|_| SignError::InvalidArgument(format!("{shown} is not UTF-8")))?;
    let pin = text.split(['\n', '\r']).next().unwrap_or("");
    if pin.is_empty() {
        return Err(SignError::InvalidArgument(format!("{shown} is empty")));
    }
    Ok(Zeroizing::new(pin.to_owned()))
}

/// The file p11-kit's configuration names for module `name`
/// (`/etc/pkcs11/modules/NAME.module`, then the packaged ones), as
/// `module-name=` asks.
fn p11_kit_module(name: &str) -> Result<PathBuf, SignError> {
    let dirs = ["/etc/pkcs11/modules", "/usr/share/p11-kit/modules"];
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(Path::new(dir).join(format!("{name}.module"))) else { continue };
        for line in text.lines() {
            if let Some(v) = line.trim().strip_prefix("module:") {
                let v = v.trim();
                let p = PathBuf::from(v);
                if p.is_absolute() {
                    return Ok(p);
                }
                let multiarch = format!("/usr/lib/{}-linux-gnu/pkcs11", std::env::consts::ARCH);
                return Ok(Path::new(&multiarch).join(p));
            }
        }
    }
    Err(SignError::Config(format!("no p11-kit module named `{name}` (looked for {name}.module in {})", dirs.join(", "))))
}

/// Checks that the module `uri` and `settings` name is a file, without
/// loading it.
pub(crate) fn module_exists(uri: &Pkcs11Uri, settings: &Pkcs11Settings) -> Result<(), SignError> {
    let path = settings.module_for(uri)?;
    std::fs::metadata(&path)
        .map(|_| ())
        .map_err(|e| SignError::Config(format!("the PKCS#11 module {} cannot be opened: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signer with a fixed module and PIN file (an agent) uses those
    /// files themselves, never the name a client gave, even when that name
    /// leads to them now: a link the client controls could lead elsewhere
    /// by the time the file is opened.
    #[test]
    fn fixed_settings_use_their_own_files_never_the_clients_names() {
        let dir = tempfile::tempdir().unwrap();
        let (module, pin) = (dir.path().join("module.so"), dir.path().join("pin"));
        std::fs::write(&module, b"").unwrap();
        std::fs::write(&pin, b"1234\n").unwrap();
        let (module_link, pin_link) = (dir.path().join("m-link"), dir.path().join("p-link"));
        std::os::unix::fs::symlink(&module, &module_link).unwrap();
        std::os::unix::fs::symlink(&pin, &pin_link).unwrap();
        let settings = Pkcs11Settings { module: Some(module.clone()), pin_file: Some(pin.clone()), pin: None, fixed: true };
        let uri = Pkcs11Uri::parse(&format!(
            "pkcs11:token=t;object=k?module-path={}&pin-source=file:{}",
            module_link.display(),
            pin_link.display()
        ))
        .unwrap();
        assert_eq!(settings.module_for(&uri).unwrap(), module);
        assert_eq!(settings.pin_for(&uri).unwrap().map(|p| p.secret.as_str().to_owned()).as_deref(), Some("1234"));
        // Now the links lead elsewhere: refused, and never followed.
        std::fs::remove_file(&module_link).unwrap();
        std::os::unix::fs::symlink("/bin/sh", &module_link).unwrap();
        assert!(settings.module_for(&uri).is_err());
        let unfixed = Pkcs11Settings { fixed: false, ..settings.clone() };
        assert_eq!(unfixed.module_for(&uri).unwrap(), module_link);
    }
}
