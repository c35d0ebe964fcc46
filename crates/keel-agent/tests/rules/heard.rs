// Another process's writes heard at once, through a store that announces its commits
// (PostgreSQL's LISTEN/NOTIFY): with the executors' polls set to an hour, only the
// announcement can carry a cancel from one process to a run in another.

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, ExecutorConfig};
use keel_core::{AgentCard, Message, TaskState};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_runtime::Runtime;
use serde_json::json;
use tokio::sync::Notify;

/// An executor whose run calls `wait`, a tool that never answers (it is only ever canceled),
/// and that looks at the store on its own only once an hour.
fn waiting_executor(runtime: Arc<dyn Runtime>, started: Arc<Notify>) -> AgentExecutor {
    let tool = super::fixture::object_tool("wait", "Wait for ever", move |_, _| {
        let started = started.clone();
        async move {
            started.notify_one();
            std::future::pending::<()>().await;
            Ok(json!(null))
        }
    });
    let llm = MockLlm::scripted(vec![MockResponse::ToolCalls(vec![ToolCall::new(
        "wait",
        json!({}),
    )])]);
    let agent = Agent::builder(AgentCard::new("waiter", "waits", "http://127.0.0.1:0"))
        .llm(llm)
        .tool(tool)
        .build()
        .unwrap();
    let config = ExecutorConfig {
        poll_interval: Duration::from_secs(3600),
        ..ExecutorConfig::default()
    };
    AgentExecutor::with_config(agent, runtime, config)
}

#[tokio::test]
async fn a_cancel_stored_by_another_process_stops_a_tool_call_in_flight_at_once() {
    let (runtime, auth) = super::fixture::backend();
    let started = Arc::new(Notify::new());
    let running = waiting_executor(runtime.clone(), started.clone());
    let other = waiting_executor(runtime, Arc::new(Notify::new()));
    running.start_takeover();
    other.start_takeover();

    let began = started.notified();
    let task = super::fixture::start(&running, &auth, Message::user("wait")).await;
    began.await;
    assert!(running.is_running(&auth, &task.id));

    // The canceling process answers once it hears that the run stopped; without the store's
    // announcements it would wait its hour-long poll (the bound only turns a hang into a
    // failure).
    let cancel = other.cancel_task(&auth, &task.id, Some("from the other process".into()));
    let canceled = tokio::time::timeout(Duration::from_secs(120), cancel)
        .await
        .expect("the cancel was heard by the running process")
        .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    keel_runtime::testing::eventually("the run in the other executor to stop", || {
        let stopped = !running.is_running(&auth, &task.id);
        async move { stopped.then_some(()) }
    })
    .await;
    let stored = running.get_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(stored.state(), TaskState::Canceled);
    assert_eq!(
        stored.status().message.as_ref().map(|m| m.text()),
        Some("Canceled: from the other process".to_owned())
    );
    running.shutdown().await;
    other.shutdown().await;
}
