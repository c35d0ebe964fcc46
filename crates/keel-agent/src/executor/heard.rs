//! What the executor hears from a store that announces every process's commits
//! ([`Runtime::change_feed`](keel_runtime::Runtime::change_feed)): another process's task
//! events wake this process's watchers (streams, subscriptions, push follow-ups, blocked
//! senders) at once, and a cancel request another process stored stops the run here at once,
//! instead of at the next poll. The polls stay: an announcement is a hint, never the record.

use std::sync::Arc;

use futures::StreamExt;
use keel_runtime::{AuthContext, StoreChange};

use super::cancel::cancel_if_flagged;
use super::state::Inner;
use super::AgentExecutor;
use crate::thread_state::ThreadHost;

impl AgentExecutor {
    /// Follow the store's announcements until shutdown, when it makes them; a feed that
    /// cannot be set up is logged and the polls alone remain.
    pub(super) fn hear_store_changes(&self) {
        let Some(feed) = self.inner.runtime.change_feed() else {
            return;
        };
        let me = Arc::downgrade(&self.inner);
        let stop = self.inner.driver.shutting_down.clone();
        self.inner.driver.tracker.spawn(async move {
            let changes = match feed.follow().await {
                Ok(changes) => changes,
                Err(err) => {
                    if let Some(inner) = me.upgrade() {
                        inner.log(
                            keel_runtime::LogLevel::Warn,
                            &format!("cannot follow the store's changes, polling only: {err}"),
                        );
                    }
                    return;
                }
            };
            let changes = changes.take_until(stop.cancelled_owned());
            futures::pin_mut!(changes);
            while let Some(change) = changes.next().await {
                let Some(inner) = me.upgrade() else { return };
                inner.heard(change).await;
            }
        });
    }
}

impl Inner {
    async fn heard(&self, change: StoreChange) {
        match change {
            // This process's own save comes back too; its waiters were handed that snapshot
            // (or a later one) already, so it must not send them to read it back.
            StoreChange::TaskEvents {
                auth,
                task_id,
                own_write: true,
            } => self.notices.task_touched(&auth, &task_id),
            StoreChange::TaskEvents { auth, task_id, .. } => {
                self.notices.task_saved(&auth, &task_id)
            }
            StoreChange::Memory { auth, key } => self.cancel_flagged(Some((&auth, &key))).await,
            // Anything may have changed: wake every watcher, look at every run's flag.
            _ => {
                self.notices.task_changed();
                self.cancel_flagged(None).await;
            }
        }
    }

    /// Stop the runs of this process whose cancel request was stored: the run whose flag is
    /// `key` of `auth`'s tenant, or, with `None`, every run.
    async fn cancel_flagged(&self, flagged: Option<(&AuthContext, &str)>) {
        let runs: Vec<_> = self
            .driver
            .active
            .iter()
            .filter(|run| {
                flagged.is_none_or(|(auth, key)| {
                    run.key().0 == auth.namespace() && run.cancel_key == key
                })
            })
            .map(|run| (run.key().0.clone(), run.value().clone()))
            .collect();
        let memory = self.runtime.memory_service();
        for (namespace, run) in runs {
            if let Some(auth) = AuthContext::from_namespace(&namespace) {
                cancel_if_flagged(memory.as_ref(), &auth, &run).await;
            }
        }
    }
}
