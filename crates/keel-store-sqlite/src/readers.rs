//! The reader threads: a few OS threads, each owning one read connection, that serve reads in
//! batches.
//!
//! Why not read on the writer thread: reads would then queue behind writes and wait for their
//! fsyncs, and a batch would hold the write lock while serving them. In WAL mode SQLite lets
//! any number of readers run beside the one writer, each on a consistent snapshot, so reads
//! get their own connections.
//!
//! Why not `spawn_blocking` per read: each read then costs a task allocation, a wake of a
//! blocking-pool thread and a wake back, and under load those context switches and futex
//! calls, not SQLite, take most of the CPU. Like the writer, a reader thread instead takes the
//! first waiting job from ONE channel shared by all reader threads, drains whatever else is
//! already queued (up to [`MAX_BATCH`]), and serves the whole batch in ONE read transaction
//! (one snapshot), answering each job as soon as it has run. Under load one wake serves many
//! reads; with no load a read runs at once (there is no waiting to fill a batch).
//!
//! The rules:
//!
//! - **A read sent after a write was acknowledged sees that write.** The writer answers only
//!   after `COMMIT`, and a batch's snapshot is taken by its first statement, which runs after
//!   every job of the batch was sent (the thread has received them all before it begins).
//! - **A job's error goes to that job only.** The others of its batch run and answer as
//!   usual; a job never writes (`query_only`), so it cannot spoil the snapshot for the rest.
//! - **A panic in a job** answers that job with [`AgentError::Internal`]; the thread rolls
//!   the transaction back and goes on serving.
//! - **A connection left in a transaction** (by a failing or misbehaving job) is rolled back
//!   before the next batch, and a job that ended the batch's transaction gets a fresh one for
//!   the jobs after it.
//! - **Dropping the pool** closes the channel: the threads serve the jobs already sent, close
//!   their connections and are joined. A read whose thread is gone is a clear
//!   [`AgentError::Storage`], never a hang.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use keel_core::{AgentError, AgentResult};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use crate::codec::SqlContext;
use crate::schema;
use crate::workers::{self, ConnWork, Workers};

/// How many reader threads (and read connections) a file database gets. Two, not one: a
/// slow read (a long history, a large scan) then holds up only the reads batched with it,
/// while the other thread keeps serving new ones. Not more: every thread is an OS thread and
/// a connection with its own page cache, reads are short, and batching already serves many
/// reads per wake.
pub(crate) const READER_THREADS: usize = 2;

/// The most jobs one read batch takes. Bounds how long the reads at the end of a batch wait
/// behind the ones before them, and how long one snapshot is held (a held snapshot keeps the
/// WAL from being checkpointed past it).
pub(crate) const MAX_BATCH: usize = 64;

/// Counters the reader threads keep; see [`crate::StoreStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) batches: AtomicU64,
}

/// One read, type-erased so reads with different results share a channel.
trait ReadJob: Send {
    /// Run on `conn` (inside the batch's read transaction) and answer the caller at once.
    fn run(self: Box<Self>, conn: &Connection);
    /// Answer the caller with `error` without running the read.
    fn fail(self: Box<Self>, error: AgentError);
}

/// A read's closure and where to send its answer.
struct Pending<T, F> {
    work: F,
    reply: oneshot::Sender<AgentResult<T>>,
}

impl<T, F> ReadJob for Pending<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> AgentResult<T> + Send,
{
    fn run(self: Box<Self>, conn: &Connection) {
        let Pending { work, reply } = *self;
        // A panic in one read must not take the thread (and every later read) down.
        let answer = catch_unwind(AssertUnwindSafe(|| work(conn))).unwrap_or_else(|_| {
            Err(AgentError::internal(
                "a read panicked in a SQLite reader thread",
            ))
        });
        // The caller may have stopped waiting (its future was dropped); nothing to undo.
        let _ = reply.send(answer);
    }

    fn fail(self: Box<Self>, error: AgentError) {
        let _ = self.reply.send(Err(error));
    }
}

type Job = Box<dyn ReadJob>;

/// The reader threads of one database file. Dropping it closes the channel; the threads
/// finish the reads already sent, close their connections and are joined.
pub(crate) struct ReadPool {
    threads: Workers<Job>,
    counters: Arc<Counters>,
}

impl ReadPool {
    /// Open [`READER_THREADS`] read connections to the database at `path` (already created
    /// and migrated by the writer) and start a thread for each. `location` names the database
    /// in errors.
    pub(crate) fn start(path: &Path, location: &str) -> AgentResult<Self> {
        // Opened here rather than on the threads, so a file that cannot be read fails the
        // store's opening instead of every later read.
        let conns = (0..READER_THREADS)
            .map(|_| open_reader(path))
            .collect::<AgentResult<Vec<_>>>()?;
        let (jobs, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let counters = Arc::new(Counters::default());
        let mut threads = Workers::new(jobs);
        for (n, conn) in conns.into_iter().enumerate() {
            let (receiver, counters) = (receiver.clone(), counters.clone());
            threads.spawn(
                format!("keel-sqlite-reader-{n}"),
                &format!("a reader thread for {location}"),
                move || serve(conn, &receiver, &counters),
            )?;
        }
        Ok(Self { threads, counters })
    }

    /// The reader threads' counters.
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Run `work` in a read transaction (one consistent snapshot for all its statements,
    /// shared with the other reads of its batch) on a reader thread.
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl ConnWork<T>) -> AgentResult<T> {
        self.submit(work)?.await.map_err(|_| stopped())?
    }

    /// Queue `work` for the reader threads; the receiver gets its answer. Separate from
    /// [`ReadPool::run`] so tests can queue reads without polling futures.
    fn submit<T: Send + 'static>(
        &self,
        work: impl ConnWork<T>,
    ) -> AgentResult<oneshot::Receiver<AgentResult<T>>> {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(Pending { work, reply });
        self.counters.submitted.fetch_add(1, Ordering::Relaxed);
        if !self.threads.send(job) {
            return Err(stopped());
        }
        Ok(answer)
    }
}

fn stopped() -> AgentError {
    AgentError::storage(
        "the SQLite reader threads have stopped, so the read was not done; see earlier errors \
         in the log",
    )
}

/// A reader thread's loop: one batch per turn until every sender is gone.
fn serve(conn: Connection, jobs: &Mutex<Receiver>, counters: &Counters) {
    while let Some(batch) = next_batch(jobs) {
        counters.batches.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::READ_TRANSACTIONS_METRIC).increment(1);
        metrics::counter!(crate::READS_METRIC).increment(batch.len() as u64);
        serve_batch(&conn, batch);
    }
    tracing::debug!("SQLite reader thread stopping");
}

type Receiver = mpsc::Receiver<Job>;

/// Wait for the first job, then take what else is already queued. `None` once the channel
/// is closed and empty.
fn next_batch(jobs: &Mutex<Receiver>) -> Option<Vec<Job>> {
    // The lock is held while waiting: the other threads wait on the lock instead of the
    // channel, and the one holding it drains the queue in one go. It is released before the
    // batch runs, so another thread can take the next jobs meanwhile. The receiver cannot be
    // left inconsistent by a panic, so a poisoned lock is still usable.
    let jobs = jobs.lock().unwrap_or_else(|p| p.into_inner());
    workers::next_batch(&jobs, MAX_BATCH)
}

/// Serve `batch` in one read transaction, answering each job as it finishes.
fn serve_batch(conn: &Connection, batch: Vec<Job>) {
    // Every path below ends its transaction; this guards against one left open anyway
    // (a job that began its own), which would otherwise pin an old snapshot for good.
    rollback(conn);
    for job in batch {
        // A deferred BEGIN takes its snapshot at the first statement, which is after every
        // job of the batch was received. Begun again when a job ended the transaction, so
        // the jobs after it still run in one (newer, and still taken after they were sent).
        if conn.is_autocommit() {
            if let Err(e) = conn
                .execute_batch("BEGIN")
                .context("starting a read transaction")
            {
                // Only this job fails; the next one tries again.
                job.fail(e);
                continue;
            }
        }
        job.run(conn);
    }
    // Nothing was written; ending the transaction only releases the snapshot.
    rollback(conn);
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::error!(error = %e, "SQLite read rollback failed");
        }
    }
}

fn open_reader(path: &Path) -> AgentResult<Connection> {
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use super::*;

    /// A file database with one table `t`, and the reader threads over it. The directory
    /// must outlive the pool.
    fn pool() -> (tempfile::TempDir, Connection, ReadPool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("readers.db");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (n INTEGER NOT NULL)")
            .unwrap();
        let pool = ReadPool::start(&path, "readers.db").unwrap();
        (dir, writer, pool)
    }

    fn count(conn: &Connection) -> AgentResult<i64> {
        conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .map_err(AgentError::storage)
    }

    /// Occupy one reader thread until `release` is sent to: returns once the job is running,
    /// so its thread has already taken (and drained) its batch.
    fn hold_a_thread(
        pool: &ReadPool,
    ) -> (std_mpsc::Sender<()>, oneshot::Receiver<AgentResult<()>>) {
        let (started, running) = std_mpsc::channel();
        let (release, released) = std_mpsc::channel::<()>();
        let answer = pool
            .submit(move |_| {
                let _ = started.send(());
                let _ = released.recv();
                Ok(())
            })
            .unwrap();
        running.recv().unwrap();
        (release, answer)
    }

    #[tokio::test]
    async fn concurrent_reads_are_served_in_fewer_batches_than_reads() {
        let (_dir, _writer, pool) = pool();
        // Hold every reader thread, so the reads below all wait in the queue.
        let held: Vec<_> = (0..READER_THREADS).map(|_| hold_a_thread(&pool)).collect();
        let before = pool.counters().batches.load(Ordering::Relaxed);
        let answers: Vec<_> = (0..32).map(|_| pool.submit(count).unwrap()).collect();
        for (release, _) in &held {
            release.send(()).unwrap();
        }
        for (_, answer) in held {
            answer.await.unwrap().unwrap();
        }
        for answer in answers {
            assert_eq!(answer.await.unwrap().unwrap(), 0);
        }
        let batches = pool.counters().batches.load(Ordering::Relaxed) - before;
        // All 32 were queued before any thread came back for more, and the first thread to
        // take the receiver drains the queue (32 < MAX_BATCH): one batch.
        assert_eq!(batches, 1, "32 queued reads took {batches} batches");
        assert_eq!(
            pool.counters().submitted.load(Ordering::Relaxed),
            32 + READER_THREADS as u64
        );
    }

    #[tokio::test]
    async fn an_error_or_a_panic_answers_only_its_own_read() {
        let (_dir, _writer, pool) = pool();
        let held: Vec<_> = (0..READER_THREADS).map(|_| hold_a_thread(&pool)).collect();
        // Queued together, so they share one batch (and one transaction).
        let before = pool.submit(count).unwrap();
        let failing = pool
            .submit(|_| Err::<i64, _>(AgentError::invalid_input("n", "refused")))
            .unwrap();
        let panicking = pool
            .submit(|_| -> AgentResult<i64> { panic!("bug in a read") })
            .unwrap();
        let broken = pool
            .submit(|conn| {
                // Ends the batch's transaction behind the pool's back, then fails.
                conn.execute_batch("ROLLBACK")
                    .map_err(AgentError::storage)?;
                Err::<i64, _>(AgentError::invalid_input("n", "ended the transaction"))
            })
            .unwrap();
        let after = pool
            .submit(|conn| {
                // The batch's transaction was begun again for the reads after `broken`.
                assert!(!conn.is_autocommit());
                count(conn)
            })
            .unwrap();
        for (release, _) in &held {
            release.send(()).unwrap();
        }
        assert_eq!(before.await.unwrap().unwrap(), 0);
        assert!(matches!(
            failing.await.unwrap(),
            Err(AgentError::InvalidInput { .. })
        ));
        let err = panicking.await.unwrap().unwrap_err();
        assert!(matches!(err, AgentError::Internal { .. }), "{err:?}");
        assert!(matches!(
            broken.await.unwrap(),
            Err(AgentError::InvalidInput { .. })
        ));
        assert_eq!(after.await.unwrap().unwrap(), 0);
        // The threads live on.
        for _ in 0..4 {
            assert_eq!(pool.run(count).await.unwrap(), 0);
        }
    }

    #[tokio::test]
    async fn a_read_sees_every_write_committed_before_it_was_sent() {
        let (_dir, writer, pool) = pool();
        for n in 1..=3 {
            writer.execute("INSERT INTO t VALUES (?1)", [n]).unwrap();
            assert_eq!(pool.run(count).await.unwrap(), n);
        }
    }

    #[tokio::test]
    async fn a_transaction_left_open_is_rolled_back_before_the_next_batch() {
        let (_dir, writer, pool) = pool();
        // Leaves a transaction (and its snapshot) open on whichever thread runs it.
        let left_open = |conn: &Connection| {
            conn.execute_batch("ROLLBACK; BEGIN")
                .map_err(AgentError::storage)?;
            count(conn)
        };
        for _ in 0..READER_THREADS * 2 {
            assert_eq!(pool.run(left_open).await.unwrap(), 0);
        }
        writer.execute("INSERT INTO t VALUES (1)", []).unwrap();
        // Every thread starts its next batch on a fresh snapshot.
        for _ in 0..READER_THREADS * 4 {
            assert_eq!(pool.run(count).await.unwrap(), 1);
        }
    }

    #[tokio::test]
    async fn dropping_the_pool_serves_what_was_sent_and_joins_the_threads() {
        let (_dir, _writer, pool) = pool();
        let answers: Vec<_> = (0..8).map(|_| pool.submit(count).unwrap()).collect();
        let counters = pool.counters.clone();
        drop(pool);
        // Each thread held a handle to the counters until it ended; the drop joined them.
        assert_eq!(Arc::strong_count(&counters), 1);
        for answer in answers {
            assert_eq!(answer.await.unwrap().unwrap(), 0);
        }
    }

    #[tokio::test]
    async fn a_read_with_no_thread_left_is_a_storage_error() {
        let (_dir, _writer, mut pool) = pool();
        // As after the threads ended: the channel is closed.
        pool.threads.close();
        let err = pool.run(count).await.unwrap_err();
        assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");
    }
}
