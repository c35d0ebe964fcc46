//! The cached Python venvs with the official A2A SDK, used by interop tests: the 1.x SDK via
//! `KEEL_PYTHON`, the 0.3.x SDK (a v0.3 client) via `KEEL_PYTHON_V03`. Each has its own venv,
//! since the two SDK lines share the `a2a` package name.

use std::path::PathBuf;
use std::process::Command;

/// One cached SDK venv.
pub struct SdkVenv {
    /// The directory under `target/`.
    pub dir_name: &'static str,
    /// What gets pip-installed; changing it invalidates the cached venv.
    pub requirements: &'static [&'static str],
    /// The environment variable that hands its python to the tests.
    pub env_var: &'static str,
}

/// The A2A 1.x SDK (`KEEL_PYTHON`).
pub const V1: SdkVenv = SdkVenv {
    dir_name: "py-a2a-sdk",
    requirements: &["a2a-sdk>=1.0,<2", "httpx"],
    env_var: "KEEL_PYTHON",
};

/// The A2A 0.3.x SDK, a v0.3 client (`KEEL_PYTHON_V03`).
pub const V03: SdkVenv = SdkVenv {
    dir_name: "py-a2a-sdk-v03",
    requirements: &["a2a-sdk>=0.3,<0.4", "httpx"],
    env_var: "KEEL_PYTHON_V03",
};

/// Marker file inside the venv recording the requirements of the last successful install.
const MARKER: &str = "keel-requirements.txt";

impl SdkVenv {
    /// Where the venv lives: under `target/`, so it is git-ignored and cached with the build.
    pub fn dir(&self) -> PathBuf {
        crate::util::workspace_root()
            .join("target")
            .join(self.dir_name)
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
    /// matches.
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
            crate::util::status(&mut cmd)?;
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
        crate::util::status(&mut cmd)?;
        let mut check = Command::new(&python);
        check.args(["-c", "import a2a.client, a2a.types"]);
        crate::util::status(&mut check)?;
        std::fs::write(&marker, wanted)
            .map_err(|e| format!("could not write {}: {e}", marker.display()))?;
        Ok(python)
    }
}
