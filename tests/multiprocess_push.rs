//! Two `keel serve` processes on one Redis both follow a task's push notification configs
//! (each created one), yet the webhook receives each update once per config: every
//! (config, event) delivery is claimed once through the store.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use support::{redis_url, uuid_like, KeelServer, Rpc};

/// What the webhook received: (notification token, the task state the update carries).
type Received = Arc<Mutex<Vec<(String, String)>>>;

/// How long the webhook takes to answer: several of the watchers' poll intervals, so that
/// the other process looks at the task while a delivery is in flight (the race a claim
/// settles).
const WEBHOOK_LATENCY: Duration = Duration::from_secs(1);

/// A webhook on 127.0.0.1:0 that records every delivery, answering each after
/// [`WEBHOOK_LATENCY`]; answers its URL.
async fn webhook(received: Received) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let router = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: String| {
            let received = received.clone();
            async move {
                let token = headers
                    .get("X-A2A-Notification-Token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let state = body["statusUpdate"]["status"]["state"]
                    .as_str()
                    .unwrap_or("artifact")
                    .to_owned();
                received.lock().unwrap().push((token, state));
                tokio::time::sleep(WEBHOOK_LATENCY).await;
                "ok"
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    url
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn two_processes_deliver_each_update_once_per_config() {
    let prefix = format!("keel-test-{}:", uuid_like());
    let url = redis_url();
    let args = [
        "--store",
        url.as_str(),
        "--redis-prefix",
        prefix.as_str(),
        "--allow-private-push-targets",
    ];
    let (a, b) = (KeelServer::start_with(&args), KeelServer::start_with(&args));
    let (rpc_a, rpc_b) = (Rpc::new(&a), Rpc::new(&b));
    let received: Received = Arc::default();
    let hook = webhook(received.clone()).await;

    let task = rpc_a.send(r#"/sleep {"seconds": 300}"#, None, true).await;
    let id = task["id"].as_str().unwrap().to_owned();
    rpc_a
        .wait_for(&id, Duration::from_secs(10), |s| s == "TASK_STATE_WORKING")
        .await;
    // One config through each process: both processes now follow the task.
    for (rpc, config, token) in [(&rpc_a, "ca", "tok-a"), (&rpc_b, "cb", "tok-b")] {
        let created = rpc
            .call(
                "CreateTaskPushNotificationConfig",
                json!({"taskId": id, "id": config, "url": hook, "token": token}),
            )
            .await;
        assert!(created.get("result").is_some(), "{created}");
    }
    let canceled = rpc_b.call("CancelTask", json!({"id": id})).await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");

    // Wait for the final update to reach both configs.
    support::wait_until(
        "the canceled status to reach both configs",
        Duration::from_secs(30),
        || async { received.lock().unwrap().clone() },
        |received| {
            let finals = received.iter();
            finals
                .filter(|(_, state)| state == "TASK_STATE_CANCELED")
                .count()
                >= 2
        },
    )
    .await;
    // Stop both processes, so every delivery either was made or never will be.
    assert!(a.terminate().success());
    assert!(b.terminate().success());

    let received = received.lock().unwrap().clone();
    for token in ["tok-a", "tok-b"] {
        let mut states: Vec<&str> = received
            .iter()
            .filter(|(t, _)| t == token)
            .map(|(_, s)| s.as_str())
            .collect();
        assert!(states.contains(&"TASK_STATE_CANCELED"), "{received:?}");
        let all = states.len();
        states.sort_unstable();
        states.dedup();
        assert_eq!(
            states.len(),
            all,
            "config {token} received an update twice: {received:?}"
        );
    }
}
