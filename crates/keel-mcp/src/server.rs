//! [`McpServer`]: one MCP server's connection, started on demand and started again when the
//! server went away (a stdio process that exited, an HTTP session that broke).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use rmcp::handler::client::ClientHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, Implementation, NumberOrString,
    ProgressNotificationParam, ProgressToken, RequestParamsMeta as _,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::ServiceExt as _;
use tokio::io::AsyncBufReadExt as _;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::http_client::TracingClient;
use crate::spec::{ServerSpec, TransportSpec};
use crate::McpError;

/// Lines of a stdio server's stderr kept to explain why it did not start.
const STDERR_LINES: usize = 20;

/// How long a server that failed to start has to finish writing its stderr.
const STDERR_WAIT: Duration = Duration::from_secs(2);

type Client = RunningService<RoleClient, Handler>;

/// Where a call's progress notifications go: the sender its caller gave, by the call's
/// progress token.
type ProgressRoutes = Arc<StdMutex<HashMap<ProgressToken, ProgressSender>>>;

/// The receiving end of a call's progress notifications.
pub(crate) type ProgressSender = tokio::sync::mpsc::UnboundedSender<ProgressNotificationParam>;

/// Keel's side of a connection: who it says it is, where the server's progress
/// notifications go, and what its `tools/list_changed` notifications advance.
#[derive(Clone)]
struct Handler {
    info: ClientConfig,
    progress: ProgressRoutes,
    tools_generation: Arc<AtomicU64>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let routes = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        // A report for a call that has ended (or was never ours) goes nowhere.
        if let Some(sender) = routes.get(&params.progress_token) {
            let _ = sender.send(params);
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // Whoever made tools of the list sees the number move and lists them again.
        self.tools_generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// Removes a call's progress route when the call ends, however it ends.
struct Route<'a> {
    routes: &'a ProgressRoutes,
    token: ProgressToken,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.token);
    }
}

/// One connected MCP server. Clone the `Arc` to share it between agents: they share its
/// process (or HTTP session).
pub struct McpServer {
    spec: ServerSpec,
    client: Mutex<Option<Running>>,
    /// The tail of the current process's stderr.
    stderr: Arc<StdMutex<VecDeque<String>>>,
    /// The calls waiting for progress, kept across restarts of the connection.
    progress: ProgressRoutes,
    /// The number in the next call's progress token.
    next_token: AtomicU64,
    /// Moves when the server's tool list may have changed: it said so
    /// (`notifications/tools/list_changed`), or it was started again.
    tools_generation: Arc<AtomicU64>,
}

/// The live connection and, for a stdio server, its process id.
struct Running {
    client: Client,
    pid: Option<u32>,
}

/// The W3C trace context a call carries: the caller's `traceparent` and `tracestate`.
pub(crate) struct Trace {
    /// The `traceparent` value.
    pub(crate) parent: String,
    /// The `tracestate` value, passed along unchanged when the run has one.
    pub(crate) state: Option<String>,
}

/// How a call ended, short of a result.
pub(crate) enum CallError {
    /// The caller's token fired first.
    Canceled,
    /// Anything else, ready for the model to read.
    Failed(McpError),
}

impl McpServer {
    /// Start the server and complete the MCP handshake: an error names the server and its
    /// command (or URL) and says why, with the end of what a stdio server printed on stderr.
    pub async fn start(spec: ServerSpec) -> Result<Arc<Self>, McpError> {
        let server = Arc::new(Self {
            spec,
            client: Mutex::new(None),
            stderr: Arc::default(),
            progress: Arc::default(),
            next_token: AtomicU64::new(1),
            tools_generation: Arc::default(),
        });
        {
            let mut slot = server.client.lock().await;
            *slot = Some(server.connect().await?);
        }
        Ok(server)
    }

    /// Its spec.
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// The process id of a stdio server while it runs (`None` for HTTP, or before a restart).
    pub async fn process_id(&self) -> Option<u32> {
        let slot = self.client.lock().await;
        slot.as_ref()
            .filter(|running| !running.client.peer().is_transport_closed())
            .and_then(|running| running.pid)
    }

    /// A number that moves whenever the server's tool list may have changed since: the
    /// server sent `notifications/tools/list_changed`, or it was started again. Read it
    /// before [`McpServer::list_tools`]; a list made then is stale once the number moved.
    pub fn tools_generation(&self) -> u64 {
        self.tools_generation.load(Ordering::SeqCst)
    }

    /// Every tool the server lists (all pages), before the allow and deny lists.
    pub async fn list_tools(&self) -> Result<Vec<rmcp::model::Tool>, McpError> {
        let peer = self.peer().await?;
        peer.list_all_tools()
            .await
            .map_err(|err| McpError::Request {
                server: self.spec.name.clone(),
                reason: describe(&err),
            })
    }

    /// Close the connection (a stdio server's process is asked to exit, then killed).
    pub async fn shutdown(&self) {
        let running = self.client.lock().await.take();
        if let Some(mut running) = running {
            let _ = running
                .client
                .close_with_timeout(Duration::from_secs(5))
                .await;
        }
    }

    /// The live connection's peer, starting the server again first if it went away.
    async fn peer(&self) -> Result<rmcp::Peer<RoleClient>, McpError> {
        let mut slot = self.client.lock().await;
        if let Some(running) = slot.as_ref() {
            if !running.client.peer().is_transport_closed() {
                return Ok(running.client.peer().clone());
            }
            tracing::warn!(server = %self.spec.name, "MCP server went away; starting it again");
        }
        let running = self.connect().await?;
        if slot.is_some() {
            // A server started again may list other tools than before.
            self.tools_generation.fetch_add(1, Ordering::SeqCst);
        }
        let peer = running.client.peer().clone();
        *slot = Some(running);
        Ok(peer)
    }

    /// Call `tool` with `arguments`, within the call timeout, until `cancel` fires. Dropping
    /// the request (timeout, cancel) makes rmcp send `notifications/cancelled` for it. A
    /// connection lost during the call is started again and the call retried once when
    /// `retry` (an idempotent tool); otherwise the error says the server stopped, and the next
    /// call starts it again. The call carries a progress token: the server's progress
    /// notifications for it go to `progress`; and `trace` in its `params._meta`
    /// (`traceparent`, `tracestate`: the propagation of the OpenTelemetry MCP conventions,
    /// on every transport), which an HTTP server also gets as headers ([`TracingClient`]).
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        retry: bool,
        cancel: &CancellationToken,
        progress: ProgressSender,
        trace: &Trace,
    ) -> Result<CallToolResult, CallError> {
        let token = ProgressToken(NumberOrString::Number(
            self.next_token.fetch_add(1, Ordering::Relaxed) as i64,
        ));
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.clone(), progress);
        let _route = Route {
            routes: &self.progress,
            token: token.clone(),
        };
        let mut attempts = if retry { 2 } else { 1 };
        loop {
            attempts -= 1;
            let peer = tokio::select! {
                () = cancel.cancelled() => return Err(CallError::Canceled),
                peer = self.peer() => peer.map_err(CallError::Failed)?,
            };
            let mut params =
                CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
            params.set_progress_token(token.clone());
            params.set_traceparent(&trace.parent);
            if let Some(state) = &trace.state {
                params.set_tracestate(state);
            }
            let call = tokio::time::timeout(self.spec.call_timeout, peer.call_tool(params));
            let outcome = tokio::select! {
                () = cancel.cancelled() => return Err(CallError::Canceled),
                outcome = call => outcome,
            };
            let error = match outcome {
                Ok(Ok(result)) => return Ok(result),
                Err(_elapsed) => {
                    return Err(CallError::Failed(McpError::Timeout {
                        server: self.spec.name.clone(),
                        tool: tool.to_owned(),
                        after: self.spec.call_timeout,
                    }))
                }
                Ok(Err(err)) => err,
            };
            let lost = peer.is_transport_closed()
                || matches!(
                    error,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                );
            if !lost {
                return Err(CallError::Failed(McpError::Request {
                    server: self.spec.name.clone(),
                    reason: describe(&error),
                }));
            }
            if attempts == 0 {
                return Err(CallError::Failed(McpError::Stopped {
                    server: self.spec.name.clone(),
                    tool: tool.to_owned(),
                }));
            }
            tracing::warn!(server = %self.spec.name, tool, "MCP server stopped during an idempotent call; retrying once");
        }
    }

    /// Spawn (or reach) the server and run the MCP handshake, within the startup timeout.
    async fn connect(&self) -> Result<Running, McpError> {
        let started = tokio::time::timeout(self.spec.startup_timeout, self.handshake()).await;
        match started {
            Ok(Ok(running)) => Ok(running),
            Ok(Err(reason)) => Err(self.not_started(reason)),
            Err(_elapsed) => Err(self.not_started(format!(
                "no MCP handshake within {}s",
                self.spec.startup_timeout.as_secs_f64()
            ))),
        }
    }

    async fn handshake(&self) -> Result<Running, String> {
        let info = Handler {
            info: client_info(),
            progress: self.progress.clone(),
            tools_generation: self.tools_generation.clone(),
        };
        match &self.spec.transport {
            TransportSpec::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let (process, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|err| format!("cannot run it: {err}"))?;
                let pid = process.id();
                self.stderr
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                let reader = stderr.map(|stderr| self.keep_stderr(stderr));
                match info.serve(process).await {
                    Ok(client) => Ok(Running { client, pid }),
                    Err(err) => {
                        // The failed transport was dropped, which kills the process: its
                        // stderr ends soon, and what it said explains the failure.
                        if let Some(reader) = reader {
                            let _ = tokio::time::timeout(STDERR_WAIT, reader).await;
                        }
                        Err(err.to_string())
                    }
                }
            }
            TransportSpec::Http { url, headers } => {
                let mut custom = HashMap::new();
                for header in headers {
                    let name = http::HeaderName::from_bytes(header.name.as_bytes())
                        .map_err(|_| format!("`{}` is not a header name", header.name))?;
                    let mut value = http::HeaderValue::from_str(&header.value).map_err(|_| {
                        format!("the value of header `{}` is not valid", header.name)
                    })?;
                    value.set_sensitive(header.secret);
                    custom.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.clone())
                    .custom_headers(custom);
                ensure_crypto_provider();
                let transport =
                    StreamableHttpClientTransport::with_client(TracingClient::new()?, config);
                let client = info.serve(transport).await.map_err(|err| err.to_string())?;
                Ok(Running { client, pid: None })
            }
        }
    }

    /// Keep the last lines a stdio server writes on stderr (and drain the pipe, so a chatty
    /// server never blocks on it).
    fn keep_stderr(&self, stderr: tokio::process::ChildStderr) -> tokio::task::JoinHandle<()> {
        let tail = self.stderr.clone();
        let server = self.spec.name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(server = %server, "{line}");
                let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() == STDERR_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        })
    }

    fn not_started(&self, reason: String) -> McpError {
        let tail: Vec<String> = self
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        McpError::NotStarted {
            server: self.spec.name.clone(),
            shown: self.spec.shown.clone(),
            reason,
            stderr: tail.join("\n"),
        }
    }
}

/// Who Keel says it is in the handshake.
fn client_info() -> ClientConfig {
    let mut info = ClientConfig::default();
    info.client_info = Implementation::new("keel", env!("CARGO_PKG_VERSION"));
    info
}

/// An rmcp error as one line, without the request it came from (which may hold arguments).
fn describe(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(data) => format!("{} (code {})", data.message, data.code.0),
        other => other.to_string(),
    }
}

/// rmcp's HTTP client is reqwest 0.13 built with rustls and no crypto provider (so that
/// aws-lc does not come in): it uses the process's default provider, which must be set
/// before the first client is built. Keel's is ring, as for its own reqwest 0.12.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first: either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
