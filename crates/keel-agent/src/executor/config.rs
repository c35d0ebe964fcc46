//! How an executor is tuned and how a message is sent.

use std::sync::Arc;
use std::time::Duration;

use keel_core::RunContext;

use crate::async_tools::CallbackDispatcher;

/// How [`AgentExecutor::send_message`] should behave.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Return the submitted task at once and let the run go on in the background.
    pub return_immediately: bool,
    /// Keep only this many most recent messages in the returned task's history.
    pub history_length: Option<usize>,
    /// The run context to attach (otherwise one is created, or upgraded from legacy keys).
    pub run_context: Option<RunContext>,
    /// The id a new task takes (otherwise a fresh one): a front door that must name the task
    /// before it exists (an idempotent retry, an error after creation) chooses it first.
    /// Ignored when the message continues a task.
    pub task_id: Option<keel_core::TaskId>,
}

impl SendOptions {
    /// Return the submitted task at once ([`SendOptions::return_immediately`]), everything
    /// else as by default.
    pub fn in_background() -> Self {
        SendOptions {
            return_immediately: true,
            ..SendOptions::default()
        }
    }
}

/// The default of [`ExecutorConfig::drain_timeout`]: long enough for a step's model call or
/// an ordinary tool call to finish, and well inside the 30 s a container orchestrator
/// usually waits between SIGTERM and SIGKILL.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of [`ExecutorConfig::max_concurrent_threads`] (decision 276): a thousand
/// conversations waiting on their models at once, not a few dozen.
const DEFAULT_MAX_THREADS: usize = 1024;

/// Tuning of an [`AgentExecutor`].
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// How long a thread lease lasts without renewal; a crashed process's threads are taken
    /// over after this long.
    pub lease_ttl: Duration,
    /// How many threads this process runs at once; more wait for a slot. A running thread
    /// spends most of its time waiting on a model, holding memory but no core, so the
    /// default is sized by memory (tens of KiB a running thread; decision 276), not by cores.
    pub max_concurrent_threads: usize,
    /// How many of those slots one tenant may hold at once (capped at
    /// `max_concurrent_threads`); its further threads wait for one of its own to finish, so
    /// that other tenants are still served. Three quarters of the slots by default.
    pub max_threads_per_tenant: usize,
    /// How many items may wait in one thread's queue besides the running task's when a
    /// message starts a new task there; past it the message is refused with
    /// [`AgentError::Overloaded`](keel_core::AgentError::Overloaded) and nothing is stored.
    /// Counted in the store, so the bound holds across the processes sharing it.
    pub max_queued_per_thread: usize,
    /// How many items may wait in all of one tenant's thread queues together when a message
    /// starts a new task; past it, as for `max_queued_per_thread`. Stores that cannot count
    /// a tenant's queues ([`ThreadQueue::tenant_queue_len`] unsupported) bound threads only.
    ///
    /// [`ThreadQueue::tenant_queue_len`]: keel_runtime::ThreadQueue::tenant_queue_len
    pub max_queued_per_tenant: usize,
    /// How often to look again at work another process holds (its lease, its task state).
    pub poll_interval: Duration,
    /// This process's name in thread leases; unique among the live processes sharing a
    /// store. Random by default; a name kept across restarts (an instance id) lets a restarted
    /// process take its own interrupted threads back at once ([`AgentExecutor::recover`]).
    ///
    /// [`AgentExecutor::recover`]: crate::AgentExecutor::recover
    pub holder: String,
    /// Asynchronous tools: where their callbacks go and what carries their invocations
    /// (keel-transport's `HttpCallbacks`: its `{base}/callbacks/{call_id}` route, over HTTP).
    /// Without it asynchronous tools cannot be dispatched.
    pub callbacks: Option<Arc<dyn CallbackDispatcher>>,
    /// Asynchronous tools: how long a pending call waits for its callback when the tool sets
    /// no timeout of its own.
    pub async_tool_timeout: Duration,
    /// How long [`AgentExecutor::shutdown`] lets running steps go on to their next persisted
    /// point before it stops them where they are (as a crash would). Either way the tasks
    /// stay unfinished, not canceled, and their threads are released for the next process.
    ///
    /// [`AgentExecutor::shutdown`]: crate::AgentExecutor::shutdown
    pub drain_timeout: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(30),
            max_concurrent_threads: DEFAULT_MAX_THREADS,
            max_threads_per_tenant: DEFAULT_MAX_THREADS / 4 * 3,
            max_queued_per_thread: 100,
            max_queued_per_tenant: 1000,
            poll_interval: Duration::from_millis(200),
            holder: format!("keel-{}-{}", std::process::id(), uuid_suffix()),
            callbacks: None,
            async_tool_timeout: Duration::from_secs(3600),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

fn uuid_suffix() -> String {
    keel_core::RunId::new()
        .as_str()
        .chars()
        .rev()
        .take(8)
        .collect()
}
