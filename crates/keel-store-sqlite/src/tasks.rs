//! [`TaskManager`] over SQLite: task snapshots in `tasks`, their event logs in `task_events`.

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult, Task, TaskEvent, TaskId, ThreadId};
use keel_runtime::{
    decode_task_event, encode_task_event, encode_task_events, encode_task_snapshot, updated_micros,
    AuthContext, ListTasksFilter, Page, TaskManager, TaskPageStart, UpdatedCursor,
};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection};

use crate::codec::{
    decode_task, select_count, select_record, select_row, select_rows, to_sql_int, usize_to_sql,
    SqlContext,
};
use crate::SqliteStore;

pub(crate) fn task_exists(conn: &Connection, tenant: &str, task_id: &TaskId) -> AgentResult<bool> {
    conn.prepare_cached("SELECT 1 FROM tasks WHERE tenant = ?1 AND task_id = ?2")
        .and_then(|mut stmt| stmt.exists(params![tenant, task_id.as_str()]))
        .context("looking up a task")
}

/// The thread of a task, or `None` when there is no such task.
fn task_thread(conn: &Connection, tenant: &str, task_id: &TaskId) -> AgentResult<Option<ThreadId>> {
    select_row(
        conn,
        "SELECT thread_id FROM tasks WHERE tenant = ?1 AND task_id = ?2",
        params![tenant, task_id.as_str()],
        |row| row.get::<_, String>(0).map(ThreadId::from),
        "looking up a task",
    )
}

/// A task snapshot ready to be written: encoded (without history) and with the columns the
/// listings filter on.
pub(crate) struct SnapshotRow {
    pub(crate) tenant: String,
    pub(crate) task_id: TaskId,
    pub(crate) thread_id: ThreadId,
    state: &'static str,
    /// The status timestamp, in microseconds: the key of the most-recently-updated order.
    updated_at: i64,
    body: String,
}

impl SnapshotRow {
    pub(crate) fn new(tenant: String, task: &Task) -> AgentResult<Self> {
        // Snapshots never carry the history: it is rebuilt from the event log.
        Ok(Self {
            tenant,
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            state: task.state().as_str(),
            updated_at: updated_micros(task),
            body: encode_task_snapshot(task)?,
        })
    }

    /// Insert or replace the snapshot.
    pub(crate) fn upsert(&self, conn: &Connection) -> AgentResult<()> {
        // An upsert, not REPLACE: the row (and its creation `seq`) is kept, so re-saving a
        // task does not move it in listings.
        conn.prepare_cached(
            "INSERT INTO tasks (tenant, task_id, thread_id, state, body, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (tenant, task_id) DO UPDATE SET \
             thread_id = excluded.thread_id, state = excluded.state, body = excluded.body, \
             updated_at = excluded.updated_at",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                self.tenant,
                self.task_id.as_str(),
                self.thread_id.as_str(),
                self.state,
                self.body,
                self.updated_at
            ])
        })
        .context("saving a task")?;
        Ok(())
    }
}

/// A task's snapshot and the log entries saved with it, encoded before the job is sent (so an
/// encoding error writes nothing): what `save_task_with_events` and the step store's folds
/// write of a task, in one savepoint with whatever else the job writes.
pub(crate) struct TaskRows {
    snapshot: SnapshotRow,
    events: Vec<String>,
}

impl TaskRows {
    pub(crate) fn new(tenant: String, task: &Task, events: &[TaskEvent]) -> AgentResult<Self> {
        Ok(Self {
            snapshot: SnapshotRow::new(tenant, task)?,
            events: encode_task_events(events, &task.id, Some(&task.thread_id))?,
        })
    }

    /// Save the snapshot, then append the entries after the task's last.
    pub(crate) fn save(&self, conn: &Connection) -> AgentResult<()> {
        let snapshot = &self.snapshot;
        snapshot.upsert(conn)?;
        append_task_events(conn, &snapshot.tenant, &snapshot.task_id, &self.events)
    }
}

/// Append encoded events to a task's log, after its last one. The caller checks that the
/// task exists (or has just saved it) in the same transaction.
pub(crate) fn append_task_events(
    conn: &Connection,
    tenant: &str,
    task_id: &TaskId,
    bodies: &[String],
) -> AgentResult<()> {
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO task_events (tenant, task_id, seq, body) \
             SELECT ?1, ?2, COALESCE(MAX(seq), 0) + 1, ?3 FROM task_events \
             WHERE tenant = ?1 AND task_id = ?2",
        )
        .context("appending a task event")?;
    for body in bodies {
        stmt.execute(params![tenant, task_id.as_str(), body])
            .context("appending a task event")?;
    }
    Ok(())
}

/// The `WHERE` clauses and their arguments for the tenant and the filter's thread and state.
/// Only the filters that are set become SQL, so each query can use its index.
fn filter_clauses(tenant: String, filter: &ListTasksFilter) -> (Vec<&'static str>, Vec<SqlValue>) {
    let mut clauses = vec!["tenant = ?"];
    let mut args = vec![SqlValue::Text(tenant)];
    if let Some(thread_id) = &filter.thread_id {
        clauses.push("thread_id = ?");
        args.push(SqlValue::Text(thread_id.as_str().to_owned()));
    }
    if let Some(state) = filter.state {
        clauses.push("state = ?");
        args.push(SqlValue::Text(state.as_str().to_owned()));
    }
    (clauses, args)
}

/// How many tasks match `filter_sql` (from [`filter_clauses`]) with `args`.
fn count_tasks(conn: &Connection, filter_sql: &str, args: &[SqlValue]) -> AgentResult<usize> {
    select_count(
        conn,
        &format!("SELECT COUNT(*) FROM tasks WHERE {filter_sql}"),
        params_from_iter(args),
        "counting tasks",
    )
}

impl SqliteStore {
    /// [`TaskOrder::RecentlyUpdated`]: a range of one of the `updated_at` indexes, newest
    /// first; the token is the last row's `updated_at` and id.
    async fn list_recently_updated(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
        page_size: usize,
        since: Option<i64>,
        after: Option<UpdatedCursor>,
    ) -> AgentResult<Page<Task>> {
        let (mut clauses, mut args) = filter_clauses(self.tenant(auth).await?, filter);
        if let Some(since) = since {
            clauses.push("updated_at >= ?");
            args.push(SqlValue::Integer(since));
        }
        let filter_sql = clauses.join(" AND ");
        self.read(move |conn| {
            let total = count_tasks(conn, &filter_sql, &args)?;
            let mut page_sql =
                format!("SELECT updated_at, task_id, body FROM tasks WHERE {filter_sql}");
            let mut page_args = args;
            if let Some(after) = &after {
                page_sql.push_str(" AND (updated_at < ? OR (updated_at = ? AND task_id < ?))");
                page_args.push(SqlValue::Integer(after.micros));
                page_args.push(SqlValue::Integer(after.micros));
                page_args.push(SqlValue::Text(after.task_id.as_str().to_owned()));
            }
            page_sql.push_str(" ORDER BY updated_at DESC, task_id DESC LIMIT ?");
            // One row more than the page tells whether another page follows.
            page_args.push(SqlValue::Integer(usize_to_sql(page_size).saturating_add(1)));
            let rows: Vec<(i64, String, String)> = select_rows(
                conn,
                &page_sql,
                params_from_iter(&page_args),
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                "listing tasks",
            )?;
            Page::from_rows(rows, page_size, total, |(micros, task_id, body)| {
                let task = decode_task(&body, &format!("task {task_id}"))?;
                let task_id = TaskId::from(task_id);
                Ok((task, UpdatedCursor { micros, task_id }))
            })
        })
        .await
    }
}

#[async_trait]
impl TaskManager for SqliteStore {
    async fn tenants(&self) -> AgentResult<Vec<AuthContext>> {
        self.read(|conn| {
            let namespaces: Vec<String> = select_rows(
                conn,
                "SELECT name FROM tenants WHERE id IN (SELECT DISTINCT tenant FROM tasks)",
                [],
                |row| row.get(0),
                "listing tenants",
            )?;
            AuthContext::from_stored_namespaces(&namespaces, "the tasks table")
        })
        .await
    }

    async fn get_task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Option<Task>> {
        let (tenant, task_id) = (self.tenant(auth).await?, task_id.clone());
        self.read(move |conn| {
            select_record(
                conn,
                "SELECT body FROM tasks WHERE tenant = ?1 AND task_id = ?2",
                params![tenant, task_id.as_str()],
                &format!("task {task_id}"),
                decode_task,
            )
        })
        .await
    }

    async fn list_tasks(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
    ) -> AgentResult<Page<Task>> {
        let (page_size, start) = filter.page_start()?;
        let after = match start {
            // The seq of a token is at most `i64::MAX` (see `TaskPageStart::Created`).
            TaskPageStart::Created { after } => to_sql_int(after),
            TaskPageStart::RecentlyUpdated { since, after } => {
                return self
                    .list_recently_updated(auth, filter, page_size, since, after)
                    .await;
            }
        };
        let (clauses, args) = filter_clauses(self.tenant(auth).await?, filter);
        let filter_sql = clauses.join(" AND ");
        self.read(move |conn| {
            let total = count_tasks(conn, &filter_sql, &args)?;
            // One row more than the page tells whether another page follows.
            let mut page_args = args;
            page_args.push(SqlValue::Integer(after));
            page_args.push(SqlValue::Integer(usize_to_sql(page_size).saturating_add(1)));
            let rows: Vec<(i64, String)> = select_rows(
                conn,
                &format!(
                    "SELECT seq, body FROM tasks WHERE {filter_sql} AND seq > ? \
                     ORDER BY seq LIMIT ?"
                ),
                params_from_iter(&page_args),
                |row| Ok((row.get(0)?, row.get(1)?)),
                "listing tasks",
            )?;
            Page::from_rows(rows, page_size, total, |(seq, body): (i64, String)| {
                Ok((decode_task(&body, &format!("task (row {seq})"))?, seq))
            })
        })
        .await
    }

    async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        let row = SnapshotRow::new(self.tenant(auth).await?, task)?;
        self.write(move |conn| row.upsert(conn)).await
    }

    async fn save_task_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        let rows = TaskRows::new(self.tenant(auth).await?, task, events)?;
        // One job: one savepoint, so the snapshot and the events commit (or roll back)
        // together, and one place in the writer's queue instead of 1 + N.
        self.write(move |conn| rows.save(conn)).await
    }

    async fn add_task_event(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        event: &TaskEvent,
    ) -> AgentResult<()> {
        let body = encode_task_event(event, task_id, None)?;
        let (tenant, task_id) = (self.tenant(auth).await?, task_id.clone());
        self.write(move |conn| {
            if !task_exists(conn, &tenant, &task_id)? {
                return Err(AgentError::TaskNotFound { task_id });
            }
            append_task_events(conn, &tenant, &task_id, std::slice::from_ref(&body))
        })
        .await
    }

    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        let (tenant, task_id) = (self.tenant(auth).await?, task_id.clone());
        self.read(move |conn| {
            let Some(thread_id) = task_thread(conn, &tenant, &task_id)? else {
                return Err(AgentError::TaskNotFound { task_id });
            };
            let rows: Vec<(i64, String)> = select_rows(
                conn,
                "SELECT seq, body FROM task_events WHERE tenant = ?1 AND task_id = ?2 \
                 ORDER BY seq",
                params![tenant, task_id.as_str()],
                |row| Ok((row.get(0)?, row.get(1)?)),
                "reading task events",
            )?;
            rows.into_iter()
                .map(|(seq, body)| {
                    decode_task_event(
                        "sqlite",
                        &format!("reading stored event {seq} of task {task_id}"),
                        &body,
                        &task_id,
                        Some(&thread_id),
                    )
                })
                .collect()
        })
        .await
    }
}
