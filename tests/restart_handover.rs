//! Deploys and restarts lose no work: `keel serve` stopped by SIGTERM in the middle of a slow,
//! non-idempotent tool call hands the task on (never `canceled`) and the next process on the
//! store finishes it, the tool having run once; a SQLite server killed with -9 resumes its
//! tasks at once when it restarts, not a lease TTL later; and a second `keel serve` on the
//! same SQLite file is refused, naming it.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use futures::StreamExt;
use keel::core::{TaskId, TaskState};
use keel::services::Runtime;
use keel::{DefaultRuntime, StoreConfig};
use serde_json::{json, Value};
use support::{KeelServer, Rpc};
use tokio::sync::{Notify, Semaphore};

/// The agent's world: a model that asks for one `charge` call and then answers, and the
/// `charge` endpoint, which counts its calls (the journal of a side effect that must not
/// happen twice), says when one started and answers only when the test lets it.
struct World {
    model_url: String,
    model_calls: Arc<AtomicUsize>,
    tool_url: String,
    charges: Arc<AtomicUsize>,
    charging: Arc<Notify>,
    gate: Arc<Semaphore>,
}

impl World {
    async fn start() -> World {
        let model_calls = Arc::new(AtomicUsize::new(0));
        let calls = model_calls.clone();
        let model = Router::new().route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| {
                calls.fetch_add(1, Ordering::SeqCst);
                let answered = body["messages"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
                let message = if answered {
                    json!({"role": "assistant", "content": "charged once"})
                } else {
                    json!({"role": "assistant", "content": null, "tool_calls": [{
                        "id": "call_charge", "type": "function",
                        "function": {"name": "charge", "arguments": "{\"card\": \"4242\"}"}
                    }]})
                };
                async move { support::openai_reply(&body, message) }
            }),
        );
        let (charges, charging, gate) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(Notify::new()),
            Arc::new(Semaphore::new(0)),
        );
        let tool = Router::new().route("/charge", {
            let (charges, charging, gate) = (charges.clone(), charging.clone(), gate.clone());
            post(move || {
                let (charges, charging, gate) = (charges.clone(), charging.clone(), gate.clone());
                async move {
                    charges.fetch_add(1, Ordering::SeqCst);
                    charging.notify_one();
                    gate.acquire().await.unwrap().forget();
                    Json(json!({"charged": "4242"}))
                }
            })
        });
        World {
            model_url: format!("{}/v1", support::serve(model).await),
            model_calls,
            tool_url: format!("{}/charge", support::serve(tool).await),
            charges,
            charging,
            gate,
        }
    }

    /// A `keel.toml` in `dir` serving the agent on this world, with `server` as its
    /// `[server]` table's lines; its path.
    fn config(&self, dir: &Path, server: &str) -> String {
        let path = dir.join("keel.toml");
        std::fs::write(
            &path,
            format!(
                "[server]\n{server}\n\n[[agents]]\nname = \"payer\"\ndescription = \"Charges cards.\"\n\n\
                 [agents.model]\nid = \"openai-compatible:{}:scripted\"\n\n\
                 [[agents.tools.http]]\nname = \"charge\"\ndescription = \"Charge the card.\"\n\
                 url = \"{}\"\ntimeout_seconds = 120\n",
                self.model_url, self.tool_url
            ),
        )
        .unwrap();
        path.display().to_string()
    }

    /// Send the task (answered at once) and wait until its `charge` call is in flight.
    async fn charging(&self, server: &KeelServer) -> String {
        let started = self.charging.notified();
        let task = Rpc::new(server).send("charge my card", None, true).await;
        tokio::time::timeout(Duration::from_secs(20), started)
            .await
            .expect("the charge call started");
        task["id"].as_str().unwrap().to_owned()
    }
}

/// The task as the store holds it, read from this process as any reader of the store may.
async fn stored_state(store: &StoreConfig, task_id: &str) -> TaskState {
    let runtime = DefaultRuntime::builder()
        .store(store.clone())
        .build()
        .await
        .unwrap();
    let auth = runtime.auth_service().auth_context();
    let task = runtime
        .task_manager()
        .get_task(&auth, &TaskId::from(task_id))
        .await
        .unwrap()
        .unwrap();
    task.state()
}

/// Wait until the server has stopped accepting connections (its shutdown has begun).
async fn refusing(url: &str) {
    let http = reqwest::Client::new();
    support::wait_until(
        "the server to stop accepting connections",
        Duration::from_secs(10),
        || async { http.get(url).send().await.is_err() },
        |refused| *refused,
    )
    .await;
}

/// The events of an SSE answer, each the JSON of its `data:` line, until the stream ends.
async fn sse_events(response: reqwest::Response) -> Vec<Value> {
    let mut events = Vec::new();
    let mut text = String::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                events.push(serde_json::from_str(data.trim()).unwrap());
            }
        }
    }
    events
}

/// SIGTERM while the tool call is in flight: the call finishes within the drain, its result
/// is kept, the task is left working (never canceled), a streaming client is told the server
/// is going away, and the restarted server finishes the task at once, the tool having run
/// once.
async fn sigterm_hands_the_task_on(store: StoreConfig, store_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let world = World::start().await;
    let config = world.config(dir.path(), "");
    let mut args = vec!["--config", config.as_str(), "--drain-timeout", "60"];
    args.extend_from_slice(store_args);
    let mut server = KeelServer::start_with(&args);
    let url = server.url.clone();

    // A streaming client follows the task from its start.
    let started = world.charging.notified();
    let message = json!({"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": "charge my card"}]});
    let stream = reqwest::Client::new()
        .post(&url)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": message}}))
        .send()
        .await
        .unwrap();
    let events = tokio::spawn(sse_events(stream));
    tokio::time::timeout(Duration::from_secs(20), started)
        .await
        .expect("the charge call started");

    server.send_sigterm();
    refusing(&url).await;
    // The call in flight is let finish: its result is the task's next persisted point.
    world.gate.add_permits(1);
    let status = server.exited(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}");

    let events = events.await.unwrap();
    let task_id = events[0]["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let last = &events.last().unwrap()["result"]["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_WORKING", "{events:?}");
    assert_eq!(
        last["message"]["metadata"]["status_kind"], "server_going_away",
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .all(|e| !e.to_string().contains("TASK_STATE_CANCELED")),
        "{events:?}"
    );
    assert_eq!(stored_state(&store, &task_id).await, TaskState::Working);
    assert_eq!(world.model_calls.load(Ordering::SeqCst), 1);

    // The restarted server resumes the task at once: well inside the 30 s lease TTL, so the
    // stopped one released its thread.
    let server = KeelServer::start_with(&args);
    let done = Rpc::new(&server)
        .wait_for_end(&task_id, Duration::from_secs(10))
        .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(
        done["status"]["message"]["parts"][0]["text"],
        "charged once"
    );
    assert_eq!(world.charges.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(
        world.model_calls.load(Ordering::SeqCst),
        2,
        "the model was asked once per step"
    );
    assert!(server.terminate().success());
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_tool_call_hands_the_task_on_and_the_restart_finishes_it_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let spec = format!("sqlite:{}", path.display());
    sigterm_hands_the_task_on(StoreConfig::Sqlite(path), &["--store", &spec]).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_tool_call_hands_the_task_on_and_the_restart_finishes_it_on_redis() {
    let url = support::redis_url();
    let prefix = format!("keel-test-{}:", support::uuid_like());
    let store = StoreConfig::Redis {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    sigterm_hands_the_task_on(store, &["--store", &url, "--redis-prefix", &prefix]).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_that_outlasts_the_drain_is_cut_off_and_never_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::start().await;
    // The file's drain, not the 10 s default.
    let config = world.config(dir.path(), "drain_timeout_seconds = 0.5");
    let path = dir.path().join("keel.db");
    let spec = format!("sqlite:{}", path.display());
    let args = ["--config", config.as_str(), "--store", spec.as_str()];
    let mut server = KeelServer::start_with(&args);
    let task_id = world.charging(&server).await;

    // The gate stays shut: the call outlasts the drain, and the server exits without it.
    let signaled = Instant::now();
    server.send_sigterm();
    let status = server.exited(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}");
    assert!(
        signaled.elapsed() < Duration::from_secs(10),
        "{:?}",
        signaled.elapsed()
    );
    assert_eq!(
        stored_state(&StoreConfig::Sqlite(path), &task_id).await,
        TaskState::Working
    );
    world.gate.add_permits(1);

    // The call may have charged the card: the resumed run tells the model so and does not
    // charge again.
    let server = KeelServer::start_with(&args);
    let done = Rpc::new(&server)
        .wait_for_end(&task_id, Duration::from_secs(10))
        .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert!(
        done["history"]
            .to_string()
            .contains("its result was never saved"),
        "{done}"
    );
    assert_eq!(
        world.charges.load(Ordering::SeqCst),
        1,
        "charged at most once"
    );
    assert!(server.terminate().success());
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_sqlite_server_killed_with_sigkill_resumes_its_task_at_once_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::start().await;
    let config = world.config(dir.path(), "");
    let spec = format!("sqlite:{}", dir.path().join("keel.db").display());
    // The default lease TTL, 30 s: the restart must not wait for it.
    let args = ["--config", config.as_str(), "--store", spec.as_str()];
    let server = KeelServer::start_with(&args);
    let task_id = world.charging(&server).await;
    server.kill_hard();
    world.gate.add_permits(1);

    let log = dir.path().join("restarted.log");
    let restarted = Instant::now();
    let server = KeelServer::start_logging_to(&args, &log);
    let done = Rpc::new(&server)
        .wait_for_end(&task_id, Duration::from_secs(5))
        .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert!(
        restarted.elapsed() < Duration::from_secs(5),
        "{:?}",
        restarted.elapsed()
    );
    assert_eq!(
        world.charges.load(Ordering::SeqCst),
        1,
        "charged at most once"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("resuming task {task_id} (working)")),
        "{text}"
    );
    assert!(server.terminate().success());
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_second_server_on_the_same_sqlite_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("keel.db");
    let spec = format!("sqlite:{}", database.display());
    let first = KeelServer::start_with(&["--store", &spec]);
    let second = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking({
            let spec = spec.clone();
            move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
                    .args([
                        "serve",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "0",
                        "--store",
                        &spec,
                    ])
                    .env("RUST_LOG", "warn")
                    .output()
                    .unwrap()
            }
        }),
    )
    .await
    .expect("the second server gave up at once")
    .unwrap();
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    assert!(second.stdout.is_empty(), "it never served: {second:?}");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&format!("claim the SQLite store {}", database.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("in use by process {}", first.pid())),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{}.owner", database.display())),
        "{stderr}"
    );

    // Once the first has stopped, the file is free again.
    assert!(first.terminate().success());
    let next = KeelServer::start_with(&["--store", &spec]);
    assert!(next.terminate().success());
}

#[test]
fn a_drain_timeout_out_of_range_is_refused() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--port",
            "0",
            "--store",
            "memory",
            "--drain-timeout",
            "4000",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "keel: --drain-timeout 4000 is out of range: use 0 to 3600 seconds"
    );
}
