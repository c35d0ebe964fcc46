//! The cached Python venvs with the official A2A SDK, used by interop tests: the 1.x SDK via
//! `KEEL_PYTHON`, the 0.3.x SDK (a v0.3 client) via `KEEL_PYTHON_V03`. Each has its own venv,
//! since the two SDK lines share the `a2a` package name.
//!
//! std only and self-contained: `cargo xtask py-sdk` uses it, and the root tests include this
//! very file (`tests/support`), so both make and find the venvs the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One cached SDK venv.
pub struct SdkVenv {
    /// The directory under `target/`.
    pub dir_name: &'static str,
    /// What gets pip-installed; changing it invalidates the cached venv.
    pub requirements: &'static [&'static str],
    /// The environment variable that hands its python to the tests.
    pub env_var: &'static str,
    /// The modules an install must make importable (`python -c "import …"`).
    pub imports: &'static str,
}

/// The A2A 1.x SDK (`KEEL_PYTHON`).
pub const V1: SdkVenv = SdkVenv {
    dir_name: "py-a2a-sdk",
    requirements: &["a2a-sdk[grpc]>=1.0,<2", "httpx"],
    env_var: "KEEL_PYTHON",
    imports: "a2a.client, a2a.types",
};

/// The A2A 0.3.x SDK, a v0.3 client (`KEEL_PYTHON_V03`).
pub const V03: SdkVenv = SdkVenv {
    dir_name: "py-a2a-sdk-v03",
    requirements: &["a2a-sdk>=0.3,<0.4", "httpx"],
    env_var: "KEEL_PYTHON_V03",
    imports: "a2a.client, a2a.types",
};

/// Marker file inside the venv recording the requirements of the last successful install.
const MARKER: &str = "keel-requirements.txt";

/// The workspace root: the nearest directory above the compiling crate that holds `xtask/`
/// (this file is compiled into xtask and into the root tests, whose crates sit at different
/// depths).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("xtask").join("Cargo.toml").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}

impl SdkVenv {
    /// Where the venv lives: under `target/`, so it is git-ignored and cached with the build.
    pub fn dir(&self) -> PathBuf {
        workspace_root().join("target").join(self.dir_name)
    }

    /// The venv's python interpreter.
    fn python(&self) -> PathBuf {
        if cfg!(windows) {
            self.dir().join("Scripts").join("python.exe")
        } else {
            self.dir().join("bin").join("python")
        }
    }

    /// Creates (if missing or stale) the venv and returns its python; a no-op when the marker
    /// matches. Needs python3 with its venv module, and PyPI for the first install.
    pub fn ensure(&self) -> Result<PathBuf, String> {
        let dir = self.dir();
        let python = self.python();
        let marker = dir.join(MARKER);
        let wanted = self.requirements.join("\n") + "\n";
        if python.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
            return Ok(python);
        }
        let _ = std::fs::remove_file(&marker);
        if !python.is_file() {
            let host = if cfg!(windows) { "python" } else { "python3" };
            eprintln!("creating Python venv at {}", dir.display());
            let mut cmd = Command::new(host);
            cmd.args(["-m", "venv", "--clear"]).arg(&dir);
            run(&mut cmd)?;
        }
        eprintln!(
            "installing {} into {}",
            self.requirements.join(" "),
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
        .args(self.requirements);
        run(&mut cmd)?;
        let mut check = Command::new(&python);
        check.arg("-c").arg(format!("import {}", self.imports));
        run(&mut check)?;
        // Written last: an interrupted install leaves no marker and is redone next time.
        std::fs::write(&marker, wanted)
            .map_err(|e| format!("could not write {}: {e}", marker.display()))?;
        Ok(python)
    }
}

/// Runs `cmd` to its end; `Err` names the command and carries what it printed on stderr.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let shown = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    match cmd.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{shown}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        )),
        Err(e) => Err(format!("could not run `{shown}`: {e}")),
    }
}
