//! The asynchronous tool callback route over real HTTP: a tool server on 127.0.0.1:0
//! acknowledges the invocation, then POSTs the result to the Keel server's
//! `/callbacks/{call_id}`; forged, unknown and duplicate callbacks get 401, 404 and 409.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keel_agent::{
    Agent, AgentExecutor, AsyncHttpTool, AsyncInvocation, ExecutorConfig, SendOptions,
    CALLBACK_SECRET_HEADER,
};
use keel_core::{AgentCard, Message, PartContent, TaskState};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_runtime::{Runtime, Services};
use keel_transport::{A2aServer, StreamEvent};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A tool server on 127.0.0.1:0 that acknowledges each invocation, hands it to the test,
/// and gives it to `then` (which may play the tool's callback): its endpoint and the
/// invocations it received.
async fn tool_server(
    then: impl Fn(AsyncInvocation) + Clone + Send + Sync + 'static,
) -> (String, mpsc::UnboundedReceiver<AsyncInvocation>) {
    let (tx, seen) = mpsc::unbounded_channel::<AsyncInvocation>();
    let tool_app = axum::Router::new().route(
        "/invoke",
        axum::routing::post(move |axum::Json(inv): axum::Json<AsyncInvocation>| {
            let (tx, then) = (tx.clone(), then.clone());
            async move {
                let _ = tx.send(inv.clone());
                then(inv);
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let tool_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/invoke", tool_listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(tool_listener, tool_app).await });
    (endpoint, seen)
}

/// The Keel server of an agent whose `report` tool is the asynchronous HTTP tool at
/// `endpoint`, its callbacks addressed to the server itself: its base URL and executor.
async fn report_server(endpoint: String) -> (String, AgentExecutor) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
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
    tokio::spawn(A2aServer::new(executor.clone()).serve(listener, std::future::pending()));
    (base, executor)
}

#[tokio::test]
async fn a_tool_server_calls_back_over_http_and_bad_callbacks_get_clear_errors() {
    // The tool server: acknowledges, then calls back a little later.
    let (endpoint, mut seen) = tool_server(|inv| {
        tokio::spawn(async move {
            // The remote job's own latency (the callback comes after the
            // acknowledgement), not a wait for a state.
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
    })
    .await;

    // The Keel server, whose address is the callback base URL.
    let (base, executor) = report_server(endpoint).await;
    let auth = executor.runtime().auth_service().auth_context();

    // A result posted to `url` with `secret`: the answer's status and error code, if any.
    let post_result = |url: String, secret: String| async move {
        let response = reqwest::Client::new()
            .post(url)
            .header(CALLBACK_SECRET_HEADER, secret)
            .json(&json!({"output": 1}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        (status, body["error"]["code"].clone())
    };
    let unknown = post_result(format!("{base}/callbacks/nope"), "x".into()).await;
    assert_eq!(unknown, (StatusCode::NOT_FOUND, json!("unknown_call")));

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
    let forged = post_result(inv.callback_url.clone(), "forged".into()).await;
    assert_eq!(forged.0, StatusCode::UNAUTHORIZED);
    let duplicate = post_result(inv.callback_url.clone(), inv.callback_secret.clone()).await;
    assert_eq!(duplicate, (StatusCode::CONFLICT, json!("duplicate")));
}

#[tokio::test]
async fn progress_events_reach_the_tasks_stream_and_the_run_before_the_one_result() {
    // The tool server acknowledges and hands the invocation to the test, which plays the
    // tool's callbacks itself.
    let (endpoint, mut seen) = tool_server(|_| {}).await;
    let (base, executor) = report_server(endpoint).await;
    let sink = Arc::new(keel_events::InMemoryEventSink::new());
    executor.add_event_sink(sink.clone() as Arc<dyn keel_events::EventSink>);

    // A subscriber follows the task from its start.
    let client = keel_transport::A2aClient::new(base.clone());
    let mut stream = client
        .send_streaming_message(Message::user("report please"))
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(first, StreamEvent::Task(_)), "{first:?}");

    let inv = seen.recv().await.unwrap();
    let http = reqwest::Client::new();
    let callback = |body: Value| {
        http.post(&inv.callback_url)
            .header(CALLBACK_SECRET_HEADER, &inv.callback_secret)
            .json(&body)
            .send()
    };
    for percent in [40, 90] {
        let response = callback(json!({"kind": "event", "event": {"percent": percent}}))
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        assert_eq!(response.json::<Value>().await.unwrap()["kind"], "event");
    }
    let unknown_kind = callback(json!({"kind": "gossip"})).await.unwrap();
    assert_eq!(unknown_kind.status(), 400);
    let result = callback(json!({"output": {"report": "ready"}}))
        .await
        .unwrap();
    assert_eq!(result.status(), 202);
    // After the result: progress is refused, and the result arrives only once.
    let late = callback(json!({"kind": "event", "event": {"percent": 100}}))
        .await
        .unwrap();
    assert_eq!(late.status(), 409);
    assert_eq!(
        late.json::<Value>().await.unwrap()["error"]["code"],
        "result_delivered"
    );
    let again = callback(json!({"kind": "result", "output": 2}))
        .await
        .unwrap();
    assert_eq!(again.status(), 409);

    // The stream carried both reports, in order, as working updates, then the answer.
    let mut progress = Vec::new();
    let mut last_state = None;
    while let Some(event) = stream.next().await {
        if let StreamEvent::StatusUpdate { status, .. } = event.unwrap() {
            last_state = Some(status.state);
            let Some(message) = status.message else {
                continue;
            };
            if let Some(PartContent::Data { data }) = message.parts.first().map(|p| &p.content) {
                assert_eq!(status.state, TaskState::Working);
                progress.push(data["percent"].clone());
            }
        }
    }
    assert_eq!(progress, [json!(40), json!(90)]);
    assert_eq!(last_state, Some(TaskState::Completed));

    // The run's events: two progress reports, then the one result.
    let kinds: Vec<(String, Value)> = sink
        .events()
        .iter()
        .filter(|e| e.event_type.as_str().starts_with("tool.async."))
        .map(|e| {
            (
                e.event_type.as_str().to_owned(),
                e.payload["progress"].clone(),
            )
        })
        .collect();
    let names: Vec<&str> = kinds.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "tool.async.dispatched",
            "tool.async.acknowledged",
            "tool.async.progress",
            "tool.async.progress",
            "tool.async.result"
        ]
    );
    assert_eq!(kinds[2].1, json!({"percent": 40}));
    assert_eq!(kinds[3].1, json!({"percent": 90}));
}
