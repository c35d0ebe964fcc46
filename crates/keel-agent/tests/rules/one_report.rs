// One run, one report (issue 36): a run that pauses (for an approval, for input) and is
// resumed, by the same executor or by a new one on the same store (a restart), keeps one
// sequence of events and one stored report holding every event, approval and model call.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool};
use keel_core::{AgentCard, ApprovalOutcome, Message, RunContext, Task, TaskState};
use keel_events::{EventType, InMemoryEventSink, RunEvent, RunReport};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_policy::{approve_request, CapabilityPolicy, CapabilityRule};
use keel_runtime::{AuthContext, Runtime};
use serde_json::json;

use super::fixture::send;

/// The model's turns of a run that writes a record (an action that needs approval) and
/// answers "done" once it has the tool's result.
fn write_then_answer() -> Vec<MockResponse> {
    vec![
        MockResponse::ToolCalls(vec![ToolCall::new("publish", json!({"id": "r1"}))]),
        MockResponse::Text("done".into()),
    ]
}

/// An agent whose `publish` tool needs approval, its model scripted with `script`.
fn gated_writer(script: Vec<MockResponse>) -> Agent {
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
async fn pause(exec: &AgentExecutor, auth: &AuthContext) -> Task {
    let paused = send(exec, auth, Message::user("publish r1")).await;
    assert_eq!(paused.state(), TaskState::InputRequired);
    paused
}

/// An executor for `agent` on `runtime` whose run events also go to the returned sink.
fn observed(agent: Agent, runtime: &Arc<dyn Runtime>) -> (AgentExecutor, Arc<InMemoryEventSink>) {
    let exec = AgentExecutor::new(agent, runtime.clone());
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    (exec, sink)
}

/// Approve the one action `task` waits for, through `exec`.
async fn approve(exec: &AgentExecutor, auth: &AuthContext, task: &Task) -> Task {
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
async fn stored_report(exec: &AgentExecutor, auth: &AuthContext, task: &Task) -> RunReport {
    let run_id = RunContext::from_task(task).unwrap().unwrap().run_id;
    let record = exec.reads().run(auth, &run_id).await.unwrap().expect("a stored report");
    RunReport::from_value(record.report).unwrap()
}

fn sequences(events: &[RunEvent]) -> Vec<u64> {
    events.iter().map(|e| e.sequence).collect()
}

fn count(events: &[RunEvent], kind: EventType) -> usize {
    events.iter().filter(|e| e.event_type == kind).count()
}

/// What the report says of the whole run: every event numbered once from 1, both model calls
/// with their summed usage, and the approval with its decision.
fn assert_one_run(report: &RunReport) {
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

#[tokio::test]
async fn a_run_paused_for_an_approval_keeps_one_event_sequence_and_one_report() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let (exec, sink) = observed(gated_writer(write_then_answer()), &runtime);
    let paused = pause(&exec, &auth).await;
    let before = sink.events().len() as u64;
    assert_eq!(stored_report(&exec, &auth, &paused).await.event_count, before);

    let done = approve(&exec, &auth, &paused).await;
    assert_eq!(done.state(), TaskState::Completed);

    // Live: the sinks saw one sequence, not a second one starting again at 1.
    let live = sink.events();
    assert_eq!(sequences(&live), (1..=live.len() as u64).collect::<Vec<_>>());
    assert!(live.len() as u64 > before);
    // Stored: one report with every event the sinks saw, and the same totals.
    let report = stored_report(&exec, &auth, &done).await;
    assert_one_run(&report);
    assert_eq!(report.event_count, live.len() as u64);
    assert_eq!(report.model, RunReport::from_events(&live).model);
}

#[tokio::test]
async fn a_run_paused_for_an_approval_keeps_one_report_across_a_restart() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let (first, first_sink) = observed(gated_writer(write_then_answer()), &runtime);
    let paused = pause(&first, &auth).await;
    first.shutdown().await;
    drop(first);

    // A new executor on the same store (a restarted process) takes the decision.
    let agent = gated_writer(vec![MockResponse::Text("done".into())]);
    let (second, second_sink) = observed(agent, &runtime);
    let done = approve(&second, &auth, &paused).await;
    assert_eq!(done.state(), TaskState::Completed);

    let earlier = first_sink.events();
    let later = second_sink.events();
    let first_after = later.first().map(|e| e.sequence);
    assert_eq!(first_after, Some(earlier.len() as u64 + 1), "numbering goes on");
    let report = stored_report(&second, &auth, &done).await;
    assert_one_run(&report);
    assert_eq!(report.event_count, (earlier.len() + later.len()) as u64);
}

#[tokio::test]
async fn a_run_paused_for_input_keeps_one_report_when_the_answer_comes() {
    let agent = Agent::builder(AgentCard::new("asker", "one report", "http://127.0.0.1:0"))
        .llm(MockLlm::scripted(vec![
            MockResponse::ToolCalls(vec![ToolCall::new(
                "ask_human",
                json!({"question": "which record?"}),
            )]),
            MockResponse::Text("r1 it is".into()),
        ]))
        .human_handoff(true)
        .build()
        .unwrap();
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let (exec, sink) = observed(agent, &runtime);
    let asked = send(&exec, &auth, Message::user("write a record")).await;
    assert_eq!(asked.state(), TaskState::InputRequired);
    let mut answer = Message::user("r1");
    answer.task_id = Some(asked.id.clone());
    let done = send(&exec, &auth, answer).await;
    assert_eq!(done.state(), TaskState::Completed);

    let live = sink.events();
    assert_eq!(sequences(&live), (1..=live.len() as u64).collect::<Vec<_>>());
    let report = stored_report(&exec, &auth, &done).await;
    assert_eq!(report.event_count, live.len() as u64);
    assert_eq!(sequences(&report.events), sequences(&live));
    assert_eq!(report.model.calls, 2);
}
