//! Thread storage: a thread's durable history, its FIFO queue of pending work, its private
//! key-value store, and the parent/child registry of subagent threads.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, AgentResult, Metadata, ThreadId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AuthContext, Lease};

/// One entry of a thread's history with its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Position in the thread, starting at 1, without gaps.
    pub seq: u64,
    /// The message or tool result.
    pub message: LlmMessage,
}

/// A thread's conversation as the model sees it (messages and tool results), appended before
/// the engine continues.
#[async_trait]
pub trait ThreadHistory: Send + Sync {
    /// Append `messages` in order, as the holder of `lease`. A stale or expired lease is
    /// [`AgentError::LeaseLost`] and nothing is written. Returns the seq of the last entry.
    async fn append_history(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        messages: &[LlmMessage],
    ) -> AgentResult<u64>;

    /// Up to `limit` entries with `seq > after_seq`, in order.
    async fn read_history(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>>;

    /// The newest `limit` entries with `seq < before_seq`, in order (oldest first):
    /// `before_seq` [`u64::MAX`] reads the tail. What the engine pages a thread with from
    /// the end, back to its newest compaction checkpoint, so that a run's cost does not
    /// grow with the thread's length (decision 250). The default reads the history from
    /// the start; a backend overrides it with a read of the wanted range only.
    async fn read_history_before(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        before_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        let mut entries = self.read_history(auth, thread_id, 0, usize::MAX).await?;
        entries.retain(|entry| entry.seq < before_seq);
        let start = entries.len().saturating_sub(limit);
        entries.drain(..start);
        Ok(entries)
    }
}

/// Work waiting for a thread: a user message, a tool call, a callback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedItem {
    /// Unique id, for acknowledging and de-duplicating.
    pub id: String,
    /// Position in the queue (increasing).
    pub seq: u64,
    /// What is queued.
    pub payload: Value,
    /// When it was queued.
    pub enqueued_at: DateTime<Utc>,
}

/// A durable FIFO queue per thread. Items are read with [`ThreadQueue::peek_queue`] and
/// removed with [`ThreadQueue::ack_queue`] once their effect is persisted, so a crash in
/// between delivers an item again rather than losing it.
#[async_trait]
pub trait ThreadQueue: Send + Sync {
    /// Add `payload` at the back of the thread's queue.
    async fn push_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        payload: Value,
    ) -> AgentResult<QueuedItem>;

    /// Up to `limit` items from the front, oldest first, without removing them.
    async fn peek_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>>;

    /// Remove the items with these ids, as the holder of `lease` (a stale lease is
    /// [`AgentError::LeaseLost`]). Unknown ids are ignored, so an ack can be repeated.
    async fn ack_queue(&self, auth: &AuthContext, lease: &Lease, ids: &[String])
        -> AgentResult<()>;

    /// How many items wait.
    async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize>;

    /// How many items wait in all of the tenant's thread queues together: what a server
    /// counts to bound one tenant's queued work, the same figure for every process sharing
    /// the store. The default, for backends that do not keep it, is
    /// [`AgentError::Unsupported`]; the engine then bounds each thread's queue only.
    async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
        let _ = auth;
        Err(AgentError::Unsupported {
            what: "counting a tenant's queued work".into(),
        })
    }

    /// The tenant's threads whose queue holds work, in no particular order: where a sweep
    /// looks for work that no process runs (queued by a process that died, or whose wake was
    /// lost). The default, for backends that do not keep it, is
    /// [`AgentError::Unsupported`]; such work then waits for a restart's recovery.
    async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
        let _ = auth;
        Err(AgentError::Unsupported {
            what: "listing the threads with queued work".into(),
        })
    }
}

/// Caps of the per-thread key-value store. Exceeding one is [`AgentError::InvalidInput`]
/// whose reason names the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLimits {
    /// Longest key, in bytes (UTF-8).
    pub max_key_bytes: usize,
    /// Largest value, in bytes of its JSON encoding.
    pub max_value_bytes: usize,
    /// Most keys per thread.
    pub max_keys: usize,
}

impl KvLimits {
    /// The documented defaults: 256-byte keys, 64 KiB values, 1,000 keys per thread.
    pub const DEFAULT: KvLimits = KvLimits {
        max_key_bytes: 256,
        max_value_bytes: 64 * 1024,
        max_keys: 1000,
    };

    /// Check a key and the encoded value against the caps (not the key count).
    pub fn check(&self, key: &str, encoded_value: &str) -> AgentResult<()> {
        self.check_sizes(key, encoded_value.len())
    }

    /// Check a key and a value (by the length of its JSON encoding) against the caps (not the
    /// key count).
    pub fn check_value(&self, key: &str, value: &Value) -> AgentResult<()> {
        let mut counted = ByteCount(0);
        serde_json::to_writer(&mut counted, value).map_err(AgentError::internal)?;
        self.check_sizes(key, counted.0)
    }

    fn check_sizes(&self, key: &str, value_bytes: usize) -> AgentResult<()> {
        if key.is_empty() {
            return Err(AgentError::invalid_input("key", "must not be empty"));
        }
        if key.len() > self.max_key_bytes {
            return Err(AgentError::invalid_input(
                "key",
                format!(
                    "is {} bytes; the cap max_key_bytes is {}",
                    key.len(),
                    self.max_key_bytes
                ),
            ));
        }
        if value_bytes > self.max_value_bytes {
            return Err(AgentError::invalid_input(
                "value",
                format!(
                    "is {} bytes as JSON; the cap max_value_bytes is {}",
                    value_bytes, self.max_value_bytes
                ),
            ));
        }
        Ok(())
    }

    /// The error for a thread that already holds `max_keys` keys.
    pub fn too_many_keys(&self) -> AgentError {
        AgentError::invalid_input(
            "key",
            format!(
                "the thread already holds {} keys; the cap max_keys is {}",
                self.max_keys, self.max_keys
            ),
        )
    }
}

/// Counts the bytes written to it, so a value's encoded size is known without keeping it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Default for KvLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A durable key-value store private to each thread (Standard Agents §14): values round-trip
/// as JSON, `null` deletes, and no thread can read another's keys.
#[async_trait]
pub trait ThreadKv: Send + Sync {
    /// The value, or `None` when unset or deleted.
    async fn kv_get(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
    ) -> AgentResult<Option<Value>>;
    /// Set `key`; `Value::Null` deletes it. Durable before it returns.
    async fn kv_set(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
        value: Value,
    ) -> AgentResult<()>;
    /// The thread's keys, sorted.
    async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>>;
}

/// A subagent thread as its parent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildThread {
    /// The child's thread.
    pub thread_id: ThreadId,
    /// Its parent's thread.
    pub parent_thread_id: ThreadId,
    /// Display name.
    pub name: String,
    /// The child's agent.
    pub agent: String,
    /// Free-form status the child reports (`running`, `completed`, ...).
    pub status: String,
    /// Whether the parent can message it again.
    pub resumable: bool,
    /// When it was registered.
    pub created_at: DateTime<Utc>,
    /// Extra data.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

impl ChildThread {
    /// A child `thread_id` of `parent_thread_id`, named `name` and run by `agent`, as a
    /// parent registers it when it starts one: `running`, resumable, registered now, with no
    /// metadata.
    ///
    /// ```
    /// use keel_core::ThreadId;
    /// use keel_runtime::ChildThread;
    /// let child = ChildThread::running(ThreadId::new(), ThreadId::new(), "helper", "researcher");
    /// assert_eq!((child.status.as_str(), child.resumable), ("running", true));
    /// ```
    pub fn running(
        thread_id: ThreadId,
        parent_thread_id: ThreadId,
        name: impl Into<String>,
        agent: impl Into<String>,
    ) -> Self {
        Self {
            thread_id,
            parent_thread_id,
            name: name.into(),
            agent: agent.into(),
            status: "running".into(),
            resumable: true,
            created_at: Utc::now(),
            metadata: Metadata::default(),
        }
    }

    /// Put `children` in the registry's order: oldest first, ties broken by thread id (what
    /// [`SubagentRegistry::children`] returns on every backend).
    pub fn sort_oldest_first(children: &mut [ChildThread]) {
        children.sort_by(|a, b| (a.created_at, &a.thread_id).cmp(&(b.created_at, &b.thread_id)));
    }

    /// The error of [`SubagentRegistry::set_child_status`] for a thread that is not a
    /// registered subagent: [`AgentError::InvalidInput`] naming `child`.
    pub fn not_registered(child: &ThreadId) -> AgentError {
        AgentError::invalid_input(
            "child",
            format!("thread {child} is not a registered subagent"),
        )
    }
}

/// The parent/child registry of subagent threads.
#[async_trait]
pub trait SubagentRegistry: Send + Sync {
    /// Register (or replace) a child under its parent.
    async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()>;
    /// A parent's children, oldest first.
    async fn children(
        &self,
        auth: &AuthContext,
        parent: &ThreadId,
    ) -> AgentResult<Vec<ChildThread>>;
    /// The child's entry, if registered.
    async fn child(&self, auth: &AuthContext, child: &ThreadId)
        -> AgentResult<Option<ChildThread>>;
    /// Update a child's status; an unregistered child is [`AgentError::InvalidInput`].
    async fn set_child_status(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
        status: &str,
    ) -> AgentResult<()>;
}

/// Everything a thread needs from a store, as one object.
pub trait ThreadStore:
    ThreadHistory + ThreadQueue + ThreadKv + SubagentRegistry + crate::ThreadLeases
{
}

impl<T> ThreadStore for T where
    T: ThreadHistory + ThreadQueue + ThreadKv + SubagentRegistry + crate::ThreadLeases
{
}

/// Check a lease time-to-live: at least 1 ms and at most 24 h, else
/// [`AgentError::InvalidInput`] naming `ttl`. [`Validated`](crate::Validated) applies it to
/// `acquire_lease`, `renew_lease` and `claim_due_timers` around every backend, so the bounds
/// are the same everywhere (it is re-exported as `keel_runtime::check_lease_ttl`).
///
/// ```
/// use std::time::Duration;
/// use keel_runtime::check_lease_ttl;
/// assert!(check_lease_ttl(Duration::from_secs(30)).is_ok());
/// assert!(check_lease_ttl(Duration::from_millis(1)).is_ok());
/// assert!(check_lease_ttl(Duration::from_micros(999)).is_err());
/// assert!(check_lease_ttl(Duration::from_secs(86_400 + 1)).is_err());
/// ```
pub fn check_ttl(ttl: Duration) -> AgentResult<()> {
    if ttl < MIN_LEASE_TTL || ttl > MAX_LEASE_TTL {
        return Err(AgentError::invalid_input(
            "ttl",
            format!("must be between 1 ms and 24 h, got {ttl:?}"),
        ));
    }
    Ok(())
}

/// The shortest lease TTL [`check_ttl`] accepts.
const MIN_LEASE_TTL: Duration = Duration::from_millis(1);
/// The longest lease TTL [`check_ttl`] accepts.
const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);
