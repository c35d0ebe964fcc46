// One run, one report (issue 36): a run that pauses (for an approval, for input) and is
// resumed, by the same executor or by a new one on the same store (a restart), keeps one
// sequence of events and one stored report holding every event, approval and model call.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor};
use keel_core::{AgentCard, Message, TaskState};
use keel_events::RunReport;
use keel_llm::{MockLlm, MockResponse, ToolCall};
use serde_json::json;

use super::fixture::{backend, send, start};
use super::one_report_fixture::*;

#[tokio::test]
async fn a_run_paused_for_an_approval_keeps_one_event_sequence_and_one_report() {
    let (runtime, auth) = backend();
    let (exec, sink) = observed(gated_writer(write_then_answer()), &runtime);
    let paused = pause(&exec, &auth).await;
    let before = sink.events().len() as u64;
    // The pause's report holds every event so far (waited for: the report follows the task).
    stored_report(&exec, &auth, &paused, before).await;

    let done = approve(&exec, &auth, &paused).await;
    assert_eq!(done.state(), TaskState::Completed);

    // Live: the sinks saw one sequence, not a second one starting again at 1.
    let live = sink.events();
    assert_eq!(sequences(&live), (1..=live.len() as u64).collect::<Vec<_>>());
    assert!(live.len() as u64 > before);
    // Stored: one report with every event the sinks saw, and the same totals.
    let report = stored_report(&exec, &auth, &done, live.len() as u64).await;
    assert_one_run(&report);
    assert_eq!(report.model, RunReport::from_events(&live).model);
}

#[tokio::test]
async fn a_run_paused_for_an_approval_keeps_one_report_across_a_restart() {
    let runtime = super::runtime();
    one_report_across_a_restart(runtime.clone(), move || runtime).await;
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
    let (runtime, auth) = backend();
    let (exec, sink) = observed(agent, &runtime);
    let asked = send(&exec, &auth, Message::user("write a record")).await;
    assert_eq!(asked.state(), TaskState::InputRequired);
    let answer = Message {
        task_id: Some(asked.id.clone()),
        ..Message::user("r1")
    };
    let done = send(&exec, &auth, answer).await;
    assert_eq!(done.state(), TaskState::Completed);

    let live = sink.events();
    assert_eq!(sequences(&live), (1..=live.len() as u64).collect::<Vec<_>>());
    let report = stored_report(&exec, &auth, &done, live.len() as u64).await;
    assert_eq!(sequences(&report.events), sequences(&live));
    assert_eq!(report.model.calls, 2);
}

#[tokio::test]
async fn a_run_paused_for_an_asynchronous_tool_keeps_one_report_when_its_result_comes() {
    let (sent, mut invocations) = tokio::sync::mpsc::unbounded_channel();
    let agent = Agent::builder(AgentCard::new("renderer", "one report", "http://127.0.0.1:0"))
        .llm(MockLlm::scripted(vec![
            MockResponse::ToolCalls(vec![ToolCall::new("watch", json!({"price": "x"}))]),
            MockResponse::Text("watched".into()),
        ]))
        // Asynchronous, dispatched in process: the invocation comes to this test.
        .tool(super::budgets_and_subscriptions::Watch(sent))
        .build()
        .unwrap();
    let (runtime, auth) = backend();
    let config = keel_agent::ExecutorConfig {
        callbacks: Some(keel_transport::callbacks::HttpCallbacks::shared(
            "http://127.0.0.1:9/keel",
        )),
        ..Default::default()
    };
    let exec = AgentExecutor::with_config(agent, runtime, config);
    let sink = Arc::new(keel_events::InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let task = start(&exec, &auth, Message::user("watch x")).await;
    let invocation = invocations.recv().await.unwrap();
    let paused = keel_runtime::testing::eventually("the run to rest awaiting its tool", || async {
        let reads = exec.reads();
        let task = reads.task(&auth, &task.id).await.unwrap();
        let stored = reads.latest_run(&auth, &task.id).await.unwrap();
        stored.is_some().then_some(task)
    })
    .await;
    assert_eq!(paused.state(), TaskState::Working);
    let secret = &invocation.callback_secret;
    // A progress report comes while no run holds the task: it joins the same sequence.
    exec.deliver_tool_progress(&invocation.call_id, secret, json!({"done": "half"}))
        .await
        .unwrap();
    exec.deliver_tool_result(&invocation.call_id, secret, json!("x moved"), false)
        .await
        .unwrap();
    let done = keel_runtime::testing::eventually("the run to complete", || async {
        let task = exec.reads().task(&auth, &task.id).await.unwrap();
        task.state().is_terminal().then_some(task)
    })
    .await;
    assert_eq!(done.state(), TaskState::Completed);

    let live = sink.events();
    assert_eq!(sequences(&live), (1..=live.len() as u64).collect::<Vec<_>>());
    let report = stored_report(&exec, &auth, &done, live.len() as u64).await;
    assert_eq!(sequences(&report.events), sequences(&live));
    assert_eq!(report.model.calls, 2, "the call before the wait and after it");
    for kind in [
        "tool.async.dispatched",
        "tool.async.progress",
        "tool.async.result",
    ] {
        let found = count(&report.events, keel_events::EventType::from(kind));
        assert_eq!(found, 1, "{kind} in the report");
    }
}
