//! Helpers shared by the command-line tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `keyfence` binary built for these tests.
pub fn keyfence(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyfence")).args(args).output().expect("run keyfence")
}

/// Runs it and asserts success; returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = keyfence(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A scratch directory removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("keyfence-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch directory");
        Dir(d)
    }

    /// A path inside the directory, as a string for command lines.
    pub fn p(&self, f: &str) -> String {
        self.0.join(f).to_str().expect("UTF-8 path").to_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
