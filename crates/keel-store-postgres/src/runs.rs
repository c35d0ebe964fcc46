//! [`RunStore`] over PostgreSQL: task records in `task_records`, run reports in
//! `run_records`, each found through the index of the [`RunQuery`]'s fields.

use async_trait::async_trait;
use keel_core::{AgentResult, RunId};
use keel_runtime::{
    AuthContext, IndexedRecord, RecordText, RunQuery, RunRecord, RunStore, TaskRecord,
};
use tokio_postgres::types::ToSql;

use crate::codec::{decode_text, to_nanos, to_sql_int, Arg, ByKey};
use crate::PostgresStore;

/// Takes a task record's row as [`PostgresStore::save_record`] gives it, its state `$9`.
const SAVE_TASK_RECORD: &str = "\
INSERT INTO task_records (tenant, task_id, run_id, thread_id, trace_id, agent_name,
    recorded_at, body, state)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
/// Save a run report's row, its values `$values` (the tenant, the index columns, the time and
/// the body, as [`record_columns`] gives them after the tenant). A replaced report takes a new
/// `id`, so it is the newest of reports of equal time.
macro_rules! save_run_report {
    ($values:literal) => {
        concat!(
            "INSERT INTO run_records (tenant, task_id, run_id, thread_id, trace_id, agent_name,
    recorded_at, body)
VALUES ",
            $values,
            "
ON CONFLICT (tenant, run_id) DO UPDATE SET id = DEFAULT, task_id = excluded.task_id,
    thread_id = excluded.thread_id, trace_id = excluded.trace_id,
    agent_name = excluded.agent_name, recorded_at = excluded.recorded_at, body = excluded.body"
        )
    };
}
pub(crate) use save_run_report;

/// Takes a run report's row as [`PostgresStore::save_record`] gives it.
const SAVE_RUN_REPORT: &str = save_run_report!("($1, $2, $3, $4, $5, $6, $7, $8)");

/// A record's columns after the tenant, as its statements take them: the index columns (task,
/// run, thread, trace, agent; each may be null) and the time.
pub(crate) fn record_columns<T: IndexedRecord>(record: &T) -> ([Option<&str>; 5], i64) {
    let index = record.index();
    (index.ids().map(|(_, id)| id), to_nanos(index.recorded_at))
}

const GET_RUN_REPORT: ByKey<RunRecord> = ByKey {
    sql: "SELECT body FROM run_records WHERE tenant = $1 AND run_id = $2",
    op: "reading a run report",
    noun: "run report",
    decode: decode_text,
};

/// The `WHERE` clause and its arguments for `query`. `contains` is `strpos`, not `LIKE`: a
/// `%` or `_` in the needle is plain text and the match is case-sensitive, on the record's
/// stored JSON, which is the text `RunQuery` documents `contains` as searching.
fn where_clause(tenant: String, query: &RunQuery) -> (String, Vec<Arg>) {
    let mut clauses = vec!["tenant = $1".to_owned()];
    let mut args = vec![Arg::Text(tenant)];
    let mut add = |clause: &str, arg: Option<Arg>| {
        if let Some(arg) = arg {
            args.push(arg);
            clauses.push(clause.replace('?', &format!("${}", args.len())));
        }
    };
    let text = |value: Option<&str>| value.map(|v| Arg::Text(v.to_owned()));
    for (column, id) in query.ids() {
        add(&format!("{column} = ?"), text(id));
    }
    add("strpos(body, ?) > 0", text(query.contains.as_deref()));
    add(
        "recorded_at >= ?",
        query.since.map(|t| Arg::Int(to_nanos(t))),
    );
    add(
        "recorded_at < ?",
        query.until.map(|t| Arg::Int(to_nanos(t))),
    );
    (clauses.join(" AND "), args)
}

impl PostgresStore {
    /// Save `record` by `sql`, which takes the tenant, the record's index columns (task, run,
    /// thread, trace, agent; each may be null), its time and its `body` (the record's stored
    /// text) as `$1` to `$8`, and
    /// `state`, when given, as `$9`: the one row shape of task records and run reports.
    async fn save_record<T: IndexedRecord>(
        &self,
        auth: &AuthContext,
        record: &T,
        body: String,
        sql: &str,
        state: Option<&str>,
        op: &'static str,
    ) -> AgentResult<()> {
        let ((ids, recorded_at), tenant) = (record_columns(record), auth.namespace());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&tenant];
        params.extend(ids.iter().map(|id| id as &(dyn ToSql + Sync)));
        params.extend([&recorded_at as &(dyn ToSql + Sync), &body]);
        params.extend(state.as_ref().map(|state| state as &(dyn ToSql + Sync)));
        self.execute(sql, &params, op).await?;
        Ok(())
    }

    /// Run a record query on `table`, in `order`.
    async fn find_records<T: RecordText>(
        &self,
        auth: &AuthContext,
        run_query: &RunQuery,
        table: &str,
        order: &str,
        what: &'static str,
    ) -> AgentResult<Vec<T>> {
        let limit = run_query.effective_limit()?;
        let (filter, mut args) = where_clause(auth.namespace(), run_query);
        args.push(Arg::Int(to_sql_int(limit)));
        let sql = format!(
            "SELECT id, body FROM {table} WHERE {filter} ORDER BY {order} LIMIT ${}",
            args.len()
        );
        let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(Arg::sql).collect();
        let rows = self.query(&sql, &params, "searching records").await?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.get(0);
                decode_text(row.get(1), &format!("{what} (row {id})"))
            })
            .collect()
    }
}

#[async_trait]
impl RunStore for PostgresStore {
    async fn save_task_record(&self, auth: &AuthContext, record: &TaskRecord) -> AgentResult<()> {
        let state = Some(record.state.as_str());
        self.save_record(
            auth,
            record,
            record.to_text()?,
            SAVE_TASK_RECORD,
            state,
            "saving a task record",
        )
        .await
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
        self.save_record(
            auth,
            record,
            text,
            SAVE_RUN_REPORT,
            None,
            "saving a run report",
        )
        .await
    }

    async fn get_run_report(
        &self,
        auth: &AuthContext,
        run_id: &RunId,
    ) -> AgentResult<Option<RunRecord>> {
        self.select_by_key(&GET_RUN_REPORT, auth, run_id.as_str())
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
