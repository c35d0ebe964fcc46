// The records agent of the replay tests (issue 42): a tool that needs an approval its handler
// gives, a scripted model, a run recorded on a runtime and replayed unchanged. Included by the
// rules harness (so that a recording replays on every backend) and by the replay tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::replay::{Recording, Replay};
use keel_agent::{Agent, AgentBuilder, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, Message, Task, TaskState};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_policy::{approve_request, ApprovalFn, CapabilityPolicy, CapabilityRule};
use keel_runtime::{AuthContext, Runtime};
use serde_json::{json, Value};

pub(crate) const INSTRUCTIONS: &str = "You keep records.";

pub(crate) fn schema() -> Value {
    json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]})
}

pub(crate) fn write_tool(writes: Arc<AtomicUsize>, schema: Value) -> FnTool {
    FnTool::new(
        "write_record",
        "Write a record",
        schema,
        move |args, _ctx| {
            let writes = writes.clone();
            async move {
                writes.fetch_add(1, Ordering::SeqCst);
                Ok(json!(format!(
                    "wrote {}",
                    args["id"].as_str().unwrap_or_default()
                )))
            }
        },
    )
    .with_capabilities(["records.write"])
}

/// The records agent without an approval handler: a write waits for a person's decision.
pub(crate) fn unattended(
    writes: Arc<AtomicUsize>,
    instructions: &str,
    schema: Value,
) -> AgentBuilder {
    Agent::builder(AgentCard::new(
        "records",
        "keeps records",
        "http://127.0.0.1:0",
    ))
    .instructions(instructions)
    .tool(write_tool(writes, schema))
    .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval))
}

/// The records agent: asks approval before a write, which its handler gives.
pub(crate) fn agent(writes: Arc<AtomicUsize>, instructions: &str, schema: Value) -> AgentBuilder {
    unattended(writes, instructions, schema).approval_handler(ApprovalFn::new(
        |request, _| async move { Ok(approve_request(&request, "reviewer")) },
    ))
}

pub(crate) fn script() -> Arc<MockLlm> {
    Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("write_record", json!({"id": "r1"}))]),
        MockResponse::Text("done".into()),
    ]))
}

/// Record one run of the agent on `runtime` and read it back through `reads`.
pub(crate) async fn record(runtime: Arc<dyn Runtime>) -> Recording {
    record_as(runtime, |agent| agent, 1).await
}

/// Record one run of the agent as `configure` leaves it, which runs the tool `writes` times.
pub(crate) async fn record_as(
    runtime: Arc<dyn Runtime>,
    configure: impl FnOnce(AgentBuilder) -> AgentBuilder,
    expected_writes: usize,
) -> Recording {
    let writes = Arc::new(AtomicUsize::new(0));
    let built = configure(agent(writes.clone(), INSTRUCTIONS, schema())).llm_shared(script());
    let (exec, auth, task) = send_write(runtime, built).await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(writes.load(Ordering::SeqCst), expected_writes);
    recording_of(&exec, &auth, &task).await
}

/// An executor of `agent` on `runtime`, its caller, and the task of "write r1" sent to it.
pub(crate) async fn send_write(
    runtime: Arc<dyn Runtime>,
    agent: AgentBuilder,
) -> (AgentExecutor, AuthContext, Task) {
    let exec = AgentExecutor::new(agent.build().unwrap(), runtime.clone());
    let auth = runtime.auth_service().auth_context();
    let task = exec
        .send_message(&auth, Message::user("write r1"), SendOptions::default())
        .await
        .unwrap();
    (exec, auth, task)
}

/// The recording of `task`'s latest run.
pub(crate) async fn recording_of(
    exec: &AgentExecutor,
    auth: &AuthContext,
    task: &Task,
) -> Recording {
    let record = exec
        .reads()
        .latest_run(auth, &task.id)
        .await
        .unwrap()
        .expect("the run was recorded");
    Recording::from_json(&record.report).unwrap()
}

/// `recording` re-driven through `agent` on the message it answered ("write r1").
pub(crate) async fn replayed(
    recording: Recording,
    agent: AgentBuilder,
) -> keel_agent::replay::ReplayOutcome {
    Replay::new(recording)
        .run(agent, Message::user("write r1"))
        .await
        .unwrap()
}

pub(crate) async fn replay_unchanged(runtime: Arc<dyn Runtime>) {
    let recording = record(runtime).await;
    assert_eq!(recording.steps.len(), 2);
    assert_eq!(recording.tool_calls.len(), 1);
    assert_eq!(recording.approvals.len(), 1);
    let writes = Arc::new(AtomicUsize::new(0));
    let outcome = replayed(recording, agent(writes.clone(), INSTRUCTIONS, schema())).await;
    assert_eq!(outcome.divergence, None, "{:?}", outcome.divergence);
    assert!(outcome.passed());
    assert_eq!(outcome.task.state(), TaskState::Completed);
    assert_eq!(writes.load(Ordering::SeqCst), 0, "a replay runs no tool");
    assert_eq!(outcome.model_inputs.len(), 2);
}
