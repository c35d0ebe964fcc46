//! A small pool of read connections, used through `spawn_blocking`.
//!
//! Why not read on the writer thread: reads would then queue behind writes and wait for their
//! fsyncs, and a batch would hold the write lock while serving them. In WAL mode SQLite lets
//! any number of readers run beside the one writer, each on a consistent snapshot, so reads
//! get their own connections and scale with the blocking pool instead. A read started after a
//! write was acknowledged sees it: the writer answers only after `COMMIT`, and every read
//! transaction starts from the latest commit.

use std::path::PathBuf;
use std::sync::Mutex;

use keel_core::{AgentError, AgentResult};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use crate::codec::SqlContext;
use crate::schema;

/// How many reads may run at once, and how many idle connections are kept.
const MAX_READERS: usize = 8;

/// Read connections to one database file.
pub(crate) struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
}

impl ReadPool {
    /// A pool for the database at `path` (already created and migrated by the writer).
    /// Connections are opened on first use.
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(MAX_READERS),
        }
    }

    /// Run `work` in a read transaction (one consistent snapshot for all its statements) on a
    /// blocking thread.
    pub(crate) async fn run<T, F>(&self, work: F) -> AgentResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> AgentResult<T> + Send + 'static,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| AgentError::internal("the SQLite read pool was closed"))?;
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let path = self.path.clone();
        let (conn, result) = tokio::task::spawn_blocking(move || {
            let conn = match idle {
                Some(conn) => conn,
                None => open_reader(&path)?,
            };
            let result = in_snapshot(&conn, work);
            Ok::<_, AgentError>((conn, result))
        })
        .await
        .map_err(|e| AgentError::internal(format!("a SQLite read task failed: {e}")))??;
        // Only a connection back in autocommit mode is clean enough to reuse.
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_READERS {
                idle.push(conn);
            }
        }
        result
    }
}

fn open_reader(path: &std::path::Path) -> AgentResult<Connection> {
    // Read-write flags with `query_only`, rather than SQLITE_OPEN_READ_ONLY: a read-only
    // connection to a WAL database fails when it cannot write the shared-memory file.
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| {
        AgentError::storage_source(
            "sqlite",
            format!(
                "opening a read connection to the database at {}",
                path.display()
            ),
            e,
        )
    })?;
    schema::configure_reader(&conn)?;
    Ok(conn)
}

fn in_snapshot<T>(
    conn: &Connection,
    work: impl FnOnce(&Connection) -> AgentResult<T>,
) -> AgentResult<T> {
    let tx = conn
        .unchecked_transaction()
        .context("starting a read transaction")?;
    let result = work(&tx);
    // Nothing was written; ending the transaction only releases the snapshot.
    let ended = tx.rollback().context("ending a read transaction");
    let value = result?;
    ended?;
    Ok(value)
}
