//! A SQLite-backed `keel serve` keeps what it acknowledged: tasks survive a restart and a
//! SIGKILL, and a run cut off mid-way is resumed when the server comes back.

mod support;

use std::time::Duration;

use support::{KeelServer, Rpc};

fn sqlite_store(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", dir.path().join("keel.db").display())
}

#[cfg(unix)]
#[tokio::test]
async fn a_task_acknowledged_before_sigkill_is_answered_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir);
    // A short lease, so the restarted server takes over the dead one's thread quickly.
    let args = ["--store", store.as_str(), "--lease-ttl", "1"];
    let server = KeelServer::start_with(&args);
    let rpc = Rpc::new(&server);
    let done = rpc.send("remember me", None, false).await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
    let done_id = done["id"].as_str().unwrap().to_owned();
    // A run cut off in the middle: wait until its `sleep` call is persisted, then kill.
    let pending = rpc.send(r#"/sleep {"seconds": 300}"#, None, true).await;
    let pending_id = pending["id"].as_str().unwrap().to_owned();
    support::wait_until(
        "the sleep call to be persisted",
        Duration::from_secs(10),
        || rpc.get(&pending_id),
        |task| {
            task["history"].as_array().is_some_and(|h| {
                h.iter()
                    .any(|m| m["parts"][0]["metadata"]["keel.partType"] == "tool_call")
            })
        },
    )
    .await;
    server.kill_hard();

    let server = KeelServer::start_with(&args);
    let rpc = Rpc::new(&server);
    let task = rpc.get(&done_id).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let texts: Vec<&str> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(texts, ["remember me", "You said: remember me"]);
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"],
        "You said: remember me"
    );

    // The interrupted run resumes; its `sleep` call is not idempotent, so it is answered with
    // an "interrupted" tool error instead of being run again, and the task completes.
    let resumed = rpc.wait_for_end(&pending_id, Duration::from_secs(30)).await;
    assert_eq!(
        resumed["status"]["state"], "TASK_STATE_COMPLETED",
        "{resumed}"
    );
    let answer = resumed["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(answer.contains("its result was never saved"), "{answer}");
}

#[cfg(unix)]
#[tokio::test]
async fn a_graceful_restart_keeps_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir);
    let server = KeelServer::start_with(&["--store", &store]);
    let rpc = Rpc::new(&server);
    let mut ids = Vec::new();
    for i in 0..5 {
        let task = rpc.send(&format!("message {i}"), None, false).await;
        ids.push(task["id"].as_str().unwrap().to_owned());
    }
    assert!(server.terminate().success());
    let server = KeelServer::start_with(&["--store", &store]);
    let rpc = Rpc::new(&server);
    for (i, id) in ids.iter().enumerate() {
        let task = rpc.get(id).await;
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(
            task["status"]["message"]["parts"][0]["text"],
            format!("You said: message {i}")
        );
    }
}
