//! A stranger's client can stream from Keel: the official Python `a2a-sdk` 1.x, against a real
//! `keel serve`, over JSON-RPC and over HTTP+JSON, streams a message (task first, updates,
//! ends after the final status), hangs up on a slow task, resubscribes, cancels it and sees one
//! canceled event, lists the tasks of its context, and is refused a subscription to a finished
//! task with UnsupportedOperationError.

mod support;

use support::{sdk_python, KeelServer, PythonSteps};

#[test]
fn python_a2a_sdk_streams_resubscribes_and_lists_over_jsonrpc_and_rest() {
    let server = KeelServer::start(&[]);
    let steps = PythonSteps::run(
        sdk_python(),
        "a2a_streaming_check.py",
        &[server.url.as_str()],
    );
    let step = |name: &str, binding: &str| steps.step_over(name, binding);
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
    assert!(steps
        .steps
        .iter()
        .any(|s| s["step"] == "done" && s["ok"] == true));
}
