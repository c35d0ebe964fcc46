//! The scoped-variable completion flow of subagents over real HTTP (Standard Agents §7.5):
//! a parent's `subagent_create` lacks a scoped variable, `GET
//! /threads/{parent}/variables/{request}` describes the request to its own tenant only, and
//! `POST` stores the value and starts the deferred subagent at once.

mod support;

use std::sync::{Arc, Mutex};

use keel_agent::{Agent, AgentExecutor, Environment, SubagentSpec, SECRETS_KEY_VAR};
use keel_core::{AgentCard, ThreadId};
use keel_llm::{LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::testing::eventually;
use keel_runtime::{AuthContext, Runtime};
use keel_transport::{A2aServer, Security};
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::{object_tool, SendJson, ALICE, BOB};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn card(name: &str) -> AgentCard {
    AgentCard::new(name, "variables over HTTP", "http://127.0.0.1:0")
}

/// Another tenant's request is answered as one that does not exist: 404 `unknown_request`.
async fn assert_unknown_request(response: reqwest::Response) {
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_request", "{body}");
}

/// The first id-looking token after `"request_id"` in a tool result.
fn request_id_in(text: &str) -> String {
    let at = text
        .find("request_id")
        .expect("the bootstrap error names its request");
    text[at + "request_id".len()..]
        .chars()
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect()
}

#[tokio::test]
async fn missing_scoped_variables_are_described_and_provided_over_http_in_the_callers_tenant() {
    let alice = AuthContext::new("acme", "alice");
    let runtime: Arc<dyn Runtime> = support::two_tenant_runtime(MockLlm::new());
    let env = Environment::isolated().with_var(SECRETS_KEY_VAR, KEY);
    let seen = Arc::new(Mutex::new(Vec::<Option<String>>::new()));
    let reader = {
        let seen = seen.clone();
        object_tool("check_token", "Checks the token", move |_a, ctx| {
            let seen = seen.clone();
            async move {
                let value = ctx.thread.scoped_variable("API_TOKEN").await?;
                seen.lock().unwrap().push(value);
                Ok(json!("checked"))
            }
        })
    };
    let child = AgentExecutor::new(
        Agent::builder(card("researcher"))
            .environment(env.clone())
            .llm(MockLlm::scripted(vec![
                MockResponse::ToolCalls(vec![ToolCall::new("check_token", json!({}))]),
                MockResponse::Text("found A".into()),
            ]))
            .tool(reader)
            .build()
            .unwrap(),
        runtime.clone(),
    );
    let executor = AgentExecutor::new(
        Agent::builder(card("lead"))
            .environment(env)
            .llm(MockLlm::scripted(vec![
                MockResponse::ToolCalls(vec![ToolCall::new(
                    "subagent_create",
                    json!({"name": "alpha", "message": "find A"}),
                )]),
                MockResponse::Text("waiting".into()),
                MockResponse::Text("got it".into()),
            ]))
            .subagent(SubagentSpec::new("researcher", child).scoped_env(["API_TOKEN"]))
            .build()
            .unwrap(),
        runtime.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = A2aServer::new(executor.clone()).with_security(Security::api_key_and_bearer());
    tokio::spawn(server.serve(listener, std::future::pending()));

    // Alice's parent task asks for the subagent; the variable is missing.
    let task = support::completed_task(&executor, &alice, "go").await;
    let thread: ThreadId = task.thread_id.clone();
    let history = executor
        .thread(&alice, thread.clone())
        .history()
        .await
        .unwrap();
    let result = history
        .iter()
        .find(|e| e.message.role == LlmRole::Tool)
        .unwrap()
        .message
        .content
        .clone();
    assert!(result.contains("scoped_variables_missing"), "{result}");
    let request_id = request_id_in(&result);
    let url = format!("{base}/threads/{thread}/variables/{request_id}");
    let http = reqwest::Client::new();
    // The request read, or answered with `body`, as the caller of `key`.
    let get = |key: &str| http.get(&url).header("X-API-Key", key).send();
    let post = |key: &str, body: Value| http.post(&url).header("X-API-Key", key).json(&body).send();

    // Without credentials: 401. Another tenant: not found.
    assert_eq!(
        http.get(&url).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_unknown_request(get(BOB).await.unwrap()).await;
    let stolen = json!({"variables": {"API_TOKEN": "stolen"}});
    assert_unknown_request(post(BOB, stolen).await.unwrap()).await;
    // Even naming Alice's tenant in the path does not widen Bob's access.
    let hinted = http
        .get(format!(
            "{base}/acme/threads/{thread}/variables/{request_id}"
        ))
        .header("X-API-Key", BOB)
        .send()
        .await
        .unwrap();
    assert_unknown_request(hinted).await;

    // Alice sees what is missing.
    let described: Value = http
        .get(&url)
        .header("X-API-Key", ALICE)
        .json_with_status(StatusCode::OK)
        .await;
    assert_eq!(described["missing"], json!(["API_TOKEN"]));
    assert_eq!(described["name"], "alpha");
    assert_eq!(described["subagent"], "researcher");
    assert_eq!(described["request_id"], json!(request_id));

    // A body lacking the variable, or no JSON at all: 400, nothing starts.
    let lacking: Value = http
        .post(&url)
        .header("X-API-Key", ALICE)
        .json(&json!({"variables": {}}))
        .json_with_status(StatusCode::BAD_REQUEST)
        .await;
    assert!(lacking["error"]["message"]
        .as_str()
        .unwrap()
        .contains("API_TOKEN"));
    let garbage = http
        .post(&url)
        .header("X-API-Key", ALICE)
        .header("content-type", "application/json")
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
    assert!(executor
        .thread(&alice, thread.clone())
        .children()
        .await
        .unwrap()
        .is_empty());

    // Providing it starts the subagent at once; the value is never echoed.
    let value = json!({"variables": {"API_TOKEN": "tok-http"}});
    let provided = post(ALICE, value.clone()).await.unwrap();
    assert_eq!(provided.status(), StatusCode::CREATED);
    let provided = provided.text().await.unwrap();
    assert!(!provided.contains("tok-http"));
    let provided: Value = serde_json::from_str(&provided).unwrap();
    assert_eq!(provided["child"]["name"], "alpha");
    assert_eq!(provided["child"]["parent_thread_id"], json!(thread));

    // Used up: both verbs now answer 404.
    let again = get(ALICE).await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
    let again = post(ALICE, value).await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_FOUND);

    // The child ran with the value and its answer reached the parent thread.
    let parent = executor.thread(&alice, thread.clone());
    eventually("the child's answer on the parent thread", || async {
        parent.history().await.unwrap().iter().any(|e| {
            e.message
                .content
                .contains("[subagent alpha] completed: found A")
        })
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [Some("tok-http".to_owned())]
    );
}
