//! What the console's browser test (tests/console_browser.rs) needs: Debian's Chromium and
//! the pinned `playwright-core` of `tests/browser/package-lock.json`, installed with `npm ci`
//! into `tests/browser/node_modules` (git-ignored).
//!
//! std only and self-contained: `cargo xtask ci` installs both through it, and the test
//! includes this very file (`tests/support`), so both find them the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable naming the Chromium to drive (default [`DEFAULT_CHROMIUM`]).
pub const CHROMIUM_ENV: &str = "KEEL_CHROMIUM";

/// Where Debian's `chromium` package puts the browser.
pub const DEFAULT_CHROMIUM: &str = "/usr/bin/chromium";

/// The workspace root: the nearest directory above the compiling crate that holds `xtask/`.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("xtask").join("Cargo.toml").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}

/// The browser test's npm project: `package.json`, its lock file and the test script.
pub fn test_dir() -> PathBuf {
    workspace_root().join("tests").join("browser")
}

/// The Chromium to drive: `KEEL_CHROMIUM`, else Debian's, when it is there.
pub fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os(CHROMIUM_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CHROMIUM));
    path.is_file().then_some(path)
}

/// Finds Chromium, else installs Debian's package with `apt-get install -y chromium`.
pub fn ensure_chromium() -> Result<PathBuf, String> {
    if let Some(found) = chromium() {
        return Ok(found);
    }
    println!("no Chromium at {DEFAULT_CHROMIUM}: installing it with `apt-get install -y chromium`");
    let status = Command::new("apt-get")
        .args(["install", "-y", "chromium"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .map_err(|e| format!("could not run apt-get: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`apt-get install -y chromium` failed ({status}); install Chromium and set \
             {CHROMIUM_ENV} to it"
        ));
    }
    chromium()
        .ok_or_else(|| format!("apt-get installed chromium, but {DEFAULT_CHROMIUM} is missing"))
}

/// Installs `tests/browser`'s locked packages with `npm ci` unless the last install was of
/// the same lock file, and returns the directory to run the test script in. Needs node and
/// npm, and the npm registry for the first install.
pub fn ensure_node_modules() -> Result<PathBuf, String> {
    let dir = test_dir();
    let lock = std::fs::read_to_string(dir.join("package-lock.json"))
        .map_err(|e| format!("could not read {}/package-lock.json: {e}", dir.display()))?;
    let marker = dir.join("node_modules").join(".keel-lock.json");
    let installed = dir.join("node_modules").join("playwright-core").is_dir();
    if installed && std::fs::read_to_string(&marker).is_ok_and(|m| m == lock) {
        return Ok(dir);
    }
    eprintln!(
        "installing the browser test's packages: npm ci in {}",
        dir.display()
    );
    let output = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--silent"])
        .current_dir(&dir)
        .output()
        .map_err(|e| format!("could not run npm (install node and npm): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "npm ci in {} failed ({}): {}",
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // Written last: an interrupted install leaves no marker and is redone next time.
    std::fs::write(&marker, lock)
        .map_err(|e| format!("could not write {}: {e}", marker.display()))?;
    Ok(dir)
}
