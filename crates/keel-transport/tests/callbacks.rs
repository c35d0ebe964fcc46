//! The asynchronous tool callback route over real HTTP: a tool server on 127.0.0.1:0
//! acknowledges the invocation, then POSTs the result to the Keel server's
//! `/callbacks/{call_id}`; forged, unknown and duplicate callbacks get 401, 404 and 409.

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{
    Agent, AgentExecutor, AsyncHttpTool, AsyncInvocation, ExecutorConfig, SendOptions,
    CALLBACK_SECRET_HEADER,
};
use keel_core::{AgentCard, Message, TaskState};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_runtime::{Runtime, Services};
use keel_transport::A2aServer;
use serde_json::{json, Value};
use tokio::sync::mpsc;

#[tokio::test]
async fn a_tool_server_calls_back_over_http_and_bad_callbacks_get_clear_errors() {
    // The tool server: acknowledges, then calls back a little later.
    let (tx, mut seen) = mpsc::unbounded_channel::<AsyncInvocation>();
    let tool_app = axum::Router::new().route(
        "/invoke",
        axum::routing::post(move |axum::Json(inv): axum::Json<AsyncInvocation>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(inv.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let response = reqwest::Client::new()
                        .post(&inv.callback_url)
                        .header(CALLBACK_SECRET_HEADER, &inv.callback_secret)
                        .json(&json!({"output": {"report": "ready"}}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 202);
                });
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let tool_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/invoke", tool_listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(tool_listener, tool_app).await });

    // The Keel server, whose address is the callback base URL.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let auth = runtime.auth_service().auth_context();
    let agent = Agent::builder(AgentCard::new("rap", "async tools", &base))
        .llm(MockLlm::scripted(vec![
            MockResponse::ToolCalls(vec![ToolCall::new("report", json!({}))]),
            MockResponse::Text("the report is ready".into()),
        ]))
        .tool(AsyncHttpTool::new(
            "report",
            "Build a report",
            json!({"type": "object"}),
            endpoint,
        ))
        .build()
        .unwrap();
    let config = ExecutorConfig {
        callbacks: Some(keel_transport::callbacks::HttpCallbacks::shared(
            base.clone(),
        )),
        ..ExecutorConfig::default()
    };
    let executor = AgentExecutor::with_config(agent, runtime, config);
    let server = A2aServer::new(executor.clone());
    tokio::spawn(server.serve(listener, std::future::pending()));

    let http = reqwest::Client::new();
    let unknown = http
        .post(format!("{base}/callbacks/nope"))
        .header(CALLBACK_SECRET_HEADER, "x")
        .json(&json!({"output": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        unknown.json::<Value>().await.unwrap()["error"]["code"],
        "unknown_call"
    );

    let task = executor
        .send_message(
            &auth,
            Message::user("report please"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(
        task.status().message.as_ref().unwrap().text(),
        "the report is ready"
    );

    let inv = seen.recv().await.unwrap();
    let forged = http
        .post(&inv.callback_url)
        .header(CALLBACK_SECRET_HEADER, "forged")
        .json(&json!({"output": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let duplicate = http
        .post(&inv.callback_url)
        .header(CALLBACK_SECRET_HEADER, &inv.callback_secret)
        .json(&json!({"output": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(duplicate.status(), 409);
    assert_eq!(
        duplicate.json::<Value>().await.unwrap()["error"]["code"],
        "duplicate"
    );
}
