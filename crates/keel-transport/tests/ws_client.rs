//! `A2aClient::ws`: every `AgentTransport` operation over the WebSocket endpoint of a real
//! server on 127.0.0.1:0, streams as a `Stream` ending at the final status, typed errors, and
//! a cancel on the control socket that ends the stream it stops while that stream is open.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keel_core::{AgentError, Message, TaskState};
use keel_transport::{A2aClient, AgentTransport, SendMessageOptions, StreamEvent, TaskListQuery};
use support::{TestServer, SLEEP_30};

/// The client as the trait object callers hold.
fn client(server: &TestServer) -> Arc<dyn AgentTransport> {
    Arc::new(A2aClient::ws(&server.base))
}

fn state_of(event: &StreamEvent) -> Option<TaskState> {
    match event {
        StreamEvent::Task(task) => Some(task.state()),
        StreamEvent::StatusUpdate { status, .. } => Some(status.state),
        _ => None,
    }
}

#[tokio::test]
async fn unary_operations_answer_in_keel_models_and_typed_errors() {
    let server = TestServer::start().await;
    let client = client(&server);

    let card = client.get_card().await.unwrap();
    assert_eq!(card.name, "echo");

    let task = client
        .send_message(Message::user("hello"), SendMessageOptions::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(
        task.status().message.as_ref().map(Message::text).as_deref(),
        Some("You said: hello")
    );

    let got = client.get_task(&task.id, Some(1)).await.unwrap();
    assert_eq!(got.id, task.id);
    assert_eq!(got.state(), TaskState::Completed);
    assert_eq!(got.history.len(), 1);

    let listed = client.list_tasks(&TaskListQuery::default()).await.unwrap();
    assert!(listed.tasks.iter().any(|t| t.id == task.id));

    support::assert_typed_errors(&*client, &task).await;
    server.stop().await;
}

#[tokio::test]
async fn a_streamed_send_yields_events_until_the_final_status() {
    let server = TestServer::start().await;
    let client = client(&server);
    let events: Vec<StreamEvent> = client
        .send_streaming_message(Message::user("stream me"))
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert!(
        matches!(events.first(), Some(StreamEvent::Task(_))),
        "{events:?}"
    );
    assert_eq!(
        events.last().and_then(state_of),
        Some(TaskState::Completed),
        "{events:?}"
    );
    assert!(events.last().unwrap().is_final());
    server.stop().await;
}

#[tokio::test]
async fn cancel_on_the_control_socket_ends_the_open_stream_it_stops() {
    let server = TestServer::start().await;
    let client = client(&server);
    let mut stream = client
        .send_streaming_message(Message::user(SLEEP_30))
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    let StreamEvent::Task(task) = first else {
        panic!("the stream starts with the task: {first:?}");
    };
    // Wait on the stream itself until the run is working, then subscribe to it too.
    if task.state() != TaskState::Working {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("an event within 10 s")
                .unwrap()
                .unwrap();
            if state_of(&event) == Some(TaskState::Working) {
                break;
            }
        }
    }
    let mut subscribed = client.subscribe(&task.id).await.unwrap();
    assert!(matches!(
        subscribed.next().await,
        Some(Ok(StreamEvent::Task(_)))
    ));

    // Both streams are open on the data socket and unread; the cancel does not wait for them.
    let canceled = tokio::time::timeout(
        Duration::from_secs(10),
        client.cancel_task(&task.id, Some("enough".into())),
    )
    .await
    .expect("the cancel is answered while the streams are open")
    .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);

    for stream in [&mut stream, &mut subscribed] {
        let rest: Vec<StreamEvent> = tokio::time::timeout(
            Duration::from_secs(10),
            stream.map(Result::unwrap).collect::<Vec<_>>(),
        )
        .await
        .expect("the stream ends after the cancel");
        assert_eq!(
            rest.last().and_then(state_of),
            Some(TaskState::Canceled),
            "{rest:?}"
        );
    }
    // Subscribing to a terminal task is refused, typed.
    assert!(matches!(
        client.subscribe(&task.id).await,
        Err(AgentError::Unsupported { .. })
    ));
    server.stop().await;
}

#[tokio::test]
async fn a_dropped_stream_leaves_the_socket_serving_other_calls() {
    let server = TestServer::start().await;
    let client = client(&server);
    let task = support::start_sleeping(&*client).await;
    let stream = client.subscribe(&task.id).await.unwrap();
    drop(stream);
    let again = client
        .send_message(Message::user("still here"), SendMessageOptions::default())
        .await
        .unwrap();
    assert_eq!(again.state(), TaskState::Completed);
    client.cancel_task(&task.id, None).await.unwrap();
    server.stop().await;
}
