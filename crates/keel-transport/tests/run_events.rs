//! A client following a task over A2A turns each stream event into the normalized run event
//! the engine would emit for it (`StreamEvent::run_event`), against a real server.

mod support;

use std::sync::Arc;

use futures::StreamExt;
use keel_core::{Message, RunContext, TaskState};
use keel_events::payload::TaskStatusPayload;
use keel_events::{EventEmitter, InMemoryEventSink};
use keel_transport::{A2aClient, StreamEvent};
use support::TestServer;

#[tokio::test]
async fn a_followed_stream_becomes_run_events_ending_with_the_final_status() {
    let server = TestServer::start().await;
    let client = A2aClient::new(server.base.clone());
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&RunContext::new(), sink.clone());
    let mut stream = client
        .send_streaming_message(Message::user("hello"))
        .await
        .unwrap();
    let mut task_id = None;
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        if let StreamEvent::Task(task) = &event {
            task_id = Some(task.id.clone());
        }
        if let Some(builder) = event.run_event() {
            emitter.emit(builder).await.unwrap();
        }
    }
    let events = sink.events();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types.first(), Some(&"task.status"), "{types:?}");
    assert!(types.contains(&"task.artifact"), "{types:?}");
    let last = events.last().unwrap();
    assert!(last.is("task.status") && last.is_final, "{last:?}");
    let status: TaskStatusPayload = last.payload_as().unwrap();
    assert_eq!(status.state, TaskState::Completed);
    assert_eq!(status.message.as_deref(), Some("You said: hello"));
    // Every event names the followed task; only the first carries the task itself.
    assert!(events.iter().all(|e| e.task_id == task_id));
    assert!(events[0].payload.get("task").is_some());
    assert!(events[1..].iter().all(|e| e.payload.get("task").is_none()));
    // A bare message (an agent that answers without a task) has no run event.
    assert!(StreamEvent::Message(Box::new(Message::agent("hi")))
        .run_event()
        .is_none());
    server.stop().await;
}
