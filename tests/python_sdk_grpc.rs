//! A stranger's gRPC client can talk to Keel: the official Python `a2a-sdk` 1.x with its grpc
//! extra, against a real `keel serve`, finds the gRPC interface on the card, streams a message,
//! gets the task, resubscribes to a slow task and cancels it, lists the context's tasks, and
//! reads A2A's typed errors (TaskNotFound, UnsupportedOperation) from the statuses' details.

mod support;

use support::{sdk_python, KeelServer, PythonSteps};

#[test]
fn python_a2a_sdk_speaks_grpc_to_keel_serve() {
    let server = KeelServer::start(&[]);
    let steps = PythonSteps::run(sdk_python(), "a2a_grpc_check.py", &[server.url.as_str()]);
    let host_port = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    assert_eq!(steps.step("card")["grpc"], serde_json::json!([host_port]));
    let stream = steps.step("stream");
    assert_eq!(stream["kinds"][0], "task");
    assert_eq!(stream["last"], "TASK_STATE_COMPLETED");
    assert_eq!(steps.step("get")["state"], "TASK_STATE_COMPLETED");
    assert_eq!(steps.step("get")["history"], 1);
    assert_eq!(steps.step("resubscribe")["cancel"], "TASK_STATE_CANCELED");
    assert_eq!(
        steps.step("resubscribe")["finals"],
        serde_json::json!(["TASK_STATE_CANCELED"])
    );
    assert_eq!(steps.step("list")["total"], 2);
    assert_eq!(steps.step("unknown_task")["code"], -32001);
    assert_eq!(steps.step("subscribe_finished")["code"], -32004);
    assert!(steps
        .steps
        .iter()
        .any(|s| s["step"] == "done" && s["ok"] == true));
}
