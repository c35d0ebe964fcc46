//! The blocking client: code that is not async cancels a task another thread is running,
//! reads it back, and gets typed errors, over a real server on 127.0.0.1:0.

mod support;

use std::time::Duration;

use keel_core::{AgentError, Message, TaskId, TaskState};
use keel_transport::{A2aClient, SendMessageOptions};
use support::{TestServer, SLEEP_30};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_cancel_task_stops_a_task_running_elsewhere() {
    let server = TestServer::start().await;
    let base = server.base.clone();

    let outcome = tokio::task::spawn_blocking(move || {
        let client = A2aClient::new(&base).blocking().expect("a blocking client");
        let started = client.send_message(
            Message::user(SLEEP_30),
            SendMessageOptions {
                return_immediately: true,
                ..Default::default()
            },
        )?;
        let canceled = client.cancel_task(&started.id, Some("stop pressed".into()))?;
        let read_back = client.get_task(&started.id, None)?;
        let unknown = client.cancel_task(&TaskId::from("no-such-task"), None);
        Ok::<_, AgentError>((started, canceled, read_back, unknown))
    });
    let (started, canceled, read_back, unknown) =
        tokio::time::timeout(Duration::from_secs(60), outcome)
            .await
            .expect("the blocking calls finish")
            .expect("the blocking thread does not panic")
            .expect("the blocking calls succeed");

    assert!(!started.state().is_terminal(), "{}", started.state());
    assert_eq!(canceled.state(), TaskState::Canceled);
    assert_eq!(canceled.metadata["cancel_reason"], "stop pressed");
    assert_eq!(read_back.state(), TaskState::Canceled);
    assert!(
        matches!(unknown, Err(AgentError::TaskNotFound { .. })),
        "{unknown:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_client_on_a_plain_thread_gets_typed_errors_and_drops_in_async_code() {
    let server = TestServer::start().await;
    let base = server.base.clone();

    // A thread with no async runtime at all: the client drives its own.
    let (client, unknown) = std::thread::spawn(move || {
        let client = A2aClient::new(&base).blocking().expect("a blocking client");
        let unknown = client.cancel_task(&TaskId::from("no-such-task"), None);
        (client, unknown)
    })
    .join()
    .expect("the plain thread does not panic");

    assert!(
        matches!(unknown, Err(AgentError::TaskNotFound { .. })),
        "{unknown:?}"
    );
    drop(client); // inside async code, where dropping a runtime the usual way panics
    server.stop().await;
}
