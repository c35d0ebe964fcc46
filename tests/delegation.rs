//! Remote delegation: a parent agent whose tool is a remote A2A agent, with two real
//! `A2aServer`s on 127.0.0.1 in this process, talking HTTP. The child run's `RunContext`
//! travels in the message metadata under `run_context` and the remote server adopts it for
//! its run (same trace, `parent_run_id`, extended `agent_chain`; its run report and events say
//! so); a malformed one is InvalidParams naming the field; and canceling the parent task
//! cancels the remote child task (`CancelTask`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use keel::agent::{Agent, AgentExecutor, SendOptions};
use keel::core::{AgentCard, Message, RunContext, Task, TaskState, RUN_CONTEXT_KEY};
use keel::delegation::RemoteAgentTool;
use keel::events::InMemoryEventSink;
use keel::services::{AuthContext, ListTasksFilter, RunQuery, Runtime};
use keel::transport::A2aServer;
use keel::DefaultRuntime;
use tokio::sync::oneshot;

/// A running in-process A2A server; stops when dropped.
struct Served {
    url: String,
    executor: AgentExecutor,
    auth: AuthContext,
    events: Arc<InMemoryEventSink>,
    _stop: oneshot::Sender<()>,
}

async fn serve(agent: Agent) -> Served {
    let runtime = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(agent, runtime);
    let events = Arc::new(InMemoryEventSink::new());
    executor.add_event_sink(events.clone());
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
        events,
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
    // The context left the message for the task: it is the child run's, not the message's.
    assert!(
        !sent.metadata.contains_key(RUN_CONTEXT_KEY),
        "{:?}",
        sent.metadata
    );
    let ctx = RunContext::from_task(&remote)
        .unwrap()
        .expect("the adopted run context");
    let parent_ctx = RunContext::from_task(&task)
        .unwrap()
        .expect("parent context");
    assert_eq!(ctx.parent_run_id.as_ref(), Some(&parent_ctx.run_id));
    assert_ne!(ctx.run_id, parent_ctx.run_id);
    assert_eq!(ctx.trace_id, parent_ctx.trace_id);
    assert_eq!(ctx.workspace_uri, parent_ctx.workspace_uri);
    assert_eq!(ctx.budget, parent_ctx.budget);
    assert_eq!(ctx.permissions, parent_ctx.permissions);
    assert_eq!(ctx.agent_chain, ["delegate", "keel-demo"]);
    // The child's run lives in its own thread; the parent's is kept for correlation.
    assert_eq!(ctx.thread_id.as_ref(), Some(&remote.thread_id));
    assert_eq!(
        ctx.metadata["parent_thread_id"],
        serde_json::json!(task.thread_id.as_str())
    );

    // The child's run report carries the parent's trace and the parent run.
    let reports = child
        .executor
        .runtime()
        .run_store()
        .find_run_reports(
            &child.auth,
            &RunQuery {
                task_id: Some(remote.id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].run_id, ctx.run_id);
    assert_eq!(reports[0].trace_id.as_ref(), Some(&parent_ctx.trace_id));
    let report: keel::events::RunReport =
        serde_json::from_value(reports[0].report.clone()).expect("a run report");
    // It names the child's run and task; the parent run is in the task's run context, read
    // above from the task itself (a final status carries no copy of the task, decision 255).
    assert_eq!(report.run_id.as_ref(), Some(&ctx.run_id));
    assert_eq!(report.task_id.as_ref(), Some(&remote.id));
    // And so are its events: every one is stamped with the run the parent named.
    let events = child.events.events();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e.run_id == ctx.run_id), "{events:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_run_context_is_invalid_params_naming_the_field() {
    let child = child().await;
    let send = |run_context: serde_json::Value| {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}],
                        "metadata": {"run_context": run_context}}
        }});
        let url = child.url.clone();
        async move { support::post_rpc(&url, &body).await }
    };
    let bad_budget = send(serde_json::json!({
        "run_id": "r-1", "trace_id": "t-1", "budget": {"max_steps": "three"}
    }))
    .await;
    assert_eq!(bad_budget["error"]["code"], -32602, "{bad_budget}");
    assert_eq!(
        bad_budget["error"]["data"][0]["metadata"]["field"],
        "message.metadata.run_context.budget.max_steps",
        "{bad_budget}"
    );
    let not_an_object = send(serde_json::json!("yes")).await;
    assert_eq!(not_an_object["error"]["code"], -32602, "{not_an_object}");
    assert_eq!(
        not_an_object["error"]["data"][0]["metadata"]["field"], "message.metadata.run_context",
        "{not_an_object}"
    );
    // Nothing was accepted.
    assert!(child_tasks(&child).await.is_empty());
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
    let working = |tasks: &[Task]| {
        tasks
            .iter()
            .find(|t| t.state() == TaskState::Working)
            .map(|t| t.id.clone())
    };
    let tasks = support::wait_until(
        "the child to start",
        Duration::from_secs(20),
        || child_tasks(&child),
        |tasks| working(tasks).is_some(),
    )
    .await;
    let remote_id = working(&tasks).expect("a working child task");

    let canceled = parent
        .executor
        .cancel_task(&parent.auth, &task.id, Some("user gave up".into()))
        .await
        .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);

    // The remote child is canceled too, through CancelTask.
    let remote = support::wait_until(
        "the remote child to be canceled",
        Duration::from_secs(20),
        || async {
            let remote = child.executor.get_task(&child.auth, &remote_id, Some(0));
            remote.await.unwrap()
        },
        |remote| remote.state() == TaskState::Canceled,
    )
    .await;
    assert_eq!(
        remote
            .metadata
            .get("cancel_reason")
            .and_then(|v| v.as_str()),
        Some(keel::delegation::PARENT_CANCELED_REASON),
        "{:?}",
        remote.metadata
    );
}
