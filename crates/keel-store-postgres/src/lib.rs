//! Keel's store traits over PostgreSQL: one [`PostgresStore`] that one Keel process or several
//! share, kept where most teams already keep (and back up, and monitor) their data.
//!
//! [`PostgresStore`] implements every store trait of `keel-runtime`: [`TaskManager`],
//! [`MemoryService`], the thread traits that make up [`ThreadStore`] (history, queue,
//! key-value store, subagent registry, leases), [`RunStore`], [`ThreadTimers`],
//! [`AsyncCallStore`] and [`StepStore`]. It is cheap to clone (one shared connection pool), and
//! [`PostgresStore::services`] builds a runtime's whole service bundle over it:
//!
//! ```no_run
//! use std::sync::Arc;
//! use keel_store_postgres::PostgresStore;
//! # async fn demo() -> Result<(), keel_core::AgentError> {
//! let store = PostgresStore::connect("postgres://keel@db.internal/keel").await?;
//! let services = store.services(Arc::new(keel_llm::MockLlm::new()));
//! # let _ = services;
//! # Ok(())
//! # }
//! ```
//!
//! # Schema
//!
//! Tables live in the connection's current schema (the first of its `search_path`; set
//! another with `?options=-c%20search_path%3Dmyschema` in the URL). They are created and
//! upgraded by embedded, versioned migrations (`keel_schema_version` holds the version) when
//! the store connects, under a PostgreSQL advisory lock, so two processes starting at once
//! never both migrate; a schema newer than this code is refused.
//!
//! Every row carries its tenant ([`AuthContext::namespace`]) and every tenant's query names
//! it, so no id a tenant sends reaches another tenant's rows. Two tables are read across
//! tenants by design: timers (a scheduler claims due timers of every tenant; the row names
//! its tenant) and asynchronous calls (a callback names only its call; the row says whose it
//! is and a transition compares it).
//!
//! # Atomicity and several processes
//!
//! - A write under a lease (history, queue acks, a persisted step) reads the thread's lease
//!   row `FOR SHARE` in the same transaction as the write, so a holder whose lease lapsed or
//!   was taken over gets [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost) and
//!   writes nothing, and a takeover waits for the write in flight.
//! - A persisted step (history entries and task events) is one transaction.
//! - Within a process, a lease's release waits for the fenced writes sent before it (the
//!   engine acknowledges a thread's last item and releases its lease together, in that
//!   order, and a pool would otherwise run them on two connections in either order).
//! - Taking a lease locks the thread's counter row, so two processes never both see a thread
//!   free; the fencing token only grows.
//! - Due timers are claimed with `FOR UPDATE SKIP LOCKED`: concurrent schedulers claim
//!   disjoint timers without waiting on each other.
//!
//! Live events and cancels reach other processes as on every shared store: the engine reads
//! the task's event log by sequence and the cancel flag in memory, so nothing is lost. On
//! top of that, [`PostgresStore::changes`] hears at once, through LISTEN/NOTIFY, what any
//! process commits: every write that appends to a task's log or saves a memory value (a
//! cancel request is one) is announced with `pg_notify` once it has committed (not in the
//! writing statement, which would serialize every such commit: see `changes::Announcer`).
//! It is a hint to read sooner, never the record: a
//! listener that lost its connection opens it again and reports [`StoreChange::Missed`].
//!
//! Timestamps are `BIGINT` nanoseconds since the Unix epoch (UTC) from the writing process's
//! clock, as in the SQLite store: processes sharing a database need synchronised clocks
//! (NTP) for lease expiry to mean the same to all of them.
//!
//! # TLS
//!
//! The URL's `sslmode` decides (`prefer` by default: TLS when the server offers it). TLS is
//! rustls on the `ring` provider, verifying the server against the system's root
//! certificates.
//!
//! [`AuthContext::namespace`]: keel_runtime::AuthContext::namespace

mod async_calls;
mod changes;
mod codec;
mod error;
mod leases;
mod memory;
mod runs;
mod schema;
mod steps;
mod tasks;
mod threads;
mod timers;

#[cfg(feature = "testing")]
pub mod testing;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    ClientWrapper, Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use keel_core::{AgentError, AgentResult, TaskId};
use keel_runtime::{AuthContext, KvLimits, Llm, Services};

#[cfg(doc)]
use keel_runtime::{
    AsyncCallStore, MemoryService, RunStore, StepStore, TaskManager, ThreadStore, ThreadTimers,
};

pub use changes::Changes;
pub use keel_runtime::StoreChange;
pub use schema::SCHEMA_VERSION;

/// How long to wait for a new connection, and for a free one from the pool.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server lets one of the store's transactions sit idle before ending it.
const IDLE_IN_TRANSACTION_MS: u64 = 60_000;
const POOL_WAIT: Duration = Duration::from_secs(10);
/// Connections kept by default: enough for a busy server's concurrent steps, few enough that
/// several replicas fit PostgreSQL's default `max_connections` (100).
const DEFAULT_POOL_SIZE: usize = 16;

/// Keel's stores over one PostgreSQL database: implements every store trait, so one value
/// can back a whole runtime. Clones share one connection pool; a lost connection is
/// replaced on the next call (the call that saw it fails with
/// [`AgentError::StoreUnavailable`]).
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    kv_limits: KvLimits,
    /// `host:port/db`, for logs (never the password).
    server: Arc<str>,
    /// The order of each lease's writes and release within this process.
    order: Arc<leases::WriteOrder>,
    /// The LISTEN connection behind [`PostgresStore::changes`], started on first use.
    listener: Arc<changes::Listener>,
    /// Sends the notifications of this store's writes.
    announcer: Arc<changes::Announcer>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("server", &self.server)
            .field("kv_limits", &self.kv_limits)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connect to the database at `url` (`postgres://[user[:password]@]host[:port]/db[?...]`,
    /// or the `key=value` form libpq takes), with a pool of 16 connections, and bring its
    /// schema up to date.
    ///
    /// The server must answer now: an unreachable server is
    /// [`AgentError::StoreUnavailable`], a URL that does not parse or a schema newer than this
    /// code [`AgentError::Storage`].
    pub async fn connect(url: &str) -> AgentResult<PostgresStore> {
        Self::connect_with_pool_size(url, DEFAULT_POOL_SIZE).await
    }

    /// [`PostgresStore::connect`] with at most `size` pooled connections.
    pub async fn connect_with_pool_size(url: &str, size: usize) -> AgentResult<PostgresStore> {
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
            AgentError::storage(format!(
                "the store URL is not a PostgreSQL URL Keel can use ({e}); expected \
                 postgres://[user[:password]@]host[:port]/database"
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let options = config.get_options().unwrap_or_default();
        if !options.contains("idle_in_transaction_session_timeout") {
            // Keel's transactions are a few statements long. One left open (its process
            // stalled between two statements) would hold its rows' locks, a thread's lease
            // row among them, until the connection died; the server ends it instead.
            let options = format!(
                "{options} -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
            );
            config.options(options.trim_start());
        }
        let server = server_name(&config);
        let listener = Arc::new(changes::Listener::new(config.clone()));
        let manager = Manager::from_config(
            config,
            tls()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let own = listener.own_sessions();
        let pool = Pool::builder(manager)
            .post_create(Hook::async_fn(move |client: &mut ClientWrapper, _| {
                let own = own.clone();
                Box::pin(async move {
                    let pid: i32 = client
                        .query_one("SELECT pg_backend_pid()", &[])
                        .await
                        .map_err(HookError::Backend)?
                        .get(0);
                    own.lock().unwrap_or_else(|p| p.into_inner()).insert(pid);
                    Ok(())
                })
            }))
            .max_size(size.max(1))
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(POOL_WAIT))
            .build()
            .map_err(AgentError::internal_source)?;
        let announcer = Arc::new(changes::Announcer::new(pool.clone()));
        let store = PostgresStore {
            pool,
            kv_limits: KvLimits::DEFAULT,
            server: Arc::from(server),
            order: Arc::new(leases::WriteOrder::new()),
            listener,
            announcer,
        };
        let mut client = store.client().await?;
        schema::migrate(&mut client).await?;
        tracing::debug!(server = %store.server, "connected to PostgreSQL");
        Ok(store)
    }

    /// Use other caps for the per-thread key-value store (default [`KvLimits::DEFAULT`]).
    #[must_use]
    pub fn with_kv_limits(mut self, limits: KvLimits) -> Self {
        self.kv_limits = limits;
        self
    }

    /// The key-value caps in use.
    pub fn kv_limits(&self) -> KvLimits {
        self.kv_limits
    }

    /// Every service of a runtime over this database (tasks, memory, threads, one-transaction
    /// step writes, runs, timers, asynchronous calls, and the announcements of what every
    /// process commits), with a static tenant, `tracing` logs and `llm` as the default model.
    pub fn services(&self, llm: Arc<dyn Llm>) -> Services {
        Services::from_store(self.clone(), self.kv_limits, llm)
            .with_steps(self.clone())
            .with_changes(self.clone())
    }

    /// How many statements every Postgres store of this process has sent so far (a
    /// transaction's `BEGIN` and `COMMIT` included): what benchmarks divide by the work done,
    /// to show what one step or one message costs the database.
    pub fn statements_sent() -> u64 {
        codec::STATEMENTS.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every change committed to this store's schema from now on, by any process: task
    /// events appended and memory values saved (cancel requests among them), heard through
    /// LISTEN/NOTIFY on one connection of its own (opened by the first call, shared by every
    /// clone, closed with the last). Returns once that connection listens; a server that does
    /// not answer is [`AgentError::StoreUnavailable`].
    ///
    /// A hint to read sooner, never the record: a lost connection is opened again and
    /// announced as [`StoreChange::Missed`] (changes in between went unheard), so a follower
    /// re-reads what it follows then, and keeps a slow poll besides.
    pub async fn changes(&self) -> AgentResult<Changes> {
        self.listener
            .subscribe(self.server.clone(), CONNECT_TIMEOUT * 2)
            .await
    }

    /// Tell listeners (this process's and others') that `task_id`'s log grew.
    fn announce_task_events(&self, auth: &AuthContext, task_id: &TaskId) {
        self.announcer
            .task_events(&auth.namespace(), task_id.as_str());
    }

    /// Tell listeners that memory value `key` was saved.
    fn announce_memory(&self, auth: &AuthContext, key: &str) {
        self.announcer.memory(&auth.namespace(), key);
    }

    /// A pooled connection.
    async fn client(&self) -> AgentResult<Object> {
        self.pool.get().await.map_err(error::pool)
    }
}

/// `host:port/db` of `config`, for logs.
fn server_name(config: &tokio_postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or_default())
}

/// The TLS connector: rustls on `ring`, trusting the system's root certificates.
fn tls() -> AgentResult<tokio_postgres_rustls::MakeRustlsConnect> {
    let mut roots = rustls::RootCertStore::empty();
    // Certificates the platform cannot load are skipped: a server signed by one of them is
    // refused at its handshake, with rustls' error naming why.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(AgentError::internal_source)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

#[async_trait::async_trait]
impl keel_runtime::ChangeFeed for PostgresStore {
    async fn follow(&self) -> AgentResult<futures::stream::BoxStream<'static, StoreChange>> {
        Ok(self.changes().await?.into_stream())
    }
}
