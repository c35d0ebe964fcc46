//! Streams by A2A v1.0's rules, against a real server: SendStreamingMessage and SubscribeToTask
//! over SSE (JSON-RPC and HTTP+JSON), and the Keel client's typed streams.

mod support;

use futures::StreamExt;
use keel_core::{AgentError, Message, TaskState};
use keel_transport::{A2aClient, StreamEvent, TaskEventStream};
use serde_json::{json, Value};
use support::{sse_events, user_message, SendJson, TestServer, SLEEP_30};

/// The stream of `text` sent through `client`, as `SendStreamingMessage` opens it.
async fn stream_of(client: &A2aClient, text: &str) -> TaskEventStream {
    client
        .send_streaming_message(Message::user(text))
        .await
        .unwrap()
}

/// Every event of a Keel client's stream, read to its end (an error fails the test).
async fn drain(
    events: impl futures::Stream<Item = keel_core::AgentResult<StreamEvent>>,
) -> Vec<StreamEvent> {
    events.map(Result::unwrap).collect().await
}

/// The states of a stream's status updates, in order.
fn status_states(events: &[StreamEvent]) -> Vec<TaskState> {
    events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::StatusUpdate { status, .. } => Some(status.state),
            _ => None,
        })
        .collect()
}

fn state_of(result: &Value) -> Option<&str> {
    result["statusUpdate"]["status"]["state"]
        .as_str()
        .or_else(|| result["task"]["status"]["state"].as_str())
}

#[tokio::test]
async fn jsonrpc_stream_starts_with_the_task_carries_updates_and_ends_after_completed() {
    let server = TestServer::start().await;
    let events = server
        .rpc_stream(
            "SendStreamingMessage",
            json!({"message": user_message("hello")}),
        )
        .await;
    assert!(events.len() >= 3, "{events:?}");
    for (_, envelope) in &events {
        assert_eq!(envelope["jsonrpc"], "2.0");
        assert_eq!(envelope["id"], "req-1");
        assert!(envelope.get("result").is_some(), "{envelope}");
    }
    let results: Vec<&Value> = events.iter().map(|(_, e)| &e["result"]).collect();
    let task = &results[0]["task"];
    assert!(
        task["id"].is_string(),
        "the first event is the task: {}",
        results[0]
    );
    assert_eq!(task["history"][0]["parts"][0]["text"], "hello");
    let last = results.last().unwrap();
    assert_eq!(state_of(last), Some("TASK_STATE_COMPLETED"), "{last}");
    assert_eq!(last["statusUpdate"]["taskId"], task["id"]);
    assert_eq!(last["statusUpdate"]["contextId"], task["contextId"]);
    let artifact = results
        .iter()
        .find(|r| r.get("artifactUpdate").is_some())
        .expect("an artifact update");
    assert_eq!(
        artifact["artifactUpdate"]["artifact"]["parts"][0]["text"],
        "You said: hello"
    );
    assert_eq!(artifact["artifactUpdate"]["lastChunk"], true);
    // No status is sent twice, and only the last one is final.
    let states: Vec<&str> = results.iter().filter_map(|r| state_of(r)).collect();
    let mut seen = states.clone();
    seen.dedup();
    assert_eq!(seen, states, "{states:?}");
    assert_eq!(
        states
            .iter()
            .filter(|s| **s == "TASK_STATE_COMPLETED")
            .count(),
        1,
        "{states:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn stream_ends_at_an_interrupted_state_and_continues_on_the_next_turn() {
    let server = TestServer::start().await;
    let client = A2aClient::new(server.base.clone());
    let asking = stream_of(&client, "/ask_human {\"question\": \"which city?\"}").await;
    let events = drain(asking).await;
    let task_id = events.iter().find_map(|event| match event {
        StreamEvent::Task(task) => Some(task.id.clone()),
        _ => None,
    });
    let Some(StreamEvent::StatusUpdate { status, .. }) = events.last() else {
        panic!("the stream ends with a status update: {events:?}");
    };
    assert_eq!(status.state, TaskState::InputRequired);

    // The answer continues the same task; its stream starts with the task still waiting and
    // does not end there, but after this turn's final status.
    let mut answer = Message::user("Athens");
    answer.task_id = task_id.clone();
    let events = drain(client.send_streaming_message(answer).await.unwrap()).await;
    for event in &events {
        if let StreamEvent::Task(task) = event {
            assert_eq!(Some(&task.id), task_id.as_ref());
        }
    }
    let states = status_states(&events);
    assert_eq!(states.last(), Some(&TaskState::Completed), "{states:?}");
    server.stop().await;
}

#[tokio::test]
async fn subscribe_follows_a_running_task_and_ends_with_one_canceled_event() {
    let server = TestServer::start().await;
    for (binding, client) in server.http_clients() {
        let running = support::start_sleeping(&client).await;
        let mut events = client.subscribe(&running.id).await.unwrap();
        let Some(Ok(StreamEvent::Task(first))) = events.next().await else {
            panic!("{binding:?}: the first event is the task");
        };
        assert_eq!(first.id, running.id);
        assert!(!first.state().is_terminal());
        assert_eq!(first.history[0].text(), SLEEP_30);

        let canceled = client.cancel_task(&running.id, None).await.unwrap();
        assert_eq!(canceled.state(), TaskState::Canceled);
        let mut finals = status_states(&drain(events).await);
        finals.retain(|state| state.is_terminal());
        assert_eq!(finals, vec![TaskState::Canceled], "{binding:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn subscribe_to_a_task_waiting_for_input_stays_open_until_it_is_terminal() {
    let server = TestServer::start().await;
    for (binding, client) in server.http_clients() {
        let asked =
            drain(stream_of(&client, "/ask_human {\"question\": \"which city?\"}").await).await;
        let Some(StreamEvent::Task(task)) = asked.first() else {
            panic!("{binding:?}: the first event is the task: {asked:?}");
        };
        let mut events = client.subscribe(&task.id).await.unwrap();
        let Some(Ok(StreamEvent::Task(first))) = events.next().await else {
            panic!("{binding:?}: the subscription starts with the task");
        };
        assert_eq!(first.state(), TaskState::InputRequired, "{binding:?}");

        let mut answer = Message::user("Athens");
        answer.task_id = Some(task.id.clone());
        client
            .send_message(answer, Default::default())
            .await
            .unwrap();
        let states = status_states(&drain(events).await);
        assert_eq!(
            states.last(),
            Some(&TaskState::Completed),
            "{binding:?}: the subscription carries the follow-up to the end: {states:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn subscribe_to_a_terminal_task_is_unsupported_operation_before_any_stream() {
    let server = TestServer::start().await;
    let done = server.send_message(user_message("hi")).await["result"]["task"].clone();
    let response = server
        .rpc_with(Some("1.0"), "SubscribeToTask", json!({"id": done["id"]}))
        .await;
    assert!(response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], -32004, "{answer}");
    assert_eq!(
        answer["error"]["data"][0]["metadata"]["state"],
        "TASK_STATE_COMPLETED"
    );

    let answer: Value = server
        .http
        .get(format!(
            "{}/tasks/{}:subscribe",
            server.base,
            done["id"].as_str().unwrap()
        ))
        .header("A2A-Version", "1.0")
        .json_with_status(reqwest::StatusCode::BAD_REQUEST)
        .await;
    assert_eq!(
        answer["error"]["details"][0]["reason"],
        "UNSUPPORTED_OPERATION"
    );

    let client = A2aClient::new(server.base.clone());
    let id = done["id"].as_str().unwrap().into();
    let err = client.subscribe(&id).await.err().expect("an error");
    assert!(matches!(err, AgentError::Unsupported { .. }), "{err:?}");
    let missing = "no-such-task".into();
    let err = client.subscribe(&missing).await.err().expect("an error");
    assert_eq!(err, AgentError::TaskNotFound { task_id: missing });
    server.stop().await;
}

#[tokio::test]
async fn a_client_going_away_never_cancels_the_task() {
    let server = TestServer::start().await;
    let client = A2aClient::new(server.base.clone());
    let mut events = stream_of(&client, "/sleep {\"seconds\": 0.5}").await;
    let Some(Ok(StreamEvent::Task(task))) = events.next().await else {
        panic!("the first event is the task");
    };
    drop(events);
    // Follow it again: the run goes on and completes.
    let events = drain(client.subscribe(&task.id).await.unwrap()).await;
    let state = match events.last().unwrap() {
        StreamEvent::StatusUpdate { status, .. } => status.state,
        StreamEvent::Task(task) => task.state(),
        other => panic!("{other:?}"),
    };
    assert_eq!(state, TaskState::Completed);
    server.stop().await;
}

#[tokio::test]
async fn rest_stream_events_are_bare_stream_responses() {
    let server = TestServer::start().await;
    let response = server
        .post_v1("/message:stream")
        .header("content-type", "application/a2a+json")
        .body(json!({"message": user_message("hi")}).to_string())
        .send()
        .await
        .unwrap();
    let events = sse_events(response).await;
    assert!(events[0].1["task"]["id"].is_string(), "{events:?}");
    assert_eq!(
        state_of(&events.last().unwrap().1),
        Some("TASK_STATE_COMPLETED")
    );
    assert!(events.iter().all(|(name, _)| name == "message"));
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams_with_a_going_away_status_and_leaves_the_task_working() {
    let server = TestServer::start().await;
    let client = A2aClient::new(server.base.clone());
    let mut events = stream_of(&client, SLEEP_30).await;
    assert!(matches!(
        events.next().await,
        Some(Ok(StreamEvent::Task(_)))
    ));
    let executor = server.executor.clone();
    let stopping = tokio::spawn(server.stop());
    let mut last = None;
    while let Some(event) = events.next().await {
        last = Some(event.unwrap());
    }
    let Some(StreamEvent::StatusUpdate {
        task_id, status, ..
    }) = &last
    else {
        panic!("{last:?}")
    };
    // Not a terminal state: the task goes on in the next process.
    assert_eq!(status.state, TaskState::Working, "{last:?}");
    let message = status.message.as_ref().unwrap();
    assert_eq!(
        message.status_kind(),
        Some(keel_core::StatusKind::ServerGoingAway)
    );
    assert!(
        message.text().contains("SubscribeToTask"),
        "{}",
        message.text()
    );
    stopping.await.unwrap();
    let auth = executor.runtime().auth_service().auth_context();
    let stored = executor.get_task(&auth, task_id, None).await.unwrap();
    assert_eq!(stored.state(), TaskState::Working);
    // The going-away update is the stream's own: the task's log does not hold it.
    assert!(stored.status().message.is_none(), "{:?}", stored.status());
}
