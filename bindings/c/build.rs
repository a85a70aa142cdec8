//! Gives the shared library its soname, so that programs linked against
//! `libkeyfence.so` load `libkeyfence.so.0` and a later incompatible ABI can
//! sit beside it.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkeyfence.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
