//! [`RunStore`] over SQLite: task records and run reports, each row with its index columns
//! beside the stored JSON body that `contains` searches.

use async_trait::async_trait;
use keel_core::{AgentResult, RunId};
use keel_runtime::{
    AuthContext, IndexedRecord, RecordText, RunQuery, RunRecord, RunStore, TaskRecord,
};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection};

use crate::codec::{decode_text, select_record, select_rows, to_nanos, usize_to_sql, SqlContext};
use crate::SqliteStore;

/// Takes a task record's row as [`SqliteStore::save_record`] gives it, its state `?9`.
const SAVE_TASK_RECORD: &str = "INSERT INTO task_records (tenant, task_id, run_id, thread_id, \
    trace_id, agent_name, recorded_at, body, state) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
/// Takes a run report's row as [`SqliteStore::save_record`] gives it. REPLACE deletes the old
/// row and inserts a new one (with a new `id`), so a replaced report counts as the newest
/// among reports of equal time.
const SAVE_RUN_REPORT: &str = "INSERT OR REPLACE INTO run_records (tenant, task_id, run_id, \
    thread_id, trace_id, agent_name, recorded_at, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// The WHERE clause (after the tenant) and its arguments for `query`, in parameter order.
///
/// `contains` is `instr(body, ?) > 0`, not LIKE: a `%` or `_` in the needle is then plain text
/// and the match is case-sensitive. The body is the record's stored JSON (the versioned
/// envelope, compact, object keys in sorted order), which is exactly the text `RunQuery`
/// documents `contains` as searching, on every backend.
fn where_clause(tenant: String, query: &RunQuery) -> (String, Vec<SqlValue>) {
    let mut clauses = vec!["tenant = ?".to_owned()];
    let mut args = vec![SqlValue::Text(tenant)];
    let mut add = |clause: String, arg: Option<SqlValue>| {
        if let Some(arg) = arg {
            clauses.push(clause);
            args.push(arg);
        }
    };
    let text = |value: Option<&str>| value.map(|v| SqlValue::Text(v.to_owned()));
    for (column, id) in query.ids() {
        add(format!("{column} = ?"), text(id));
    }
    add("instr(body, ?) > 0".into(), text(query.contains.as_deref()));
    let nanos = |time| Some(SqlValue::Integer(to_nanos(time)));
    add("recorded_at >= ?".into(), query.since.and_then(nanos));
    add("recorded_at < ?".into(), query.until.and_then(nanos));
    (clauses.join(" AND "), args)
}

/// A task record's or run report's row, encoded, ready to insert in a write job.
pub(crate) struct RecordRow {
    sql: &'static str,
    args: Vec<SqlValue>,
    what: &'static str,
}

impl RecordRow {
    /// The row of `record` for `sql`, which takes the tenant, the record's index columns (task,
    /// run, thread, trace, agent; each may be null), its time and its `body` (the record's
    /// stored text) as `?1` to `?8`, and `state`, when given, as `?9`: the one row shape of
    /// task records and run reports.
    fn new<T: IndexedRecord>(
        tenant: String,
        record: &T,
        body: String,
        sql: &'static str,
        state: Option<&'static str>,
        what: &'static str,
    ) -> Self {
        let index = record.index();
        let text = |value: Option<&str>| value.map_or(SqlValue::Null, |v| SqlValue::Text(v.into()));
        let mut args = vec![SqlValue::Text(tenant)];
        args.extend(index.ids().map(|(_, id)| text(id)));
        args.extend([
            SqlValue::Integer(to_nanos(index.recorded_at)),
            SqlValue::Text(body),
        ]);
        args.extend(state.map(|state| SqlValue::Text(state.into())));
        Self { sql, args, what }
    }

    /// The row of a run's report, `text` its stored text.
    pub(crate) fn run(tenant: String, record: &RunRecord, text: String) -> Self {
        Self::new(
            tenant,
            record,
            text,
            SAVE_RUN_REPORT,
            None,
            "saving a run report",
        )
    }

    /// Insert the row (a run report's replaces the run's earlier one).
    pub(crate) fn insert(&self, conn: &Connection) -> AgentResult<()> {
        conn.prepare_cached(self.sql)
            .and_then(|mut stmt| stmt.execute(params_from_iter(&self.args)))
            .context(self.what)?;
        Ok(())
    }
}

impl SqliteStore {
    /// Run a record query: `select` is the statement up to `WHERE`, `order` what follows it.
    async fn find_records<T>(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
        table: &'static str,
        order: &'static str,
        what: &'static str,
    ) -> AgentResult<Vec<T>>
    where
        T: RecordText + Send + 'static,
    {
        let limit = query.effective_limit()?;
        let (filter, mut args) = where_clause(self.tenant(auth).await?, query);
        args.push(SqlValue::Integer(usize_to_sql(limit)));
        self.read(move |conn| {
            let rows: Vec<(i64, String)> = select_rows(
                conn,
                &format!("SELECT id, body FROM {table} WHERE {filter} ORDER BY {order} LIMIT ?"),
                params_from_iter(&args),
                |row| Ok((row.get(0)?, row.get(1)?)),
                &format!("searching {what}s"),
            )?;
            rows.into_iter()
                .map(|(id, body)| decode_text(&body, &format!("{what} (row {id})")))
                .collect()
        })
        .await
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn save_task_record(&self, auth: &AuthContext, record: &TaskRecord) -> AgentResult<()> {
        let state = Some(record.state.as_str());
        let row = RecordRow::new(
            self.tenant(auth).await?,
            record,
            record.to_text()?,
            SAVE_TASK_RECORD,
            state,
            "saving a task record",
        );
        self.write(move |conn| row.insert(conn)).await
    }

    async fn find_task_records(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<TaskRecord>> {
        // Newest first means most recently saved, as in the in-memory store.
        self.find_records(auth, query, "task_records", "id DESC", "task record")
            .await
    }

    async fn save_run_text(
        &self,
        auth: &AuthContext,
        record: &RunRecord,
        text: String,
    ) -> AgentResult<()> {
        let row = RecordRow::run(self.tenant(auth).await?, record, text);
        self.write(move |conn| row.insert(conn)).await
    }

    async fn get_run_report(
        &self,
        auth: &AuthContext,
        run_id: &RunId,
    ) -> AgentResult<Option<RunRecord>> {
        let (tenant, run_id) = (self.tenant(auth).await?, run_id.clone());
        self.read(move |conn| {
            select_record(
                conn,
                "SELECT body FROM run_records WHERE tenant = ?1 AND run_id = ?2",
                params![tenant, run_id.as_str()],
                &format!("run report {run_id}"),
                decode_text,
            )
        })
        .await
    }

    async fn find_run_reports(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<RunRecord>> {
        // Newest first by the report's own time, as in the in-memory store.
        self.find_records(
            auth,
            query,
            "run_records",
            "recorded_at DESC, id DESC",
            "run report",
        )
        .await
    }
}
