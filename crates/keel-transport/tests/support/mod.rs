//! A real A2A server on 127.0.0.1:0 for the integration tests: the echo agent with a
//! cancellable `sleep` tool and the `ask_human` hand-off, and helpers to read SSE answers.

#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, ExecutorConfig, FnTool};
use keel_core::{AgentCard, AgentSkill};
use keel_llm::MockLlm;
use keel_runtime::{ApiKeyAuthService, AuthContext, Services};
use keel_transport::A2aServer;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Alice's API key: she is `alice` of tenant `acme` (see [`two_tenants`]).
pub const ALICE: &str = "key-alice";
/// Bob's API key: he is `bob` of tenant `globex` (see [`two_tenants`]).
pub const BOB: &str = "key-bob";

/// Where the agent card is served.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// A message that makes the agent sleep 30 s (until canceled).
pub const SLEEP_30: &str = "/sleep {\"seconds\": 30}";

/// Two tenants, each proven by an API key: [`ALICE`] (`acme`) and [`BOB`] (`globex`).
pub fn two_tenants() -> ApiKeyAuthService {
    ApiKeyAuthService::new(AuthContext::new("local", "operator"))
        .with_key(ALICE, AuthContext::new("acme", "alice"))
        .with_key(BOB, AuthContext::new("globex", "bob"))
}

/// In-memory services over `llm` whose callers are the [`two_tenants`].
pub fn two_tenant_runtime(llm: MockLlm) -> Arc<Services> {
    Arc::new(Services::in_memory(Arc::new(llm)).with_auth(two_tenants()))
}

pub fn agent() -> Agent {
    let card = AgentCard::new("echo", "Echoes what it hears", "http://unused").with_skill(
        AgentSkill::new("echo", "Repeat the message")
            .with_tags(["demo"])
            .with_example("hello"),
    );
    let sleep = FnTool::new(
        "sleep",
        "Sleep for some seconds; stops early when the run is canceled",
        json!({
            "type": "object",
            "properties": {"seconds": {"type": "number"}},
            "required": ["seconds"]
        }),
        |args, ctx| async move {
            let seconds = args["seconds"].as_f64().unwrap_or(0.0);
            tokio::select! {
                () = ctx.cancel.cancelled() => Ok(json!("interrupted")),
                () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => Ok(json!("slept")),
            }
        },
    );
    Agent::builder(card)
        .instructions("Repeat what the user says.")
        .tool(sleep)
        .human_handoff(true)
        .build()
        .expect("the test agent builds")
}

pub struct TestServer {
    pub base: String,
    pub http: reqwest::Client,
    pub executor: AgentExecutor,
    stop: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
        Self::start_with(runtime, |server| server).await
    }

    /// A server over `runtime`, configured by `configure`.
    pub async fn start_with(
        runtime: Arc<dyn keel_runtime::Runtime>,
        configure: impl FnOnce(A2aServer) -> A2aServer,
    ) -> Self {
        // The tests' runs are sleeps that outlast any drain: a short one keeps `stop` quick.
        let config = ExecutorConfig {
            drain_timeout: Duration::from_millis(100),
            ..ExecutorConfig::default()
        };
        let executor = AgentExecutor::with_config(agent(), runtime, config);
        Self::start_with_executor(executor, configure).await
    }

    /// A server over `executor` (an executor tuned by the test), configured by `configure`.
    pub async fn start_with_executor(
        executor: AgentExecutor,
        configure: impl FnOnce(A2aServer) -> A2aServer,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(configure(A2aServer::new(executor.clone())).serve(
            listener,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            base,
            http: reqwest::Client::new(),
            executor,
            stop: Some(stop),
            serving: Some(serving),
        }
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(serving) = self.serving.take() {
            serving.await.unwrap().unwrap();
        }
    }

    /// GET `path` with `A2A-Version: 1.0`; the JSON body.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get_json_as(Some("1.0"), path).await
    }

    /// GET `path` with the given `A2A-Version` (none: a v0.3 caller); the JSON body.
    pub async fn get_json_as(&self, version: Option<&str>, path: &str) -> Value {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(version) = version {
            request = request.header("A2A-Version", version);
        }
        request.send().await.unwrap().json().await.unwrap()
    }

    /// The agent card, as a v1.0 caller reads it.
    pub async fn card(&self) -> Value {
        self.get_json(CARD_PATH).await
    }

    /// A JSON-RPC call with `A2A-Version: 1.0` (or the given version, or none).
    pub async fn rpc_with(
        &self,
        version: Option<&str>,
        method: &str,
        params: Value,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .post(format!("{}/", self.base))
            .json(&json!({"jsonrpc": "2.0", "id": "req-1", "method": method, "params": params}));
        if let Some(version) = version {
            request = request.header("A2A-Version", version);
        }
        request.send().await.unwrap()
    }

    /// A unary JSON-RPC v1.0 call; the whole response.
    pub async fn rpc(&self, method: &str, params: Value) -> Value {
        self.rpc_with(Some("1.0"), method, params)
            .await
            .json()
            .await
            .unwrap()
    }
}

/// Send [`SLEEP_30`] through `client` and return at once, while the task runs.
pub async fn start_sleeping(client: &dyn keel_transport::AgentTransport) -> keel_core::Task {
    client
        .send_message(
            keel_core::Message::user(SLEEP_30),
            keel_transport::SendMessageOptions {
                return_immediately: true,
                ..Default::default()
            },
        )
        .await
        .unwrap()
}

pub fn user_message(text: &str) -> Value {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    json!({
        "messageId": format!("m-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        "role": "ROLE_USER",
        "parts": [{"text": text}]
    })
}

/// The SSE events of a finished response: `(event name, data as JSON)`.
pub async fn sse_events(response: reqwest::Response) -> Vec<(String, Value)> {
    assert!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "not an event stream: {:?}",
        response.headers()
    );
    let text = response.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let mut name = "message".to_owned();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.trim_start().to_owned());
                }
            }
            (!data.is_empty()).then(|| (name, serde_json::from_str(&data.join("\n")).unwrap()))
        })
        .collect()
}
