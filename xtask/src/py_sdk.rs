//! The cached Python venv with the official A2A SDK, used by interop tests via `KEEL_PYTHON`.

use std::path::PathBuf;
use std::process::Command;

/// What gets pip-installed; changing it invalidates the cached venv.
pub const REQUIREMENTS: &[&str] = &["a2a-sdk>=1.0,<2", "httpx"];

/// Marker file inside the venv recording the requirements of the last successful install.
const MARKER: &str = "keel-requirements.txt";

/// Where the venv lives: under `target/`, so it is git-ignored and cached with the build.
pub fn venv_dir() -> PathBuf {
    crate::util::workspace_root()
        .join("target")
        .join("py-a2a-sdk")
}

/// The venv's python interpreter.
fn venv_python() -> PathBuf {
    if cfg!(windows) {
        venv_dir().join("Scripts").join("python.exe")
    } else {
        venv_dir().join("bin").join("python")
    }
}

/// Creates (if missing or stale) the venv and returns its python; a no-op when the marker matches.
pub fn ensure() -> Result<PathBuf, String> {
    let dir = venv_dir();
    let python = venv_python();
    let marker = dir.join(MARKER);
    let wanted = REQUIREMENTS.join("\n") + "\n";
    if python.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
        return Ok(python);
    }
    let _ = std::fs::remove_file(&marker);
    if !python.is_file() {
        let host = if cfg!(windows) { "python" } else { "python3" };
        eprintln!("creating Python venv at {}", dir.display());
        let mut cmd = Command::new(host);
        cmd.args(["-m", "venv", "--clear"]).arg(&dir);
        crate::util::status(&mut cmd)?;
    }
    eprintln!(
        "installing {} into {}",
        REQUIREMENTS.join(" "),
        dir.display()
    );
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .args(REQUIREMENTS);
    crate::util::status(&mut cmd)?;
    let mut check = Command::new(&python);
    check.args(["-c", "import a2a.client, a2a.types"]);
    crate::util::status(&mut check)?;
    std::fs::write(&marker, wanted)
        .map_err(|e| format!("could not write {}: {e}", marker.display()))?;
    Ok(python)
}
