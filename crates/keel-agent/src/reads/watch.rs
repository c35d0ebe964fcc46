//! Watches: a task's or a thread's durable event log, from a sequence number on, then live.
//!
//! A watch keeps the sequence number of the last event it handed out and reads the log again
//! from there whenever it may have grown: when the executor's local signal is bumped, and at
//! least every [`POLL_INTERVAL`] (for the writes of other replicas, which bump no local
//! signal). The signal is marked seen before each read, so a write that lands while the watch
//! reads wakes the next wait rather than being missed; the log itself decides what is new, so
//! nothing is handed out twice.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use futures::Stream;
use keel_core::{AgentError, AgentResult, TaskEvent, TaskId, ThreadId};
use keel_runtime::AuthContext;
use tokio::sync::watch as signal;

use super::Reads;

/// How often a watch re-reads the store when no local signal arrives.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// One event of a task's durable log, with its place in it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskChange {
    /// The task whose log holds the event.
    pub task_id: TaskId,
    /// Its sequence number in that log, from 1 without gaps: resume a watch after it.
    pub seq: u64,
    /// The event.
    pub event: TaskEvent,
}

impl TaskChange {
    /// The events of a whole log after sequence number `after`, numbered.
    pub(super) fn number(task_id: &TaskId, events: Vec<TaskEvent>, after: u64) -> Vec<TaskChange> {
        events
            .into_iter()
            .zip(1u64..)
            .skip(usize::try_from(after).unwrap_or(usize::MAX))
            .map(|(event, seq)| TaskChange {
                task_id: task_id.clone(),
                seq,
                event,
            })
            .collect()
    }

    /// Whether this is a terminal status: the task's log ends here.
    pub fn is_terminal(&self) -> bool {
        matches!(&self.event, TaskEvent::StatusUpdate { status, .. } if status.state.is_terminal())
    }
}

/// Waits for the next chance that a log has grown.
struct Wake {
    updates: Option<signal::Receiver<u64>>,
}

impl Wake {
    /// Mark the signal seen: call before reading the store.
    fn mark(&mut self) {
        if let Some(updates) = &mut self.updates {
            updates.borrow_and_update();
        }
    }

    /// The signal changed since the last [`Wake::mark`], or a poll interval passed.
    async fn wait(&mut self) {
        let signalled = async {
            let changed = match &mut self.updates {
                Some(updates) => updates.changed().await.is_ok(),
                None => false,
            };
            if !changed {
                // No signal, or a closed one (it never changes again): the poll alone.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = signalled => {}
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

/// Follows one task's log ([`Reads::watch_task`]). Drive it with [`TaskWatch::next`], or turn
/// it into a [`Stream`] with [`TaskWatch::into_stream`].
pub struct TaskWatch {
    reads: Reads,
    auth: AuthContext,
    task_id: TaskId,
    after: u64,
    pending: VecDeque<TaskChange>,
    wake: Wake,
    ended: bool,
}

impl std::fmt::Debug for TaskWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskWatch")
            .field("task_id", &self.task_id)
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

impl TaskWatch {
    pub(super) fn new(reads: Reads, auth: AuthContext, task_id: TaskId, after: u64) -> Self {
        let wake = Wake {
            updates: reads.updates.clone(),
        };
        Self {
            reads,
            auth,
            task_id,
            after,
            pending: VecDeque::new(),
            wake,
            ended: false,
        }
    }

    /// The sequence number of the last event read from the log (handed out or queued).
    pub fn position(&self) -> u64 {
        self.after
    }

    /// The next event, waiting for it; `None` once a terminal status has been handed out.
    /// An error (the task is unknown, the store failed) ends the watch.
    ///
    /// Cancel-safe: dropping the future loses nothing, the next call reads from the same
    /// position.
    pub async fn next(&mut self) -> Option<AgentResult<TaskChange>> {
        loop {
            if let Some(change) = self.take() {
                return Some(Ok(change));
            }
            if self.ended {
                return None;
            }
            match self.read().await {
                Ok(true) => {}
                Ok(false) => self.wake.wait().await,
                Err(err) => {
                    self.ended = true;
                    return Some(Err(err));
                }
            }
        }
    }

    /// What the log holds now beyond what was handed out, without waiting (empty when nothing
    /// is new): for a consumer that must stop soon and wants what is already there.
    pub async fn ready(&mut self) -> AgentResult<Vec<TaskChange>> {
        if self.pending.is_empty() && !self.ended {
            self.read().await?;
        }
        Ok(std::iter::from_fn(|| self.take()).collect())
    }

    /// The watch as a stream of its events.
    pub fn into_stream(self) -> impl Stream<Item = AgentResult<TaskChange>> + Send {
        futures::stream::unfold(self, |mut watch| async move {
            let item = watch.next().await?;
            Some((item, watch))
        })
    }

    /// The next queued change; the watch ends after a terminal status.
    fn take(&mut self) -> Option<TaskChange> {
        if self.ended {
            return None;
        }
        let change = self.pending.pop_front()?;
        if change.is_terminal() {
            self.ended = true;
            self.pending.clear();
        }
        Some(change)
    }

    /// Read the log after the position; whether anything new was queued.
    async fn read(&mut self) -> AgentResult<bool> {
        self.wake.mark();
        let changes = self
            .reads
            .task_changes(&self.auth, &self.task_id, self.after)
            .await?;
        if let Some(last) = changes.last() {
            self.after = last.seq;
        }
        let grew = !changes.is_empty();
        self.pending.extend(changes);
        Ok(grew)
    }
}

/// Where a [`ThreadWatch`] starts or resumes: for each task of the thread, the sequence
/// number of the last event seen (a task not named starts from its first event). Its
/// [`token`](ThreadPosition::token) is an opaque string to resume with (`Last-Event-ID`).
///
/// ```
/// use keel_agent::reads::ThreadPosition;
/// let position = ThreadPosition::default().after("t1".into(), 3);
/// let again = ThreadPosition::parse(&position.token())?;
/// assert_eq!(again.of(&"t1".into()), 3);
/// assert_eq!(again.of(&"t2".into()), 0);
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadPosition {
    seen: BTreeMap<TaskId, u64>,
}

impl ThreadPosition {
    /// This position, with `task_id` seen up to `seq`.
    #[must_use]
    pub fn after(mut self, task_id: TaskId, seq: u64) -> Self {
        self.seen.insert(task_id, seq);
        self
    }

    /// Move past `change`.
    pub fn advance(&mut self, change: &TaskChange) {
        self.seen.insert(change.task_id.clone(), change.seq);
    }

    /// The last sequence number seen of `task_id` (0: none).
    pub fn of(&self, task_id: &TaskId) -> u64 {
        self.seen.get(task_id).copied().unwrap_or(0)
    }

    /// The position as an opaque token.
    pub fn token(&self) -> String {
        serde_json::to_string(&self.seen).unwrap_or_default()
    }

    /// The position a token names; a token [`ThreadPosition::token`] did not make is
    /// [`AgentError::InvalidInput`] naming `position`.
    pub fn parse(token: &str) -> AgentResult<Self> {
        serde_json::from_str(token)
            .map(|seen| Self { seen })
            .map_err(|_| {
                AgentError::invalid_input(
                    "position",
                    format!("`{token}` is not a position this server issued"),
                )
            })
    }
}

/// Follows every task of a thread ([`Reads::watch_thread`]): each task's events in its log's
/// order, tasks in the order they were created. Drive it with [`ThreadWatch::next`] or
/// [`ThreadWatch::into_stream`].
pub struct ThreadWatch {
    reads: Reads,
    auth: AuthContext,
    thread_id: ThreadId,
    position: ThreadPosition,
    /// Tasks whose log was read to its terminal end: it does not grow again.
    finished: HashSet<TaskId>,
    pending: VecDeque<TaskChange>,
    wake: Wake,
}

impl std::fmt::Debug for ThreadWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadWatch")
            .field("thread_id", &self.thread_id)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl ThreadWatch {
    pub(super) fn new(
        reads: Reads,
        auth: AuthContext,
        thread_id: ThreadId,
        position: ThreadPosition,
    ) -> Self {
        let wake = Wake {
            updates: reads.updates.clone(),
        };
        Self {
            reads,
            auth,
            thread_id,
            position,
            finished: HashSet::new(),
            pending: VecDeque::new(),
            wake,
        }
    }

    /// Where the watch stands: everything up to here was read from the logs.
    pub fn position(&self) -> &ThreadPosition {
        &self.position
    }

    /// The next event of any of the thread's tasks, waiting for it. An error (the store
    /// failed) is handed out and the watch goes on from the same position.
    ///
    /// Cancel-safe: dropping the future loses nothing.
    pub async fn next(&mut self) -> AgentResult<TaskChange> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(change);
            }
            if !self.read().await? {
                self.wake.wait().await;
            }
        }
    }

    /// The watch as a stream of its events (it never ends by itself).
    pub fn into_stream(self) -> impl Stream<Item = AgentResult<TaskChange>> + Send {
        futures::stream::unfold(self, |mut watch| async move {
            let item = watch.next().await;
            Some((item, watch))
        })
    }

    /// Read every unfinished task's log after the position; whether anything was queued.
    async fn read(&mut self) -> AgentResult<bool> {
        self.wake.mark();
        let tasks = self
            .reads
            .thread_task_ids(&self.auth, &self.thread_id, &self.finished)
            .await?;
        let mut read = Vec::new();
        for task_id in tasks {
            let changes = match self
                .reads
                .task_changes(&self.auth, &task_id, self.position.of(&task_id))
                .await
            {
                Ok(changes) => changes,
                // Evicted since it was listed: nothing more will come of it.
                Err(AgentError::TaskNotFound { .. }) => Vec::new(),
                Err(err) => return Err(err),
            };
            // A terminal status is a log's last word (the snapshot may show it before the
            // log does, so the log decides).
            if changes.iter().any(TaskChange::is_terminal) {
                self.finished.insert(task_id.clone());
            }
            read.extend(changes);
        }
        // Only now, with every read done, does the position move (cancel-safety).
        for change in &read {
            self.position.advance(change);
        }
        let grew = !read.is_empty();
        self.pending.extend(read);
        Ok(grew)
    }
}
