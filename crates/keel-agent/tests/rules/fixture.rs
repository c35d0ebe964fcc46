// What the rule files share: an executor on the backend's runtime, and the two ways a test
// sends a message (waiting for the task's answer, or returning at once while it runs).

use keel_agent::{Agent, AgentExecutor, SendOptions};
use keel_core::{Message, Task};
use keel_runtime::AuthContext;

/// An executor for `agent` on this backend's runtime, and the runtime's default caller.
pub(crate) fn executor(agent: Agent) -> (AgentExecutor, AuthContext) {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    (AgentExecutor::new(agent, runtime), auth)
}

/// Send `message` and wait for the task's answer.
pub(crate) async fn send(exec: &AgentExecutor, auth: &AuthContext, message: Message) -> Task {
    exec.send_message(auth, message, SendOptions::default())
        .await
        .unwrap()
}

/// Send `message` and return at once, while the task runs (or waits in its thread's queue).
pub(crate) async fn start(exec: &AgentExecutor, auth: &AuthContext, message: Message) -> Task {
    exec.send_message(
        auth,
        message,
        SendOptions {
            return_immediately: true,
            ..Default::default()
        },
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
