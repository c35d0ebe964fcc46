//! [`Workers`]: OS threads that take their jobs from one channel, what the writer thread and
//! the reader threads are built on. Dropping it closes the channel; the threads finish the
//! jobs already sent, close their connections and are joined.

use std::sync::mpsc;
use std::thread::JoinHandle;

use keel_core::{AgentError, AgentResult};
use rusqlite::Connection;

/// What a job runs: a closure called once on a worker thread's connection, whose result goes
/// back to the caller.
pub(crate) trait ConnWork<T>:
    FnOnce(&Connection) -> AgentResult<T> + Send + 'static
{
}

impl<T, F> ConnWork<T> for F where F: FnOnce(&Connection) -> AgentResult<T> + Send + 'static {}

/// The sending end of a job channel and the threads that serve it.
pub(crate) struct Workers<J> {
    jobs: Option<mpsc::Sender<J>>,
    threads: Vec<JoinHandle<()>>,
}

impl<J> Workers<J> {
    /// No threads yet, jobs going to `jobs`.
    pub(crate) fn new(jobs: mpsc::Sender<J>) -> Self {
        Self {
            jobs: Some(jobs),
            threads: Vec::new(),
        }
    }

    /// Start a thread named `name` running `serve`; `what` names it in the error when the
    /// system will not start one. On an error, dropping `self` stops and joins the threads
    /// already started.
    pub(crate) fn spawn(
        &mut self,
        name: String,
        what: &str,
        serve: impl FnOnce() + Send + 'static,
    ) -> AgentResult<()> {
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(serve)
            .map_err(|e| AgentError::storage_source("sqlite", format!("starting {what}"), e))?;
        self.threads.push(thread);
        Ok(())
    }

    /// Close the channel: the threads end once the jobs already sent are done, and every
    /// later [`send`](Self::send) fails.
    pub(crate) fn close(&mut self) {
        drop(self.jobs.take());
    }

    /// Queue `job` for the threads; `false` when they have stopped, and the job was not sent.
    pub(crate) fn send(&self, job: J) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok())
    }
}

impl<J> Drop for Workers<J> {
    fn drop(&mut self) {
        self.close();
        let current = std::thread::current().id();
        for thread in self.threads.drain(..) {
            // Join so that dropping the store really closes the database (a reopen right
            // after sees no second writer). Never join from one of these threads itself (a
            // job's closure could hold the last handle to the store).
            if thread.thread().id() != current {
                let _ = thread.join();
            }
        }
    }
}

/// Wait for the first job on `jobs`, then take what else is already queued, up to `max` in
/// all: one batch. `None` once the channel is closed and empty.
pub(crate) fn next_batch<J>(jobs: &mpsc::Receiver<J>, max: usize) -> Option<Vec<J>> {
    let first = jobs.recv().ok()?;
    let mut batch = vec![first];
    while batch.len() < max {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    Some(batch)
}
