//! A stranger's client can stream from Keel: the official Python `a2a-sdk` 1.x, against a real
//! `keel serve`, over JSON-RPC and over HTTP+JSON, streams a message (task first, updates,
//! ends after the final status), hangs up on a slow task, resubscribes, cancels it and sees one
//! canceled event, lists the tasks of its context, and is refused a subscription to a finished
//! task with UnsupportedOperationError.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{sdk_python, workspace_root, KeelServer};

#[test]
fn python_a2a_sdk_streams_resubscribes_and_lists_over_jsonrpc_and_rest() {
    let server = KeelServer::start(&[]);
    let script = workspace_root().join("tests/python/a2a_streaming_check.py");
    let output = Command::new(sdk_python())
        .arg(&script)
        .arg(&server.url)
        .output()
        .expect("run the Python SDK streaming check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK streaming check failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let steps: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let step = |name: &str, binding: &str| -> &Value {
        steps
            .iter()
            .find(|s| s["step"] == name && s["binding"] == binding)
            .unwrap_or_else(|| panic!("no `{name}` step over {binding} in {stdout}"))
    };
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let stream = step("stream", binding);
        assert_eq!(stream["kinds"][0], "task");
        assert_eq!(stream["last"], "TASK_STATE_COMPLETED");
        assert_eq!(
            step("resubscribe", binding)["finals"],
            serde_json::json!(["TASK_STATE_CANCELED"])
        );
        assert_eq!(step("list", binding)["total"], 2);
        assert_eq!(step("subscribe_finished", binding)["code"], -32004);
    }
    assert!(steps.iter().any(|s| s["step"] == "done" && s["ok"] == true));
}
