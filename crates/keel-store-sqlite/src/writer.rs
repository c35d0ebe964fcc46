//! The writer thread: the one connection that writes, and group commit.
//!
//! Every write is a job sent over a channel to a dedicated OS thread that owns the write
//! connection. The thread takes the first waiting job, drains whatever else is already queued
//! (up to [`MAX_BATCH`]), and runs the whole batch in ONE `IMMEDIATE` transaction, each job
//! inside its own `SAVEPOINT` so a job that fails rolls back only its own changes. It then
//! commits once — one fsync under `synchronous=FULL` for the batch — and only THEN answers
//! every job. So:
//!
//! - no caller is acknowledged before its data is durable;
//! - jobs run in the order they were sent, and each sees the effects of the jobs before it
//!   (which is what makes lease acquisition and fencing atomic);
//! - under load the cost of an fsync is shared by every write that arrived while the previous
//!   commit was in flight, and with no load a write commits at once (there is no waiting to
//!   fill a batch);
//! - if the commit fails, every job of the batch gets the error and none of it is kept.
//!
//! SQLite work is blocking; a dedicated thread keeps it off the async runtime's workers, and a
//! single writer is what SQLite wants anyway (it allows one writer at a time).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use keel_core::{AgentError, AgentResult};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::workers::{self, ConnWork, Workers};

/// The most jobs one transaction takes. Bounds how long a batch holds the write lock and how
/// much work one failed commit can throw away.
pub(crate) const MAX_BATCH: usize = 256;

/// Counters the writer keeps; see [`crate::StoreStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) failed_batches: AtomicU64,
}

/// One unit of work for the writer, type-erased so jobs with different results share a
/// channel.
trait WriteJob: Send {
    /// Run inside the batch's transaction; `true` when the job succeeded (its savepoint is
    /// released), `false` when it failed (its savepoint is rolled back).
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answer the caller, once the batch's fate (`outcome` of the commit) is known.
    fn finish(self: Box<Self>, outcome: Result<(), AgentError>);
}

/// A job with its closure, its result once run, and where to send the answer.
struct Pending<T, F> {
    work: Option<F>,
    result: Option<AgentResult<T>>,
    reply: oneshot::Sender<AgentResult<T>>,
}

impl<T, F> WriteJob for Pending<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> AgentResult<T> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let result = work(conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, outcome: Result<(), AgentError>) {
        let answer = match (self.result, outcome) {
            // A job's own error is the most precise answer, whatever happened to the batch.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(e)) => Err(e),
            (None, Ok(())) => Err(AgentError::internal(
                "a write panicked in the SQLite writer thread; its changes were rolled back",
            )),
        };
        // The caller may have stopped waiting (its future was dropped); the write stands.
        let _ = self.reply.send(answer);
    }
}

type Job = Box<dyn WriteJob>;

/// The handle to the writer thread. Dropping it closes the channel; the thread finishes the
/// jobs already sent, closes the connection and is joined.
pub(crate) struct Writer {
    thread: Workers<Job>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Start the writer thread on a configured, migrated connection.
    pub(crate) fn start(conn: Connection, location: &str) -> AgentResult<Self> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        let mut thread = Workers::new(jobs);
        thread.spawn(
            "keel-sqlite-writer".into(),
            &format!("the writer thread for {location}"),
            move || run(conn, receiver, &thread_counters),
        )?;
        Ok(Self { thread, counters })
    }

    /// The writer's counters.
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Run `work` in the writer's transaction and answer once it is committed (or failed).
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl ConnWork<T>) -> AgentResult<T> {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(Pending {
            work: Some(work),
            result: None,
            reply,
        });
        // Counted before sending, so `finished` never runs ahead of `submitted`.
        self.counters.submitted.fetch_add(1, Ordering::Relaxed);
        if !self.thread.send(job) {
            return Err(stopped());
        }
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> AgentError {
    AgentError::storage(
        "the SQLite writer thread has stopped, so the write was not done; see earlier errors \
         in the log",
    )
}

/// The writer thread's loop: one batch per turn until every sender is gone.
fn run(conn: Connection, jobs: mpsc::Receiver<Job>, counters: &Counters) {
    while let Some(batch) = workers::next_batch(&jobs, MAX_BATCH) {
        commit_batch(&conn, batch, counters);
    }
    tracing::debug!("SQLite writer thread stopping");
}

/// Run `batch` in one transaction, commit once, then answer every job.
fn commit_batch(conn: &Connection, batch: Vec<Job>, counters: &Counters) {
    let size = batch.len() as u64;
    if !conn.is_autocommit() {
        // Every path below ends its transaction; this only guards against a bug leaving one
        // open, which would otherwise fail every later batch at BEGIN.
        tracing::warn!("SQLite writer found a transaction left open; rolling it back");
        rollback(conn);
    }
    let outcome = match conn.execute_batch("BEGIN IMMEDIATE") {
        Err(e) => {
            let error = AgentError::storage_source(
                "sqlite",
                "starting a write transaction (is another process holding the database's \
                 write lock?)",
                e,
            );
            counters.failed_batches.fetch_add(1, Ordering::Relaxed);
            counters.finished.fetch_add(size, Ordering::Relaxed);
            metrics::counter!(crate::WRITES_METRIC).increment(size);
            finish_all(batch, Err(error));
            return;
        }
        Ok(()) => run_jobs(conn, batch),
    };
    let (done, aborted) = outcome;
    let outcome = match aborted {
        Some(error) => {
            rollback(conn);
            Err(error)
        }
        None => match conn.execute_batch("COMMIT") {
            Ok(()) => {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                rollback(conn);
                Err(AgentError::storage_source(
                    "sqlite",
                    format!("committing a batch of {size} writes, so none of them was kept"),
                    e,
                ))
            }
        },
    };
    if let Err(error) = &outcome {
        tracing::error!(%error, size, "SQLite write batch failed");
        counters.failed_batches.fetch_add(1, Ordering::Relaxed);
    } else {
        tracing::trace!(size, "SQLite write batch committed");
    }
    // Counted before answering, so a caller that sees its answer also sees it counted.
    counters.finished.fetch_add(size, Ordering::Relaxed);
    // Once a batch, not once a write: with no recorder installed these are no-ops.
    metrics::counter!(crate::WRITES_METRIC).increment(size);
    if outcome.is_ok() {
        metrics::counter!(crate::COMMITS_METRIC).increment(1);
    }
    finish_all(done, outcome);
}

/// Run each job in its own savepoint. Returns the jobs (to be answered after the commit) and,
/// when the transaction itself broke, the error that aborts the whole batch.
fn run_jobs(conn: &Connection, batch: Vec<Job>) -> (Vec<Job>, Option<AgentError>) {
    let mut done = Vec::with_capacity(batch.len());
    let mut aborted: Option<AgentError> = None;
    for mut job in batch {
        if aborted.is_some() {
            // The transaction is gone; later jobs are not run and share the batch's error.
            done.push(job);
            continue;
        }
        // Cached like every statement: `execute_batch` compiles its SQL at every call.
        let opened = conn
            .prepare_cached("SAVEPOINT keel_job")
            .and_then(|mut savepoint| savepoint.execute([]));
        if let Err(e) = opened {
            aborted = Some(AgentError::storage_source(
                "sqlite",
                "opening a savepoint",
                e,
            ));
            done.push(job);
            continue;
        }
        // A panic in a job must not take the writer thread (and every later write) down.
        let ok = catch_unwind(AssertUnwindSafe(|| job.run(conn))).unwrap_or(false);
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back on its own (disk full, I/O error):
            // the jobs before this one are lost too, so the batch fails as a whole.
            aborted = Some(AgentError::storage(
                "SQLite rolled back the write transaction (disk full or I/O error?); the \
                 batch's writes were not kept",
            ));
        } else {
            let closed = if ok {
                conn.prepare_cached("RELEASE keel_job")
                    .and_then(|mut release| release.execute([]))
            } else {
                conn.execute_batch("ROLLBACK TO keel_job; RELEASE keel_job")
                    .map(|()| 0)
            };
            if let Err(e) = closed {
                aborted = Some(AgentError::storage_source(
                    "sqlite",
                    "closing a savepoint",
                    e,
                ));
            }
        }
        done.push(job);
    }
    (done, aborted)
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::error!(error = %e, "SQLite rollback failed");
        }
    }
}

fn finish_all(jobs: Vec<Job>, outcome: Result<(), AgentError>) {
    for job in jobs {
        job.finish(outcome.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> Writer {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER NOT NULL)")
            .unwrap();
        Writer::start(conn, ":memory:").unwrap()
    }

    fn count(conn: &Connection) -> AgentResult<i64> {
        conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .map_err(AgentError::storage)
    }

    #[tokio::test]
    async fn a_failing_job_rolls_back_only_its_own_changes() {
        let writer = writer();
        let failed = writer
            .run(|conn| {
                conn.execute("INSERT INTO t VALUES (1)", [])
                    .map_err(AgentError::storage)?;
                Err::<(), _>(AgentError::invalid_input("n", "refused after writing"))
            })
            .await;
        assert!(matches!(failed, Err(AgentError::InvalidInput { .. })));
        writer
            .run(|conn| {
                conn.execute("INSERT INTO t VALUES (2)", [])
                    .map_err(AgentError::storage)
            })
            .await
            .unwrap();
        assert_eq!(writer.run(count).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_writer_lives_on() {
        let writer = writer();
        let err = writer
            .run(|_| -> AgentResult<()> { panic!("bug in a job") })
            .await
            .unwrap_err();
        assert!(matches!(err, AgentError::Internal { .. }), "{err:?}");
        assert_eq!(writer.run(count).await.unwrap(), 0);
    }
}
