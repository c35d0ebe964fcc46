//! The engine's read-and-watch API: what a front door (the A2A transport, the command line,
//! the operator console) reads about a tenant's tasks, threads, runs and pending approvals,
//! and the watch that follows a task or a thread as its durable event log grows.
//!
//! Front doors read through [`Reads`] and never name a store: the stores stay the engine's
//! business, and one place answers every caller the same way (the same error kinds, the same
//! page tokens, the same tenant scoping). Every read takes the caller's [`AuthContext`]; another
//! tenant's id answers exactly as an unknown one does ([`AgentError::TaskNotFound`],
//! [`AgentError::ThreadNotFound`]).
//!
//! A watch ([`TaskWatch`], [`ThreadWatch`]) reads the durable event log, which is the truth on
//! every replica sharing the store; the executor's local signal
//! ([`AgentExecutor::task_updates`]) only wakes it early, and without one it re-reads every
//! [`POLL_INTERVAL`]. So a watch opened on any process sees the events of a task run by
//! another, with no gap and no duplicate.

mod pages;
mod values;
mod watch;

use std::collections::HashSet;
use std::sync::Arc;

use keel_core::{
    AgentError, AgentResult, ApprovalRequest, RunId, Task, TaskEvent, TaskId, TaskState, ThreadId,
};
use keel_events::RunReport;
use keel_runtime::{
    load_task_with_history, AuthContext, ChildThread, Credentials, HistoryEntry, ListTasksFilter,
    Page, QueuedItem, RunQuery, RunRecord, Runtime, TaskOrder,
};
use serde_json::Value;
use tokio::sync::watch as signal;

use crate::task_meta::EngineMeta;
use crate::{AgentExecutor, TERMINATED_AT_KEY};

use pages::StorePages;
pub use pages::{ListPage, RunPageQuery, ThreadListing};
pub use values::TenantValues;
pub use watch::{TaskChange, TaskWatch, ThreadPosition, ThreadWatch, POLL_INTERVAL};

/// Tenant-scoped reads and watches over the engine's stores. Cheap to clone; get one from
/// [`AgentExecutor::reads`] (its watches wake on the executor's local signal) or, for a process
/// that runs no agent (`keel runs`), from [`Reads::new`].
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::reads::{Reads, TaskQuery};
/// use keel_llm::MockLlm;
/// use keel_runtime::{Runtime, Services};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_core::AgentError> {
/// let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
/// let reads = Reads::new(runtime);
/// let auth = reads.default_auth();
/// let page = reads.tasks(&auth, &TaskQuery::default()).await?;
/// assert!(page.items.is_empty() && page.next_page_token.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Reads {
    runtime: Arc<dyn Runtime>,
    updates: Option<signal::Receiver<u64>>,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads")
            .field("wakes_on_local_updates", &self.updates.is_some())
            .finish_non_exhaustive()
    }
}

/// Which tasks [`Reads::tasks`] lists, and which page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskQuery {
    /// Only tasks of this thread.
    pub thread_id: Option<ThreadId>,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks sent to this agent.
    pub agent: Option<String>,
    /// In which order, and for [`TaskOrder::RecentlyUpdated`] since when.
    pub order: TaskOrder,
    /// At most this many per page (default 50, at most 100; zero is
    /// [`AgentError::InvalidInput`] naming `page_size`).
    pub page_size: Option<u32>,
    /// Where to continue: a previous page's `next_page_token` (opaque). A token this server
    /// did not issue is [`AgentError::InvalidInput`] naming `page_token`.
    pub page_token: Option<String>,
}

/// A thread as [`Reads::thread`] answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSummary {
    /// The thread.
    pub thread_id: ThreadId,
    /// When it was terminated (as stored), if it was.
    pub terminated_at: Option<Value>,
    /// The thread that started it as a subagent, if any.
    pub parent_thread_id: Option<ThreadId>,
    /// Its registered subagents.
    pub children: Vec<ChildThread>,
    /// How many items wait in its queue.
    pub queued: usize,
}

/// An action waiting for a person's decision ([`Reads::pending_approvals`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PendingApproval {
    /// The task that waits (`input-required`).
    pub task_id: TaskId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// The request to answer with [`AgentExecutor::decide_approval`].
    pub request: ApprovalRequest,
}

impl AgentExecutor {
    /// The read-and-watch API over this executor's stores; its watches wake on this
    /// executor's local updates as well as on what other replicas write.
    pub fn reads(&self) -> Reads {
        Reads::new(self.runtime().clone()).with_updates(self.task_updates())
    }
}

impl Reads {
    /// Reads over `runtime`'s stores; watches poll the store every [`POLL_INTERVAL`].
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        Self {
            runtime,
            updates: None,
        }
    }

    /// Also wake watches early on `updates`, a signal bumped whenever a task changes (as
    /// [`AgentExecutor::task_updates`]).
    #[must_use]
    pub fn with_updates(mut self, updates: signal::Receiver<u64>) -> Self {
        self.updates = Some(updates);
        self
    }

    // Callers.

    /// Whom `credentials` prove, as the runtime's auth service decides: `Ok(None)` when they
    /// prove nobody.
    pub fn authenticate(&self, credentials: &Credentials) -> AgentResult<Option<AuthContext>> {
        self.runtime.auth_service().authenticate(credentials)
    }

    /// The tenant of a caller that brings no credentials (the auth service's default).
    pub fn default_auth(&self) -> AuthContext {
        self.runtime.auth_service().auth_context()
    }

    /// The tenant-scoped key-value store a front door keeps its own records in (the A2A
    /// transport's push notification configs).
    pub fn values(&self) -> TenantValues {
        TenantValues::new(self.runtime.memory_service())
    }

    // Tasks.

    /// The task's snapshot without its history; [`AgentError::TaskNotFound`] when this tenant
    /// has no such task.
    pub async fn task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Task> {
        stored_task(self.runtime.as_ref(), auth, task_id).await
    }

    /// The task with its history rebuilt from its event log (only the last `history_length`
    /// messages when given); [`AgentError::TaskNotFound`] when this tenant has no such task.
    pub async fn task_with_history(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        history_length: Option<usize>,
    ) -> AgentResult<Task> {
        task_with_history(self.runtime.as_ref(), auth, task_id, history_length).await
    }

    /// The task's whole event log, in order: the event at index `i` has sequence number
    /// `i + 1`. [`AgentError::TaskNotFound`] when this tenant has no such task.
    pub async fn task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        self.runtime
            .task_manager()
            .get_task_events(auth, task_id)
            .await
    }

    /// The events of the task's log after sequence number `after`, numbered.
    pub async fn task_changes(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        after: u64,
    ) -> AgentResult<Vec<TaskChange>> {
        let events = self.task_events(auth, task_id).await?;
        Ok(TaskChange::number(task_id, events, after))
    }

    /// One page of the tenant's tasks matching `query` (snapshots, without history).
    ///
    /// Thread, state and time are filtered by the store on its index. The agent is not
    /// indexed: the store's pages are read in turn and only the agent's tasks kept, until the
    /// page is full; the token still marks a position in the store's order, so paging neither
    /// repeats nor skips a task. With an agent, `total_size` counts the store's matches before
    /// the agent filter.
    pub async fn tasks(&self, auth: &AuthContext, query: &TaskQuery) -> AgentResult<Page<Task>> {
        let filter = ListTasksFilter {
            thread_id: query.thread_id.clone(),
            state: query.state,
            page_size: query.page_size,
            page_token: query.page_token.clone().filter(|t| !t.is_empty()),
            order: query.order,
        };
        match &query.agent {
            None => self.runtime.task_manager().list_tasks(auth, &filter).await,
            Some(agent) => {
                self.filtered_tasks(auth, filter, |task| {
                    (EngineMeta::of(&task.metadata).agent.as_deref() == Some(agent.as_str()))
                        .then_some(task)
                })
                .await
            }
        }
    }

    /// One page of the actions waiting for approval (tasks `input-required` with a pending
    /// request), oldest task first; `thread_id` narrows them to one thread. Paged as
    /// [`Reads::tasks`] with a filter the store does not index.
    pub async fn pending_approvals(
        &self,
        auth: &AuthContext,
        thread_id: Option<&ThreadId>,
        page_size: Option<u32>,
        page_token: Option<String>,
    ) -> AgentResult<Page<PendingApproval>> {
        let filter = ListTasksFilter {
            thread_id: thread_id.cloned(),
            state: Some(TaskState::InputRequired),
            page_size,
            page_token: page_token.filter(|t| !t.is_empty()),
            order: TaskOrder::Created,
        };
        self.filtered_tasks(auth, filter, |task| {
            let request = EngineMeta::of(&task.metadata).pending_approval?;
            Some(PendingApproval {
                task_id: task.id,
                thread_id: task.thread_id,
                request,
            })
        })
        .await
    }

    /// A page of what `keep` makes of the store's matches of `filter`, read through
    /// [`StorePages`] at the filter's page size.
    async fn filtered_tasks<T>(
        &self,
        auth: &AuthContext,
        filter: ListTasksFilter,
        mut keep: impl FnMut(Task) -> Option<T>,
    ) -> AgentResult<Page<T>> {
        let size = filter.effective_page_size()?;
        let mut pages = StorePages::new(filter, size);
        let mut items = Vec::new();
        while let Some(tasks) = pages.next(self, auth, items.len()).await? {
            items.extend(tasks.into_iter().filter_map(&mut keep));
        }
        Ok(pages.page(items))
    }

    // Threads.

    /// Whether the tenant holds anything of the thread: history, queued work or values.
    pub async fn thread_exists(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<bool> {
        let store = self.runtime.thread_store();
        Ok(!store.read_history(auth, thread_id, 0, 1).await?.is_empty()
            || store.queue_len(auth, thread_id).await? > 0
            || !store.kv_keys(auth, thread_id).await?.is_empty())
    }

    /// The thread's state: terminated or not, its parent and children, its queue's length.
    /// [`AgentError::ThreadNotFound`] when the tenant holds nothing of it.
    pub async fn thread(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<ThreadSummary> {
        self.require_thread(auth, thread_id).await?;
        let store = self.runtime.thread_store();
        Ok(ThreadSummary {
            thread_id: thread_id.clone(),
            terminated_at: store.kv_get(auth, thread_id, TERMINATED_AT_KEY).await?,
            parent_thread_id: store
                .child(auth, thread_id)
                .await?
                .map(|c| c.parent_thread_id),
            children: store.children(auth, thread_id).await?,
            queued: store.queue_len(auth, thread_id).await?,
        })
    }

    /// At most `limit` entries of the thread's history after position `after` (positions
    /// start at 1). An empty page of a thread the tenant holds nothing of is
    /// [`AgentError::ThreadNotFound`].
    pub async fn thread_messages(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        let entries = self
            .runtime
            .thread_store()
            .read_history(auth, thread_id, after, limit)
            .await?;
        if entries.is_empty() {
            self.require_thread(auth, thread_id).await?;
        }
        Ok(entries)
    }

    /// A task's own entries of its thread's history (its input, its model's answers, its
    /// tool calls and results), oldest first, with the thread's id: the task's conversation.
    /// Read back from the thread's end to the task's first input (decision 251), so a recent
    /// task on a long thread costs a page or two whatever the thread's length; a task that
    /// never ran, one page. [`AgentError::TaskNotFound`] when this tenant has no such task.
    pub async fn task_messages(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<(ThreadId, Vec<HistoryEntry>)> {
        let task = self.task(auth, task_id).await?;
        let fresh = task.state() == TaskState::Submitted;
        let events = self.task_events(auth, task_id).await?;
        let first = events
            .iter()
            .filter_map(TaskEvent::as_message)
            .find(|m| m.role == keel_core::Role::User)
            .map(|m| m.message_id.as_str().to_owned());
        let store = self.runtime.thread_store();
        let mut entries =
            crate::executor::read_back(store.as_ref(), auth, &task.thread_id, |page| {
                fresh
                    || page
                        .iter()
                        .any(|e| crate::executor::is_input(&e.message, first.as_deref()))
            })
            .await?;
        entries.retain(|e| crate::executor::is_tagged(&e.message, task_id));
        Ok((task.thread_id, entries))
    }

    /// The first `limit` items of the thread's queue, oldest first. An empty queue of a
    /// thread the tenant holds nothing of is [`AgentError::ThreadNotFound`].
    pub async fn thread_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>> {
        let items = self
            .runtime
            .thread_store()
            .peek_queue(auth, thread_id, limit)
            .await?;
        if items.is_empty() {
            self.require_thread(auth, thread_id).await?;
        }
        Ok(items)
    }

    async fn require_thread(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<()> {
        if self.thread_exists(auth, thread_id).await? {
            Ok(())
        } else {
            Err(AgentError::ThreadNotFound {
                thread_id: thread_id.clone(),
            })
        }
    }

    // Runs.

    /// Run records matching `query`, newest first, each with its report rendered from the
    /// stored run (redacted as persisted; decision 257). A record whose report cannot be
    /// read (a version this Keel does not read) keeps its stored JSON, so that one old row
    /// does not hide the others; [`run`](Self::run) names the version it refuses.
    pub async fn runs(&self, auth: &AuthContext, query: &RunQuery) -> AgentResult<Vec<RunRecord>> {
        let mut records = self
            .runtime
            .run_store()
            .find_run_reports(auth, query)
            .await?;
        for record in &mut records {
            if let Ok(rendered) = RunReport::render(record.report.clone()) {
                record.report = rendered;
            }
        }
        Ok(records)
    }

    /// The record of one run, if this tenant recorded it, with its report rendered from the
    /// stored run (decision 257); a report of a version this Keel does not read is
    /// [`AgentError::InvalidInput`] naming the version.
    pub async fn run(&self, auth: &AuthContext, run_id: &RunId) -> AgentResult<Option<RunRecord>> {
        let Some(mut record) = self
            .runtime
            .run_store()
            .get_run_report(auth, run_id)
            .await?
        else {
            return Ok(None);
        };
        record.report = RunReport::render(std::mem::take(&mut record.report))?;
        Ok(Some(record))
    }

    /// The record of the task's newest run, if one was recorded.
    pub async fn latest_run(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Option<RunRecord>> {
        let query = RunQuery {
            task_id: Some(task_id.clone()),
            limit: Some(1),
            ..RunQuery::default()
        };
        Ok(self.runs(auth, &query).await?.into_iter().next())
    }

    // Watches.

    /// Follow the task's event log from after sequence number `after` (0: from its first
    /// event): first what the log holds, then each event as it is appended, until a terminal
    /// status. A task this tenant does not have ends the watch with
    /// [`AgentError::TaskNotFound`]. A watch from past a terminal status has nothing left to
    /// hand out and waits: look at the task's state first (as `SubscribeToTask` does).
    pub fn watch_task(&self, auth: &AuthContext, task_id: &TaskId, after: u64) -> TaskWatch {
        TaskWatch::new(self.clone(), auth.clone(), task_id.clone(), after)
    }

    /// Follow every task of the thread from `from` (the default: from each task's first
    /// event): the events the logs hold, then new ones, including those of tasks created
    /// later. The watch never ends by itself.
    pub fn watch_thread(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        from: ThreadPosition,
    ) -> ThreadWatch {
        ThreadWatch::new(self.clone(), auth.clone(), thread_id.clone(), from)
    }

    /// The ids of the thread's tasks, oldest first, leaving out `skip`.
    async fn thread_task_ids(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        skip: &HashSet<TaskId>,
    ) -> AgentResult<Vec<TaskId>> {
        let tasks = self.runtime.task_manager();
        let filter = ListTasksFilter {
            thread_id: Some(thread_id.clone()),
            page_size: Some(ListTasksFilter::MAX_PAGE_SIZE),
            ..ListTasksFilter::default()
        };
        let all = keel_runtime::list_all_tasks(tasks.as_ref(), auth, filter).await?;
        Ok(all
            .into_iter()
            .filter(|t| !skip.contains(&t.id))
            .map(|t| t.id)
            .collect())
    }
}

/// The stored task without its history, or [`AgentError::TaskNotFound`]: the one read of a
/// task by id that the engine and the reads share.
pub(crate) async fn stored_task(
    runtime: &dyn Runtime,
    auth: &AuthContext,
    task_id: &TaskId,
) -> AgentResult<Task> {
    runtime
        .task_manager()
        .get_task(auth, task_id)
        .await?
        .ok_or_else(|| task_not_found(task_id))
}

/// The task with its history rebuilt from its event log (the last `history_length` messages
/// when given), or [`AgentError::TaskNotFound`].
pub(crate) async fn task_with_history(
    runtime: &dyn Runtime,
    auth: &AuthContext,
    task_id: &TaskId,
    history_length: Option<usize>,
) -> AgentResult<Task> {
    load_task_with_history(
        runtime.task_manager().as_ref(),
        auth,
        task_id,
        history_length,
    )
    .await?
    .ok_or_else(|| task_not_found(task_id))
}

fn task_not_found(task_id: &TaskId) -> AgentError {
    AgentError::TaskNotFound {
        task_id: task_id.clone(),
    }
}
