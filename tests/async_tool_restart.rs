//! An asynchronous tool over real HTTP with `keel serve` (seed 004): the tool server on
//! 127.0.0.1:0 acknowledges at once and calls back seconds later — after the `keel serve`
//! process that dispatched the call has exited — and the conversation finishes in a fresh
//! `keel serve` process on the same SQLite file (listening on the same address, the one the
//! callback URL names).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::{KeelServer, Rpc};
use tokio::sync::Notify;

/// A model that starts `background_job` and answers with its result.
async fn scripted_model() -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| async move {
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let result = messages
                .iter()
                .rfind(|m| m["role"] == "tool")
                .map(|m| m["content"].to_string());
            let message = match result {
                None => json!({"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_job", "type": "function",
                    "function": {"name": "background_job", "arguments": json!({"job": "render"}).to_string()}
                }]}),
                Some(result) => json!({"role": "assistant", "content": format!("job done: {result}")}),
            };
            support::openai_reply(&body, message)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

/// What the tool server saw and did.
#[derive(Default)]
struct ToolLog {
    invocations: Vec<Value>,
    /// Callback attempts: the HTTP status, or the connection error.
    attempts: Vec<Result<u16, String>>,
}

/// The tool: acknowledges each invocation at once; once `go` is notified, it waits two
/// seconds and calls back, retrying while nobody listens at the callback URL.
async fn tool_server(log: Arc<Mutex<ToolLog>>, go: Arc<Notify>) -> String {
    let app = Router::new().route(
        "/invoke",
        post(move |Json(invocation): Json<Value>| {
            let (log, go) = (log.clone(), go.clone());
            async move {
                log.lock().unwrap().invocations.push(invocation.clone());
                tokio::spawn(async move {
                    go.notified().await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let http = reqwest::Client::new();
                    for _ in 0..150 {
                        let sent = http
                            .post(invocation["callback_url"].as_str().unwrap_or_default())
                            .header(
                                "x-keel-callback-secret",
                                invocation["callback_secret"].as_str().unwrap_or_default(),
                            )
                            .json(&json!({"output": {"file": "video.mp4"}}))
                            .send()
                            .await;
                        let attempt = sent.map(|r| r.status().as_u16()).map_err(|e| e.to_string());
                        let delivered = matches!(attempt, Ok(status) if status < 500);
                        log.lock().unwrap().attempts.push(attempt);
                        if delivered {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                });
                (StatusCode::ACCEPTED, Json(json!({"status": "accepted"})))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/invoke")
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn an_async_tool_calls_back_after_the_process_exited_and_a_fresh_process_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let llm = format!("openai-compatible:{}:scripted", scripted_model().await);
    let (log, go) = (
        Arc::new(Mutex::new(ToolLog::default())),
        Arc::new(Notify::new()),
    );
    let tool_url = tool_server(log.clone(), go.clone()).await;
    let args = ["--store", store.as_str(), "--llm", llm.as_str()];
    let env = [("KEEL_DEMO_ASYNC_TOOL_URL", tool_url.as_str())];

    let first = KeelServer::start_with_env(&args, &env);
    let port: u16 = first
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the URL");
    let rpc = Rpc::new(&first);
    let task = rpc.send("render my video", None, true).await;
    let id = task["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let task = rpc.get(&id).await;
        if task["metadata"]["stop_reason"] == "awaiting_tool" {
            break task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never waited: {task}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        waiting["status"]["state"], "TASK_STATE_WORKING",
        "{waiting}"
    );
    let invocation = log.lock().unwrap().invocations[0].clone();
    assert_eq!(invocation["tool"], "background_job");
    assert_eq!(
        invocation["callback_url"],
        format!("http://127.0.0.1:{port}/callbacks/call_job")
    );

    // The dispatching process exits; the tool calls back two seconds later.
    assert!(first.terminate().success());
    go.notify_one();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A fresh process on the same store and address takes the callback and finishes.
    let second = KeelServer::start_on(port, &args, &env);
    let done = Rpc::new(&second)
        .wait_for(&id, Duration::from_secs(30), |s| {
            s == "TASK_STATE_COMPLETED" || s == "TASK_STATE_FAILED"
        })
        .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    let answer = done["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(answer.starts_with("job done: "), "{answer}");
    assert!(answer.contains("video.mp4"), "{answer}");
    let log = log.lock().unwrap();
    assert_eq!(log.invocations.len(), 1, "dispatched once");
    assert_eq!(log.attempts.last(), Some(&Ok(202)), "{:?}", log.attempts);
}
