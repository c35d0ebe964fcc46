//! Keel's store traits over Redis: one [`RedisStore`] that several Keel processes can share,
//! so a deployment can outgrow one machine.
//!
//! [`RedisStore`] implements every store trait of `keel-runtime`: [`TaskManager`],
//! [`MemoryService`], the thread traits that make up [`ThreadStore`] (history, queue,
//! key-value store, subagent registry, leases) and [`RunStore`]. It is cheap to clone (one
//! shared, multiplexed, self-reconnecting connection), so the same store can back every
//! service of a runtime:
//!
//! ```no_run
//! use std::sync::Arc;
//! use keel_runtime::{KvLimits, RunStore, TaskManager, ThreadStore};
//! use keel_store_redis::RedisStore;
//! # async fn demo() -> Result<(), keel_core::AgentError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379")
//!     .await?
//!     .with_prefix("myapp:")
//!     .with_kv_limits(KvLimits::DEFAULT);
//! let tasks: Arc<dyn TaskManager> = Arc::new(store.clone());
//! let threads: Arc<dyn ThreadStore> = Arc::new(store.clone());
//! let runs: Arc<dyn RunStore> = Arc::new(store);
//! # let _ = (tasks, threads, runs);
//! # Ok(())
//! # }
//! ```
//!
//! Only core Redis commands are used (no modules). Redis 5 or newer is required (scripts
//! read the server clock with `TIME` before writing, which needs effects replication); the
//! tests run against Redis 7.
//!
//! # Durability: turn persistence on
//!
//! Redis keeps what it acknowledged **only with persistence on**. With the default
//! configuration (RDB snapshots only, or none) a crash or restart of the Redis server loses
//! every write since the last snapshot, and with it Keel's guarantee that an acknowledged
//! step survives. Run Redis with the append-only file enabled:
//!
//! ```text
//! appendonly yes
//! appendfsync everysec   # or `always`, to lose nothing at all, at a cost in write latency
//! ```
//!
//! With `appendfsync everysec` a power loss can still cost up to a second of writes; use
//! `always` when that matters. Replicas do not help on their own: Redis replication is
//! asynchronous, so a failover can lose acknowledged writes. Also disable eviction
//! (`maxmemory-policy noeviction`): an evicting Redis silently drops Keel's records.
//!
//! # Key layout
//!
//! Every key is `<prefix>{<tenant namespace>}:<kind>[<id>]`. The prefix defaults to `keel:`
//! ([`RedisStore::with_prefix`]); the tenant namespace is [`AuthContext::namespace`], so no
//! id a tenant sends can reach another tenant's keys. The braces are a Redis hash tag: all of
//! a tenant's keys hash to one slot, which multi-key scripts and `MULTI` need on
//! Redis-Cluster-style deployments. Each key has at most one variable part, at its end, and no
//! kind is a prefix of another, so two different records can never share a key.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `task:<task>` | string | the task snapshot (no history) |
//! | `task-meta:<task>` | hash | `seq`, `thread`, `state`: what the indexes were built from |
//! | `task-events:<task>` | list | the task's event log (`RPUSH`) |
//! | `task-seq` | string | per-tenant counter giving each new task its creation order |
//! | `tasks` | sorted set | the tenant's task ids, score = creation seq |
//! | `tasks-by-thread:<thread>` | sorted set | the same, one thread |
//! | `tasks-by-state:<state>` | sorted set | the same, one state |
//! | `tasks-by-thread-state:<state>:<thread>` | sorted set | the same, one thread and state |
//! | `tasks-by-update` | sorted set | the tenant's task ids, score = status timestamp (µs) |
//! | `tasks-by-update-thread:<thread>` | sorted set | the same, one thread |
//! | `tasks-by-update-state:<state>` | sorted set | the same, one state |
//! | `tasks-by-update-thread-state:<state>:<thread>` | sorted set | the same, one thread and state |
//! | `memory:<key>` | string | a [`MemoryService`] value, with `PX` when it has a TTL |
//! | `history:<thread>` | list | the thread's history, entry `seq` = list index + 1 |
//! | `queue:<thread>` | sorted set | queued item ids, score = queue seq |
//! | `queue-items:<thread>` | hash | item id → the queued item |
//! | `queue-seq:<thread>` | string | the queue's seq counter |
//! | `queued-threads` | hash | thread → how many items its queue holds, for threads with queued work |
//! | `kv:<thread>` | hash | the thread's key-value store |
//! | `lease:<thread>` | string | `<token>:<holder>` of the live lease, with `PX` = its TTL |
//! | `lease-token:<thread>` | string | the fencing-token counter; never deleted |
//! | `child:<thread>` | hash | a subagent: `record`, `status`, `parent` |
//! | `children:<thread>` | sorted set | a parent's children, score = `created_at` (µs) |
//! | `task-records` | hash | record seq → task record |
//! | `task-record-seq` | string | the task-record counter |
//! | `task-records-by-time` | sorted set | every task record, score = `recorded_at` (µs) |
//! | `task-records-by-{task,run,thread,trace,agent}:<id>` | sorted set | the same, one index value |
//! | `run-reports` | hash | run id → run record |
//! | `run-reports-by-time` | sorted set | run ids, score = `recorded_at` (µs) |
//! | `run-reports-by-{task,thread,trace,agent}:<id>` | sorted set | the same, one index value |
//!
//! System-level keys (not a tenant's) live under `<prefix>{keel-system}:`; a tenant's base
//! starts with a digit inside the braces, so the two never meet:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `timers-due` | sorted set | every timer id, score = when it becomes claimable (µs): its due time, then its claim's expiry |
//! | `timer:<id>` | hash | a timer: `owner` (namespace), `thread`, `body`, `attempts`, `claim` |
//! | `timers-of:<namespace>:<thread>` | sorted set | one thread's timer ids, score = due time (µs) |
//! | `tenants` | set | namespaces of tenants that saved a task (for recovery of all tenants) |
//! One kind of key is not a tenant's: `<prefix>async-call:<call>` (hash: `tenant`,
//! `app_name`, `user_name`, `thread_id`, `state`, `record`) indexes asynchronous tool calls
//! by id alone, because a callback names only its call; its fields say whose it is, and a
//! transition compares them (and the state) in one script.
//!
//! Records are Keel's versioned stored JSON ([`keel_core::stored`]); a record that does not
//! decode is [`AgentError::Storage`] naming its key.
//!
//! # Atomicity
//!
//! Every write that touches more than one key, or that must check before it writes, is one
//! Lua script (`EVALSHA`, loaded on first use) or one `MULTI` pipeline, so it is one round trip
//! and no other client ever sees half of it:
//!
//! - leases: acquire (`EXISTS`, `INCR` the token counter, `SET NX PX`), renew and release
//!   compare the lease key's token with the caller's before touching it;
//! - fenced writes (`append_history`, `ack_queue`) check the lease token and write in the same
//!   script, so a holder whose lease expired (its key is gone) or was taken over gets
//!   [`AgentError::LeaseLost`] and writes nothing; a step's messages are one `EVALSHA`;
//! - `save_task` (snapshot, creation seq and every index) and `save_task_with_events` (the
//!   same script, then `RPUSH` of the events), `add_task_event` (`EXISTS` then `RPUSH`),
//!   `persist_step` (the lease check, `EXISTS` of the task, then both `RPUSH`es), `push_queue`, `kv_set` (`HEXISTS`/`HLEN` then `HSET`, so the key cap holds under
//!   concurrent writers), `register_child`, `set_child_status`, `save_task_record` are scripts;
//! - `save_run_report` is a `MULTI` pipeline; listings read through one script so a page is
//!   a consistent snapshot.
//!
//! Scripts derive a few index keys from the tenant's key base (the old state and thread index
//! of a re-saved task, a re-registered child's old parent); those keys always share the
//! tenant's hash tag.
//!
//! # Costs worth knowing
//!
//! - `list_tasks` is `O(log n + page)`: every filter combination has its own index.
//! - `find_task_records` / `find_run_reports` narrow candidates with the most selective index
//!   the query names (task, run, thread, trace, agent, else the tenant's time index) and the
//!   `since`/`until` window, then, newest first and client-side, match the `contains` text on
//!   each candidate's stored JSON, decode it and check the remaining fields, until `limit`
//!   records match. A query whose
//!   other fields reject most candidates of the chosen index reads many records.
//! - A run report replaced with different index fields stays listed in its old indexes; the
//!   client-side check drops it there.

mod async_calls;
mod encoding;
mod error;
mod keys;
mod lease;
mod memory;
mod runs;
mod scripts;
mod tasks;
mod thread;
mod timers;

use std::sync::Arc;
use std::time::Duration;

use keel_core::{AgentError, AgentResult};
use keel_runtime::{AuthContext, KvLimits, Llm, Services};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

#[cfg(doc)]
use keel_runtime::{MemoryService, RunStore, TaskManager, ThreadStore};

use crate::error::ServerName;
use crate::keys::TenantKeys;

/// How long to wait for a TCP connection, and then for each reply.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a lost connection, how many times the connection is tried again and the longest
/// wait between two tries. Calls made meanwhile wait for these tries, so they are few and
/// quick: while Redis is down a call fails within a fraction of a second (connection
/// refused) or one connection timeout (no answer), as [`AgentError::StoreUnavailable`],
/// instead of after the client's default six backed-off tries. Each later call tries again.
const RECONNECT_ATTEMPTS: usize = 1;
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(200);

/// Keel's stores over one Redis server: implements every store trait (`TaskManager`,
/// `MemoryService`, `ThreadHistory`, `ThreadQueue`, `ThreadKv`, `SubagentRegistry`,
/// `ThreadLeases`, `RunStore`, `ThreadTimers`), so one value can back a whole runtime.
///
/// Clones share one multiplexed connection that reconnects by itself after a network error
/// (the call that saw the error fails with [`AgentError::StoreUnavailable`]; later calls use
/// the new connection, or fail the same way, quickly, while Redis stays unreachable). Read the crate docs on persistence before relying on it for durability.
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    prefix: Arc<str>,
    kv_limits: KvLimits,
    server: ServerName,
    /// Tenants this process already added to the system tenant set.
    known_tenants: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &self.server.shown())
            .field("prefix", &self.prefix)
            .field("kv_limits", &self.kv_limits)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The key prefix used unless [`RedisStore::with_prefix`] says otherwise.
    pub const DEFAULT_PREFIX: &'static str = "keel:";

    /// Connect to the Redis server at `url` (`redis://[user:password@]host[:port][/db]`,
    /// `rediss://` needs a TLS-enabled build of the `redis` crate).
    ///
    /// The server must answer a `PING` now: an unreachable server, a refused connection or
    /// bad credentials are [`AgentError::Storage`] at once, with the URL in the message and its
    /// password masked. After that, lost connections are re-established automatically.
    pub async fn connect(url: &str) -> AgentResult<RedisStore> {
        let server = ServerName::new(url);
        let client = redis::Client::open(url).map_err(|e| {
            AgentError::storage(format!(
                "`{}` is not a Redis URL Keel can use ({}); expected \
                 redis://[user:password@]host[:port][/db]",
                server.shown(),
                server.scrub(&e.to_string())
            ))
        })?;

        // Probe once, without the manager's retry loop, so a server that is down fails fast
        // with a clear message instead of after several backed-off reconnection attempts.
        let probe_config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let mut probe = client
            .get_multiplexed_async_connection_with_config(&probe_config)
            .await
            .map_err(|e| server.error("connect", &e))?;
        redis::cmd("PING")
            .query_async::<()>(&mut probe)
            .await
            .map_err(|e| server.error("PING", &e))?;
        drop(probe);

        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(RECONNECT_ATTEMPTS)
            .set_max_delay(RECONNECT_MAX_DELAY);
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| server.error("connect", &e))?;
        tracing::debug!(server = %server.shown(), "connected to Redis");
        Ok(RedisStore {
            connection,
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            kv_limits: KvLimits::DEFAULT,
            server,
            known_tenants: Arc::default(),
        })
    }

    /// Put every key under `prefix` instead of `keel:` (to share one Redis database between
    /// deployments, or to isolate tests). Stores that should see the same data must use the
    /// same prefix.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self.known_tenants = Arc::default();
        self
    }

    /// Use other caps for the per-thread key-value store (default [`KvLimits::DEFAULT`]).
    #[must_use]
    pub fn with_kv_limits(mut self, limits: KvLimits) -> Self {
        self.kv_limits = limits;
        self
    }

    /// Every service of a runtime over this server (tasks, memory, threads, one-round-trip
    /// step writes, runs, timers, asynchronous calls), with a static tenant, `tracing` logs
    /// and `llm` as the default model.
    pub fn services(&self, llm: Arc<dyn Llm>) -> Services {
        Services::from_store(self.clone(), self.kv_limits, llm).with_steps(self.clone())
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key-value caps in use.
    pub fn kv_limits(&self) -> KvLimits {
        self.kv_limits
    }

    /// The keys of one tenant.
    fn keys(&self, auth: &AuthContext) -> TenantKeys {
        TenantKeys::new(&self.prefix, auth)
    }

    /// A handle on the shared connection (cheap: the manager is reference-counted).
    fn con(&self) -> ConnectionManager {
        self.connection.clone()
    }

    /// A Redis failure during `op`, as an actionable [`AgentError::Storage`].
    fn fail(&self, op: &str, err: &redis::RedisError) -> AgentError {
        self.server.error(op, err)
    }

    /// The record stored at `key` (`GET`), or in the hash `key` under `field` (`HGET`),
    /// decoded; `None` when there is none. `op` names the read in a connection error; a
    /// record that does not decode is [`AgentError::Storage`] naming the key.
    async fn read_record<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        key: &str,
        field: Option<&str>,
    ) -> AgentResult<Option<T>> {
        self.read_text(op, key, field)
            .await?
            .map(|text| encoding::decode(key, &text))
            .transpose()
    }

    /// The string at `key` (or its hash `field`), as stored.
    async fn read_text(
        &self,
        op: &str,
        key: &str,
        field: Option<&str>,
    ) -> AgentResult<Option<String>> {
        let mut cmd = redis::cmd(if field.is_some() { "HGET" } else { "GET" });
        cmd.arg(key).arg(field);
        cmd.query_async(&mut self.con())
            .await
            .map_err(|e| self.fail(op, &e))
    }
}
