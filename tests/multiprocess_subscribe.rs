//! Two `keel serve` processes on one Redis (and on one PostgreSQL): a client subscribes (SSE `SubscribeToTask`) on one
//! process to a task running on the other, cancels it through the first, and sees exactly one
//! final `canceled` status before the stream ends.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{redis_url, uuid_like, KeelServer, Rpc};

/// The `data:` payloads of the complete SSE events in `buffer`, removing them from it.
fn take_events(buffer: &mut String) -> Vec<Value> {
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let data: Vec<&str> = block
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim_start)
            .collect();
        if !data.is_empty() {
            events.push(serde_json::from_str(&data.join("\n")).expect("SSE data is JSON"));
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn subscribing_on_one_process_to_a_task_on_the_other_and_canceling_ends_with_one_canceled_event(
) {
    let prefix = format!("keel-test-{}:", uuid_like());
    let url = redis_url();
    subscribe_on_one_and_cancel(&["--store", url.as_str(), "--redis-prefix", prefix.as_str()])
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_subscribing_on_one_process_to_a_task_on_the_other_and_canceling_ends_with_one_canceled_event(
) {
    let (schema, args) = support::postgres_store().await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    subscribe_on_one_and_cancel(&args).await;
    schema.drop_schema().await.unwrap();
}

/// Two `keel serve` processes with `args` (one store): a task runs on one, a client
/// subscribes on the other and cancels through it, and sees exactly one final `canceled`
/// status before the stream ends.
async fn subscribe_on_one_and_cancel(args: &[&str]) {
    let (runner, watcher) = (KeelServer::start_with(args), KeelServer::start_with(args));
    let (rpc_runner, rpc_watcher) = (Rpc::new(&runner), Rpc::new(&watcher));

    // The task runs on `runner`.
    let task = rpc_runner
        .send(r#"/sleep {"seconds": 300}"#, None, true)
        .await;
    let id = task["id"].as_str().unwrap().to_owned();
    rpc_watcher
        .wait_for(&id, Duration::from_secs(10), |s| s == "TASK_STATE_WORKING")
        .await;

    // Subscribe on `watcher`.
    let mut response = reqwest::Client::new()
        .post(&watcher.url)
        .header("A2A-Version", "1.0")
        .header("Accept", "text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": "sub", "method": "SubscribeToTask", "params": {"id": id}}))
        .send()
        .await
        .unwrap();
    assert!(response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream")));

    let mut buffer = String::new();
    let mut events: Vec<Value> = Vec::new();
    let mut canceled = false;
    let read_all = async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            events.extend(take_events(&mut buffer));
            // Once the stream has begun (the Task event), cancel through `watcher` too.
            if !canceled && !events.is_empty() {
                canceled = true;
                let answer = rpc_watcher
                    .call(
                        "CancelTask",
                        json!({"id": id, "metadata": {"reason": "from the watcher"}}),
                    )
                    .await;
                assert_eq!(
                    answer["result"]["status"]["state"], "TASK_STATE_CANCELED",
                    "{answer}"
                );
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read_all)
        .await
        .expect("the stream ends after the final status");

    let results: Vec<&Value> = events.iter().map(|e| &e["result"]).collect();
    assert!(
        results[0].get("task").is_some(),
        "the stream begins with the task: {events:?}"
    );
    assert_eq!(results[0]["task"]["id"], id.as_str());
    let canceled_events = results
        .iter()
        .filter(|r| r["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED")
        .count();
    assert_eq!(canceled_events, 1, "exactly one canceled event: {events:?}");
    assert_eq!(
        results.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_CANCELED",
        "the canceled status is the last event: {events:?}"
    );
    assert!(
        events
            .iter()
            .all(|e| e["id"] == "sub" && e.get("error").is_none()),
        "{events:?}"
    );

    // Both processes agree.
    let on_runner = rpc_runner.get(&id).await;
    assert_eq!(on_runner["status"]["state"], "TASK_STATE_CANCELED");
    assert_eq!(
        on_runner["metadata"]["keel"]["cancelReason"],
        "from the watcher"
    );
}
