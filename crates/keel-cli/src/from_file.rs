//! Agents from `keel.toml`: `keel init` writes one, `keel check` validates one and prints what
//! it would serve, and `keel serve --config` serves every agent it declares.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel::agent::ExecutorConfig;
use keel::config::{LoadedConfig, DEFAULT_CONFIG_FILE, TEMPLATE};
use keel::services::AuthContext;
use keel::transport::callbacks::HttpCallbacks;
use keel::transport::{A2aServer, AgentsServer, EndpointSpec, Limits, PushTarget, Security};
use keel::{Config, DefaultRuntime, StoreConfig};

/// `keel init [DIR]`: write the commented example, never over an existing file unless asked.
pub(crate) fn init(dir: Option<PathBuf>, force: bool) -> Result<(), String> {
    let dir = dir.unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir)
        .map_err(|err| format!("cannot create `{}`: {err}", dir.display()))?;
    let path = dir.join(DEFAULT_CONFIG_FILE);
    if path.exists() && !force {
        return Err(format!(
            "`{}` already exists; pass --force to replace it",
            path.display()
        ));
    }
    std::fs::write(&path, TEMPLATE)
        .map_err(|err| format!("cannot write `{}`: {err}", path.display()))?;
    println!(
        "keel: wrote {} (two agents on the offline model). Next: `keel check {0}`, then \
         `keel serve --config {0}`.",
        path.display()
    );
    Ok(())
}

/// The file `keel check` and `keel serve` read: the one named, else `./keel.toml`.
pub(crate) fn config_path(named: Option<PathBuf>) -> PathBuf {
    named.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_FILE))
}

/// Load and check a file: its syntax and fields, then its agents built as `keel serve`
/// would build them (on an offline in-memory runtime: no store is opened), its MCP servers
/// started (and so checked) too.
pub(crate) async fn load(path: &Path) -> Result<LoadedConfig, String> {
    let loaded = Config::from_path(path).map_err(|err| err.to_string())?;
    loaded
        .agents()
        .connect(Arc::new(DefaultRuntime::offline()))
        .await
        .map_err(|err| err.to_string())?;
    Ok(loaded)
}

/// `keel check [FILE]`.
pub(crate) async fn check(path: &Path) -> Result<(), String> {
    let loaded = load(path).await?;
    print!("{}", summary(&loaded, None));
    Ok(())
}

/// Where `keel serve` actually serves, when the command line changed the file's `[server]`.
struct Served<'a> {
    url: &'a str,
    listening: SocketAddr,
    store_overridden: bool,
    /// The push targets in force (the command line's, else the file's).
    push_targets: &'a [PushTarget],
    allow_private: bool,
}

/// What a file serves, secrets masked: the server, then each agent with its path, model and
/// tools.
fn summary(loaded: &LoadedConfig, served: Option<Served<'_>>) -> String {
    let server = &loaded.server;
    let (targets, allow_private): (Vec<String>, bool) = match &served {
        Some(served) => (
            served
                .push_targets
                .iter()
                .map(ToString::to_string)
                .collect(),
            served.allow_private,
        ),
        None => (
            server
                .push
                .allow_targets
                .iter()
                .map(|t| t.get_ref().clone())
                .collect(),
            server.push.allow_private_targets,
        ),
    };
    let (base, listening, store) = match served {
        Some(served) => (
            served.url.to_owned(),
            served.listening.to_string(),
            if served.store_overridden {
                "given by --store".to_owned()
            } else {
                server.store.to_string()
            },
        ),
        None => (
            server.public_url.as_ref().map_or_else(
                || format!("http://{}:{}/", server.host, server.port),
                ToString::to_string,
            ),
            format!("{}:{}", server.host, server.port),
            server.store.to_string(),
        ),
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}: ok", loaded.path.display());
    let _ = writeln!(
        out,
        "server: {base} (listening on {listening}), store {store}"
    );
    for key in &server.api_keys {
        let _ = writeln!(
            out,
            "  api key {} -> tenant {}",
            key.key,
            key.tenant.get_ref()
        );
    }
    if targets.is_empty() {
        if allow_private {
            let _ = writeln!(out, "  push notifications may reach private addresses");
        }
    } else {
        let _ = writeln!(out, "  push notifications only to: {}", targets.join(", "));
    }
    let default = loaded.default_agent().name();
    for agent in &loaded.agents {
        let name = agent.name();
        let marker = if name == default {
            " (default, also at /)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "agent `{name}`{marker}: {}",
            AgentsServer::agent_url(&base, name)
        );
        let _ = writeln!(out, "  {}", agent.description);
        match &agent.model.api_key {
            Some(key) => {
                let _ = writeln!(out, "  model: {} (api key {key})", agent.model.id.get_ref());
            }
            None => {
                let _ = writeln!(out, "  model: {}", agent.model.id.get_ref());
            }
        }
        for builtin in &agent.tools.builtin {
            let _ = writeln!(out, "  tool (built-in): {}", builtin.as_str());
        }
        if agent.tools.run_code {
            let _ = writeln!(out, "  tool (built-in): run_code");
        }
        for tool in &agent.tools.http {
            let kind = if tool.asynchronous {
                "async http"
            } else {
                "http"
            };
            let _ = writeln!(
                out,
                "  tool ({kind}): {} {} {}",
                tool.name.get_ref(),
                tool.method.get_ref().to_ascii_uppercase(),
                tool.url
            );
            for (header, value) in &tool.headers {
                let _ = writeln!(out, "    header {header}: {value}");
            }
        }
        for sub in &agent.subagents {
            let kind = sub.kind.as_deref().unwrap_or(sub.agent.get_ref());
            let _ = writeln!(out, "  subagent: {kind} (runs `{}`)", sub.agent.get_ref());
        }
        for remote in &agent.remote_agents {
            let _ = writeln!(
                out,
                "  remote agent: {} at {}",
                remote.name.get_ref(),
                remote.url
            );
        }
        for (name, server) in loaded.mcp_servers_of(agent) {
            let _ = writeln!(out, "  mcp server: {name} ({})", server.shown());
        }
    }
    out
}

/// What the command line sets over the file's `[server]` (flags given explicitly or through
/// their environment variables).
#[derive(Debug, Default)]
pub(crate) struct ServerOverrides {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub public_url: Option<String>,
    pub store: Option<String>,
    pub redis_prefix: Option<String>,
    pub api_keys: Option<Vec<(String, AuthContext)>>,
    pub allow_private_push_targets: bool,
    pub push_targets: Option<Vec<PushTarget>>,
    pub lease_ttl: Option<Duration>,
    pub async_tool_timeout: Option<Duration>,
    pub drain_timeout: Option<Duration>,
    pub instance_id: Option<String>,
    pub limits: Limits,
    pub max_threads: usize,
    pub max_threads_per_tenant: usize,
    pub max_queued_per_thread: usize,
    pub max_queued_per_tenant: usize,
    /// The connection deadlines and cap: the file's, with the flags given over them.
    pub connections: keel::transport::ConnectionLimits,
    /// Whether `--metrics` asked for `/metrics` (the file's `[server] metrics` may too).
    pub metrics: bool,
    /// `--console` / `--no-console`, over the file's `[server] console`.
    pub console: Option<bool>,
}

/// `keel serve` with a file: every agent under `/agents/{name}/`, the default also at `/`.
pub(crate) async fn serve(loaded: LoadedConfig, overrides: ServerOverrides) -> Result<(), String> {
    let server = &loaded.server;
    let host = overrides.host.unwrap_or_else(|| server.host.clone());
    let port = overrides.port.unwrap_or(server.port);
    let addr: SocketAddr = format!("{host}:{port}")
        .parse()
        .or_else(|_| format!("[{host}]:{port}").parse())
        .map_err(|_| {
            format!("`{host}` is not an IP address to listen on (try 127.0.0.1 or 0.0.0.0)")
        })?;
    let store_overridden = overrides.store.is_some();
    let store_spec = overrides
        .store
        .unwrap_or_else(|| server.store.value().to_owned());
    let mut store = StoreConfig::parse(&store_spec).map_err(|err| err.to_string())?;
    if let StoreConfig::Redis { prefix, .. } = &mut store {
        *prefix = overrides
            .redis_prefix
            .unwrap_or_else(|| server.redis_prefix.clone());
    }
    // Held until the server has stopped: no other `keel serve` runs on this SQLite file.
    let (_owner, instance_id) = crate::claim_store(&store, overrides.instance_id.as_deref())?;
    let keys = match overrides.api_keys {
        Some(keys) => keys,
        None => server
            .api_keys
            .iter()
            .map(|k| {
                let (app, user) = k.tenant.get_ref().split_once('/').unwrap_or_default();
                (k.key.value().to_owned(), AuthContext::new(app, user))
            })
            .collect(),
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| format!("cannot listen on {addr}: {err}"))?;
    let local = listener.local_addr().map_err(|err| err.to_string())?;
    let secured = !keys.is_empty();
    let runtime = crate::open_runtime(&store, None, keys).await?;
    // A public URL from the environment may hold a secret: it is printed masked.
    let (mut url, mut shown) = match (overrides.public_url, &server.public_url) {
        (Some(url), _) => (url.clone(), url),
        (None, Some(from_file)) => (from_file.value().to_owned(), from_file.to_string()),
        (None, None) => (format!("http://{local}/"), format!("http://{local}/")),
    };
    for url in [&mut url, &mut shown] {
        if !url.ends_with('/') {
            url.push('/');
        }
    }
    let lease_ttl = overrides
        .lease_ttl
        .unwrap_or(Duration::from_secs_f64(server.lease_ttl_seconds));
    let async_tool_timeout = overrides
        .async_tool_timeout
        .unwrap_or(Duration::from_secs_f64(server.async_tool_timeout_seconds));
    let drain = overrides
        .drain_timeout
        .unwrap_or(Duration::from_secs_f64(server.drain_timeout_seconds));
    let base = url.clone();
    let (max_concurrent_threads, max_threads_per_tenant) =
        (overrides.max_threads, overrides.max_threads_per_tenant);
    let (max_queued_per_thread, max_queued_per_tenant) = (
        overrides.max_queued_per_thread,
        overrides.max_queued_per_tenant,
    );
    let agents = loaded
        .agents()
        .executor_config(move |name| {
            let mut config = ExecutorConfig {
                lease_ttl,
                // Asynchronous tools call back to their own agent's callback route.
                callbacks: Some(HttpCallbacks::shared(
                    AgentsServer::agent_url(&base, name).trim_end_matches('/'),
                )),
                async_tool_timeout,
                max_concurrent_threads,
                max_threads_per_tenant,
                max_queued_per_thread,
                max_queued_per_tenant,
                drain_timeout: drain,
                ..ExecutorConfig::default()
            };
            // One holder per agent: each agent's executor drives only its own threads.
            if let Some(id) = &instance_id {
                config.holder = format!("{id}/{name}");
            }
            config
        })
        .connect(Arc::new(runtime))
        .await
        .map_err(|err| err.to_string())?;
    let allow_private = overrides.allow_private_push_targets || server.push.allow_private_targets;
    let push_targets = overrides
        .push_targets
        .unwrap_or_else(|| server.push.targets());
    let mut served = AgentsServer::new()
        .with_default(agents.default_agent().name.clone())
        .with_public_url(url.clone())
        .with_connection_limits(overrides.connections);
    let observed =
        crate::telemetry::observe(Some(&loaded.telemetry), overrides.metrics || server.metrics)?;
    if let Some(route) = observed.metrics {
        served = served.with_metrics(route);
    }
    let console = crate::console_served(overrides.console, server.console, local.ip());
    let traces = observed.traces;
    let mcp_stop = tokio_util::sync::CancellationToken::new();
    for agent in agents.iter() {
        if let Some(traces) = &traces {
            agent.executor.add_event_sink(traces.sink());
        }
        // Work a dead process left behind resumes now; each executor takes its own agent's.
        let resumed = agent
            .executor
            .recover_all()
            .await
            .map_err(|err| format!("cannot recover unfinished tasks: {err}"))?;
        if resumed > 0 {
            tracing::info!(agent = %agent.name, resumed, "resuming unfinished tasks");
        }
        // Work another process sharing the store leaves behind when it dies is taken over here.
        agent.executor.start_takeover();
        agent
            .executor
            .start_effects()
            .map_err(|err| format!("cannot start the effect scheduler: {err}"))?;
        let mut server = A2aServer::new(agent.executor.clone())
            .allow_private_push_targets(allow_private)
            .allow_push_targets(push_targets.iter().cloned())
            .with_limits(overrides.limits)
            .with_endpoint(EndpointSpec::compact_thread());
        if secured {
            server = server.with_security(Security::api_key_and_bearer());
        }
        // `/mcp` goes to the default agent's routes, which offer every agent there.
        if agent.name == agents.default_agent().name {
            let executors = agents.iter().map(|a| a.executor.clone()).collect();
            server = crate::mcp::mount(server, executors, &url, mcp_stop.clone())?;
            // The console reads every agent through the default one's operator routes.
            if console {
                server = server.with_console(keel::console::router());
            }
        }
        served = served.with_agent(agent.name.clone(), server);
    }
    let shutdown = crate::shutdown_signal(drain);
    let shutdown = async move {
        shutdown.await;
        mcp_stop.cancel();
    };
    // The first stdout line is the contract for scripts and tests that start `keel serve`.
    let names: Vec<String> = agents.iter().map(|a| format!("`{}`", a.name)).collect();
    println!(
        "keel: serving {} from {} at {shown} (each at {shown}agents/NAME/; `{}` also at {shown})",
        names.join(", "),
        loaded.path.display(),
        agents.default_agent().name,
    );
    let served_at = Served {
        url: &shown,
        listening: local,
        store_overridden,
        push_targets: &push_targets,
        allow_private,
    };
    eprint!("{}", summary(&loaded, Some(served_at)));
    if console {
        eprintln!("console: {shown}console/");
    }
    let result = served
        .serve(listener, shutdown)
        .await
        .map_err(|err| format!("server error: {err}"));
    crate::telemetry::flush_traces(traces).await;
    result?;
    eprintln!("keel: stopped");
    Ok(())
}
