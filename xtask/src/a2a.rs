//! What `cargo xtask bench a2a` needs before its bench runs: `wrk` (installed with apt-get
//! when missing), the release `keel` binary, and the peer servers of `benches/peers`, built
//! as their own package (outside the workspace) into `target/peers`. The bench is told where
//! the binaries are through `KEEL_BENCH_KEEL_BIN` and `KEEL_BENCH_PEERS_DIR`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::util;

/// Builds and finds everything the A2A bench runs; the environment to hand it.
pub fn prepare() -> Result<Vec<(&'static str, OsString)>, String> {
    ensure_wrk()?;
    let target = target_dir();
    println!("building the release `keel` binary");
    util::status(util::cargo(&[]).args(["build", "--release", "-p", "keel-cli"]))?;
    println!("building the peer servers (benches/peers, its own package)");
    let peers_target = target.join("peers");
    util::status(
        util::cargo(&[])
            .args(["build", "--release", "--manifest-path"])
            .arg(util::workspace_root().join("benches/peers/Cargo.toml"))
            .arg("--target-dir")
            .arg(&peers_target),
    )?;
    Ok(vec![
        ("KEEL_BENCH_KEEL_BIN", target.join("release/keel").into()),
        ("KEEL_BENCH_PEERS_DIR", peers_target.join("release").into()),
    ])
}

/// Builds the release `keel` binary alone (what `cargo xtask bench soak` runs); the
/// environment to hand the bench.
pub fn prepare_keel() -> Result<Vec<(&'static str, OsString)>, String> {
    println!("building the release `keel` binary");
    util::status(util::cargo(&[]).args(["build", "--release", "-p", "keel-cli"]))?;
    Ok(vec![(
        "KEEL_BENCH_KEEL_BIN",
        target_dir().join("release/keel").into(),
    )])
}

/// The workspace's target directory: `CARGO_TARGET_DIR` when set, else `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| util::workspace_root().join("target"))
}

/// Whether `program --version` (or `-v`) runs at all.
fn runs(program: &str, flag: &str) -> bool {
    Command::new(program)
        .arg(flag)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Finds `wrk`, else installs the Debian package (the load generator of the bench).
fn ensure_wrk() -> Result<(), String> {
    // `wrk -v` exits non-zero, but it runs: that is all this asks.
    if runs("wrk", "-v") {
        return Ok(());
    }
    println!("wrk is not on PATH: installing it with `apt-get install -y wrk`");
    util::status(Command::new("apt-get").args(["install", "-y", "wrk"]))
        .map_err(|e| format!("{e}; install wrk yourself and run again"))?;
    if runs("wrk", "-v") {
        Ok(())
    } else {
        Err("apt-get installed wrk, but it does not run".into())
    }
}
