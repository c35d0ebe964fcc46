//! An approval can wait across a process restart: the pending request is persisted, and the
//! decision, given to a fresh runtime on the same store, resumes the run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel::llm::{MockResponse, ToolCall};
use keel::policy::{approve_request, CapabilityPolicy, CapabilityRule};
use keel::prelude::*;
use serde_json::json;

fn agent(writes: Arc<AtomicUsize>, script: Vec<MockResponse>) -> Agent {
    let write = FnTool::new(
        "write_record",
        "Write a record",
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
        move |_args, _ctx| {
            let writes = writes.clone();
            async move {
                writes.fetch_add(1, Ordering::SeqCst);
                Ok(json!("written"))
            }
        },
    )
    .with_capabilities(["records.write"]);
    Agent::builder(AgentCard::new(
        "records",
        "keeps records",
        "http://127.0.0.1:0",
    ))
    .llm(MockLlm::scripted(script))
    .tool(write)
    .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval))
    .build()
    .unwrap()
}

async fn runtime(store: &StoreConfig) -> Arc<DefaultRuntime> {
    Arc::new(
        DefaultRuntime::builder()
            .store(store.clone())
            .build()
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_approval_survives_a_restart_and_the_decision_resumes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreConfig::Sqlite(dir.path().join("keel.db"));
    let writes = Arc::new(AtomicUsize::new(0));

    let first = runtime(&store).await;
    let auth = first.auth_service().auth_context();
    let before = AgentExecutor::new(
        agent(
            writes.clone(),
            vec![MockResponse::ToolCalls(vec![ToolCall::new(
                "write_record",
                json!({"id": "r1"}),
            )])],
        ),
        first.clone(),
    );
    let task = before
        .send_message(&auth, Message::user("write r1"), SendOptions::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::InputRequired);
    before.shutdown().await;
    drop(before);
    drop(first);

    // A new process: a fresh runtime on the same file finds the pending request.
    let second = runtime(&store).await;
    let after = AgentExecutor::new(
        agent(writes.clone(), vec![MockResponse::Text("done".into())]),
        second,
    );
    let waiting = after.get_task(&auth, &task.id, None).await.unwrap();
    let request: keel::core::ApprovalRequest =
        serde_json::from_value(waiting.metadata["pending_approval"].clone()).unwrap();
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "nothing ran before the decision"
    );
    let done = after
        .decide_approval(&auth, &task.id, approve_request(&request, "ops"))
        .await
        .unwrap();
    assert_eq!(done.state(), TaskState::Completed);
    assert_eq!(done.status().message.as_ref().unwrap().text(), "done");
    assert_eq!(
        writes.load(Ordering::SeqCst),
        1,
        "the approved action ran exactly once"
    );
}
