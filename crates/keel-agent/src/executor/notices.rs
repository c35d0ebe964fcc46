//! Who hears about a task in this process: the executor's event sinks, the
//! [`AgentExecutor::task_updates`](super::AgentExecutor::task_updates) signal, and the callers
//! waiting for a particular task to rest. A part of the engine with its own state: the run
//! loop and the thread driver tell it what changed; the public front hands out its signals.

use std::sync::{Arc, RwLock};

use dashmap::DashMap;
use keel_core::{Task, TaskId};
use keel_events::EventSink;
use keel_runtime::AuthContext;
use tokio::sync::watch;

use super::state::TaskKey;

/// What a task's waiters are told at each save: the snapshot this process has just written
/// (without its history), or `None` when the change was heard from the store (another
/// process wrote it), which the waiter then reads.
pub(super) type Saved = Option<Arc<Task>>;

type Waiters = DashMap<TaskKey, watch::Sender<Saved>, foldhash::fast::RandomState>;

pub(super) struct Notices {
    /// Bumped whenever this process persists a task status or a message of a task, to wake
    /// local watchers of a task's events (streams, push delivery).
    changed: watch::Sender<u64>,
    /// The callers waiting for a task to rest, by task: saving a task record (its status or
    /// metadata) in this process wakes that task's waiters only. One signal for every task
    /// woke each blocked caller at every other task's save, and each then read its own task
    /// again: with N blocking senders, N reads per save. Kept apart from `changed` so that a
    /// blocking send is not woken at every persisted message either.
    resting: Waiters,
    /// Where every run's events go (besides its own recorder).
    sinks: RwLock<Vec<Arc<dyn EventSink>>>,
}

impl Notices {
    pub(super) fn new() -> Self {
        Self {
            changed: watch::channel(0).0,
            resting: DashMap::default(),
            sinks: RwLock::new(Vec::new()),
        }
    }

    /// Tell [`AgentExecutor::task_updates`](super::AgentExecutor::task_updates) subscribers
    /// that a task changed. Nobody listens most of the time, and a watch wakes its (absent)
    /// waiters at a cost even then: twice a step. A subscriber arriving later sees only later
    /// changes either way.
    pub(super) fn task_changed(&self) {
        if self.changed.receiver_count() > 0 {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wake the task's local waiters after a change they must read from the store (see
    /// `resting`), and event watchers.
    pub(super) fn task_saved(&self, auth: &AuthContext, task_id: &TaskId) {
        if let Some(waiters) = self.waiters(auth, task_id) {
            waiters.send_replace(None);
        }
        self.task_changed();
    }

    /// Wake the task's local waiters after this process saved `task`, handing them the
    /// snapshot it wrote: a blocked caller then needs no read of what was just written.
    pub(super) fn task_saved_as(&self, auth: &AuthContext, task: &Task) {
        if let Some(waiters) = self.waiters(auth, &task.id) {
            waiters.send_replace(Some(Arc::new(task.clone_without_history())));
        }
        self.task_changed();
    }

    /// Wake the task's local waiters without telling them anything new: they keep the last
    /// snapshot this process wrote, which is still the task as far as it knows (its run
    /// ended here, or the store announced a write this process's own run made).
    pub(super) fn task_touched(&self, auth: &AuthContext, task_id: &TaskId) {
        if let Some(waiters) = self.waiters(auth, task_id) {
            waiters.send_modify(|_| {});
        }
        self.task_changed();
    }

    /// The signal of `task_id`'s waiters, when it has any (most saves have none: the map is
    /// looked into only when it is not empty).
    fn waiters(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> Option<dashmap::mapref::one::Ref<'_, TaskKey, watch::Sender<Saved>>> {
        if self.resting.is_empty() {
            return None;
        }
        self.resting.get(&(auth.namespace(), task_id.clone()))
    }

    /// The signal [`Self::task_changed`] bumps.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A place among `task_id`'s waiters, taken before the change it waits for is started
    /// (e.g. the task queued), so that no wake-up can come before it.
    pub(super) fn rest_waiter(&self, auth: &AuthContext, task_id: &TaskId) -> RestWaiter<'_> {
        RestWaiter::new(&self.resting, (auth.namespace(), task_id.clone()))
    }

    /// The event sinks now, for a run to keep.
    pub(super) fn sinks(&self) -> Vec<Arc<dyn EventSink>> {
        self.sinks.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Send every later run's events to `sink` too.
    pub(super) fn add_sink(&self, sink: Arc<dyn EventSink>) {
        self.sinks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(sink);
    }
}

/// One caller's place among a task's waiters (`Notices::resting`); the task's entry goes when
/// its last waiter does, also when the waiting future is dropped (a client that went away).
pub(super) struct RestWaiter<'a> {
    waiters: &'a Waiters,
    key: TaskKey,
    pub(super) receiver: watch::Receiver<Saved>,
}

impl<'a> RestWaiter<'a> {
    fn new(waiters: &'a Waiters, key: TaskKey) -> Self {
        let receiver = waiters
            .entry(key.clone())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        Self {
            waiters,
            key,
            receiver,
        }
    }
}

impl Drop for RestWaiter<'_> {
    fn drop(&mut self) {
        // This waiter's own receiver still counts here.
        self.waiters
            .remove_if(&self.key, |_, sender| sender.receiver_count() <= 1);
    }
}
