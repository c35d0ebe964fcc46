//! Keel's store traits over SQLite: the embedded, durable backend.
//!
//! One [`SqliteStore`] implements every store trait of `keel-runtime` — [`TaskManager`],
//! [`MemoryService`], [`ThreadHistory`], [`ThreadQueue`], [`ThreadKv`], [`SubagentRegistry`],
//! [`ThreadLeases`] (so also [`ThreadStore`]), [`RunStore`], [`ThreadTimers`],
//! [`AsyncCallStore`] and [`StepStore`] — over one database file, with the same semantics as
//! the in-memory stores (the shared conformance suite checks it). Paired writes are one write
//! job each: [`TaskManager::save_task_with_events`] (a snapshot and its events) and
//! [`StepStore::persist_step`] (a step's history and task log, fenced).
//!
//! # Durability and concurrency
//!
//! - **Persisted before acknowledged.** The database runs in WAL mode with
//!   `synchronous=FULL`: a write's future resolves only after the transaction holding it has
//!   committed and the WAL has been fsynced.
//! - **Group commit.** All writes go through one writer thread that batches whatever is
//!   queued into one transaction and one fsync, each write in its own savepoint (see the
//!   `writer` module). [`SqliteStore::stats`] shows the batching.
//! - **Reads** run beside the writer on two reader threads, each owning one read connection.
//!   Like the writer, a reader thread serves whatever reads are queued as one batch in one
//!   read transaction (one consistent snapshot, taken after every read of the batch was sent,
//!   so a read sent after a write was acknowledged sees it), answering each as it finishes
//!   (see the `readers` module). An in-memory database has only the writer's connection, so
//!   there reads go through the writer thread too.
//! - **Fencing.** Lease acquisition and every fenced write (`append_history`, `ack_queue`,
//!   `renew_lease`, `persist_step`) check the lease and write in the same transaction, so a holder whose
//!   lease expired or was taken over cannot write, even from another process sharing the file.
//! - **Cancellation.** A write whose future is dropped after it was handed to the writer
//!   thread still runs and may commit; only its answer is lost, so treat its outcome as
//!   unknown. Saves, acks, releases and key-value sets can simply be repeated; a repeated
//!   `push_queue`, `append_history`, `add_task_event` or `persist_step` may land twice, as
//!   may the events of a repeated `save_task_with_events`.
//! - **Several processes** may open the same file: SQLite's locks serialise their writers
//!   (each waits up to the busy timeout, 5 s) and leases keep one flow per thread. One of
//!   them runs agents on it: [`StoreOwner`] locks a file beside the database for that
//!   process and keeps its instance id, so that it takes its own threads back at once when
//!   it restarts (`keel serve` claims its store so).
//!
//! # Storage format
//!
//! Keel's records (task snapshots, events, history messages, subagent entries, task and run
//! records) are stored in `keel_core::stored`'s versioned JSON envelope; callers' own JSON
//! values (memory, key-value store, queue payloads) as plain JSON text. Timestamps are
//! integer nanoseconds since the Unix epoch, UTC. Every row names its tenant by a short key,
//! the id of the tenant's namespace in the `tenants` table. The schema is versioned with
//! `PRAGMA user_version` ([`SCHEMA_VERSION`]) and migrated on open.
//!
//! ```
//! use std::sync::Arc;
//! use keel_core::{Message, Task};
//! use keel_runtime::{AuthContext, TaskManager};
//! use keel_store_sqlite::SqliteStore;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel_core::AgentError> {
//! # let dir = tempfile::tempdir().unwrap();
//! let store = Arc::new(SqliteStore::open(dir.path().join("keel.db"))?);
//! let tasks: Arc<dyn TaskManager> = store.clone();
//! let auth = AuthContext::new("app", "alice");
//! let task = Task::create(Message::user("hi"));
//! tasks.save_task(&auth, &task).await?;
//! assert!(tasks.get_task(&auth, &task.id).await?.is_some());
//! # Ok(())
//! # }
//! ```
//!
//! [`TaskManager`]: keel_runtime::TaskManager
//! [`MemoryService`]: keel_runtime::MemoryService
//! [`ThreadHistory`]: keel_runtime::ThreadHistory
//! [`ThreadQueue`]: keel_runtime::ThreadQueue
//! [`ThreadKv`]: keel_runtime::ThreadKv
//! [`SubagentRegistry`]: keel_runtime::SubagentRegistry
//! [`ThreadLeases`]: keel_runtime::ThreadLeases
//! [`ThreadStore`]: keel_runtime::ThreadStore
//! [`RunStore`]: keel_runtime::RunStore
//! [`ThreadTimers`]: keel_runtime::ThreadTimers
//! [`AsyncCallStore`]: keel_runtime::AsyncCallStore
//! [`StepStore`]: keel_runtime::StepStore
//! [`StepStore::persist_step`]: keel_runtime::StepStore::persist_step
//! [`TaskManager::save_task_with_events`]: keel_runtime::TaskManager::save_task_with_events

mod async_calls;
mod codec;
mod leases;
mod memory;
mod owner;
mod readers;
mod runs;
mod schema;
mod steps;
mod tasks;
mod tenants;
mod threads;
mod timers;
mod workers;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use keel_core::{AgentError, AgentResult};
use keel_runtime::{KvLimits, Llm, Services};
use rusqlite::{Connection, OpenFlags};

use crate::readers::ReadPool;
use crate::writer::Writer;

pub use crate::owner::StoreOwner;
pub use crate::schema::SCHEMA_VERSION;

/// Every Keel store trait over one SQLite database. Cheap to clone: clones share the
/// database, its writer thread and its reader threads. The threads stop and the file is
/// closed when the last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
    kv_limits: KvLimits,
}

struct Inner {
    /// The path, or `:memory:`, for error messages.
    location: String,
    /// `None` for an in-memory database, whose only connection is the writer's.
    readers: Option<ReadPool>,
    writer: Writer,
    /// The keys of the tenants used so far (see `tenants`).
    tenants: tenants::TenantKeys,
}

/// Writes the writer thread answered (committed, or failed), counted in the process's
/// `metrics` recorder as [`StoreStats::writes_finished`] is (`keel serve --metrics`): with
/// [`COMMITS_METRIC`], how many writes one commit shares (docs/observability.md).
pub const WRITES_METRIC: &str = "keel_sqlite_writes_total";
/// Write transactions the writer thread committed, each one fsync ([`StoreStats::commits`]).
pub const COMMITS_METRIC: &str = "keel_sqlite_commits_total";
/// Reads the reader threads took ([`StoreStats::reads_submitted`], counted as a batch
/// begins).
pub const READS_METRIC: &str = "keel_sqlite_reads_total";
/// Read transactions the reader threads began, each shared by a batch of reads
/// ([`StoreStats::read_batches`]).
pub const READ_TRANSACTIONS_METRIC: &str = "keel_sqlite_read_transactions_total";

/// What the writer and reader threads have done since the store was opened: how many writes
/// the writer took and in how many commits (`writes_finished / commits` is the average
/// group-commit batch size), and how many reads the reader threads took and in how many
/// batches (`reads_submitted / read_batches` is the average read batch size).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Writes sent to the writer thread.
    pub writes_submitted: u64,
    /// Writes answered (committed, or failed).
    pub writes_finished: u64,
    /// Transactions committed (one per batch; schema migrations are not counted).
    pub commits: u64,
    /// Batches whose transaction could not start or commit, so every write in them failed.
    pub failed_batches: u64,
    /// Reads sent to the reader threads. Zero for an in-memory database, whose reads go
    /// through the writer thread (and are counted as writes).
    pub reads_submitted: u64,
    /// Read batches begun by the reader threads (each one read transaction, one snapshot).
    pub read_batches: u64,
}

impl SqliteStore {
    /// Open (creating if needed) the database file at `path`, configure it (WAL,
    /// `synchronous=FULL`, foreign keys, busy timeout), migrate its schema, and start the
    /// writer thread and the reader threads (each with its own read connection).
    ///
    /// This is synchronous and does blocking file I/O (opening, and a migration on first
    /// use), like `std::fs::File::open`; it is meant for start-up. From inside an async
    /// context on a hot path, wrap it in `tokio::task::spawn_blocking`. It needs no tokio
    /// runtime; the store's methods do (they await answers from the store's threads).
    ///
    /// A file that cannot be opened (for example in a directory that does not exist), is not
    /// a SQLite database, or has a schema newer than [`SCHEMA_VERSION`] is
    /// [`AgentError::Storage`] naming the path.
    pub fn open(path: impl AsRef<Path>) -> AgentResult<SqliteStore> {
        let path = path.as_ref();
        let location = path.display().to_string();
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| {
            AgentError::storage_source(
                "sqlite",
                format!(
                    "opening the database at {location} (does the directory exist, and may \
                     this process write there?)"
                ),
                e,
            )
        })?;
        schema::prepare_writer(&mut conn, &location, true).map_err(|e| naming(e, &location))?;
        // Readers open the file later: pin the absolute path now, so a change of the working
        // directory cannot point them at another file.
        let absolute: PathBuf = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let writer = Writer::start(conn, &location)?;
        let readers = ReadPool::start(&absolute, &location).map_err(|e| naming(e, &location))?;
        tracing::info!(%location, schema_version = SCHEMA_VERSION, "opened SQLite store");
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                location,
                readers: Some(readers),
                writer,
                tenants: Default::default(),
            }),
            kv_limits: KvLimits::DEFAULT,
        })
    }

    /// A store in process memory, for tests: the same SQL and semantics as a file, but
    /// nothing survives the store, and reads share the writer thread.
    pub fn open_in_memory() -> AgentResult<SqliteStore> {
        let location = ":memory:".to_owned();
        let mut conn = Connection::open_in_memory().map_err(|e| {
            AgentError::storage_source("sqlite", "opening an in-memory database", e)
        })?;
        schema::prepare_writer(&mut conn, &location, false)?;
        let writer = Writer::start(conn, &location)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                location,
                readers: None,
                writer,
                tenants: Default::default(),
            }),
            kv_limits: KvLimits::DEFAULT,
        })
    }

    /// Use other caps for the per-thread key-value store (default [`KvLimits::DEFAULT`]).
    #[must_use]
    pub fn with_kv_limits(mut self, limits: KvLimits) -> SqliteStore {
        self.kv_limits = limits;
        self
    }

    /// The key-value caps in force.
    pub fn kv_limits(&self) -> KvLimits {
        self.kv_limits
    }

    /// Every service of a runtime over this database (tasks, memory, threads, one-write-job
    /// step writes, runs, timers, asynchronous calls), with a static tenant, `tracing` logs
    /// and `llm` as the default model.
    pub fn services(&self, llm: Arc<dyn Llm>) -> Services {
        Services::from_store(self.clone(), self.kv_limits, llm).with_steps(self.clone())
    }

    /// The database's path as given to [`SqliteStore::open`], or `:memory:`.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// Counters of the writer and reader threads, for monitoring group commit and read
    /// batching.
    pub fn stats(&self) -> StoreStats {
        let counters = self.inner.writer.counters();
        let mut stats = StoreStats {
            writes_submitted: counters.submitted.load(Ordering::Relaxed),
            writes_finished: counters.finished.load(Ordering::Relaxed),
            commits: counters.commits.load(Ordering::Relaxed),
            failed_batches: counters.failed_batches.load(Ordering::Relaxed),
            ..StoreStats::default()
        };
        if let Some(readers) = &self.inner.readers {
            let counters = readers.counters();
            stats.reads_submitted = counters.submitted.load(Ordering::Relaxed);
            stats.read_batches = counters.batches.load(Ordering::Relaxed);
        }
        stats
    }

    /// Run `work` on a read connection, in one snapshot (shared with the other reads of its
    /// batch).
    pub(crate) async fn read<T, F>(&self, work: F) -> AgentResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> AgentResult<T> + Send + 'static,
    {
        match &self.inner.readers {
            Some(pool) => pool.run(work).await,
            None => self.inner.writer.run(work).await,
        }
    }

    /// Run `work` in the writer's transaction; resolves once it is durable (or failed).
    pub(crate) async fn write<T, F>(&self, work: F) -> AgentResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> AgentResult<T> + Send + 'static,
    {
        self.inner.writer.run(work).await
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.inner.location)
            .field("kv_limits", &self.kv_limits)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Prefix a storage error from opening with the database's path, so it can be acted on.
fn naming(error: AgentError, location: &str) -> AgentError {
    match error {
        AgentError::Storage {
            operation, source, ..
        } if !operation.contains(location) && !source.to_string().contains(location) => {
            AgentError::Storage {
                backend: "sqlite",
                operation: if operation.is_empty() {
                    format!("opening the database at {location}")
                } else {
                    format!("opening the database at {location}: {operation}")
                },
                source,
            }
        }
        other => other,
    }
}
