//! A stranger's client can configure push notifications on Keel: the official Python
//! `a2a-sdk` 1.x, against a real `keel serve`, over JSON-RPC and over HTTP+JSON, creates, gets,
//! lists and deletes a task's push notification config.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{sdk_python, workspace_root, KeelServer};

#[test]
fn python_a2a_sdk_manages_push_configs_over_jsonrpc_and_rest() {
    let server = KeelServer::start(&[]);
    let script = workspace_root().join("tests/python/a2a_push_check.py");
    let output = Command::new(sdk_python())
        .arg(&script)
        .arg(&server.url)
        .output()
        .expect("run the Python SDK push check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK push check failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let steps: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let step = |name: &str| {
            steps
                .iter()
                .find(|s| s["step"] == name && s["binding"] == binding)
                .unwrap_or_else(|| panic!("no `{name}` step over {binding} in {stdout}"))
        };
        assert_eq!(step("create")["id"], format!("hook-{binding}"));
        assert_eq!(
            step("list")["ids"],
            serde_json::json!([format!("hook-{binding}")])
        );
        assert_eq!(step("deleted")["left"], 0);
    }
    assert!(steps.iter().any(|s| s["step"] == "ok"));
}
