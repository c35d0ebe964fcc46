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
