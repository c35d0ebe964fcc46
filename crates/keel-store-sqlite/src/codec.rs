//! Conversions between Keel values and SQLite columns: the versioned JSON envelope for Keel's
//! own records, plain JSON text for callers' values, timestamps as integers, and SQLite
//! errors as [`AgentError::Storage`] with context.

use keel_core::{AgentError, AgentResult};
use rusqlite::{Connection, OptionalExtension, Params, Row};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// Attach what was being done to a SQLite error, so a `Storage` error can be acted on.
pub(crate) trait SqlContext<T> {
    /// Map the error to [`AgentError::Storage`] naming `what` failed.
    fn context(self, what: &str) -> AgentResult<T>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn context(self, what: &str) -> AgentResult<T> {
        self.map_err(|e| AgentError::storage_source("sqlite", what, e))
    }
}

/// The one row `sql` selects with `params`, mapped by `row`, or `None` when none matches:
/// the shape of every lookup by key. `what` says what was being read, for the error.
pub(crate) fn select_row<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    row: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    what: &str,
) -> AgentResult<Option<T>> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.query_row(params, row).optional())
        .context(what)
}

/// Every row `sql` selects with `params`, mapped by `row`, in order: the shape of every
/// listing. `what` says what was being read, for the error.
pub(crate) fn select_rows<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    row: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
    what: &str,
) -> AgentResult<Vec<T>> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.query_map(params, row)?.collect())
        .context(what)
}

/// The number a `SELECT COUNT(*)` statement `sql` gives with `params`.
pub(crate) fn select_count(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    what: &str,
) -> AgentResult<usize> {
    let count: Option<i64> = select_row(conn, sql, params, |row| row.get(0), what)?;
    Ok(count.map_or(0, |n| usize::try_from(n).unwrap_or(0)))
}

/// The text of the one column `sql` selects with `params`, or `None` when no row matches.
pub(crate) fn select_text(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    what: &str,
) -> AgentResult<Option<String>> {
    select_row(conn, sql, params, |row| row.get(0), what)
}

/// The Keel record stored in the one column `sql` selects with `params`, decoded, or `None`
/// when no row matches; `what` names the record (`task t-1`) in errors.
pub(crate) fn select_record<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    what: &str,
    decode: fn(&str, &str) -> AgentResult<T>,
) -> AgentResult<Option<T>> {
    select_text(conn, sql, params, &format!("reading {what}"))?
        .map(|body| decode(&body, what))
        .transpose()
}

/// Decode a record of the run store read from the column; `what` names it in errors.
pub(crate) fn decode_text<T: keel_runtime::RecordText>(text: &str, what: &str) -> AgentResult<T> {
    T::from_text("sqlite", &format!("reading stored {what}"), text)
}

/// Decode a task snapshot read from the column (decision 269); `what` names it in errors.
pub(crate) fn decode_task(text: &str, what: &str) -> AgentResult<keel_core::Task> {
    keel_runtime::decode_task_snapshot("sqlite", &format!("reading stored {what}"), text)
}

/// A Keel record (task snapshot, event, message, ...) as the versioned stored-JSON envelope
/// text. Encoding happens on the caller's task, so the writer thread only runs SQL.
pub(crate) fn encode_record<T: Serialize>(value: &T) -> AgentResult<String> {
    keel_runtime::encode_record(value)
}

/// Decode an envelope read from the column; `what` names the record in the error
/// (`task t-1`), since a corrupt row is only fixable if the operator can find it.
pub(crate) fn decode_record<T: DeserializeOwned>(text: &str, what: &str) -> AgentResult<T> {
    keel_runtime::decode_record("sqlite", &format!("reading stored {what}"), text)
}

/// A caller's JSON value (memory, key-value store, queue payload) as text. These are not
/// Keel types, so there is no format for the envelope to version: they are stored as given.
pub(crate) fn encode_value(value: &Value) -> AgentResult<String> {
    serde_json::to_string(value).map_err(AgentError::internal)
}

/// Parse a caller's JSON value read from the column.
pub(crate) fn decode_value(text: &str, what: &str) -> AgentResult<Value> {
    serde_json::from_str(text)
        .map_err(|e| AgentError::storage_source("sqlite", format!("reading stored {what}"), e))
}

/// Timestamps are stored as every SQL backend stores them (nanoseconds since the epoch).
pub(crate) use keel_runtime::stored_time::{from_nanos, to_nanos};

/// A sequence number or token from Keel's `u64` to SQLite's `i64`, saturating: values past
/// `i64::MAX` are never issued, so saturating keeps comparisons right.
pub(crate) fn to_sql_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A count or limit from `usize` to SQLite's `i64`, saturating.
pub(crate) fn usize_to_sql(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored sequence number, token or count back to Keel's `u64`; a negative value is
/// corrupt data.
pub(crate) fn from_sql_int(n: i64, what: &str) -> AgentResult<u64> {
    u64::try_from(n).map_err(|_| AgentError::storage(format!("stored {what} is negative ({n})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_record_is_a_storage_error_naming_it() {
        let err = decode_record::<keel_core::Task>("{not json", "task t-1").unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }));
        assert!(err.to_string().contains("task t-1"), "{err}");
    }
}
