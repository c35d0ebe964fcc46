//! The MCP servers Keel's MCP client is tested against, none written here, installed once in
//! a cached place under `target/`: the reference "everything" server from npm (its
//! `mcp-server-everything` command, handed to the tests as `KEEL_MCP_EVERYTHING`) and a venv
//! with the Python MCP SDK, whose FastMCP serves the tests' fixture (`KEEL_MCP_PYTHON`).
//!
//! std only and self-contained besides `py_sdk` (its venv and `run`): `cargo xtask ci` and
//! `cargo xtask mcp` use it, and keel-mcp's tests include this very file, so both make and
//! find the servers the same way.

use std::path::PathBuf;
use std::process::Command;

use super::py_sdk::{run, SdkVenv};

/// The venv with the Python MCP SDK (FastMCP, with uvicorn).
pub const PYTHON: SdkVenv = SdkVenv {
    dir_name: "mcp-py",
    requirements: &["mcp>=1.30,<2"],
    env_var: "KEEL_MCP_PYTHON",
    imports: "mcp.server.fastmcp, uvicorn",
};

/// The npm package of the reference server, pinned: a newer one may change its tools.
pub const EVERYTHING_PACKAGE: &str = "@modelcontextprotocol/server-everything@2026.8.31";

/// The environment variable that hands the everything server's command to the tests.
pub const EVERYTHING_ENV: &str = "KEEL_MCP_EVERYTHING";

/// Where the npm install lives.
fn node_dir() -> PathBuf {
    PYTHON
        .dir()
        .parent()
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("mcp-node")
}

/// The command that installs both, for messages.
pub const INSTALL_COMMAND: &str = "cargo xtask mcp";

/// Installs (if missing or another version) the everything server and returns its command;
/// a no-op when the marker names the pinned package. Needs node, npm and the npm registry for
/// the first install.
pub fn ensure_everything() -> Result<PathBuf, String> {
    let dir = node_dir();
    let bin = dir
        .join("node_modules")
        .join(".bin")
        .join("mcp-server-everything");
    let marker = dir.join("keel-package.txt");
    if bin.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m == EVERYTHING_PACKAGE) {
        return Ok(bin);
    }
    let _ = std::fs::remove_file(&marker);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    // A package.json of its own, so npm installs here and not in a parent's project.
    std::fs::write(dir.join("package.json"), "{\"private\": true}\n")
        .map_err(|e| format!("could not write {}: {e}", dir.display()))?;
    eprintln!("installing {EVERYTHING_PACKAGE} into {}", dir.display());
    let mut npm = Command::new("npm");
    npm.args([
        "install",
        "--no-audit",
        "--no-fund",
        "--silent",
        "--save-exact",
    ])
    .arg(EVERYTHING_PACKAGE)
    .current_dir(&dir);
    run(&mut npm)?;
    if !bin.is_file() {
        return Err(format!("npm installed no {}", bin.display()));
    }
    // Written last: an interrupted install leaves no marker and is redone next time.
    std::fs::write(&marker, EVERYTHING_PACKAGE)
        .map_err(|e| format!("could not write {}: {e}", marker.display()))?;
    Ok(bin)
}

/// Both servers: `(variable, value)` for each, ready to hand to the tests.
pub fn ensure_all() -> Result<Vec<(&'static str, PathBuf)>, String> {
    Ok(vec![
        (EVERYTHING_ENV, ensure_everything()?),
        (PYTHON.env_var, PYTHON.ensure()?),
    ])
}

/// `cargo xtask ci`'s step: install both and hand their variables to the tests. A failed
/// install skips the step with the reason; the MCP tests then fail saying what is missing.
pub fn ci_step(
    test_env: &mut Vec<(&'static str, std::ffi::OsString)>,
) -> Result<Option<String>, String> {
    match ensure_all() {
        Ok(found) => {
            for (var, path) in found {
                println!("    {var}={}", path.display());
                test_env.push((var, path.into_os_string()));
            }
            Ok(None)
        }
        Err(e) => Ok(Some(format!(
            "could not install the MCP test servers ({e}); the MCP tests will fail until \
             `{INSTALL_COMMAND}` works"
        ))),
    }
}
