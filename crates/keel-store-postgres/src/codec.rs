//! Conversions between Keel values and PostgreSQL columns: the versioned JSON envelope for
//! Keel's records, plain JSON text for callers' values, timestamps as `BIGINT` nanoseconds,
//! and the shapes of every statement (prepared once per pooled connection).

use keel_core::{AgentError, AgentResult};
use keel_runtime::AuthContext;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::error::{doing, BACKEND};

/// A Keel record (task snapshot, event, message, ...) as stored-JSON envelope text.
pub(crate) fn encode_record<T: Serialize>(value: &T) -> AgentResult<String> {
    keel_runtime::encode_record(value)
}

/// Decode an envelope read from a column; `what` names the record in the error.
pub(crate) fn decode_record<T: DeserializeOwned>(text: &str, what: &str) -> AgentResult<T> {
    keel_runtime::decode_record(BACKEND, &format!("reading stored {what}"), text)
}

/// Decode a task snapshot read from a column (decision 269); `what` names it in errors.
pub(crate) fn decode_task(text: &str, what: &str) -> AgentResult<keel_core::Task> {
    keel_runtime::decode_task_snapshot(BACKEND, &format!("reading stored {what}"), text)
}

/// Decode a record of the run store read from a column; `what` names it in errors.
pub(crate) fn decode_text<T: keel_runtime::RecordText>(text: &str, what: &str) -> AgentResult<T> {
    T::from_text(BACKEND, &format!("reading stored {what}"), text)
}

/// A read of one stored record by its key among a tenant's rows: the statement (column 0 of
/// the row it selects, bound as tenant and key), what it does and what it reads (for
/// errors), and how its text is decoded.
pub(crate) struct ByKey<T> {
    pub(crate) sql: &'static str,
    pub(crate) op: &'static str,
    pub(crate) noun: &'static str,
    pub(crate) decode: fn(&str, &str) -> AgentResult<T>,
}

/// Every record of `records`, encoded.
pub(crate) fn encode_all<T: Serialize>(records: &[T]) -> AgentResult<Vec<String>> {
    records.iter().map(encode_record).collect()
}

/// A caller's JSON value (memory, key-value store, queue payload) as text, stored as given.
pub(crate) fn encode_value(value: &Value) -> AgentResult<String> {
    serde_json::to_string(value).map_err(AgentError::internal)
}

/// Parse a caller's JSON value read from a column.
pub(crate) fn decode_value(text: &str, what: &str) -> AgentResult<Value> {
    serde_json::from_str(text)
        .map_err(|e| AgentError::storage_source(BACKEND, format!("reading stored {what}"), e))
}

/// Timestamps are stored as every SQL backend stores them (nanoseconds since the epoch).
pub(crate) use keel_runtime::stored_time::{from_nanos, to_nanos};

/// A seq, token or count from `u64`/`usize` to `BIGINT`, saturating (larger values are never
/// issued, so saturating keeps comparisons right).
pub(crate) fn to_sql_int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// A stored seq, token or count back to `u64`; a negative value is corrupt data.
pub(crate) fn from_sql_int(n: i64, what: &str) -> AgentResult<u64> {
    u64::try_from(n).map_err(|_| AgentError::storage(format!("stored {what} is negative ({n})")))
}

/// One argument of a statement built at run time (a listing with optional filters).
pub(crate) enum Arg {
    /// A `TEXT` argument.
    Text(String),
    /// A `BIGINT` argument.
    Int(i64),
}

impl Arg {
    /// The argument as a statement parameter.
    pub(crate) fn sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Arg::Text(text) => text,
            Arg::Int(n) => n,
        }
    }
}

/// Statements sent by every Postgres store of this process (see
/// [`PostgresStore::statements_sent`](crate::PostgresStore::statements_sent)).
pub(crate) static STATEMENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Count `n` statements sent.
fn sent(n: u64) {
    STATEMENTS.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// A transaction on `client` (its `BEGIN` and `COMMIT` counted as statements).
pub(crate) async fn transaction<'a>(
    client: &'a mut deadpool_postgres::Object,
    op: &'static str,
) -> AgentResult<deadpool_postgres::Transaction<'a>> {
    sent(2);
    client.transaction().await.map_err(doing(op))
}

/// The parameters of a statement.
pub(crate) type Params<'a> = [&'a (dyn ToSql + Sync)];

/// Every row `sql` (prepared once per connection) selects with `params`; `op` says what was
/// being done, for the error.
pub(crate) async fn query<C: GenericClient + Sync>(
    db: &C,
    sql: &str,
    params: &Params<'_>,
    op: &'static str,
) -> AgentResult<Vec<Row>> {
    let stmt = db.prepare_cached(sql).await.map_err(doing(op))?;
    sent(1);
    db.query(&stmt, params).await.map_err(doing(op))
}

/// The one row `sql` selects, or `None`.
pub(crate) async fn query_opt<C: GenericClient + Sync>(
    db: &C,
    sql: &str,
    params: &Params<'_>,
    op: &'static str,
) -> AgentResult<Option<Row>> {
    let stmt = db.prepare_cached(sql).await.map_err(doing(op))?;
    sent(1);
    db.query_opt(&stmt, params).await.map_err(doing(op))
}

/// The one row `sql` always yields (an aggregate, a `RETURNING` of an upsert).
pub(crate) async fn query_one<C: GenericClient + Sync>(
    db: &C,
    sql: &str,
    params: &Params<'_>,
    op: &'static str,
) -> AgentResult<Row> {
    let stmt = db.prepare_cached(sql).await.map_err(doing(op))?;
    sent(1);
    db.query_one(&stmt, params).await.map_err(doing(op))
}

/// Run `sql`; how many rows it changed.
pub(crate) async fn execute<C: GenericClient + Sync>(
    db: &C,
    sql: &str,
    params: &Params<'_>,
    op: &'static str,
) -> AgentResult<u64> {
    let stmt = db.prepare_cached(sql).await.map_err(doing(op))?;
    sent(1);
    db.execute(&stmt, params).await.map_err(doing(op))
}

/// One statement on a pooled connection of its own: what a store method that sends a single
/// statement (no transaction, no fence) does, so it need not check a connection out itself.
impl crate::PostgresStore {
    /// [`query`] on a pooled connection.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &Params<'_>,
        op: &'static str,
    ) -> AgentResult<Vec<Row>> {
        query(&self.client().await?, sql, params, op).await
    }

    /// [`query_opt`] on a pooled connection.
    pub(crate) async fn query_opt(
        &self,
        sql: &str,
        params: &Params<'_>,
        op: &'static str,
    ) -> AgentResult<Option<Row>> {
        query_opt(&self.client().await?, sql, params, op).await
    }

    /// The record `read` selects by `key` among `auth`'s rows, or `None`: the one shape of
    /// every by-key read.
    pub(crate) async fn select_by_key<T>(
        &self,
        read: &ByKey<T>,
        auth: &AuthContext,
        key: &str,
    ) -> AgentResult<Option<T>> {
        let row = self
            .query_opt(read.sql, &[&auth.namespace(), &key], read.op)
            .await?;
        row.map(|row| (read.decode)(row.get(0), &format!("{} {key}", read.noun)))
            .transpose()
    }

    /// [`query_one`] on a pooled connection.
    pub(crate) async fn query_one(
        &self,
        sql: &str,
        params: &Params<'_>,
        op: &'static str,
    ) -> AgentResult<Row> {
        query_one(&self.client().await?, sql, params, op).await
    }

    /// [`execute`] on a pooled connection; how many rows it changed.
    pub(crate) async fn execute(
        &self,
        sql: &str,
        params: &Params<'_>,
        op: &'static str,
    ) -> AgentResult<u64> {
        execute(&self.client().await?, sql, params, op).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_past_bigint_saturate() {
        assert_eq!(to_sql_int(u64::MAX), i64::MAX);
        assert_eq!(to_sql_int(7usize), 7);
        assert!(from_sql_int(-1, "seq").is_err());
    }
}
