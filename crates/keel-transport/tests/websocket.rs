//! JSON-RPC over the WebSocket at `/ws`: unary calls, streams as several response frames
//! with the request's id, errors that keep the socket open, requests that run concurrently on
//! one socket, and cancellation from a separate control connection (another socket, or HTTP)
//! that ends the stream it stops.

mod support;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use keel_core::TaskState;
use keel_transport::A2aClient;
use serde_json::{json, Value};
use support::{connect_ws, next_ws, send_ws, user_message, Socket, TestServer, SLEEP_30};
use tokio_tungstenite::tungstenite::Message;

/// The next JSON-RPC frame (within 10 s).
async fn next(socket: &mut Socket) -> Value {
    next_ws(socket, Duration::from_secs(10)).await
}

async fn connect(server: &TestServer) -> Socket {
    connect_ws(&server.base, None).await
}

/// Request `id`: `method` (SendMessage or SendStreamingMessage) of a user message saying
/// `text`.
async fn send_text(socket: &mut Socket, id: &str, method: &str, text: &str) {
    send_ws(socket, id, method, json!({"message": user_message(text)})).await;
}

/// A stream of [`SLEEP_30`] opened on a new socket as request `long`: the socket and the
/// task's id (from the stream's first frame).
async fn sleeping_stream(server: &TestServer) -> (Socket, String) {
    let mut streaming = connect(server).await;
    send_text(&mut streaming, "long", "SendStreamingMessage", SLEEP_30).await;
    let first = next(&mut streaming).await;
    let task_id = first["result"]["task"]["id"].as_str().unwrap().to_owned();
    (streaming, task_id)
}

/// Read `socket`'s frames up to the one that reports the task canceled; that frame.
async fn until_canceled(socket: &mut Socket) -> Value {
    loop {
        let frame = next(socket).await;
        assert_eq!(frame["id"], "long", "{frame}");
        if frame["result"]["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED" {
            return frame;
        }
    }
}

fn state_of(result: &Value) -> Option<&str> {
    result
        .get("task")
        .and_then(|t| t["status"]["state"].as_str())
        .or_else(|| result["statusUpdate"]["status"]["state"].as_str())
}

#[tokio::test]
async fn unary_calls_and_errors_share_one_socket() {
    let server = TestServer::start().await;
    let mut socket = connect(&server).await;
    send_text(&mut socket, "s1", "SendMessage", "hello").await;
    let sent = next(&mut socket).await;
    assert_eq!(sent["id"], "s1", "{sent}");
    let task_id = sent["result"]["task"]["id"].as_str().unwrap().to_owned();
    assert_eq!(state_of(&sent["result"]), Some("TASK_STATE_COMPLETED"));

    send_ws(&mut socket, "g1", "GetTask", json!({"id": task_id})).await;
    let got = next(&mut socket).await;
    assert_eq!(got["id"], "g1");
    assert_eq!(got["result"]["id"], task_id.as_str());

    send_ws(&mut socket, "g2", "GetTask", json!({"id": "no-such-task"})).await;
    let missing = next(&mut socket).await;
    assert_eq!(missing["id"], "g2");
    assert_eq!(missing["error"]["code"], -32001, "{missing}");

    send_ws(&mut socket, "x", "NoSuchMethod", json!({})).await;
    assert_eq!(next(&mut socket).await["error"]["code"], -32601);
    socket.send(Message::text("{not json")).await.unwrap();
    let parse = next(&mut socket).await;
    assert_eq!(parse["error"]["code"], -32700);
    assert_eq!(parse["id"], Value::Null);
    socket.send(Message::text("[]")).await.unwrap();
    assert_eq!(next(&mut socket).await["error"]["code"], -32600);

    // Still serving after every error.
    send_ws(&mut socket, "l1", "ListTasks", json!({})).await;
    let list = next(&mut socket).await;
    assert_eq!(list["result"]["totalSize"], 1, "{list}");
    socket.close(None).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_stream_is_several_frames_with_the_request_id_ending_at_the_final_status() {
    let server = TestServer::start().await;
    let mut socket = connect(&server).await;
    send_text(
        &mut socket,
        "stream-1",
        "SendStreamingMessage",
        "stream this",
    )
    .await;
    let mut frames = Vec::new();
    loop {
        let frame = next(&mut socket).await;
        assert_eq!(frame["id"], "stream-1", "{frame}");
        let done = state_of(&frame["result"]) == Some("TASK_STATE_COMPLETED");
        frames.push(frame);
        if done {
            break;
        }
    }
    assert!(
        frames[0]["result"].get("task").is_some(),
        "starts with the task"
    );
    // The socket goes on serving after the stream.
    send_ws(&mut socket, "after", "ListTasks", json!({})).await;
    assert_eq!(next(&mut socket).await["id"], "after");
    server.stop().await;
}

#[tokio::test]
async fn cancel_on_a_control_connection_ends_the_stream_it_stops() {
    let server = TestServer::start().await;
    let (mut streaming, task_id) = sleeping_stream(&server).await;

    // The same socket still answers while its stream is open.
    send_ws(&mut streaming, "peek", "GetTask", json!({"id": task_id})).await;
    let peek = loop {
        let frame = next(&mut streaming).await;
        if frame["id"] == "peek" {
            break frame;
        }
    };
    assert!(peek.get("result").is_some(), "{peek}");

    // Cancel from a second socket: answered at once, not behind the stream.
    let mut control = connect(&server).await;
    send_ws(&mut control, "c1", "CancelTask", json!({"id": task_id})).await;
    let canceled = next(&mut control).await;
    assert_eq!(canceled["id"], "c1");
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );

    let last = until_canceled(&mut streaming).await;
    assert_eq!(last["result"]["statusUpdate"]["taskId"], task_id.as_str());
    server.stop().await;
}

#[tokio::test]
async fn cancel_over_http_ends_a_websocket_stream_and_a_hang_up_cancels_nothing() {
    let server = TestServer::start().await;
    let (mut streaming, task_id) = sleeping_stream(&server).await;

    // A second stream on another socket, whose client hangs up: the task goes on.
    let mut watcher = connect(&server).await;
    send_ws(
        &mut watcher,
        "sub",
        "SubscribeToTask",
        json!({"id": task_id}),
    )
    .await;
    assert_eq!(next(&mut watcher).await["id"], "sub");
    // Hang up, and wait until the server has answered the close (frames still in flight are
    // read past): it has then taken in the hang-up before the task is read.
    watcher.close(None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = watcher.next().await {}
    })
    .await
    .expect("the server closes its side within 10 s");
    let client = A2aClient::new(&server.base);
    let running = client
        .get_task(&task_id.clone().into(), None)
        .await
        .unwrap();
    assert_eq!(running.state(), TaskState::Working);

    let canceled = client
        .cancel_task(&task_id.clone().into(), None)
        .await
        .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    until_canceled(&mut streaming).await;
    server.stop().await;
}

#[tokio::test]
async fn an_upgrade_without_credentials_is_refused_when_security_is_on() {
    let runtime = std::sync::Arc::new(keel_runtime::Services::in_memory(std::sync::Arc::new(
        keel_llm::MockLlm::new(),
    )));
    let server = TestServer::start_with(runtime, |s| {
        s.with_security(keel_transport::Security::api_key_and_bearer())
    })
    .await;
    let url = format!("{}/ws", server.base.replacen("http://", "ws://", 1));
    let err = tokio_tungstenite::connect_async(url)
        .await
        .expect_err("no credentials, no socket");
    match err {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            assert_eq!(response.status(), 401);
        }
        other => panic!("expected HTTP 401, got {other:?}"),
    }
    server.stop().await;
}
