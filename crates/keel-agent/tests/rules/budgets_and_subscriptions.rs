// Budgets hold on every path: an explicit `infer` part goes through the same checkpoints as a
// step of the model loop, and stops as that step would. Subscription events: an asynchronous
// tool's event marked as one is queued as input to its thread and wakes the model, where a
// progress report does not.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, SendOptions};
use keel_core::{AgentCard, Message, Part, RunBudget, RunContext, Role, Task, TaskState};
use keel_events::{InMemoryEventSink, RunEvent};
use keel_llm::{MockLlm, MockResponse, ToolCall, Usage};
use keel_runtime::AuthContext;
use serde_json::json;
use super::fixture::{backend, call_then_answer, echo_tool};

fn card() -> AgentCard {
    AgentCard::new("budgeted", "keeps to its budget", "http://127.0.0.1:0")
}

fn executor(llm: MockLlm) -> (AgentExecutor, AuthContext, Arc<InMemoryEventSink>) {
    let agent = Agent::builder(card())
        .llm(llm.with_usage(Usage::default()))
        .tool(echo_tool())
        .build()
        .unwrap();
    let (runtime, auth) = backend();
    let exec = AgentExecutor::new(agent, runtime);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    (exec, auth, sink)
}

/// A budget of one limit, named as its field (and the stop reason) names it.
fn limited(limit: &str, max: u64) -> RunBudget {
    serde_json::from_value(json!({ limit: max })).unwrap()
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

/// Assert that the step loop's run (`looped`: its task and `budget.exceeded` events) failed
/// at `limit`, the one budget it exceeded, and that the explicit parts' run (`inferred`)
/// stopped exactly as it did.
fn assert_stopped_alike(limit: &str, looped: &(Task, Vec<RunEvent>), inferred: &(Task, Vec<RunEvent>)) {
    let expected = stop(&looped.0, &looped.1);
    assert_eq!(expected.0, TaskState::Failed, "{:?}", looped.0);
    assert_eq!(expected.1, limit);
    assert_eq!(expected.3, [limit]);
    assert_eq!(stop(&inferred.0, &inferred.1), expected, "{:?}", inferred.0);
}

fn two_infer_parts() -> Message {
    Message::new(
        Role::User,
        vec![Part::infer("First question"), Part::infer("Second question")],
    )
}

/// A model that answers [`two_infer_parts`], one text each.
fn two_answers() -> MockLlm {
    MockLlm::scripted(vec![
        MockResponse::Text("one".into()),
        MockResponse::Text("two".into()),
    ])
}

const LONG_ANSWER: &str = "an answer long enough to cost far more than ten output tokens by any estimate";

#[tokio::test]
async fn an_infer_part_over_max_steps_stops_as_the_step_loop_does() {
    let budget = limited("max_steps", 1);
    // The loop: a tool call is step 1, the next model call would be step 2.
    let looped = MockLlm::scripted(call_then_answer("echo", json!({"x": 1}), "done"));
    let looped = send_under(looped, Message::user("go"), budget.clone()).await;
    // Explicit parts: the first `infer` part is step 1, the second would be step 2.
    let inferred = send_under(two_answers(), two_infer_parts(), budget).await;
    assert_stopped_alike("max_steps", &looped, &inferred);
}

#[tokio::test]
async fn an_infer_part_over_max_output_tokens_stops_as_the_step_loop_does() {
    let budget = limited("max_output_tokens", 10);
    // The model reports no usage: both paths count the answer from its estimated size.
    let answer = || MockLlm::scripted(vec![MockResponse::Text(LONG_ANSWER.into())]);
    let looped = send_under(answer(), Message::user("go"), budget.clone()).await;
    let inferred = send_under(answer(), Message::infer("Answer at length"), budget).await;
    assert_stopped_alike("max_output_tokens", &looped, &inferred);
}

#[tokio::test]
async fn infer_parts_under_the_budget_count_as_steps_and_complete() {
    let budget = limited("max_steps", 2);
    let (task, exceeded) = send_under(two_answers(), two_infer_parts(), budget).await;
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    assert!(exceeded.is_empty(), "{exceeded:?}");
}

/// A model at $1 per million input tokens and $10 per million output tokens that reports
/// 1000 input and 100 output tokens a call (2000 micro-dollars) and writes at most 100
/// tokens an answer: a call is estimated at its context's tokens plus 1000 micro-dollars.
fn priced(responses: Vec<MockResponse>) -> MockLlm {
    let price = keel_core::ModelPrice::per_million(1.0, 10.0).unwrap();
    MockLlm::scripted(responses)
        .with_profile(
            keel_llm::ModelProfile::new("mock", "priced")
                .with_max_output_tokens(100)
                .with_price(price),
        )
        .with_usage(Usage {
            input_tokens: 1000,
            output_tokens: 100,
        })
}

/// Run `llm` on a message under `budget` with every event kept.
async fn send_priced(llm: MockLlm, budget: RunBudget) -> (Task, Vec<RunEvent>) {
    let agent = Agent::builder(card()).llm(llm).tool(echo_tool()).build().unwrap();
    let (runtime, auth) = backend();
    let exec = AgentExecutor::new(agent, runtime);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let options = SendOptions {
        run_context: Some(RunContext::new().with_budget(budget)),
        ..Default::default()
    };
    let task = exec
        .send_message(&auth, Message::user("go"), options)
        .await
        .unwrap();
    (task, sink.events())
}

#[tokio::test]
async fn max_cost_stops_the_run_before_a_call_whose_estimate_would_pass_it() {
    // The first call (estimated near 1000, cost 2000) fits under 2500; the second, estimated
    // near 1000 more, would pass it: it is never made.
    let budget = limited("max_cost_micros", 2500);
    let llm = priced(call_then_answer("echo", json!({"x": 1}), "done"));
    let (task, events) = send_priced(llm, budget).await;
    let of = |kind: &str| events.iter().filter(|e| e.is(kind)).collect::<Vec<_>>();
    assert_eq!(task.state(), TaskState::Failed, "{task:?}");
    assert_eq!(task.metadata["stop_reason"], "max_cost_micros");
    assert_eq!(of("llm.call.started").len(), 1, "the second call is not made");
    let completed = of("llm.call.completed");
    assert_eq!(completed[0].payload["cost_micros"], 2000);
    let exceeded = of("budget.exceeded");
    assert_eq!(exceeded.len(), 1);
    let payload = &exceeded[0].payload;
    assert_eq!(payload["limit"], "max_cost_micros");
    assert_eq!((payload["used"].as_u64(), payload["max"].as_u64()), (Some(2000), Some(2500)));
    assert_eq!(payload["usage"]["cost_micros"], 2000);
}

#[tokio::test]
async fn a_priced_run_under_max_cost_records_each_call_s_cost_and_completes() {
    let budget = limited("max_cost_micros", 10_000);
    let llm = priced(call_then_answer("echo", json!({"x": 1}), "done"));
    let (task, events) = send_priced(llm, budget).await;
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    let costs: Vec<_> = events
        .iter()
        .filter(|e| e.is("llm.call.completed"))
        .map(|e| e.payload["cost_micros"].as_u64())
        .collect();
    assert_eq!(costs, [Some(2000), Some(2000)]);
    assert!(!events.iter().any(|e| e.is("budget.exceeded")));
}

/// An asynchronous tool that hands each invocation to the test instead of an endpoint.
pub(crate) struct Watch(pub(crate) tokio::sync::mpsc::UnboundedSender<keel_agent::AsyncInvocation>);

#[async_trait::async_trait]
impl keel_agent::Tool for Watch {
    fn name(&self) -> &str {
        "watch"
    }
    fn description(&self) -> &str {
        "Watch a price; its moves arrive later as events."
    }
    fn parameters(&self) -> serde_json::Value {
        json!({"type": "object"})
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: &keel_agent::ToolContext,
    ) -> keel_core::AgentResult<serde_json::Value> {
        unreachable!("an asynchronous tool is dispatched, never called")
    }
    fn asynchronous(&self) -> Option<&dyn keel_agent::AsyncDispatch> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl keel_agent::AsyncDispatch for Watch {
    async fn dispatch(
        &self,
        invocation: &keel_agent::AsyncInvocation,
        _sender: &dyn keel_agent::InvocationSender,
    ) -> keel_core::AgentResult<()> {
        let _ = self.0.send(invocation.clone());
        Ok(())
    }
}

/// An executor whose model calls `watch` and then answers each wake; the invocation the
/// tool got, and the task that waits for it.
async fn watching(
    replies: &[&str],
) -> (AgentExecutor, AuthContext, Arc<MockLlm>, keel_agent::AsyncInvocation, Task) {
    let (tx, mut invocations) = tokio::sync::mpsc::unbounded_channel();
    let mut script = vec![MockResponse::ToolCalls(vec![ToolCall::new("watch", json!({}))])];
    script.extend(replies.iter().map(|r| MockResponse::Text((*r).into())));
    let llm = Arc::new(MockLlm::scripted(script));
    let agent = Agent::builder(card())
        .llm_shared(llm.clone())
        .tool(Watch(tx))
        .build()
        .unwrap();
    let (runtime, auth) = backend();
    let config = keel_agent::ExecutorConfig {
        callbacks: Some(keel_transport::callbacks::HttpCallbacks::shared("http://127.0.0.1:9")),
        ..keel_agent::ExecutorConfig::default()
    };
    let exec = AgentExecutor::with_config(agent, runtime, config);
    let options = SendOptions::in_background();
    let task = exec
        .send_message(&auth, Message::user("watch the price"), options)
        .await
        .unwrap();
    let invocation = invocations.recv().await.unwrap();
    keel_runtime::testing::eventually("the task to wait for its tool", || async {
        let task = exec.get_task(&auth, &task.id, None).await.unwrap();
        task.metadata.get("stop_reason") == Some(&json!("awaiting_tool"))
    })
    .await;
    (exec, auth, llm, invocation, task)
}

/// Wait until the thread's history holds the assistant's `reply`.
async fn replied(exec: &AgentExecutor, auth: &AuthContext, task: &Task, reply: &str) {
    keel_runtime::testing::eventually("the model's reply in the thread", || async {
        exec.thread(auth, task.thread_id.clone())
            .history()
            .await
            .unwrap()
            .iter()
            .any(|e| e.message.role == keel_llm::LlmRole::Assistant && e.message.content == reply)
    })
    .await;
}

/// How many user messages saying `text` the model was shown.
fn shown(request: &keel_llm::LlmRequest, text: &str) -> usize {
    request
        .messages
        .iter()
        .filter(|m| m.role == keel_llm::LlmRole::User && m.content.contains(text))
        .count()
}

#[tokio::test]
async fn a_subscription_event_wakes_the_model_and_a_progress_report_does_not() {
    let (exec, auth, llm, inv, task) = watching(&["noted: 42"]).await;

    // Progress first: it joins the task's log only, and queues nothing for the model.
    exec.deliver_tool_progress(&inv.call_id, &inv.callback_secret, json!("progress at 50%"))
        .await
        .unwrap();
    let accepted = exec
        .deliver_subscription_event(&inv.call_id, &inv.callback_secret, json!("the price moved to 42"))
        .await
        .unwrap();
    assert_eq!(accepted.task_id, task.id);
    assert_eq!(accepted.thread_id, task.thread_id);
    replied(&exec, &auth, &task, "noted: 42").await;

    // Two model calls: the one that called the tool, and the one the event woke, which saw the
    // event as a message and not the progress report.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    // Once: the turn the event started does not take its own queue item as new input.
    assert_eq!(shown(&requests[1], "the price moved to 42"), 1, "{:?}", requests[1]);
    assert!(!requests
        .iter()
        .any(|r| r.messages.iter().any(|m| m.content.contains("progress at 50%"))));
    // The waiting task still waits for its result: the event is input, not the result.
    let waiting = exec.get_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(waiting.state(), TaskState::Working);
}

#[tokio::test]
async fn subscription_events_follow_the_result_and_a_forged_one_is_refused() {
    let (exec, auth, llm, inv, task) = watching(&["watching", "moved to 7"]).await;
    let forged = exec
        .deliver_subscription_event(&inv.call_id, "not-the-secret", json!("forged"))
        .await;
    assert!(
        matches!(forged, Err(keel_agent::CallbackError::Forbidden { .. })),
        "{forged:?}"
    );
    let unknown = exec
        .deliver_subscription_event("no-such-call", &inv.callback_secret, json!("lost"))
        .await;
    assert!(
        matches!(unknown, Err(keel_agent::CallbackError::UnknownCall { .. })),
        "{unknown:?}"
    );

    // The subscription is acknowledged by its result; its events keep coming after it.
    exec.deliver_tool_result(&inv.call_id, &inv.callback_secret, json!("subscribed"), false)
        .await
        .unwrap();
    replied(&exec, &auth, &task, "watching").await;
    exec.deliver_subscription_event(&inv.call_id, &inv.callback_secret, json!({"price": 7}))
        .await
        .unwrap();
    replied(&exec, &auth, &task, "moved to 7").await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert_eq!(shown(&requests[2], r#"{"price":7}"#), 1, "{:?}", requests[2]);
    assert!(!requests
        .iter()
        .any(|r| shown(r, "forged") + shown(r, "lost") > 0));
}
