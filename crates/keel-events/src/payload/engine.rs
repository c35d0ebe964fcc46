//! The thread engine's own markers: asynchronous tool calls, the thread queue, what a step
//! persisted, and why a run stopped.

use chrono::{DateTime, Utc};
use keel_core::TaskState;
use serde::{Deserialize, Serialize};

use crate::{summary, EventType, RunEvent, RunEventBuilder};

impl EventType {
    /// An asynchronous tool call was handed to its dispatcher.
    pub const TOOL_ASYNC_DISPATCHED: EventType = EventType::known("tool.async.dispatched");
    /// The dispatcher acknowledged an asynchronous tool call.
    pub const TOOL_ASYNC_ACKNOWLEDGED: EventType = EventType::known("tool.async.acknowledged");
    /// An asynchronous tool called back with its result.
    pub const TOOL_ASYNC_RESULT: EventType = EventType::known("tool.async.result");
    /// An asynchronous tool reported progress before its result.
    pub const TOOL_ASYNC_PROGRESS: EventType = EventType::known("tool.async.progress");
    /// No result of an asynchronous tool arrived by its deadline.
    pub const TOOL_ASYNC_TIMED_OUT: EventType = EventType::known("tool.async.timed_out");
    /// Queued work was injected into the run before a model call.
    pub const QUEUE_INJECTED: EventType = EventType::known("queue.injected");
    /// The thread queue held nothing more to inject.
    pub const QUEUE_DRAINED: EventType = EventType::known("queue.drained");
    /// The model's message was persisted to the thread history.
    pub const MESSAGE_PERSISTED: EventType = EventType::known("message.persisted");
    /// A tool's result was persisted to the thread history.
    pub const TOOL_RESULT_PERSISTED: EventType = EventType::known("tool_result.persisted");
    /// The run stopped, and why.
    pub const RUN_STOPPED: EventType = EventType::known("run.stopped");
    /// A step's stop rules were evaluated.
    pub const STOP_EVALUATED: EventType = EventType::known("stop.evaluated");
    /// The run's thread was terminated (soft shutdown); the run ends canceled.
    pub const THREAD_TERMINATED: EventType = EventType::known("thread.terminated");
    /// The thread's history was compacted before a model call, because the context would
    /// not fit the model's window.
    pub const CONTEXT_COMPACTED: EventType = EventType::known("context.compacted");
}

/// `tool.async.progress`: one progress report of an asynchronous tool, before its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolAsyncProgressPayload {
    /// The asynchronous call.
    pub call_id: String,
    /// The model's tool call it answers.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
    /// What the tool reported, as it sent it.
    pub progress: serde_json::Value,
}

/// `thread.terminated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadTerminatedPayload {
    /// The thread that was terminated.
    pub thread_id: keel_core::ThreadId,
    /// When it was terminated, when the engine knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated_at: Option<DateTime<Utc>>,
}

/// `context.compacted`: what automatic compaction did to the history the model sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextCompactedPayload {
    /// The strategy that ran (`recent`, `tokens`, `summary`).
    pub strategy: String,
    /// Estimated tokens of the whole request (system prompt, history, tools) before.
    pub before_tokens: u64,
    /// The same estimate after compaction.
    pub after_tokens: u64,
    /// History messages before.
    pub before_messages: usize,
    /// History messages after (a summary counts as one).
    pub after_messages: usize,
    /// The model's context window that was exceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Whether the model wrote a summary of what was removed.
    #[serde(default)]
    pub summary_created: bool,
}

/// `tool.async.dispatched` and `tool.async.timed_out`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolAsyncDeadlinePayload {
    /// The asynchronous call.
    pub call_id: String,
    /// The model's tool call it answers.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
    /// When the call times out.
    pub deadline: DateTime<Utc>,
}

/// `tool.async.acknowledged`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolAsyncAcknowledgedPayload {
    /// The asynchronous call.
    pub call_id: String,
    /// The model's tool call it answers.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
}

/// `tool.async.result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolAsyncResultPayload {
    /// The asynchronous call.
    pub call_id: String,
    /// The model's tool call it answers.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
    /// Whether the tool reported an error.
    pub is_error: bool,
}

/// `queue.injected`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueInjectedPayload {
    /// The ids of the queue items injected.
    pub items: Vec<String>,
}

/// `message.persisted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePersistedPayload {
    /// The message's role (`assistant`).
    pub role: String,
    /// How many tool calls it carries.
    pub tool_calls: usize,
}

/// `tool_result.persisted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResultPersistedPayload {
    /// The model's tool call answered.
    pub call_id: String,
    /// Whether the result is an error.
    pub is_error: bool,
    /// The tool's name.
    pub tool: String,
}

/// `run.stopped`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStoppedPayload {
    /// The task's stop reason (`awaiting_tool`, `response`, `canceled`, ...).
    pub reason: String,
    /// The asynchronous call awaited, when the reason is `awaiting_tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The task's state when the run stopped.
    pub state: TaskState,
}

/// `stop.evaluated`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopEvaluatedPayload {
    /// The stop rule that fired (`response`, `stop_tool`, ...), or `null` when none did.
    #[serde(default)]
    pub stop: Option<String>,
}

/// The start of an asynchronous tool's event: its summary names the tool and what happened
/// to the call ("asynchronous tool `fetch` dispatched"), the same wording for every step.
fn tool_async(kind: EventType, tool: &str, what: &str) -> RunEventBuilder {
    RunEvent::builder(kind, format!("asynchronous tool `{tool}` {what}"))
}

impl RunEvent {
    /// `tool.async.dispatched`.
    pub fn tool_async_dispatched(payload: ToolAsyncDeadlinePayload) -> RunEventBuilder {
        tool_async(
            EventType::TOOL_ASYNC_DISPATCHED,
            &payload.tool,
            "dispatched",
        )
        .payload_from(payload)
    }

    /// `tool.async.acknowledged`.
    pub fn tool_async_acknowledged(payload: ToolAsyncAcknowledgedPayload) -> RunEventBuilder {
        tool_async(
            EventType::TOOL_ASYNC_ACKNOWLEDGED,
            &payload.tool,
            "acknowledged",
        )
        .payload_from(payload)
    }

    /// `tool.async.result`.
    pub fn tool_async_result(payload: ToolAsyncResultPayload) -> RunEventBuilder {
        tool_async(EventType::TOOL_ASYNC_RESULT, &payload.tool, "called back").payload_from(payload)
    }

    /// `tool.async.progress`.
    pub fn tool_async_progress(payload: ToolAsyncProgressPayload) -> RunEventBuilder {
        tool_async(
            EventType::TOOL_ASYNC_PROGRESS,
            &payload.tool,
            "reported progress",
        )
        .payload_from(payload)
    }

    /// `thread.terminated`.
    pub fn thread_terminated(payload: ThreadTerminatedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::THREAD_TERMINATED,
            format!("thread {} terminated", payload.thread_id),
        )
        .severity(crate::Severity::Warning)
        .payload_from(payload)
    }

    /// `tool.async.timed_out`.
    pub fn tool_async_timed_out(payload: ToolAsyncDeadlinePayload) -> RunEventBuilder {
        tool_async(EventType::TOOL_ASYNC_TIMED_OUT, &payload.tool, "timed out")
            .payload_from(payload)
    }

    /// `queue.injected`.
    pub fn queue_injected(payload: QueueInjectedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::QUEUE_INJECTED,
            format!("{} queued item(s) injected", payload.items.len()),
        )
        .payload_from(payload)
    }

    /// `queue.drained`, with an empty payload.
    pub fn queue_drained() -> RunEventBuilder {
        RunEvent::builder(EventType::QUEUE_DRAINED, summary::QUEUE_DRAINED)
    }

    /// `message.persisted`.
    pub fn message_persisted(payload: MessagePersistedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::MESSAGE_PERSISTED,
            summary::message_persisted(&payload.role),
        )
        .payload_from(payload)
    }

    /// `tool_result.persisted`.
    pub fn tool_result_persisted(payload: ToolResultPersistedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::TOOL_RESULT_PERSISTED,
            summary::TOOL_RESULT_PERSISTED,
        )
        .payload_from(payload)
    }

    /// `run.stopped`.
    pub fn run_stopped(payload: RunStoppedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::RUN_STOPPED,
            summary::run_stopped(&payload.reason),
        )
        .payload_from(payload)
    }

    /// `context.compacted`.
    pub fn context_compacted(payload: ContextCompactedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::CONTEXT_COMPACTED,
            format!(
                "context compacted: ~{} -> ~{} tokens",
                payload.before_tokens, payload.after_tokens
            ),
        )
        .payload_from(payload)
    }

    /// `stop.evaluated`.
    pub fn stop_evaluated(payload: StopEvaluatedPayload) -> RunEventBuilder {
        RunEvent::builder(EventType::STOP_EVALUATED, summary::STOP_EVALUATED).payload_from(payload)
    }
}
