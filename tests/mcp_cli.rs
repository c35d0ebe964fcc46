//! The `keel` command with MCP servers, as a user runs it: `keel tools` lists what the model
//! of `examples/mcp.toml` sees from the reference "everything" server, `keel run` calls one of
//! its tools with the offline model, and `keel check` names a server that does not start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

// xtask's own code, included rather than copied: the tests find the servers where
// `cargo xtask mcp` installs them.
#[allow(dead_code)]
#[path = "../xtask/src/mcp.rs"]
mod mcp_servers;
#[allow(dead_code)]
#[path = "../xtask/src/py_sdk.rs"]
mod py_sdk;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace root")
        .to_owned()
}

/// `PATH` with the everything server's directory first: the example names its command.
fn path_with_everything() -> OsString {
    let command = match std::env::var_os(mcp_servers::EVERYTHING_ENV) {
        Some(found) => PathBuf::from(found),
        None => mcp_servers::ensure_everything().unwrap_or_else(|error| {
            panic!(
                "this test needs npm's {} (`{}` installs it under target/): {error}",
                mcp_servers::EVERYTHING_PACKAGE,
                mcp_servers::INSTALL_COMMAND
            )
        }),
    };
    let dir = command
        .parent()
        .expect("the command's directory")
        .to_owned();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest))).expect("a PATH")
}

/// `keel ARGS` at the workspace root, quiet logs.
fn keel() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .current_dir(root())
        .env("RUST_LOG", "warn")
        .env("PATH", path_with_everything())
        .env_remove("KEEL_CONFIG")
        .env_remove("KEEL_STORE");
    command
}

#[test]
fn keel_tools_lists_the_everything_servers_tools_with_schemas_and_flags() {
    // assert_cmd's success check shows the stderr of a failure.
    let run = keel()
        .args(["tools", "--config", "examples/mcp.toml", "--json"])
        .assert()
        .success();
    let out = run.get_output();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["agent"], "mcp-demo");
    let tools = listed[0]["tools"].as_array().unwrap();
    let echo = tools
        .iter()
        .find(|t| t["name"] == "everything_echo")
        .expect("everything_echo is listed");
    assert_eq!(echo["source"], "mcp");
    assert_eq!(echo["server"], "everything");
    assert_eq!(echo["mcp_name"], "echo");
    assert_eq!(echo["read_only"], true);
    assert_eq!(echo["idempotent"], true);
    assert_eq!(
        echo["parameters"]["required"],
        serde_json::json!(["message"])
    );
    // The file's deny list keeps the tools that need a human or a model on the other side.
    assert!(!tools
        .iter()
        .any(|t| t["name"] == "everything_trigger-sampling-request"));
}

#[test]
fn keel_run_calls_an_mcp_tool_with_the_offline_model_and_the_run_replays() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let out = keel()
        .args([
            "run",
            "--config",
            "examples/mcp.toml",
            "--store",
            &store,
            r#"/everything_echo {"message": "from the command line"}"#,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("everything_echo: Echo: from the command line"),
        "{stdout}"
    );

    // The run replays through the file's agent with the MCP tool's recorded result.
    let listed = keel()
        .args(["runs", "list", "--json", "--store", &store])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let run_id = listed["runs"][0]["run_id"].as_str().unwrap().to_owned();
    let replay = keel()
        .args(["replay", &run_id, "--json", "--config", "examples/mcp.toml"])
        .args(["--store", &store])
        .output()
        .unwrap();
    let verdict: Value = serde_json::from_slice(&replay.stdout).unwrap_or_else(|_| {
        panic!("{}", String::from_utf8_lossy(&replay.stderr));
    });
    assert_eq!(replay.status.code(), Some(0), "{verdict}");
    assert_eq!(verdict["passed"], true, "{verdict}");
    assert_eq!(
        verdict["unrecorded_tools"],
        serde_json::json!([]),
        "{verdict}"
    );
}

#[test]
fn keel_check_names_a_server_that_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    std::fs::write(
        &file,
        "[[agents]]\nname = \"a\"\ndescription = \"A.\"\n\
         [mcp.ghost]\ncommand = \"keel-no-such-mcp-server\"\nargs = [\"--serve\"]\n",
    )
    .unwrap();
    let out = keel().arg("check").arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("mcp.ghost"), "{stderr}");
    assert!(
        stderr.contains(
            "MCP server `ghost` (keel-no-such-mcp-server --serve) did not start: cannot run it"
        ),
        "{stderr}"
    );
}

#[test]
fn keel_check_starts_the_servers_and_lists_them() {
    let run = keel()
        .args(["check", "examples/mcp.toml"])
        .assert()
        .success();
    let out = run.get_output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("  mcp server: everything (mcp-server-everything)"),
        "{stdout}"
    );
}
