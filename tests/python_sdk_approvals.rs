//! Approvals by a stranger's client: the official Python `a2a-sdk` 1.x approves and denies an
//! action waiting for approval on a real `keel serve --config` (docs/approvals.md), over
//! SendMessage and SendStreamingMessage, and sees another tenant's task, a wrong request id
//! and a task that waits no more refused with A2A errors.

mod support;

use serde_json::Value;
use support::{sdk_python, KeelServer, PythonSteps};

const ALICE: &str = "approvals-alice-key";
const BOB: &str = "approvals-bob-key";

/// An agent whose every action needs approval, with the sandboxed `run_code` tool, and two
/// tenants.
const CONFIG: &str = concat!(
    r#"
[server]
store = "memory"

[[server.api_keys]]
key = "${KEEL_TEST_ALICE_KEY}"
tenant = "acme/alice"

[[server.api_keys]]
key = "${KEEL_TEST_BOB_KEY}"
tenant = "globex/bob"
"#,
    support::careful_agent!()
);

#[test]
fn python_a2a_sdk_approves_and_denies_a_waiting_action() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let env = [("KEEL_TEST_ALICE_KEY", ALICE), ("KEEL_TEST_BOB_KEY", BOB)];
    let server = KeelServer::start_with_env(&["--config", file.to_str().unwrap()], &env);

    let steps = PythonSteps::run(
        sdk_python(),
        "a2a_approval_check.py",
        &[server.url.as_str(), ALICE, BOB],
    );
    let step = |name: &str| steps.step(name);
    assert_eq!(step("other_tenant")["errorCode"], -32001);
    assert_eq!(step("wrong_request")["errorCode"], -32602);
    assert_eq!(step("approve")["state"], "TASK_STATE_COMPLETED");
    assert_eq!(step("not_waiting")["errorCode"], -32602);
    assert_eq!(
        step("deny_stream")["states"].as_array().unwrap().last(),
        Some(&Value::from("TASK_STATE_COMPLETED"))
    );
    assert_eq!(step("done")["ok"], true);
}
