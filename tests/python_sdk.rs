//! A stranger's client can talk to Keel: the official Python `a2a-sdk` 1.x fetches the card
//! of a real `keel serve`, sends a message, gets the task, cancels a working task and sees a
//! cancel of a finished task refused.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{sdk_python, workspace_root, KeelServer};

#[test]
fn python_a2a_sdk_round_trips_card_send_get_and_cancel() {
    let server = KeelServer::start(&[]);
    let script = workspace_root().join("tests/python/a2a_client_check.py");
    let output = Command::new(sdk_python())
        .arg(&script)
        .arg(&server.url)
        .output()
        .expect("run the Python SDK check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK check failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
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
    assert_eq!(step("card")["name"], "keel-demo");
    assert_eq!(step("send")["state"], "TASK_STATE_COMPLETED");
    assert_eq!(step("send")["answer"], "You said: hello from python");
    assert_eq!(step("get")["state"], "TASK_STATE_COMPLETED");
    assert_eq!(step("cancel")["state"], "TASK_STATE_CANCELED");
    assert_eq!(step("cancel_completed")["errorCode"], -32002);
    assert_eq!(step("done")["ok"], true);
}
