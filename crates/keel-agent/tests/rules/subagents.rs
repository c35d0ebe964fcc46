// Subagents (Standard Agents §7–§8) with the offline model: child threads linked in the
// registry, the lifecycle tools, maxInstances guidance, delivery to the parent, termination
// and cancel propagation.

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, FnTool, ParentCommunication, SendOptions, SubagentSpec};
use keel_core::{AgentCard, Message, RunContext, Task, TaskState, ThreadId};
use keel_llm::{LlmMessage, LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::{AuthContext, ChildThread, ListTasksFilter, Runtime};
use serde_json::json;
use tokio::sync::Notify;

fn card(name: &str) -> AgentCard {
    AgentCard::new(name, "subagent tests", "http://127.0.0.1:0")
}

/// A child agent answering with the runtime's default offline model ("You said: ...").
fn child_executor(runtime: &Arc<dyn Runtime>) -> AgentExecutor {
    let agent = Agent::builder(card("researcher")).build().unwrap();
    AgentExecutor::new(agent, runtime.clone())
}

fn parent(
    runtime: &Arc<dyn Runtime>,
    spec: SubagentSpec,
    script: Vec<MockResponse>,
) -> AgentExecutor {
    let agent = Agent::builder(card("lead"))
        .llm(MockLlm::scripted(script))
        .subagent(spec)
        .build()
        .unwrap();
    AgentExecutor::new(agent, runtime.clone())
}

fn create(name: &str, message: &str) -> MockResponse {
    MockResponse::ToolCalls(vec![ToolCall::new(
        "subagent_create",
        json!({"name": name, "message": message}),
    )])
}

async fn tool_results(exec: &AgentExecutor, auth: &AuthContext, thread: &ThreadId) -> Vec<String> {
    history(exec, auth, thread)
        .await
        .into_iter()
        .filter(|m| m.role == LlmRole::Tool)
        .map(|m| m.content)
        .collect()
}

async fn history(exec: &AgentExecutor, auth: &AuthContext, thread: &ThreadId) -> Vec<LlmMessage> {
    exec.thread(auth, thread.clone())
        .history()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect()
}

async fn ask(exec: &AgentExecutor, auth: &AuthContext, text: &str) -> Task {
    exec.send_message(auth, Message::user(text), SendOptions::default())
        .await
        .unwrap()
}

async fn child_tasks(runtime: &Arc<dyn Runtime>, auth: &AuthContext, child: &ChildThread) -> Vec<Task> {
    runtime
        .task_manager()
        .list_tasks(
            auth,
            &ListTasksFilter {
                thread_id: Some(child.thread_id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .items
}

/// Poll (the store may be another process's) until `check` holds.
async fn eventually<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition never held");
}

#[tokio::test]
async fn subagent_create_runs_a_child_thread_linked_in_the_registry() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let spec = SubagentSpec::new("researcher", child_executor(&runtime));
    let exec = parent(
        &runtime,
        spec,
        vec![create("alpha", "find A"), MockResponse::Text("merged".into())],
    );
    let task = ask(&exec, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);

    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[0].contains("You said: find A"), "{results:?}");

    let children = exec.thread(&auth, task.thread_id.clone()).children().await.unwrap();
    assert_eq!(children.len(), 1);
    let child = &children[0];
    assert_eq!(child.name, "alpha");
    assert_eq!(child.agent, "researcher");
    assert_eq!(child.parent_thread_id, task.thread_id);
    assert!(!child.resumable);
    // Non-resumable: terminated once it delivered.
    assert_eq!(child.status, "terminated");

    let child_task = &child_tasks(&runtime, &auth, child).await[0];
    let parent_ctx = RunContext::from_task(&task).unwrap().unwrap();
    let child_ctx = RunContext::from_task(child_task).unwrap().unwrap();
    assert_ne!(child_ctx.run_id, parent_ctx.run_id);
    assert_eq!(child_ctx.parent_run_id.as_ref(), Some(&parent_ctx.run_id));
    assert_eq!(child_ctx.trace_id, parent_ctx.trace_id);
    assert_eq!(child_ctx.agent_chain.last().map(String::as_str), Some("researcher"));
    assert_eq!(child_ctx.agent_chain.len(), parent_ctx.agent_chain.len() + 1);
    assert_eq!(child_ctx.thread_id.as_ref(), Some(&child.thread_id));
}

#[tokio::test]
async fn subagent_create_needs_a_non_empty_name() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let spec = SubagentSpec::new("researcher", child_executor(&runtime));
    let exec = parent(
        &runtime,
        spec,
        vec![create("  ", "find A"), MockResponse::Text("ok".into())],
    );
    let task = ask(&exec, &auth, "go").await;
    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[0].contains("non-empty name"), "{results:?}");
    assert!(exec.thread(&auth, task.thread_id).children().await.unwrap().is_empty());
}

#[tokio::test]
async fn creating_past_max_instances_tells_the_model_to_message_an_existing_one() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let spec = SubagentSpec::new("researcher", child_executor(&runtime))
        .max_instances(1)
        .resumable(true);
    let exec = parent(
        &runtime,
        spec,
        vec![
            create("alpha", "find A"),
            create("beta", "find B"),
            MockResponse::Text("ok".into()),
        ],
    );
    let task = ask(&exec, &auth, "go").await;
    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[1].contains("at most 1"), "{results:?}");
    assert!(results[1].contains("`alpha`"), "{results:?}");
    assert!(results[1].contains("subagent_message"), "{results:?}");
    let children = exec.thread(&auth, task.thread_id).children().await.unwrap();
    assert_eq!(children.len(), 1);
}

#[tokio::test]
async fn a_resumable_child_is_messaged_again_on_its_own_thread() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let child_exec = child_executor(&runtime);
    let spec = SubagentSpec::new("researcher", child_exec.clone()).resumable(true);
    let exec = parent(
        &runtime,
        spec,
        vec![
            create("alpha", "find A"),
            MockResponse::ToolCalls(vec![ToolCall::new(
                "subagent_message",
                json!({"name": "alpha", "message": "and B"}),
            )]),
            MockResponse::Text("ok".into()),
        ],
    );
    assert!(exec
        .agent()
        .tool_specs()
        .iter()
        .any(|t| t.name == "subagent_message"));
    let task = ask(&exec, &auth, "go").await;
    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[1].contains("You said: and B"), "{results:?}");
    let children = exec.thread(&auth, task.thread_id).children().await.unwrap();
    assert_eq!(children[0].status, "completed");
    assert!(children[0].resumable);
    let child_history = history(&child_exec, &auth, &children[0].thread_id).await;
    let users: Vec<_> = child_history
        .iter()
        .filter(|m| m.role == LlmRole::User)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(users, ["find A", "and B"]);
}

#[tokio::test]
async fn a_background_child_queues_its_result_to_the_parent_with_auto_communication() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let spec = SubagentSpec::new("researcher", child_executor(&runtime));
    let exec = parent(
        &runtime,
        spec,
        vec![
            MockResponse::ToolCalls(vec![ToolCall::new(
                "subagent_create",
                json!({"name": "alpha", "message": "find A", "wait": false}),
            )]),
            MockResponse::Text("started".into()),
            MockResponse::Text("got it".into()),
        ],
    );
    let task = ask(&exec, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let thread = task.thread_id.clone();
    eventually(|| {
        let (exec, auth, thread) = (exec.clone(), auth.clone(), thread.clone());
        async move {
            history(&exec, &auth, &thread).await.iter().any(|m| {
                m.role == LlmRole::User && m.content.contains("[subagent alpha] completed: You said: find A")
            })
        }
    })
    .await;
}

#[tokio::test]
async fn explicit_parent_communication_queues_nothing() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let spec = SubagentSpec::new("researcher", child_executor(&runtime))
        .parent_communication(ParentCommunication::Explicit);
    let exec = parent(
        &runtime,
        spec,
        vec![
            MockResponse::ToolCalls(vec![ToolCall::new(
                "subagent_create",
                json!({"name": "alpha", "message": "find A", "wait": false}),
            )]),
            MockResponse::Text("started".into()),
        ],
    );
    let task = ask(&exec, &auth, "go").await;
    let thread = task.thread_id.clone();
    let state = exec.thread(&auth, thread.clone());
    eventually(|| {
        let state = state.clone();
        async move { state.children().await.unwrap()[0].status == "terminated" }
    })
    .await;
    assert!(!history(&exec, &auth, &thread)
        .await
        .iter()
        .any(|m| m.content.contains("[subagent alpha]")));
    assert_eq!(
        runtime.thread_store().queue_len(&auth, &thread).await.unwrap(),
        0
    );
}

#[tokio::test]
async fn terminating_the_parent_terminates_its_children() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let spec = SubagentSpec::new("researcher", child_executor(&runtime)).resumable(true);
    let exec = parent(
        &runtime,
        spec,
        vec![create("alpha", "find A"), MockResponse::Text("ok".into())],
    );
    let task = ask(&exec, &auth, "go").await;
    let state = exec.thread(&auth, task.thread_id.clone());
    assert_eq!(state.children().await.unwrap()[0].status, "completed");
    state.terminate().await.unwrap();
    assert_eq!(state.children().await.unwrap()[0].status, "terminated");
}

#[tokio::test]
async fn canceling_the_parent_cancels_the_child_it_waits_for() {
    let runtime = super::runtime();
    let auth = runtime.auth_service().auth_context();
    let started = Arc::new(Notify::new());
    let gate = {
        let started = started.clone();
        FnTool::new("gate", "Never returns", json!({"type": "object"}), move |_a, _c| {
            let started = started.clone();
            async move {
                started.notify_one();
                std::future::pending::<()>().await;
                Ok(json!("never"))
            }
        })
    };
    let child = Agent::builder(card("researcher"))
        .llm(MockLlm::scripted(vec![MockResponse::ToolCalls(vec![
            ToolCall::new("gate", json!({})),
        ])]))
        .tool(gate)
        .build()
        .unwrap();
    let spec = SubagentSpec::new("researcher", AgentExecutor::new(child, runtime.clone()));
    let exec = parent(&runtime, spec, vec![create("alpha", "block")]);
    let task = exec
        .send_message(
            &auth,
            Message::user("go"),
            SendOptions {
                return_immediately: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    started.notified().await;
    let canceled = exec.cancel_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    let children = exec.thread(&auth, task.thread_id).children().await.unwrap();
    let child = children[0].clone();
    let (rt, auth2) = (runtime.clone(), auth.clone());
    eventually(|| {
        let (rt, auth, child) = (rt.clone(), auth2.clone(), child.clone());
        async move {
            child_tasks(&rt, &auth, &child)
                .await
                .iter()
                .all(|t| t.state() == TaskState::Canceled)
        }
    })
    .await;
}
