// What the one-report rules share (issue 36): an agent whose one action needs approval, an
// executor whose run events are also kept in a sink, and what a stored report of one whole
// run must say. Included by the rules harness and by the restart test on a SQLite file.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, ApprovalOutcome, Message, RunContext, Task, TaskState};
use keel_events::{EventType, InMemoryEventSink, RunEvent, RunReport};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_policy::{approve_request, CapabilityPolicy, CapabilityRule};
use keel_runtime::{AuthContext, Runtime};
use serde_json::json;

/// The model's turns of a run that writes a record (an action that needs approval) and
/// answers "done" once it has the tool's result.
pub(crate) fn write_then_answer() -> Vec<MockResponse> {
    vec![
        MockResponse::ToolCalls(vec![ToolCall::new("publish", json!({"id": "r1"}))]),
        MockResponse::Text("done".into()),
    ]
}

/// An agent whose `publish` tool needs approval, its model scripted with `script`.
pub(crate) fn gated_writer(script: Vec<MockResponse>) -> Agent {
    let publish = FnTool::new("publish", "Publish", json!({"type": "object"}), |_, _| async {
        Ok(json!("published"))
    });
    Agent::builder(AgentCard::new("writer", "one report", "http://127.0.0.1:0"))
        .llm(MockLlm::scripted(script))
        .tool(publish.with_capabilities(["drafts.publish"]))
        .policy(CapabilityPolicy::new().with_rule("drafts.publish", CapabilityRule::RequireApproval))
        .build()
        .unwrap()
}

/// Send the message that makes the run pause for an approval; the paused task.
pub(crate) async fn pause(exec: &AgentExecutor, auth: &AuthContext) -> Task {
    let message = Message::user("publish r1");
    let paused = exec.send_message(auth, message, SendOptions::default());
    let paused = paused.await.unwrap();
    assert_eq!(paused.state(), TaskState::InputRequired);
    paused
}

/// An executor for `agent` on `runtime` whose run events also go to the returned sink.
pub(crate) fn observed(agent: Agent, runtime: &Arc<dyn Runtime>) -> (AgentExecutor, Arc<InMemoryEventSink>) {
    let exec = AgentExecutor::new(agent, runtime.clone());
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    (exec, sink)
}

/// Approve the one action `task` waits for, through `exec`.
pub(crate) async fn approve(exec: &AgentExecutor, auth: &AuthContext, task: &Task) -> Task {
    let pending = exec
        .reads()
        .pending_approvals(auth, None, None, None)
        .await
        .unwrap();
    assert_eq!(pending.items.len(), 1, "one action waits for approval");
    let decision = approve_request(&pending.items[0].request, "reviewer");
    exec.decide_approval(auth, &task.id, decision).await.unwrap()
}

/// The task's run, as the run store keeps its report.
/// The stored report of `task`'s run once it holds `events` events: a run saves its task's
/// state first and its report after it, so a report read as the task ends may be the earlier
/// one of a pause.
pub(crate) async fn stored_report(
    exec: &AgentExecutor,
    auth: &AuthContext,
    task: &Task,
    events: u64,
) -> RunReport {
    let run_id = RunContext::from_task(task).unwrap().unwrap().run_id;
    keel_runtime::testing::eventually("the run's report to hold its events", || async {
        let record = exec.reads().run(auth, &run_id).await.unwrap()?;
        let report = RunReport::from_value(record.report).unwrap();
        (report.event_count == events).then_some(report)
    })
    .await
}

pub(crate) fn sequences(events: &[RunEvent]) -> Vec<u64> {
    events.iter().map(|e| e.sequence).collect()
}

pub(crate) fn count(events: &[RunEvent], kind: EventType) -> usize {
    events.iter().filter(|e| e.event_type == kind).count()
}

/// What the report says of the whole run: every event numbered once from 1, both model calls
/// with their summed usage, and the approval with its decision.
pub(crate) fn assert_one_run(report: &RunReport) {
    let n = report.event_count;
    assert_eq!(sequences(&report.events), (1..=n).collect::<Vec<_>>());
    assert_eq!(report.final_state, Some(TaskState::Completed));
    assert_eq!(report.model.calls, 2, "both model calls, before and after the pause");
    let completed: Vec<_> = report
        .events
        .iter()
        .filter(|e| e.event_type == EventType::LLM_CALL_COMPLETED)
        .collect();
    assert_eq!(completed.len(), 2);
    let output: u64 = completed
        .iter()
        .map(|e| e.payload["output_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(report.model.output_tokens, output);
    assert_eq!(report.budget.usage.llm_calls, 2);
    assert_eq!(report.approvals.len(), 1, "the approval the run paused for");
    assert_eq!(
        report.approvals[0].decision.as_ref().map(|d| d.outcome),
        Some(ApprovalOutcome::Approved)
    );
    assert_eq!(count(&report.events, EventType::RUN_STOPPED), 2);
}

/// A run paused for an approval by an executor on `first`, whose process then stops, and
/// approved by a new executor on `reopen()` (the same store, opened again): one sequence of
/// events across both, and one stored report of the whole run.
pub(crate) async fn one_report_across_a_restart(
    first: Arc<dyn Runtime>,
    reopen: impl FnOnce() -> Arc<dyn Runtime>,
) {
    let auth = first.auth_service().auth_context();
    let (before, before_sink) = observed(gated_writer(write_then_answer()), &first);
    let paused = pause(&before, &auth).await;
    before.shutdown().await;
    drop((before, first));

    let second = reopen();
    let agent = gated_writer(vec![MockResponse::Text("done".into())]);
    let (after, after_sink) = observed(agent, &second);
    let done = approve(&after, &auth, &paused).await;
    assert_eq!(done.state(), TaskState::Completed);

    let (earlier, later) = (before_sink.events(), after_sink.events());
    assert_eq!(later[0].sequence, earlier.len() as u64 + 1, "numbering goes on");
    let all: Vec<RunEvent> = earlier.into_iter().chain(later).collect();
    let report = stored_report(&after, &auth, &done, all.len() as u64).await;
    assert_one_run(&report);
    assert_eq!(sequences(&report.events), sequences(&all));
    assert_eq!(report.model, RunReport::from_events(&all).model, "the live totals");
}
