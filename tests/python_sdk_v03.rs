//! A v0.3 client can talk to Keel: the official Python `a2a-sdk` 0.3.x, in its own venv,
//! fetches the card of a real `keel serve` where it looks by default
//! (`/.well-known/agent-card.json`, no `A2A-Version`: the v0.3 form, decision 266) and at the
//! legacy path, validating it as a v0.3 card, sends a message, gets the task and cancels a
//! working task, speaking v0.3 JSON-RPC with no `A2A-Version`.

mod support;

use support::{sdk_python_v03, KeelServer, PythonSteps};

#[test]
fn python_a2a_sdk_0_3_sends_gets_and_cancels() {
    let python = sdk_python_v03();
    let server = KeelServer::start(&[]);
    let steps = PythonSteps::run(python, "a2a_v03_client_check.py", &[server.url.as_str()]);
    let step = |name: &str| steps.step(name);
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
