//! Shared helpers for the whole-system tests: start the real `keel` binary and find the
//! Python A2A SDK venv.

#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running `keel serve`, killed when dropped.
pub struct KeelServer {
    child: Child,
    /// The base URL it printed, ending in `/`.
    pub url: String,
}

impl KeelServer {
    /// Start `keel serve --port 0` with extra arguments and wait for the line that names
    /// its URL (the server is listening once it is printed).
    pub fn start(extra: &[&str]) -> KeelServer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start keel serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the serving line");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("keel serve printed no URL: {line:?}"))
            .to_owned();
        KeelServer { child, url }
    }

    /// Send SIGTERM and wait for the exit status.
    #[cfg(unix)]
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        let status = self.child.wait().expect("wait for keel");
        std::mem::forget(self);
        status
    }
}

impl Drop for KeelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python interpreter of the a2a-sdk venv: `KEEL_PYTHON` (set by `cargo xtask ci`), else
/// the venv `cargo xtask py-sdk` creates under `target/`. Panics with the command to run when
/// neither exists: this test must never pass without talking to the real SDK.
pub fn sdk_python() -> PathBuf {
    if let Some(python) = std::env::var_os("KEEL_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = workspace_root().join("target/py-a2a-sdk/bin/python");
    assert!(
        venv.exists(),
        "the Python a2a-sdk venv is missing: run `cargo xtask py-sdk` (or `cargo xtask ci`, which creates it)"
    );
    venv
}
