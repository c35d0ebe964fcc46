//! Shared helpers: the workspace root and how cargo child processes are configured.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// A `cargo` command run from the workspace root, with the shared CI environment
/// (`CARGO_PROFILE_DEV_DEBUG=0`, `CARGO_TERM_COLOR=always` unless set) plus `extra_env`.
pub fn cargo(extra_env: &[(&str, OsString)]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd.env("CARGO_PROFILE_DEV_DEBUG", "0");
    if std::env::var_os("CARGO_TERM_COLOR").is_none() {
        cmd.env("CARGO_TERM_COLOR", "always");
    }
    for (key, value) in extra_env {
        cmd.env(key, value);
    }
    cmd
}

/// Runs `cmd` with inherited stdio; `Err` describes a spawn failure or a non-zero exit.
pub fn status(cmd: &mut Command) -> Result<(), String> {
    let shown = describe(cmd);
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("`{shown}` failed ({s})")),
        Err(e) => Err(format!("could not run `{shown}`: {e}")),
    }
}

/// A human-readable rendering of a command line, for messages.
pub fn describe(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program());
    let program = program.file_name().unwrap_or(program.as_os_str());
    std::iter::once(program)
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
