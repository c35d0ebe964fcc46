//! An asynchronous tool over real HTTP with `keel serve` (seed 004): the tool server on
//! 127.0.0.1:0 acknowledges at once and calls back seconds later — after the `keel serve`
//! process that dispatched the call has exited — and the conversation finishes in a fresh
//! `keel serve` process on the same store (a SQLite file, and Redis), listening on the same
//! address, the one the callback URL names. The task belongs to a tenant proven by an API key
//! (not the server's default one): the callback carries no credentials but the call's secret,
//! and still lands in that tenant; a callback with a wrong secret changes nothing. And of many
//! concurrent duplicate callbacks, sent to two `keel serve` processes on one store, exactly
//! one is accepted and the result is persisted once.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::KeelServer;
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

/// JSON-RPC as the tenant that `key` proves.
async fn call(url: &str, key: &str, method: &str, params: Value) -> Value {
    reqwest::Client::new()
        .post(url)
        .header("A2A-Version", "1.0")
        .header("x-api-key", key)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("JSON answer")
}

/// GetTask as `key`'s tenant until `done` holds (at most `within`).
async fn wait_for(
    url: &str,
    key: &str,
    id: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    support::wait_until(
        &format!("task {id} to get there"),
        within,
        || async { call(url, key, "GetTask", json!({"id": id})).await["result"].clone() },
        done,
    )
    .await
}

/// The whole story on `store` (plus `extra` arguments).
async fn callback_after_exit_finishes_in_a_fresh_process(store: String, extra: &[&str]) {
    let llm = format!("openai-compatible:{}:scripted", scripted_model().await);
    let (log, go) = (
        Arc::new(Mutex::new(ToolLog::default())),
        Arc::new(Notify::new()),
    );
    let tool_url = tool_server(log.clone(), go.clone()).await;
    let key = "key-of-bob";
    let mut args = vec![
        "--store",
        store.as_str(),
        "--llm",
        llm.as_str(),
        "--api-key",
        "key-of-bob=acme/bob",
    ];
    args.extend_from_slice(extra);
    let env = [("KEEL_DEMO_ASYNC_TOOL_URL", tool_url.as_str())];

    let first = KeelServer::start_with_env(&args, &env);
    let port: u16 = first
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the URL");
    let message = json!({"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": "render my video"}]});
    let sent = call(
        &first.url,
        key,
        "SendMessage",
        json!({"message": message, "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = sent["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_owned();
    let waiting = wait_for(&first.url, key, &id, Duration::from_secs(20), |t| {
        t["metadata"]["keel"]["stopReason"] == "awaiting_tool"
    })
    .await;
    assert_eq!(
        waiting["status"]["state"], "TASK_STATE_WORKING",
        "{waiting}"
    );
    let invocation = log.lock().unwrap().invocations[0].clone();
    assert_eq!(invocation["tool"], "background_job");
    assert_eq!(invocation["user_id"], "bob");
    let call_id = invocation["call_id"].as_str().unwrap().to_owned();
    assert_eq!(
        invocation["callback_url"],
        format!("http://127.0.0.1:{port}/callbacks/{call_id}")
    );
    // The task is the API key's tenant's: without the key it does not exist.
    let anonymous = reqwest::Client::new()
        .post(&first.url)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    // A callback with a wrong secret for this very call: 401, and nothing changes.
    let forged = reqwest::Client::new()
        .post(invocation["callback_url"].as_str().unwrap())
        .header("x-keel-callback-secret", "not-the-secret")
        .json(&json!({"output": "forged"}))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let still = call(
        &first.url,
        key,
        "GetTask",
        json!({"id": id, "historyLength": 100}),
    )
    .await["result"]
        .clone();
    assert_eq!(still["status"]["state"], "TASK_STATE_WORKING", "{still}");
    assert!(!still.to_string().contains("forged"), "{still}");

    // The dispatching process exits; the tool calls back two seconds later.
    assert!(first.terminate().success());
    go.notify_one();

    // A fresh process on the same store and address takes the callback and finishes, in the
    // call's tenant.
    let second = KeelServer::start_on(port, &args, &env);
    let done = wait_for(&second.url, key, &id, Duration::from_secs(30), |t| {
        t["status"]["state"] == "TASK_STATE_COMPLETED"
            || t["status"]["state"] == "TASK_STATE_FAILED"
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

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn an_async_tool_calls_back_after_the_process_exited_and_a_fresh_process_finishes_on_sqlite()
{
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    callback_after_exit_finishes_in_a_fresh_process(store, &[]).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn an_async_tool_calls_back_after_the_process_exited_and_a_fresh_process_finishes_on_redis() {
    let url = support::redis_url();
    let prefix = format!("keel-test-{}:", support::uuid_like());
    callback_after_exit_finishes_in_a_fresh_process(url, &["--redis-prefix", &prefix]).await;
}

/// N concurrent duplicate callbacks, half to each of `processes` (one or two) on `store`.
async fn concurrent_duplicates_accept_exactly_one(store: String, processes: usize, extra: &[&str]) {
    let llm = format!("openai-compatible:{}:scripted", scripted_model().await);
    // Never told to go: this tool never calls back by itself.
    let log = Arc::new(Mutex::new(ToolLog::default()));
    let tool_url = tool_server(log.clone(), Arc::new(Notify::new())).await;
    let key = "key-of-bob";
    let mut args = vec![
        "--store",
        store.as_str(),
        "--llm",
        llm.as_str(),
        "--api-key",
        "key-of-bob=acme/bob",
    ];
    args.extend_from_slice(extra);
    let env = [("KEEL_DEMO_ASYNC_TOOL_URL", tool_url.as_str())];
    let first = KeelServer::start_with_env(&args, &env);
    let second = (processes > 1).then(|| KeelServer::start_with_env(&args, &env));
    let message = json!({"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": "render my video"}]});
    let sent = call(
        &first.url,
        key,
        "SendMessage",
        json!({"message": message, "configuration": {"returnImmediately": true}}),
    )
    .await;
    let id = sent["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_owned();
    wait_for(&first.url, key, &id, Duration::from_secs(20), |t| {
        t["metadata"]["keel"]["stopReason"] == "awaiting_tool"
    })
    .await;
    let invocation = log.lock().unwrap().invocations[0].clone();
    let call_id = invocation["call_id"].as_str().unwrap().to_owned();
    let secret = invocation["callback_secret"].as_str().unwrap().to_owned();

    let http = reqwest::Client::new();
    let posts = (0..16).map(|i| {
        let server = match &second {
            Some(second) if i % 2 == 1 => &second.url,
            _ => &first.url,
        };
        http.post(format!("{server}callbacks/{call_id}"))
            .header("x-keel-callback-secret", &secret)
            .json(&json!({"output": {"file": format!("take-{i}.mp4")}}))
            .send()
    });
    let statuses: Vec<u16> = futures::future::join_all(posts)
        .await
        .into_iter()
        .map(|r| r.expect("a callback answer").status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 202).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        15,
        "{statuses:?}"
    );
    let winner = statuses.iter().position(|s| *s == 202).unwrap();

    let done = wait_for(&first.url, key, &id, Duration::from_secs(30), |t| {
        t["status"]["state"] == "TASK_STATE_COMPLETED"
            || t["status"]["state"] == "TASK_STATE_FAILED"
    })
    .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    let answer = done["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(answer.contains(&format!("take-{winner}.mp4")), "{answer}");
    // The result is in the task's log exactly once.
    let full = call(
        &first.url,
        key,
        "GetTask",
        json!({"id": id, "historyLength": 100}),
    )
    .await["result"]
        .clone();
    let text = full["history"].to_string();
    assert_eq!(
        text.matches(".mp4").count(),
        2,
        "once as the tool output, once in the answer: {text}"
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn of_concurrent_duplicate_callbacks_one_is_accepted_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    // One `keel serve` owns a SQLite store; processes share a Redis store (below).
    concurrent_duplicates_accept_exactly_one(store, 1, &[]).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn of_concurrent_duplicate_callbacks_to_two_processes_one_is_accepted_on_redis() {
    let url = support::redis_url();
    let prefix = format!("keel-test-{}:", support::uuid_like());
    concurrent_duplicates_accept_exactly_one(url, 2, &["--redis-prefix", &prefix]).await;
}

/// A call whose tool never calls back times out in a process started after the dispatching
/// one exited, before the deadline: the model sees the timeout as the tool's error.
async fn a_pending_call_times_out_in_a_fresh_process(store: String, extra: &[&str]) {
    let llm = format!("openai-compatible:{}:scripted", scripted_model().await);
    // Never told to go: this tool never calls back.
    let log = Arc::new(Mutex::new(ToolLog::default()));
    let tool_url = tool_server(log.clone(), Arc::new(Notify::new())).await;
    let mut args = vec![
        "--store",
        store.as_str(),
        "--llm",
        llm.as_str(),
        "--async-tool-timeout",
        "3",
    ];
    args.extend_from_slice(extra);
    let env = [("KEEL_DEMO_ASYNC_TOOL_URL", tool_url.as_str())];
    let first = KeelServer::start_with_env(&args, &env);
    let rpc = support::Rpc::new(&first);
    let task = rpc.send("render my video", None, true).await;
    let id = task["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{task}"))
        .to_owned();
    support::wait_until(
        &format!("task {id} to wait for its tool"),
        Duration::from_secs(20),
        || rpc.get(&id),
        |task| task["metadata"]["keel"]["stopReason"] == "awaiting_tool",
    )
    .await;
    assert!(first.terminate().success());

    // A fresh process picks the task up (still pending) and ends the call at its deadline.
    let second = KeelServer::start_with_env(&args, &env);
    let done = support::Rpc::new(&second)
        .wait_for_end(&id, Duration::from_secs(30))
        .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    let answer = done["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(answer.starts_with("job done: "), "{answer}");
    assert!(answer.contains("timed out"), "{answer}");
    assert_eq!(log.lock().unwrap().invocations.len(), 1, "dispatched once");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_call_times_out_in_a_fresh_process_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    a_pending_call_times_out_in_a_fresh_process(store, &[]).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_call_times_out_in_a_fresh_process_on_redis() {
    let url = support::redis_url();
    let prefix = format!("keel-test-{}:", support::uuid_like());
    a_pending_call_times_out_in_a_fresh_process(url, &["--redis-prefix", &prefix]).await;
}
