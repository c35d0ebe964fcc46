// Asynchronous tools (seed 004, RAP) with a real HTTP tool server on 127.0.0.1:0: dispatch
// and acknowledgement, the durable wait with no run held, callbacks (good, forged, unknown,
// duplicate, late), the order of a step's calls (decision 7) and timeouts.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use keel_agent::{
    Agent, AgentExecutor, AsyncHttpTool, AsyncInvocation, CallbackError, ExecutorConfig, FnTool,
    SendOptions,
};
use keel_core::{AgentCard, Message, Task, TaskState};
use keel_llm::{LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::{AuthContext, Runtime};
use serde_json::json;
use tokio::sync::mpsc;

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

fn executor(endpoint: &str, timeout: Option<Duration>, script: Vec<MockResponse>) -> (AgentExecutor, AuthContext) {
    let runtime: Arc<dyn Runtime> = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let mut render = AsyncHttpTool::new(
        "render",
        "Render something; the result arrives later.",
        json!({"type": "object"}),
        endpoint,
    );
    if let Some(timeout) = timeout {
        render = render.with_timeout(timeout);
    }
    let echo = FnTool::new("echo", "Echo", json!({"type": "object"}), |a, _| async move {
        Ok(a)
    });
    let agent = Agent::builder(AgentCard::new("rap", "async tools", "http://127.0.0.1:0"))
        .llm(MockLlm::scripted(script))
        .tool(render)
        .tool(echo)
        .build()
        .unwrap();
    let config = ExecutorConfig {
        callback_base_url: Some("http://127.0.0.1:9/keel".into()),
        ..ExecutorConfig::default()
    };
    (AgentExecutor::with_config(agent, runtime, config), auth)
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
        SendOptions {
            return_immediately: true,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

async fn wait_for(exec: &AgentExecutor, auth: &AuthContext, task: &Task, check: impl Fn(&Task) -> bool) -> Task {
    for _ in 0..500 {
        let current = exec.get_task(auth, &task.id, None).await.unwrap();
        if check(&current) {
            return current;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the task never got there");
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
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    let (exec, auth) = executor(&endpoint, None, script());
    let task = start(&exec, &auth).await;
    let inv = invocations.recv().await.unwrap();
    assert_eq!(inv.tool, "render");
    assert_eq!(inv.arguments, json!({"scene": 1}));
    assert_eq!(inv.group_id, task.thread_id.as_str());
    assert_eq!(inv.callback_url, format!("http://127.0.0.1:9/keel/callbacks/{}", inv.call_id));

    // The run ended without holding the thread: the task waits, working, and the later call
    // of the step has not run.
    let waiting = wait_for(&exec, &auth, &task, |t| {
        t.metadata.get("stop_reason") == Some(&json!("awaiting_tool"))
    })
    .await;
    assert_eq!(waiting.state(), TaskState::Working);
    assert!(!exec.is_running(&auth, &task.id));
    assert!(tool_results(&exec, &auth, &task).await.is_empty());

    // Forged and unknown callbacks change nothing.
    let forged = exec
        .deliver_tool_result(&auth, &inv.call_id, "not-the-secret", json!("x"), false)
        .await;
    assert!(matches!(forged, Err(CallbackError::Forbidden { .. })), "{forged:?}");
    let unknown = exec
        .deliver_tool_result(&auth, "no-such-call", &inv.callback_secret, json!("x"), false)
        .await;
    assert!(matches!(unknown, Err(CallbackError::UnknownCall { .. })), "{unknown:?}");
    assert!(tool_results(&exec, &auth, &task).await.is_empty());

    let delivered = exec
        .deliver_tool_result(&auth, &inv.call_id, &inv.callback_secret, json!({"video": "v.mp4"}), false)
        .await
        .unwrap();
    assert_eq!(delivered, task.id);
    let done = wait_for(&exec, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    let results = tool_results(&exec, &auth, &task).await;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("v.mp4"), "{results:?}");
    assert!(results[1].contains("render"), "{results:?}");

    let duplicate = exec
        .deliver_tool_result(&auth, &inv.call_id, &inv.callback_secret, json!("again"), false)
        .await;
    assert!(matches!(duplicate, Err(CallbackError::Duplicate { .. })), "{duplicate:?}");
}

#[tokio::test]
async fn a_pending_call_past_its_deadline_is_a_tool_error_and_a_late_callback_is_refused() {
    let (endpoint, mut invocations) = tool_server(StatusCode::OK).await;
    let (exec, auth) = executor(&endpoint, Some(Duration::from_millis(100)), script());
    let task = start(&exec, &auth).await;
    let inv = invocations.recv().await.unwrap();
    let done = wait_for(&exec, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    let results = tool_results(&exec, &auth, &task).await;
    assert!(results[0].contains("timed out"), "{results:?}");
    let late = exec
        .deliver_tool_result(&auth, &inv.call_id, &inv.callback_secret, json!("x"), false)
        .await;
    assert!(matches!(late, Err(CallbackError::Late { .. })), "{late:?}");
}

#[tokio::test]
async fn an_async_tool_that_does_not_acknowledge_is_a_tool_error_the_model_sees() {
    let (endpoint, _invocations) = tool_server(StatusCode::INTERNAL_SERVER_ERROR).await;
    let (exec, auth) = executor(&endpoint, None, script());
    let task = start(&exec, &auth).await;
    let done = wait_for(&exec, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    let results = tool_results(&exec, &auth, &task).await;
    assert!(results[0].contains("did not acknowledge"), "{results:?}");
    assert_eq!(results.len(), 2);
}

#[tokio::test]
async fn a_callback_is_handled_by_a_fresh_executor_after_the_first_one_stopped() {
    let (endpoint, mut invocations) = tool_server(StatusCode::ACCEPTED).await;
    let runtime: Arc<dyn Runtime> = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let build = |script: Vec<MockResponse>| {
        let render = AsyncHttpTool::new("render", "Render", json!({"type": "object"}), &endpoint);
        let agent = Agent::builder(AgentCard::new("rap", "async tools", "http://127.0.0.1:0"))
            .llm(MockLlm::scripted(script))
            .tool(render)
            .build()
            .unwrap();
        let config = ExecutorConfig {
            callback_base_url: Some("http://127.0.0.1:9".into()),
            ..ExecutorConfig::default()
        };
        AgentExecutor::with_config(agent, runtime.clone(), config)
    };
    let first = build(vec![MockResponse::ToolCalls(vec![ToolCall::new(
        "render",
        json!({}),
    )])]);
    let task = start(&first, &auth).await;
    let inv = invocations.recv().await.unwrap();
    wait_for(&first, &auth, &task, |t| {
        t.metadata.get("stop_reason") == Some(&json!("awaiting_tool"))
    })
    .await;
    first.shutdown().await;
    drop(first);

    let second = build(vec![MockResponse::Text("finished later".into())]);
    second
        .deliver_tool_result(&auth, &inv.call_id, &inv.callback_secret, json!("rendered"), false)
        .await
        .unwrap();
    let done = wait_for(&second, &auth, &task, |t| t.state().is_terminal()).await;
    assert_eq!(done.state(), TaskState::Completed);
    assert_eq!(done.status().message.as_ref().unwrap().text(), "finished later");
}
