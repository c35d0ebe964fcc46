//! Remote delegation: a parent agent whose tool is a remote A2A agent, with two real
//! `A2aServer`s on 127.0.0.1 in this process. The child run's `RunContext` travels in the
//! message metadata under `run_context`, and canceling the parent task cancels the remote
//! child task (`CancelTask`).

use std::sync::Arc;
use std::time::Duration;

use keel::agent::{Agent, AgentExecutor, SendOptions};
use keel::core::{AgentCard, Message, RunContext, Task, TaskState, RUN_CONTEXT_KEY};
use keel::delegation::RemoteAgentTool;
use keel::services::{AuthContext, ListTasksFilter, Runtime};
use keel::transport::A2aServer;
use keel::DefaultRuntime;
use tokio::sync::oneshot;

/// A running in-process A2A server; stops when dropped.
struct Served {
    url: String,
    executor: AgentExecutor,
    auth: AuthContext,
    _stop: oneshot::Sender<()>,
}

async fn serve(agent: Agent) -> Served {
    let runtime = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(agent, runtime);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        A2aServer::new(executor.clone())
            .with_public_url(url.clone())
            .serve(listener, async move {
                let _ = stopped.await;
            }),
    );
    Served {
        url,
        executor,
        auth,
        _stop: stop,
    }
}

/// The child: Keel's demo agent (echoes; `/sleep` waits until canceled).
async fn child() -> Served {
    serve(keel::demo::agent().unwrap()).await
}

/// The parent: one tool, `delegate`, that is the remote child.
async fn parent(child_url: &str) -> Served {
    let card = AgentCard::new(
        "parent",
        "Delegates to a remote agent.",
        "http://127.0.0.1/",
    );
    let tool = RemoteAgentTool::new("delegate", "Ask the remote agent.", child_url)
        .with_poll_interval(Duration::from_millis(20));
    serve(Agent::builder(card).tool(tool).build().unwrap()).await
}

async fn child_tasks(child: &Served) -> Vec<Task> {
    child
        .executor
        .runtime()
        .task_manager()
        .list_tasks(&child.auth, &ListTasksFilter::default())
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parent_delegates_to_a_remote_agent_with_the_child_run_context() {
    let child = child().await;
    let parent = parent(&child.url).await;
    let task = parent
        .executor
        .send_message(
            &parent.auth,
            Message::user(r#"/delegate {"message": "hello child"}"#),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    let answer = task.status().message.as_ref().unwrap().text();
    assert!(answer.contains("You said: hello child"), "{answer}");
    assert!(answer.contains("completed"), "{answer}");

    // The child's task got the message with the child run's context.
    let tasks = child_tasks(&child).await;
    assert_eq!(tasks.len(), 1);
    let remote = child
        .executor
        .get_task(&child.auth, &tasks[0].id, None)
        .await
        .unwrap();
    assert_eq!(remote.state(), TaskState::Completed);
    let sent = remote
        .history
        .iter()
        .find(|m| m.text() == "hello child")
        .expect("the delegated message");
    let ctx: RunContext =
        serde_json::from_value(sent.metadata[RUN_CONTEXT_KEY].clone()).expect("a run context");
    let parent_ctx = RunContext::from_task(&task)
        .unwrap()
        .expect("parent context");
    assert_eq!(ctx.parent_run_id.as_ref(), Some(&parent_ctx.run_id));
    assert_ne!(ctx.run_id, parent_ctx.run_id);
    assert_eq!(ctx.trace_id, parent_ctx.trace_id);
    assert_eq!(ctx.agent_chain.last().map(String::as_str), Some("delegate"));
}

#[tokio::test(flavor = "multi_thread")]
async fn canceling_the_parent_cancels_the_remote_child_task() {
    let child = child().await;
    let parent = parent(&child.url).await;
    let task = parent
        .executor
        .send_message(
            &parent.auth,
            Message::user(r#"/delegate {"message": "/sleep {\"seconds\": 300}"}"#),
            SendOptions {
                return_immediately: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // Wait until the child works on the delegated sleep.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let remote_id = loop {
        let tasks = child_tasks(&child).await;
        if let Some(t) = tasks.iter().find(|t| t.state() == TaskState::Working) {
            break t.id.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let canceled = parent
        .executor
        .cancel_task(&parent.auth, &task.id, Some("user gave up".into()))
        .await
        .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);

    // The remote child is canceled too, through CancelTask.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let remote = child
            .executor
            .get_task(&child.auth, &remote_id, Some(0))
            .await
            .unwrap();
        if remote.state() == TaskState::Canceled {
            assert_eq!(
                remote
                    .metadata
                    .get("cancel_reason")
                    .and_then(|v| v.as_str()),
                Some(keel::delegation::PARENT_CANCELED_REASON),
                "{:?}",
                remote.metadata
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the remote child is still {}",
            remote.state()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
