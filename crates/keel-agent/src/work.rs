//! Work that reaches a thread through its durable queue (a task to run, a queued message or
//! tool call, a fired effect), and what wakes the effect scheduler when work is scheduled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use keel_core::{Message, TaskId};
use keel_llm::ToolCall;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;

/// Work waiting in a thread's durable queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum QueuedWork {
    /// Run (or continue) this task.
    Task { task_id: TaskId },
    /// A queued user message (`ThreadState::queue_message`).
    Message { message: Message },
    /// A queued tool call (`ThreadState::queue_tool`).
    Tool { call: ToolCall },
    /// A scheduled effect whose timer fired (see `effects`).
    Effect(QueuedEffect),
}

/// A fired timer as it waits in the thread's queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct QueuedEffect {
    pub(crate) timer_id: String,
    pub(crate) name: String,
    pub(crate) payload: Value,
    pub(crate) due_at: DateTime<Utc>,
}

/// An executor's effect scheduler state: what wakes it, and whether it runs.
#[derive(Default)]
pub(crate) struct EffectScheduler {
    wake: Arc<Notify>,
    started: AtomicBool,
}

impl EffectScheduler {
    /// Wake the scheduler to look at the timers again.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// What the scheduler loop waits on.
    pub(crate) fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Whether the scheduler was started.
    pub(crate) fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// Mark the scheduler started; `false` when it already was.
    pub(crate) fn start(&self) -> bool {
        !self.started.swap(true, Ordering::SeqCst)
    }
}
