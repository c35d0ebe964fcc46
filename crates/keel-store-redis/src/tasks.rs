//! [`TaskManager`] over Redis: a snapshot string per task, an event list per task, and
//! sorted-set indexes (per tenant, thread, state, thread and state) scored by a per-tenant
//! creation seq, so listings are in creation order and a re-save does not move a task; and
//! the same indexes scored by status time, for the most-recently-updated order.

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult, Task, TaskEvent, TaskId, TaskState, ThreadId};
use keel_runtime::{
    decode_task_event, decode_task_snapshot, encode_task_event, encode_task_events,
    encode_task_snapshot, updated_micros, AuthContext, ListTasksFilter, Page, RunRecord,
    TaskManager, TaskPageStart, UpdatedCursor,
};

use crate::encoding::{micros, reading};
use crate::keys::{fixed, kind, TenantKeys};
use crate::runs::run_record_keys;
use crate::scripts;
use crate::RedisStore;

impl RedisStore {
    /// Save the snapshot with its indexes and append `events` to the task's log, and with
    /// `run` (a run's record and its stored text) save that record too, in one script: one
    /// round trip, all or nothing (the tenant list aside, noted once per process).
    pub(crate) async fn save_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
        run: Option<(&RunRecord, String)>,
    ) -> AgentResult<()> {
        // Encoded before anything is sent, so an encoding error writes nothing.
        let snapshot = encode_task_snapshot(task)?;
        let events = encode_task_events(events, &task.id, Some(&task.thread_id))?;
        // Noted before the save, so the tenant list never misses a tenant with tasks.
        self.note_tenant(auth).await?;
        let keys = self.keys(auth);
        let (id, thread, state) = (
            task.id.as_str(),
            task.thread_id.as_str(),
            task.state().as_str(),
        );
        let events_key = keys.of(kind::TASK_EVENTS, id);
        let script = match run {
            Some(_) => &*scripts::SAVE_TASK_AND_RUN,
            None => &*scripts::SAVE_TASK,
        };
        let mut call = script.prepare_invoke();
        call.key(keys.of(kind::TASK, id))
            .key(keys.of(kind::TASK_META, id))
            .key(keys.fixed(fixed::TASK_SEQ));
        for index in BY_CREATION.holding(&keys, thread, state) {
            call.key(index);
        }
        call.key(&events_key);
        for index in BY_UPDATE.holding(&keys, thread, state) {
            call.key(index);
        }
        call.arg(snapshot)
            .arg(id)
            .arg(thread)
            .arg(state)
            .arg(keys.base())
            .arg(updated_micros(task));
        for event in events {
            call.arg(event);
        }
        if let Some((record, text)) = run {
            let (hash, index_keys) = run_record_keys(&keys, record);
            call.key(hash);
            for key in index_keys {
                call.key(key);
            }
            call.arg(text)
                .arg(record.run_id.as_str())
                .arg(micros(record.recorded_at));
        }
        let outcome: i64 = call
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("save task", &e))?;
        if outcome < 0 {
            return Err(AgentError::storage(format!(
                "Redis key `{events_key}` is not a list, so task {id} was not saved; were keys \
                 under Keel's prefix changed by hand?"
            )));
        }
        Ok(())
    }

    /// [`TaskOrder::RecentlyUpdated`]: a range of one of the by-status-time indexes, newest
    /// first; the token is the last task's score and id.
    async fn list_recently_updated(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
        page_size: usize,
        since: Option<i64>,
        after: Option<UpdatedCursor>,
    ) -> AgentResult<Page<Task>> {
        let keys = self.keys(auth);
        let index = BY_UPDATE.matching(&keys, filter);
        let snapshot_prefix = keys.of(kind::TASK, "");
        let (max, after_id) = match &after {
            Some(after) => (after.micros.to_string(), after.task_id.to_string()),
            None => ("+inf".to_owned(), String::new()),
        };
        let min = since.map_or("-inf".to_owned(), |micros| micros.to_string());
        let mut filled = false;
        loop {
            // One more than a page tells whether another page follows.
            let (total, rows): (i64, Vec<(String, i64, Option<String>)>) =
                scripts::LIST_TASKS_BY_UPDATE
                    .key(&index)
                    .key(keys.fixed(fixed::TASKS))
                    .key(keys.fixed(fixed::TASKS_BY_UPDATE))
                    .arg(&max)
                    .arg(&after_id)
                    .arg(&min)
                    .arg(page_size + 1)
                    .arg(&snapshot_prefix)
                    .invoke_async(&mut self.con())
                    .await
                    .map_err(|e| self.fail("list tasks by update", &e))?;
            if total < 0 {
                if filled {
                    return Err(AgentError::storage(format!(
                        "Redis index `{}` stays out of step with `{}`; were keys under Keel's \
                         prefix changed by hand?",
                        keys.fixed(fixed::TASKS_BY_UPDATE),
                        keys.fixed(fixed::TASKS)
                    )));
                }
                self.index_tasks_by_update(auth).await?;
                filled = true;
                continue;
            }
            let total = usize::try_from(total).unwrap_or(0);
            return Page::from_rows(rows, page_size, total, |(id, micros, snapshot)| {
                let task = listed_task(&index, &snapshot_prefix, &id, snapshot)?;
                let task_id = TaskId::from(id);
                Ok((task, UpdatedCursor { micros, task_id }))
            });
        }
    }

    /// Put the tenant's tasks that were saved before the by-status-time indexes existed into
    /// them: read once per tenant, the first time it is listed in that order.
    async fn index_tasks_by_update(&self, auth: &AuthContext) -> AgentResult<()> {
        let keys = self.keys(auth);
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.fixed(fixed::TASKS))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("read the task index", &e))?;
        tracing::info!(tasks = ids.len(), "indexing stored tasks by status time");
        for id in ids {
            let Some(task) = self.get_task(auth, &TaskId::from(id.as_str())).await? else {
                continue;
            };
            let _: i64 = scripts::INDEX_TASK_UPDATE
                .key(keys.fixed(fixed::TASKS_BY_UPDATE))
                .key(keys.of(kind::TASK_META, &id))
                .arg(&id)
                .arg(updated_micros(&task))
                .arg(keys.base())
                .invoke_async(&mut self.con())
                .await
                .map_err(|e| self.fail("index a task by status time", &e))?;
        }
        Ok(())
    }
}

/// The snapshot of task `id`, which `index` lists, read by a listing script from
/// `<snapshot_prefix><id>`; a missing one means keys were changed behind Keel's back.
fn listed_task(
    index: &str,
    snapshot_prefix: &str,
    id: &str,
    snapshot: Option<String>,
) -> AgentResult<Task> {
    let key = format!("{snapshot_prefix}{id}");
    let snapshot = snapshot.ok_or_else(|| {
        AgentError::storage(format!(
            "Redis index `{index}` lists task {id} but `{key}` is missing; \
             were keys under Keel's prefix deleted by hand?"
        ))
    })?;
    decode_snapshot(&key, &snapshot)
}

/// Decode the task snapshot found at `key`.
fn decode_snapshot(key: &str, text: &str) -> AgentResult<Task> {
    decode_task_snapshot("redis", &reading(key), text)
}

/// The four sorted-set indexes of one task order, scored alike: the tenant's tasks, and
/// those of a thread, of a state, and of a state in a thread. Every filter combination has its
/// own index, so a page costs O(log n + page).
struct TaskIndexes {
    all: &'static str,
    by_thread: &'static str,
    by_state: &'static str,
    by_thread_state: &'static str,
}

/// The indexes scored by the per-tenant creation seq.
const BY_CREATION: TaskIndexes = TaskIndexes {
    all: fixed::TASKS,
    by_thread: kind::TASKS_BY_THREAD,
    by_state: kind::TASKS_BY_STATE,
    by_thread_state: kind::TASKS_BY_THREAD_STATE,
};

/// The indexes scored by status time.
const BY_UPDATE: TaskIndexes = TaskIndexes {
    all: fixed::TASKS_BY_UPDATE,
    by_thread: kind::TASKS_BY_UPDATE_THREAD,
    by_state: kind::TASKS_BY_UPDATE_STATE,
    by_thread_state: kind::TASKS_BY_UPDATE_THREAD_STATE,
};

impl TaskIndexes {
    /// The index of the tasks of `thread` in `state`, either `None` meaning any.
    fn of(&self, keys: &TenantKeys, thread: Option<&str>, state: Option<&str>) -> String {
        match (thread, state) {
            (None, None) => keys.fixed(self.all),
            (Some(thread), None) => keys.of(self.by_thread, thread),
            (None, Some(state)) => keys.of(self.by_state, state),
            (Some(thread), Some(state)) => {
                keys.of(self.by_thread_state, &format!("{state}:{thread}"))
            }
        }
    }

    /// The index that lists exactly the tasks `filter` asks for.
    fn matching(&self, keys: &TenantKeys, filter: &ListTasksFilter) -> String {
        let thread = filter.thread_id.as_ref().map(ThreadId::as_str);
        self.of(keys, thread, filter.state.map(TaskState::as_str))
    }

    /// The four indexes that hold a task of `thread` in `state`, in the order the save
    /// script takes them: all, by thread, by state, by both.
    fn holding(&self, keys: &TenantKeys, thread: &str, state: &str) -> [String; 4] {
        [
            self.of(keys, None, None),
            self.of(keys, Some(thread), None),
            self.of(keys, None, Some(state)),
            self.of(keys, Some(thread), Some(state)),
        ]
    }
}

#[async_trait]
impl TaskManager for RedisStore {
    async fn get_task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Option<Task>> {
        let key = self.keys(auth).of(kind::TASK, task_id.as_str());
        let text = self.read_text("GET task", &key, None).await?;
        text.map(|text| decode_snapshot(&key, &text)).transpose()
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
                return self
                    .list_recently_updated(auth, filter, page_size, since, after)
                    .await;
            }
        };
        let keys = self.keys(auth);
        let index = BY_CREATION.matching(&keys, filter);
        let snapshot_prefix = keys.of(kind::TASK, "");
        // One more than a page tells whether another page follows.
        let (total, rows): (u64, Vec<(String, String, Option<String>)>) = scripts::LIST_TASKS
            .key(&index)
            .arg(after)
            .arg(page_size + 1)
            .arg(&snapshot_prefix)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("list tasks", &e))?;
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        Page::from_rows(rows, page_size, total, |(id, seq, snapshot)| {
            Ok((listed_task(&index, &snapshot_prefix, &id, snapshot)?, seq))
        })
    }

    async fn tenants(&self) -> AgentResult<Vec<AuthContext>> {
        self.list_tenants().await
    }

    async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        self.save_with_events(auth, task, &[], None).await
    }

    async fn save_task_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        self.save_with_events(auth, task, events, None).await
    }

    async fn add_task_event(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        event: &TaskEvent,
    ) -> AgentResult<()> {
        let keys = self.keys(auth);
        // Checking the snapshot and appending in one script: an event can never land in the
        // log of a task that does not exist.
        let length: i64 = scripts::ADD_TASK_EVENT
            .key(keys.of(kind::TASK, task_id.as_str()))
            .key(keys.of(kind::TASK_EVENTS, task_id.as_str()))
            .arg(encode_task_event(event, task_id, None)?)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("append task event", &e))?;
        if length < 0 {
            return Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            });
        }
        Ok(())
    }

    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        let keys = self.keys(auth);
        let events_key = keys.of(kind::TASK_EVENTS, task_id.as_str());
        // The thread, from the task's index entry: the log leaves it out (decision 269).
        let (exists, thread, events): (bool, Option<String>, Vec<String>) = redis::pipe()
            .atomic()
            .exists(keys.of(kind::TASK, task_id.as_str()))
            .hget(keys.of(kind::TASK_META, task_id.as_str()), "thread")
            .lrange(&events_key, 0, -1)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("read task events", &e))?;
        if !exists {
            return Err(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            });
        }
        let thread = thread.map(ThreadId::from);
        let operation = reading(&events_key);
        events
            .iter()
            .map(|event| decode_task_event("redis", &operation, event, task_id, thread.as_ref()))
            .collect()
    }
}
