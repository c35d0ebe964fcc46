//! Asynchronous tools (seed 004, RAP): tools that acknowledge a call at once and deliver the
//! result later through a callback, while the runtime holds no process open for them.
//!
//! When the model calls an asynchronous tool, the engine gives the call a fresh id, persists
//! it in the runtime's [`AsyncCallStore`](keel_runtime::AsyncCallStore) (tenant, thread, task,
//! a hash of a per-call secret, a deadline) and links the model's tool call to it in the
//! thread's key-value store (`keel:pending:<tool call id>`), dispatches the invocation, and
//! ends the run without holding the thread: the task stays `working` with
//! `stop_reason = awaiting_tool`. A callback goes through
//! [`AgentExecutor::deliver_tool_result`](crate::AgentExecutor::deliver_tool_result), which
//! finds the call by id alone (the secret is the credential, so any tenant's call can be
//! answered and no caller can name a tenant), checks the secret, moves the call from pending
//! to delivered with one compare-and-set in the store (so of concurrent duplicates exactly one
//! is accepted) and queues the task on its thread; the thread's worker appends the tool result
//! and the step goes on (decision 7: the later calls of that step run after it). A pending
//! call past its deadline ends as a tool error the model sees.
//!
//! Before its result, a call may report progress any number of times
//! ([`AgentExecutor::deliver_tool_progress`](crate::AgentExecutor::deliver_tool_progress)):
//! each report joins the task's log as a `working` status update whose message carries the
//! report as a data part (`metadata.status_kind = tool_progress`), so the task's stream and
//! push subscribers see it, and goes to the executor's event sinks as `tool.async.progress`
//! under the task's run. Progress changes nothing the model sees, and is refused once the
//! result is in.
//!
//! A call may also push subscription events, before or after its result
//! ([`AgentExecutor::deliver_subscription_event`](crate::AgentExecutor::deliver_subscription_event)):
//! each is queued durably on the call's thread as a user message, as any queued input is, and
//! wakes the model (seed 004: results, subscription events and user messages arrive through
//! one input channel).

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentError, AgentResult, TaskId, ThreadId};
use keel_llm::{LlmMessage, LlmRole};
use keel_runtime::AuthContext;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The header a callback carries its per-call secret in.
pub const CALLBACK_SECRET_HEADER: &str = "x-keel-callback-secret";

/// What an asynchronous tool's endpoint receives (RAP's invocation, plus the secret the
/// callback must present in [`CALLBACK_SECRET_HEADER`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AsyncInvocation {
    /// The tool's name.
    pub tool: String,
    /// The call's id, unique across threads and tenants; the callback URL names it. (The
    /// model's own id of the tool call stays inside the runtime.)
    pub call_id: String,
    /// The model's arguments, already checked against the tool's schema.
    pub arguments: Value,
    /// Where to POST the result.
    pub callback_url: String,
    /// Secret to present with the callback.
    pub callback_secret: String,
    /// The thread (RAP's `group_id`).
    pub group_id: String,
    /// The user, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

/// Where an asynchronous tool calls back: the URL a call's result is posted to. The engine
/// knows no HTTP route; keel-transport's `HttpCallbacks` names its own
/// (`{base}/callbacks/{call_id}`).
pub trait CallbackAddress: Send + Sync + fmt::Debug {
    /// The URL the tool posts the result of the call `call_id` to.
    fn callback_url(&self, call_id: &str) -> String;
}

/// What carries an invocation to an asynchronous tool's endpoint and waits for the
/// acknowledgement (keel-transport's `HttpCallbacks` POSTs it over HTTP).
#[async_trait]
pub trait InvocationSender: Send + Sync + fmt::Debug {
    /// Deliver `invocation` to `endpoint`; `Ok` when the endpoint acknowledged it, else why
    /// not, in words.
    async fn send(&self, endpoint: &str, invocation: &AsyncInvocation) -> Result<(), String>;
}

/// Both halves of asynchronous tools' transport, as
/// [`ExecutorConfig::callbacks`](crate::ExecutorConfig::callbacks) takes them.
pub trait CallbackDispatcher: CallbackAddress + InvocationSender {}

impl<T: CallbackAddress + InvocationSender> CallbackDispatcher for T {}

/// How an asynchronous tool sends an invocation out. The dispatch must only acknowledge:
/// the result comes back through the callback.
#[async_trait]
pub trait AsyncDispatch: Send + Sync {
    /// Send the invocation, with `sender` (the executor's, see
    /// [`ExecutorConfig::callbacks`](crate::ExecutorConfig::callbacks)) when it goes to an
    /// endpoint; `Ok` means the tool acknowledged it.
    async fn dispatch(
        &self,
        invocation: &AsyncInvocation,
        sender: &dyn InvocationSender,
    ) -> AgentResult<()>;
    /// How long to wait for the callback (else the executor's default).
    fn timeout(&self) -> Option<Duration> {
        None
    }
}

/// Why a callback was refused. Each refusal changes nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallbackError {
    /// No asynchronous call has this id.
    #[error("no asynchronous tool call `{call_id}` is pending")]
    UnknownCall {
        /// The call id.
        call_id: String,
    },
    /// The call timed out (or its task ended) before the result arrived.
    #[error("asynchronous tool call `{call_id}` is no longer waiting for a result")]
    Late {
        /// The call id.
        call_id: String,
    },
    /// The secret does not match the call's.
    #[error("wrong secret for asynchronous tool call `{call_id}`")]
    Forbidden {
        /// The call id.
        call_id: String,
    },
    /// The result was already delivered.
    #[error("asynchronous tool call `{call_id}` already has its result")]
    Duplicate {
        /// The call id.
        call_id: String,
    },
    /// Progress arrived after the call's result: a call reports progress only until its
    /// one result is in.
    #[error("asynchronous tool call `{call_id}` already has its result; progress comes before it")]
    AfterResult {
        /// The call id.
        call_id: String,
    },
    /// The store failed.
    #[error(transparent)]
    Agent(#[from] AgentError),
}

/// What an accepted callback reached: the call's tenant (found from the call, never from the
/// caller), its thread and its task.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedCallback {
    /// The tenant that owns the call.
    pub auth: AuthContext,
    /// The call's thread.
    pub thread_id: ThreadId,
    /// The task that waits for the result; it is queued on its thread.
    pub task_id: TaskId,
}

/// The engine's record of an asynchronous call, kept in the runtime's
/// [`AsyncCallStore`](keel_runtime::AsyncCallStore) under the call's id (its state is the
/// store's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PendingCall {
    pub(crate) task_id: TaskId,
    /// The model's id of the tool call, which the result answers in the history.
    pub(crate) tool_call_id: String,
    pub(crate) tool: String,
    pub(crate) secret_sha256: String,
    pub(crate) deadline: DateTime<Utc>,
    #[serde(default)]
    pub(crate) output: Option<Value>,
    #[serde(default)]
    pub(crate) is_error: bool,
}

/// Thread key linking a model's tool call to its asynchronous call's id. Model call ids are
/// only unique within a conversation (some models number them), so the callback names a
/// fresh id of Keel's instead.
pub(crate) fn link_key(tool_call_id: &str) -> String {
    format!("keel:pending:{tool_call_id}")
}

/// A fresh id for an asynchronous call, unique across tenants and threads.
pub(crate) fn new_call_id() -> String {
    format!("acall-{}", keel_core::RunId::new().as_str())
}

/// A fresh per-call secret (two UUIDs' worth of randomness).
pub(crate) fn new_secret() -> String {
    format!(
        "{}{}",
        keel_core::RunId::new().as_str().replace('-', ""),
        keel_core::TraceId::new().as_str().replace('-', "")
    )
}

/// The hex SHA-256 of a secret, as stored.
pub(crate) fn hash_secret(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compare two strings in time independent of where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The thread's history as the model is shown it. Providers require each tool call to be
/// answered right after the assistant message that made it, but an asynchronous call's result
/// can arrive after other messages (the user may write while it is pending). So a call with
/// no result right after its message gets a placeholder result saying the result will come
/// later, and a result that arrives after other messages is shown where it arrived, as a
/// user-role note naming the call. The stored history is left as it happened.
///
/// It takes the messages by value (the request's own copy, built once per step) and moves
/// them into the view rather than copying the history a second time.
pub(crate) fn model_view(history: Vec<LlmMessage>) -> Vec<LlmMessage> {
    if !reshaped(&history) {
        return history;
    }
    let mut view: Vec<LlmMessage> = Vec::with_capacity(history.len());
    // Calls whose results may still follow directly (the run of tool messages after them),
    // as (index in `view` of the assistant message, index of the call in it): the calls are
    // looked up where they are rather than copied.
    let mut open: Vec<(usize, usize)> = Vec::new();
    // Calls answered by a placeholder: their real result, when it comes, is a note.
    let mut deferred: HashSet<String> = HashSet::new();
    let close = |open: &mut Vec<(usize, usize)>,
                 view: &mut Vec<LlmMessage>,
                 deferred: &mut HashSet<String>| {
        for (at, index) in open.drain(..) {
            let call = &view[at].tool_calls[index];
            let placeholder = LlmMessage::tool_result(
                call,
                format!(
                    "`{}` is asynchronous: its result has not arrived yet and will be added \
                     to the conversation when it does",
                    call.name
                ),
            );
            deferred.insert(call.id.clone());
            view.push(placeholder);
        }
    };
    for message in history {
        if message.role == LlmRole::Tool {
            let id = message.tool_call_id.as_deref().unwrap_or_default();
            if let Some(at) = open
                .iter()
                .position(|&(at, index)| view[at].tool_calls[index].id == id)
            {
                open.remove(at);
                view.push(message);
                continue;
            }
            if deferred.remove(id) {
                let name = message.tool_name.as_deref().unwrap_or("tool");
                view.push(LlmMessage::user(format!(
                    "[result of the asynchronous tool call `{name}` ({id}), arrived now]\n{}",
                    message.content
                )));
                continue;
            }
            view.push(message);
            continue;
        }
        close(&mut open, &mut view, &mut deferred);
        if message.role == LlmRole::Assistant {
            let at = view.len();
            open.extend((0..message.tool_calls.len()).map(|index| (at, index)));
        }
        view.push(message);
    }
    // Calls still open at the end are the current step's: left as they are.
    view
}

/// Whether [`model_view`] changes anything: only when a message other than a tool result
/// follows a call still unanswered (a placeholder goes in, and its late result becomes a
/// note). The common history, every call answered at once, is used as it is.
pub(crate) fn reshaped(history: &[LlmMessage]) -> bool {
    let mut open: Vec<&str> = Vec::new();
    for message in history {
        if message.role == LlmRole::Tool {
            let id = message.tool_call_id.as_deref().unwrap_or_default();
            if let Some(at) = open.iter().position(|call| *call == id) {
                open.remove(at);
            }
            continue;
        }
        if !open.is_empty() {
            return true;
        }
        if message.role == LlmRole::Assistant {
            open.extend(message.tool_calls.iter().map(|call| call.id.as_str()));
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_llm::ToolCall;
    use serde_json::json;

    #[test]
    fn a_result_arriving_after_other_messages_is_a_note_and_its_call_gets_a_placeholder() {
        let call = ToolCall::new("render", json!({}));
        let history = vec![
            LlmMessage::user("render it"),
            LlmMessage::assistant("", vec![call.clone()]),
            LlmMessage::user("are you there?"),
            LlmMessage::assistant("still rendering", vec![]),
            LlmMessage::tool_result(&call, "v.mp4"),
        ];
        assert!(reshaped(&history));
        let view = model_view(history);
        let roles: Vec<LlmRole> = view.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                LlmRole::User,
                LlmRole::Assistant,
                LlmRole::Tool,
                LlmRole::User,
                LlmRole::Assistant,
                LlmRole::User
            ]
        );
        assert_eq!(view[2].tool_call_id.as_deref(), Some(call.id.as_str()));
        assert!(view[2].content.contains("not arrived yet"));
        assert!(view[5].content.contains("v.mp4") && view[5].content.contains(&call.id));
    }

    #[test]
    fn results_right_after_their_calls_are_shown_as_they_are() {
        let (a, b) = (ToolCall::new("a", json!({})), ToolCall::new("b", json!({})));
        let history = vec![
            LlmMessage::user("go"),
            LlmMessage::assistant("", vec![a.clone(), b.clone()]),
            LlmMessage::tool_result(&a, "1"),
            LlmMessage::tool_result(&b, "2"),
            LlmMessage::assistant("done", vec![]),
        ];
        // Nothing to reshape: the history is used as it is, not rebuilt.
        assert!(!reshaped(&history));
        assert_eq!(model_view(history.clone()), history);
        // The current step's unanswered calls stay open (the step is still running them).
        let open = &history[..3];
        assert_eq!(model_view(open.to_vec()), open.to_vec());
    }
}
