//! A real A2A server on 127.0.0.1:0 for the integration tests: the echo agent with a
//! cancellable `sleep` tool and the `ask_human` hand-off, and helpers to read SSE answers.

#![allow(dead_code)] // each test file uses a different subset

pub mod operator;

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, ExecutorConfig, FnTool};
use keel_core::{AgentCard, AgentSkill};
use keel_llm::MockLlm;
use keel_runtime::{ApiKeyAuthService, AuthContext, Services};
use keel_transport::{A2aClient, A2aServer, Binding};
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

/// A tool named `name` whose arguments are any JSON object, that answers as `run` does.
pub fn object_tool<F, Fut>(name: &str, description: &str, run: F) -> FnTool
where
    F: Fn(Value, keel_agent::ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = keel_core::AgentResult<Value>> + Send + 'static,
{
    FnTool::new(name, description, json!({"type": "object"}), run)
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

/// An agent whose `write_record` tool needs approval (capability `records.write`); each
/// run of the tool counts in `writes`.
pub fn records_agent(writes: Arc<std::sync::atomic::AtomicUsize>) -> Agent {
    let tool = FnTool::new(
        "write_record",
        "Write a record",
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
        move |args, _ctx| {
            let writes = writes.clone();
            async move {
                writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(json!(format!(
                    "wrote {}",
                    args["id"].as_str().unwrap_or_default()
                )))
            }
        },
    )
    .with_capabilities(["records.write"]);
    Agent::builder(AgentCard::new("records", "keeps records", "http://unused"))
        .tool(tool)
        .human_handoff(true)
        // Limits no test reaches, which the operator API lists: the stop rules' step
        // limit is the tighter one.
        .max_steps(12)
        .budget(keel_core::RunBudget {
            max_steps: Some(30),
            max_input_tokens: Some(500_000),
            max_runtime_seconds: Some(600.0),
            ..keel_core::RunBudget::default()
        })
        .policy(keel_policy::CapabilityPolicy::new().with_rule(
            "records.write",
            keel_policy::CapabilityRule::RequireApproval,
        ))
        .build()
        .unwrap()
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

    /// A Keel client of this server on each HTTP binding, with the binding it speaks.
    pub fn http_clients(&self) -> [(Binding, A2aClient); 2] {
        [Binding::JsonRpc, Binding::HttpJson]
            .map(|binding| (binding, A2aClient::new(&self.base).with_binding(binding)))
    }

    /// A POST to `path` as an A2A v1.0 caller, for the test to finish and send.
    pub fn post_v1(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base))
            .header("A2A-Version", "1.0")
    }

    /// A GET of `path` as an A2A v1.0 caller, for the test to finish and send.
    pub fn get_v1(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.base))
            .header("A2A-Version", "1.0")
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
        request.json_body().await
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

    /// A unary JSON-RPC call as [`Self::rpc_with`] sends it; the answer's JSON body.
    pub async fn rpc_as(&self, version: Option<&str>, method: &str, params: Value) -> Value {
        self.rpc_with(version, method, params)
            .await
            .json()
            .await
            .unwrap()
    }

    /// A streaming JSON-RPC v1.0 call (`SendStreamingMessage`, `SubscribeToTask`), read to
    /// its end: its SSE events.
    pub async fn rpc_stream(&self, method: &str, params: Value) -> Vec<(String, Value)> {
        sse_events(self.rpc_with(Some("1.0"), method, params).await).await
    }

    /// A unary JSON-RPC v1.0 call; the whole response.
    pub async fn rpc(&self, method: &str, params: Value) -> Value {
        self.rpc_as(Some("1.0"), method, params).await
    }

    /// `SendMessage` of `message` (A2A JSON) over JSON-RPC v1.0; the whole response.
    pub async fn send_message(&self, message: Value) -> Value {
        self.rpc("SendMessage", json!({ "message": message })).await
    }
}

/// Send `request`: the answer's status and JSON body (`null` when it has none).
pub async fn status_and_json(request: reqwest::RequestBuilder) -> (reqwest::StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// GET `url` as the tenant of the API key `key` (none: no credentials).
pub async fn get_as(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
) -> (reqwest::StatusCode, Value) {
    let mut request = http.get(url);
    if let Some(key) = key {
        request = request.header("X-API-Key", key);
    }
    status_and_json(request).await
}

/// The typed errors a Keel client reads back: canceling `completed` (a task that has
/// completed) is `TaskNotCancelable`, and reading a task that does not exist `TaskNotFound`.
pub async fn assert_typed_errors(
    client: &dyn keel_transport::AgentTransport,
    completed: &keel_core::Task,
) {
    use keel_core::{AgentError, TaskId, TaskState};
    let err = client.cancel_task(&completed.id, None).await.unwrap_err();
    let not_cancelable = AgentError::TaskNotCancelable {
        task_id: completed.id.clone(),
        state: TaskState::Completed,
    };
    assert_eq!(err, not_cancelable);
    let missing = TaskId::from("no-such-task");
    let err = client.get_task(&missing, None).await.unwrap_err();
    assert_eq!(err, AgentError::TaskNotFound { task_id: missing });
}

/// Send `text` to `executor` as `auth` and wait for the task, which must complete.
pub async fn completed_task(
    executor: &AgentExecutor,
    auth: &AuthContext,
    text: &str,
) -> keel_core::Task {
    let task = executor
        .send_message(auth, keel_core::Message::user(text), Default::default())
        .await
        .unwrap();
    assert_eq!(task.state(), keel_core::TaskState::Completed, "{task:?}");
    task
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

/// Sending a request and reading its JSON body in one step, for the many tests that only
/// look at the answer (a transport or parse failure fails the test).
pub trait SendJson {
    /// Send the request; the answer's body as JSON.
    fn json_body(self) -> impl std::future::Future<Output = Value> + Send;

    /// Send the request, assert that it is answered with `status`; the body as JSON.
    fn json_with_status(
        self,
        status: reqwest::StatusCode,
    ) -> impl std::future::Future<Output = Value> + Send;
}

impl SendJson for reqwest::RequestBuilder {
    async fn json_body(self) -> Value {
        self.send().await.unwrap().json().await.unwrap()
    }

    async fn json_with_status(self, status: reqwest::StatusCode) -> Value {
        let response = self.send().await.unwrap();
        assert_eq!(response.status(), status, "{response:?}");
        response.json().await.unwrap()
    }
}

/// A JSON-RPC WebSocket on a test server's `/ws`.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Open the JSON-RPC WebSocket of the server at `base` as an A2A v1.0 caller, proven by
/// `api_key` (`X-API-Key`) when one is given.
pub async fn connect_ws(base: &str, api_key: Option<&str>) -> Socket {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}/ws", base.replacen("http://", "ws://", 1));
    let mut request = url.into_client_request().unwrap();
    let headers = request.headers_mut();
    headers.insert("A2A-Version", "1.0".parse().unwrap());
    if let Some(key) = api_key {
        headers.insert("X-API-Key", key.parse().unwrap());
    }
    let (socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    socket
}

/// Send one JSON-RPC request on `socket`.
pub async fn send_ws(socket: &mut Socket, id: &str, method: &str, params: Value) {
    use futures::SinkExt;
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    socket
        .send(tokio_tungstenite::tungstenite::Message::text(
            request.to_string(),
        ))
        .await
        .unwrap();
}

/// The next JSON-RPC frame on `socket` (control frames are read past), within `within`.
pub async fn next_ws(socket: &mut Socket, within: Duration) -> Value {
    use futures::StreamExt;
    loop {
        let frame = tokio::time::timeout(within, socket.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .unwrap();
        if let tokio_tungstenite::tungstenite::Message::Text(text) = frame {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

/// One field of each interface the agent card lists in `supportedInterfaces`.
pub fn interface_fields<'a>(card: &'a Value, field: &str) -> Vec<&'a str> {
    card["supportedInterfaces"]
        .as_array()
        .expect("the card lists its interfaces")
        .iter()
        .map(|i| i[field].as_str().unwrap())
        .collect()
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

/// A gRPC client that names A2A 1.0 on every call that names no version, as A2A's SDKs do
/// (a call without `a2a-version` is A2A 0.3, which the gRPC binding does not speak).
#[cfg(feature = "grpc")]
pub type GrpcClient = keel_transport::grpc::proto::a2a_service_client::A2aServiceClient<
    keel_transport::grpc::tonic::service::interceptor::InterceptedService<
        keel_transport::grpc::tonic::transport::Channel,
        fn(
            keel_transport::grpc::tonic::Request<()>,
        )
            -> Result<keel_transport::grpc::tonic::Request<()>, keel_transport::grpc::tonic::Status>,
    >,
>;

/// A [`GrpcClient`] of the server at `base`.
#[cfg(feature = "grpc")]
pub async fn grpc_client(base: &str) -> GrpcClient {
    use keel_transport::grpc::tonic::{transport::Channel, Request, Status};
    fn v1(mut request: Request<()>) -> Result<Request<()>, Status> {
        if !request.metadata().contains_key("a2a-version") {
            request
                .metadata_mut()
                .insert("a2a-version", "1.0".parse().unwrap());
        }
        Ok(request)
    }
    let channel = Channel::from_shared(base.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    keel_transport::grpc::proto::a2a_service_client::A2aServiceClient::with_interceptor(
        channel,
        v1 as fn(Request<()>) -> Result<Request<()>, Status>,
    )
}
