//! The conformance agent against a real server on 127.0.0.1:0: each TCK scenario, chosen by
//! `messageId` prefix, over JSON-RPC, HTTP+JSON (REST) and their SSE streams, and over gRPC
//! (feature `grpc`) with the generated client of A2A's proto.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel::agent::AgentExecutor;
use keel::conformance::{
    self, ARTIFACT_ADDED_TEXT, ARTIFACT_TEXT, AUTH_RECEIVED_TEXT, CHUNKS, COMPLETE_TEXT,
    DELAYED_TEXT, FILE_BYTES_BASE64, FILE_MEDIA_TYPE, FILE_NAME, FILE_URL, INPUT_RECEIVED_TEXT,
    MESSAGE_RESPONSE_TEXT,
};
use keel::llm::MockLlm;
use keel::services::Services;
use keel::transport::A2aServer;
use keel_runtime::testing::eventually;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// The delay of `tck-delayed-complete` here: long enough that a non-blocking send sees the
/// task still working, short enough to keep the tests quick.
const DELAY: Duration = Duration::from_millis(1500);

/// A binding the scenarios run over; each test runs every scenario over each of them (a new
/// binding is a variant, its line here, and its arm in [`Server::request`]).
#[derive(Debug, Clone, Copy)]
enum Binding {
    JsonRpc,
    Rest,
    #[cfg(feature = "grpc")]
    Grpc,
}

const BINDINGS: &[Binding] = &[
    Binding::JsonRpc,
    Binding::Rest,
    #[cfg(feature = "grpc")]
    Binding::Grpc,
];

/// A streaming call as it was opened: the HTTP answer, or the gRPC stream.
enum Opened {
    Http(reqwest::Response),
    #[cfg(feature = "grpc")]
    Grpc(grpc::Stream),
}

struct Server {
    base: String,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start() -> Self {
        let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
        let agent = conformance::agent_with_delay(DELAY).unwrap();
        let executor = AgentExecutor::new(agent, runtime);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = conformance::with_extended_card(A2aServer::new(executor));
        let serving = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            http: reqwest::Client::new(),
            stop: Some(stop),
            serving,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.serving.await.unwrap().unwrap();
    }

    /// A JSON-RPC request, or the REST route of the same operation.
    fn request(&self, binding: Binding, method: &str, params: Value) -> reqwest::RequestBuilder {
        let request = match binding {
            Binding::JsonRpc => self.http.post(format!("{}/", self.base)).json(
                &json!({"jsonrpc": "2.0", "id": "req-1", "method": method, "params": params}),
            ),
            Binding::Rest => {
                let id = params["id"].as_str().unwrap_or_default();
                let url = |path: String| format!("{}{path}", self.base);
                match method {
                    "SendMessage" => self.http.post(url("/message:send".into())).json(&params),
                    "SendStreamingMessage" => {
                        self.http.post(url("/message:stream".into())).json(&params)
                    }
                    "GetTask" => self.http.get(url(format!("/tasks/{id}"))),
                    "ListTasks" => self.http.get(url("/tasks".into())).query(&[(
                        "contextId",
                        params["contextId"].as_str().unwrap_or_default(),
                    )]),
                    "CancelTask" => self.http.post(url(format!("/tasks/{id}:cancel"))),
                    "SubscribeToTask" => self.http.get(url(format!("/tasks/{id}:subscribe"))),
                    other => panic!("no REST route for {other}"),
                }
            }
            #[cfg(feature = "grpc")]
            Binding::Grpc => unreachable!("gRPC calls go through `grpc`"),
        };
        request.header("A2A-Version", "1.0")
    }

    /// A unary call's result (the JSON-RPC `result`, or the REST body).
    async fn call(&self, binding: Binding, method: &str, params: Value) -> Value {
        #[cfg(feature = "grpc")]
        if let Binding::Grpc = binding {
            return grpc::call(&self.base, method, params).await;
        }
        let response = self.request(binding, method, params).send().await.unwrap();
        assert!(response.status().is_success(), "{method}: {response:?}");
        let body: Value = response.json().await.unwrap();
        match binding {
            Binding::JsonRpc => {
                assert!(body.get("error").is_none(), "{method}: {body}");
                body["result"].clone()
            }
            Binding::Rest => body,
            #[cfg(feature = "grpc")]
            Binding::Grpc => unreachable!(),
        }
    }

    /// Send `message` and answer with the task.
    async fn send(&self, binding: Binding, message: Value, configuration: Value) -> Value {
        let result = self
            .call(
                binding,
                "SendMessage",
                json!({"message": message, "configuration": configuration}),
            )
            .await;
        result["task"].clone()
    }

    /// Send a message for `scenario` (blocking) and answer with the task.
    async fn scenario(&self, binding: Binding, scenario: &str) -> Value {
        self.send(binding, message(scenario), json!({})).await
    }

    /// Answer `task`, interrupted in `scenario`, with a follow-up: the same task completes,
    /// saying `text`.
    async fn assert_follow_up_completes(
        &self,
        binding: Binding,
        scenario: &str,
        task: &Value,
        text: &str,
    ) {
        let done = self
            .send(binding, follow_up(scenario, task), json!({}))
            .await;
        assert_eq!(done["id"], task["id"]);
        assert_state(&done, "TASK_STATE_COMPLETED", binding);
        assert_eq!(status_text(&done), text);
    }

    /// SendStreamingMessage of a message for `scenario`: its stream responses, to the end.
    async fn stream_message(&self, binding: Binding, scenario: &str) -> Vec<Value> {
        self.stream(
            binding,
            "SendStreamingMessage",
            json!({"message": message(scenario)}),
        )
        .await
    }

    /// The stream responses of a streaming call, read to its end.
    async fn stream(&self, binding: Binding, method: &str, params: Value) -> Vec<Value> {
        let opened = self.open(binding, method, params).await;
        stream_responses(binding, opened).await
    }

    /// Open a streaming call; its responses are read later ([`stream_responses`]).
    async fn open(&self, binding: Binding, method: &str, params: Value) -> Opened {
        #[cfg(feature = "grpc")]
        if let Binding::Grpc = binding {
            return Opened::Grpc(grpc::open(&self.base, method, params).await);
        }
        Opened::Http(self.request(binding, method, params).send().await.unwrap())
    }
}

/// The `StreamResponse`s of a streaming call, read to its end (unwrapping JSON-RPC envelopes).
// Without the `grpc` feature the match has one arm.
#[allow(clippy::infallible_destructuring_match)]
async fn stream_responses(binding: Binding, opened: Opened) -> Vec<Value> {
    let response = match opened {
        Opened::Http(response) => response,
        #[cfg(feature = "grpc")]
        Opened::Grpc(stream) => return grpc::read(stream).await,
    };
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "not a stream: {content_type}"
    );
    let text = response.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let data: Vec<&str> = block
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            (!data.is_empty()).then(|| serde_json::from_str::<Value>(&data.join("\n")).unwrap())
        })
        .map(|event| match binding {
            Binding::JsonRpc => {
                assert!(event.get("error").is_none(), "{event}");
                event["result"].clone()
            }
            Binding::Rest => event,
            #[cfg(feature = "grpc")]
            Binding::Grpc => unreachable!(),
        })
        .collect()
}

/// The gRPC arm: each operation through A2A's generated client, its messages built from and
/// read back as the same JSON the HTTP bindings carry.
#[cfg(feature = "grpc")]
mod grpc {
    use keel::transport::grpc::proto::a2a_service_client::A2aServiceClient;
    use keel::transport::grpc::tonic::{self, Streaming};
    use keel::transport::grpc::{from_json, proto, to_json, ProtoJson};
    use serde_json::Value;

    pub(super) type Stream = Streaming<proto::StreamResponse>;

    fn request<M: ProtoJson>(params: &Value) -> tonic::Request<M> {
        let mut request = tonic::Request::new(from_json(&params.to_string()).unwrap());
        request
            .metadata_mut()
            .insert("a2a-version", "1.0".parse().unwrap());
        request
    }

    async fn client(base: &str) -> A2aServiceClient<tonic::transport::Channel> {
        A2aServiceClient::connect(base.to_owned()).await.unwrap()
    }

    pub(super) async fn call(base: &str, method: &str, params: Value) -> Value {
        let mut client = client(base).await;
        let answer = match method {
            "SendMessage" => client
                .send_message(request::<proto::SendMessageRequest>(&params))
                .await
                .map(|r| to_json(r.get_ref())),
            "GetTask" => client
                .get_task(request::<proto::GetTaskRequest>(&params))
                .await
                .map(|r| to_json(r.get_ref())),
            "ListTasks" => client
                .list_tasks(request::<proto::ListTasksRequest>(&params))
                .await
                .map(|r| to_json(r.get_ref())),
            "CancelTask" => client
                .cancel_task(request::<proto::CancelTaskRequest>(&params))
                .await
                .map(|r| to_json(r.get_ref())),
            other => panic!("no unary gRPC call for {other}"),
        };
        let mut answer = answer
            .unwrap_or_else(|status| panic!("{method}: {status:?}"))
            .unwrap();
        // proto3's JSON leaves out an empty repeated field; the HTTP bindings send `[]`.
        if method == "ListTasks" && answer.get("tasks").is_none() {
            answer["tasks"] = Value::Array(Vec::new());
        }
        integral(answer)
    }

    /// A `google.protobuf.Value` number is a double, so a data part's `42` comes back as
    /// `42.0`; read whole numbers back as the integers the HTTP bindings carry.
    fn integral(value: Value) -> Value {
        match value {
            Value::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9e15 => {
                    Value::from(f as i64)
                }
                _ => Value::Number(n),
            },
            Value::Array(items) => Value::Array(items.into_iter().map(integral).collect()),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, value)| (key, integral(value)))
                    .collect(),
            ),
            other => other,
        }
    }

    pub(super) async fn open(base: &str, method: &str, params: Value) -> Stream {
        let mut client = client(base).await;
        let opened = match method {
            "SendStreamingMessage" => {
                client
                    .send_streaming_message(request::<proto::SendMessageRequest>(&params))
                    .await
            }
            "SubscribeToTask" => {
                client
                    .subscribe_to_task(request::<proto::SubscribeToTaskRequest>(&params))
                    .await
            }
            other => panic!("no streaming gRPC call for {other}"),
        };
        opened
            .unwrap_or_else(|status| panic!("{method}: {status:?}"))
            .into_inner()
    }

    pub(super) async fn read(mut stream: Stream) -> Vec<Value> {
        let mut responses = Vec::new();
        while let Some(response) = stream.message().await.unwrap() {
            responses.push(integral(to_json(&response).unwrap()));
        }
        responses
    }
}

/// A user message whose id starts with `prefix`.
fn message(prefix: &str) -> Value {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    json!({
        "messageId": format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        "role": "ROLE_USER",
        "parts": [{"text": "scenario"}]
    })
}

/// A message for `scenario` that continues `task` (its id and context).
fn follow_up(scenario: &str, task: &Value) -> Value {
    let mut message = message(scenario);
    message["taskId"] = task["id"].clone();
    message["contextId"] = task["contextId"].clone();
    message
}

/// Assert that `task`, as `binding` answered it, is in `wanted`.
fn assert_state(task: &Value, wanted: &str, binding: Binding) {
    assert_eq!(state(task), wanted, "{binding:?}: {task}");
}

/// Assert that the stream `events` (over `binding`) ends at the state `wanted`.
fn assert_stream_ends_at(events: &[Value], wanted: &str, binding: Binding) {
    let last = events.last().and_then(streamed_state);
    assert_eq!(last, Some(wanted), "{binding:?}: {events:?}");
}

fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or_default()
}

/// The state a stream response carries, if any.
fn streamed_state(response: &Value) -> Option<&str> {
    response["statusUpdate"]["status"]["state"]
        .as_str()
        .or_else(|| response["task"]["status"]["state"].as_str())
}

fn status_text(task: &Value) -> &str {
    task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

/// A test that runs its body over every binding in turn, against one server.
macro_rules! over_every_binding {
    ($name:ident, |$server:ident, $binding:ident| $body:block) => {
        #[tokio::test]
        async fn $name() {
            let $server = Server::start().await;
            for &$binding in BINDINGS {
                $body
            }
            $server.stop().await;
        }
    };
}

/// Send `request`; the answer's JSON body.
async fn json_body(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// Poll GetTask until the task is in `wanted`.
async fn wait_for_state(server: &Server, binding: Binding, id: &Value, wanted: &str) -> Value {
    eventually(&format!("the task to reach {wanted}"), || async {
        let task = server.call(binding, "GetTask", json!({"id": id})).await;
        (state(&task) == wanted).then_some(task)
    })
    .await
}

over_every_binding!(
    complete_task_answers_with_the_fixed_message_over_every_binding,
    |server, binding| {
        let task = server.scenario(binding, "tck-complete-task").await;
        assert_state(&task, "TASK_STATE_COMPLETED", binding);
        assert_eq!(status_text(&task), COMPLETE_TEXT, "{binding:?}: {task}");
        assert_eq!(task["status"]["message"]["role"], "ROLE_AGENT");
    }
);

over_every_binding!(
    artifact_text_completes_with_a_text_artifact_over_every_binding,
    |server, binding| {
        let task = server.scenario(binding, "tck-artifact-text").await;
        assert_state(&task, "TASK_STATE_COMPLETED", binding);
        let artifacts = task["artifacts"].as_array().unwrap();
        assert_eq!(artifacts.len(), 1, "{task}");
        assert_eq!(artifacts[0]["parts"][0]["text"], ARTIFACT_TEXT);
        assert!(artifacts[0]["artifactId"].is_string());
    }
);

over_every_binding!(
    delayed_complete_blocks_until_done_or_returns_while_working,
    |server, binding| {
        let blocking = server.scenario(binding, "tck-delayed-complete").await;
        assert_eq!(state(&blocking), "TASK_STATE_COMPLETED", "{blocking}");
        assert_eq!(status_text(&blocking), DELAYED_TEXT);

        let immediate = server
            .send(
                binding,
                message("tck-delayed-complete"),
                json!({"returnImmediately": true}),
            )
            .await;
        assert!(
            matches!(
                state(&immediate),
                "TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING"
            ),
            "{binding:?}: {immediate}"
        );
        let done = wait_for_state(&server, binding, &immediate["id"], "TASK_STATE_COMPLETED").await;
        assert_eq!(status_text(&done), DELAYED_TEXT);
    }
);

over_every_binding!(
    input_required_waits_then_the_follow_up_completes_the_task,
    |server, binding| {
        let task = server.scenario(binding, "tck-input-required").await;
        assert_state(&task, "TASK_STATE_INPUT_REQUIRED", binding);
        // A follow-up that asks for input again keeps the task waiting (as the TCK's agents do).
        let again = server
            .send(binding, follow_up("tck-input-required", &task), json!({}))
            .await;
        assert_eq!(again["id"], task["id"]);
        assert_state(&again, "TASK_STATE_INPUT_REQUIRED", binding);
        server
            .assert_follow_up_completes(binding, "tck-complete-task", &task, INPUT_RECEIVED_TEXT)
            .await;
    }
);

over_every_binding!(
    reject_task_ends_rejected_with_the_reason_over_every_binding,
    |server, binding| {
        let task = server.scenario(binding, "tck-reject-task").await;
        assert_state(&task, "TASK_STATE_REJECTED", binding);
        assert!(status_text(&task).contains("rejected"), "{task}");
    }
);

/// The artifact scenarios and the one part each must end with, in A2A v1.0 JSON.
fn artifact_scenarios() -> [(&'static str, Value); 3] {
    [
        (
            "tck-artifact-file",
            json!({"raw": FILE_BYTES_BASE64, "mediaType": FILE_MEDIA_TYPE, "filename": FILE_NAME}),
        ),
        // `tck-artifact-file-url` extends `tck-artifact-file`: the longer prefix wins.
        (
            "tck-artifact-file-url",
            json!({"url": FILE_URL, "mediaType": FILE_MEDIA_TYPE, "filename": FILE_NAME}),
        ),
        (
            "tck-artifact-data",
            json!({"data": {"key": "value", "count": 42}}),
        ),
    ]
}

over_every_binding!(
    file_url_and_data_artifacts_complete_the_task_as_a2a_parts_over_every_binding,
    |server, binding| {
        for (prefix, part) in artifact_scenarios() {
            let task = server.scenario(binding, prefix).await;
            assert_eq!(
                state(&task),
                "TASK_STATE_COMPLETED",
                "{binding:?} {prefix}: {task}"
            );
            assert_eq!(status_text(&task), ARTIFACT_ADDED_TEXT);
            // The run named its output: no `answer` artifact beside it.
            let artifacts = task["artifacts"].as_array().unwrap();
            assert_eq!(artifacts.len(), 1, "{binding:?} {prefix}: {task}");
            assert_eq!(artifacts[0]["parts"], json!([part]), "{binding:?} {prefix}");
        }
    }
);

over_every_binding!(
    artifacts_of_each_kind_stream_as_one_update_before_the_completed_status,
    |server, binding| {
        for (prefix, part) in artifact_scenarios() {
            let events = server.stream_message(binding, prefix).await;
            let updates: Vec<&Value> = events
                .iter()
                .filter_map(|e| e.get("artifactUpdate"))
                .collect();
            assert_eq!(updates.len(), 1, "{binding:?} {prefix}: {events:?}");
            assert_eq!(updates[0]["artifact"]["parts"], json!([part]));
            assert_eq!(updates[0]["lastChunk"], true);
            assert_eq!(
                events.last().and_then(streamed_state),
                Some("TASK_STATE_COMPLETED"),
                "{binding:?} {prefix}: {events:?}"
            );
        }
    }
);

over_every_binding!(
    message_response_answers_with_a_message_and_creates_no_task,
    |server, binding| {
        let result = server
            .call(
                binding,
                "SendMessage",
                json!({"message": message("tck-message-response")}),
            )
            .await;
        assert!(result.get("task").is_none(), "{binding:?}: {result}");
        let reply = &result["message"];
        assert_eq!(reply["role"], "ROLE_AGENT", "{binding:?}: {result}");
        assert_eq!(reply["parts"][0]["text"], MESSAGE_RESPONSE_TEXT);
        assert!(reply.get("taskId").is_none(), "{result}");
        assert!(reply["messageId"].is_string(), "{result}");
        // The reply names its thread, and the thread holds no task.
        let thread = reply["contextId"].as_str().expect("a contextId");
        let listed = server
            .call(binding, "ListTasks", json!({"contextId": thread}))
            .await;
        assert_eq!(listed["tasks"], json!([]), "{binding:?}: {listed}");
    }
);

over_every_binding!(
    message_response_streams_the_message_as_its_only_event,
    |server, binding| {
        let events = server.stream_message(binding, "tck-message-response").await;
        assert_eq!(events.len(), 1, "{binding:?}: {events:?}");
        assert_eq!(
            events[0]["message"]["parts"][0]["text"], MESSAGE_RESPONSE_TEXT,
            "{binding:?}: {events:?}"
        );
        assert_eq!(events[0]["message"]["role"], "ROLE_AGENT");
    }
);

over_every_binding!(
    auth_required_waits_then_the_follow_up_completes_the_task,
    |server, binding| {
        let task = server.scenario(binding, "tck-auth-required").await;
        assert_state(&task, "TASK_STATE_AUTH_REQUIRED", binding);
        let fetched = server
            .call(binding, "GetTask", json!({"id": task["id"]}))
            .await;
        assert_eq!(state(&fetched), "TASK_STATE_AUTH_REQUIRED", "{fetched}");
        server
            .assert_follow_up_completes(binding, "tck-auth-required", &task, AUTH_RECEIVED_TEXT)
            .await;
    }
);

over_every_binding!(
    auth_required_ends_the_stream_at_the_interrupted_state,
    |server, binding| {
        let events = server.stream_message(binding, "tck-auth-required").await;
        assert_stream_ends_at(&events, "TASK_STATE_AUTH_REQUIRED", binding);
    }
);

over_every_binding!(
    a_chunked_artifact_streams_appended_chunks_and_the_task_keeps_their_concatenation,
    |server, binding| {
        let events = server
            .stream_message(binding, "tck-stream-artifact-chunked")
            .await;
        let task_id = events[0]["task"]["id"].clone();
        let updates: Vec<&Value> = events
            .iter()
            .filter_map(|e| e.get("artifactUpdate"))
            .collect();
        assert_eq!(updates.len(), 2, "{binding:?}: {events:?}");
        let id = &updates[0]["artifact"]["artifactId"];
        assert!(id.is_string(), "{events:?}");
        assert_eq!(updates[1]["artifact"]["artifactId"], *id);
        assert_ne!(updates[0]["append"], true, "{events:?}");
        assert_ne!(updates[0]["lastChunk"], true, "{events:?}");
        assert_eq!(updates[1]["append"], true, "{events:?}");
        assert_eq!(updates[1]["lastChunk"], true, "{events:?}");
        for (update, chunk) in updates.iter().zip(CHUNKS) {
            assert_eq!(update["artifact"]["parts"], json!([{"text": chunk}]));
        }
        assert_stream_ends_at(&events, "TASK_STATE_COMPLETED", binding);
        let task = server
            .call(binding, "GetTask", json!({"id": task_id}))
            .await;
        let artifacts = task["artifacts"].as_array().unwrap();
        assert_eq!(artifacts.len(), 1, "{binding:?}: {task}");
        assert_eq!(artifacts[0]["artifactId"], *id);
        let text: String = artifacts[0]["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert_eq!(text, CHUNKS.concat(), "{task}");
    }
);

over_every_binding!(
    streams_start_with_the_task_and_end_with_the_final_state_in_order,
    |server, binding| {
        let events = server.stream_message(binding, "tck-delayed-complete").await;
        let task = &events[0]["task"];
        assert!(
            task["id"].is_string(),
            "the first event is the task: {events:?}"
        );
        let states: Vec<&str> = events.iter().filter_map(streamed_state).collect();
        let working = states.iter().position(|s| *s == "TASK_STATE_WORKING");
        let completed = states.iter().position(|s| *s == "TASK_STATE_COMPLETED");
        assert!(
            working.is_some() && working < completed,
            "{binding:?}: {states:?}"
        );
        assert_eq!(states.last(), Some(&"TASK_STATE_COMPLETED"), "{states:?}");
        // The answer's artifact arrives whole, before the final status.
        let artifact_at = events
            .iter()
            .position(|e| e.get("artifactUpdate").is_some())
            .expect("an artifact update");
        let update = &events[artifact_at]["artifactUpdate"];
        assert_eq!(update["taskId"], task["id"]);
        assert_eq!(update["artifact"]["parts"][0]["text"], DELAYED_TEXT);
        assert_eq!(update["lastChunk"], true);
        assert_ne!(update["append"], true);
        assert_eq!(artifact_at, events.len() - 2, "{events:?}");
    }
);

over_every_binding!(
    a_long_running_task_can_be_resubscribed_and_its_stream_ends_when_canceled,
    |server, binding| {
        let task = server
            .send(
                binding,
                message("tck-long-running"),
                json!({"returnImmediately": true}),
            )
            .await;
        wait_for_state(&server, binding, &task["id"], "TASK_STATE_WORKING").await;
        // The subscription is open once its headers are in; the cancel then reaches it.
        let subscription = server
            .open(binding, "SubscribeToTask", json!({"id": task["id"]}))
            .await;
        let canceled = server
            .call(binding, "CancelTask", json!({"id": task["id"]}))
            .await;
        assert_eq!(state(&canceled), "TASK_STATE_CANCELED", "{canceled}");
        let events = stream_responses(binding, subscription).await;
        assert_eq!(events[0]["task"]["id"], task["id"], "{events:?}");
        assert_eq!(
            streamed_state(&events[0]),
            Some("TASK_STATE_WORKING"),
            "{events:?}"
        );
        assert_stream_ends_at(&events, "TASK_STATE_CANCELED", binding);
    }
);

#[tokio::test]
async fn the_card_declares_streaming_push_notifications_and_the_extended_card() {
    let server = Server::start().await;
    let card = json_body(
        server
            .http
            .get(format!("{}/.well-known/agent-card.json", server.base)),
    )
    .await;
    assert_eq!(card["name"], "keel-conformance");
    assert_eq!(card["capabilities"]["streaming"], true, "{card}");
    assert_eq!(card["capabilities"]["pushNotifications"], true, "{card}");
    assert_eq!(card["capabilities"]["extendedAgentCard"], true, "{card}");
    server.stop().await;
}

#[tokio::test]
async fn message_response_reaches_a_v03_client_as_a_message() {
    let server = Server::start().await;
    let body = json_body(server.http.post(format!("{}/", server.base)).json(&json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {"message": {
            "kind": "message",
            "messageId": "tck-message-response-v03",
            "role": "user",
            "parts": [{"kind": "text", "text": "scenario"}]
        }}
    })))
    .await;
    let reply = &body["result"];
    assert_eq!(reply["kind"], "message", "{body}");
    assert_eq!(reply["role"], "agent", "{body}");
    assert_eq!(reply["parts"][0]["text"], MESSAGE_RESPONSE_TEXT, "{body}");
    server.stop().await;
}
