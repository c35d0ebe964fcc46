//! A stranger's client can configure push notifications on Keel: the official Python
//! `a2a-sdk` 1.x, against a real `keel serve`, over JSON-RPC and over HTTP+JSON, creates, gets,
//! lists and deletes a task's push notification config.

mod support;

use support::{sdk_python, KeelServer, PythonSteps};

#[test]
fn python_a2a_sdk_manages_push_configs_over_jsonrpc_and_rest() {
    let server = KeelServer::start(&[]);
    let steps = PythonSteps::run(sdk_python(), "a2a_push_check.py", &[server.url.as_str()]);
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let step = |name: &str| steps.step_over(name, binding);
        assert_eq!(step("create")["id"], format!("hook-{binding}"));
        assert_eq!(
            step("list")["ids"],
            serde_json::json!([format!("hook-{binding}")])
        );
        assert_eq!(step("deleted")["left"], 0);
    }
    assert!(steps.steps.iter().any(|s| s["step"] == "ok"));
}
