//! A v0.3 client can talk to Keel: the official Python `a2a-sdk` 0.3.x, in its own venv,
//! fetches the card of a real `keel serve` (validating it as a v0.3 card), sends a message,
//! gets the task and cancels a working task, speaking v0.3 JSON-RPC with no `A2A-Version`.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{sdk_python_v03, workspace_root, KeelServer};

#[test]
fn python_a2a_sdk_0_3_sends_gets_and_cancels() {
    let python = sdk_python_v03();
    let server = KeelServer::start(&[]);
    let script = workspace_root().join("tests/python/a2a_v03_client_check.py");
    let output = Command::new(python)
        .arg(&script)
        .arg(&server.url)
        .output()
        .expect("run the Python SDK 0.3 check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK 0.3 check failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let steps: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let step = |name: &str| -> &Value {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no `{name}` step in {stdout}"))
    };
    let card = step("card");
    assert_eq!(card["name"], "keel-demo");
    assert_eq!(card["url"], server.url.as_str());
    assert_eq!(card["protocolVersion"], "0.3.0");
    assert_eq!(card["preferredTransport"], "JSONRPC");
    assert_eq!(card["streaming"], true);
    assert_eq!(step("send")["state"], "completed");
    assert_eq!(step("send")["answer"], "You said: hello from python 0.3");
    assert_eq!(step("get")["state"], "completed");
    assert_eq!(step("cancel")["state"], "canceled");
    assert_eq!(step("done")["ok"], true);
}
