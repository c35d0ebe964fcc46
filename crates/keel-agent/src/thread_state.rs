//! [`ThreadState`]: the handle that tools, hooks and application code get for one thread.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use futures::future::BoxFuture;
use keel_core::{AgentError, AgentResult, Message, ThreadId};
use keel_events::EventSink;
use keel_llm::ToolCall;
use keel_runtime::{
    AuthContext, ChildThread, HistoryEntry, LogLevel, QueuedItem, Runtime, ThreadStore,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::attachments::AttachmentStore;
use crate::code::{CodeRequest, CodeRun, CodeRunner};
use crate::environment::Environment;
use crate::subagents::keys::{scoped_context, scoped_key};
use crate::work::{EffectScheduler, QueuedWork};

/// Keys of the thread key-value store that Keel itself uses start with this prefix.
pub const RESERVED_KEY_PREFIX: &str = "keel:";
pub(crate) const TERMINATED_KEY: &str = TERMINATED_AT_KEY;
/// The key, in a thread's key-value store, of the time the thread was terminated (an RFC
/// 3339 string); absent while the thread is open.
pub const TERMINATED_AT_KEY: &str = "keel:terminated_at";
/// The cancel reason of a run whose thread was terminated.
pub(crate) const TERMINATED_REASON: &str = "thread terminated";

/// Set `key` of `thread_id`'s key-value store to the current time (an RFC 3339 string): how
/// Keel records that something happened to a thread once (terminated, immediate kinds
/// activated), where only the key's presence and the time matter.
pub(crate) async fn mark_now(
    store: &dyn ThreadStore,
    auth: &AuthContext,
    thread_id: &ThreadId,
    key: &str,
) -> AgentResult<()> {
    let now = json!(Utc::now().to_rfc3339());
    store.kv_set(auth, thread_id, key, now).await
}

/// An effect handler: gets the thread and the payload, and may queue messages and tools.
pub(crate) type EffectFn =
    Arc<dyn Fn(ThreadState, Value) -> BoxFuture<'static, AgentResult<()>> + Send + Sync>;

/// What a thread's handle, the scheduled effects and the subagents need of the executor that
/// runs the thread: a narrow handle, so that none of them reaches into the executor's state.
#[async_trait]
pub(crate) trait ThreadHost: Send + Sync {
    /// The service hub.
    fn runtime(&self) -> &Arc<dyn Runtime>;
    /// The name (card name) of the agent the executor runs.
    fn agent_name(&self) -> &str;
    /// Where the agent reads its flags and scoped variables.
    fn environment(&self) -> &Environment;
    /// What runs model-written code, when the agent has one.
    fn code_runner(&self) -> Option<&Arc<dyn CodeRunner>>;
    /// The agent's handler of the scheduled effect `name`.
    fn effect_handler(&self, name: &str) -> Option<EffectFn>;
    /// The executor's effect scheduler.
    fn effect_scheduler(&self) -> &EffectScheduler;
    /// Where every run's events go.
    fn sinks(&self) -> Vec<Arc<dyn EventSink>>;
    /// How long a thread lease lasts without renewal.
    fn lease_ttl(&self) -> Duration;
    /// Fires when the executor shuts down.
    fn shutting_down(&self) -> &CancellationToken;
    /// The executor's background tasks, waited for at shutdown.
    fn tracker(&self) -> &TaskTracker;
    /// This handle, shared; `None` once the executor is dropped.
    fn shared(&self) -> Option<Arc<dyn ThreadHost>>;
    /// Wake whoever follows the executor's tasks (a task's log grew).
    fn task_changed(&self);
    /// Make sure a local worker drives the thread.
    fn schedule(&self, auth: &AuthContext, thread_id: &ThreadId);
    /// Put `work` on the thread's durable queue and schedule the thread.
    async fn enqueue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        work: QueuedWork,
    ) -> AgentResult<()>;
    /// Cancel this process's runs on the thread.
    fn cancel_thread_runs(&self, auth: &AuthContext, thread_id: &ThreadId, reason: &str);
    /// After work was queued that no task record would bring back: make sure it runs even if
    /// this process stops first (see `effects::guard_queued`).
    async fn guard_queued(&self, auth: &AuthContext, thread_id: &ThreadId);
    /// Subagents: terminate the thread's children.
    async fn terminate_children(&self, auth: &AuthContext, thread_id: &ThreadId)
        -> AgentResult<()>;
    /// Subagents: queue `message` on the parent thread of `child` (a thread of this executor).
    async fn queue_on_parent(
        &self,
        auth: &AuthContext,
        child: &ChildThread,
        message: Message,
    ) -> AgentResult<QueuedItem>;
    /// Subagents: the executor in this process whose `kind` children this executor runs.
    fn local_parent(&self, kind: &str) -> Option<Arc<dyn ThreadHost>>;
    /// A line of the engine's own log, through the runtime's logging service.
    fn log(&self, level: LogLevel, message: &str) {
        self.runtime().logging_service().log(level, message);
    }
}

/// One thread as its tools and the application see it: its history, its durable queue, its
/// private key-value store (Standard Agents §14), its place among subagents, and the live
/// cancellation token of the run that holds it (if any).
#[derive(Clone)]
pub struct ThreadState {
    pub(crate) auth: AuthContext,
    pub(crate) thread_id: ThreadId,
    pub(crate) host: Arc<dyn ThreadHost>,
    pub(crate) cancel: CancellationToken,
}

impl std::fmt::Debug for ThreadState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadState")
            .field("thread_id", &self.thread_id)
            .finish_non_exhaustive()
    }
}

impl ThreadState {
    fn runtime(&self) -> &Arc<dyn Runtime> {
        self.host.runtime()
    }

    /// The thread's id.
    pub fn thread_id(&self) -> &ThreadId {
        &self.thread_id
    }

    /// The name of the agent running the thread.
    pub fn agent_name(&self) -> &str {
        self.host.agent_name()
    }

    /// Fires when the run holding the thread is canceled.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Start running model-written code with the agent's [`CodeRunner`](crate::CodeRunner);
    /// the handle's [`terminate`](crate::CodeRun::terminate) stops it. An agent without a
    /// runner answers [`AgentError::Unsupported`].
    pub fn run_code(&self, request: CodeRequest) -> AgentResult<Box<dyn CodeRun>> {
        let runner = self
            .host
            .code_runner()
            .ok_or_else(|| AgentError::Unsupported {
                what: format!("agent `{}` has no code runner", self.agent_name()),
            })?;
        runner.start(request)
    }

    /// The thread's history, oldest first.
    pub async fn history(&self) -> AgentResult<Vec<HistoryEntry>> {
        self.runtime()
            .thread_store()
            .read_history(&self.auth, &self.thread_id, 0, usize::MAX)
            .await
    }

    /// Queue a user message: injected before the next model call when the thread is active,
    /// or starting a new turn when it is idle (§9).
    pub async fn queue_message(&self, text: impl Into<String>) -> AgentResult<QueuedItem> {
        let message = Message::user(text).in_thread(self.thread_id.clone());
        self.queue(QueuedWork::Message { message }).await
    }

    /// Queue a tool call: run before the next model call when the thread is active, or on its
    /// own when it is idle.
    pub async fn queue_tool(
        &self,
        name: impl Into<String>,
        arguments: Value,
    ) -> AgentResult<QueuedItem> {
        self.queue(QueuedWork::Tool {
            call: ToolCall::new(name, arguments),
        })
        .await
    }

    fn attachment_store(&self) -> AttachmentStore<'_> {
        AttachmentStore {
            runtime: self.runtime().as_ref(),
            auth: &self.auth,
            thread_id: &self.thread_id,
        }
    }

    /// Store a file in this thread's attachment store (§8.1) and answer its file part, whose
    /// `uri` (`keel-attachment://{thread_id}/{path}`) is valid in this thread only.
    pub async fn put_attachment(
        &self,
        name: &str,
        media_type: Option<&str>,
        bytes: &[u8],
    ) -> AgentResult<keel_core::FileContent> {
        self.attachment_store().put(name, media_type, bytes).await
    }

    /// A file of this thread's attachment store with its bytes, by URI or bare path; `None`
    /// when there is none. Another thread's URI is [`AgentError::InvalidInput`].
    pub async fn read_attachment(
        &self,
        uri: &str,
    ) -> AgentResult<Option<(keel_core::FileContent, Vec<u8>)>> {
        self.attachment_store().read(uri).await
    }

    /// Load the bytes of this thread's stored files named by `messages` (a request copy), so
    /// providers can send them; see `AttachmentStore::load_request_bytes`.
    pub(crate) async fn load_attachment_bytes(&self, messages: &mut [keel_llm::LlmMessage]) {
        self.attachment_store().load_request_bytes(messages).await;
    }

    /// Every file of this thread's attachment store.
    pub async fn attachments(&self) -> AgentResult<Vec<keel_core::FileContent>> {
        self.attachment_store().list().await
    }

    /// A scoped variable handed to this thread (a subagent) by its parent (§7.4–§7.5):
    /// stored sealed, opened here with the key of the agent's
    /// [`Environment`](crate::Environment). Never put it into a prompt.
    pub async fn scoped_variable(&self, name: &str) -> AgentResult<Option<String>> {
        let Some(sealed) = self
            .runtime()
            .thread_store()
            .kv_get(&self.auth, &self.thread_id, &scoped_key(name))
            .await?
        else {
            return Ok(None);
        };
        let sealed = sealed.as_str().ok_or_else(|| {
            AgentError::storage(format!("scoped variable `{name}` is not a sealed string"))
        })?;
        self.host
            .environment()
            .open(&scoped_context(&self.thread_id, name), sealed)
            .map(Some)
    }

    pub(crate) async fn queue(&self, work: QueuedWork) -> AgentResult<QueuedItem> {
        self.ensure_open().await?;
        let payload = serde_json::to_value(&work).map_err(AgentError::internal)?;
        let item = self
            .runtime()
            .thread_store()
            .push_queue(&self.auth, &self.thread_id, payload)
            .await?;
        self.host.schedule(&self.auth, &self.thread_id);
        // Only the queue holds this work: a wake brings it back if this process stops first.
        self.host.guard_queued(&self.auth, &self.thread_id).await;
        Ok(item)
    }

    /// A value of the thread's key-value store, `None` when unset.
    pub async fn get_value(&self, key: &str) -> AgentResult<Option<Value>> {
        self.runtime()
            .thread_store()
            .kv_get(&self.auth, &self.thread_id, key)
            .await
    }

    /// Set a value; `Value::Null` deletes it. Keys starting with `keel:` are reserved.
    pub async fn set_value(&self, key: &str, value: Value) -> AgentResult<()> {
        if key.starts_with(RESERVED_KEY_PREFIX) {
            return Err(AgentError::invalid_input(
                "key",
                format!("keys starting with `{RESERVED_KEY_PREFIX}` are reserved for Keel"),
            ));
        }
        self.runtime()
            .thread_store()
            .kv_set(&self.auth, &self.thread_id, key, value)
            .await
    }

    /// Whether the thread was terminated.
    pub async fn is_terminated(&self) -> AgentResult<bool> {
        Ok(self
            .runtime()
            .thread_store()
            .kv_get(&self.auth, &self.thread_id, TERMINATED_KEY)
            .await?
            .is_some())
    }

    pub(crate) async fn ensure_open(&self) -> AgentResult<()> {
        if self.is_terminated().await? {
            return Err(AgentError::ThreadTerminated {
                thread_id: self.thread_id.clone(),
            });
        }
        Ok(())
    }

    /// Soft shutdown (§10): record the termination time, abort the run in flight, refuse
    /// every later message, queued work and execution on this thread, and mark the thread
    /// `terminated` in its parent's registry when it is a subagent.
    pub async fn terminate(&self) -> AgentResult<()> {
        let store = self.runtime().thread_store();
        mark_now(&*store, &self.auth, &self.thread_id, TERMINATED_KEY).await?;
        self.host
            .cancel_thread_runs(&self.auth, &self.thread_id, TERMINATED_REASON);
        if store.child(&self.auth, &self.thread_id).await?.is_some() {
            store
                .set_child_status(&self.auth, &self.thread_id, "terminated")
                .await?;
        }
        // Subagents: a terminated parent terminates its children (best effort).
        Box::pin(self.host.terminate_children(&self.auth, &self.thread_id)).await?;
        Ok(())
    }

    /// Report a status to the parent's registry without ending this thread (§8.3).
    pub async fn set_status(&self, status: &str) -> AgentResult<()> {
        self.runtime()
            .thread_store()
            .set_child_status(&self.auth, &self.thread_id, status)
            .await
    }

    /// The parent thread, when this thread is a subagent.
    pub async fn parent(&self) -> AgentResult<Option<ThreadId>> {
        Ok(self
            .runtime()
            .thread_store()
            .child(&self.auth, &self.thread_id)
            .await?
            .map(|c| c.parent_thread_id))
    }

    /// This thread's registered subagents.
    pub async fn children(&self) -> AgentResult<Vec<ChildThread>> {
        self.runtime()
            .thread_store()
            .children(&self.auth, &self.thread_id)
            .await
    }

    /// Queue a message to the parent thread (§8.2, explicit parent communication). A thread
    /// that is not a subagent has no parent: [`AgentError::InvalidInput`].
    pub async fn notify_parent(&self, content: &str) -> AgentResult<QueuedItem> {
        let child = self
            .runtime()
            .thread_store()
            .child(&self.auth, &self.thread_id)
            .await?
            .ok_or_else(|| {
                AgentError::invalid_input(
                    "thread",
                    format!("thread {} has no parent", self.thread_id),
                )
            })?;
        // Queued through the store and run by the parent's executor: this thread's executor
        // runs another agent and must never drive the parent's thread.
        self.host
            .queue_on_parent(
                &self.auth,
                &child,
                Message::user(format!("[from subagent {}] {content}", self.thread_id))
                    .with_status_kind(keel_core::StatusKind::SubagentMessage),
            )
            .await
    }
}
