// The engine's rules, end to end on the in-memory runtime with the offline model.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, AgentError, Message, Part, Role, Task, TaskId, TaskState};
use keel_llm::{LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::{testing, AuthContext};
use serde_json::{json, Value};
use tokio::sync::Notify;
use super::fixture::{call_then_answer, executor, object_tool, scripted, send, start, try_send};

fn card() -> AgentCard {
    AgentCard::new("test", "test agent", "http://127.0.0.1:0")
}

fn add_tool(calls: Arc<AtomicUsize>) -> FnTool {
    FnTool::new(
        "add",
        "Add two numbers",
        json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]
        }),
        move |args, _ctx| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(json!(
                    args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)
                ))
            }
        },
    )
}

/// A tool that announces it has started, then waits until the run is canceled.
fn blocking_tool(started: Arc<Notify>) -> FnTool {
    object_tool("wait", "Wait until canceled", move |_args, ctx| {
        let started = started.clone();
        async move {
            started.notify_one();
            ctx.cancel.cancelled().await;
            Ok(Value::Null)
        }
    })
}

/// A task of an agent with the [`blocking_tool`], started on a call of it that never returns:
/// the executor, its caller, the task, and the notice the call gives once it runs.
async fn blocked_task() -> (AgentExecutor, AuthContext, Task, Arc<Notify>) {
    let started = Arc::new(Notify::new());
    let agent = Agent::builder(card())
        .tool(blocking_tool(started.clone()))
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let task = start(&exec, &auth, Message::user("/wait")).await;
    (exec, auth, task, started)
}

fn part_types(task: &keel_core::Task) -> Vec<(Role, &'static str)> {
    task.history
        .iter()
        .flat_map(|m| m.parts.iter().map(move |p| (m.role, p.content.type_name())))
        .collect()
}

#[tokio::test]
async fn tool_calls_run_in_order_and_every_step_is_persisted() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (exec, auth, llm) = scripted(
        card(),
        vec![
            MockResponse::ToolCalls(vec![
                ToolCall::new("add", json!({"a": 1, "b": 2})),
                ToolCall::new("add", json!({"a": 3, "b": 4})),
            ]),
            MockResponse::Text("3 and 7".into()),
        ],
        |agent| agent.tool(add_tool(calls.clone())),
    );
    let task = send(&exec, &auth, Message::user("add")).await;

    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        part_types(&task),
        [
            (Role::User, "text"),
            (Role::Agent, "tool_call"),
            (Role::Agent, "tool_call"),
            (Role::Agent, "tool_output"),
            (Role::Agent, "tool_output"),
            (Role::Agent, "text"),
        ]
    );
    assert_eq!(task.artifacts.len(), 1);
    assert_eq!(task.artifacts[0].parts[0].as_text(), Some("3 and 7"));
    // The second model call saw both results, in order.
    let second = &llm.requests()[1];
    let results: Vec<_> = second
        .messages
        .iter()
        .filter(|m| m.role == LlmRole::Tool)
        .map(|m| m.content.clone())
        .collect();
    assert_eq!(results, ["3.0", "7.0"]);
    let states: Vec<_> = task.state_history.iter().map(|t| t.new_state).collect();
    assert_eq!(states, [TaskState::Working, TaskState::Completed]);
}

#[tokio::test]
async fn a_failing_tool_becomes_a_tool_result_the_model_sees() {
    let failing = object_tool("flaky", "Always fails", |_a, _c| async {
        Err(AgentError::ToolFailed {
            tool: "flaky".into(),
            message: "upstream 503".into(),
        })
    });
    let (exec, auth, llm) = scripted(
        card(),
        call_then_answer("flaky", json!({}), "sorry, the service is down"),
        |agent| agent.tool(failing),
    );
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), TaskState::Completed);
    let (output, is_error) = testing::tool_outputs(&task).remove(0);
    assert!(is_error);
    assert!(output.as_str().unwrap().contains("upstream 503"));
    assert!(llm.requests()[1]
        .messages
        .iter()
        .any(|m| m.role == LlmRole::Tool && m.content.contains("upstream 503")));
}

#[tokio::test]
async fn invalid_arguments_are_rejected_before_the_tool_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (exec, auth, llm) = scripted(
        card(),
        call_then_answer("add", json!({"a": "one"}), "could not add"),
        |agent| agent.tool(add_tool(calls.clone())),
    );
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the tool must not run with invalid arguments"
    );
    assert_eq!(task.state(), TaskState::Completed);
    let tool_msg = llm.requests()[1]
        .messages
        .iter()
        .find(|m| m.role == LlmRole::Tool)
        .unwrap()
        .content
        .clone();
    assert!(tool_msg.contains("arguments of `add`"), "{tool_msg}");
    assert!(
        tool_msg.contains("\"b\" is a required property"),
        "{tool_msg}"
    );
}

#[tokio::test]
async fn an_unknown_tool_and_a_panicking_tool_become_error_results() {
    let panicky = object_tool("boom", "Panics", |_a, _c| async {
        if true {
            panic!("tool bug");
        }
        Ok(Value::Null)
    });
    let (exec, auth, llm) = scripted(
        card(),
        vec![
            MockResponse::ToolCalls(vec![
                ToolCall::new("nope", json!({})),
                ToolCall::new("boom", json!({})),
            ]),
            MockResponse::Text("done".into()),
        ],
        |agent| agent.tool(panicky),
    );
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), TaskState::Completed);
    let tool_msgs: Vec<_> = llm.requests()[1]
        .messages
        .iter()
        .filter(|m| m.role == LlmRole::Tool)
        .map(|m| m.content.clone())
        .collect();
    assert!(tool_msgs[0].contains("unknown tool `nope`"));
    assert!(tool_msgs[1].contains("panicked"));
}

#[tokio::test]
async fn the_step_limit_fails_the_task_with_a_typed_reason() {
    let (exec, auth, _) = scripted(
        card(),
        (0..3)
            .map(|_| MockResponse::ToolCalls(vec![ToolCall::new("add", json!({"a": 1, "b": 1}))]))
            .collect(),
        |agent| {
            agent
                .tool(add_tool(Arc::new(AtomicUsize::new(0))))
                .max_steps(2)
        },
    );
    let task = send(&exec, &auth, Message::user("loop")).await;
    assert_eq!(task.state(), TaskState::Failed);
    assert_eq!(task.metadata["stop_reason"], "max_steps");
    assert!(task.metadata["error"]
        .as_str()
        .unwrap()
        .contains("budget exceeded: max_steps"));
}

#[tokio::test]
async fn a_model_error_fails_the_task() {
    let llm = MockLlm::scripted(vec![MockResponse::Error("rate limited".into())]);
    let agent = Agent::builder(card()).llm(llm).build().unwrap();
    let (exec, auth) = executor(agent);
    let task = send(&exec, &auth, Message::user("hi")).await;
    assert_eq!(task.state(), TaskState::Failed);
    assert!(task
        .status()
        .message
        .as_ref()
        .unwrap()
        .text()
        .contains("rate limited"));
}

#[tokio::test]
async fn a_running_task_is_canceled_live_with_its_reason() {
    let (exec, auth, task, started) = blocked_task().await;
    assert!(matches!(
        task.state(),
        TaskState::Submitted | TaskState::Working
    ));
    started.notified().await;
    assert!(exec.is_running(&auth, &task.id));
    let canceled = exec
        .cancel_task(&auth, &task.id, Some("user changed their mind".into()))
        .await
        .unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    assert_eq!(
        canceled.metadata["cancel_reason"],
        "user changed their mind"
    );
    assert!(!exec.is_running(&auth, &task.id));
    // Canceling again: it is terminal now.
    let err = exec.cancel_task(&auth, &task.id, None).await.unwrap_err();
    assert!(matches!(
        err,
        AgentError::TaskNotCancelable {
            state: TaskState::Canceled,
            ..
        }
    ));
}

#[tokio::test]
async fn cancel_of_terminal_task_is_not_cancelable_and_unknown_is_not_found() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let task = send(&exec, &auth, Message::user("hi")).await;
    assert_eq!(task.state(), TaskState::Completed);
    let err = exec.cancel_task(&auth, &task.id, None).await.unwrap_err();
    assert!(matches!(
        err,
        AgentError::TaskNotCancelable {
            state: TaskState::Completed,
            ..
        }
    ));
    let err = exec
        .cancel_task(&auth, &TaskId::from("missing"), None)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AgentError::TaskNotFound {
            task_id: TaskId::from("missing")
        }
    );
    let err = exec
        .get_task(&auth, &TaskId::from("missing"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::TaskNotFound { .. }));
}

#[tokio::test]
async fn a_direct_tool_call_runs_without_a_model_and_fails_when_the_tool_fails() {
    let calls = Arc::new(AtomicUsize::new(0));
    let llm = Arc::new(MockLlm::scripted(vec![]));
    let agent = Agent::builder(card())
        .llm_shared(llm.clone())
        .tool(add_tool(calls.clone()))
        .build()
        .unwrap();
    let (exec, auth) = executor(agent);
    let ok = Message::new(
        Role::User,
        vec![Part::tool_call("c1", "add", json!({"a": 2, "b": 2}))],
    );
    let task = send(&exec, &auth, ok).await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(task.status().message.as_ref().unwrap().text(), "4.0");
    let bad = Message::new(
        Role::User,
        vec![Part::tool_call("c2", "add", json!({"a": 2}))],
    );
    let task = send(&exec, &auth, bad).await;
    assert_eq!(task.state(), TaskState::Failed);
    assert!(
        llm.requests().is_empty(),
        "no model call for direct tool calls"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bad_messages_are_invalid_input_and_nothing_is_stored() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let empty = Message::new(Role::User, vec![]);
    let err = try_send(&exec, &auth, empty).await.unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { ref field, .. } if field == "message.parts"));
    let err = try_send(&exec, &auth, Message::agent("hi")).await.unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { ref field, .. } if field == "message.role"));
    let page = exec
        .runtime()
        .task_manager()
        .list_tasks(&auth, &Default::default())
        .await
        .unwrap();
    assert_eq!(page.total_size, 0);
}

#[tokio::test]
async fn a_message_for_a_finished_task_is_refused_and_unknown_task_is_not_found() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let task = send(&exec, &auth, Message::user("hi")).await;
    let mut follow_up = Message::user("again");
    follow_up.task_id = Some(task.id.clone());
    let err = try_send(&exec, &auth, follow_up).await.unwrap_err();
    // A2A §3.1.1: UnsupportedOperation for a task in a terminal state.
    assert!(
        matches!(err, AgentError::Unsupported { ref what } if what.contains("completed")),
        "{err:?}"
    );
    let mut unknown = Message::user("x");
    unknown.task_id = Some(TaskId::from("nope"));
    let err = try_send(&exec, &auth, unknown).await.unwrap_err();
    assert!(matches!(err, AgentError::TaskNotFound { .. }));
}

#[tokio::test]
async fn history_length_keeps_the_latest_messages() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let task = exec
        .send_message(
            &auth,
            Message::user("hi"),
            SendOptions {
                history_length: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(task.history.len(), 1);
    assert_eq!(task.history[0].text(), "You said: hi");
}

#[tokio::test]
async fn tasks_are_invisible_to_other_tenants() {
    let (exec, auth) = executor(Agent::builder(card()).build().unwrap());
    let task = send(&exec, &auth, Message::user("hi")).await;
    let other = AuthContext::new("other-app", "mallory");
    assert!(matches!(
        exec.get_task(&other, &task.id, None).await,
        Err(AgentError::TaskNotFound { .. })
    ));
    assert!(matches!(
        exec.cancel_task(&other, &task.id, None).await,
        Err(AgentError::TaskNotFound { .. })
    ));
}

#[test]
fn builder_rejects_bad_tool_schemas_duplicates_and_zero_steps() {
    let bad_schema = FnTool::new("t", "d", json!({"type": 12}), |_a, _c| async {
        Ok(Value::Null)
    });
    let err = Agent::builder(card()).tool(bad_schema).build().unwrap_err();
    assert!(
        matches!(err, AgentError::InvalidInput { ref field, .. } if field == "parameters of tool `t`")
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let err = Agent::builder(card())
        .tool(add_tool(calls.clone()))
        .tool(add_tool(calls))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("declared twice"));
    let err = Agent::builder(card()).max_steps(0).build().unwrap_err();
    assert!(
        matches!(&err, AgentError::InvalidInput { field, .. } if field == "max_steps"),
        "{err:?}"
    );
}
