//! The in-process transport: one scenario run through [`AgentTransport`] against a remote
//! agent (A2aClient over JSON-RPC and over HTTP+JSON) and against the same agent in process
//! (`A2aClient::in_process`) gives the same results, and the same task read both ways is equal.

mod support;

use std::sync::Arc;

use futures::StreamExt;
use keel_core::{AgentError, Message, Task, TaskState};
use keel_transport::{
    A2aClient, AgentTransport, Binding, SendMessageOptions, StreamEvent, TaskListQuery,
};
use serde_json::{json, Value};
use support::{TestServer, SLEEP_30};

fn error_name(err: &AgentError) -> &'static str {
    match err {
        AgentError::TaskNotFound { .. } => "TaskNotFound",
        AgentError::TaskNotCancelable { .. } => "TaskNotCancelable",
        AgentError::InvalidInput { .. } => "InvalidInput",
        AgentError::Unsupported { .. } => "Unsupported",
        _ => "other",
    }
}

fn outcome<T>(result: Result<T, AgentError>, ok: impl FnOnce(T) -> Value) -> Value {
    match result {
        Ok(value) => ok(value),
        Err(err) => json!({"error": error_name(&err)}),
    }
}

fn summary(task: &Task) -> Value {
    json!({
        "state": task.state().to_string(),
        "reply": task.status().message.as_ref().map(Message::text),
        "history": task.history.iter().map(Message::text).collect::<Vec<_>>(),
        "artifacts": task.artifacts.len(),
    })
}

fn event_summary(event: &StreamEvent) -> Value {
    match event {
        StreamEvent::Task(task) => json!({"task": task.state().to_string()}),
        StreamEvent::Message(message) => json!({"message": message.text()}),
        StreamEvent::StatusUpdate { status, .. } => json!({"status": status.state.to_string()}),
        StreamEvent::ArtifactUpdate {
            append, last_chunk, ..
        } => json!({"artifact": {"append": append, "last": last_chunk}}),
    }
}

async fn collect(stream: keel_transport::TaskEventStream) -> Value {
    let events: Vec<_> = stream.collect().await;
    Value::Array(
        events
            .iter()
            .map(|e| outcome(e.clone(), |e| event_summary(&e)))
            .collect(),
    )
}

/// Every operation, through the trait; the result has no ids or timestamps in it.
async fn scenario(client: &dyn AgentTransport, thread: &str) -> Value {
    let mut out = serde_json::Map::new();
    let card = client.get_card().await.expect("the card");
    out.insert("card".into(), json!(card.name));

    let mut first = Message::user("hello there");
    first.thread_id = Some(thread.into());
    let task = client
        .send_message(first, SendMessageOptions::default())
        .await
        .expect("a blocking send");
    out.insert("send".into(), summary(&task));

    let mut second = Message::user("once more");
    second.thread_id = Some(thread.into());
    second.task_id = Some(task.id.clone());
    let continued = client
        .send_message(
            second,
            SendMessageOptions {
                return_immediately: false,
                history_length: Some(1),
            },
        )
        .await;
    out.insert("continue".into(), outcome(continued, |t| summary(&t)));

    out.insert(
        "get".into(),
        outcome(client.get_task(&task.id, Some(2)).await, |t| summary(&t)),
    );
    out.insert(
        "get_missing".into(),
        outcome(client.get_task(&"no-such-task".into(), None).await, |t| {
            summary(&t)
        }),
    );
    let query = TaskListQuery {
        thread_id: Some(thread.into()),
        ..TaskListQuery::default()
    };
    out.insert(
        "list".into(),
        outcome(client.list_tasks(&query).await, |list| {
            json!({
                "total": list.total_size,
                "page_size": list.page_size,
                "next": list.next_page_token,
                "tasks": list.tasks.iter().map(summary).collect::<Vec<_>>(),
            })
        }),
    );
    out.insert(
        "cancel_done".into(),
        outcome(client.cancel_task(&task.id, None).await, |t| summary(&t)),
    );
    out.insert(
        "subscribe_done".into(),
        match client.subscribe(&task.id).await {
            Ok(stream) => collect(stream).await,
            Err(err) => json!({"error": error_name(&err)}),
        },
    );

    let mut streamed = Message::user("stream me");
    streamed.thread_id = Some(format!("{thread}-stream").into());
    out.insert(
        "stream".into(),
        match client.send_streaming_message(streamed).await {
            Ok(stream) => collect(stream).await,
            Err(err) => json!({"error": error_name(&err)}),
        },
    );

    // A long task: subscribe, cancel it, and see the stream end with `canceled`.
    let mut sleeper = Message::user(SLEEP_30);
    sleeper.thread_id = Some(format!("{thread}-sleep").into());
    let sleeping = client
        .send_message(
            sleeper,
            SendMessageOptions {
                return_immediately: true,
                history_length: None,
            },
        )
        .await
        .expect("a non-blocking send");
    let mut events = client
        .subscribe(&sleeping.id)
        .await
        .expect("a subscription");
    let first_event = events.next().await.map(|e| e.map(|e| event_summary(&e)));
    assert!(
        matches!(first_event, Some(Ok(ref v)) if v.get("task").is_some()),
        "{first_event:?}"
    );
    let canceled = client
        .cancel_task(&sleeping.id, Some("enough".into()))
        .await
        .expect("cancel");
    out.insert("cancel".into(), json!(canceled.state().to_string()));
    let rest = collect(events).await;
    let last = rest.as_array().and_then(|a| a.last()).cloned();
    out.insert("cancel_stream_end".into(), last.unwrap_or(Value::Null));
    Value::Object(out)
}

#[tokio::test]
async fn the_same_scenario_gives_the_same_results_in_process_and_over_both_bindings() {
    let server = TestServer::start().await;
    let in_process: Arc<dyn AgentTransport> =
        Arc::new(A2aClient::in_process(server.executor.clone()).expect("anonymous access"));
    let json_rpc: Arc<dyn AgentTransport> = Arc::new(A2aClient::new(&server.base));
    let rest: Arc<dyn AgentTransport> =
        Arc::new(A2aClient::new(&server.base).with_binding(Binding::HttpJson));

    let local = scenario(in_process.as_ref(), "th-local").await;
    let remote = scenario(json_rpc.as_ref(), "th-rpc").await;
    let remote_rest = scenario(rest.as_ref(), "th-rest").await;
    assert_eq!(local, remote, "in process vs JSON-RPC");
    assert_eq!(local, remote_rest, "in process vs HTTP+JSON");
    assert_eq!(local["send"]["state"], "completed", "{local:#}");
    assert_eq!(local["get_missing"]["error"], "TaskNotFound");
    assert_eq!(local["cancel_done"]["error"], "TaskNotCancelable");
    assert_eq!(local["subscribe_done"]["error"], "Unsupported");
    assert_eq!(local["cancel"], "canceled");
    assert_eq!(
        local["cancel_stream_end"]["status"], "canceled",
        "{local:#}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_task_reads_the_same_through_either_transport() {
    let server = TestServer::start().await;
    let local = A2aClient::in_process(server.executor.clone()).expect("anonymous access");
    let remote = A2aClient::new(&server.base);
    let task = local
        .send_message(Message::user("hi"), SendMessageOptions::default())
        .await
        .expect("send");
    let via_local = local.get_task(&task.id, None).await.expect("local get");
    let via_remote = remote.get_task(&task.id, None).await.expect("remote get");
    assert_eq!(via_local.id, via_remote.id);
    assert_eq!(via_local.state(), TaskState::Completed);
    assert_eq!(summary(&via_local), summary(&via_remote));
    assert_eq!(via_local.history, via_remote.history);
    assert_eq!(via_local.artifacts, via_remote.artifacts);

    let listed_local = local
        .list_tasks(&TaskListQuery::default())
        .await
        .expect("list");
    let listed_remote = remote
        .list_tasks(&TaskListQuery::default())
        .await
        .expect("list");
    assert_eq!(listed_local.total_size, listed_remote.total_size);
    assert_eq!(
        listed_local.tasks.iter().map(|t| &t.id).collect::<Vec<_>>(),
        listed_remote
            .tasks
            .iter()
            .map(|t| &t.id)
            .collect::<Vec<_>>()
    );
    server.stop().await;
}
