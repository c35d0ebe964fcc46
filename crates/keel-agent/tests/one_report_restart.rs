//! One run, one report across a real restart (issue 36): a run paused for an approval in one
//! process, whose store is a SQLite file, and approved in the next process on the same file,
//! keeps one event sequence and one stored report with both model calls and the approval.

use std::path::Path;
use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, ApprovalOutcome, Message, RunContext, TaskState};
use keel_events::{InMemoryEventSink, RunReport};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_policy::{approve_request, CapabilityPolicy, CapabilityRule};
use keel_runtime::Runtime;
use keel_store_sqlite::SqliteStore;
use serde_json::json;

/// A process: an executor of an agent scripted with `script` (its one tool needs approval)
/// on the SQLite file at `path`, its run events also going to the returned sink.
fn process(path: &Path, script: Vec<MockResponse>) -> (AgentExecutor, Arc<InMemoryEventSink>) {
    let store = SqliteStore::open(path).expect("open SQLite");
    let runtime: Arc<dyn Runtime> = Arc::new(store.services(Arc::new(MockLlm::new())));
    let tool = FnTool::new(
        "write_record",
        "Write a record",
        json!({"type": "object"}),
        |_, _| async { Ok(json!("written")) },
    )
    .with_capabilities(["records.write"]);
    let agent = Agent::builder(AgentCard::new("writer", "restarts", "http://127.0.0.1:0"))
        .llm(MockLlm::scripted(script))
        .tool(tool)
        .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval))
        .build()
        .unwrap();
    let exec = AgentExecutor::new(agent, runtime);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    (exec, sink)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_across_a_restart_on_sqlite_keeps_one_report_with_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let call = ToolCall::new("write_record", json!({"id": "r1"}));
    let (first, first_sink) = process(&path, vec![MockResponse::ToolCalls(vec![call])]);
    let auth = first.runtime().auth_service().auth_context();
    let paused = first
        .send_message(&auth, Message::user("write r1"), SendOptions::default())
        .await
        .unwrap();
    assert_eq!(paused.state(), TaskState::InputRequired);
    first.shutdown().await;
    drop(first);

    // The next process, on the same file, takes the decision.
    let (second, second_sink) = process(&path, vec![MockResponse::Text("done".into())]);
    let reads = second.reads();
    let pending = reads
        .pending_approvals(&auth, None, None, None)
        .await
        .unwrap();
    let decision = approve_request(&pending.items[0].request, "reviewer");
    let done = second
        .decide_approval(&auth, &paused.id, decision)
        .await
        .unwrap();
    assert_eq!(done.state(), TaskState::Completed);

    let (earlier, later) = (first_sink.events(), second_sink.events());
    assert_eq!(
        later[0].sequence,
        earlier.len() as u64 + 1,
        "numbering goes on"
    );
    let run_id = RunContext::from_task(&done).unwrap().unwrap().run_id;
    let record = reads
        .run(&auth, &run_id)
        .await
        .unwrap()
        .expect("a stored report");
    let report = RunReport::from_value(record.report).unwrap();
    let all: Vec<u64> = earlier.iter().chain(&later).map(|e| e.sequence).collect();
    let stored: Vec<u64> = report.events.iter().map(|e| e.sequence).collect();
    assert_eq!(stored, all);
    assert_eq!(stored, (1..=report.event_count).collect::<Vec<_>>());
    assert_eq!(
        report.model.calls, 2,
        "the model call before the restart and after"
    );
    let live = RunReport::from_events(&earlier.iter().chain(&later).cloned().collect::<Vec<_>>());
    assert_eq!(
        report.model, live.model,
        "the stored totals are the live ones"
    );
    assert_eq!(report.approvals.len(), 1);
    assert_eq!(
        report.approvals[0].decision.as_ref().map(|d| d.outcome),
        Some(ApprovalOutcome::Approved)
    );
    assert_eq!(report.final_state, Some(TaskState::Completed));
}
