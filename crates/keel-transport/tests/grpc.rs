//! The gRPC binding (feature `grpc`) against a real server, with the generated tonic client of
//! A2A's proto: the card's three interfaces, streams (SendStreamingMessage, SubscribeToTask),
//! errors as statuses with `ErrorInfo`, credentials in metadata and tenants kept apart, the
//! push config operations and the extended card.

mod support;

use std::sync::Arc;

use keel_agent::AgentExecutor;
use keel_core::AgentCard;
use keel_llm::MockLlm;
use keel_runtime::Services;
use keel_transport::grpc::tonic::{Code, Request, Status, Streaming};
use keel_transport::grpc::tonic_types::StatusExt;
use keel_transport::grpc::{from_json, proto, to_json, ProtoJson};
use keel_transport::{A2aServer, AgentsServer, Security};
use serde_json::{json, Value};
use support::{sse_events, user_message, GrpcClient, SendJson, TestServer, ALICE, BOB, SLEEP_30};

/// The echo agent's server, and a gRPC client of it.
async fn serve() -> (TestServer, GrpcClient) {
    let server = TestServer::start().await;
    let grpc = support::grpc_client(&server.base).await;
    (server, grpc)
}

/// A request message from its A2A JSON.
fn message<M: ProtoJson>(json: Value) -> M {
    from_json(&json.to_string()).unwrap()
}

/// A request carrying the API key `key` in its metadata.
fn as_caller<M>(key: &str, message: M) -> Request<M> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-api-key", key.parse().unwrap());
    request
}

/// The events of a stream, as A2A JSON, until it ends.
async fn drain(mut stream: Streaming<proto::StreamResponse>) -> Vec<Value> {
    let mut events = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        events.push(to_json(&event).unwrap());
    }
    events
}

/// SubscribeToTask for the task `id`: its stream, or the status refusing it.
async fn subscribe(
    grpc: &mut GrpcClient,
    id: &str,
) -> Result<Streaming<proto::StreamResponse>, Status> {
    let request = proto::SubscribeToTaskRequest {
        id: id.to_owned(),
        ..Default::default()
    };
    Ok(grpc.subscribe_to_task(request).await?.into_inner())
}

/// CancelTask for the task `id`: the task as canceled, or the status refusing it.
async fn cancel(grpc: &mut GrpcClient, id: &str) -> Result<proto::Task, Status> {
    let request = proto::CancelTaskRequest {
        id: id.to_owned(),
        ..Default::default()
    };
    Ok(grpc.cancel_task(request).await?.into_inner())
}

/// Send [`SLEEP_30`] without waiting: the task, running.
async fn start_sleeping(grpc: &mut GrpcClient) -> proto::Task {
    let request = message::<proto::SendMessageRequest>(json!({
        "message": user_message(SLEEP_30),
        "configuration": {"returnImmediately": true}
    }));
    sent_task(grpc, request).await
}

/// Send `request`; the task SendMessage answers with.
async fn sent_task(
    grpc: &mut GrpcClient,
    request: impl keel_transport::grpc::tonic::IntoRequest<proto::SendMessageRequest>,
) -> proto::Task {
    let sent = grpc.send_message(request).await.unwrap().into_inner();
    let Some(proto::send_message_response::Payload::Task(task)) = sent.payload else {
        panic!("SendMessage answers with the task");
    };
    task
}

/// A status of `code` whose `ErrorInfo.reason` is `reason`: an A2A error as gRPC carries it.
fn assert_status(status: &Status, code: Code, expected_reason: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(reason(status), expected_reason, "{status:?}");
}

/// The `ErrorInfo.reason` of a status.
fn reason(status: &Status) -> String {
    status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
        .unwrap_or_default()
}

fn secured_runtime() -> Arc<Services> {
    support::two_tenant_runtime(MockLlm::new())
}

#[tokio::test]
async fn the_card_lists_jsonrpc_http_json_and_grpc_on_the_one_listener() {
    let server = TestServer::start().await;
    let card: Value = server.card().await;
    let interfaces: Vec<(String, String, String)> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let field = |name: &str| i[name].as_str().unwrap().to_owned();
            (
                field("protocolBinding"),
                field("protocolVersion"),
                field("url"),
            )
        })
        .collect();
    let host_port = server.base.trim_start_matches("http://").to_owned();
    let v1 = |binding: &str, url: String| (binding.to_owned(), "1.0".to_owned(), url);
    assert_eq!(
        interfaces[..3],
        [
            v1("JSONRPC", format!("{}/", server.base)),
            v1("HTTP+JSON", server.base.clone()),
            v1("GRPC", host_port),
        ],
        "{card}"
    );
    server.stop().await;
}

#[tokio::test]
async fn send_streaming_message_streams_the_task_then_its_updates_to_completed() {
    let (server, mut grpc) = serve().await;
    let stream = grpc
        .send_streaming_message(message::<proto::SendMessageRequest>(
            json!({"message": user_message("hello over grpc")}),
        ))
        .await
        .unwrap()
        .into_inner();
    let events = drain(stream).await;
    let first = &events[0]["task"];
    assert!(first["id"].is_string(), "{events:?}");
    assert_eq!(first["history"][0]["parts"][0]["text"], "hello over grpc");
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.get("artifactUpdate").is_some()),
        "the echo arrives as an artifact: {events:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn subscribe_follows_a_running_task_and_ends_with_one_canceled_event() {
    let (server, mut grpc) = serve().await;
    let task = start_sleeping(&mut grpc).await;
    let mut stream = subscribe(&mut grpc, &task.id).await.unwrap();
    // The first event is the task as it is: waiting on it is waiting for the stream to exist.
    let first = to_json(&stream.message().await.unwrap().unwrap()).unwrap();
    assert_eq!(first["task"]["id"], task.id.as_str(), "{first}");

    let canceled = cancel(&mut grpc, &task.id).await.unwrap();
    assert_eq!(
        canceled.status.unwrap().state,
        proto::TaskState::Canceled as i32
    );
    let finals: Vec<Value> = drain(stream)
        .await
        .into_iter()
        .filter_map(|e| {
            e["statusUpdate"]["status"]["state"]
                .as_str()
                .map(Value::from)
        })
        .filter(|state| state != "TASK_STATE_WORKING")
        .collect();
    assert_eq!(finals, vec![json!("TASK_STATE_CANCELED")]);
    server.stop().await;
}

#[tokio::test]
async fn subscribe_to_a_task_waiting_for_input_stays_open_until_it_is_terminal() {
    let (server, mut grpc) = serve().await;
    let task = sent_task(
        &mut grpc,
        message::<proto::SendMessageRequest>(json!({
            "message": user_message("/ask_human {\"question\": \"which city?\"}")
        })),
    )
    .await;
    assert_eq!(
        task.status.as_ref().unwrap().state,
        proto::TaskState::InputRequired as i32
    );
    let mut stream = subscribe(&mut grpc, &task.id).await.unwrap();
    let first = to_json(&stream.message().await.unwrap().unwrap()).unwrap();
    assert_eq!(
        first["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{first}"
    );
    let mut answer = user_message("Athens");
    answer["taskId"] = json!(task.id);
    sent_task(
        &mut grpc,
        message::<proto::SendMessageRequest>(json!({"message": answer})),
    )
    .await;
    let events = drain(stream).await;
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    server.stop().await;
}

/// The kind of each stream event, with its state: `task <state>`, `status <state>`,
/// `artifact`, `message`.
fn shape(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|event| {
            if let Some(task) = event.get("task") {
                format!("task {}", task["status"]["state"].as_str().unwrap_or(""))
            } else if let Some(update) = event.get("statusUpdate") {
                format!(
                    "status {}",
                    update["status"]["state"].as_str().unwrap_or("")
                )
            } else if event.get("artifactUpdate").is_some() {
                "artifact".to_owned()
            } else {
                "message".to_owned()
            }
        })
        .collect()
}

#[tokio::test]
async fn a_fast_task_streams_the_same_events_on_every_binding() {
    let (server, mut grpc) = serve().await;
    let mut shapes = Vec::new();
    for binding in ["JSONRPC", "HTTP+JSON", "GRPC"] {
        // The fastest task: finished before its stream is read. The message is sent, and then
        // streamed again with the same id, which follows the task it made from its turn.
        let fast = user_message("fast");
        let sent = server.send_message(fast.clone()).await;
        assert_eq!(
            sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{sent}"
        );
        let request = json!({"message": fast});
        let events: Vec<Value> = match binding {
            "JSONRPC" => server
                .rpc_stream("SendStreamingMessage", request)
                .await
                .into_iter()
                .map(|(_, envelope)| envelope["result"].clone())
                .collect(),
            "HTTP+JSON" => {
                let response = server
                    .post_v1("/message:stream")
                    .json(&request)
                    .send()
                    .await
                    .unwrap();
                sse_events(response)
                    .await
                    .into_iter()
                    .map(|(_, event)| event)
                    .collect()
            }
            _ => {
                drain(
                    grpc.send_streaming_message(message::<proto::SendMessageRequest>(request))
                        .await
                        .unwrap()
                        .into_inner(),
                )
                .await
            }
        };
        shapes.push((binding, shape(&events)));
    }
    let (_, first) = &shapes[0];
    assert!(first[0].starts_with("task "), "{shapes:?}");
    assert!(first.len() >= 3, "the task, then its updates: {shapes:?}");
    assert_eq!(
        first.last().map(String::as_str),
        Some("status TASK_STATE_COMPLETED"),
        "{shapes:?}"
    );
    assert!(shapes.iter().all(|(_, shape)| shape == first), "{shapes:?}");
    server.stop().await;
}

#[tokio::test]
async fn errors_are_statuses_with_the_a2a_code_and_error_info() {
    let (server, mut grpc) = serve().await;

    let missing = grpc
        .get_task(proto::GetTaskRequest {
            id: "no-such-task".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let details = missing.get_error_details();
    let info = details.error_info().unwrap();
    assert_eq!(info.reason, "TASK_NOT_FOUND");
    assert_eq!(info.domain, "a2a-protocol.org");
    assert_eq!(info.metadata["taskId"], "no-such-task");

    let done = message::<proto::SendMessageRequest>(json!({"message": user_message("done")}));
    let done = sent_task(&mut grpc, done).await;
    // A terminal task has nothing to follow: UnsupportedOperation before any stream.
    let subscribe = subscribe(&mut grpc, &done.id).await.unwrap_err();
    assert_status(
        &subscribe,
        Code::FailedPrecondition,
        "UNSUPPORTED_OPERATION",
    );
    // So is a message to it (A2A v1.0.1, 5.4: FAILED_PRECONDITION, not UNIMPLEMENTED).
    let mut follow_up = user_message("more");
    follow_up["taskId"] = json!(done.id);
    let follow_up = grpc
        .send_message(message::<proto::SendMessageRequest>(
            json!({"message": follow_up}),
        ))
        .await
        .unwrap_err();
    assert_status(
        &follow_up,
        Code::FailedPrecondition,
        "UNSUPPORTED_OPERATION",
    );

    let cancel = cancel(&mut grpc, &done.id).await.unwrap_err();
    assert_status(&cancel, Code::FailedPrecondition, "TASK_NOT_CANCELABLE");

    let no_parts = grpc
        .send_message(message::<proto::SendMessageRequest>(
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
        ))
        .await
        .unwrap_err();
    assert_status(&no_parts, Code::InvalidArgument, "INVALID_PARAMS");

    // The binding speaks A2A 1.0, like HTTP+JSON.
    let mut old = Request::new(proto::GetTaskRequest {
        id: done.id.clone(),
        ..Default::default()
    });
    old.metadata_mut()
        .insert("a2a-version", "0.3".parse().unwrap());
    let old = grpc.get_task(old).await.unwrap_err();
    assert_status(&old, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
    // A call that names no version is A2A 0.3 (v1.0.1, 3.6.2): the same answer.
    let mut unversioned =
        keel_transport::grpc::proto::a2a_service_client::A2aServiceClient::connect(
            server.base.clone(),
        )
        .await
        .unwrap();
    let unnamed = unversioned
        .get_task(proto::GetTaskRequest {
            id: done.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&unnamed, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");

    let card = grpc
        .get_extended_agent_card(proto::GetExtendedAgentCardRequest::default())
        .await
        .unwrap_err();
    // As over JSON-RPC: a server without an extended card does not offer the operation.
    assert_status(&card, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    server.stop().await;
}

#[tokio::test]
async fn credentials_travel_as_metadata_and_tenants_never_meet() {
    let extended = AgentCard::new("echo-extended", "Echoes, with more skills", "http://unused");
    let server = TestServer::start_with(secured_runtime(), |s| {
        s.with_security(Security::api_key_and_bearer())
            .with_extended_card(extended)
    })
    .await;
    let mut grpc = support::grpc_client(&server.base).await;

    let anonymous = grpc
        .get_extended_agent_card(proto::GetExtendedAgentCardRequest::default())
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let wrong = grpc
        .get_extended_agent_card(as_caller(
            "no-such-key",
            proto::GetExtendedAgentCardRequest::default(),
        ))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);

    let card = grpc
        .get_extended_agent_card(as_caller(
            ALICE,
            proto::GetExtendedAgentCardRequest::default(),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(card.name, "echo-extended");
    assert!(card.security_schemes.contains_key("apiKey"));

    let mut bearer = Request::new(message::<proto::SendMessageRequest>(
        json!({"message": user_message("alice's")}),
    ));
    bearer
        .metadata_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let task = sent_task(&mut grpc, bearer).await;
    let get = |key: &str| {
        as_caller(
            key,
            proto::GetTaskRequest {
                id: task.id.clone(),
                ..Default::default()
            },
        )
    };
    assert_eq!(
        grpc.get_task(get(ALICE)).await.unwrap().into_inner().id,
        task.id
    );
    let as_bob = grpc.get_task(get(BOB)).await.unwrap_err();
    assert_eq!(as_bob.code(), Code::NotFound, "bob cannot see alice's task");
    let listed = grpc
        .list_tasks(as_caller(BOB, proto::ListTasksRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_size, 0);
    server.stop().await;
}

#[tokio::test]
async fn push_config_operations_create_get_list_and_delete() {
    let server = TestServer::start_with(
        Arc::new(Services::in_memory(Arc::new(MockLlm::new()))),
        |s| s.allow_private_push_targets(true),
    )
    .await;
    let mut grpc = support::grpc_client(&server.base).await;
    let task = start_sleeping(&mut grpc).await;
    let created = grpc
        .create_task_push_notification_config(message::<proto::TaskPushNotificationConfig>(
            json!({"taskId": task.id, "id": "hook-1", "url": "http://127.0.0.1:9/hook", "token": "secret"}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.id, "hook-1");
    assert_eq!(created.task_id, task.id);

    let hook_1 = || proto::GetTaskPushNotificationConfigRequest {
        task_id: task.id.clone(),
        id: "hook-1".into(),
        ..Default::default()
    };
    let got = grpc
        .get_task_push_notification_config(hook_1())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.url, "http://127.0.0.1:9/hook");
    let listed = grpc
        .list_task_push_notification_configs(proto::ListTaskPushNotificationConfigsRequest {
            task_id: task.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.configs.len(), 1);

    grpc.delete_task_push_notification_config(proto::DeleteTaskPushNotificationConfigRequest {
        task_id: task.id.clone(),
        id: "hook-1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let gone = grpc
        .get_task_push_notification_config(hook_1())
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");

    cancel(&mut grpc, &task.id).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn agents_under_a_path_list_no_grpc_interface() {
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let server = || A2aServer::new(AgentExecutor::new(support::agent(), runtime.clone()));
    let agents = AgentsServer::new()
        .with_agent("alpha", server())
        .with_agent("beta", server());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(agents.serve(listener, async move {
        let _ = stopped.await;
    }));
    let card: Value = reqwest::Client::new()
        .get(format!("{base}/agents/beta/.well-known/agent-card.json"))
        .header("A2A-Version", "1.0")
        .json_body()
        .await;
    let bindings = support::interface_fields(&card, "protocolBinding");
    assert_eq!(bindings, ["JSONRPC", "HTTP+JSON", "JSONRPC"], "{card}");
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_ends_an_open_grpc_stream_with_a_going_away_status() {
    let (server, mut grpc) = serve().await;
    let mut stream = grpc
        .send_streaming_message(message::<proto::SendMessageRequest>(
            json!({"message": user_message(SLEEP_30)}),
        ))
        .await
        .unwrap()
        .into_inner();
    let first = to_json(&stream.message().await.unwrap().unwrap()).unwrap();
    assert!(first.get("task").is_some(), "{first}");
    let stopping = tokio::spawn(server.stop());
    let events = drain(stream).await;
    let status = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(status["state"], "TASK_STATE_WORKING", "{events:?}");
    assert_eq!(
        status["message"]["metadata"]["status_kind"], "server_going_away",
        "{events:?}"
    );
    stopping.await.unwrap();
}

#[tokio::test]
async fn a_message_over_the_body_limit_is_refused() {
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let server = TestServer::start_with(runtime, |s| s.with_body_limit(4096)).await;
    let mut grpc = support::grpc_client(&server.base).await;
    let refused = grpc
        .send_message(message::<proto::SendMessageRequest>(
            json!({"message": user_message(&"x".repeat(8192))}),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let fits = grpc
        .send_message(message::<proto::SendMessageRequest>(
            json!({"message": user_message("small")}),
        ))
        .await;
    assert!(fits.is_ok(), "{fits:?}");
    server.stop().await;
}
