//! The schema and its versioned migrations, applied under an advisory lock.
//!
//! `keel_schema_version` holds one row: the version. Migrations are an ordered list; step
//! `i` takes the schema from version `i` to `i + 1`. Connecting takes a session advisory lock
//! (keyed by the schema's name), applies every missing step in one transaction and unlocks,
//! so two processes starting at once on a new database migrate it once; a database whose
//! version is newer than this code knows is refused rather than misread.

use keel_core::{AgentError, AgentResult};

use crate::error::doing;

/// Every migration, oldest first. Append only: a released step is never edited.
const MIGRATIONS: &[&str] = &[V1];

/// The schema version this code creates and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The first key of Keel's advisory lock (the second is the schema's name, hashed): an
/// arbitrary constant no other application is likely to use ("keel" in ASCII).
const LOCK_CLASS: i32 = 0x6b65_656c;

const LOCK: &str = "SELECT pg_advisory_lock($1, hashtext(current_schema()))";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1, hashtext(current_schema()))";
const CREATE_VERSION: &str = "CREATE TABLE IF NOT EXISTS keel_schema_version (\
     one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)";
const READ_VERSION: &str = "SELECT version FROM keel_schema_version";
const WRITE_VERSION: &str = "INSERT INTO keel_schema_version (version) VALUES ($1) \
     ON CONFLICT (one) DO UPDATE SET version = excluded.version";

/// Version 1. Every table but the two read across tenants is keyed by `tenant` (the
/// `AuthContext::namespace` string) first. Timestamps are BIGINT nanoseconds (UTC); Keel's
/// records are TEXT in the versioned stored-JSON envelope; callers' values plain JSON TEXT.
/// `COLLATE "C"` on the keys that are listed in order keeps Rust's byte order.
const V1: &str = r#"
-- Task snapshots (without history). `seq` is the creation order used for listing and page
-- tokens; an upsert keeps it. `updated_at` (µs) is the status time, the other order.
-- `last_event` numbers the event log, and its row lock serialises appends to one task.
CREATE TABLE tasks (
    seq        BIGSERIAL PRIMARY KEY,
    tenant     TEXT NOT NULL,
    task_id    TEXT COLLATE "C" NOT NULL,
    thread_id  TEXT NOT NULL,
    state      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_event BIGINT NOT NULL DEFAULT 0,
    body       TEXT NOT NULL,
    UNIQUE (tenant, task_id)
);
CREATE INDEX tasks_by_thread ON tasks (tenant, thread_id, seq);
CREATE INDEX tasks_by_state ON tasks (tenant, state, seq);
CREATE INDEX tasks_by_update ON tasks (tenant, updated_at, task_id);
CREATE INDEX tasks_by_thread_update ON tasks (tenant, thread_id, updated_at, task_id);
CREATE INDEX tasks_by_state_update ON tasks (tenant, state, updated_at, task_id);

CREATE TABLE task_events (
    tenant  TEXT NOT NULL,
    task_id TEXT NOT NULL,
    seq     BIGINT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (tenant, task_id, seq)
);

CREATE TABLE memory (
    tenant     TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    expires_at BIGINT,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX memory_by_expiry ON memory (expires_at) WHERE expires_at IS NOT NULL;

-- Per-thread counters that outlive what they number (acked queue items, released leases);
-- the row is also the lock that serialises taking a thread's lease and capping its keys.
CREATE TABLE threads (
    tenant           TEXT NOT NULL,
    thread_id        TEXT NOT NULL,
    last_queue_seq   BIGINT NOT NULL DEFAULT 0,
    last_lease_token BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, thread_id)
);

CREATE TABLE thread_history (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (tenant, thread_id, seq)
);

CREATE TABLE thread_queue (
    tenant      TEXT NOT NULL,
    thread_id   TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    id          TEXT NOT NULL,
    payload     TEXT NOT NULL,
    enqueued_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, thread_id, seq)
);
CREATE UNIQUE INDEX thread_queue_by_id ON thread_queue (tenant, thread_id, id);

CREATE TABLE thread_kv (
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    key       TEXT COLLATE "C" NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (tenant, thread_id, key)
);

CREATE TABLE subagents (
    tenant           TEXT NOT NULL,
    thread_id        TEXT COLLATE "C" NOT NULL,
    parent_thread_id TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    body             TEXT NOT NULL,
    PRIMARY KEY (tenant, thread_id)
);
CREATE INDEX subagents_by_parent ON subagents (tenant, parent_thread_id, created_at, thread_id);

CREATE TABLE leases (
    tenant     TEXT NOT NULL,
    thread_id  TEXT NOT NULL,
    holder     TEXT NOT NULL,
    token      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, thread_id)
);

CREATE TABLE task_records (
    id          BIGSERIAL PRIMARY KEY,
    tenant      TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    thread_id   TEXT NOT NULL,
    state       TEXT NOT NULL,
    run_id      TEXT,
    trace_id    TEXT,
    agent_name  TEXT,
    recorded_at BIGINT NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX task_records_by_task ON task_records (tenant, task_id, id);
CREATE INDEX task_records_by_run ON task_records (tenant, run_id, id);
CREATE INDEX task_records_by_thread ON task_records (tenant, thread_id, id);
CREATE INDEX task_records_by_trace ON task_records (tenant, trace_id, id);
CREATE INDEX task_records_by_agent ON task_records (tenant, agent_name, id);
CREATE INDEX task_records_by_time ON task_records (tenant, recorded_at);

-- One report per run; a save replaces it and takes a new `id`, so it is the newest of
-- reports of equal time.
CREATE TABLE run_records (
    id          BIGSERIAL PRIMARY KEY,
    tenant      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    task_id     TEXT,
    thread_id   TEXT,
    trace_id    TEXT,
    agent_name  TEXT,
    recorded_at BIGINT NOT NULL,
    body        TEXT NOT NULL,
    UNIQUE (tenant, run_id)
);
CREATE INDEX run_records_by_task ON run_records (tenant, task_id);
CREATE INDEX run_records_by_thread ON run_records (tenant, thread_id);
CREATE INDEX run_records_by_trace ON run_records (tenant, trace_id);
CREATE INDEX run_records_by_agent ON run_records (tenant, agent_name);
CREATE INDEX run_records_by_time ON run_records (tenant, recorded_at);

-- Timers are read across tenants (a scheduler claims due timers of all of them), so the
-- tenant is a column beside the id. `ready_at` is when the row may be claimed: its due
-- time, then the end of each claim. `agent` '' is claimable by every agent.
CREATE TABLE thread_timers (
    id        TEXT COLLATE "C" PRIMARY KEY,
    tenant    TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    agent     TEXT NOT NULL DEFAULT '',
    due_at    BIGINT NOT NULL,
    ready_at  BIGINT NOT NULL,
    claim     TEXT,
    attempts  INTEGER NOT NULL DEFAULT 0,
    body      TEXT NOT NULL
);
CREATE INDEX thread_timers_by_agent ON thread_timers (agent, ready_at, id);
CREATE INDEX thread_timers_by_thread ON thread_timers (tenant, thread_id, due_at, id);

-- Asynchronous tool calls, by call id alone: a callback names only its call.
CREATE TABLE async_calls (
    call_id   TEXT PRIMARY KEY,
    tenant    TEXT NOT NULL,
    app_name  TEXT NOT NULL,
    user_name TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    state     TEXT NOT NULL,
    record    TEXT NOT NULL
);
"#;

/// Bring the connection's schema up to date, under Keel's advisory lock.
pub(crate) async fn migrate(client: &mut deadpool_postgres::Object) -> AgentResult<()> {
    client
        .execute(LOCK, &[&LOCK_CLASS])
        .await
        .map_err(doing("taking the migration lock"))?;
    let result = apply(client).await;
    // Unlock whatever happened: the connection goes back to the pool.
    let unlocked = client
        .execute(UNLOCK, &[&LOCK_CLASS])
        .await
        .map_err(doing("releasing the migration lock"));
    result.and(unlocked.map(|_| ()))
}

/// Every missing step, in one transaction.
async fn apply(client: &mut deadpool_postgres::Object) -> AgentResult<()> {
    client
        .batch_execute(CREATE_VERSION)
        .await
        .map_err(doing("creating the schema version table"))?;
    let row = client
        .query_opt(READ_VERSION, &[])
        .await
        .map_err(doing("reading the schema version"))?;
    let version: i32 = row.map_or(0, |row| row.get(0));
    let version = u32::try_from(version).unwrap_or(u32::MAX);
    if version > SCHEMA_VERSION {
        return Err(AgentError::storage(format!(
            "the PostgreSQL schema has Keel schema version {version}, newer than this Keel \
             understands ({SCHEMA_VERSION}); upgrade Keel or use another schema"
        )));
    }
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = client
        .transaction()
        .await
        .map_err(doing("starting a migration"))?;
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| crate::error::fail(&format!("migrating to version {}", step + 1), e))?;
    }
    let new_version = i32::try_from(SCHEMA_VERSION).unwrap_or(i32::MAX);
    tx.execute(WRITE_VERSION, &[&new_version])
        .await
        .map_err(doing("recording the schema version"))?;
    tx.commit().await.map_err(doing("committing a migration"))?;
    tracing::info!(
        from = version,
        to = SCHEMA_VERSION,
        "migrated the PostgreSQL schema"
    );
    Ok(())
}
