//! [`DefaultRuntime`]: the service hub with Keel's built-in services, [`StoreConfig`],
//! which chooses where it keeps its data, and the builder's one-call server
//! ([`DefaultRuntimeBuilder::serve`]).

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, ExecutorConfig};
use keel_core::{AgentError, AgentResult};
use keel_llm::{Llm, MockLlm};
use keel_runtime::{AuthService, LoggingService, Runtime, Services};
use keel_transport::callbacks::HttpCallbacks;
use keel_transport::{A2aServer, AgentsServer};

/// Where a [`DefaultRuntime`] keeps tasks, threads, memory and run records.
///
/// ```
/// use keel::StoreConfig;
/// assert_eq!(StoreConfig::parse("memory")?, StoreConfig::Memory);
/// assert_eq!(StoreConfig::parse("sqlite:./keel.db")?, StoreConfig::Sqlite("./keel.db".into()));
/// assert_eq!(
///     StoreConfig::parse("postgres://db/keel")?,
///     StoreConfig::Postgres { url: "postgres://db/keel".into() }
/// );
/// assert_eq!(StoreConfig::parse("sqlite://./keel.db")?, StoreConfig::Sqlite("./keel.db".into()));
/// assert_eq!(StoreConfig::parse("sqlite:///var/keel.db")?, StoreConfig::Sqlite("/var/keel.db".into()));
/// assert!(StoreConfig::parse("mysql://x").is_err());
/// # Ok::<(), keel::core::AgentError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// In process memory: nothing survives a restart.
    Memory,
    /// A SQLite file (feature `sqlite`, on by default).
    Sqlite(PathBuf),
    /// A Redis server shared by several processes (feature `redis`), with a key prefix.
    Redis {
        /// `redis://[:password@]host:port[/db]`.
        url: String,
        /// Prefix of every key (`keel:` by default).
        prefix: String,
    },
    /// A PostgreSQL database shared by several processes (feature `postgres`).
    Postgres {
        /// `postgres://[user[:password]@]host[:port]/database[?sslmode=...]`.
        url: String,
    },
}

impl StoreConfig {
    /// The default store of `keel serve`: SQLite at `./keel.db`.
    pub fn default_sqlite() -> Self {
        StoreConfig::Sqlite(PathBuf::from("./keel.db"))
    }

    /// Parse `memory`, `sqlite:PATH`, `redis://…` / `rediss://…` or `postgres://…` /
    /// `postgresql://…`. `sqlite://PATH` is read as other tools read it (`sqlite://./keel.db`
    /// is `./keel.db`, `sqlite:///var/keel.db` is `/var/keel.db`), not as a path that starts
    /// with `//`.
    pub fn parse(spec: &str) -> AgentResult<Self> {
        if spec == "memory" {
            Ok(StoreConfig::Memory)
        } else if let Some(path) = spec
            .strip_prefix("sqlite://")
            .or_else(|| spec.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(AgentError::invalid_input(
                    "store",
                    "`sqlite:` needs a path, e.g. sqlite:./keel.db",
                ));
            }
            Ok(StoreConfig::Sqlite(PathBuf::from(path)))
        } else if spec.starts_with("redis://") || spec.starts_with("rediss://") {
            Ok(StoreConfig::Redis {
                url: spec.to_owned(),
                prefix: "keel:".into(),
            })
        } else if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            Ok(StoreConfig::Postgres {
                url: spec.to_owned(),
            })
        } else {
            Err(AgentError::invalid_input(
                "store",
                format!(
                    "`{spec}` is not a store; use memory, sqlite:PATH, redis://HOST:PORT or \
                     postgres://HOST/DATABASE"
                ),
            ))
        }
    }
}

/// The out-of-the-box [`Runtime`]: a static tenant, the stores chosen by [`StoreConfig`],
/// `tracing` logs, and a default model.
///
/// ```
/// use keel::prelude::*;
/// let runtime = DefaultRuntime::builder()
///     .llm(MockLlm::new())
///     .auth(keel::services::StaticAuthService::new(AuthContext::new("acme", "ops")))
///     .build_in_memory();
/// assert_eq!(runtime.auth_service().auth_context().app_name, "acme");
/// ```
#[derive(Clone)]
pub struct DefaultRuntime {
    services: Services,
}

impl DefaultRuntime {
    /// In-memory services with `llm` as the default model.
    pub fn new(llm: impl Llm + 'static) -> Self {
        Self::builder().llm(llm).build_in_memory()
    }

    /// In-memory services with the offline [`MockLlm`]: no API key, no network, no files.
    pub fn offline() -> Self {
        Self::builder().build_in_memory()
    }

    /// Choose the services one by one.
    pub fn builder() -> DefaultRuntimeBuilder {
        DefaultRuntimeBuilder {
            llm: None,
            auth: None,
            logging: None,
            store: StoreConfig::Memory,
            agents: Vec::new(),
        }
    }
}

keel_runtime::runtime_from_field!(DefaultRuntime => services);

/// Builds a [`DefaultRuntime`], and with [`agents`](Self::agents) serves them in one call
/// ([`serve`](Self::serve)).
#[must_use]
pub struct DefaultRuntimeBuilder {
    llm: Option<Arc<dyn Llm>>,
    auth: Option<Arc<dyn AuthService>>,
    logging: Option<Arc<dyn LoggingService>>,
    store: StoreConfig,
    agents: Vec<Agent>,
}

impl DefaultRuntimeBuilder {
    /// The default model (the offline [`MockLlm`] when not set).
    pub fn llm(mut self, llm: impl Llm + 'static) -> Self {
        self.llm = Some(Arc::new(llm));
        self
    }

    /// The default model, shared.
    pub fn llm_shared(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Who the callers are: a [`StaticAuthService`](keel_runtime::StaticAuthService) (one tenant for everyone, the default)
    /// or an [`ApiKeyAuthService`](keel_runtime::ApiKeyAuthService) mapping keys to tenants.
    pub fn auth(mut self, auth: impl AuthService + 'static) -> Self {
        self.auth = Some(Arc::new(auth));
        self
    }

    /// Where data is kept (in memory unless set).
    pub fn store(mut self, store: StoreConfig) -> Self {
        self.store = store;
        self
    }

    /// Where the runtime's log lines go: `tracing` unless set;
    /// [`ConsoleLoggingService`](keel_runtime::ConsoleLoggingService) writes plain lines to
    /// stderr.
    pub fn logging(mut self, logging: impl LoggingService + 'static) -> Self {
        self.logging = Some(Arc::new(logging));
        self
    }

    /// The agents [`serve`](Self::serve) serves, each under `/agents/{name}/` (its card's
    /// name), the first also at `/`. Adds to those given before.
    pub fn agents(mut self, agents: impl IntoIterator<Item = Agent>) -> Self {
        self.agents.extend(agents);
        self
    }

    /// Build the runtime and serve its [`agents`](Self::agents) over A2A on `addr` until
    /// Ctrl-C: seed 002's `DefaultRuntime::builder().agents([...]).serve(addr)`. See
    /// [`serve_on`](Self::serve_on) for what it starts.
    pub async fn serve(self, addr: impl tokio::net::ToSocketAddrs) -> AgentResult<()> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|err| AgentError::internal(format_args!("cannot listen: {err}")))?;
        self.serve_on(listener, async {
            // Without a signal handler the server runs until the process ends.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await
    }

    /// Build the runtime and serve its [`agents`](Self::agents) on `listener` until
    /// `shutdown` completes; a caller that binds `127.0.0.1:0` knows the address. Each agent
    /// gets an executor on the one runtime, with asynchronous tools calling back to its own
    /// URL; before serving, each resumes the unfinished tasks a previous process left
    /// (`recover_all`), starts taking over threads that a dead process sharing the store
    /// leaves (`start_takeover`) and starts its effect scheduler, as `keel serve` does. On
    /// shutdown, running tasks are handed on, not canceled (`AgentExecutor::shutdown`): they
    /// stop at their next step, within the default drain timeout, for the next process.
    ///
    /// No agents, two agents with one name, or a name that is not one URL path segment is
    /// [`AgentError::InvalidInput`].
    ///
    /// ```
    /// use keel::prelude::*;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let agent = |name: &str| Agent::builder(AgentCard::new(name, "Echoes", "http://unused")).build();
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let url = format!("http://{}/agents/beta", listener.local_addr()?);
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let serving = tokio::spawn(
    ///     DefaultRuntime::builder()
    ///         .agents([agent("alpha")?, agent("beta")?])
    ///         .serve_on(listener, async move { let _ = stopped.await; }),
    /// );
    /// assert_eq!(keel::transport::A2aClient::new(url).get_card().await?.name, "beta");
    /// let _ = stop.send(());
    /// serving.await??;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn serve_on(
        mut self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> AgentResult<()> {
        let agents = std::mem::take(&mut self.agents);
        check_agent_names(&agents)?;
        let address = listener
            .local_addr()
            .map_err(|err| AgentError::internal(format_args!("cannot read the address: {err}")))?;
        let base_url = format!("http://{address}/");
        let runtime: Arc<dyn Runtime> = Arc::new(self.build().await?);
        let mut served = AgentsServer::new();
        for agent in agents {
            let name = agent.card().name.clone();
            let config = ExecutorConfig {
                // Asynchronous tools call back to their own agent's callback route.
                callbacks: Some(HttpCallbacks::shared(
                    AgentsServer::agent_url(&base_url, &name).trim_end_matches('/'),
                )),
                ..ExecutorConfig::default()
            };
            let executor = AgentExecutor::with_config(agent, runtime.clone(), config);
            let resumed = executor.recover_all().await?;
            if resumed > 0 {
                tracing::info!(agent = %name, resumed, "resuming unfinished tasks");
            }
            executor.start_takeover();
            executor.start_effects()?;
            served = served.with_agent(name, A2aServer::new(executor));
        }
        served
            .serve(listener, shutdown)
            .await
            .map_err(|err| AgentError::internal(format_args!("the server failed: {err}")))
    }

    /// The default model, or the offline one.
    fn take_llm(&mut self) -> Arc<dyn Llm> {
        self.llm
            .take()
            .unwrap_or_else(|| Arc::new(MockLlm::new().keep_requests(0)))
    }

    /// `services` with the chosen auth and logging services, if chosen.
    fn finish(mut self, mut services: Services) -> DefaultRuntime {
        if let Some(auth) = self.auth.take() {
            services.auth = auth;
        }
        if let Some(logging) = self.logging.take() {
            services.logging = logging;
        }
        DefaultRuntime { services }
    }

    /// The runtime with in-memory stores, whatever [`DefaultRuntimeBuilder::store`] says.
    pub fn build_in_memory(mut self) -> DefaultRuntime {
        let services = Services::in_memory(self.take_llm());
        self.finish(services)
    }

    /// Open the configured store and build the runtime. A store whose Cargo feature is off,
    /// or that cannot be opened, is an error that says which.
    pub async fn build(mut self) -> AgentResult<DefaultRuntime> {
        let llm = self.take_llm();
        let services = match self.store.clone() {
            StoreConfig::Memory => Services::in_memory(llm),
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite(path) => {
                tokio::task::spawn_blocking(move || keel_store_sqlite::SqliteStore::open(path))
                    .await
                    .map_err(AgentError::internal)??
                    .services(llm)
            }
            #[cfg(feature = "redis")]
            StoreConfig::Redis { url, prefix } => keel_store_redis::RedisStore::connect(&url)
                .await?
                .with_prefix(prefix)
                .services(llm),
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres { url } => keel_store_postgres::PostgresStore::connect(&url)
                .await?
                .services(llm),
            #[allow(unreachable_patterns)] // reachable exactly when a store feature is off
            other => {
                return Err(AgentError::Unsupported {
                    what: format!(
                    "store {other:?}: this build of Keel lacks its Cargo feature (sqlite / redis / postgres)"
                ),
                })
            }
        };
        Ok(self.finish(services))
    }
}

/// Agents served together need distinct names that are one URL path segment.
fn check_agent_names(agents: &[Agent]) -> AgentResult<()> {
    if agents.is_empty() {
        return Err(AgentError::invalid_input(
            "agents",
            "give at least one agent to serve",
        ));
    }
    let mut seen = HashSet::new();
    for agent in agents {
        let name = agent.card().name.as_str();
        let segment = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && name != "."
            && name != "..";
        if !segment {
            return Err(AgentError::invalid_input(
                "agents[].card.name",
                format!("`{name}` cannot be served under /agents/{{name}}/: use letters, digits, `-`, `_` or `.`"),
            ));
        }
        if !seen.insert(name) {
            return Err(AgentError::invalid_input(
                "agents[].card.name",
                format!("two agents are named `{name}`; each is served under its own name"),
            ));
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_sqlite_runtime_hands_out_a_step_store() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = DefaultRuntime::builder()
            .store(StoreConfig::Sqlite(dir.path().join("keel.db")))
            .build()
            .await
            .unwrap();
        assert!(
            runtime.step_store().is_some(),
            "the engine writes each persist point in one SQLite job"
        );
    }
}

#[cfg(test)]
mod logging_tests {
    use std::io::Write;
    use std::sync::Mutex;

    use keel_runtime::{ConsoleLoggingService, LogLevel};

    use super::*;

    /// A writer whose bytes the test can still read after handing it over.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_chosen_logging_service_is_the_runtimes() {
        let out = Shared::default();
        let runtime = DefaultRuntime::builder()
            .logging(ConsoleLoggingService::with_writer(out.clone()))
            .build_in_memory();
        runtime
            .logging_service()
            .log(LogLevel::Warn, "disk almost full");
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.ends_with(" WARN keel: disk almost full\n"), "{text}");
    }
}
