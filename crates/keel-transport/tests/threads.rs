//! A thread's own routes over real HTTP beside A2A: its state, messages and queue, read and
//! queued by the tenant that owns the thread and by no other, on one agent's server and per
//! agent under `/agents/{name}`.

mod support;

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, Message, ThreadId};
use keel_llm::MockLlm;
use keel_runtime::{ApiKeyAuthService, AuthContext, Runtime, Services};
use keel_transport::{A2aServer, AgentsServer, Security};
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{get_as as get, object_tool, status_and_json, ALICE, BOB};
use tokio::sync::Notify;

/// A tool that announces it started, then waits for `release`: it keeps the thread busy so
/// that queued work stays queued.
fn gate_tool(started: Arc<Notify>, release: Arc<Notify>) -> FnTool {
    object_tool("gate", "Wait for the test", move |_a, _c| {
        let (started, release) = (started.clone(), release.clone());
        async move {
            started.notify_one();
            release.notified().await;
            Ok(json!("released"))
        }
    })
}

async fn post(http: &reqwest::Client, url: &str, key: &str, body: Value) -> (StatusCode, Value) {
    status_and_json(http.post(url).header("X-API-Key", key).json(&body)).await
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

#[tokio::test]
async fn a_threads_state_messages_and_queue_are_served_to_its_tenant_only() {
    let alice = AuthContext::new("acme", "alice");
    let runtime: Arc<dyn Runtime> = support::two_tenant_runtime(MockLlm::new());
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let executor = AgentExecutor::new(
        Agent::builder(AgentCard::new(
            "threads",
            "threads over HTTP",
            "http://127.0.0.1:0",
        ))
        .tool(gate_tool(started.clone(), release.clone()))
        .build()
        .unwrap(),
        runtime,
    );
    let one = A2aServer::new(executor.clone()).with_security(Security::api_key_and_bearer());
    let base = serve(one.router("http://127.0.0.1:0")).await;
    let many = AgentsServer::new().with_agent(
        "threads",
        A2aServer::new(executor.clone()).with_security(Security::api_key_and_bearer()),
    );
    let agents_base = serve(many.router("http://127.0.0.1:0")).await;
    let http = reqwest::Client::new();

    // Alice's thread, with one finished turn.
    let task = support::completed_task(&executor, &alice, "hello").await;
    let thread: ThreadId = task.thread_id.clone();
    let state_url = format!("{base}/threads/{thread}");

    // State: Alice's; 401 without credentials; 404 for Bob, even naming Alice's tenant.
    let (status, state) = get(&http, &state_url, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{state}");
    assert_eq!(state["thread_id"], thread.to_string());
    assert_eq!(state["terminated"], false);
    assert_eq!(state["queued"], 0);
    assert_eq!(state["children"], json!([]));
    assert_eq!(
        get(&http, &state_url, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, refused) = get(&http, &state_url, Some(BOB)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(refused["error"]["code"], "thread_not_found");
    let hinted = format!("{base}/acme/threads/{thread}");
    let (status, refused) = get(&http, &hinted, Some(BOB)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(refused["error"]["code"], "thread_not_found");
    let unknown = format!("{base}/threads/{}", ThreadId::new());
    assert_eq!(
        get(&http, &unknown, Some(ALICE)).await.0,
        StatusCode::NOT_FOUND
    );

    // Messages: the history in order, paged by seq; a bad page size is a 400.
    let messages_url = format!("{state_url}/messages");
    let (status, read) = get(&http, &messages_url, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    let entries = read["messages"].as_array().unwrap();
    assert_eq!(entries[0]["seq"], 1);
    assert_eq!(entries[0]["message"]["role"], "user");
    assert_eq!(entries[0]["message"]["content"], "hello");
    assert_eq!(entries.last().unwrap()["message"]["role"], "assistant");
    let (_, paged) = get(
        &http,
        &format!("{messages_url}?after=1&limit=1"),
        Some(ALICE),
    )
    .await;
    assert_eq!(paged["messages"].as_array().unwrap().len(), 1);
    assert_eq!(paged["messages"][0]["seq"], 2);
    let (status, bad) = get(&http, &format!("{messages_url}?limit=0"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_limit");
    assert_eq!(
        get(&http, &messages_url, Some(BOB)).await.0,
        StatusCode::NOT_FOUND
    );

    // Per agent, the same routes under /agents/{name}, with the same tenancy.
    let per_agent = format!("{agents_base}/agents/threads/threads/{thread}");
    assert_eq!(get(&http, &per_agent, Some(ALICE)).await.0, StatusCode::OK);
    assert_eq!(
        get(&http, &per_agent, Some(BOB)).await.0,
        StatusCode::NOT_FOUND
    );

    // Queue: while a run holds the thread, a message queued over HTTP waits in its queue.
    executor
        .send_message(
            &alice,
            Message::user("/gate").in_thread(thread.clone()),
            SendOptions::in_background(),
        )
        .await
        .unwrap();
    started.notified().await;
    let (status, _) = post(&http, &messages_url, BOB, json!({"text": "sneaky"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, bad) = post(&http, &messages_url, ALICE, json!({"text": " "})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_body");
    let (status, queued) = post(&http, &messages_url, ALICE, json!({"text": "and then?"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    let queue_url = format!("{state_url}/queue");
    let (status, waiting) = get(&http, &queue_url, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    let items = waiting["items"].as_array().unwrap();
    // The running task's own item stays until it rests; ours waits behind it.
    let ours = items.last().unwrap();
    assert_eq!(ours["id"], queued["id"]);
    assert_eq!(ours["payload"]["kind"], "message");
    assert_eq!(ours["payload"]["message"]["parts"][0]["text"], "and then?");
    assert_eq!(
        get(&http, &state_url, Some(ALICE)).await.1["queued"],
        items.len()
    );
    assert_eq!(
        get(&http, &queue_url, Some(BOB)).await.0,
        StatusCode::NOT_FOUND
    );

    // Released, the run takes the queued message in before its next model call.
    let mut updates = executor.task_updates();
    release.notify_one();
    loop {
        let history = executor
            .thread(&alice, thread.clone())
            .history()
            .await
            .unwrap();
        if history.iter().any(|e| e.message.content == "and then?") {
            break;
        }
        updates.changed().await.unwrap();
    }
    let (_, read) = get(&http, &messages_url, Some(ALICE)).await;
    assert!(read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["message"]["content"] == "and then?"));
}

#[tokio::test]
async fn queuing_on_a_terminated_thread_is_a_conflict() {
    let alice = AuthContext::new("acme", "alice");
    let auth_service = ApiKeyAuthService::new(AuthContext::new("local", "operator"))
        .with_key(ALICE, alice.clone());
    let runtime: Arc<dyn Runtime> =
        Arc::new(Services::in_memory(Arc::new(MockLlm::new())).with_auth(auth_service));
    let executor = AgentExecutor::new(
        Agent::builder(AgentCard::new(
            "threads",
            "threads over HTTP",
            "http://127.0.0.1:0",
        ))
        .build()
        .unwrap(),
        runtime,
    );
    let server = A2aServer::new(executor.clone()).with_security(Security::api_key_and_bearer());
    let base = serve(server.router("http://127.0.0.1:0")).await;
    let task = support::completed_task(&executor, &alice, "hello").await;
    let thread = task.thread_id.clone();
    executor
        .thread(&alice, thread.clone())
        .terminate()
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let (status, state) = get(&http, &format!("{base}/threads/{thread}"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state["terminated"], true);
    assert!(state["terminated_at"].is_string());
    let (status, refused) = post(
        &http,
        &format!("{base}/threads/{thread}/messages"),
        ALICE,
        json!({"text": "more"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["error"]["code"], "thread_terminated");
}
