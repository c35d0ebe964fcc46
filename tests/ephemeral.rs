//! The ephemeral runtime (seed 004): a whole multi-tool conversation where every input — user
//! message or asynchronous tool callback — is handled by a fresh `keel run-once` process on
//! the same store (a SQLite file, and Redis), with a real HTTP tool server that acknowledges
//! at once and whose result is delivered after the process that dispatched the call exited.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::RunOnce;

/// The text of the last user message and the tool results after it.
fn turn(body: &Value) -> (String, Vec<String>) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last_user = messages.iter().rposition(|m| m["role"] == "user");
    let user = last_user
        .map(|i| content_text(&messages[i]["content"]))
        .unwrap_or_default();
    let tools = messages
        .iter()
        .skip(last_user.map_or(0, |i| i + 1))
        .filter(|m| m["role"] == "tool")
        .map(|m| content_text(&m["content"]))
        .collect();
    (user, tools)
}

fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}
    }]})
}

/// The scripted model. Turn 1 ("render ..."): count words, then start the asynchronous
/// `background_job`, then answer with its result. Turn 2 ("what time"): read the clock,
/// then answer, quoting turn 1's answer when it is in the conversation (proof the thread's
/// history came back from the store).
async fn scripted_model(requests: Arc<Mutex<Vec<Value>>>) -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| {
            let requests = requests.clone();
            async move {
                if let Ok(mut seen) = requests.lock() {
                    seen.push(body.clone());
                }
                let (user, tools) = turn(&body);
                let message = if user.starts_with("render") {
                    match tools.len() {
                        0 => call("call_wc", "word_count", json!({"text": user})),
                        1 => call("call_job", "background_job", json!({"job": "render the intro"})),
                        _ => json!({"role": "assistant", "content": format!("words: {}; job: {}", tools[0], tools[1])}),
                    }
                } else if tools.is_empty() {
                    call("call_clock", "clock", json!({}))
                } else {
                    let everything = body["messages"].to_string();
                    let remembered = everything.contains("video.mp4");
                    json!({"role": "assistant", "content": format!("time read; remembered the job: {remembered}")})
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

/// A real asynchronous tool endpoint: records each invocation and acknowledges at once.
async fn tool_server(invocations: Arc<Mutex<Vec<Value>>>) -> String {
    let app = Router::new().route(
        "/invoke",
        post(move |Json(body): Json<Value>| {
            let invocations = invocations.clone();
            async move {
                if let Ok(mut seen) = invocations.lock() {
                    seen.push(body);
                }
                (StatusCode::ACCEPTED, Json(json!({"status": "accepted"})))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/invoke")
}

/// The whole conversation on `store`, each input in a fresh process.
async fn conversation_in_fresh_processes(store: String, extra: Vec<String>) {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let invocations = Arc::new(Mutex::new(Vec::new()));
    let llm = format!(
        "openai-compatible:{}:scripted",
        scripted_model(requests.clone()).await
    );
    let tool_url = tool_server(invocations.clone()).await;
    let mut args = vec![
        "--store".to_owned(),
        store,
        "--llm".to_owned(),
        llm,
        "--callback-base-url".to_owned(),
        "http://127.0.0.1:9/keel".to_owned(),
    ];
    args.extend(extra);
    let keel = RunOnce::new(args, vec![("KEEL_DEMO_ASYNC_TOOL_URL".into(), tool_url)]);
    let thread = format!("thread-{}", support::uuid_like());

    // Input 1, process 1: a sync tool, then the asynchronous one; the process exits while
    // the job is pending.
    let first = keel
        .run(&["--thread", &thread, "--message", "render my video please"])
        .await;
    assert_eq!(first["state"], "working", "{first}");
    assert_eq!(first["rest"], "awaiting_tool", "{first}");
    let task_id = first["task_id"].as_str().unwrap().to_owned();
    let invocation = {
        let seen = invocations.lock().unwrap();
        assert_eq!(seen.len(), 1, "one invocation: {seen:?}");
        seen[0].clone()
    };
    assert_eq!(invocation["tool"], "background_job");
    assert_eq!(invocation["group_id"], thread.as_str());
    assert_eq!(invocation["arguments"]["job"], "render the intro");
    // The callback names Keel's id of the call (unique across threads), not the model's.
    let call_id = invocation["call_id"].as_str().unwrap().to_owned();
    assert_ne!(call_id, "call_job");
    assert_eq!(first["awaiting_tool_call"], call_id.as_str(), "{first}");
    assert_eq!(
        invocation["callback_url"],
        format!("http://127.0.0.1:9/keel/callbacks/{call_id}")
    );
    let secret = invocation["callback_secret"].as_str().unwrap().to_owned();

    // The job takes a while; no process is running for it meanwhile (the time going by with
    // no process is the scenario, not a wait for a state).
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A forged callback (wrong secret), in a fresh process: refused, nothing changes.
    let forged = keel
        .run_raw(&[
            "--callback",
            &call_id,
            "--secret",
            "not-the-secret",
            "--result",
            "\"forged\"",
        ])
        .await;
    assert!(!forged.status.success(), "a forged callback must fail");
    assert!(forged.stderr.contains("wrong secret"), "{}", forged.stderr);

    // Input 2, process 2: the job's result; the conversation finishes.
    let second = keel
        .run(&[
            "--callback",
            &call_id,
            "--secret",
            &secret,
            "--result",
            "{\"file\": \"video.mp4\"}",
        ])
        .await;
    assert_eq!(second["task_id"], task_id.as_str(), "{second}");
    assert_eq!(second["state"], "completed", "{second}");
    assert_eq!(second["rest"], "finished", "{second}");
    let answer = second["answer"].as_str().unwrap();
    assert!(answer.starts_with("words: 4; job: "), "{answer}");
    assert!(answer.contains("video.mp4"), "{answer}");

    // A duplicate callback, in a fresh process: refused.
    let duplicate = keel
        .run_raw(&[
            "--callback",
            &call_id,
            "--secret",
            &secret,
            "--result",
            "\"again\"",
        ])
        .await;
    assert!(
        !duplicate.status.success(),
        "a duplicate callback must fail"
    );
    assert!(
        duplicate.stderr.contains("already has its result"),
        "{}",
        duplicate.stderr
    );

    // Input 3, process 3: a new message in the same thread sees the earlier turn.
    let third = keel
        .run(&["--thread", &thread, "--message", "what time is it?"])
        .await;
    assert_eq!(third["state"], "completed", "{third}");
    assert_ne!(third["task_id"], task_id.as_str());
    assert_eq!(
        third["answer"], "time read; remembered the job: true",
        "{third}"
    );
    // Each model step ran exactly once across the four processes: 3 in turn 1, 2 in turn 2.
    assert_eq!(requests.lock().unwrap().len(), 5);
    assert_eq!(invocations.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_with_an_async_tool_runs_in_fresh_processes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    conversation_in_fresh_processes(store, Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_with_an_async_tool_runs_in_fresh_processes_on_redis() {
    let url = support::redis_url();
    let prefix = format!("keel-test-{}:", support::uuid_like());
    conversation_in_fresh_processes(url, vec!["--redis-prefix".into(), prefix]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_once_answers_offline_and_refuses_unknown_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let keel = RunOnce::new(vec!["--store".into(), store], Vec::new());
    let answer = keel.run(&["--thread", "t", "--message", "hello"]).await;
    assert_eq!(answer["state"], "completed", "{answer}");
    assert_eq!(answer["answer"], "You said: hello");
    let unknown = keel
        .run_raw(&["--callback", "nope", "--secret", "s", "--result", "1"])
        .await;
    assert!(!unknown.status.success());
    assert!(
        unknown
            .stderr
            .contains("no asynchronous tool call `nope` is pending"),
        "{}",
        unknown.stderr
    );
    let bad_json = keel
        .run_raw(&[
            "--callback",
            "nope",
            "--secret",
            "s",
            "--result",
            "not json",
        ])
        .await;
    assert!(!bad_json.status.success());
    assert!(
        bad_json.stderr.contains("--result must be JSON"),
        "{}",
        bad_json.stderr
    );
}
