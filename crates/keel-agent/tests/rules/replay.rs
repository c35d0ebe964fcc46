// Replay (issue 42) on every backend: a run recorded on the backend (a tool call that needs
// an approval, then an answer; one that asked a subagent first) replays unchanged with no
// divergence, no model call, no tool run and no child run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::replay::Replay;
use keel_agent::AgentExecutor;
use keel_core::{Message, TaskState};
use keel_llm::{MockLlm, MockResponse};
use keel_runtime::Runtime;

use super::replay_fixture::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_agent_replays_without_divergence() {
    replay_unchanged(super::runtime()).await;
}

// A run that asked a subagent (and waited for its answer) before a write replays unchanged:
// the recorded `subagent_create` result stands in, so no child runs and no model is called.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_asked_a_subagent_replays_without_divergence_or_a_child_run() {
    let child_model = Arc::new(MockLlm::new());
    let with_researcher = |runtime: &Arc<dyn Runtime>, model: Arc<MockLlm>| {
        let child = keel_agent::Agent::builder(keel_core::AgentCard::new(
            "researcher",
            "finds records",
            "http://127.0.0.1:0",
        ))
        .llm_shared(model)
        .build()
        .unwrap();
        keel_agent::SubagentSpec::new("researcher", AgentExecutor::new(child, runtime.clone()))
    };
    let script = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![keel_llm::ToolCall::new(
            "subagent_create",
            serde_json::json!({"name": "r", "message": "find r1"}),
        )]),
        MockResponse::ToolCalls(vec![keel_llm::ToolCall::new(
            "write_record",
            serde_json::json!({"id": "r1"}),
        )]),
        MockResponse::Text("done".into()),
    ]));
    let runtime = super::runtime();
    let writes = Arc::new(AtomicUsize::new(0));
    let built = agent(writes.clone(), INSTRUCTIONS, schema())
        .subagent(with_researcher(&runtime, child_model.clone()))
        .llm_shared(script);
    let (exec, auth, task) = send_write(runtime, built).await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(child_model.requests().len(), 1, "the child answered once");
    let recording = recording_of(&exec, &auth, &task).await;
    assert_eq!(recording.steps.len(), 3);

    // The replay's definition has the subagent too, over a runtime of its own.
    let replay_runtime = super::runtime();
    let replay_child = Arc::new(MockLlm::new());
    let replayed_writes = Arc::new(AtomicUsize::new(0));
    let outcome = Replay::new(recording)
        .run_on(
            replay_runtime.clone(),
            agent(replayed_writes.clone(), INSTRUCTIONS, schema())
                .subagent(with_researcher(&replay_runtime, replay_child.clone())),
            Message::user("write r1"),
        )
        .await
        .unwrap();
    assert_eq!(outcome.divergence, None, "{:?}", outcome.divergence);
    assert!(outcome.passed(), "{:?}", outcome.unrecorded_tools);
    assert_eq!(outcome.task.state(), TaskState::Completed);
    assert_eq!(
        replayed_writes.load(Ordering::SeqCst),
        0,
        "a replay runs no tool"
    );
    assert!(replay_child.requests().is_empty(), "a replay runs no child");
}
