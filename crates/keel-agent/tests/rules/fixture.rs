// What the rule files share: an executor on the backend's runtime (for a built agent, or for
// one over a scripted model), the common model script and the gate tool, and the ways a test
// sends a message (waiting for the task's answer, or returning at once while it runs).

use std::sync::Arc;

use keel_agent::{Agent, AgentBuilder, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, Message, Task};
use keel_llm::{MockLlm, MockResponse};
use keel_runtime::AuthContext;
use tokio::sync::Notify;

/// This backend's runtime, fresh for the test, and its default caller.
pub(crate) fn backend() -> (Arc<dyn keel_runtime::Runtime>, AuthContext) {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    (runtime, auth)
}

/// An executor for `agent` on this backend's runtime, and the runtime's default caller.
pub(crate) fn executor(agent: Agent) -> (AgentExecutor, AuthContext) {
    let (runtime, auth) = backend();
    (AgentExecutor::new(agent, runtime), auth)
}

/// An executor for an agent of `card` whose model follows `script`, as `configure` finishes
/// building it; the caller; and the model, shared so the test can read what it was sent.
pub(crate) fn scripted(
    card: AgentCard,
    script: Vec<MockResponse>,
    configure: impl FnOnce(AgentBuilder) -> AgentBuilder,
) -> (AgentExecutor, AuthContext, Arc<MockLlm>) {
    let llm = Arc::new(MockLlm::scripted(script));
    let agent = configure(Agent::builder(card).llm_shared(llm.clone()))
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    (exec, auth, llm)
}

/// A model's script: one call of `tool` with `args`, then the answer `text`.
pub(crate) fn call_then_answer(tool: &str, args: serde_json::Value, text: &str) -> Vec<MockResponse> {
    vec![
        MockResponse::ToolCalls(vec![keel_llm::ToolCall::new(tool, args)]),
        MockResponse::Text(text.into()),
    ]
}

/// A tool named `name` whose arguments are any JSON object, as most rule tests' tools take,
/// that answers as `run` does.
pub(crate) fn object_tool<F, Fut>(name: &str, description: &str, run: F) -> FnTool
where
    F: Fn(serde_json::Value, keel_agent::ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = keel_core::AgentResult<serde_json::Value>> + Send + 'static,
{
    FnTool::new(name, description, serde_json::json!({"type": "object"}), run)
}

/// A tool (`echo`) that answers with its arguments.
pub(crate) fn echo_tool() -> FnTool {
    object_tool("echo", "Echo the input", |args, _| async move { Ok(args) })
}

/// A tool (`gate`) that announces it started, then waits for `release` (a run canceled while
/// it waits ends the wait).
pub(crate) fn gate_tool(started: Arc<Notify>, release: Arc<Notify>) -> FnTool {
    object_tool("gate", "Wait for the test", move |_a, _c| {
        let (started, release) = (started.clone(), release.clone());
        async move {
            started.notify_one();
            release.notified().await;
            Ok(serde_json::json!("released"))
        }
    })
}

/// Send `message` and wait for the task's answer, or the error that refused it.
pub(crate) async fn try_send(
    exec: &AgentExecutor,
    auth: &AuthContext,
    message: Message,
) -> keel_core::AgentResult<Task> {
    exec.send_message(auth, message, SendOptions::default()).await
}

/// Send `message` and wait for the task's answer.
pub(crate) async fn send(exec: &AgentExecutor, auth: &AuthContext, message: Message) -> Task {
    try_send(exec, auth, message).await.unwrap()
}

/// Send `message` and return at once, while the task runs (or waits in its thread's queue).
pub(crate) async fn start(exec: &AgentExecutor, auth: &AuthContext, message: Message) -> Task {
    exec.send_message(
        auth,
        message,
        SendOptions::in_background(),
    )
    .await
    .unwrap()
}

/// Send `text` on `thread` and wait for the task's answer.
pub(crate) async fn send_in(
    exec: &AgentExecutor,
    auth: &AuthContext,
    thread: &keel_core::ThreadId,
    text: &str,
) -> Task {
    send(exec, auth, Message::user(text).in_thread(thread.clone())).await
}

/// Everything `thread`'s store holds of its history, oldest first.
pub(crate) async fn stored_history(
    exec: &AgentExecutor,
    auth: &AuthContext,
    thread: &keel_core::ThreadId,
) -> Vec<keel_runtime::HistoryEntry> {
    exec.runtime()
        .thread_store()
        .read_history(auth, thread, 0, usize::MAX)
        .await
        .unwrap()
}

/// `child` registered as `name`, a running subagent of kind `agent`, under `parent`.
pub(crate) async fn register_running_child(
    runtime: &dyn keel_runtime::Runtime,
    auth: &AuthContext,
    child: &keel_core::ThreadId,
    parent: &keel_core::ThreadId,
    name: &str,
    agent: &str,
) {
    let child = keel_runtime::ChildThread::running(child.clone(), parent.clone(), name, agent);
    runtime
        .thread_store()
        .register_child(auth, &child)
        .await
        .unwrap();
}

/// `bytes` attached to `state`'s thread as `name`, of `media_type` when given.
pub(crate) async fn attach(
    state: &keel_agent::ThreadState,
    name: &str,
    media_type: Option<&str>,
    bytes: &[u8],
) -> keel_core::FileContent {
    state.put_attachment(name, media_type, bytes).await.unwrap()
}
