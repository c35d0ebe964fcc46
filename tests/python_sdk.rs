//! A stranger's client can talk to Keel: the official Python `a2a-sdk` 1.x fetches the card
//! of a real `keel serve`, sends a message, gets the task, cancels a working task and sees a
//! cancel of a finished task refused.

mod support;

use support::{sdk_python, KeelServer, PythonSteps};

#[test]
fn python_a2a_sdk_round_trips_card_send_get_and_cancel() {
    let server = KeelServer::start(&[]);
    let steps = PythonSteps::run(sdk_python(), "a2a_client_check.py", &[server.url.as_str()]);
    let step = |name: &str| steps.step(name);
    assert_eq!(step("card")["name"], "keel-demo");
    assert_eq!(step("send")["state"], "TASK_STATE_COMPLETED");
    assert_eq!(step("send")["answer"], "You said: hello from python");
    assert_eq!(step("get")["state"], "TASK_STATE_COMPLETED");
    assert_eq!(step("cancel")["state"], "TASK_STATE_CANCELED");
    assert_eq!(step("cancel_completed")["errorCode"], -32002);
    assert_eq!(step("done")["ok"], true);
}

/// Every card a v1.0 client is handed (the well-known card asked for with `A2A-Version: 1.0`,
/// the extended card over HTTP+JSON and JSON-RPC) parses with protobuf's strict JSON parser
/// into A2A's generated `AgentCard`, as a client built on a2a.proto reads it (issue 43, item
/// 5); the v0.3 form, for a caller that names 0.3 or no version (decision 266) and at the
/// legacy path, carries the v0.3 fields that such a parser refuses, so the check can tell
/// the two apart, and still parses leniently, as the SDK's own resolver reads it.
#[test]
fn every_v1_card_parses_as_strict_protobuf_json() {
    let server = KeelServer::start(&["--agent", "conformance"]);
    let steps = PythonSteps::run(
        sdk_python(),
        "a2a_card_strict_check.py",
        &[server.url.as_str()],
    );
    for name in ["card_v1", "extended_rest", "extended_jsonrpc"] {
        let step = steps.step(name);
        assert_eq!(step["strict"], true, "{name}: {step}");
        assert_eq!(step["unknown"], serde_json::json!([]), "{name}: {step}");
    }
    for name in ["card", "legacy", "card_v03"] {
        let step = steps.step(name);
        assert_eq!(step["strict"], false, "{name}: {step}");
        assert_eq!(step["lenient"], true, "{name}: {step}");
        assert_eq!(
            step["unknown"],
            serde_json::json!([
                "additionalInterfaces",
                "preferredTransport",
                "protocolVersion",
                "supportsAuthenticatedExtendedCard",
                "url"
            ]),
            "{name}: {step}"
        );
    }
    assert_eq!(steps.step("done")["ok"], true);
}
