// Asynchronous tools (seed 004, RAP) with a real HTTP tool server on 127.0.0.1:0: dispatch
// and acknowledgement, the durable wait with no run held, callbacks (good, forged, unknown,
// duplicate, late), the order of a step's calls (decision 7) and timeouts.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use keel_agent::{
    Agent, AgentExecutor, AsyncHttpTool, AsyncInvocation, CallbackError, ExecutorConfig,
    SendOptions,
};
use keel_core::{AgentCard, AgentError, Message, Task, TaskState};
use keel_llm::{LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::{AuthContext, Runtime};
use serde_json::json;
use tokio::sync::mpsc;
use super::fixture::{echo_tool, send_in};

/// A tool server that answers every invocation with `status` and hands it to the test.
async fn tool_server(status: StatusCode) -> (String, mpsc::UnboundedReceiver<AsyncInvocation>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/invoke",
        axum::routing::post(move |axum::Json(inv): axum::Json<AsyncInvocation>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(inv);
                status
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/invoke", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

/// An executor on this backend's runtime of the async-tools agent (see [`executor_on`]) whose
/// model follows `script`, and the runtime's caller.
fn executor(endpoint: &str, timeout: Option<Duration>, script: Vec<MockResponse>) -> (AgentExecutor, AuthContext) {
    let runtime: Arc<dyn Runtime> = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let llm = Arc::new(MockLlm::scripted(script));
    (executor_on(runtime, endpoint, timeout, llm), auth)
}

/// An executor on `runtime` of the async-tools agent: `render` is POSTed to `endpoint` (and
/// times out after `timeout`), `echo` answers at once, `llm` is the model, and callbacks are
/// addressed under `http://127.0.0.1:9/keel`.
fn executor_on(runtime: Arc<dyn Runtime>, endpoint: &str, timeout: Option<Duration>, llm: Arc<MockLlm>) -> AgentExecutor {
    let mut render = AsyncHttpTool::new(
        "render",
        "Render something; the result arrives later.",
        json!({"type": "object"}),
        endpoint,
    );
    if let Some(timeout) = timeout {
        render = render.with_timeout(timeout);
    }
    let agent = Agent::builder(AgentCard::new("rap", "async tools", "http://127.0.0.1:0"))
        .llm_shared(llm)
        .tool(render)
        .tool(echo_tool())
        .build()
        .unwrap();
    let config = ExecutorConfig {
        callbacks: Some(keel_transport::callbacks::HttpCallbacks::shared("http://127.0.0.1:9/keel")),
        ..ExecutorConfig::default()
    };
    AgentExecutor::with_config(agent, runtime, config)
}

fn script() -> Vec<MockResponse> {
    vec![
        MockResponse::ToolCalls(vec![
            ToolCall::new("render", json!({"scene": 1})),
            ToolCall::new("echo", json!({"after": "render"})),
        ]),
        MockResponse::Text("done".into()),
    ]
}

async fn start(exec: &AgentExecutor, auth: &AuthContext) -> Task {
    exec.send_message(
        auth,
        Message::user("go"),
        SendOptions::in_background(),
    )
    .await
    .unwrap()
}

/// The default script's task, started on an agent whose `render` tool server acknowledges
/// with `status` (and whose calls time out after `timeout`): the executor, its caller, the
/// task, and the invocations the tool server receives.
async fn started(
    status: StatusCode,
    timeout: Option<Duration>,
) -> (AgentExecutor, AuthContext, Task, mpsc::UnboundedReceiver<AsyncInvocation>) {
    let (endpoint, invocations) = tool_server(status).await;
    let (exec, auth) = executor(&endpoint, timeout, script());
    let task = start(&exec, &auth).await;
    (exec, auth, task, invocations)
}

async fn wait_for(exec: &AgentExecutor, auth: &AuthContext, task: &Task, check: impl Fn(&Task) -> bool) -> Task {
    keel_runtime::testing::eventually("the task to get there", || async {
        let current = exec.get_task(auth, &task.id, None).await.unwrap();
        check(&current).then_some(current)
    })
    .await
}

/// Whether `task` rests, waiting for its asynchronous tool's result.
fn awaiting_tool(task: &Task) -> bool {
    task.metadata.get("stop_reason") == Some(&json!("awaiting_tool"))
}

/// Deliver `output` as the result of the invocation `inv`, with its own secret.
async fn deliver(
    exec: &AgentExecutor,
    inv: &AsyncInvocation,
    output: serde_json::Value,
) -> Result<keel_agent::AcceptedCallback, CallbackError> {
    exec.deliver_tool_result(&inv.call_id, &inv.callback_secret, output, false)
        .await
}

/// Wait until `task` ends, assert that it completed, and give back the tool results its
/// thread holds.
async fn results_once_completed(exec: &AgentExecutor, auth: &AuthContext, task: &Task) -> Vec<String> {
    let done = wait_for(exec, auth, task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed, "{done:?}");
    tool_results(exec, auth, task).await
}

async fn tool_results(exec: &AgentExecutor, auth: &AuthContext, task: &Task) -> Vec<String> {
    exec.thread(auth, task.thread_id.clone())
        .history()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.message.role == LlmRole::Tool)
        .map(|e| e.message.content)
        .collect()
}

#[tokio::test]
async fn an_async_tool_result_arrives_by_callback_and_the_step_goes_on_in_order() {
    let (exec, auth, task, mut invocations) = started(StatusCode::ACCEPTED, None).await;
    let inv = invocations.recv().await.unwrap();
    assert_eq!(inv.tool, "render");
    assert_eq!(inv.arguments, json!({"scene": 1}));
    assert_eq!(inv.group_id, task.thread_id.as_str());
    assert_eq!(inv.callback_url, format!("http://127.0.0.1:9/keel/callbacks/{}", inv.call_id));

    // The run ended without holding the thread: the task waits, working, and the later call
    // of the step has not run.
    let waiting = wait_for(&exec, &auth, &task, awaiting_tool).await;
    assert_eq!(waiting.state(), TaskState::Working);
    // The run saves the task before it leaves the registry of running tasks: wait for that.
    keel_runtime::testing::eventually("the run to let go of the task", || async {
        !exec.is_running(&auth, &task.id)
    })
    .await;
    assert!(tool_results(&exec, &auth, &task).await.is_empty());

    // Forged and unknown callbacks change nothing.
    let forged = exec
        .deliver_tool_result(&inv.call_id, "not-the-secret", json!("x"), false)
        .await;
    assert!(matches!(forged, Err(CallbackError::Forbidden { .. })), "{forged:?}");
    let unknown = exec
        .deliver_tool_result("no-such-call", &inv.callback_secret, json!("x"), false)
        .await;
    assert!(matches!(unknown, Err(CallbackError::UnknownCall { .. })), "{unknown:?}");
    assert!(tool_results(&exec, &auth, &task).await.is_empty());

    let delivered = deliver(&exec, &inv, json!({"video": "v.mp4"})).await
        .unwrap();
    assert_eq!(delivered.task_id, task.id);
    assert_eq!(delivered.auth, auth);
    assert_eq!(delivered.thread_id, task.thread_id);
    let results = results_once_completed(&exec, &auth, &task).await;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("v.mp4"), "{results:?}");
    assert!(results[1].contains("render"), "{results:?}");

    let duplicate = deliver(&exec, &inv, json!("again")).await;
    assert!(matches!(duplicate, Err(CallbackError::Duplicate { .. })), "{duplicate:?}");
}

#[tokio::test]
async fn a_pending_call_past_its_deadline_is_a_tool_error_and_a_late_callback_is_refused() {
    let (exec, auth, task, mut invocations) = started(StatusCode::OK, Some(Duration::from_millis(100))).await;
    let inv = invocations.recv().await.unwrap();
    let results = results_once_completed(&exec, &auth, &task).await;
    assert!(results[0].contains("timed out"), "{results:?}");
    let late = deliver(&exec, &inv, json!("x")).await;
    assert!(matches!(late, Err(CallbackError::Late { .. })), "{late:?}");
}

#[tokio::test]
async fn an_async_tool_that_does_not_acknowledge_is_a_tool_error_the_model_sees() {
    let (exec, auth, task, _invocations) = started(StatusCode::INTERNAL_SERVER_ERROR, None).await;
    let results = results_once_completed(&exec, &auth, &task).await;
    assert!(results[0].contains("did not acknowledge"), "{results:?}");
    assert_eq!(results.len(), 2);
}

#[tokio::test]
async fn a_callback_is_handled_by_a_fresh_executor_after_the_first_one_stopped() {
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    let runtime: Arc<dyn Runtime> = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let build = |script: Vec<MockResponse>| {
        executor_on(runtime.clone(), &endpoint, None, Arc::new(MockLlm::scripted(script)))
    };
    let first = build(vec![MockResponse::ToolCalls(vec![ToolCall::new(
        "render",
        json!({}),
    )])]);
    let task = start(&first, &auth).await;
    let inv = invocations.recv().await.unwrap();
    wait_for(&first, &auth, &task, awaiting_tool).await;
    first.shutdown().await;
    drop(first);

    let second = build(vec![MockResponse::Text("finished later".into())]);
    deliver(&second, &inv, json!("rendered")).await
        .unwrap();
    let done = wait_for(&second, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    assert_eq!(done.status().message.as_ref().unwrap().text(), "finished later");
}

#[tokio::test]
async fn a_task_of_any_tenant_is_resumed_by_its_callback_found_by_call_id_alone() {
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    let (exec, default) = executor(&endpoint, None, script());
    let tenant = AuthContext::new("acme", "bob");
    assert_ne!(tenant, default);
    let task = start(&exec, &tenant).await;
    let inv = invocations.recv().await.unwrap();
    assert_eq!(inv.user_id.as_deref(), Some("bob"));
    wait_for(&exec, &tenant, &task, awaiting_tool).await;

    // A wrong secret for this very call: refused, the task keeps waiting with no result.
    let forged = exec
        .deliver_tool_result(&inv.call_id, "not-the-secret", json!("forged"), false)
        .await;
    assert!(matches!(forged, Err(CallbackError::Forbidden { .. })), "{forged:?}");
    assert!(tool_results(&exec, &tenant, &task).await.is_empty());
    let still = exec.get_task(&tenant, &task.id, None).await.unwrap();
    assert_eq!(still.state(), TaskState::Working);

    let accepted = deliver(&exec, &inv, json!("rendered")).await
        .unwrap();
    assert_eq!(accepted.auth, tenant, "the call's own tenant, not the default one");
    let done = wait_for(&exec, &tenant, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    assert!(tool_results(&exec, &tenant, &task).await[0].contains("rendered"));
    // Nothing of it is visible in the default tenant.
    let err = exec.get_task(&default, &task.id, None).await.unwrap_err();
    assert!(matches!(err, AgentError::TaskNotFound { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn of_concurrent_duplicate_callbacks_exactly_one_is_accepted_and_persisted_once() {
    let (exec, auth, task, mut invocations) = started(StatusCode::ACCEPTED, None).await;
    let inv = invocations.recv().await.unwrap();
    wait_for(&exec, &auth, &task, awaiting_tool).await;
    let attempts: Vec<_> = (0..8)
        .map(|i| {
            let (exec, inv) = (exec.clone(), inv.clone());
            tokio::spawn(async move {
                deliver(&exec, &inv, json!({"attempt": i})).await
                    .map(|_| i)
            })
        })
        .collect();
    let mut accepted = Vec::new();
    for attempt in attempts {
        match attempt.await.unwrap() {
            Ok(i) => accepted.push(i),
            Err(CallbackError::Duplicate { .. }) => {}
            Err(other) => panic!("a losing duplicate must be Duplicate, got {other:?}"),
        }
    }
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    let results = results_once_completed(&exec, &auth, &task).await;
    assert_eq!(results.len(), 2, "one render result and the echo: {results:?}");
    assert!(results[0].contains(&format!("\"attempt\":{}", accepted[0])), "{results:?}");
}

#[tokio::test]
async fn threads_whose_model_numbers_calls_alike_get_distinct_async_calls() {
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    // Some models number calls per conversation: both threads' calls are `call_0`.
    let numbered = || {
        MockResponse::ToolCalls(vec![ToolCall {
            id: "call_0".into(),
            name: "render".into(),
            arguments: json!({}),
        }])
    };
    let script = vec![
        numbered(),
        numbered(),
        MockResponse::Text("done".into()),
        MockResponse::Text("done".into()),
    ];
    let (exec, auth) = executor(&endpoint, None, script);
    let first = start(&exec, &auth).await;
    let first_inv = invocations.recv().await.unwrap();
    wait_for(&exec, &auth, &first, awaiting_tool).await;
    let second = start(&exec, &auth).await;
    let second_inv = invocations.recv().await.unwrap();
    wait_for(&exec, &auth, &second, awaiting_tool).await;
    assert_ne!(first.thread_id, second.thread_id);
    assert_ne!(first_inv.call_id, second_inv.call_id);
    assert_ne!(first_inv.call_id, "call_0");
    deliver(&exec, &second_inv, json!("two")).await
        .unwrap();
    wait_for(&exec, &auth, &second, |t| t.state().is_terminal()).await;
    deliver(&exec, &first_inv, json!("one")).await
        .unwrap();
    for (task, result) in [(&first, "one"), (&second, "two")] {
        let done = wait_for(&exec, &auth, task, |t| t.state().is_terminal()).await;
        assert_eq!(done.state(), TaskState::Completed);
        assert_eq!(tool_results(&exec, &auth, task).await, vec![result.to_owned()]);
    }
}

#[tokio::test]
async fn dispatch_acknowledgement_callback_and_timeout_are_in_the_event_stream() {
    use keel_events::InMemoryEventSink;
    let kinds = |sink: &InMemoryEventSink| -> Vec<String> {
        sink.events()
            .iter()
            .map(|e| e.event_type.as_str().to_owned())
            .filter(|t| t.starts_with("tool.async."))
            .collect()
    };
    let payload = |sink: &InMemoryEventSink, kind: &str| {
        let event = sink.events().into_iter().find(|e| e.event_type.as_str() == kind);
        event.expect("the event was emitted").payload
    };
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    let (exec, auth) = executor(&endpoint, None, script());
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let task = start(&exec, &auth).await;
    let inv = invocations.recv().await.unwrap();
    wait_for(&exec, &auth, &task, awaiting_tool).await;
    assert_eq!(kinds(&sink), ["tool.async.dispatched", "tool.async.acknowledged"]);
    let dispatched = payload(&sink, "tool.async.dispatched");
    assert_eq!(dispatched["call_id"], json!(inv.call_id));
    assert_eq!(dispatched["tool"], json!("render"));
    deliver(&exec, &inv, json!("ok")).await
        .unwrap();
    wait_for(&exec, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(
        kinds(&sink),
        ["tool.async.dispatched", "tool.async.acknowledged", "tool.async.result"]
    );
    let result = payload(&sink, "tool.async.result");
    assert_eq!(result["call_id"], json!(inv.call_id));
    assert_eq!(result["is_error"], json!(false));

    // A call whose deadline passes: the timeout is an event too.
    let (endpoint, _invocations) = tool_server(StatusCode::ACCEPTED).await;
    let (exec, auth) = executor(&endpoint, Some(Duration::from_millis(100)), script());
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let task = start(&exec, &auth).await;
    wait_for(&exec, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(
        kinds(&sink),
        ["tool.async.dispatched", "tool.async.acknowledged", "tool.async.timed_out"]
    );
}

#[tokio::test]
async fn a_user_message_while_a_result_is_pending_is_answered_and_the_model_sees_both_in_order() {
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    let runtime: Arc<dyn Runtime> = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("render", json!({}))]),
        MockResponse::Text("still rendering; noted".into()),
        MockResponse::Text("rendered, and you asked meanwhile".into()),
    ]));
    let exec = executor_on(runtime, &endpoint, None, llm.clone());
    let first = start(&exec, &auth).await;
    let inv = invocations.recv().await.unwrap();
    wait_for(&exec, &auth, &first, awaiting_tool).await;

    // The user writes while the result is pending: answered at once, in the same thread.
    let meanwhile = send_in(&exec, &auth, &first.thread_id, "are you there?").await;
    let meanwhile = wait_for(&exec, &auth, &meanwhile, |t| t.state().is_terminal()).await;
    assert_eq!(meanwhile.state(), TaskState::Completed);
    assert_eq!(
        meanwhile.status().message.as_ref().unwrap().text(),
        "still rendering; noted"
    );

    deliver(&exec, &inv, json!("v.mp4")).await
        .unwrap();
    let done = wait_for(&exec, &auth, &first, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);

    // The last model call saw the user's message and then the tool's result, in that order,
    // in a shape every provider accepts: the call answered at once by a placeholder, the
    // result a note where it arrived.
    let requests = llm.requests();
    let last = &requests.last().unwrap().messages;
    let call_at = last
        .iter()
        .position(|m| !m.tool_calls.is_empty())
        .expect("the tool call");
    assert_eq!(last[call_at + 1].role, LlmRole::Tool, "{last:?}");
    assert!(last[call_at + 1].content.contains("not arrived yet"), "{last:?}");
    let asked = last
        .iter()
        .position(|m| m.role == LlmRole::User && m.content == "are you there?")
        .expect("the user's message");
    let result = last
        .iter()
        .position(|m| m.role == LlmRole::User && m.content.contains("v.mp4"))
        .expect("the tool result");
    assert!(call_at < asked && asked < result, "{last:?}");
    // The meanwhile turn's model call had the placeholder too.
    let middle = &requests[1].messages;
    let call_at = middle.iter().position(|m| !m.tool_calls.is_empty()).unwrap();
    assert_eq!(middle[call_at + 1].role, LlmRole::Tool, "{middle:?}");
}

#[tokio::test]
async fn a_retried_callback_requeues_a_task_whose_accepting_process_died_before_queuing_it() {
    let (exec, auth, task, mut invocations) = started(StatusCode::ACCEPTED, None).await;
    let inv = invocations.recv().await.unwrap();
    wait_for(&exec, &auth, &task, awaiting_tool).await;
    // As if a process accepted the result (the store moved the call) and died before it
    // queued the task.
    let calls = exec.runtime().async_call_store();
    let call = calls.find_async_call(&inv.call_id).await.unwrap().unwrap();
    let mut record = call.record.clone();
    record["output"] = json!("accepted before the crash");
    assert!(calls
        .transition_async_call(
            &call.auth,
            &inv.call_id,
            keel_runtime::AsyncCallState::Pending,
            keel_runtime::AsyncCallState::Delivered,
            record,
        )
        .await
        .unwrap());

    // The tool retries: it is told the result is already there, and the task goes on.
    let retry = deliver(&exec, &inv, json!("retry")).await;
    assert!(matches!(retry, Err(CallbackError::Duplicate { .. })), "{retry:?}");
    let done = wait_for(&exec, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    assert!(tool_results(&exec, &auth, &task).await[0].contains("accepted before the crash"));
}
