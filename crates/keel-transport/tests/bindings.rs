//! The same operations on every binding: ListTasks, the HTTP+JSON (REST) routes and errors,
//! one scenario run over JSON-RPC, REST and (feature `grpc`) gRPC with the results compared,
//! and the v0.3 compatibility layer.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_core::{AgentError, AgentResult, Message, TaskEvent, TaskId, TaskState};
use keel_runtime::{AuthContext, ListTasksFilter, Page, Services};
use keel_transport::{A2aClient, Binding, SendMessageOptions, TaskListQuery};
use serde_json::{json, Value};
use support::{sse_events, user_message, SendJson, TestServer};

fn in_thread(text: &str, thread: &str) -> Value {
    let mut message = user_message(text);
    message["contextId"] = json!(thread);
    message
}

#[tokio::test]
async fn list_tasks_filters_pages_and_puts_the_most_recent_first() {
    let server = TestServer::start().await;
    let mut ids = Vec::new();
    for text in ["one", "two", "three"] {
        let answer = server.send_message(in_thread(text, "th-a")).await;
        ids.push(answer["result"]["task"]["id"].clone());
    }
    server
        .rpc(
            "SendMessage",
            json!({"message": in_thread("other", "th-b")}),
        )
        .await;

    let page = server
        .rpc("ListTasks", json!({"contextId": "th-a", "pageSize": 2}))
        .await["result"]
        .clone();
    assert_eq!(page["totalSize"], 3, "{page}");
    assert_eq!(page["pageSize"], 2);
    assert_eq!(
        page["tasks"][0]["id"], ids[2],
        "most recently updated first"
    );
    assert_eq!(page["tasks"][1]["id"], ids[1]);
    assert!(
        page["tasks"][0].get("artifacts").is_none(),
        "artifacts are left out by default"
    );
    let token = page["nextPageToken"].as_str().unwrap();
    assert!(!token.is_empty());
    let last = server
        .rpc(
            "ListTasks",
            json!({"contextId": "th-a", "pageSize": 2, "pageToken": token, "includeArtifacts": true, "historyLength": 1}),
        )
        .await["result"]
        .clone();
    assert_eq!(last["tasks"][0]["id"], ids[0]);
    assert_eq!(last["nextPageToken"], "", "{last}");
    assert!(last["tasks"][0]["artifacts"].is_array());
    assert_eq!(last["tasks"][0]["history"].as_array().unwrap().len(), 1);

    let all = server.rpc("ListTasks", json!({})).await["result"].clone();
    assert_eq!(all["totalSize"], 4);
    assert_eq!(all["pageSize"], 50);
    let completed = server
        .rpc("ListTasks", json!({"status": "TASK_STATE_COMPLETED"}))
        .await["result"]
        .clone();
    assert_eq!(completed["totalSize"], 4);
    let working = server
        .rpc("ListTasks", json!({"status": "TASK_STATE_WORKING"}))
        .await["result"]
        .clone();
    assert_eq!(working["totalSize"], 0);
    assert_eq!(working["tasks"], json!([]));
    for (after, total) in [("2999-01-01T00:00:00Z", 0), ("2000-01-01T00:00:00Z", 4)] {
        let listed = server
            .rpc("ListTasks", json!({"statusTimestampAfter": after}))
            .await;
        assert_eq!(
            listed["result"]["totalSize"], total,
            "after {after}: {listed}"
        );
    }

    for (params, field) in [
        (json!({"pageSize": 0}), "pageSize"),
        (json!({"pageSize": 101}), "pageSize"),
        (json!({"historyLength": -1}), "historyLength"),
        (json!({"pageToken": "not-ours"}), "pageToken"),
    ] {
        let answer = server.rpc("ListTasks", params.clone()).await;
        assert_eq!(answer["error"]["code"], -32602, "{params}: {answer}");
        assert_eq!(answer["error"]["data"][0]["metadata"]["field"], field);
    }
    server.stop().await;
}

/// The binding a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    JsonRpc,
    Rest,
    #[cfg(feature = "grpc")]
    Grpc,
}

/// One operation over gRPC, with the tenant in the request as REST has it in the path: the
/// answer's JSON, or the error's `ErrorInfo.reason` (its status code checked against A2A's).
#[cfg(feature = "grpc")]
async fn grpc_call(
    server: &TestServer,
    operation: &str,
    mut params: Value,
) -> Result<Value, String> {
    use keel_transport::grpc::tonic_types::StatusExt;
    use keel_transport::grpc::{from_json, to_json, tonic, ProtoJson};
    let mut client = support::grpc_client(&server.base).await;
    params["tenant"] = json!("tenant-x");
    fn json_of<M: ProtoJson>(
        reply: Result<tonic::Response<M>, tonic::Status>,
    ) -> Result<Value, tonic::Status> {
        reply.map(|r| to_json(r.get_ref()).unwrap())
    }
    fn request<M: ProtoJson>(params: &str) -> tonic::Request<M> {
        tonic::Request::new(from_json(params).unwrap())
    }
    let params = params.to_string();
    let answer = match operation {
        "SendMessage" => json_of(client.send_message(request(&params)).await),
        "GetTask" => json_of(client.get_task(request(&params)).await),
        "ListTasks" => json_of(client.list_tasks(request(&params)).await),
        "CancelTask" => json_of(client.cancel_task(request(&params)).await),
        other => panic!("{other}"),
    };
    answer.map_err(|status| {
        let reason = status
            .get_error_details()
            .error_info()
            .unwrap()
            .reason
            .clone();
        let expected = match reason.as_str() {
            "TASK_NOT_FOUND" => tonic::Code::NotFound,
            "TASK_NOT_CANCELABLE" => tonic::Code::FailedPrecondition,
            _ => tonic::Code::InvalidArgument,
        };
        assert_eq!(status.code(), expected, "{status:?}");
        reason
    })
}

/// One operation on one binding: the result, or the error's `ErrorInfo.reason`.
async fn call(
    server: &TestServer,
    via: Via,
    operation: &str,
    params: Value,
) -> Result<Value, String> {
    #[cfg(feature = "grpc")]
    if via == Via::Grpc {
        return grpc_call(server, operation, params).await;
    }
    if via == Via::JsonRpc {
        let answer = server.rpc(operation, params).await;
        return match answer.get("error") {
            Some(error) => Err(error["data"][0]["reason"].as_str().unwrap().to_owned()),
            None => Ok(answer["result"].clone()),
        };
    }
    let id = params["id"].as_str().unwrap_or("").to_owned();
    let url = |path: &str| format!("{}/tenant-x{path}", server.base);
    let request = match operation {
        "SendMessage" => server.http.post(url("/message:send")).json(&params),
        "GetTask" => server.http.get(url(&format!("/tasks/{id}"))).query(
            &params
                .get("historyLength")
                .map(|n| vec![("historyLength", n.to_string())])
                .unwrap_or_default(),
        ),
        "ListTasks" => server.http.get(url("/tasks")).query(
            &params
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().map_or(v.to_string(), str::to_owned)))
                .collect::<Vec<_>>(),
        ),
        "CancelTask" => server.http.post(url(&format!("/tasks/{id}:cancel"))),
        other => panic!("{other}"),
    };
    let response = request.header("A2A-Version", "1.0").send().await.unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    match body.get("error") {
        Some(error) => {
            let reason = error["details"][0]["reason"].as_str().unwrap().to_owned();
            let expected = match reason.as_str() {
                "TASK_NOT_FOUND" => 404,
                _ => 400,
            };
            assert_eq!(status.as_u16(), expected, "{body}");
            assert_eq!(error["code"], expected);
            assert!(error["status"].is_string());
            Err(reason)
        }
        None => {
            assert_eq!(status, 200);
            Ok(body)
        }
    }
}

/// Drop what differs between two runs: ids, timestamps, Keel's metadata.
fn normalize(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for key in [
                "id",
                "contextId",
                "taskId",
                "messageId",
                "artifactId",
                "timestamp",
                "metadata",
                "nextPageToken",
            ] {
                map.remove(key);
            }
            map.values_mut().for_each(normalize);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

async fn scenario(server: &TestServer, via: Via, thread: &str) -> Vec<Result<Value, String>> {
    let mut out = Vec::new();
    let sent = call(
        server,
        via,
        "SendMessage",
        json!({"message": in_thread("hello", thread)}),
    )
    .await;
    let id = sent.as_ref().unwrap()["task"]["id"].clone();
    out.push(sent);
    out.push(
        call(
            server,
            via,
            "GetTask",
            json!({"id": id, "historyLength": 1}),
        )
        .await,
    );
    out.push(call(server, via, "ListTasks", json!({"contextId": thread})).await);
    out.push(call(server, via, "CancelTask", json!({"id": id})).await);
    out.push(call(server, via, "GetTask", json!({"id": "no-such-task"})).await);
    out.push(
        call(
            server,
            via,
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
        )
        .await,
    );
    out.iter_mut().flatten().for_each(normalize);
    out
}

/// Run [`scenario`] over JSON-RPC and over `via`, each on a thread of its own, on one
/// server: both answer alike, typed errors included.
async fn assert_answers_like_jsonrpc(via: Via, thread: &str) {
    let server = TestServer::start().await;
    let over_jsonrpc = scenario(&server, Via::JsonRpc, "th-rpc").await;
    let over_via = scenario(&server, via, thread).await;
    assert_eq!(over_jsonrpc, over_via);
    assert_eq!(over_via[3], Err("TASK_NOT_CANCELABLE".to_owned()));
    assert_eq!(over_via[4], Err("TASK_NOT_FOUND".to_owned()));
    assert_eq!(over_via[5], Err("INVALID_PARAMS".to_owned()));
    server.stop().await;
}

#[tokio::test]
async fn jsonrpc_and_rest_answer_the_same_scenario_the_same_way() {
    assert_answers_like_jsonrpc(Via::Rest, "th-rest").await;
}

#[cfg(feature = "grpc")]
#[tokio::test]
async fn grpc_answers_the_same_scenario_as_jsonrpc() {
    assert_answers_like_jsonrpc(Via::Grpc, "th-grpc").await;
}

#[tokio::test]
async fn rest_errors_are_status_objects_with_the_a2a_http_status() {
    let server = TestServer::start().await;
    let http = &server.http;
    let base = &server.base;
    let done = server.send_message(user_message("done")).await["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Each case's request, by its path under the binding's base.
    let get = |path: &str| http.get(format!("{base}{path}"));
    let post = |path: &str| http.post(format!("{base}{path}"));
    let cases = [
        (get("/tasks/nope"), 404, "TASK_NOT_FOUND"),
        (
            post(&format!("/tasks/{done}:cancel")),
            400,
            "TASK_NOT_CANCELABLE",
        ),
        (get("/nowhere"), 404, "METHOD_NOT_FOUND"),
        (
            http.delete(format!("{base}/tasks/t/pushNotificationConfigs/c")),
            404,
            "TASK_NOT_FOUND",
        ),
        (get("/extendedAgentCard"), 400, "UNSUPPORTED_OPERATION"),
        (get("/tasks?pageSize=abc"), 400, "INVALID_PARAMS"),
        (
            post("/message:send")
                .header("content-type", "text/plain")
                .body("hi"),
            400,
            "CONTENT_TYPE_NOT_SUPPORTED",
        ),
        (
            post("/message:send")
                .header("content-type", "application/json")
                .body("{oops"),
            400,
            "PARSE_ERROR",
        ),
        (
            get("/tasks").header("A2A-Version", "7.0"),
            400,
            "VERSION_NOT_SUPPORTED",
        ),
        (
            get("/tasks").header("A2A-Version", "0.3"),
            400,
            "VERSION_NOT_SUPPORTED",
        ),
        // No version is 0.3 (v1.0.1, 3.6.2), which this binding does not speak: the same answer.
        (get("/tasks"), 400, "VERSION_NOT_SUPPORTED"),
    ];
    for (request, status, reason) in cases {
        // Every case but the version's own names A2A 1.0.
        let (client, request) = request.build_split();
        let mut request = request.unwrap();
        if reason != "VERSION_NOT_SUPPORTED" {
            request
                .headers_mut()
                .insert("A2A-Version", "1.0".parse().unwrap());
        }
        let response = client.execute(request).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{reason}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], status, "{body}");
        assert_eq!(body["error"]["details"][0]["reason"], reason, "{body}");
        // The body's `status` is the google.rpc.Code whose HTTP mapping is the answer's.
        let code_status = match body["error"]["status"].as_str().unwrap() {
            "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => 400,
            "NOT_FOUND" => 404,
            "ABORTED" | "ALREADY_EXISTS" => 409,
            "RESOURCE_EXHAUSTED" => 429,
            "UNIMPLEMENTED" => 501,
            "UNAVAILABLE" => 503,
            other => panic!("{reason}: status {other}"),
        };
        assert_eq!(code_status, status, "{body}");
        assert_eq!(body["error"]["details"][0]["domain"], "a2a-protocol.org");
        assert!(body["error"]["message"].is_string());
    }
    // Still serving.
    let response = http
        .post(format!("{base}/message:send"))
        .header("content-type", "application/json")
        .header("A2A-Version", "1.0")
        .body(json!({"message": user_message("still here")}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.stop().await;
}

#[tokio::test]
async fn keel_client_speaks_rest_with_typed_errors() {
    let server = TestServer::start().await;
    let client = A2aClient::new(server.base.clone()).with_binding(Binding::HttpJson);
    let task = client
        .send_message(
            Message::user("hello").in_thread("th-c"),
            SendMessageOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(
        client
            .get_task(&task.id, Some(1))
            .await
            .unwrap()
            .history
            .len(),
        1
    );
    let list = client
        .list_tasks(&TaskListQuery {
            thread_id: Some("th-c".into()),
            include_artifacts: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(list.total_size, 1);
    assert_eq!(list.tasks[0].id, task.id);
    assert_eq!(list.tasks[0].artifacts.len(), 1);
    assert_eq!(list.next_page_token, None);
    support::assert_typed_errors(&client, &task).await;

    let over_jsonrpc = A2aClient::new(server.base.clone())
        .list_tasks(&TaskListQuery::default())
        .await
        .unwrap();
    assert_eq!(over_jsonrpc.total_size, 1);
    server.stop().await;
}

#[tokio::test]
async fn v0_3_clients_without_a_version_header_get_v0_3_shapes() {
    let server = TestServer::start().await;
    let message = json!({
        "kind": "message", "messageId": "v03-1", "role": "user",
        "parts": [{"kind": "text", "text": "hello"}]
    });
    let answer: Value = server
        .rpc_as(None, "message/send", json!({"message": message}))
        .await;
    let task = &answer["result"];
    assert_eq!(task["kind"], "task", "{answer}");
    assert_eq!(task["status"]["state"], "completed");
    assert_eq!(task["status"]["message"]["kind"], "message");
    assert_eq!(task["status"]["message"]["role"], "agent");
    assert_eq!(
        task["status"]["message"]["parts"][0],
        json!({"kind": "text", "text": "You said: hello"})
    );
    assert_eq!(task["artifacts"][0]["parts"][0]["kind"], "text");

    let got: Value = server
        .rpc_as(
            None,
            "tasks/get",
            json!({"id": task["id"], "historyLength": 1}),
        )
        .await;
    assert_eq!(got["result"]["kind"], "task");
    assert_eq!(got["result"]["history"].as_array().unwrap().len(), 1);
    let canceled: Value = server
        .rpc_as(Some("0.3"), "tasks/cancel", json!({"id": task["id"]}))
        .await;
    assert_eq!(canceled["error"]["code"], -32002, "{canceled}");

    // Non-blocking, then canceled through v0.3.
    let running: Value = server
        .rpc_as(
            None,
            "message/send",
            json!({"message": {"kind": "message", "messageId": "v03-2", "role": "user", "parts": [{"kind": "text", "text": support::SLEEP_30}]},
                   "configuration": {"blocking": false}}),
        )
        .await;
    let state = running["result"]["status"]["state"].as_str().unwrap();
    assert!(state == "submitted" || state == "working", "{running}");
    let canceled: Value = server
        .rpc_as(None, "tasks/cancel", json!({"id": running["result"]["id"]}))
        .await;
    assert_eq!(
        canceled["result"]["status"]["state"], "canceled",
        "{canceled}"
    );

    // A request without a version is A2A 0.3, as the spec says: a v1.0 name without the header
    // is refused as a version it did not name.
    let v1: Value = server
        .rpc_as(None, "GetTask", json!({"id": task["id"]}))
        .await;
    assert_eq!(v1["error"]["code"], -32009, "{v1}");
    server.stop().await;
}

#[tokio::test]
async fn v0_3_stream_events_carry_kinds_and_final() {
    let server = TestServer::start().await;
    let response = server
        .rpc_with(
            None,
            "message/stream",
            json!({"message": {"kind": "message", "messageId": "v03-s", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}}),
        )
        .await;
    let events = sse_events(response).await;
    let results: Vec<&Value> = events.iter().map(|(_, e)| &e["result"]).collect();
    assert_eq!(results[0]["kind"], "task", "{results:?}");
    let last = results.last().unwrap();
    assert_eq!(last["kind"], "status-update");
    assert_eq!(last["status"]["state"], "completed");
    assert_eq!(last["final"], true);
    assert!(results.iter().any(|r| r["kind"] == "artifact-update"));
    assert!(results[1..results.len() - 1]
        .iter()
        .all(|r| r["final"] != true));

    let resubscribe: Value = server
        .rpc_as(None, "tasks/resubscribe", json!({"id": results[0]["id"]}))
        .await;
    assert_eq!(
        resubscribe["error"]["code"], -32004,
        "a finished task: {resubscribe}"
    );
    server.stop().await;
}

#[tokio::test]
async fn version_header_selects_the_protocol_and_unknown_versions_are_refused() {
    let server = TestServer::start().await;
    let message = json!({"kind": "message", "messageId": "x", "role": "user", "parts": [{"kind": "text", "text": "hi"}]});
    let cases = [
        (Some("0.3"), "SendMessage", -32601),
        (Some("1.0"), "message/send", -32601),
        (Some("0.2"), "message/send", -32009),
        (Some("2.0"), "SendMessage", -32009),
        (None, "tasks/pushNotificationConfig/set", -32602),
    ];
    for (version, method, code) in cases {
        let answer: Value = server
            .rpc_as(version, method, json!({"message": message}))
            .await;
        assert_eq!(
            answer["error"]["code"], code,
            "{version:?} {method}: {answer}"
        );
    }
    // An empty `A2A-Version` is 0.3, as none is (v1.0.1, 3.6.2): a v0.3 method is served, a
    // v1.0 name is a version the request did not name.
    let answer: Value = server
        .rpc_as(Some(""), "message/send", json!({"message": message}))
        .await;
    assert_eq!(answer["result"]["kind"], "task", "{answer}");
    assert_eq!(answer["result"]["status"]["state"], "completed", "{answer}");
    let answer: Value = server
        .rpc_as(Some(" "), "SendMessage", json!({"message": message}))
        .await;
    assert_eq!(answer["error"]["code"], -32009, "{answer}");
    let why = answer["error"]["message"].as_str().unwrap();
    assert!(
        why.contains("names no A2A-Version (or an empty one) is A2A 0.3"),
        "{why}"
    );
    // The version may also come as a query parameter.
    let answer: Value = server
        .http
        .post(format!("{}/?A2A-Version=9.9", server.base))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}))
        .json_body()
        .await;
    assert_eq!(answer["error"]["code"], -32009);
    server.stop().await;
}

/// The in-memory task store, counting the snapshots its listings hand out.
struct CountingTasks {
    inner: keel_runtime::InMemoryTaskManager,
    listed: Arc<AtomicUsize>,
}

keel_runtime::task_manager_from_field! {
    CountingTasks => inner;
    async fn list_tasks(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
    ) -> AgentResult<Page<keel_core::Task>> {
        let page = self.inner.list_tasks(auth, filter).await?;
        self.listed.fetch_add(page.items.len(), Ordering::Relaxed);
        Ok(page)
    }
}

#[tokio::test]
async fn a_list_tasks_page_reads_only_its_own_tasks_from_the_store() {
    let listed = Arc::new(AtomicUsize::new(0));
    let runtime = Arc::new(
        Services::in_memory(Arc::new(keel_llm::MockLlm::new())).with_tasks(CountingTasks {
            inner: keel_runtime::InMemoryTaskManager::new(),
            listed: listed.clone(),
        }),
    );
    let server = TestServer::start_with(runtime, |s| s).await;
    let mut last = Value::Null;
    for n in 0..250 {
        let answer = server
            .rpc(
                "SendMessage",
                json!({"message": user_message(&format!("hello {n}"))}),
            )
            .await;
        last = answer["result"]["task"]["id"].clone();
    }
    listed.store(0, Ordering::Relaxed);
    let page = server.rpc("ListTasks", json!({"pageSize": 1})).await["result"].clone();
    assert_eq!(page["totalSize"], 250, "{page}");
    assert_eq!(page["tasks"][0]["id"], last, "the newest first");
    assert!(
        listed.load(Ordering::Relaxed) <= 2,
        "a page of one read {} tasks from the store",
        listed.load(Ordering::Relaxed)
    );
    server.stop().await;
}

/// A task store whose backend cannot be reached.
struct UnreachableTasks;

fn unreachable() -> AgentError {
    AgentError::store_unavailable(
        "redis",
        "GET task at redis://db.internal:6379",
        std::io::Error::other("connection refused"),
    )
}

#[async_trait::async_trait]
impl keel_runtime::TaskManager for UnreachableTasks {
    async fn get_task(&self, _: &AuthContext, _: &TaskId) -> AgentResult<Option<keel_core::Task>> {
        Err(unreachable())
    }
    async fn list_tasks(
        &self,
        _: &AuthContext,
        _: &ListTasksFilter,
    ) -> AgentResult<Page<keel_core::Task>> {
        Err(unreachable())
    }
    async fn save_task(&self, _: &AuthContext, _: &keel_core::Task) -> AgentResult<()> {
        Err(unreachable())
    }
    async fn add_task_event(&self, _: &AuthContext, _: &TaskId, _: &TaskEvent) -> AgentResult<()> {
        Err(unreachable())
    }
    async fn get_task_events(&self, _: &AuthContext, _: &TaskId) -> AgentResult<Vec<TaskEvent>> {
        Err(unreachable())
    }
}

#[tokio::test]
async fn an_unavailable_store_is_503_with_retry_after_and_a_clear_json_rpc_error() {
    let runtime = Arc::new(
        Services::in_memory(Arc::new(keel_llm::MockLlm::new())).with_tasks(UnreachableTasks),
    );
    let server = TestServer::start_with(runtime, |s| s).await;
    let response = server.get_v1("/tasks/t-1").send().await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["status"], "UNAVAILABLE", "{body}");

    for (method, params) in [
        ("GetTask", json!({"id": "t-1"})),
        ("SendMessage", json!({"message": user_message("hello")})),
    ] {
        let answer = server.rpc(method, params).await;
        let error = &answer["error"];
        assert_eq!(error["code"], -32050, "{method}: {answer}");
        let message = error["message"].as_str().unwrap();
        assert!(message.starts_with("store unavailable"), "{message}");
        assert!(!message.contains("db.internal"), "{message}");
        assert_eq!(error["data"][0]["reason"], "UNAVAILABLE");
        assert_eq!(error["data"][0]["metadata"]["backend"], "redis");
    }
    server.stop().await;
}

#[tokio::test]
async fn rest_answers_application_a2a_json_when_the_request_asks_for_it() {
    let server = TestServer::start().await;
    let content_type = |response: &reqwest::Response| {
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let body = json!({"message": user_message("typed")}).to_string();
    let send = |content_type: &str| {
        server
            .post_v1("/message:send")
            .header("content-type", content_type.to_owned())
            .body(body.clone())
    };
    let asked = send("application/a2a+json").send().await.unwrap();
    assert_eq!(asked.status(), 200);
    assert_eq!(content_type(&asked), "application/a2a+json");
    let task: Value = asked.json().await.unwrap();
    let id = task["task"]["id"].as_str().unwrap();

    let plain = send("application/json").send().await.unwrap();
    assert_eq!(content_type(&plain), "application/json");

    // Accept alone asks for it too, on answers and on errors.
    for path in [format!("/tasks/{id}"), "/tasks/nope".to_owned()] {
        let read = server
            .get_v1(&path)
            .header("accept", "application/a2a+json")
            .send()
            .await
            .unwrap();
        assert_eq!(content_type(&read), "application/a2a+json", "{path}");
    }
    server.stop().await;
}
