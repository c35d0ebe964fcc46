//! Authentication and tenancy over both bindings: the card's security schemes, HTTP 401 with
//! `WWW-Authenticate` for missing or wrong credentials, the extended card for authenticated
//! callers only, and two tenants (two API keys) that never see each other's tasks.

mod support;

use std::sync::Arc;

use keel_core::AgentCard;
use keel_llm::MockLlm;
use keel_runtime::{ApiKeyAuthService, AuthContext, Services};
use keel_transport::{A2aServer, Security};
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{user_message, TestServer, ALICE, BOB, SLEEP_30};

fn runtime() -> Arc<Services> {
    support::two_tenant_runtime(MockLlm::new())
}

async fn secured(configure: impl FnOnce(A2aServer) -> A2aServer) -> TestServer {
    TestServer::start_with(runtime(), |server| {
        configure(server.with_security(Security::api_key_and_bearer()))
    })
    .await
}

/// A JSON-RPC v1.0 call with the API key `key` (none when `None`): status and body.
async fn rpc_as(
    server: &TestServer,
    key: Option<&str>,
    method: &str,
    params: Value,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let mut request = server
        .post_v1("/")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    if let Some(key) = key {
        request = request.header("X-API-Key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body, headers)
}

async fn rest_as(
    server: &TestServer,
    key: &str,
    method: reqwest::Method,
    path: &str,
) -> (StatusCode, Value) {
    let response = server
        .http
        .request(method, format!("{}{path}", server.base))
        .header("X-API-Key", key)
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or(0)
}

fn challenges(headers: &reqwest::header::HeaderMap) -> Vec<String> {
    headers
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_card_is_public_and_declares_api_key_and_bearer_schemes() {
    let server = secured(|s| s).await;
    let card: Value = server.card().await;
    let schemes = &card["securitySchemes"];
    assert_eq!(
        schemes["apiKey"]["apiKeySecurityScheme"]["name"], "X-API-Key",
        "{card}"
    );
    assert_eq!(
        schemes["apiKey"]["apiKeySecurityScheme"]["location"],
        "header"
    );
    assert_eq!(
        schemes["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    let requirements = card["securityRequirements"].as_array().unwrap();
    assert!(requirements.contains(&json!({"schemes": {"apiKey": {"list": []}}})));
    assert!(requirements.contains(&json!({"schemes": {"bearer": {"list": []}}})));
    assert_eq!(card["capabilities"]["extendedAgentCard"], false);

    // A v0.3 caller sees the same schemes in v0.3's shape.
    let card: Value = server.get_json_as(Some("0.3"), support::CARD_PATH).await;
    let schemes = &card["securitySchemes"];
    assert_eq!(schemes["apiKey"]["type"], "apiKey", "{card}");
    assert_eq!(schemes["apiKey"]["in"], "header");
    assert_eq!(schemes["apiKey"]["name"], "X-API-Key");
    assert_eq!(schemes["bearer"]["type"], "http");
    assert_eq!(schemes["bearer"]["scheme"], "Bearer");
    let security = card["security"].as_array().unwrap();
    assert!(security.contains(&json!({"apiKey": []})));
    assert!(security.contains(&json!({"bearer": []})));
    server.stop().await;
}

#[tokio::test]
async fn missing_or_wrong_credentials_are_401_with_www_authenticate_on_both_bindings() {
    let server = secured(|s| s).await;
    for key in [None, Some("wrong")] {
        let (status, body, headers) = rpc_as(&server, key, "ListTasks", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let challenges = challenges(&headers);
        assert!(
            challenges.iter().any(|c| c.starts_with("Bearer")),
            "{challenges:?}"
        );
        assert!(
            challenges.iter().any(|c| c.contains("X-API-Key")),
            "{challenges:?}"
        );
        assert_eq!(body["jsonrpc"], "2.0");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("authentication"));

        let mut request = server.get_v1("/tasks");
        if let Some(key) = key {
            request = request.header("X-API-Key", key);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response.headers().get("www-authenticate").is_some());
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["status"], "UNAUTHENTICATED");
    }
    // A batch is one HTTP request: refused as a whole.
    let response = server
        .http
        .post(format!("{}/", server.base))
        .json(&json!([{"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // A bearer token works as well as the API key header.
    let response = server
        .get_v1("/tasks")
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn the_extended_card_is_only_for_authenticated_callers() {
    let extended = AgentCard::new("echo-extended", "Echoes, with more skills", "http://unused");
    let server = secured(|s| s.with_extended_card(extended)).await;
    let card: Value = server.get_json_as(None, support::CARD_PATH).await;
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);

    let (status, _, _) = rpc_as(&server, None, "GetExtendedAgentCard", json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body, _) = rpc_as(&server, Some(ALICE), "GetExtendedAgentCard", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["result"]["name"], "echo-extended", "{body}");
    assert!(body["result"]["securitySchemes"]["apiKey"].is_object());
    let (status, body) = rest_as(&server, BOB, reqwest::Method::GET, "/extendedAgentCard").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["name"], "echo-extended");
    server.stop().await;

    // Without one configured, an authenticated caller still learns there is none.
    let server = secured(|s| s).await;
    let (_, body, _) = rpc_as(&server, Some(ALICE), "GetExtendedAgentCard", json!({})).await;
    assert_eq!(code(&body), -32004, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_tenant_can_never_reach_another_tenants_tasks() {
    let server = secured(|s| s.allow_private_push_targets(true)).await;
    // Alice's JSON-RPC call of `method`: the answer.
    let on = &server;
    let as_alice = |method: &'static str, params: Value| async move {
        rpc_as(on, Some(ALICE), method, params).await.1
    };
    let sleeping =
        json!({"message": user_message(SLEEP_30), "configuration": {"returnImmediately": true}});
    let sent = as_alice("SendMessage", sleeping).await;
    let task_id = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    let done = as_alice("SendMessage", json!({"message": user_message("hello")})).await;
    let done_id = done["result"]["task"]["id"].as_str().unwrap().to_owned();
    let hook = json!({"taskId": task_id, "id": "alice-hook", "url": "http://127.0.0.1:9/hook", "token": "alice-secret"});
    let created = as_alice("CreateTaskPushNotificationConfig", hook).await;
    assert_eq!(created["result"]["id"], "alice-hook", "{created}");

    for id in [&task_id, &done_id] {
        for method in ["GetTask", "CancelTask", "SubscribeToTask"] {
            let (status, body, _) = rpc_as(&server, Some(BOB), method, json!({"id": id})).await;
            assert_eq!(status, StatusCode::OK, "{method}: {body}");
            assert_eq!(code(&body), -32001, "{method}: {body}");
        }
        for (method, params) in [
            (
                "CreateTaskPushNotificationConfig",
                json!({"taskId": id, "id": "alice-hook", "url": "http://127.0.0.1:9/bob"}),
            ),
            (
                "GetTaskPushNotificationConfig",
                json!({"taskId": id, "id": "alice-hook"}),
            ),
            ("ListTaskPushNotificationConfigs", json!({"taskId": id})),
            (
                "DeleteTaskPushNotificationConfig",
                json!({"taskId": id, "id": "alice-hook"}),
            ),
        ] {
            let (_, body, _) = rpc_as(&server, Some(BOB), method, params).await;
            assert_eq!(code(&body), -32001, "{method}: {body}");
        }
        // Routing to Alice's tenant changes nothing: the key decides.
        for (method, path) in [
            (reqwest::Method::GET, format!("/tasks/{id}")),
            (reqwest::Method::POST, format!("/tasks/{id}:cancel")),
            (reqwest::Method::GET, format!("/tasks/{id}:subscribe")),
            (reqwest::Method::GET, format!("/acme/tasks/{id}")),
            (reqwest::Method::POST, format!("/acme/tasks/{id}:cancel")),
            (
                reqwest::Method::GET,
                format!("/acme/tasks/{id}/pushNotificationConfigs"),
            ),
            (
                reqwest::Method::GET,
                format!("/tasks/{id}/pushNotificationConfigs/alice-hook"),
            ),
            (
                reqwest::Method::DELETE,
                format!("/acme/tasks/{id}/pushNotificationConfigs/alice-hook"),
            ),
        ] {
            let (status, body) = rest_as(&server, BOB, method.clone(), &path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
            assert_eq!(
                body["error"]["details"][0]["reason"], "TASK_NOT_FOUND",
                "{method} {path}: {body}"
            );
        }
    }
    for params in [json!({}), json!({"tenant": "acme"})] {
        let (_, list, _) = rpc_as(&server, Some(BOB), "ListTasks", params).await;
        assert_eq!(list["result"]["tasks"], json!([]), "{list}");
    }
    let (_, list) = rest_as(&server, BOB, reqwest::Method::GET, "/acme/tasks").await;
    assert_eq!(list["tasks"], json!([]), "{list}");

    // Alice's config is untouched.
    let (_, config, _) = rpc_as(
        &server,
        Some(ALICE),
        "GetTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "alice-hook"}),
    )
    .await;
    assert_eq!(
        config["result"]["url"], "http://127.0.0.1:9/hook",
        "{config}"
    );
    // Alice still sees both, and her running task was not canceled by Bob.
    let (_, list, _) = rpc_as(&server, Some(ALICE), "ListTasks", json!({})).await;
    assert_eq!(
        list["result"]["tasks"].as_array().unwrap().len(),
        2,
        "{list}"
    );
    let (_, task, _) = rpc_as(&server, Some(ALICE), "GetTask", json!({"id": task_id})).await;
    assert_ne!(
        task["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{task}"
    );
    let (_, canceled, _) = rpc_as(&server, Some(ALICE), "CancelTask", json!({"id": task_id})).await;
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    server.stop().await;
}

/// An auth service like many an application writes: the first secret it knows decides.
struct FirstKnownSecret(ApiKeyAuthService, [&'static str; 2]);

impl keel_runtime::AuthService for FirstKnownSecret {
    fn auth_context(&self) -> AuthContext {
        self.0.auth_context()
    }

    fn authenticate(
        &self,
        credentials: &keel_runtime::Credentials,
    ) -> keel_core::AgentResult<Option<AuthContext>> {
        let known = [&credentials.api_key, &credentials.bearer]
            .into_iter()
            .flatten()
            .find(|secret| self.1.contains(&secret.as_str()));
        match known {
            Some(secret) => self.0.authenticate(&keel_runtime::Credentials {
                api_key: Some(secret.clone()),
                ..keel_runtime::Credentials::default()
            }),
            None => Ok(None),
        }
    }
}

#[tokio::test]
async fn a_wrong_api_key_beside_a_valid_bearer_token_is_refused() {
    let auth = FirstKnownSecret(support::two_tenants(), [ALICE, BOB]);
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())).with_auth(auth));
    let server =
        TestServer::start_with(runtime, |s| s.with_security(Security::api_key_and_bearer())).await;
    let list = |key: &'static str, token: &'static str| {
        server
            .post_v1("/")
            .header("X-API-Key", key)
            .bearer_auth(token)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}))
            .send()
    };
    for (key, token) in [("wrong", ALICE), (ALICE, "wrong"), (ALICE, BOB)] {
        let response = list(key, token).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{key} + {token}"
        );
        assert!(!challenges(response.headers()).is_empty());
    }
    // Over HTTP+JSON too.
    let response = server
        .get_v1("/tasks")
        .header("X-API-Key", "wrong")
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Both naming the same caller is fine.
    let response = list(ALICE, ALICE).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert!(body["result"]["tasks"].is_array(), "{body}");
}
