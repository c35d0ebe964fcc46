//! A2A v1.0 over JSON-RPC against a real server on 127.0.0.1:0: the card, the methods, the
//! error codes and envelope rules (the same checks as `shared/tools/a2a-probe`), and the
//! Keel client round trip.

mod support;

use keel_core::{AgentError, Message, Role, TaskId, TaskState};
use keel_runtime::testing::eventually;
use keel_transport::{A2aClient, SendMessageOptions};
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{user_message, SendJson, TestServer, SLEEP_30};

/// The JSON-RPC envelope checks of this file, on the shared test server.
impl TestServer {
    /// POST raw bytes to `path` with `A2A-Version: 1.0` (unless `version` says otherwise).
    async fn post_raw(
        &self,
        path: &str,
        body: Vec<u8>,
        version: Option<&str>,
    ) -> (StatusCode, Option<Value>) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(version) = version {
            request = request.header("A2A-Version", version);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let bytes = response.bytes().await.unwrap();
        let body = (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).unwrap());
        (status, body)
    }

    /// POST `body` to `/` as A2A v1.0, whatever it holds.
    async fn post_value(&self, body: &Value) -> (StatusCode, Option<Value>) {
        self.post_raw("/", serde_json::to_vec(body).unwrap(), Some("1.0"))
            .await
    }

    /// POST `body`, notifications only, and assert that nothing answers: 204, no body.
    async fn assert_unanswered(&self, body: &Value) {
        let (status, answer) = self.post_value(body).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert!(answer.is_none(), "{answer:?}");
    }

    /// POST a JSON body to `/` and check the JSON-RPC envelope of the answer.
    async fn post(&self, body: Value) -> Value {
        let expected_id = body
            .get("id")
            .cloned()
            .filter(|id| id.is_string() || id.is_number())
            .unwrap_or(Value::Null);
        let (status, answer) = self.post_value(&body).await;
        let answer = answer.expect("a JSON-RPC answer");
        assert_envelope(status, &answer, &expected_id);
        answer
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        self.post(json!({"jsonrpc": "2.0", "id": "req-1", "method": method, "params": params}))
            .await
    }

    async fn send(&self, text: &str, configuration: Value) -> Value {
        let answer = self
            .call(
                "SendMessage",
                json!({"message": user_message(text), "configuration": configuration}),
            )
            .await;
        answer["result"]["task"].clone()
    }
}

/// A started server, and the task it answers `text` with, sent with `configuration`.
async fn started_with_task(text: &str, configuration: Value) -> (TestServer, Value) {
    let server = TestServer::start().await;
    let task = server.send(text, configuration).await;
    (server, task)
}

/// JSON-RPC 2.0 envelope and A2A error shape: HTTP 200, `jsonrpc: "2.0"`, the id echoed with
/// its type, exactly one of result/error, integer code, string message, and `data` (when
/// present) an array of objects that each carry `@type`.
fn assert_envelope(status: StatusCode, answer: &Value, expected_id: &Value) {
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    assert_eq!(answer.get("id"), Some(expected_id), "{answer}");
    assert_ne!(
        answer.get("result").is_some(),
        answer.get("error").is_some(),
        "{answer}"
    );
    if let Some(error) = answer.get("error") {
        assert!(error["code"].is_i64(), "{answer}");
        assert!(error["message"].is_string(), "{answer}");
        if let Some(data) = error.get("data") {
            let data = data.as_array().expect("error.data is an array");
            for entry in data {
                assert!(entry.get("@type").is_some(), "{answer}");
            }
        }
    }
}

fn code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or(0)
}

/// Checks that a posted request's answer (`post_raw`'s or `post_value`'s) is a well-formed
/// JSON-RPC error of code `expected` for the request of id `id`; `case` names the request.
fn assert_error(posted: (StatusCode, Option<Value>), id: &Value, expected: i64, case: &str) {
    let (status, answer) = posted;
    let answer = answer.unwrap_or_else(|| panic!("a JSON-RPC answer to {case}"));
    assert_envelope(status, &answer, id);
    assert_eq!(code(&answer), expected, "{case}: {answer}");
}

#[tokio::test]
async fn agent_card_declares_jsonrpc_and_rest_1_0_and_jsonrpc_0_3_and_streaming() {
    let server = TestServer::start().await;
    let card: Value = server.card().await;
    assert_eq!(card["name"], "echo");
    assert_eq!(card["description"], "Echoes what it hears");
    assert!(card["version"].is_string());
    let interfaces = [
        Some(
            json!({"url": format!("{}/", server.base), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}),
        ),
        Some(json!({"url": server.base, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"})),
        // With the gRPC binding compiled in, it is listed at the same host and port.
        cfg!(feature = "grpc").then(|| json!({"url": server.base.trim_start_matches("http://"), "protocolBinding": "GRPC", "protocolVersion": "1.0"})),
        Some(
            json!({"url": format!("{}/", server.base), "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}),
        ),
    ];
    assert_eq!(
        card["supportedInterfaces"],
        Value::Array(interfaces.into_iter().flatten().collect())
    );
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(card["capabilities"]["pushNotifications"], true);
    assert_eq!(card["defaultInputModes"], json!(["text/plain"]));
    assert_eq!(card["defaultOutputModes"], json!(["text/plain"]));
    assert_eq!(card["skills"][0]["id"], "echo");
    assert_eq!(card["skills"][0]["tags"], json!(["demo"]));
    assert_eq!(card["skills"][0]["examples"], json!(["hello"]));
    assert_eq!(
        card["capabilities"]["extensions"][0]["uri"],
        keel_transport::KEEL_CARD_EXTENSION_URI
    );
    // A v1.0 caller gets the v1.0 card only.
    for v03_field in [
        "url",
        "protocolVersion",
        "preferredTransport",
        "additionalInterfaces",
    ] {
        assert!(card.get(v03_field).is_none(), "{v03_field} in {card}");
    }
    server.stop().await;
}

/// A card request names its version as any request does (decision 266): 1.0 gets the v1.0
/// card, clean for strict protobuf JSON; 0.3 or none (0.3 by v1.0.1, 3.6.2) gets the v0.3
/// form, at the well-known path as at the legacy one, since A2A 0.3's SDKs read
/// `agent-card.json` without a version and need its `url`.
#[tokio::test]
async fn the_card_is_v1_0_when_asked_for_1_0_and_v0_3_without_a_version_or_with_0_3() {
    let server = TestServer::start().await;
    let url = format!("{}/.well-known/agent-card.json", server.base);
    let get = |url: String, version: Option<&'static str>| {
        let mut request = server.http.get(url);
        if let Some(version) = version {
            request = request.header("A2A-Version", version);
        }
        request.send()
    };
    let response = get(url.clone(), Some("1.0")).await.unwrap();
    assert_eq!(response.headers()["vary"], "A2A-Version");
    let v1_etag = response.headers()["etag"].to_str().unwrap().to_owned();
    let card: Value = response.json().await.unwrap();
    // The v1.0 card, with nothing a strict protobuf JSON parser would refuse.
    for v03_field in [
        "url",
        "protocolVersion",
        "preferredTransport",
        "additionalInterfaces",
        "supportsAuthenticatedExtendedCard",
    ] {
        assert!(card.get(v03_field).is_none(), "{v03_field} in {card}");
    }
    #[cfg(feature = "grpc")]
    keel_transport::grpc::from_json::<keel_transport::grpc::proto::AgentCard>(&card.to_string())
        .expect("the card parses as the proto's AgentCard");

    // No version is 0.3: the v0.3 form, where a v0.3 client looks by default.
    let unnamed = get(url.clone(), None).await.unwrap();
    assert_eq!(unnamed.headers()["vary"], "A2A-Version");
    let v03_etag = unnamed.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(v03_etag, v1_etag);
    let card: Value = unnamed.json().await.unwrap();
    // What a v0.3 client reads to reach the agent: the JSON-RPC 0.3 endpoint.
    assert_eq!(card["protocolVersion"], "0.3.0");
    assert_eq!(card["url"], format!("{}/", server.base));
    assert_eq!(card["preferredTransport"], "JSONRPC");
    assert_eq!(
        card["additionalInterfaces"],
        json!([{"url": format!("{}/", server.base), "transport": "JSONRPC"}])
    );
    assert_eq!(card["supportsAuthenticatedExtendedCard"], false);
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(card["capabilities"]["pushNotifications"], true);
    assert_eq!(card["skills"][0]["tags"], json!(["demo"]));
    assert_eq!(card["defaultInputModes"], json!(["text/plain"]));
    // The v1.0 discovery stays, every interface with its protocol version.
    let versions = support::interface_fields(&card, "protocolVersion");
    let v1_interfaces = if cfg!(feature = "grpc") { 3 } else { 2 };
    assert_eq!(versions.len(), v1_interfaces + 1);
    assert!(versions[..v1_interfaces].iter().all(|v| *v == "1.0"));
    assert_eq!(versions[v1_interfaces], "0.3");

    let legacy = format!("{}/.well-known/agent.json", server.base);
    for (url, version, etag) in [
        (&url, Some("0.3"), &v03_etag),
        (&url, Some(""), &v03_etag),
        (&url, Some("9.9"), &v1_etag),
        (&legacy, None, &v03_etag),
        (&legacy, Some("0.3"), &v03_etag),
        (&legacy, Some("1.0"), &v1_etag),
        (&legacy, Some("9.9"), &v03_etag),
    ] {
        let response = get(url.clone(), version).await.unwrap();
        assert_eq!(
            response.headers()["etag"].to_str().unwrap(),
            etag.as_str(),
            "{url} {version:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn blocking_send_message_completes_with_the_echo_and_an_artifact() {
    let (server, task) = started_with_task("hello", json!({})).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    let answer = &task["status"]["message"];
    assert_eq!(answer["role"], "ROLE_AGENT");
    assert_eq!(answer["parts"][0]["text"], "You said: hello");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "You said: hello");
    assert!(task["id"].is_string() && task["contextId"].is_string());
    assert!(task["metadata"]["keel"]["runId"].is_string(), "{task}");

    let got = server.call("GetTask", json!({"id": task["id"]})).await;
    assert_eq!(got["result"]["id"], task["id"]);
    assert_eq!(got["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    server.stop().await;
}

#[tokio::test]
async fn missing_configuration_or_return_immediately_means_blocking() {
    let server = TestServer::start().await;
    let answer = server
        .call("SendMessage", json!({"message": user_message("hi")}))
        .await;
    assert_eq!(
        answer["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    let task = server.send("hi", json!({"historyLength": 5})).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    server.stop().await;
}

#[tokio::test]
async fn return_immediately_answers_at_once_and_cancel_ends_the_task_canceled() {
    let (server, task) = started_with_task(SLEEP_30, json!({"returnImmediately": true})).await;
    let state = task["status"]["state"].as_str().unwrap();
    assert!(
        state == "TASK_STATE_SUBMITTED" || state == "TASK_STATE_WORKING",
        "{state}"
    );
    // The cancel itself waits for the run to stop.
    let canceled = server
        .call(
            "CancelTask",
            json!({"id": task["id"], "metadata": {"reason": "enough"}}),
        )
        .await;
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    assert_eq!(
        canceled["result"]["metadata"]["keel"]["cancelReason"],
        "enough"
    );
    server.stop().await;
}

#[tokio::test]
async fn cancel_of_a_completed_task_is_not_cancelable() {
    let (server, task) = started_with_task("hello", json!({})).await;
    let answer = server.call("CancelTask", json!({"id": task["id"]})).await;
    assert_eq!(code(&answer), -32002, "{answer}");
    let info = &answer["error"]["data"][0];
    assert_eq!(info["reason"], "TASK_NOT_CANCELABLE");
    assert_eq!(info["metadata"]["state"], "TASK_STATE_COMPLETED");
    server.stop().await;
}

#[tokio::test]
async fn unknown_task_is_task_not_found_for_get_and_cancel() {
    let server = TestServer::start().await;
    for method in ["GetTask", "CancelTask"] {
        let answer = server.call(method, json!({"id": "no-such-task"})).await;
        assert_eq!(code(&answer), -32001, "{method}: {answer}");
        assert_eq!(
            answer["error"]["data"][0]["metadata"]["taskId"],
            "no-such-task"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn malformed_json_is_a_parse_error_with_null_id() {
    let server = TestServer::start().await;
    let posted = server
        .post_raw("/", b"{not json".to_vec(), Some("1.0"))
        .await;
    assert_error(posted, &Value::Null, -32700, "malformed JSON");
    server.stop().await;
}

#[tokio::test]
async fn a_request_without_a_method_or_jsonrpc_2_0_is_an_invalid_request_echoing_the_id() {
    let server = TestServer::start().await;
    for body in [
        // No method, or one that is no string.
        json!({"jsonrpc": "2.0", "id": "probe-nomethod", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": 7}),
        // JSON-RPC other than 2.0, or none said.
        json!({"jsonrpc": "1.0", "id": 77, "method": "GetTask", "params": {"id": "x"}}),
        json!({"id": 78, "method": "GetTask", "params": {"id": "x"}}),
    ] {
        let answer = server.post(body.clone()).await;
        assert_eq!(code(&answer), -32600, "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn non_object_requests_empty_batches_and_bad_ids_are_invalid_requests_with_null_id() {
    let server = TestServer::start().await;
    for body in [
        json!([]),
        json!("GetTask"),
        json!(42),
        json!({"jsonrpc": "2.0", "id": {"x": 1}, "method": "GetTask"}),
        json!({"jsonrpc": "2.0", "id": [1], "method": "GetTask"}),
    ] {
        let posted = server.post_value(&body).await;
        assert_error(posted, &Value::Null, -32600, &body.to_string());
    }
    server.stop().await;
}

#[tokio::test]
async fn unknown_method_is_method_not_found() {
    let server = TestServer::start().await;
    let answer = server.call("NoSuchMethod", json!({})).await;
    assert_eq!(code(&answer), -32601);
    // Old v0.3 names are unknown to the v1.0 handlers.
    let answer = server.call("message/send", json!({})).await;
    assert_eq!(code(&answer), -32601);
    server.stop().await;
}

#[tokio::test]
async fn push_config_methods_check_their_params_and_the_extended_card_is_unsupported() {
    let server = TestServer::start().await;
    for (method, expected) in [
        // Known methods whose required params are missing.
        ("CreateTaskPushNotificationConfig", -32602),
        ("GetTaskPushNotificationConfig", -32602),
        ("ListTaskPushNotificationConfigs", -32602),
        ("DeleteTaskPushNotificationConfig", -32602),
        // The card says `extendedAgentCard: false`: A2A answers UnsupportedOperationError.
        ("GetExtendedAgentCard", -32004),
    ] {
        let answer = server.call(method, json!({})).await;
        assert_eq!(code(&answer), expected, "{method}");
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_params_are_invalid_params() {
    let server = TestServer::start().await;
    let ok = user_message("hi");
    let cases = [
        ("SendMessage", json!({"message": 42}), "message"),
        ("SendMessage", json!({}), "message"),
        ("SendMessage", json!([ok.clone()]), "params"),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
            "message.parts",
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": 3}]}}),
            "params",
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_UNSPECIFIED", "parts": [{"text": "x"}]}}),
            "message.role",
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": [{"text": "x"}]}}),
            "params",
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}}),
            "message.role",
        ),
        (
            "SendMessage",
            json!({"message": ok, "configuration": {"historyLength": -1}}),
            "configuration.historyLength",
        ),
        (
            "SendMessage",
            json!({"message": ok, "configuration": {"returnImmediately": "yes"}}),
            "params",
        ),
        ("GetTask", json!({}), "params"),
        ("GetTask", json!({"id": 5}), "params"),
        (
            "GetTask",
            json!({"id": "x", "historyLength": -2}),
            "historyLength",
        ),
        ("CancelTask", json!({"id": ""}), "id"),
    ];
    for (method, params, field) in cases {
        let answer = server.call(method, params.clone()).await;
        assert_eq!(code(&answer), -32602, "{method} {params}: {answer}");
        assert_eq!(
            answer["error"]["data"][0]["metadata"]["field"], field,
            "{method} {params}: {answer}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn push_to_a_private_target_is_refused_before_the_message_is_accepted() {
    let server = TestServer::start().await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/",
        "file:///etc/passwd",
    ] {
        let answer = server
            .call(
                "SendMessage",
                json!({
                    "message": user_message("hi"),
                    "configuration": {"taskPushNotificationConfig": {"url": url}}
                }),
            )
            .await;
        assert_eq!(code(&answer), -32602, "{url}: {answer}");
    }
    let list = server.call("ListTasks", json!({})).await;
    assert_eq!(list["result"]["tasks"], json!([]), "{list}");
    server.stop().await;
}

#[tokio::test]
async fn unsupported_a2a_version_is_version_not_supported() {
    let server = TestServer::start().await;
    let body = serde_json::to_vec(
        &json!({"jsonrpc": "2.0", "id": "v", "method": "GetTask", "params": {"id": "x"}}),
    )
    .unwrap();
    for version in ["9.9", "2.0", "0.9", "1.1"] {
        let posted = server.post_raw("/", body.clone(), Some(version)).await;
        assert_error(posted, &json!("v"), -32009, version);
    }
    // 1.0 and 1.0.x reach the handlers.
    for version in ["1.0", "1.0.2"] {
        let posted = server.post_raw("/", body.clone(), Some(version)).await;
        assert_error(posted, &json!("v"), -32001, version);
    }
    // No header is A2A 0.3, as the spec says, which has no `GetTask`: the version this request
    // did not name is refused, as the reference server does.
    let posted = server.post_raw("/", body.clone(), None).await;
    assert_error(posted, &json!("v"), -32009, "no A2A-Version");
    server.stop().await;
}

#[tokio::test]
async fn request_ids_are_echoed_with_their_type() {
    let server = TestServer::start().await;
    for id in [json!(42), json!("a-string-id"), json!(0), json!(-7)] {
        let answer = server
            .post(json!({"jsonrpc": "2.0", "id": id, "method": "GetTask", "params": {"id": "x"}}))
            .await;
        assert_eq!(answer["id"], id);
    }
    let answer = server
        .post(json!({"jsonrpc": "2.0", "id": 9, "method": "SendMessage", "params": {"message": user_message("hi")}}))
        .await;
    assert_eq!(answer["id"], 9);
    assert!(answer["result"]["task"].is_object());
    server.stop().await;
}

#[tokio::test]
async fn notifications_are_processed_without_an_answer() {
    let server = TestServer::start().await;
    let body = json!({"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}});
    server.assert_unanswered(&body).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_body_is_answered_with_a_json_rpc_error() {
    let server = TestServer::start().await;
    let big = "x".repeat(keel_transport::DEFAULT_BODY_LIMIT + 1);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": user_message(&big)}});
    let posted = server.post_value(&body).await;
    assert_error(posted, &Value::Null, -32600, "an oversized body");
    server.stop().await;
}

#[tokio::test]
async fn server_keeps_serving_after_every_bad_request() {
    let server = TestServer::start().await;
    let bad_bodies: Vec<Vec<u8>> = vec![
        b"{not json".to_vec(),
        b"".to_vec(),
        b"null".to_vec(),
        b"[1,2".to_vec(),
        vec![0xff, 0xfe, 0x00],
        br#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"data":null,"metadata":{"keel.partType":"tool_call"}}]}}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","role":"ROLE_USER","parts":[{"raw":"!!!"}]}}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":1.5,"method":"GetTask","params":{"id":"x"}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":"x"}"#.to_vec(),
    ];
    for body in bad_bodies {
        let (status, answer) = server.post_raw("/", body.clone(), Some("1.0")).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let answer = answer.expect("bad input gets an answer");
        assert!(answer["error"]["code"].is_i64(), "{answer}");
        let task = server.send("still there?", json!({})).await;
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    }
    server.stop().await;
}

#[tokio::test]
async fn history_length_limits_the_history() {
    let (server, full) = started_with_task("hello", json!({})).await;
    let full_len = full["history"].as_array().map_or(0, Vec::len);
    assert!(full_len >= 2, "{full}");
    let one = server.send("hello", json!({"historyLength": 1})).await;
    assert_eq!(one["history"].as_array().map_or(0, Vec::len), 1, "{one}");
    assert_eq!(one["history"][0]["role"], "ROLE_AGENT");
    let got = server
        .call("GetTask", json!({"id": full["id"], "historyLength": 1}))
        .await;
    assert_eq!(got["result"]["history"].as_array().map_or(0, Vec::len), 1);
    let got = server
        .call("GetTask", json!({"id": full["id"], "historyLength": 0}))
        .await;
    assert_eq!(got["result"]["history"].as_array().map_or(0, Vec::len), 0);
    server.stop().await;
}

#[tokio::test]
async fn endpoint_answers_with_and_without_a_trailing_slash() {
    let server = TestServer::start().await;
    let body = serde_json::to_vec(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": user_message("hi")}}),
    )
    .unwrap();
    // The card's url is `<base>/`; a client may also post to `<base>`.
    for url in [format!("{}/", server.base), server.base.clone()] {
        let answer: Value = server
            .http
            .post(&url)
            .header("A2A-Version", "1.0")
            .header("content-type", "application/json")
            .body(body.clone())
            .json_with_status(StatusCode::OK)
            .await;
        assert_eq!(
            answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{url}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn continuing_a_task_that_has_ended_is_unsupported_operation() {
    let (server, task) = started_with_task("hello", json!({})).await;
    let mut message = user_message("more");
    message["taskId"] = task["id"].clone();
    let answer = server
        .call("SendMessage", json!({"message": message}))
        .await;
    // A2A §3.1.1: a task in a terminal state takes no more messages.
    assert_eq!(code(&answer), -32004, "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn keel_client_round_trips_against_the_server() {
    let server = TestServer::start().await;
    let client = A2aClient::new(server.base.clone());

    let card = client.get_card().await.unwrap();
    assert_eq!(card.name, "echo");
    assert_eq!(card.url, format!("{}/", server.base));
    assert_eq!(card.protocol_version, "1.0");
    assert_eq!(card.skills[0].examples, vec!["hello".to_owned()]);
    assert!(card.capabilities.streaming);

    let task = client
        .send_message(Message::user("hello"), SendMessageOptions::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    let answer = task.status().message.clone().unwrap();
    assert_eq!(answer.role, Role::Agent);
    assert_eq!(answer.text(), "You said: hello");
    assert_eq!(task.artifacts[0].name.as_deref(), Some("answer"));
    assert!(task.state_history.len() >= 2);

    let got = client.get_task(&task.id, Some(1)).await.unwrap();
    assert_eq!(got.id, task.id);
    assert_eq!(got.history.len(), 1);

    // Typed errors come back.
    support::assert_typed_errors(&client, &task).await;
    let err = client
        .send_message(
            Message::new(Role::User, Vec::new()),
            SendMessageOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.parts"),
        "{err:?}"
    );

    // Return at once, then cancel: the run stops and the task ends canceled.
    let running = support::start_sleeping(&client).await;
    assert!(!running.state().is_terminal());
    let canceled = client
        .cancel_task(&running.id, Some("test over".into()))
        .await
        .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    assert_eq!(canceled.metadata["cancel_reason"], "test over");
    server.stop().await;
}

#[tokio::test]
async fn client_with_an_explicit_endpoint_skips_discovery() {
    let server = TestServer::start().await;
    let client = A2aClient::new("http://127.0.0.1:9").with_endpoint(format!("{}/", server.base));
    let task = client
        .send_message(Message::user("hi"), SendMessageOptions::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    server.stop().await;
}

#[tokio::test]
async fn client_reports_an_unreachable_agent_as_an_error_not_a_panic() {
    let client = A2aClient::new("http://127.0.0.1:9");
    let err = client.get_card().await.unwrap_err();
    assert!(
        matches!(&err, AgentError::Unreachable { url, .. } if url.starts_with("http://127.0.0.1:9/")),
        "{err:?}"
    );
    assert_eq!(err.kind(), keel_core::ErrorKind::Unavailable);
}

#[tokio::test]
async fn shutdown_hands_running_tasks_on_without_canceling_them() {
    let (server, task) = started_with_task(SLEEP_30, json!({"returnImmediately": true})).await;
    let task_id = TaskId::from(task["id"].as_str().unwrap());
    let executor = server.executor.clone();
    // Wait until the run is in its sleep, so that the shutdown has a run to hand on.
    let auth = executor.runtime().auth_service().auth_context();
    eventually("the run to start", || {
        let (executor, auth, task_id) = (executor.clone(), auth.clone(), task_id.clone());
        async move { executor.is_running(&auth, &task_id) }
    })
    .await;
    server.stop().await;
    let task = executor.get_task(&auth, &task_id, None).await.unwrap();
    assert_eq!(task.state(), TaskState::Working);
    assert!(!executor.is_running(&auth, &task_id));
}

#[tokio::test]
async fn shutdown_lets_a_blocked_send_message_answer_with_the_unfinished_task() {
    let server = TestServer::start().await;
    let http = server.http.clone();
    let url = format!("{}/", server.base);
    let blocked = tokio::spawn(async move {
        http.post(url)
            .header("A2A-Version", "1.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": user_message(SLEEP_30)}}))
            .json_body()
            .await
    });
    // Wait until the run is in flight (the task exists and is running).
    let executor = server.executor.clone();
    let auth = executor.runtime().auth_service().auth_context();
    eventually("the blocked request started a run", || {
        let (executor, auth) = (executor.clone(), auth.clone());
        async move {
            let tasks = executor
                .reads()
                .tasks(&auth, &Default::default())
                .await
                .unwrap();
            tasks
                .items
                .iter()
                .any(|t| executor.is_running(&auth, &t.id))
        }
    })
    .await;
    server.stop().await;
    let answer = blocked.await.unwrap();
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_WORKING",
        "{answer}"
    );
}

#[tokio::test]
async fn a_batch_answers_one_entry_per_request_with_an_id_and_none_for_notifications() {
    let server = TestServer::start().await;
    let task = server.send("hi", json!({})).await;
    let task_id = task["id"].as_str().unwrap();
    let body = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}},
        {"jsonrpc": "2.0", "method": "GetTask", "params": {"id": task_id}},
        {"jsonrpc": "2.0", "id": "two", "method": "GetTask", "params": {"id": "missing"}},
        {"jsonrpc": "2.0", "id": 3, "method": "NoSuchMethod"},
        42,
        {"jsonrpc": "2.0", "id": 4, "method": "SubscribeToTask", "params": {"id": task_id}},
        {"jsonrpc": "2.0", "id": 5, "method": "SendStreamingMessage", "params": {"message": user_message("x")}}
    ]);
    let (status, answer) = server.post_value(&body).await;
    assert_eq!(status, StatusCode::OK);
    let answers = answer.unwrap();
    let answers = answers.as_array().expect("a batch answers with an array");
    assert_eq!(answers.len(), 6, "{answers:?}");
    for entry in answers {
        assert_eq!(entry["jsonrpc"], "2.0");
    }
    let by_id = |id: Value| answers.iter().find(|a| a["id"] == id).unwrap().clone();
    assert_eq!(by_id(json!(1))["result"]["id"], task_id);
    assert_eq!(code(&by_id(json!("two"))), -32001);
    assert_eq!(code(&by_id(json!(3))), -32601);
    assert_eq!(code(&by_id(Value::Null)), -32600);
    assert_eq!(code(&by_id(json!(4))), -32004);
    assert_eq!(code(&by_id(json!(5))), -32004);
    // The streaming request in the batch was refused, not run: still one task only.
    let list = server.call("ListTasks", json!({})).await;
    assert_eq!(
        list["result"]["tasks"].as_array().unwrap().len(),
        1,
        "{list}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_batch_of_notifications_is_answered_with_no_content() {
    let server = TestServer::start().await;
    let body = json!([
        {"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}},
        {"jsonrpc": "2.0", "method": "ListTasks", "params": {}}
    ]);
    server.assert_unanswered(&body).await;
    server.stop().await;
}

#[tokio::test]
async fn the_card_is_cacheable_and_revalidates_with_its_etag() {
    let server = TestServer::start().await;
    let url = format!("{}/.well-known/agent-card.json", server.base);
    let first = server.http.get(&url).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let cache = first.headers()["cache-control"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cache.starts_with("public, max-age="), "{cache}");
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let modified = first.headers()["last-modified"].to_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc2822(modified).is_ok() && modified.ends_with(" GMT"),
        "an HTTP-date: {modified}"
    );
    // The same card, the same tag.
    let again = server.http.get(&url).send().await.unwrap();
    assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);

    let fresh = server
        .http
        .get(&url)
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(fresh.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(fresh.headers()["etag"].to_str().unwrap(), etag);
    assert!(fresh.bytes().await.unwrap().is_empty());

    let card: Value = server
        .http
        .get(&url)
        .header("If-None-Match", "\"something-else\"")
        .json_with_status(StatusCode::OK)
        .await;
    assert_eq!(card["name"], "echo");
    server.stop().await;
}

#[tokio::test]
async fn a_json_rpc_body_that_is_not_json_by_its_content_type_is_refused_415() {
    let server = TestServer::start().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "t"}});
    let answer: Value = server
        .post_v1("/")
        .header("content-type", "text/plain")
        .body(body.to_string())
        .json_with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        .await;
    assert_eq!(answer["error"]["code"], -32005, "{answer}");
    assert_eq!(answer["id"], Value::Null);
    // JSON by either name, with parameters, is read.
    for content_type in ["application/json; charset=utf-8", "application/a2a+json"] {
        let read: Value = server
            .http
            .post(format!("{}/", server.base))
            .header("content-type", content_type)
            .header("A2A-Version", "1.0")
            .body(body.to_string())
            .json_body()
            .await;
        assert_eq!(read["error"]["code"], -32001, "{content_type}: {read}");
    }
}

#[tokio::test]
async fn requests_may_name_fields_by_their_proto_names() {
    let server = TestServer::start().await;
    let sent = server
        .call(
            "SendMessage",
            json!({"message": {"message_id": "m-proto", "role": "ROLE_USER",
                               "parts": [{"text": "hello"}], "metadata": {"client_key": 1}},
                   "configuration": {"history_length": 5}}),
        )
        .await;
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(task["history"][0]["messageId"], "m-proto", "{sent}");
    let got = server
        .call("GetTask", json!({"id": task["id"], "history_length": 1}))
        .await;
    assert_eq!(
        got["result"]["history"].as_array().map(Vec::len),
        Some(1),
        "{got}"
    );
    server.stop().await;
}
