//! Task persistence: a snapshot per task plus an append-only event log, from which the
//! task's message history is rebuilt on demand.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use dashmap::DashMap;

use crate::scoped::{scoped, Scoped, ScopedParts};
use chrono::{DateTime, Utc};
use keel_core::{AgentError, AgentResult, Task, TaskEvent, TaskId, TaskState, ThreadId};

use crate::AuthContext;

/// Which tasks to list, and which page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListTasksFilter {
    /// Only tasks of this thread.
    pub thread_id: Option<ThreadId>,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// At most this many per page (default 50, at most 100).
    pub page_size: Option<u32>,
    /// Where to continue, from a previous [`Page::next_page_token`] (see
    /// [`TaskManager::list_tasks`] for what a token means when the list changes).
    pub page_token: Option<String>,
    /// In which order, and for [`TaskOrder::RecentlyUpdated`] since when.
    pub order: TaskOrder,
}

/// In which order [`TaskManager::list_tasks`] lists tasks. Each store pages either order on
/// an index, so a page costs the same however many tasks the tenant has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TaskOrder {
    /// Oldest first, by when each task was first saved (re-saving does not move a task).
    #[default]
    Created,
    /// Most recently updated first, by the status timestamp (A2A's `ListTasks` order), ties
    /// broken by task id, descending. Saving a task with a new status moves it to the front.
    RecentlyUpdated {
        /// Only tasks whose status timestamp is at or after this.
        since: Option<DateTime<Utc>>,
    },
}

/// Where a page in [`TaskOrder::RecentlyUpdated`] ended: the status timestamp (microseconds
/// since the Unix epoch) and id of its last task. Stores issue it as the page token
/// `<micros>:<task id>`; the next page holds the tasks strictly after it in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatedCursor {
    /// The status timestamp of the last task returned, in microseconds.
    pub micros: i64,
    /// Its id.
    pub task_id: TaskId,
}

impl UpdatedCursor {
    /// The position of `task` in the order.
    pub fn of(task: &Task) -> Self {
        Self {
            micros: updated_micros(task),
            task_id: task.id.clone(),
        }
    }

    /// The page token.
    pub fn token(&self) -> String {
        self.to_string()
    }

    /// The cursor a page token names; `None` for no token. A token no store could have
    /// issued is [`AgentError::InvalidInput`] naming `page_token`.
    pub fn parse(token: Option<&str>) -> AgentResult<Option<Self>> {
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        token
            .split_once(':')
            .and_then(|(micros, id)| {
                Some(Self {
                    micros: micros.parse().ok()?,
                    task_id: TaskId::from(id),
                })
            })
            .map(Some)
            .ok_or_else(|| {
                AgentError::invalid_input(
                    "page_token",
                    format!("`{token}` is not a token this server issued"),
                )
            })
    }

    /// Whether `(micros, task_id)` comes after this cursor in the order (is older, or as old
    /// with a smaller id).
    pub fn precedes(&self, micros: i64, task_id: &str) -> bool {
        micros < self.micros || (micros == self.micros && task_id < self.task_id.as_str())
    }
}

/// The page token, `<micros>:<task id>`.
impl std::fmt::Display for UpdatedCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.micros, self.task_id)
    }
}

/// A task's status timestamp in microseconds since the Unix epoch: the key of
/// [`TaskOrder::RecentlyUpdated`] in every store.
pub fn updated_micros(task: &Task) -> i64 {
    task.status().timestamp.timestamp_micros()
}

impl ListTasksFilter {
    /// The default page size.
    pub const DEFAULT_PAGE_SIZE: u32 = 50;
    /// The largest page size honoured.
    pub const MAX_PAGE_SIZE: u32 = 100;

    /// The effective page size; zero is [`AgentError::InvalidInput`].
    pub fn effective_page_size(&self) -> AgentResult<usize> {
        match self.page_size {
            None => Ok(Self::DEFAULT_PAGE_SIZE as usize),
            Some(0) => Err(AgentError::invalid_input("page_size", "must be at least 1")),
            Some(n) => Ok(n.min(Self::MAX_PAGE_SIZE) as usize),
        }
    }

    /// The page size and where the page starts in the filter's order: what every store
    /// reads from the request before it looks at its data. A zero `page_size` or a page
    /// token no store could have issued for this order is [`AgentError::InvalidInput`].
    ///
    /// ```
    /// use keel_runtime::{ListTasksFilter, TaskPageStart};
    /// let filter = ListTasksFilter { page_token: Some("17".into()), ..Default::default() };
    /// assert_eq!(filter.page_start().unwrap(), (50, TaskPageStart::Created { after: 17 }));
    /// let bad = ListTasksFilter { page_token: Some("-1".into()), ..Default::default() };
    /// assert!(bad.page_start().is_err());
    /// ```
    pub fn page_start(&self) -> AgentResult<(usize, TaskPageStart)> {
        let page_size = self.effective_page_size()?;
        let token = self.page_token.as_deref();
        let start = match self.order {
            TaskOrder::Created => TaskPageStart::Created {
                after: parse_seq_token(token)?,
            },
            TaskOrder::RecentlyUpdated { since } => TaskPageStart::RecentlyUpdated {
                since: since.map(|t| t.timestamp_micros()),
                after: UpdatedCursor::parse(token)?,
            },
        };
        Ok((page_size, start))
    }
}

/// Where a page of [`TaskManager::list_tasks`] starts, read from its [`ListTasksFilter`] by
/// [`ListTasksFilter::page_start`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskPageStart {
    /// [`TaskOrder::Created`]: the tasks whose creation seq is greater than `after` (0 when
    /// there is no token). A token is the creation seq of the previous page's last task:
    /// keyset pagination, which unlike an offset neither repeats nor skips tasks when earlier
    /// ones leave the filter or new ones arrive. It is at most `i64::MAX`, which every store's
    /// counter holds.
    Created {
        /// The creation seq of the last task already returned.
        after: u64,
    },
    /// [`TaskOrder::RecentlyUpdated`]: the tasks whose status timestamp is at or after
    /// `since` (microseconds since the Unix epoch) and that come after the cursor.
    RecentlyUpdated {
        /// The oldest status timestamp listed, in microseconds.
        since: Option<i64>,
        /// Where the previous page ended; `None` for the first page.
        after: Option<UpdatedCursor>,
    },
}

/// A [`TaskOrder::Created`] page token: a creation seq, at most `i64::MAX` (no store issues a
/// larger one); none or empty is 0, the start.
fn parse_seq_token(token: Option<&str>) -> AgentResult<u64> {
    match token {
        None | Some("") => Ok(0),
        Some(token) => token
            .parse::<u64>()
            .ok()
            .filter(|seq| i64::try_from(*seq).is_ok())
            .ok_or_else(|| {
                AgentError::invalid_input(
                    "page_token",
                    format!("`{token}` is not a token this server issued"),
                )
            }),
    }
}

/// One page of results.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, oldest first.
    pub items: Vec<T>,
    /// Pass this back to get the next page; `None` on the last page.
    pub next_page_token: Option<String>,
    /// How many items match the filter in all.
    pub total_size: usize,
}

impl<T> Page<T> {
    /// The page of `rows`, read in the page's order from its start and at most `page_size + 1`
    /// of them: one row more than a page tells whether another page follows, without a
    /// second query. `item` turns a row into an item and its position (a creation seq, an
    /// [`UpdatedCursor`]); the position of the last item is the next page token when more
    /// rows follow. The one paging rule of every store.
    ///
    /// ```
    /// use keel_runtime::Page;
    /// let rows = [(1, "a"), (2, "b"), (3, "c")];
    /// let page = Page::from_rows(rows, 2, 7, |(seq, name)| Ok((name, seq))).unwrap();
    /// assert_eq!(page.items, ["a", "b"]);
    /// assert_eq!(page.next_page_token.as_deref(), Some("2"));
    /// assert_eq!(page.total_size, 7);
    /// let last = Page::from_rows([(3, "c")], 2, 7, |(seq, name)| Ok((name, seq))).unwrap();
    /// assert_eq!(last.next_page_token, None);
    /// ```
    pub fn from_rows<R, P: std::fmt::Display>(
        rows: impl IntoIterator<Item = R>,
        page_size: usize,
        total_size: usize,
        mut item: impl FnMut(R) -> AgentResult<(T, P)>,
    ) -> AgentResult<Self> {
        let mut rows = rows.into_iter();
        let mut items = Vec::with_capacity(page_size.min(rows.size_hint().0));
        let mut last = None;
        for row in rows.by_ref().take(page_size) {
            let (value, position) = item(row)?;
            items.push(value);
            last = Some(position);
        }
        let more = rows.next().is_some();
        Ok(Page {
            items,
            next_page_token: last.filter(|_| more).map(|position| position.to_string()),
            total_size,
        })
    }
}

/// Persists tasks (as snapshots) and their event logs, namespaced by tenant.
///
/// Snapshots do not carry the message history: messages live in the event log as
/// [`TaskEvent::Message`] and [`load_task_with_history`] rebuilds the history.
#[async_trait]
pub trait TaskManager: keel_core::MaybeSend + keel_core::MaybeSync {
    /// The task's snapshot, or `Ok(None)` when this tenant has no such task.
    async fn get_task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Option<Task>>;
    /// The tenant's tasks matching `filter`, in its [`TaskOrder`] (by default oldest first,
    /// by when each task was first saved; re-saving does not move a task), one page at a
    /// time. Items carry no history.
    ///
    /// Page tokens are opaque, and a token stays meaningful while the list changes under a
    /// client that pages: it marks a position after the last task returned, so the next page
    /// neither repeats a task nor skips one that still matches, even when tasks were added or
    /// left the filter (a state change) in between. (In [`TaskOrder::RecentlyUpdated`] a task
    /// updated while a client pages moves to the front, before the token.) A well-formed token past the end (every
    /// task after it has left the filter) yields an empty last page: no items, no
    /// `next_page_token`, and `total_size` counting the current matches. A token this store
    /// could not have issued is [`AgentError::InvalidInput`] naming `page_token`; a zero
    /// `page_size` is [`AgentError::InvalidInput`] naming `page_size`.
    async fn list_tasks(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
    ) -> AgentResult<Page<Task>>;
    /// Insert or replace the task's snapshot (its `history` is not stored).
    async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()>;
    /// Append to the task's event log; [`AgentError::TaskNotFound`] if the task is unknown.
    async fn add_task_event(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        event: &TaskEvent,
    ) -> AgentResult<()>;
    /// Insert or replace the task's snapshot (as [`TaskManager::save_task`]) and append
    /// `events` to its log in that order (as [`TaskManager::add_task_event`] would, one by
    /// one), so the engine's paired writes (a status change and its event, a new task and its
    /// first message) cost one write.
    ///
    /// The snapshot is written first, so the events of a task saved here for the first time
    /// are accepted. With an empty `events` this is exactly `save_task`.
    ///
    /// Keel's stores override it to be atomic (on an error nothing is written) and one round
    /// trip (memory: one map update; SQLite: one write job; Redis: one script). The default,
    /// for backends that do not, makes the calls one after the other: neither atomic nor
    /// cheaper, but with the same result when nothing fails.
    async fn save_task_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        self.save_task(auth, task).await?;
        for event in events {
            self.add_task_event(auth, &task.id, event).await?;
        }
        Ok(())
    }
    /// The task's events in the order they were added; [`AgentError::TaskNotFound`] if the
    /// task is unknown.
    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>>;

    /// Every tenant that has saved a task in this store (in no particular order), so that a
    /// restarted process can recover the unfinished work of all of them. A system-level call:
    /// it exposes tenant names, never their data. Stores that cannot list tenants answer
    /// [`AgentError::Unsupported`] (the default), and recovery then covers the default tenant
    /// only.
    async fn tenants(&self) -> AgentResult<Vec<AuthContext>> {
        Err(AgentError::Unsupported {
            what: "listing the tenants of this task manager".into(),
        })
    }
}

/// Every task `filter` matches, read page after page (each of `filter`'s `page_size`) in
/// the listing's order: for the engine's sweeps and recovery, which must see every match.
pub async fn list_all_tasks(
    tasks: &dyn TaskManager,
    auth: &AuthContext,
    mut filter: ListTasksFilter,
) -> AgentResult<Vec<Task>> {
    let mut all = Vec::new();
    loop {
        let page = tasks.list_tasks(auth, &filter).await?;
        all.extend(page.items);
        match page.next_page_token {
            Some(token) => filter.page_token = Some(token),
            None => return Ok(all),
        }
    }
}

/// The task with its history rebuilt from the event log, keeping only the last
/// `history_length` messages when given. `Ok(None)` when the task is unknown.
pub async fn load_task_with_history(
    tasks: &dyn TaskManager,
    auth: &AuthContext,
    task_id: &TaskId,
    history_length: Option<usize>,
) -> AgentResult<Option<Task>> {
    // Two independent reads, sent together: one round trip (a Redis pipeline, one SQLite
    // read batch) instead of two, for every task handed out with its history.
    let (task, events) = futures::join!(
        tasks.get_task(auth, task_id),
        tasks.get_task_events(auth, task_id)
    );
    let Some(mut task) = task? else {
        return Ok(None);
    };
    set_history(&mut task, events?, history_length);
    Ok(Some(task))
}

/// `task` (a snapshot just read) with its history from the event log: what
/// [`load_task_with_history`] does for a caller that already holds the snapshot.
pub async fn attach_history(
    tasks: &dyn TaskManager,
    auth: &AuthContext,
    mut task: Task,
    history_length: Option<usize>,
) -> AgentResult<Task> {
    let events = tasks.get_task_events(auth, &task.id).await?;
    set_history(&mut task, events, history_length);
    Ok(task)
}

/// The messages of `events` (the last `history_length` when given) as `task`'s history.
fn set_history(task: &mut Task, events: Vec<TaskEvent>, history_length: Option<usize>) {
    let mut history: Vec<_> = events
        .into_iter()
        .filter_map(|event| match event {
            TaskEvent::Message { message } => Some(message),
            _ => None,
        })
        .collect();
    if let Some(keep) = history_length {
        let skip = history.len().saturating_sub(keep);
        history.drain(..skip);
    }
    task.history = history;
}

struct Entry {
    seq: u64,
    task: Task,
    events: Vec<TaskEvent>,
    /// Whether the task is already in the finished queue of the retention policy.
    counted_finished: bool,
}

/// A [`TaskManager`] over a concurrent hash map. Nothing survives a restart.
///
/// Retention is bounded so memory stays flat under load: once more than
/// [`InMemoryTaskManager::DEFAULT_FINISHED_CAP`] (or the configured number of) tasks have
/// reached a terminal state, the oldest finished ones are evicted with their event logs.
/// Tasks that are not terminal are never evicted.
pub struct InMemoryTaskManager {
    entries: DashMap<Scoped<TaskId>, Entry, foldhash::fast::RandomState>,
    next_seq: AtomicU64,
    finished: std::sync::Mutex<std::collections::VecDeque<Scoped<TaskId>>>,
    finished_cap: usize,
}

impl Default for InMemoryTaskManager {
    fn default() -> Self {
        Self::with_finished_cap(Self::DEFAULT_FINISHED_CAP)
    }
}

impl InMemoryTaskManager {
    /// How many finished tasks are kept by default.
    pub const DEFAULT_FINISHED_CAP: usize = 10_000;

    /// An empty store with the default retention.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store keeping at most `cap` finished tasks (at least 1).
    pub fn with_finished_cap(cap: usize) -> Self {
        Self {
            entries: DashMap::default(),
            // Seqs start at 1, so the page token "0" (or none) means "from the start".
            next_seq: AtomicU64::new(1),
            finished: Default::default(),
            finished_cap: cap.max(1),
        }
    }

    /// How many tasks (of every tenant) are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no task is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn note_finished(&self, key: Scoped<TaskId>) {
        let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        finished.push_back(key);
        while finished.len() > self.finished_cap {
            if let Some(oldest) = finished.pop_front() {
                self.entries
                    .remove_if(&oldest, |_, e| e.task.state().is_terminal());
            }
        }
    }

    /// Replace (or insert) the snapshot and append `events` under one hold of the map entry,
    /// so no reader sees one without the other; shared by `save_task` so the retention
    /// bookkeeping is the same on both paths.
    fn save_with_events(&self, auth: &AuthContext, task: &Task, events: &[TaskEvent]) {
        let snapshot = task.clone_without_history();
        let key = Self::key(auth, &task.id);
        let newly_finished = {
            let mut entry = match self.entries.entry(key.clone()) {
                dashmap::mapref::entry::Entry::Occupied(occupied) => {
                    let mut entry = occupied.into_ref();
                    entry.task = snapshot;
                    entry
                }
                dashmap::mapref::entry::Entry::Vacant(vacant) => vacant.insert(Entry {
                    seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
                    task: snapshot,
                    events: Vec::new(),
                    counted_finished: false,
                }),
            };
            entry.events.extend_from_slice(events);
            let newly = entry.task.state().is_terminal() && !entry.counted_finished;
            entry.counted_finished |= newly;
            newly
        };
        // After the entry's lock is dropped: eviction takes other entries' locks.
        if newly_finished {
            self.note_finished(key);
        }
    }

    fn key(auth: &AuthContext, task_id: &TaskId) -> Scoped<TaskId> {
        Scoped::new(auth, task_id.clone())
    }
}

impl InMemoryTaskManager {
    /// The tenant's entries whose task passes the filter's thread and state.
    fn matching<'a>(
        &'a self,
        auth: &'a AuthContext,
        filter: &'a ListTasksFilter,
    ) -> impl Iterator<Item = dashmap::mapref::multiple::RefMulti<'a, Scoped<TaskId>, Entry>> + 'a
    {
        self.entries.iter().filter(move |e| {
            e.key().is_of(auth)
                && filter
                    .thread_id
                    .as_ref()
                    .is_none_or(|t| &e.task.thread_id == t)
                && filter.state.is_none_or(|s| e.task.state() == s)
        })
    }

    /// [`TaskOrder::RecentlyUpdated`] in memory: every task of the map is looked at, which
    /// is what a map without indexes can do (the durable stores page on an index).
    fn list_recently_updated(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
        page_size: usize,
        since: Option<i64>,
        after: Option<UpdatedCursor>,
    ) -> AgentResult<Page<Task>> {
        let mut matching: Vec<(i64, Task)> = self
            .matching(auth, filter)
            .map(|e| (updated_micros(&e.task), e.task.clone()))
            .filter(|(micros, _)| since.is_none_or(|since| *micros >= since))
            .collect();
        let total_size = matching.len();
        matching.retain(|(micros, task)| {
            after
                .as_ref()
                .is_none_or(|after| after.precedes(*micros, task.id.as_str()))
        });
        matching.sort_by(|(ma, a), (mb, b)| mb.cmp(ma).then_with(|| b.id.cmp(&a.id)));
        Page::from_rows(matching, page_size, total_size, |(_, task)| {
            let cursor = UpdatedCursor::of(&task);
            Ok((task, cursor))
        })
    }
}

#[async_trait]
impl TaskManager for InMemoryTaskManager {
    async fn tenants(&self) -> AgentResult<Vec<AuthContext>> {
        let tenants: std::collections::HashSet<AuthContext> =
            self.entries.iter().map(|e| e.key().tenant()).collect();
        Ok(tenants.into_iter().collect())
    }

    async fn get_task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Option<Task>> {
        Ok(self
            .entries
            .get(&scoped(auth, task_id) as &dyn ScopedParts<TaskId>)
            .map(|e| e.task.clone()))
    }

    async fn list_tasks(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
    ) -> AgentResult<Page<Task>> {
        let (page_size, start) = filter.page_start()?;
        let after = match start {
            TaskPageStart::Created { after } => after,
            TaskPageStart::RecentlyUpdated { since, after } => {
                return self.list_recently_updated(auth, filter, page_size, since, after);
            }
        };
        let mut matching: Vec<(u64, Task)> = self
            .matching(auth, filter)
            .map(|e| (e.seq, e.task.clone()))
            .collect();
        matching.sort_by_key(|(seq, _)| *seq);
        let total_size = matching.len();
        let rest = matching.into_iter().filter(|(seq, _)| *seq > after);
        Page::from_rows(rest, page_size, total_size, |(seq, task)| Ok((task, seq)))
    }

    async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        self.save_with_events(auth, task, &[]);
        Ok(())
    }

    async fn save_task_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        self.save_with_events(auth, task, events);
        Ok(())
    }

    async fn add_task_event(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        event: &TaskEvent,
    ) -> AgentResult<()> {
        let mut entry = self
            .entries
            .get_mut(&scoped(auth, task_id) as &dyn ScopedParts<TaskId>)
            .ok_or_else(|| AgentError::TaskNotFound {
                task_id: task_id.clone(),
            })?;
        entry.events.push(event.clone());
        Ok(())
    }

    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        self.entries
            .get(&scoped(auth, task_id) as &dyn ScopedParts<TaskId>)
            .map(|e| e.events.clone())
            .ok_or_else(|| AgentError::TaskNotFound {
                task_id: task_id.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::Message;

    #[test]
    fn page_start_reads_the_token_of_each_order_and_refuses_foreign_ones() {
        let created = |token: Option<&str>| ListTasksFilter {
            page_token: token.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(
            created(None).page_start().unwrap(),
            (50, TaskPageStart::Created { after: 0 })
        );
        assert_eq!(
            created(Some("")).page_start().unwrap().1,
            TaskPageStart::Created { after: 0 }
        );
        assert_eq!(
            created(Some("17")).page_start().unwrap().1,
            TaskPageStart::Created { after: 17 }
        );
        // No store issues a seq past i64::MAX, nor a negative one.
        for bad in ["-1", "x", "9223372036854775808", "1:t-1"] {
            assert!(
                matches!(created(Some(bad)).page_start(), Err(AgentError::InvalidInput { ref field, .. }) if field == "page_token"),
                "{bad}"
            );
        }
        let since = Utc::now();
        let updated = |token: &str| ListTasksFilter {
            page_token: Some(token.to_owned()),
            page_size: Some(500),
            order: TaskOrder::RecentlyUpdated { since: Some(since) },
            ..Default::default()
        };
        assert_eq!(
            updated("12:t-1").page_start().unwrap(),
            (
                ListTasksFilter::MAX_PAGE_SIZE as usize,
                TaskPageStart::RecentlyUpdated {
                    since: Some(since.timestamp_micros()),
                    after: Some(UpdatedCursor {
                        micros: 12,
                        task_id: TaskId::from("t-1"),
                    }),
                }
            )
        );
        assert!(matches!(
            updated("17").page_start(),
            Err(AgentError::InvalidInput { ref field, .. }) if field == "page_token"
        ));
        let zero = ListTasksFilter {
            page_size: Some(0),
            ..Default::default()
        };
        assert!(matches!(
            zero.page_start(),
            Err(AgentError::InvalidInput { ref field, .. }) if field == "page_size"
        ));
    }

    fn tenant(user: &str) -> AuthContext {
        AuthContext::new("app", user)
    }

    #[tokio::test]
    async fn history_is_rebuilt_from_the_event_log() {
        let store = InMemoryTaskManager::new();
        let auth = tenant("a");
        let mut task = Task::create(Message::user("q"));
        store.save_task(&auth, &task).await.unwrap();
        for message in [
            task.history[0].clone(),
            Message::agent("a1"),
            Message::agent("a2"),
        ] {
            store
                .add_task_event(&auth, &task.id, &TaskEvent::Message { message })
                .await
                .unwrap();
        }
        task.complete("done").unwrap();
        store.save_task(&auth, &task).await.unwrap();
        let stored = store.get_task(&auth, &task.id).await.unwrap().unwrap();
        assert!(stored.history.is_empty(), "snapshots carry no history");
        let full = load_task_with_history(&store, &auth, &task.id, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            full.history.iter().map(Message::text).collect::<Vec<_>>(),
            ["q", "a1", "a2"]
        );
        let last = load_task_with_history(&store, &auth, &task.id, Some(1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(last.history.len(), 1);
        assert_eq!(last.history[0].text(), "a2");
    }

    #[tokio::test]
    async fn one_tenant_cannot_see_anothers_tasks() {
        let store = InMemoryTaskManager::new();
        let task = Task::create(Message::user("secret"));
        store.save_task(&tenant("a"), &task).await.unwrap();
        assert!(store
            .get_task(&tenant("b"), &task.id)
            .await
            .unwrap()
            .is_none());
        let page = store
            .list_tasks(&tenant("b"), &ListTasksFilter::default())
            .await
            .unwrap();
        assert_eq!(page.total_size, 0);
        let err = store
            .add_task_event(
                &tenant("b"),
                &task.id,
                &TaskEvent::Message {
                    message: Message::user("x"),
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::TaskNotFound { .. }));
    }

    #[tokio::test]
    async fn listing_filters_by_thread_and_paginates_in_order() {
        let store = InMemoryTaskManager::new();
        let auth = tenant("a");
        let thread = ThreadId::from("th");
        let mut ids = Vec::new();
        for _ in 0..5 {
            let task = Task::new(thread.clone());
            ids.push(task.id.clone());
            store.save_task(&auth, &task).await.unwrap();
        }
        store
            .save_task(&auth, &Task::new(ThreadId::from("other")))
            .await
            .unwrap();
        let mut filter = ListTasksFilter {
            thread_id: Some(thread),
            page_size: Some(2),
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = store.list_tasks(&auth, &filter).await.unwrap();
            assert_eq!(page.total_size, 5);
            seen.extend(page.items.into_iter().map(|t| t.id));
            match page.next_page_token {
                Some(token) => filter.page_token = Some(token),
                None => break,
            }
        }
        assert_eq!(seen, ids);
    }

    #[tokio::test]
    async fn bad_page_token_and_zero_page_size_are_invalid_input() {
        let store = InMemoryTaskManager::new();
        let auth = tenant("a");
        let bad = ListTasksFilter {
            page_token: Some("zzz".into()),
            ..Default::default()
        };
        assert!(matches!(
            store.list_tasks(&auth, &bad).await,
            Err(AgentError::InvalidInput { .. })
        ));
        let zero = ListTasksFilter {
            page_size: Some(0),
            ..Default::default()
        };
        assert!(matches!(
            store.list_tasks(&auth, &zero).await,
            Err(AgentError::InvalidInput { .. })
        ));
    }

    #[tokio::test]
    async fn retention_evicts_only_the_oldest_finished_tasks() {
        let store = InMemoryTaskManager::with_finished_cap(2);
        let auth = tenant("a");
        let live = Task::new(ThreadId::new());
        store.save_task(&auth, &live).await.unwrap();
        let mut finished = Vec::new();
        for _ in 0..4 {
            let mut task = Task::new(ThreadId::new());
            store.save_task(&auth, &task).await.unwrap();
            task.complete("done").unwrap();
            store.save_task(&auth, &task).await.unwrap();
            // Saving a finished task again must not count it twice.
            store.save_task(&auth, &task).await.unwrap();
            finished.push(task.id);
        }
        assert_eq!(
            store.len(),
            3,
            "one live task plus the two newest finished ones"
        );
        assert!(
            store.get_task(&auth, &live.id).await.unwrap().is_some(),
            "live tasks are never evicted"
        );
        assert!(store.get_task(&auth, &finished[0]).await.unwrap().is_none());
        assert!(store.get_task(&auth, &finished[3]).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn save_with_events_counts_finished_tasks_for_retention_once() {
        let store = InMemoryTaskManager::with_finished_cap(2);
        let auth = tenant("a");
        let event = TaskEvent::Message {
            message: Message::agent("done"),
        };
        async fn finish(
            store: &InMemoryTaskManager,
            auth: &AuthContext,
            event: &TaskEvent,
        ) -> Task {
            let mut task = Task::new(ThreadId::new());
            task.complete("done").unwrap();
            store
                .save_task_with_events(auth, &task, std::slice::from_ref(event))
                .await
                .unwrap();
            task
        }
        let first = finish(&store, &auth, &event).await;
        // Saving it again must not count it a second time (which would evict it early).
        store
            .save_task_with_events(&auth, &first, std::slice::from_ref(&event))
            .await
            .unwrap();
        let second = finish(&store, &auth, &event).await;
        assert!(
            store.get_task(&auth, &first.id).await.unwrap().is_some(),
            "two finished tasks fit the cap"
        );
        let third = finish(&store, &auth, &event).await;
        assert!(
            store.get_task(&auth, &first.id).await.unwrap().is_none(),
            "the oldest finished task is evicted"
        );
        for kept in [&second, &third] {
            assert_eq!(
                store.get_task_events(&auth, &kept.id).await.unwrap(),
                vec![event.clone()],
                "newer finished tasks are kept with their logs"
            );
        }
    }

    #[tokio::test]
    async fn events_of_unknown_task_are_task_not_found() {
        let store = InMemoryTaskManager::new();
        let err = store
            .get_task_events(&tenant("a"), &TaskId::from("nope"))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            AgentError::TaskNotFound {
                task_id: TaskId::from("nope")
            }
        );
    }
}
