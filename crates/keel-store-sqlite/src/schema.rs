//! The database schema, its versioned migrations, and the connection settings Keel relies on.
//!
//! The schema version lives in SQLite's `PRAGMA user_version`. Migrations are an ordered list
//! of SQL steps; step `i` takes the schema from version `i` to `i + 1`. Opening applies every
//! missing step in one `IMMEDIATE` transaction (so two processes opening the same new file
//! cannot both migrate it), and refuses a database whose version is newer than this code
//! knows rather than guess at its meaning.

use std::time::Duration;

use keel_core::{AgentError, AgentResult};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, TransactionBehavior};

use crate::codec::SqlContext;

/// How long a connection waits for another process's lock before failing with "database is
/// locked". Long enough to ride out another process's commit or checkpoint.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// One schema change.
struct Migration {
    /// What it does, for logs.
    description: &'static str,
    /// The statements.
    sql: &'static str,
}

/// Every migration, oldest first. Append only: a released step is never edited, because
/// databases in the field already ran it.
const MIGRATIONS: &[Migration] = &[
    Migration {
        description: "initial schema",
        sql: V1,
    },
    Migration {
        description: "thread timers",
        sql: V2,
    },
    Migration {
        description: "asynchronous tool calls",
        sql: ASYNC_CALLS,
    },
    Migration {
        description: "timer owners",
        sql: TIMER_AGENTS,
    },
    Migration {
        description: "tasks by status time",
        sql: TASKS_BY_UPDATE,
    },
    Migration {
        description: "tenants as short keys",
        sql: TENANT_KEYS,
    },
];

/// The schema version this code creates and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Version 1. Every table is keyed by `tenant` (the [`AuthContext::namespace`] string; since
/// version 6 its key) first, so no query can reach another tenant's rows without naming it.
/// Timestamps are INTEGER nanoseconds since the Unix epoch (UTC); Keel records are TEXT in the
/// versioned stored-JSON envelope; callers' values are plain JSON TEXT. Tables are STRICT so
/// a type slip in the code is an error instead of silently stored data.
///
/// [`AuthContext::namespace`]: keel_runtime::AuthContext::namespace
const V1: &str = r#"
-- Task snapshots (without history). `seq` is the creation order used for listing and page
-- tokens; an upsert keeps it, so re-saving a task does not move it.
CREATE TABLE tasks (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant    TEXT NOT NULL,
    task_id   TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    state     TEXT NOT NULL,
    body      TEXT NOT NULL,
    UNIQUE (tenant, task_id)
) STRICT;
CREATE INDEX tasks_by_tenant ON tasks (tenant, seq);
CREATE INDEX tasks_by_thread ON tasks (tenant, thread_id, seq);
CREATE INDEX tasks_by_state ON tasks (tenant, state, seq);

-- Each task's append-only event log; `seq` counts from 1 per task.
CREATE TABLE task_events (
    tenant  TEXT NOT NULL,
    task_id TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (tenant, task_id, seq),
    FOREIGN KEY (tenant, task_id) REFERENCES tasks (tenant, task_id)
) STRICT, WITHOUT ROWID;

-- Tenant memory; `expires_at` NULL means never.
CREATE TABLE memory (
    tenant     TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (tenant, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX memory_by_expiry ON memory (expires_at) WHERE expires_at IS NOT NULL;

-- Per-thread counters that must outlive the rows they number: the queue's last seq (items
-- are deleted on ack, seqs must still only grow) and the last lease token (a released lease
-- is deleted, tokens must still only grow).
CREATE TABLE threads (
    tenant           TEXT NOT NULL,
    thread_id        TEXT NOT NULL,
    last_queue_seq   INTEGER NOT NULL DEFAULT 0,
    last_lease_token INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, thread_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE thread_history (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (tenant, thread_id, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE thread_queue (
    tenant      TEXT NOT NULL,
    thread_id   TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    id          TEXT NOT NULL,
    payload     TEXT NOT NULL,
    enqueued_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, thread_id, seq)
) STRICT, WITHOUT ROWID;
CREATE UNIQUE INDEX thread_queue_by_id ON thread_queue (tenant, thread_id, id);

CREATE TABLE thread_kv (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (tenant, thread_id, key)
) STRICT, WITHOUT ROWID;

CREATE TABLE subagents (
    tenant           TEXT NOT NULL,
    thread_id        TEXT NOT NULL,
    parent_thread_id TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    body             TEXT NOT NULL,
    PRIMARY KEY (tenant, thread_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX subagents_by_parent ON subagents (tenant, parent_thread_id, created_at, thread_id);

-- The current lease of each thread, if any. Released leases are deleted; the token counter
-- lives in `threads`.
CREATE TABLE leases (
    tenant     TEXT NOT NULL,
    thread_id  TEXT NOT NULL,
    holder     TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, thread_id)
) STRICT, WITHOUT ROWID;

-- Task snapshots kept by the run store: every save adds a row; `id` is insertion order.
CREATE TABLE task_records (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    thread_id   TEXT NOT NULL,
    state       TEXT NOT NULL,
    run_id      TEXT,
    trace_id    TEXT,
    agent_name  TEXT,
    recorded_at INTEGER NOT NULL,
    body        TEXT NOT NULL
) STRICT;
CREATE INDEX task_records_by_task ON task_records (tenant, task_id, id);
CREATE INDEX task_records_by_run ON task_records (tenant, run_id, id);
CREATE INDEX task_records_by_thread ON task_records (tenant, thread_id, id);
CREATE INDEX task_records_by_trace ON task_records (tenant, trace_id, id);
CREATE INDEX task_records_by_agent ON task_records (tenant, agent_name, id);
CREATE INDEX task_records_by_time ON task_records (tenant, recorded_at);

-- Run reports, one per run (a save replaces).
CREATE TABLE run_records (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    task_id     TEXT,
    thread_id   TEXT,
    trace_id    TEXT,
    agent_name  TEXT,
    recorded_at INTEGER NOT NULL,
    body        TEXT NOT NULL,
    UNIQUE (tenant, run_id)
) STRICT;
CREATE INDEX run_records_by_task ON run_records (tenant, task_id);
CREATE INDEX run_records_by_thread ON run_records (tenant, thread_id);
CREATE INDEX run_records_by_trace ON run_records (tenant, trace_id);
CREATE INDEX run_records_by_agent ON run_records (tenant, agent_name);
CREATE INDEX run_records_by_time ON run_records (tenant, recorded_at);
"#;

/// Version 2: durable thread timers (scheduled effects). Unlike every other table these rows
/// are read across tenants (a scheduler claims due timers of all of them), so the tenant is
/// a column beside the id rather than the leading key; the record's body carries the tenant's
/// names. `ready_at` is when the row may be claimed: its due time, then the end of each
/// claim, so one index serves both "what is due" and "what claim lapsed".
const V2: &str = r#"
CREATE TABLE thread_timers (
    id        TEXT PRIMARY KEY,
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    due_at    INTEGER NOT NULL,
    ready_at  INTEGER NOT NULL,
    claim     TEXT,
    attempts  INTEGER NOT NULL DEFAULT 0,
    body      TEXT NOT NULL
) STRICT;
CREATE INDEX thread_timers_by_ready ON thread_timers (ready_at, id);
CREATE INDEX thread_timers_by_thread ON thread_timers (tenant, thread_id, due_at, id);
"#;

/// Version 3: pending asynchronous tool calls, keyed by call id alone: a callback names only the call, and
/// the row says which tenant owns it (`tenant` is the namespace string; `app_name` and
/// `user_name` rebuild the `AuthContext`). `record` is the engine's JSON, stored as given.
/// `IF NOT EXISTS` keeps the step harmless if it is ever reordered with another.
const ASYNC_CALLS: &str = r#"
CREATE TABLE IF NOT EXISTS async_calls (
    call_id   TEXT NOT NULL PRIMARY KEY,
    tenant    TEXT NOT NULL,
    app_name  TEXT NOT NULL,
    user_name TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    state     TEXT NOT NULL,
    record    TEXT NOT NULL
) STRICT, WITHOUT ROWID;
"#;

/// Version 4: each timer names the agent whose scheduler claims it (its card name); rows
/// stored before have `''`, which any agent's scheduler claims. The index serves a claim of
/// one agent's (and the ownerless) due timers in due order.
const TIMER_AGENTS: &str = r#"
ALTER TABLE thread_timers ADD COLUMN agent TEXT NOT NULL DEFAULT '';
CREATE INDEX thread_timers_by_agent ON thread_timers (agent, ready_at, id);
"#;

/// Version 5: each task's status timestamp (`updated_at`, microseconds since the Unix epoch),
/// indexed per filter, so that a page of the most recently updated tasks (A2A's `ListTasks`
/// order) is read off an index. Rows stored before get it from their snapshot's JSON, to the
/// millisecond (SQLite's `subsec`): close enough for an order, and page tokens carry the
/// column's value, so paging stays exact.
const TASKS_BY_UPDATE: &str = r#"
ALTER TABLE tasks ADD COLUMN updated_at INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET updated_at = COALESCE(
    CAST(round(unixepoch(json_extract(body, '$.data.status.timestamp'), 'subsec') * 1000000) AS INTEGER),
    0);
CREATE INDEX tasks_by_update ON tasks (tenant, updated_at, task_id);
CREATE INDEX tasks_by_thread_update ON tasks (tenant, thread_id, updated_at, task_id);
CREATE INDEX tasks_by_state_update ON tasks (tenant, state, updated_at, task_id);
"#;

/// Version 6 (decision 272): every row names its tenant by a short key, the `id` of the
/// tenant's namespace in `tenants`, written as decimal text (the columns stay `TEXT`), where
/// it named the namespace itself: thirty bytes or more in every row and index entry. Rows
/// stored before get their tenant's key here; a namespace is never bare digits, so no key
/// can be mistaken for a namespace.
const TENANT_KEYS: &str = r#"
CREATE TABLE tenants (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
) STRICT;
INSERT INTO tenants (name)
SELECT tenant FROM tasks
UNION SELECT tenant FROM task_events
UNION SELECT tenant FROM memory
UNION SELECT tenant FROM threads
UNION SELECT tenant FROM thread_history
UNION SELECT tenant FROM thread_queue
UNION SELECT tenant FROM thread_kv
UNION SELECT tenant FROM subagents
UNION SELECT tenant FROM leases
UNION SELECT tenant FROM task_records
UNION SELECT tenant FROM run_records
UNION SELECT tenant FROM thread_timers
UNION SELECT tenant FROM async_calls;
UPDATE tasks SET tenant = (SELECT id FROM tenants WHERE name = tasks.tenant);
UPDATE task_events SET tenant = (SELECT id FROM tenants WHERE name = task_events.tenant);
UPDATE memory SET tenant = (SELECT id FROM tenants WHERE name = memory.tenant);
UPDATE threads SET tenant = (SELECT id FROM tenants WHERE name = threads.tenant);
UPDATE thread_history SET tenant = (SELECT id FROM tenants WHERE name = thread_history.tenant);
UPDATE thread_queue SET tenant = (SELECT id FROM tenants WHERE name = thread_queue.tenant);
UPDATE thread_kv SET tenant = (SELECT id FROM tenants WHERE name = thread_kv.tenant);
UPDATE subagents SET tenant = (SELECT id FROM tenants WHERE name = subagents.tenant);
UPDATE leases SET tenant = (SELECT id FROM tenants WHERE name = leases.tenant);
UPDATE task_records SET tenant = (SELECT id FROM tenants WHERE name = task_records.tenant);
UPDATE run_records SET tenant = (SELECT id FROM tenants WHERE name = run_records.tenant);
UPDATE thread_timers SET tenant = (SELECT id FROM tenants WHERE name = thread_timers.tenant);
UPDATE async_calls SET tenant = (SELECT id FROM tenants WHERE name = async_calls.tenant);
"#;

/// The schema version recorded in the database.
fn user_version(conn: &Connection) -> AgentResult<u32> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .context("reading the schema version")?;
    // user_version is a signed 32-bit header field; a negative value was not written by Keel.
    u32::try_from(version).map_err(|_| {
        AgentError::storage(format!(
            "the database's schema version {version} is not one Keel writes"
        ))
    })
}

/// Refuse a schema newer than [`SCHEMA_VERSION`]: its tables may mean something this code
/// would misread or damage.
fn refuse_newer(version: u32, location: &str) -> AgentResult<()> {
    if version > SCHEMA_VERSION {
        return Err(AgentError::storage(format!(
            "the SQLite database at {location} has schema version {version}, newer than this \
             Keel understands ({SCHEMA_VERSION}); upgrade Keel or open another file"
        )));
    }
    Ok(())
}

/// How many prepared statements a connection keeps. The store has a few dozen distinct
/// statements, and rusqlite's default of 16 made the busiest ones fall out and be compiled
/// again.
const STATEMENT_CACHE: usize = 128;

/// What every connection, the writer's and the readers', is set up with.
fn configure_statements(conn: &Connection) -> AgentResult<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // The bundled SQLite is built with STAT4, under which a statement whose bound values the
    // query planner looked at is compiled again whenever they change: in practice at every
    // execution of every cached statement, about a seventh of a loaded server's CPU. The
    // query planner stability guarantee keeps one plan per statement; Keel's queries are
    // point lookups and index range scans whose best plan does not depend on the values.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .context("enabling the query planner stability guarantee")?;
    // Temporary files stay in memory: the writer's savepoint per job keeps a sub-journal of
    // the pages it changes, and with temporary files on disk that was a `pwrite` per page
    // (more than half of a loaded server's file writes) for a journal that the next commit
    // throws away and that never needs to survive a crash.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .context("keeping temporary files in memory")?;
    Ok(())
}

/// Settings every connection needs. `busy_timeout` first, so the pragmas below already
/// wait for a lock held by another process instead of failing.
pub(crate) fn configure_reader(conn: &Connection) -> AgentResult<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .context("setting busy_timeout")?;
    configure_statements(conn)?;
    // Readers never write: enforce it, so a bug cannot bypass the writer and its fencing.
    conn.pragma_update(None, "query_only", true)
        .context("setting query_only")?;
    Ok(())
}

/// Configure the writer connection and bring the schema up to date. `location` names the
/// database in errors (the path, or `:memory:`).
pub(crate) fn prepare_writer(conn: &mut Connection, location: &str, file: bool) -> AgentResult<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
        .context("setting busy_timeout")?;
    configure_statements(conn)?;
    // Check before changing anything: a newer database is left exactly as it was.
    refuse_newer(user_version(conn)?, location)?;
    // WAL lets readers run beside the writer; the mode is persistent in the file.
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .context("switching to WAL journal mode")?;
    if file && !mode.eq_ignore_ascii_case("wal") {
        // Still correct (readers wait on the busy timeout instead), just slower: some file
        // systems, such as network mounts, cannot do WAL.
        tracing::warn!(%location, %mode, "SQLite could not switch to WAL journal mode");
    }
    // FULL: a commit is on disk (the WAL fsynced) before it returns, so an acknowledged write
    // survives power loss. This is the brief's "persisted before acknowledged"; group commit
    // pays the fsync once per batch.
    conn.pragma_update(None, "synchronous", "FULL")
        .context("setting synchronous=FULL")?;
    conn.pragma_update(None, "foreign_keys", true)
        .context("enabling foreign keys")?;
    migrate(conn, location)
}

/// Apply every missing migration in one transaction.
fn migrate(conn: &mut Connection, location: &str) -> AgentResult<()> {
    // IMMEDIATE takes the write lock before reading the version, so a concurrent opener waits
    // and then sees the migrated version instead of migrating twice.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .context("starting the migration transaction")?;
    let current = user_version(&tx)?;
    refuse_newer(current, location)?;
    for (index, step) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index + 1;
        tracing::info!(%location, version, description = step.description, "migrating SQLite schema");
        tx.execute_batch(step.sql).context(&format!(
            "applying schema migration {version} ({})",
            step.description
        ))?;
    }
    if current < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .context("recording the schema version")?;
    }
    tx.commit().context("committing the schema migration")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        prepare_writer(&mut conn, ":memory:", false).unwrap();
        prepare_writer(&mut conn, ":memory:", false).unwrap();
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
    }

    /// An in-memory database migrated to `version` only, as an older Keel left it.
    fn database_at_version(version: usize) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        for step in &MIGRATIONS[..version] {
            conn.execute_batch(step.sql).unwrap();
        }
        conn.pragma_update(None, "user_version", version as i64)
            .unwrap();
        conn
    }

    #[test]
    fn timers_stored_before_owners_become_ownerless() {
        // A version-3 database with a timer in it, as an older Keel left it.
        let mut conn = database_at_version(3);
        conn.execute(
            "INSERT INTO thread_timers (id, tenant, thread_id, due_at, ready_at, body) \
             VALUES ('t1', 'ns', 'th', 1, 1, '{}')",
            [],
        )
        .unwrap();
        prepare_writer(&mut conn, ":memory:", false).unwrap();
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        let agent: String = conn
            .query_row("SELECT agent FROM thread_timers WHERE id = 't1'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(
            agent, "",
            "an existing timer has no owner, so any agent claims it"
        );
    }

    #[test]
    fn tasks_stored_before_the_update_index_get_their_status_time() {
        // A version-4 database with a task in it, as an older Keel left it.
        let mut conn = database_at_version(4);
        conn.execute(
            "INSERT INTO tasks (tenant, task_id, thread_id, state, body) VALUES ('ns', 't1', \
             'th', 'working', '{\"format\":1,\"data\":{\"status\":{\"state\":\"working\",\
             \"timestamp\":\"2026-01-02T03:04:05.678901234Z\"}}}')",
            [],
        )
        .unwrap();
        prepare_writer(&mut conn, ":memory:", false).unwrap();
        let micros: i64 = conn
            .query_row(
                "SELECT updated_at FROM tasks WHERE task_id = 't1'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let expected = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05.679Z")
            .unwrap()
            .timestamp_micros();
        assert_eq!(micros, expected, "to the millisecond");
    }

    #[test]
    fn rows_stored_before_tenant_keys_name_their_tenant_by_key() {
        // A version-5 database with two tenants' rows, as an older Keel left it.
        let mut conn = database_at_version(5);
        conn.execute_batch(
            "INSERT INTO tasks (tenant, task_id, thread_id, state, body) \
             VALUES ('3:app/5:alice', 't1', 'th1', 'working', '{}'), \
                    ('3:app/3:bob', 't2', 'th2', 'working', '{}'); \
             INSERT INTO thread_history (tenant, thread_id, seq, body) \
             VALUES ('3:app/3:bob', 'th2', 1, '{}'); \
             INSERT INTO leases (tenant, thread_id, holder, token, expires_at) \
             VALUES ('3:app/5:alice', 'th1', 'w', 1, 1);",
        )
        .unwrap();
        prepare_writer(&mut conn, ":memory:", false).unwrap();
        let key_of = |name: &str| -> String {
            conn.query_row("SELECT id FROM tenants WHERE name = ?1", [name], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
            .to_string()
        };
        let (alice, bob) = (key_of("3:app/5:alice"), key_of("3:app/3:bob"));
        assert_ne!(alice, bob);
        let tenant_of = |sql: &str| -> String { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(
            tenant_of("SELECT tenant FROM tasks WHERE task_id = 't1'"),
            alice
        );
        assert_eq!(
            tenant_of("SELECT tenant FROM tasks WHERE task_id = 't2'"),
            bob
        );
        assert_eq!(tenant_of("SELECT tenant FROM thread_history"), bob);
        assert_eq!(tenant_of("SELECT tenant FROM leases"), alice);
    }

    #[test]
    fn a_newer_schema_is_refused_untouched() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = prepare_writer(&mut conn, "db.sqlite", false).unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }));
        assert!(err.to_string().contains("newer"), "{err}");
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION + 1);
    }

    /// Both kinds of connection keep temporary files (the writer's per-job savepoint
    /// journals among them) in memory, and the writer commits with a full sync.
    #[test]
    fn connections_keep_temporary_files_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        let mut writer = Connection::open(&path).unwrap();
        prepare_writer(&mut writer, "keel.db", true).unwrap();
        let reader = Connection::open(&path).unwrap();
        configure_reader(&reader).unwrap();
        for conn in [&writer, &reader] {
            // 2 is MEMORY (0 the compile-time default, 1 FILE).
            let temp_store: i64 = conn
                .query_row("PRAGMA temp_store", [], |row| row.get(0))
                .unwrap();
            assert_eq!(temp_store, 2);
        }
        let synchronous: i64 = writer
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .unwrap();
        assert_eq!(synchronous, 2, "FULL");
    }
}
