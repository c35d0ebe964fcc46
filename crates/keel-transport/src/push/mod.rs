//! Push notifications: the task push notification configs (A2A's four config operations and
//! `SendMessage`'s `taskPushNotificationConfig`), and the deliverer that POSTs a task's status
//! and artifact updates to each config's webhook.
//!
//! By concern: `configs` (the four config operations and where configs are stored), `delivery`
//! (the watchers that POST a task's updates) and `guard` (the SSRF guard); the config itself is
//! [`PushConfig`](crate::push_config::PushConfig).
//!
//! # Where configs live, and why the engine's tenant values
//!
//! Configs, delivery cursors and the delivery log are stored in the engine's
//! [`TenantValues`] (the runtime's memory service): the one tenant-namespaced key-value store
//! that every runtime
//! offers (memory, SQLite, Redis, a user's own), so configs are tenant-scoped by construction
//! (a tenant's key never reaches another tenant's namespace), shared by every process on one
//! store, and survive a restart with the store — without adding a push-specific trait to
//! every backend. It has no listing, hence an index key per task. Keys, in the
//! tenant's namespace:
//!
//! | key | value |
//! |---|---|
//! | `keel:push:{task_id}:{config_id}` | the config (Keel's JSON of [`PushConfig`]) |
//! | `keel:push:{task_id}` | the index: the task's config ids |
//! | `keel:push-cursor:{task_id}` | how many of the task's log events have been delivered |
//! | `keel:push-log:{task_id}` | the delivery log: the last [`DELIVERY_LOG_LIMIT`] attempts' outcomes |
//! | `keel:push-claim:{task_id}:{config_id}:{index}` | who delivers log event `index` to the config, then that it was delivered |
//!
//! and, in the deliverer's own namespace ([`deliverer_context`]), `keel:push:active`: the
//! tenants and tasks with configs whose deliveries are not finished. A server resumes them
//! when it starts, so deliveries pending when a process stopped resume from the persisted
//! cursor (at least once: an event delivered just before a crash may be delivered again).
//! Read-modify-write of the index, the log and the active list is serialized within a
//! process; two processes creating configs for the same task at the same instant can lose
//! an index entry (the store has no compare-and-set).
//!
//! # Delivery
//!
//! One watcher per task follows its durable event log (the executor's update signal, or
//! [`POLL_INTERVAL`] for runs on other processes) and POSTs every status and artifact update,
//! as a v1.0 `StreamResponse`, to each config's URL with `X-A2A-Notification-Token: <token>`
//! and `Authorization: <scheme> <credentials>`. Failures (connection errors, 408, 429, 5xx) are
//! retried with exponential backoff and full jitter; other answers are final. The cursor
//! advances once an event has been offered to every config. The watcher ends once the task
//! is terminal and delivered, or has no configs left.
//!
//! # Once across processes
//!
//! Every process on a shared store may watch the same task (each one that created a config
//! for it, and each that resumed it at start). Each (config, event) delivery is claimed first
//! with [`TenantValues::claim`] (one atomic step on the store: `SET NX` on Redis):
//! the winner delivers and then marks the claim done (kept for a day); a watcher that finds
//! it done skips the event, and one that finds it held by another process waits, so each
//! config still receives its events in order. A claim lapses after the longest a delivery
//! with all its retries can take, so the events of a process that died mid-delivery are
//! delivered by another: once in the normal case, at least once across a crash.
//!
//! # SSRF guard
//!
//! A webhook URL must be `http` or `https`. When the operator gives an allow list of push
//! targets ([`crate::A2aServer::allow_push_targets`]: URL prefixes, host names, IP networks),
//! only the targets it names are accepted, private ones included. Without a list, unless the
//! operator allows private targets ([`crate::A2aServer::allow_private_push_targets`]), every
//! address its host resolves to must be public: loopback, private, link-local, unique-local, shared (CGNAT), unspecified,
//! broadcast and multicast addresses are refused — when the config is created and again at
//! each delivery, where the connection is pinned to the checked address (no DNS rebinding)
//! and redirects are not followed.

mod configs;
mod delivery;
mod guard;

pub use guard::PushTarget;
pub(crate) use guard::TargetPolicy;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use keel_agent::reads::{Reads, TenantValues};
use keel_agent::AgentExecutor;
use keel_core::{AgentError, AgentResult, TaskId};
use keel_runtime::AuthContext;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The header that carries a config's token to its webhook.
pub const NOTIFICATION_TOKEN_HEADER: &str = "X-A2A-Notification-Token";

/// How many outcomes the delivery log keeps per task.
pub const DELIVERY_LOG_LIMIT: usize = 500;

/// How failed deliveries are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Attempts per event and config, the first included.
    pub max_attempts: u32,
    /// The backoff before the second attempt; doubled for each further one.
    pub base_delay: Duration,
    /// The longest backoff.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The waits between the attempts of one delivery: exponential from `base_delay`, capped
    /// at `max_delay`, half of each random (never hammers, never waits for nothing).
    fn backoff(&self) -> ExponentialBackoff {
        ExponentialBuilder::default()
            .with_min_delay(self.base_delay / 2)
            .with_max_delay(self.max_delay / 2)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(
                usize::try_from(self.max_attempts.saturating_sub(1)).unwrap_or(usize::MAX),
            )
            .build()
    }
}

/// The tenant under which the deliverer keeps its list of active tasks.
pub(crate) fn deliverer_context() -> AuthContext {
    AuthContext::new("keel.transport", "push-deliverer")
}

const ACTIVE_KEY: &str = "keel:push:active";

fn config_key(task_id: &TaskId, config_id: &str) -> String {
    format!("keel:push:{task_id}:{config_id}")
}
fn index_key(task_id: &TaskId) -> String {
    format!("keel:push:{task_id}")
}
fn cursor_key(task_id: &TaskId) -> String {
    format!("keel:push-cursor:{task_id}")
}
fn log_key(task_id: &TaskId) -> String {
    format!("keel:push-log:{task_id}")
}
fn claim_key(task_id: &TaskId, config_id: &str, index: usize) -> String {
    format!("keel:push-claim:{task_id}:{config_id}:{index}")
}

/// The timeout of one POST to a webhook.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// An active delivery: a tenant's task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Active {
    auth: AuthContext,
    task_id: TaskId,
}

/// The push notification configs and their deliverer, over one executor.
#[derive(Clone)]
pub(crate) struct Push {
    inner: Arc<Inner>,
}

struct Inner {
    /// For its update signal.
    executor: AgentExecutor,
    reads: Reads,
    targets: TargetPolicy,
    retry: RetryPolicy,
    http: reqwest::Client,
    /// The tasks a watcher in this process follows.
    watching: Mutex<HashSet<Active>>,
    /// This deliverer's id in delivery claims (random per process).
    owner: String,
    /// Serializes read-modify-write of index, log and active keys in this process.
    writes: tokio::sync::Mutex<()>,
    /// Flips to true when the server stops: watchers end (their cursors stay where they are).
    stopped: watch::Receiver<bool>,
}

impl Push {
    pub(crate) fn new(
        executor: AgentExecutor,
        targets: TargetPolicy,
        retry: RetryPolicy,
        stopped: watch::Receiver<bool>,
    ) -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(DELIVERY_TIMEOUT)
            .build()
            .unwrap_or_default();
        Self {
            inner: Arc::new(Inner {
                reads: executor.reads(),
                executor,
                targets,
                retry,
                http,
                watching: Mutex::new(HashSet::new()),
                owner: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
                writes: tokio::sync::Mutex::new(()),
                stopped,
            }),
        }
    }

    fn values(&self) -> TenantValues {
        self.inner.reads.values()
    }

    async fn active(&self) -> AgentResult<Vec<Active>> {
        Ok(self
            .values()
            .load(&deliverer_context(), ACTIVE_KEY)
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default())
    }

    async fn save_active(&self, active: &[Active]) -> AgentResult<()> {
        let value = serde_json::to_value(active).map_err(AgentError::internal)?;
        self.values()
            .save(&deliverer_context(), ACTIVE_KEY, value)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_is_capped() {
        let retry = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
        };
        for _ in 0..50 {
            let waits: Vec<Duration> = retry.backoff().collect();
            assert_eq!(
                waits.len(),
                9,
                "one wait between each two of the 10 attempts"
            );
            assert!(
                waits[0] >= Duration::from_millis(50) && waits[0] <= Duration::from_millis(100)
            );
            assert!(
                waits[2] >= Duration::from_millis(200) && waits[2] <= Duration::from_millis(400)
            );
            assert!(waits.iter().all(|w| *w <= Duration::from_millis(1000)));
            assert!(waits[8] >= Duration::from_millis(500), "capped, not shrunk");
        }
    }
}
