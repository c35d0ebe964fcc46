//! Custom endpoints beside A2A (`EndpointSpec`): served at `/x/{path}` with the server's
//! credentials and the caller's tenant, under `/agents/{name}/` too, with typed errors as
//! HTTP statuses; and the operator's thread compaction served as one of them.

mod support;

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, SendOptions};
use keel_core::{AgentCard, AgentError, Message, ThreadId};
use keel_llm::{MockLlm, MockResponse};
use keel_runtime::{AuthContext, Runtime};
use keel_transport::{
    A2aServer, AgentsServer, EndpointContent, EndpointSpec, HttpMethod, Security,
};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use support::{ALICE, BOB};

fn runtime(llm: MockLlm) -> Arc<dyn Runtime> {
    support::two_tenant_runtime(llm)
}

fn executor(runtime: Arc<dyn Runtime>, llm: Option<MockLlm>) -> AgentExecutor {
    let mut agent = Agent::builder(AgentCard::new("ops", "operations", "http://unused"))
        .instructions("Answer briefly.");
    if let Some(llm) = llm {
        agent = agent.llm(llm);
    }
    AgentExecutor::new(agent.build().unwrap(), runtime)
}

fn endpoints() -> Vec<EndpointSpec> {
    let whoami = EndpointSpec::new("whoami", "/whoami", HttpMethod::Get, |request| async move {
        Ok(json!({"tenant": request.auth.app_name, "input": request.input}))
    })
    .unwrap();
    #[derive(Deserialize)]
    struct Double {
        n: u32,
    }
    let double = EndpointSpec::new(
        "double",
        "math/double",
        HttpMethod::Post,
        |request| async move {
            let Double { n } = request.input_as()?;
            Ok(json!({"double": n * 2}))
        },
    )
    .unwrap();
    let missing = EndpointSpec::new("missing", "math/missing", HttpMethod::Post, |_| async {
        Err(AgentError::TaskNotFound {
            task_id: "t-404".into(),
        })
    })
    .unwrap();
    let page = EndpointSpec::new("page", "page", HttpMethod::Get, |_| async {
        Ok(json!("<h1>ops</h1>"))
    })
    .unwrap()
    .with_content(EndpointContent::Html);
    vec![whoami, double, missing, page]
}

async fn serve(server: impl FnOnce(String) -> axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = server(base.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

async fn call(
    method: reqwest::Method,
    url: String,
    key: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(key) = key {
        request = request.header("X-API-Key", key);
    }
    if let Some(body) = body {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

#[tokio::test]
async fn custom_endpoints_are_served_per_tenant_with_the_servers_security() {
    let exec = executor(runtime(MockLlm::new()), None);
    let mut server = A2aServer::new(exec).with_security(Security::api_key_and_bearer());
    for spec in endpoints() {
        server = server.with_endpoint(spec);
    }
    let base = serve(move |base| server.router(base)).await;
    use reqwest::Method;

    // An endpoint called by Alice, without a body.
    let as_alice = |method, path: &str| call(method, format!("{base}/x/{path}"), Some(ALICE), None);
    let (status, headers, _) = call(Method::GET, format!("{base}/x/whoami"), None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.contains_key("www-authenticate"));

    let (status, _, body) = as_alice(Method::GET, "whoami?q=1").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        json_of(&body),
        json!({"tenant": "acme", "input": {"q": "1"}})
    );
    let (_, _, body) = call(Method::GET, format!("{base}/x/whoami"), Some(BOB), None).await;
    assert_eq!(json_of(&body)["tenant"], "globex");

    // Typed input: a wrong shape or a body that is not JSON is 400; an error the handler
    // returns keeps its HTTP status.
    let double = format!("{base}/x/math/double");
    let (status, _, body) = call(Method::POST, double, Some(ALICE), Some(r#"{"n": 21}"#)).await;
    assert_eq!(
        (status, json_of(&body)),
        (StatusCode::OK, json!({"double": 42}))
    );
    // ...and unknown paths are 404.
    for (method, path, input, expected) in [
        (
            Method::POST,
            "math/double",
            Some(r#"{"n": "x"}"#),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            "math/double",
            Some("{not json"),
            StatusCode::BAD_REQUEST,
        ),
        (Method::POST, "math/missing", None, StatusCode::NOT_FOUND),
        (Method::GET, "nothing", None, StatusCode::NOT_FOUND),
    ] {
        let url = format!("{base}/x/{path}");
        let (status, _, body) = call(method.clone(), url, Some(ALICE), input).await;
        assert_eq!(status, expected, "{method} {path}: {body}");
    }
    // A known path with another method is 405 naming the methods.
    let (status, headers, _) = as_alice(Method::DELETE, "whoami").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "GET");

    let (status, headers, body) = as_alice(Method::GET, "page").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert_eq!(body, "<h1>ops</h1>");

    // A2A is still served beside them.
    let (status, _, _) = call(
        Method::GET,
        format!("{base}/.well-known/agent-card.json"),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn endpoints_answer_under_the_agents_path_and_a_tenant_prefix() {
    let exec = executor(runtime(MockLlm::new()), None);
    let mut server = A2aServer::new(exec);
    for spec in endpoints() {
        server = server.with_endpoint(spec);
    }
    let agents = AgentsServer::new().with_agent("ops", server);
    let base = serve(move |base| agents.router(&base)).await;
    use reqwest::Method;
    for (path, expected) in [
        ("ops/x/whoami", StatusCode::OK),
        ("ops/acme/x/whoami", StatusCode::OK),
        ("other/x/whoami", StatusCode::NOT_FOUND),
    ] {
        let url = format!("{base}/agents/{path}");
        let (status, _, body) = call(Method::GET, url, Some(ALICE), None).await;
        assert_eq!(status, expected, "{path}: {body}");
        if status == StatusCode::OK {
            assert_eq!(json_of(&body)["tenant"], "acme");
        }
    }
}

#[tokio::test]
async fn the_compaction_endpoint_compacts_the_callers_thread_only() {
    let llm = || {
        MockLlm::scripted(
            ["a1", "a2", "a3"]
                .map(|a| MockResponse::Text(a.into()))
                .to_vec(),
        )
    };
    let runtime = runtime(llm());
    let exec = executor(runtime.clone(), Some(llm()));
    let alice = AuthContext::new("acme", "alice");
    let thread = ThreadId::new();
    for question in ["q1", "q2", "q3"] {
        exec.send_message(
            &alice,
            Message::user(question).in_thread(thread.clone()),
            SendOptions::default(),
        )
        .await
        .unwrap();
    }
    let server = A2aServer::new(exec)
        .with_security(Security::api_key_and_bearer())
        .with_endpoint(EndpointSpec::compact_thread());
    let base = serve(move |base| server.router(base)).await;
    let url = format!("{base}/x/threads/compact");
    let body = json!({"thread_id": thread, "strategy": "recent", "max_messages": 3}).to_string();
    use reqwest::Method;

    // Bob's tenant has no such thread: nothing to compact.
    let (status, _, answer) = call(Method::POST, url.clone(), Some(BOB), Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(json_of(&answer)["removed_messages"], 0);

    let (status, _, answer) = call(Method::POST, url.clone(), Some(ALICE), Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let result = json_of(&answer);
    assert_eq!(
        (
            &result["before_messages"],
            &result["after_messages"],
            &result["removed_messages"]
        ),
        (&json!(7), &json!(3), &json!(4))
    );

    let (status, _, _) = call(
        Method::POST,
        url,
        Some(ALICE),
        Some(r#"{"strategy": "recent"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a thread must be named");
}
