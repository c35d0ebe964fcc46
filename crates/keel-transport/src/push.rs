//! Push notifications: the task push notification configs (A2A's four config operations and
//! `SendMessage`'s `taskPushNotificationConfig`), and the deliverer that POSTs a task's status
//! and artifact updates to each config's webhook.
//!
//! # Where configs live, and why the memory service
//!
//! Configs, delivery cursors and the delivery log are stored through the runtime's
//! [`MemoryService`]: it is the one tenant-namespaced key-value store that every runtime
//! offers (memory, SQLite, Redis, a user's own), so configs are tenant-scoped by construction
//! (a tenant's key never reaches another tenant's namespace), shared by every process on one
//! store, and survive a restart with the store — without adding a push-specific trait to
//! every backend. The memory service has no listing, hence an index key per task. Keys, in the
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
//! an index entry (the memory service has no compare-and-set).
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
//! with [`MemoryService::save_if_absent`] (one atomic step on the store: `SET NX` on Redis):
//! the winner delivers and then marks the claim done (kept for a day); a watcher that finds
//! it done skips the event, and one that finds it held by another process waits, so each
//! config still receives its events in order. A claim lapses after the longest a delivery
//! with all its retries can take, so the events of a process that died mid-delivery are
//! delivered by another: once in the normal case, at least once across a crash.
//!
//! # SSRF guard
//!
//! A webhook URL must be `http` or `https`, and unless the operator allows private targets
//! ([`crate::A2aServer::allow_private_push_targets`]), every address its host resolves to
//! must be public: loopback, private, link-local, unique-local, shared (CGNAT), unspecified,
//! broadcast and multicast addresses are refused — when the config is created and again at
//! each delivery, where the connection is pinned to the checked address (no DNS rebinding)
//! and redirects are not followed.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_agent::AgentExecutor;
use keel_core::{AgentError, AgentResult, TaskEvent, TaskId};
use keel_runtime::{AuthContext, MemoryService};
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::jsonrpc::{RpcError, INVALID_PARAMS, TASK_NOT_FOUND};
use crate::stream::{StreamEvent, POLL_INTERVAL};
use crate::wire;

/// The header that carries a config's token to its webhook.
pub const NOTIFICATION_TOKEN_HEADER: &str = "X-A2A-Notification-Token";

/// How many outcomes the delivery log keeps per task.
pub const DELIVERY_LOG_LIMIT: usize = 500;

/// A task push notification config, in Keel's stored form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushConfig {
    /// Unique within the task.
    pub id: String,
    /// The task whose updates are pushed.
    pub task_id: TaskId,
    /// The webhook.
    pub url: String,
    /// Sent as [`NOTIFICATION_TOKEN_HEADER`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Sent as `Authorization: <scheme> <credentials>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<PushAuthentication>,
}

/// How the agent authenticates to a webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushAuthentication {
    /// An HTTP authentication scheme (`Bearer`, `Basic`, ...).
    pub scheme: String,
    /// The credentials for that scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

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
    /// The wait before attempt `attempt + 1` (`attempt` ≥ 1): full jitter over the
    /// exponential backoff.
    fn backoff(&self, attempt: u32) -> Duration {
        let exponential = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.max_delay);
        let millis = u64::try_from(exponential.as_millis()).unwrap_or(u64::MAX);
        // Half fixed, half random: never hammers, never waits for nothing.
        Duration::from_millis(millis / 2 + fastrand::u64(0..=millis / 2))
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

/// How long the record that an event was delivered to a config is kept: any watcher still
/// behind it (another process, a resumed server) has long caught up by then.
const DONE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The timeout of one POST to a webhook.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Who delivers one event to one config.
enum Claim {
    /// This process: deliver it.
    Mine,
    /// Someone delivered it already (or gave up on it): skip it.
    Done,
    /// Another process is delivering it now.
    Held,
}

/// An active delivery: a tenant's task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Active {
    auth: AuthContext,
    task_id: TaskId,
}

fn rpc(err: AgentError) -> RpcError {
    RpcError::from_agent_error(&err)
}

fn config_not_found(task_id: &TaskId, config_id: &str) -> RpcError {
    RpcError::new(
        TASK_NOT_FOUND,
        format!("task {task_id} has no push notification config `{config_id}`"),
    )
    .with("taskId", task_id.as_str())
    .with("configId", config_id)
}

/// The push notification configs and their deliverer, over one executor.
#[derive(Clone)]
pub(crate) struct Push {
    inner: Arc<Inner>,
}

struct Inner {
    executor: AgentExecutor,
    allow_private: bool,
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
        allow_private: bool,
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
                executor,
                allow_private,
                retry,
                http,
                watching: Mutex::new(HashSet::new()),
                owner: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
                writes: tokio::sync::Mutex::new(()),
                stopped,
            }),
        }
    }

    fn memory(&self) -> Arc<dyn MemoryService> {
        self.inner.executor.runtime().memory_service()
    }

    async fn require_task(&self, auth: &AuthContext, task_id: &TaskId) -> Result<(), RpcError> {
        let task = self
            .inner
            .executor
            .runtime()
            .task_manager()
            .get_task(auth, task_id)
            .await
            .map_err(rpc)?;
        match task {
            Some(_) => Ok(()),
            None => Err(rpc(AgentError::TaskNotFound {
                task_id: task_id.clone(),
            })),
        }
    }

    /// Check a webhook URL before it is stored: the SSRF guard.
    pub(crate) async fn check_url(&self, url: &str) -> Result<(), RpcError> {
        check_target(url, self.inner.allow_private)
            .await
            .map(|_| ())
            .map_err(|reason| {
                RpcError::new(INVALID_PARAMS, format!("invalid url: {reason}"))
                    .with("field", "url")
                    .with("description", reason)
            })
    }

    /// `CreateTaskPushNotificationConfig`: store the config (replacing one with the same id)
    /// and start delivering the task's updates from `from` (a log index; `None`: from now).
    pub(crate) async fn create(
        &self,
        auth: &AuthContext,
        mut config: PushConfig,
        from: Option<usize>,
    ) -> Result<PushConfig, RpcError> {
        self.require_task(auth, &config.task_id).await?;
        self.check_url(&config.url).await?;
        if config.id.is_empty() {
            config.id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        }
        let memory = self.memory();
        let task_id = config.task_id.clone();
        {
            let _writes = self.inner.writes.lock().await;
            let value = serde_json::to_value(&config).map_err(|e| rpc(AgentError::internal(e)))?;
            memory
                .save_serialized(auth, &config_key(&task_id, &config.id), value)
                .await
                .map_err(rpc)?;
            let mut index = self.index(auth, &task_id).await.map_err(rpc)?;
            if !index.contains(&config.id) {
                index.push(config.id.clone());
            }
            memory
                .save_serialized(auth, &index_key(&task_id), json!(index))
                .await
                .map_err(rpc)?;
            // Deliveries start now (or at `from`) unless a watcher already has a cursor.
            if memory
                .load_serialized(auth, &cursor_key(&task_id))
                .await
                .map_err(rpc)?
                .is_none()
            {
                let start = match from {
                    Some(from) => from,
                    None => self
                        .inner
                        .executor
                        .runtime()
                        .task_manager()
                        .get_task_events(auth, &task_id)
                        .await
                        .map_err(rpc)?
                        .len(),
                };
                memory
                    .save_serialized(auth, &cursor_key(&task_id), json!(start))
                    .await
                    .map_err(rpc)?;
            }
            let mut active = self.active().await.map_err(rpc)?;
            let entry = Active {
                auth: auth.clone(),
                task_id: task_id.clone(),
            };
            if !active.contains(&entry) {
                active.push(entry);
                self.save_active(&active).await.map_err(rpc)?;
            }
        }
        tracing::info!(task_id = %task_id, config_id = %config.id, "push notification config created");
        self.watch(auth.clone(), task_id);
        Ok(config)
    }

    /// `GetTaskPushNotificationConfig`.
    pub(crate) async fn get(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
    ) -> Result<PushConfig, RpcError> {
        self.require_task(auth, task_id).await?;
        self.load_config(auth, task_id, config_id)
            .await
            .map_err(rpc)?
            .ok_or_else(|| config_not_found(task_id, config_id))
    }

    /// `ListTaskPushNotificationConfigs`.
    pub(crate) async fn list(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> Result<Vec<PushConfig>, RpcError> {
        self.require_task(auth, task_id).await?;
        self.configs(auth, task_id).await.map_err(rpc)
    }

    /// `DeleteTaskPushNotificationConfig`.
    pub(crate) async fn delete(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
    ) -> Result<(), RpcError> {
        self.require_task(auth, task_id).await?;
        let _writes = self.inner.writes.lock().await;
        let memory = self.memory();
        let existed = memory
            .delete(auth, &config_key(task_id, config_id))
            .await
            .map_err(rpc)?;
        let mut index = self.index(auth, task_id).await.map_err(rpc)?;
        let listed = index.iter().any(|id| id == config_id);
        index.retain(|id| id != config_id);
        memory
            .save_serialized(auth, &index_key(task_id), json!(index))
            .await
            .map_err(rpc)?;
        if existed || listed {
            Ok(())
        } else {
            Err(config_not_found(task_id, config_id))
        }
    }

    async fn index(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Vec<String>> {
        Ok(self
            .memory()
            .load_serialized(auth, &index_key(task_id))
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default())
    }

    async fn load_config(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
    ) -> AgentResult<Option<PushConfig>> {
        Ok(self
            .memory()
            .load_serialized(auth, &config_key(task_id, config_id))
            .await?
            .and_then(|v| serde_json::from_value(v).ok()))
    }

    async fn configs(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Vec<PushConfig>> {
        let mut configs = Vec::new();
        for id in self.index(auth, task_id).await? {
            if let Some(config) = self.load_config(auth, task_id, &id).await? {
                configs.push(config);
            }
        }
        Ok(configs)
    }

    async fn active(&self) -> AgentResult<Vec<Active>> {
        Ok(self
            .memory()
            .load_serialized(&deliverer_context(), ACTIVE_KEY)
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default())
    }

    async fn save_active(&self, active: &[Active]) -> AgentResult<()> {
        let value = serde_json::to_value(active).map_err(AgentError::internal)?;
        self.memory()
            .save_serialized(&deliverer_context(), ACTIVE_KEY, value)
            .await
    }

    async fn finish(&self, entry: &Active) -> AgentResult<()> {
        let _writes = self.inner.writes.lock().await;
        let mut active = self.active().await?;
        active.retain(|a| a != entry);
        self.save_active(&active).await?;
        self.memory()
            .delete(&entry.auth, &cursor_key(&entry.task_id))
            .await?;
        Ok(())
    }

    /// Start a watcher for every delivery that a previous process (or this one) left
    /// unfinished. Needs a tokio runtime; without one, nothing resumes.
    pub(crate) fn resume(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let push = self.clone();
        tokio::spawn(async move {
            match push.active().await {
                Ok(active) => {
                    if !active.is_empty() {
                        tracing::info!(
                            count = active.len(),
                            "resuming pending push notification deliveries"
                        );
                    }
                    for entry in active {
                        push.watch(entry.auth, entry.task_id);
                    }
                }
                Err(err) => tracing::warn!(error = %err, "could not read pending push deliveries"),
            }
        });
    }

    /// Follow `task_id`'s log and deliver, unless a watcher in this process already does.
    fn watch(&self, auth: AuthContext, task_id: TaskId) {
        let entry = Active { auth, task_id };
        {
            let Ok(mut watching) = self.inner.watching.lock() else {
                return;
            };
            if !watching.insert(entry.clone()) {
                return;
            }
        }
        let push = self.clone();
        tokio::spawn(async move {
            let span = tracing::info_span!("a2a.push", task_id = %entry.task_id);
            let _ = tracing::Instrument::instrument(push.run_watcher(&entry), span).await;
            if let Ok(mut watching) = push.inner.watching.lock() {
                watching.remove(&entry);
            }
        });
    }

    fn is_stopped(&self) -> bool {
        *self.inner.stopped.borrow()
    }

    async fn run_watcher(&self, entry: &Active) {
        let mut updates = self.inner.executor.task_updates();
        let mut stopped = self.inner.stopped.clone();
        loop {
            if self.is_stopped() {
                return;
            }
            match self.deliver_pending(entry).await {
                Ok(Progress::Finished) => {
                    if let Err(err) = self.finish(entry).await {
                        tracing::warn!(error = %err, "could not mark push deliveries finished");
                    }
                    return;
                }
                Ok(Progress::Stopped) => return,
                Ok(Progress::Waiting) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "push delivery could not read the task; retrying")
                }
            }
            tokio::select! {
                () = changed(&mut updates) => {}
                () = changed(&mut stopped) => {}
                () = tokio::time::sleep(POLL_INTERVAL) => {}
            }
        }
    }

    /// Deliver every event after the cursor.
    async fn deliver_pending(&self, entry: &Active) -> AgentResult<Progress> {
        let Active { auth, task_id } = entry;
        let memory = self.memory();
        let events = match self
            .inner
            .executor
            .runtime()
            .task_manager()
            .get_task_events(auth, task_id)
            .await
        {
            Ok(events) => events,
            Err(AgentError::TaskNotFound { .. }) => return Ok(Progress::Finished),
            Err(err) => return Err(err),
        };
        let mut cursor: usize = memory
            .load_serialized(auth, &cursor_key(task_id))
            .await?
            .and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(events.len());
        let configs = self.configs(auth, task_id).await?;
        if configs.is_empty() {
            return Ok(Progress::Finished);
        }
        while cursor < events.len() {
            let index = cursor;
            if let Some(event) = stream_event(&events[index]) {
                let body = wire::encode_stream_event(&event);
                let kind = match event {
                    StreamEvent::ArtifactUpdate { .. } => "artifactUpdate",
                    _ => "statusUpdate",
                };
                for config in &configs {
                    match self.claim(auth, task_id, &config.id, index).await? {
                        Claim::Mine => {}
                        Claim::Done => continue,
                        // Another process is delivering it: wait for it to finish (or for
                        // its claim to lapse, should that process die) before going on, so
                        // that each config still receives the events in order.
                        Claim::Held => {
                            memory
                                .save_serialized(auth, &cursor_key(task_id), json!(cursor))
                                .await?;
                            return Ok(Progress::Waiting);
                        }
                    }
                    let Some(outcome) = self.deliver(config, &body).await else {
                        // Stopped mid-delivery: let the claim go, so another process (or the
                        // next server) delivers this event without waiting for it to lapse.
                        let _ = memory
                            .delete(auth, &claim_key(task_id, &config.id, index))
                            .await;
                        return Ok(Progress::Stopped);
                    };
                    self.log(auth, task_id, config, kind, index, outcome)
                        .await?;
                    memory
                        .save_serialized_with_ttl(
                            auth,
                            &claim_key(task_id, &config.id, index),
                            json!({"done": true}),
                            DONE_TTL,
                        )
                        .await?;
                }
            }
            cursor += 1;
            memory
                .save_serialized(auth, &cursor_key(task_id), json!(cursor))
                .await?;
            if self.is_stopped() {
                return Ok(Progress::Stopped);
            }
        }
        let terminal = events.iter().any(
            |e| matches!(e, TaskEvent::StatusUpdate { status, .. } if status.state.is_terminal()),
        );
        Ok(if terminal {
            Progress::Finished
        } else {
            Progress::Waiting
        })
    }

    /// Claim the delivery of log event `index` to config `config_id` for this process.
    async fn claim(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
        index: usize,
    ) -> AgentResult<Claim> {
        let memory = self.memory();
        let key = claim_key(task_id, config_id, index);
        let mine = json!({"owner": self.inner.owner});
        for _ in 0..2 {
            if memory
                .save_if_absent(auth, &key, mine.clone(), self.claim_ttl())
                .await?
            {
                return Ok(Claim::Mine);
            }
            match memory.load_serialized(auth, &key).await? {
                // Lapsed or released between the two calls: try once more.
                None => continue,
                Some(claim) if claim.get("done") == Some(&Value::Bool(true)) => {
                    return Ok(Claim::Done)
                }
                Some(claim) if claim == mine => return Ok(Claim::Mine),
                Some(_) => return Ok(Claim::Held),
            }
        }
        Ok(Claim::Held)
    }

    /// How long a claim holds before another process may take the delivery over: longer than
    /// every attempt of one delivery with its backoffs.
    fn claim_ttl(&self) -> Duration {
        let retry = self.inner.retry;
        (DELIVERY_TIMEOUT + retry.max_delay).saturating_mul(retry.max_attempts.max(1))
            + Duration::from_secs(30)
    }

    /// POST `body` to the config's webhook with retries; `None` when the server stopped first.
    async fn deliver(&self, config: &PushConfig, body: &Value) -> Option<Outcome> {
        let retry = self.inner.retry;
        let mut stopped = self.inner.stopped.clone();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = self.post(config, body).await;
            let (retryable, outcome) = match result {
                Ok(status) if (200..300).contains(&status) => (
                    false,
                    Outcome {
                        delivered: true,
                        attempts,
                        http_status: Some(status),
                        error: None,
                    },
                ),
                Ok(status) => (
                    status == 408 || status == 429 || status >= 500,
                    Outcome {
                        delivered: false,
                        attempts,
                        http_status: Some(status),
                        error: Some(format!("the webhook answered {status}")),
                    },
                ),
                Err(Attempt::Refused(reason)) => (
                    false,
                    Outcome {
                        delivered: false,
                        attempts,
                        http_status: None,
                        error: Some(reason),
                    },
                ),
                Err(Attempt::Failed(reason)) => (
                    true,
                    Outcome {
                        delivered: false,
                        attempts,
                        http_status: None,
                        error: Some(reason),
                    },
                ),
            };
            if !retryable || attempts >= retry.max_attempts {
                if !outcome.delivered {
                    tracing::warn!(config_id = %config.id, attempts, error = ?outcome.error, "push notification not delivered");
                }
                return Some(outcome);
            }
            tokio::select! {
                () = tokio::time::sleep(retry.backoff(attempts)) => {}
                () = changed(&mut stopped) => return None,
            }
        }
    }

    async fn post(&self, config: &PushConfig, body: &Value) -> Result<u16, Attempt> {
        let (url, pinned) = check_target(&config.url, self.inner.allow_private)
            .await
            .map_err(Attempt::Refused)?;
        // Connect to the address that was checked, not to whatever DNS says a moment later.
        let domain = url.host_str().and_then(|h| literal_ip(h).err());
        let client = match (domain, pinned.first()) {
            (Some(domain), Some(address)) => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(DELIVERY_TIMEOUT)
                .resolve(domain, *address)
                .build()
                .map_err(|e| Attempt::Failed(e.to_string()))?,
            _ => self.inner.http.clone(),
        };
        let mut request = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(token) = &config.token {
            request = request.header(NOTIFICATION_TOKEN_HEADER, token);
        }
        if let Some(auth) = &config.authentication {
            let value = match &auth.credentials {
                Some(credentials) => format!("{} {credentials}", auth.scheme),
                None => auth.scheme.clone(),
            };
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Attempt::Failed(e.to_string()))?;
        Ok(response.status().as_u16())
    }

    async fn log(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config: &PushConfig,
        kind: &str,
        index: usize,
        outcome: Outcome,
    ) -> AgentResult<()> {
        let _writes = self.inner.writes.lock().await;
        let memory = self.memory();
        let mut log: Vec<Value> = memory
            .load_serialized(auth, &log_key(task_id))
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        log.push(json!({
            "configId": config.id,
            "url": config.url,
            "event": kind,
            "logIndex": index,
            "delivered": outcome.delivered,
            "attempts": outcome.attempts,
            "httpStatus": outcome.http_status,
            "error": outcome.error,
            "at": chrono::Utc::now().to_rfc3339(),
        }));
        let excess = log.len().saturating_sub(DELIVERY_LOG_LIMIT);
        log.drain(..excess);
        memory
            .save_serialized(auth, &log_key(task_id), Value::Array(log))
            .await
    }
}

enum Progress {
    /// Everything delivered; the task is terminal (or gone, or has no configs left).
    Finished,
    /// Everything delivered so far; more may come.
    Waiting,
    /// The server stopped.
    Stopped,
}

/// What became of one event for one config.
struct Outcome {
    delivered: bool,
    attempts: u32,
    http_status: Option<u16>,
    error: Option<String>,
}

enum Attempt {
    /// The SSRF guard refused the target (final).
    Refused(String),
    /// The request failed on the way (retried).
    Failed(String),
}

/// Wait for a change; a closed channel never changes again.
async fn changed<T>(receiver: &mut watch::Receiver<T>) {
    if receiver.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The stream event a log event is pushed as: status and artifact updates only.
fn stream_event(event: &TaskEvent) -> Option<StreamEvent> {
    match event {
        TaskEvent::StatusUpdate {
            task_id,
            thread_id,
            status,
            ..
        } => Some(StreamEvent::StatusUpdate {
            task_id: task_id.clone(),
            thread_id: thread_id.clone(),
            status: status.clone(),
        }),
        TaskEvent::ArtifactUpdate {
            task_id,
            thread_id,
            artifact,
            append,
            last_chunk,
        } => Some(StreamEvent::ArtifactUpdate {
            task_id: task_id.clone(),
            thread_id: thread_id.clone(),
            artifact: artifact.clone(),
            append: *append,
            last_chunk: *last_chunk,
        }),
        TaskEvent::Message { .. } => None,
    }
}

/// The SSRF guard: the parsed URL and, unless private targets are allowed, the public
/// addresses its host resolves to (all of them must be public).
pub(crate) async fn check_target(
    url: &str,
    allow_private: bool,
) -> Result<(Url, Vec<SocketAddr>), String> {
    let url = Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("scheme `{}` is not http or https", url.scheme()));
    }
    let port = url
        .port_or_known_default()
        .ok_or_else(|| "the URL has no port".to_owned())?;
    let addresses: Vec<SocketAddr> = match url.host_str().map(literal_ip) {
        None => return Err("the URL has no host".to_owned()),
        Some(Ok(ip)) => vec![SocketAddr::new(ip, port)],
        Some(Err(domain)) => {
            if allow_private {
                return Ok((url.clone(), Vec::new()));
            }
            tokio::net::lookup_host((domain, port))
                .await
                .map_err(|e| format!("host `{domain}` does not resolve: {e}"))?
                .collect()
        }
    };
    if addresses.is_empty() {
        return Err("the host resolves to no address".to_owned());
    }
    if !allow_private {
        if let Some(bad) = addresses.iter().find(|a| !is_public(a.ip())) {
            return Err(format!(
                "target address {} is loopback, private, link-local or otherwise not public; the operator has not allowed such push targets",
                bad.ip()
            ));
        }
    }
    Ok((url, addresses))
}

/// A URL host as an IP address (`[::1]` included), or the domain name it is.
fn literal_ip(host: &str) -> Result<IpAddr, &str> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| host)
}

/// Whether an address is a public unicast address.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => {
            if let Some(v4) = ip.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let first = ip.segments()[0];
            // NAT64 (64:ff9b::/96) embeds an IPv4 address.
            if ip.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., a, b] = ip.segments();
                let [a1, a2] = a.to_be_bytes();
                let [b1, b2] = b.to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a1, a2, b1, b2));
            }
            !(ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link-local
                || ip == Ipv6Addr::from([0u8; 16]))
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_private_link_local_and_friends_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn the_guard_refuses_private_targets_unless_allowed() {
        for url in [
            "http://127.0.0.1:9/hook",
            "http://[::1]/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/",
            "http://localhost:8080/hook",
        ] {
            let err = check_target(url, false).await.unwrap_err();
            assert!(
                err.contains("not public") || err.contains("resolve"),
                "{url}: {err}"
            );
            assert!(check_target(url, true).await.is_ok(), "{url}");
        }
        assert!(check_target("ftp://example.com/", true).await.is_err());
        assert!(check_target("not a url", true).await.is_err());
        assert!(check_target("http://8.8.8.8/hook", false).await.is_ok());
    }

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_is_capped() {
        let retry = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
        };
        for _ in 0..50 {
            let first = retry.backoff(1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = retry.backoff(3);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            assert!(retry.backoff(30) <= Duration::from_millis(1000));
        }
    }
}
