// Budgets hold on every path: an explicit `infer` part goes through the same checkpoints as a
// step of the model loop, and stops as that step would. Subscription events: an asynchronous
// tool's event marked as one is queued as input to its thread and wakes the model, where a
// progress report does not.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, Message, Part, RunBudget, RunContext, Role, Task, TaskState};
use keel_events::{InMemoryEventSink, RunEvent};
use keel_llm::{MockLlm, MockResponse, ToolCall, Usage};
use keel_runtime::AuthContext;
use serde_json::json;

fn card() -> AgentCard {
    AgentCard::new("budgeted", "keeps to its budget", "http://127.0.0.1:0")
}

fn executor(llm: MockLlm) -> (AgentExecutor, AuthContext, Arc<InMemoryEventSink>) {
    let echo = FnTool::new("echo", "Echo", json!({"type": "object"}), |args, _| async move {
        Ok(args)
    });
    let agent = Agent::builder(card())
        .llm(llm.with_usage(Usage::default()))
        .tool(echo)
        .build()
        .unwrap();
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let exec = AgentExecutor::new(agent, runtime);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    (exec, auth, sink)
}

/// Send `message` under `budget` and give back the task and the `budget.exceeded` events.
async fn send_under(
    llm: MockLlm,
    message: Message,
    budget: RunBudget,
) -> (Task, Vec<RunEvent>) {
    let (exec, auth, sink) = executor(llm);
    let options = SendOptions {
        run_context: Some(RunContext::new().with_budget(budget)),
        ..Default::default()
    };
    let task = exec.send_message(&auth, message, options).await.unwrap();
    let exceeded = sink
        .events()
        .into_iter()
        .filter(|e| e.is("budget.exceeded"))
        .collect();
    (task, exceeded)
}

/// How a run stopped, as a caller and an operator see it.
fn stop(task: &Task, exceeded: &[RunEvent]) -> (TaskState, String, String, Vec<String>) {
    (
        task.state(),
        task.metadata["stop_reason"].as_str().unwrap_or_default().to_owned(),
        task.metadata["error"].as_str().unwrap_or_default().to_owned(),
        exceeded
            .iter()
            .map(|e| e.payload["limit"].as_str().unwrap_or_default().to_owned())
            .collect(),
    )
}

fn two_infer_parts() -> Message {
    Message::new(
        Role::User,
        vec![Part::infer("First question"), Part::infer("Second question")],
    )
}

const LONG_ANSWER: &str = "an answer long enough to cost far more than ten output tokens by any estimate";

#[tokio::test]
async fn an_infer_part_over_max_steps_stops_as_the_step_loop_does() {
    let budget = RunBudget {
        max_steps: Some(1),
        ..Default::default()
    };
    // The loop: a tool call is step 1, the next model call would be step 2.
    let looped = MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("echo", json!({"x": 1}))]),
        MockResponse::Text("done".into()),
    ]);
    let (loop_task, loop_exceeded) = send_under(looped, Message::user("go"), budget.clone()).await;
    // Explicit parts: the first `infer` part is step 1, the second would be step 2.
    let inferred = MockLlm::scripted(vec![
        MockResponse::Text("one".into()),
        MockResponse::Text("two".into()),
    ]);
    let (infer_task, infer_exceeded) = send_under(inferred, two_infer_parts(), budget).await;

    let expected = stop(&loop_task, &loop_exceeded);
    assert_eq!(expected.0, TaskState::Failed, "{loop_task:?}");
    assert_eq!(expected.1, "max_steps");
    assert_eq!(expected.3, ["max_steps"]);
    assert_eq!(stop(&infer_task, &infer_exceeded), expected, "{infer_task:?}");
}

#[tokio::test]
async fn an_infer_part_over_max_output_tokens_stops_as_the_step_loop_does() {
    let budget = RunBudget {
        max_output_tokens: Some(10),
        ..Default::default()
    };
    // The model reports no usage: both paths count the answer from its estimated size.
    let answer = || MockLlm::scripted(vec![MockResponse::Text(LONG_ANSWER.into())]);
    let (loop_task, loop_exceeded) =
        send_under(answer(), Message::user("go"), budget.clone()).await;
    let (infer_task, infer_exceeded) =
        send_under(answer(), Message::infer("Answer at length"), budget).await;

    let expected = stop(&loop_task, &loop_exceeded);
    assert_eq!(expected.0, TaskState::Failed, "{loop_task:?}");
    assert_eq!(expected.1, "max_output_tokens");
    assert_eq!(expected.3, ["max_output_tokens"]);
    assert_eq!(stop(&infer_task, &infer_exceeded), expected, "{infer_task:?}");
}

#[tokio::test]
async fn infer_parts_under_the_budget_count_as_steps_and_complete() {
    let budget = RunBudget {
        max_steps: Some(2),
        ..Default::default()
    };
    let inferred = MockLlm::scripted(vec![
        MockResponse::Text("one".into()),
        MockResponse::Text("two".into()),
    ]);
    let (task, exceeded) = send_under(inferred, two_infer_parts(), budget).await;
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    assert!(exceeded.is_empty(), "{exceeded:?}");
}
