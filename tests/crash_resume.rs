//! SIGKILL in the middle of a multi-step run: after a restart the run finishes, and each of
//! its tool calls (appending a line to a file) happened exactly once.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::{KeelServer, Rpc};
use tokio::sync::Notify;

/// A model that appends three journal lines, one per step, then answers. Before step 2 it
/// tells the test and waits until released, so the test can kill `keel serve` right there.
async fn scripted_model(
    step_two: Arc<Notify>,
    released: Arc<AtomicBool>,
    release: Arc<Notify>,
) -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| {
            let (step_two, released, release) = (step_two.clone(), released.clone(), release.clone());
            async move {
                let done = body["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
                if done == 1 && !released.load(Ordering::SeqCst) {
                    step_two.notify_one();
                    release.notified().await;
                }
                let message = if done < 3 {
                    json!({"role": "assistant", "content": null, "tool_calls": [{
                        "id": format!("call_{}", done + 1), "type": "function",
                        "function": {"name": "append_line", "arguments": json!({"line": format!("step {}", done + 1)}).to_string()}
                    }]})
                } else {
                    json!({"role": "assistant", "content": "journal written"})
                };
                support::openai_reply(&body, message)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_run_killed_mid_way_finishes_after_restart_with_each_tool_call_done_once() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let (step_two, released, release) = (
        Arc::new(Notify::new()),
        Arc::new(AtomicBool::new(false)),
        Arc::new(Notify::new()),
    );
    let llm = format!(
        "openai-compatible:{}:scripted",
        scripted_model(step_two.clone(), released.clone(), release.clone()).await
    );
    let args = [
        "--store",
        store.as_str(),
        "--llm",
        llm.as_str(),
        "--lease-ttl",
        "1",
    ];
    let env = [("KEEL_DEMO_JOURNAL", journal.to_str().unwrap())];

    let server = KeelServer::start_with_env(&args, &env);
    let task = Rpc::new(&server)
        .send("write the journal", None, true)
        .await;
    let id = task["id"].as_str().unwrap().to_owned();
    // Step 1's tool has run and step 2's model call is in flight: kill the server now.
    tokio::time::timeout(Duration::from_secs(20), step_two.notified())
        .await
        .expect("step 2 was never requested");
    server.kill_hard();
    assert_eq!(std::fs::read_to_string(&journal).unwrap(), "step 1\n");
    released.store(true, Ordering::SeqCst);
    release.notify_waiters();

    let server = KeelServer::start_with_env(&args, &env);
    let rpc = Rpc::new(&server);
    let done = rpc.wait_for_end(&id, Duration::from_secs(30)).await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(
        done["status"]["message"]["parts"][0]["text"],
        "journal written"
    );
    assert_eq!(
        std::fs::read_to_string(&journal).unwrap(),
        "step 1\nstep 2\nstep 3\n",
        "each line exactly once"
    );
}
