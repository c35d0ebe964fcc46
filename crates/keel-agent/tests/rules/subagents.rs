// Subagents (Standard Agents §7–§8) with the offline model: child threads linked in the
// registry, the lifecycle tools, maxInstances guidance, delivery to the parent, termination
// and cancel propagation.

use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentBuilder, AgentExecutor, FnTool, ParentCommunication, SendOptions, SubagentSpec};
use keel_core::{AgentCard, AgentError, Message, RunContext, Task, TaskState, ThreadId};
use keel_llm::{LlmMessage, LlmRole, MockLlm, MockResponse, ToolCall};
use keel_runtime::testing::eventually;
use keel_runtime::{AuthContext, ChildThread, ListTasksFilter, Runtime};
use serde_json::json;
use tokio::sync::Notify;
use super::fixture::{
    attach, backend, call_then_answer, gate_tool, object_tool, register_running_child, send_in, start,
};

fn card(name: &str) -> AgentCard {
    AgentCard::new(name, "subagent tests", "http://127.0.0.1:0")
}

/// A child agent answering with the runtime's default offline model ("You said: ...").
fn child_executor(runtime: &Arc<dyn Runtime>) -> AgentExecutor {
    on(runtime, Agent::builder(card("researcher")))
}

/// An executor on `runtime` of the agent `agent` builds.
fn on(runtime: &Arc<dyn Runtime>, agent: AgentBuilder) -> AgentExecutor {
    AgentExecutor::new(agent.build().unwrap(), runtime.clone())
}

/// An agent named `name` whose model follows `script`, to finish building.
fn scripted_agent(name: &str, script: Vec<MockResponse>) -> AgentBuilder {
    Agent::builder(card(name)).llm(MockLlm::scripted(script))
}

/// A `lead` parent on `runtime` with the subagent kind `spec`, its model following `script`.
fn parent(
    runtime: &Arc<dyn Runtime>,
    spec: SubagentSpec,
    script: Vec<MockResponse>,
) -> AgentExecutor {
    on(runtime, scripted_agent("lead", script).subagent(spec))
}

/// A `lead` parent on a fresh runtime of this backend whose model follows `script`, with the
/// subagent kind `kind` makes of the default researcher: the runtime, its caller, the parent.
fn lead(
    kind: impl FnOnce(SubagentSpec) -> SubagentSpec,
    script: Vec<MockResponse>,
) -> (Arc<dyn Runtime>, AuthContext, AgentExecutor) {
    lead_over(child_executor, kind, script)
}

/// [`lead`], asked to "go", and the task of that.
async fn lead_asked(
    kind: impl FnOnce(SubagentSpec) -> SubagentSpec,
    script: Vec<MockResponse>,
) -> (Arc<dyn Runtime>, AuthContext, AgentExecutor, Task) {
    let (runtime, auth, exec) = lead(kind, script);
    let task = ask(&exec, &auth, "go").await;
    (runtime, auth, exec, task)
}

/// [`lead`], its researcher the executor `child` makes on the runtime.
fn lead_over(
    child: impl FnOnce(&Arc<dyn Runtime>) -> AgentExecutor,
    kind: impl FnOnce(SubagentSpec) -> SubagentSpec,
    script: Vec<MockResponse>,
) -> (Arc<dyn Runtime>, AuthContext, AgentExecutor) {
    let (runtime, auth) = backend();
    let spec = kind(SubagentSpec::new("researcher", child(&runtime)));
    let exec = parent(&runtime, spec, script);
    (runtime, auth, exec)
}

fn create(name: &str, message: &str) -> MockResponse {
    MockResponse::ToolCalls(vec![ToolCall::new(
        "subagent_create",
        json!({"name": name, "message": message}),
    )])
}

/// A `subagent_message` call: `message` to the existing child `name`.
fn message_child(name: &str, message: &str) -> MockResponse {
    MockResponse::ToolCalls(vec![ToolCall::new(
        "subagent_message",
        json!({"name": name, "message": message}),
    )])
}

/// A `subagent_create` call that does not wait for the child: its result comes later.
fn create_background(name: &str, message: &str) -> MockResponse {
    MockResponse::ToolCalls(vec![ToolCall::new(
        "subagent_create",
        json!({"name": name, "message": message, "wait": false}),
    )])
}

/// A parent's script: create the child `name` in the background with `message`, answer
/// "started", then answer the child's result with `answer`.
fn background_then(name: &str, message: &str, answer: &str) -> Vec<MockResponse> {
    vec![
        create_background(name, message),
        MockResponse::Text("started".into()),
        MockResponse::Text(answer.into()),
    ]
}

/// Wait until `thread`'s history, as `exec` reads it, satisfies `holds` (`what` says how).
async fn until_history(
    exec: &AgentExecutor,
    auth: &AuthContext,
    thread: &ThreadId,
    what: &str,
    holds: impl Fn(&[LlmMessage]) -> bool,
) {
    let holds = &holds;
    eventually(what, move || async move { holds(&history(exec, auth, thread).await) }).await
}

/// Assert that the message of `thread` holding `text` is a status message of `kind`, one the
/// engine synthesized.
async fn assert_status_message(exec: &AgentExecutor, auth: &AuthContext, thread: &ThreadId, text: &str, kind: &str) {
    let history = history(exec, auth, thread).await;
    let message = history.iter().find(|m| m.content.contains(text)).unwrap();
    assert_eq!(message.metadata["status_kind"], kind, "a synthesized status message");
}

/// Whether `history` holds a message that contains `text`.
fn mentions(history: &[LlmMessage], text: &str) -> bool {
    history.iter().any(|m| m.content.contains(text))
}

/// Whether the parent's history holds alpha's result and its model's answer to it.
fn answered_alpha(history: &[LlmMessage]) -> bool {
    mentions(history, "[subagent alpha] completed: You said: find A")
        && history.iter().any(|m| m.role == LlmRole::Assistant && m.content == "thanks, alpha")
}

/// Wait until the first child of `state`'s thread has `status` in the registry.
async fn until_first_child_is(state: &keel_agent::ThreadState, status: &str) {
    eventually(&format!("the child to be {status}"), move || async move {
        state.children().await.unwrap()[0].status == status
    })
    .await
}

/// The one attachment `state`'s thread (`thread`) holds, stored under that thread: its URI,
/// its description and its bytes.
async fn only_attachment(
    state: &keel_agent::ThreadState,
    thread: &ThreadId,
) -> (String, keel_core::FileContent, Vec<u8>) {
    let files = state.attachments().await.unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    let uri = files[0].uri.clone().unwrap();
    assert!(uri.starts_with(&format!("keel-attachment://{thread}/")), "{uri}");
    let (meta, bytes) = state.read_attachment(&uri).await.unwrap().unwrap();
    (uri, meta, bytes)
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

#[tokio::test]
async fn subagent_create_runs_a_child_thread_linked_in_the_registry() {
    let (runtime, auth, exec, task) = lead_asked(
        |kind| kind,
        vec![create("alpha", "find A"), MockResponse::Text("merged".into())],
    )
    .await;
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
async fn an_invalid_create_is_a_tool_error_and_creates_nothing() {
    let cases = [
        // A subagent needs a non-empty name.
        (json!({"name": "  ", "message": "find A"}), "non-empty name"),
        // An attachment the parent does not have.
        (
            json!({"name": "alpha", "message": "read", "attachments": ["missing.txt"]}),
            "missing.txt",
        ),
    ];
    for (args, error) in cases {
        let call = MockResponse::ToolCalls(vec![ToolCall::new("subagent_create", args)]);
        let (_runtime, auth, exec, task) =
            lead_asked(|kind| kind, vec![call, MockResponse::Text("ok".into())]).await;
        let results = tool_results(&exec, &auth, &task.thread_id).await;
        assert!(results[0].contains(error), "{results:?}");
        assert!(exec.thread(&auth, task.thread_id).children().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn creating_past_max_instances_tells_the_model_to_message_an_existing_one() {
    let (_runtime, auth, exec, task) = lead_asked(
        |kind| kind.max_instances(1).resumable(true),
        vec![
            create("alpha", "find A"),
            create("beta", "find B"),
            MockResponse::Text("ok".into()),
        ],
    )
    .await;
    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[1].contains("at most 1"), "{results:?}");
    assert!(results[1].contains("`alpha`"), "{results:?}");
    assert!(results[1].contains("subagent_message"), "{results:?}");
    let children = exec.thread(&auth, task.thread_id).children().await.unwrap();
    assert_eq!(children.len(), 1);
}

#[tokio::test]
async fn a_resumable_child_is_messaged_again_on_its_own_thread() {
    let (runtime, auth) = backend();
    let child_exec = child_executor(&runtime);
    let spec = SubagentSpec::new("researcher", child_exec.clone()).resumable(true);
    let exec = parent(
        &runtime,
        spec,
        vec![
            create("alpha", "find A"),
            message_child("alpha", "and B"),
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
    let (_runtime, auth, exec, task) = lead_asked(
        |kind| kind,
        background_then("alpha", "find A", "got it"),
    )
    .await;
    assert_eq!(task.state(), TaskState::Completed);
    let thread = task.thread_id.clone();
    until_history(&exec, &auth, &thread, "the child's result", |history| {
        history.iter().any(|m| {
            m.role == LlmRole::User && m.content.contains("[subagent alpha] completed: You said: find A")
        })
    })
    .await;
    assert_status_message(&exec, &auth, &thread, "[subagent alpha] completed", "subagent_return").await;
}

#[tokio::test]
async fn explicit_parent_communication_queues_nothing() {
    let (runtime, auth, exec, task) = lead_asked(
        |kind| kind.parent_communication(ParentCommunication::Explicit),
        vec![
            create_background("alpha", "find A"),
            MockResponse::Text("started".into()),
        ],
    )
    .await;
    let thread = task.thread_id.clone();
    let state = exec.thread(&auth, thread.clone());
    until_first_child_is(&state, "terminated").await;
    assert!(!mentions(&history(&exec, &auth, &thread).await, "[subagent alpha]"));
    assert_eq!(
        runtime.thread_store().queue_len(&auth, &thread).await.unwrap(),
        0
    );
}

#[tokio::test]
async fn terminating_the_parent_terminates_its_children() {
    let (_runtime, auth, exec, task) = lead_asked(
        |kind| kind.resumable(true),
        vec![create("alpha", "find A"), MockResponse::Text("ok".into())],
    )
    .await;
    let state = exec.thread(&auth, task.thread_id.clone());
    assert_eq!(state.children().await.unwrap()[0].status, "completed");
    state.terminate().await.unwrap();
    assert_eq!(state.children().await.unwrap()[0].status, "terminated");
}

#[tokio::test]
async fn canceling_the_parent_cancels_the_child_it_waits_for() {
    let (runtime, auth) = backend();
    // The gate is never released: the child waits until it is canceled.
    let started = Arc::new(Notify::new());
    let gate = gate_tool(started.clone(), Arc::new(Notify::new()));
    let child = scripted_agent("researcher", vec![MockResponse::ToolCalls(vec![
        ToolCall::new("gate", json!({})),
    ])])
    .tool(gate);
    let spec = SubagentSpec::new("researcher", on(&runtime, child));
    let exec = parent(&runtime, spec, vec![create("alpha", "block")]);
    let task = start(&exec, &auth, Message::user("go")).await;
    started.notified().await;
    let canceled = exec.cancel_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    let children = exec.thread(&auth, task.thread_id).children().await.unwrap();
    let (runtime, auth, child) = (&runtime, &auth, &children[0]);
    eventually("the child's task to be canceled", move || async move {
        child_tasks(runtime, auth, child)
            .await
            .iter()
            .all(|t| t.state() == TaskState::Canceled)
    })
    .await;
}

// ---- attachments, optional/immediate kinds, scoped variables, status, markers ----

const SECRETS_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn sink_of(exec: &AgentExecutor) -> Arc<keel_events::InMemoryEventSink> {
    let sink = Arc::new(keel_events::InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    sink
}

fn events_named(sink: &keel_events::InMemoryEventSink, name: &str) -> Vec<serde_json::Value> {
    sink.events()
        .into_iter()
        .filter(|e| e.is(name))
        .map(|e| e.payload)
        .collect()
}

/// A tool that hands the scoped variable `var` of its thread to the test.
fn scoped_reader(var: &'static str, seen: Arc<std::sync::Mutex<Vec<Option<String>>>>) -> FnTool {
    object_tool("check_token", "Checks the token", move |_a, ctx| {
        let seen = seen.clone();
        async move {
            let value = ctx.thread.scoped_variable(var).await?;
            seen.lock().unwrap().push(value);
            Ok(json!("checked"))
        }
    })
}

#[tokio::test]
async fn a_parents_attachments_are_copied_into_the_childs_own_store() {
    let (runtime, auth) = backend();
    let child_exec = child_executor(&runtime);
    let thread = ThreadId::new();
    let parent_state = child_exec.thread(&auth, thread.clone());
    let file = attach(&parent_state, "notes.txt", Some("text/plain"), b"the parent's notes").await;
    let parent_uri = file.uri.clone().unwrap();
    assert!(parent_uri.starts_with(&format!("keel-attachment://{thread}/")));
    let spec = SubagentSpec::new("researcher", child_exec.clone());
    let exec = parent(
        &runtime,
        spec,
        vec![
            MockResponse::ToolCalls(vec![ToolCall::new(
                "subagent_create",
                json!({"name": "alpha", "message": format!("read {parent_uri}"),
                       "attachments": [parent_uri]}),
            )]),
            MockResponse::Text("ok".into()),
        ],
    );
    let task = send_in(&exec, &auth, &thread, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let child = exec.thread(&auth, thread.clone()).children().await.unwrap()[0].clone();
    let child_state = child_exec.thread(&auth, child.thread_id.clone());
    let (child_uri, meta, bytes) = only_attachment(&child_state, &child.thread_id).await;
    assert_eq!(bytes, b"the parent's notes");
    assert_eq!(meta.media_type.as_deref(), Some("text/plain"));
    // The parent's reference is not valid in the child's thread.
    let err = child_state.read_attachment(&parent_uri).await.unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
    // The child's message refers to its own copy only, as text and as a file part.
    let child_history = history(&child_exec, &auth, &child.thread_id).await;
    let first = &child_history.iter().find(|m| m.role == LlmRole::User).unwrap().content;
    assert!(first.contains(&child_uri), "{first}");
    assert!(!first.contains(&parent_uri), "{first}");
    let child_task = &child_tasks(&runtime, &auth, &child).await[0];
    let events = runtime
        .task_manager()
        .get_task_events(&auth, &child_task.id)
        .await
        .unwrap();
    let parts: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            keel_core::TaskEvent::Message { message } => Some(message.clone()),
            _ => None,
        })
        .flat_map(|m| m.parts)
        .filter_map(|p| match p.content {
            keel_core::PartContent::File { file } => file.uri,
            _ => None,
        })
        .collect();
    assert_eq!(parts, [child_uri]);
}

/// A child whose only step writes `report.txt` into its own store and ends with the file's
/// reference as its answer (the stop tool's output).
fn reporting_child(runtime: &Arc<dyn Runtime>, responses: usize) -> AgentExecutor {
    let write = object_tool("write_report", "Writes the report", |_a, ctx| async move {
        let file = ctx
            .thread
            .put_attachment("report.txt", Some("text/plain"), b"findings: 42")
            .await?;
        Ok(json!(format!("the report is at {}", file.uri.unwrap())))
    });
    let script = (0..responses)
        .map(|_| MockResponse::ToolCalls(vec![ToolCall::new("write_report", json!({}))]))
        .collect();
    let agent = scripted_agent("researcher", script)
        .tool(write)
        .stop_tool("write_report");
    on(runtime, agent)
}

#[tokio::test]
async fn a_childs_result_brings_its_attachments_into_the_parents_store() {
    let (_runtime, auth, exec) = lead_over(
        |runtime| reporting_child(runtime, 1),
        |kind| kind,
        vec![create("alpha", "write it"), MockResponse::Text("ok".into())],
    );
    let sink = sink_of(&exec);
    let task = ask(&exec, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let parent_state = exec.thread(&auth, task.thread_id.clone());
    let (parent_uri, _, bytes) = only_attachment(&parent_state, &task.thread_id).await;
    assert_eq!(bytes, b"findings: 42");
    // The tool result the parent's model sees refers to the parent's copy.
    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[0].contains(&parent_uri), "{results:?}");
    let child = &parent_state.children().await.unwrap()[0];
    assert!(!results[0].contains(&format!("keel-attachment://{}/", child.thread_id)));
    let returned = events_named(&sink, "subagent.returned");
    assert_eq!(returned.len(), 1);
    assert_eq!(returned[0]["attachments"][0]["uri"], json!(parent_uri));
}

#[tokio::test]
async fn a_background_childs_queued_result_carries_its_copied_attachments() {
    let (_runtime, auth, exec) = lead_over(
        |runtime| reporting_child(runtime, 1),
        |kind| kind,
        background_then("alpha", "write it", "got it"),
    );
    let task = ask(&exec, &auth, "go").await;
    let thread = task.thread_id.clone();
    let prefix = format!("keel-attachment://{thread}/");
    until_history(&exec, &auth, &thread, "the result with its attachment", |history| {
        history.iter().any(|m| {
            m.role == LlmRole::User
                && m.content.contains("[subagent alpha] completed")
                && m.content.contains(&prefix)
        })
    })
    .await;
    let files = exec.thread(&auth, thread).attachments().await.unwrap();
    assert_eq!(files.len(), 1);
}

#[tokio::test]
async fn optional_kinds_exist_only_when_their_flag_is_true_one_or_yes() {
    let runtime = super::runtime();
    let build = |value: Option<&str>| {
        let mut env = keel_agent::Environment::isolated();
        if let Some(value) = value {
            env = env.with_var("RESEARCH_ENABLED", value);
        }
        Agent::builder(card("lead"))
            .environment(env)
            .subagent(SubagentSpec::new("researcher", child_executor(&runtime)).optional("RESEARCH_ENABLED"))
            .build()
            .unwrap()
    };
    let offers = |agent: &Agent| agent.tool_specs().iter().any(|t| t.name == "subagent_create");
    for on in ["true", "TRUE", "1", "yes", "Yes"] {
        assert!(offers(&build(Some(on))), "{on}");
    }
    for off in ["false", "0", "no", "on", ""] {
        assert!(!offers(&build(Some(off))), "{off}");
    }
    assert!(!offers(&build(None)));
}

#[tokio::test]
async fn immediate_kinds_run_before_the_first_model_step_recursively_and_once_per_thread() {
    let (runtime, auth) = backend();
    let grandchild = on(&runtime, Agent::builder(card("scout")));
    let child = on(
        &runtime,
        Agent::builder(card("researcher"))
            .subagent(SubagentSpec::new("scout", grandchild.clone()).immediate(true)),
    );
    let model = Arc::new(MockLlm::scripted(vec![
        MockResponse::Text("done".into()),
        MockResponse::Text("again".into()),
    ]));
    let exec = on(
        &runtime,
        Agent::builder(card("lead"))
            .llm_shared(model.clone())
            .subagent(SubagentSpec::new("researcher", child.clone()).immediate(true)),
    );
    let sink = sink_of(&exec);
    let thread = ThreadId::new();
    let task = send_in(&exec, &auth, &thread, "study the sea").await;
    assert_eq!(task.state(), TaskState::Completed);
    // The first model call already saw the child's result.
    let first = &model.requests()[0];
    let tool_result = first
        .messages
        .iter()
        .find(|m| m.role == LlmRole::Tool)
        .expect("the immediate call's result precedes the first model step");
    assert!(tool_result.content.contains("study the sea"), "{}", tool_result.content);
    let children = exec.thread(&auth, thread.clone()).children().await.unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].name, "researcher");
    // Recursively: the child's own immediate kind ran on the child's thread.
    let grandchildren = child
        .thread(&auth, children[0].thread_id.clone())
        .children()
        .await
        .unwrap();
    assert_eq!(grandchildren.len(), 1);
    assert_eq!(grandchildren[0].name, "scout");
    assert_eq!(events_named(&sink, "subagent.created").len(), 1);
    // A later task on the same thread does not activate them again.
    send_in(&exec, &auth, &thread, "and the sky").await;
    assert_eq!(exec.thread(&auth, thread).children().await.unwrap().len(), 1);
}

#[tokio::test]
async fn scoped_variables_reach_the_child_sealed_and_never_a_prompt() {
    let (runtime, auth) = backend();
    let secret = "tok-SECRET-123";
    let env = keel_agent::Environment::isolated()
        .with_var(keel_agent::SECRETS_KEY_VAR, SECRETS_KEY)
        .with_var("SCOUT_NAME", "scout")
        .with_var("SCOUT_TASK", "survey the field")
        .with_var("SCOUT_TOKEN", secret);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let child_model = Arc::new(MockLlm::scripted(call_then_answer("check_token", json!({}), "surveyed")));
    let child = on(
        &runtime,
        Agent::builder(card("researcher"))
            .environment(env.clone())
            .llm_shared(child_model.clone())
            .tool(scoped_reader("SCOUT_TOKEN", seen.clone())),
    );
    let parent_model = Arc::new(MockLlm::scripted(vec![MockResponse::Text("done".into())]));
    let exec = on(
        &runtime,
        Agent::builder(card("lead"))
            .environment(env)
            .llm_shared(parent_model.clone())
            .subagent(
                SubagentSpec::new("researcher", child.clone()).immediate_with(
                    keel_agent::ImmediateEnv::new()
                        .name_env("SCOUT_NAME")
                        .description_env("SCOUT_TASK")
                        .scoped_env(["SCOUT_TOKEN"]),
                ),
            ),
    );
    let task = ask(&exec, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(seen.lock().unwrap().as_slice(), [Some(secret.to_owned())]);
    let kid = exec.thread(&auth, task.thread_id.clone()).children().await.unwrap()[0].clone();
    // No bootstrap model pass: the hints become the call's arguments as they are, and the
    // parent's model is asked once, with the child's result already in its history.
    assert_eq!(parent_model.requests().len(), 1, "the parent's model ran once");
    let first = serde_json::to_string(&parent_model.requests()[0].messages).unwrap();
    assert!(first.contains("surveyed"), "{first}");
    // nameEnv and descriptionEnv are model-visible hints.
    assert_eq!(kid.name, "scout");
    let child_history = history(&child, &auth, &kid.thread_id).await;
    assert_eq!(child_history[0].content, "survey the field");
    // The value never reached a model, a history or the store in the clear.
    for model in [&parent_model, &child_model] {
        let sent = serde_json::to_string(&model.requests().iter().map(|r| &r.messages).collect::<Vec<_>>()).unwrap();
        assert!(!sent.contains(secret));
    }
    for (thread, exec) in [(&task.thread_id, &exec), (&kid.thread_id, &child)] {
        let all = serde_json::to_string(&history(exec, &auth, thread).await).unwrap();
        assert!(!all.contains(secret));
        let store = runtime.thread_store();
        for key in store.kv_keys(&auth, thread).await.unwrap() {
            let value = store.kv_get(&auth, thread, &key).await.unwrap();
            assert!(!serde_json::to_string(&value).unwrap().contains(secret), "{key}");
        }
    }
}

#[tokio::test]
async fn missing_scoped_variables_defer_the_subagent_until_they_are_provided() {
    let (runtime, auth) = backend();
    let env = keel_agent::Environment::isolated().with_var(keel_agent::SECRETS_KEY_VAR, SECRETS_KEY);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let child = on(
        &runtime,
        Agent::builder(card("researcher"))
            .environment(env.clone())
            .llm(MockLlm::scripted(call_then_answer("check_token", json!({}), "found A")))
            .tool(scoped_reader("API_TOKEN", seen.clone())),
    );
    let exec = on(
        &runtime,
        Agent::builder(card("lead"))
            .environment(env)
            .llm(MockLlm::scripted(vec![
                create("alpha", "find A"),
                MockResponse::Text("waiting".into()),
                MockResponse::Text("got it".into()),
            ]))
            .subagent(SubagentSpec::new("researcher", child.clone()).scoped_env(["API_TOKEN"])),
    );
    let sink = sink_of(&exec);
    let task = ask(&exec, &auth, "go").await;
    let thread = task.thread_id.clone();
    let results = tool_results(&exec, &auth, &thread).await;
    assert!(results[0].contains("scoped_variables_missing"), "{results:?}");
    assert!(results[0].contains("API_TOKEN"), "{results:?}");
    assert!(exec.thread(&auth, thread.clone()).children().await.unwrap().is_empty());
    let bootstrap = events_named(&sink, "subagent.bootstrap_required");
    assert_eq!(bootstrap.len(), 1);
    let request_id = bootstrap[0]["request_id"].as_str().unwrap().to_owned();
    assert!(results[0].contains(&request_id));

    let pending = exec.pending_variables(&auth, &thread, &request_id).await.unwrap().unwrap();
    assert_eq!(pending.missing, ["API_TOKEN"]);
    assert_eq!(pending.name, "alpha");
    assert_eq!(pending.parent_thread_id, thread);
    assert_eq!(exec.pending_variables(&auth, &thread, "nope").await.unwrap(), None);

    let empty = std::collections::HashMap::new();
    let err = exec.provide_variables(&auth, &thread, &request_id, &empty).await.unwrap_err();
    assert_eq!(err.kind(), keel_core::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("API_TOKEN"), "{err}");

    let values = std::collections::HashMap::from([("API_TOKEN".to_owned(), "tok-42".to_owned())]);
    // Concurrent completions: exactly one starts the child.
    let attempts = futures::future::join_all(
        (0..8).map(|_| exec.provide_variables(&auth, &thread, &request_id, &values)),
    )
    .await;
    let mut started: Vec<_> = attempts.into_iter().filter_map(|r| r.unwrap()).collect();
    assert_eq!(started.len(), 1, "one completion starts the child");
    let started = started.pop().unwrap();
    assert_eq!(started.name, "alpha");
    assert_eq!(started.parent_thread_id, thread);
    // The request is used up.
    assert_eq!(exec.pending_variables(&auth, &thread, &request_id).await.unwrap(), None);
    assert_eq!(exec.provide_variables(&auth, &thread, &request_id, &values).await.unwrap(), None);
    // The child ran with the value, and its result reached the parent (auto communication).
    until_history(&exec, &auth, &thread, "the child's result", |history| {
        history
            .iter()
            .any(|m| m.role == LlmRole::User && m.content.contains("[subagent alpha] completed: found A"))
    })
    .await;
    assert_eq!(seen.lock().unwrap().as_slice(), [Some("tok-42".to_owned())]);
}

#[tokio::test]
async fn session_status_updates_the_registry_without_ending_the_child() {
    let (runtime, auth) = backend();
    let release = Arc::new(Notify::new());
    let gate = gate_tool(Arc::new(Notify::new()), release.clone());
    let child = on(
        &runtime,
        scripted_agent("researcher", vec![
            MockResponse::ToolCalls(vec![ToolCall::new("session_status", json!({"status": "halfway"}))]),
            MockResponse::ToolCalls(vec![ToolCall::new("gate", json!({}))]),
            MockResponse::Text("finished".into()),
        ])
        .tool(keel_agent::SessionStatusTool)
        .tool(gate),
    );
    let child_sink = sink_of(&child);
    let spec = SubagentSpec::new("researcher", child.clone()).resumable(true);
    let exec = parent(
        &runtime,
        spec,
        background_then("alpha", "work", "noted"),
    );
    let task = ask(&exec, &auth, "go").await;
    let state = exec.thread(&auth, task.thread_id.clone());
    until_first_child_is(&state, "halfway").await;
    let kid = state.children().await.unwrap()[0].clone();
    let running = child_tasks(&runtime, &auth, &kid).await;
    assert!(running.iter().all(|t| !t.state().is_terminal()), "the child goes on");
    // The tool writes the registry, then emits its event: wait for the event too.
    eventually("the child's subagent.status event", || async {
        !events_named(&child_sink, "subagent.status").is_empty()
    })
    .await;
    let status = events_named(&child_sink, "subagent.status");
    assert_eq!(status.len(), 1);
    assert_eq!(status[0]["status"], "halfway");
    release.notify_one();
    until_first_child_is(&state, "completed").await;
}

#[tokio::test]
async fn session_status_outside_a_subagent_is_a_tool_error() {
    let (runtime, auth) = backend();
    let exec = on(
        &runtime,
        scripted_agent("solo", call_then_answer("session_status", json!({"status": "x"}), "ok"))
            .tool(keel_agent::SessionStatusTool),
    );
    let task = ask(&exec, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let results = tool_results(&exec, &auth, &task.thread_id).await;
    assert!(results[0].contains("not a subagent"), "{results:?}");
}

#[tokio::test]
async fn subagent_lifecycle_markers_appear_in_the_parents_event_stream() {
    let (runtime, auth) = backend();
    let child = on(
        &runtime,
        scripted_agent("researcher", vec![
            MockResponse::Text("fine".into()),
            MockResponse::Text("again".into()),
            MockResponse::ToolCalls(vec![ToolCall::new("session_fail", json!({"error": "no luck"}))]),
        ])
        .lifecycle_tools(true),
    );
    let spec = SubagentSpec::new("researcher", child).resumable(true);
    let exec = parent(
        &runtime,
        spec,
        vec![
            create("alpha", "find A"),
            message_child("alpha", "more"),
            create("beta", "find B"),
            MockResponse::Text("done".into()),
        ],
    );
    let sink = sink_of(&exec);
    let task = ask(&exec, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let names = |kind: &str| -> Vec<String> {
        events_named(&sink, kind)
            .iter()
            .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(names("subagent.created"), ["alpha", "beta"]);
    assert_eq!(names("subagent.messaged"), ["alpha"]);
    assert_eq!(names("subagent.returned"), ["alpha", "alpha"]);
    assert_eq!(names("subagent.failed"), ["beta"]);
    let failed = &events_named(&sink, "subagent.failed")[0];
    assert_eq!(failed["state"], "failed");
    // The markers are part of the run's numbered stream and its report.
    let run = sink.events();
    let created = run.iter().find(|e| e.is("subagent.created")).unwrap();
    assert_eq!(created.task_id.as_ref(), Some(&task.id));
}

#[tokio::test]
async fn a_background_childs_result_reaches_the_parent_after_the_spawning_process_is_gone() {
    let (runtime, auth) = backend();
    let build = |script: Vec<MockResponse>| {
        let child = child_executor(&runtime);
        let parent = parent(&runtime, SubagentSpec::new("researcher", child.clone()), script);
        (parent, child)
    };
    // Process one: its child executor takes no work any more, so the child's task is only
    // persisted and queued when the parent's tool sends it; then the process goes away.
    let (first, first_child) = build(vec![
        create_background("alpha", "find A"),
        MockResponse::Text("started".into()),
    ]);
    first_child.shutdown().await;
    let task = ask(&first, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let thread = task.thread_id.clone();
    let kid = first.thread(&auth, thread.clone()).children().await.unwrap()[0].clone();
    assert!(child_tasks(&runtime, &auth, &kid)
        .await
        .iter()
        .all(|t| !t.state().is_terminal()));
    first.shutdown().await;
    drop((first, first_child));

    // Process two: fresh executors on the same store. The child's task is recovered and its
    // own completion path queues the result on the parent, whose executor runs it.
    let (second, second_child) = build(vec![MockResponse::Text("thanks, alpha".into())]);
    assert_eq!(second_child.recover(&auth).await.unwrap(), 1);
    until_history(&second, &auth, &thread, "the parent's answer to the result", answered_alpha).await;
    let kid = second.thread(&auth, thread).children().await.unwrap()[0].clone();
    assert_eq!(kid.status, "terminated");
}

#[tokio::test]
async fn notify_parent_is_run_by_the_parents_agent_not_the_childs() {
    let (runtime, auth) = backend();
    let notify = object_tool("notify", "Tells the parent", |_a, ctx| async move {
        ctx.thread.notify_parent("progress: 50%").await?;
        Ok(json!("told"))
    });
    let child = on(
        &runtime,
        scripted_agent("researcher", call_then_answer("notify", json!({}), "child done"))
            .tool(notify),
    );
    let spec = SubagentSpec::new("researcher", child).parent_communication(ParentCommunication::Explicit);
    let exec = parent(
        &runtime,
        spec,
        background_then("alpha", "work", "parent saw it"),
    );
    let task = ask(&exec, &auth, "go").await;
    let thread = task.thread_id.clone();
    until_history(&exec, &auth, &thread, "the parent's answer to the note", |history| {
        let at = history.iter().position(|m| m.content.contains("progress: 50%"));
        at.is_some_and(|i| history[i + 1..].iter().any(|m| m.role == LlmRole::Assistant && m.content == "parent saw it"))
    })
    .await;
    assert_status_message(&exec, &auth, &thread, "progress: 50%", "subagent_message").await;
}

#[tokio::test]
async fn a_forged_delivery_marker_queues_nothing_on_another_thread() {
    let (runtime, auth) = backend();
    let child_exec = child_executor(&runtime);
    let (real_parent, victim, child_thread) = (ThreadId::new(), ThreadId::new(), ThreadId::new());
    register_running_child(
        runtime.as_ref(),
        &auth,
        &child_thread,
        &real_parent,
        "alpha",
        "researcher",
    )
    .await;
    // A caller's own run context claims the child's result belongs to another thread.
    let mut run = RunContext::new();
    run.metadata.insert(
        "keel.subagent_delivery".into(),
        json!({"parent_thread_id": victim, "subagent": "researcher", "name": "alpha",
               "communication": "auto"}),
    );
    let task = child_exec
        .send_message(
            &auth,
            Message::user("hi").in_thread(child_thread),
            SendOptions {
                run_context: Some(run),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    for thread in [&victim, &real_parent] {
        assert_eq!(runtime.thread_store().queue_len(&auth, thread).await.unwrap(), 0);
    }
}

#[tokio::test]
async fn a_background_child_canceled_before_it_ran_still_reports_to_its_parent() {
    let (runtime, auth) = backend();
    let child = child_executor(&runtime);
    // The child's executor takes no work, so its task stays queued until it is canceled.
    child.shutdown().await;
    let exec = parent(
        &runtime,
        SubagentSpec::new("researcher", child.clone()),
        background_then("alpha", "find A", "alpha is gone"),
    );
    let task = ask(&exec, &auth, "go").await;
    let thread = task.thread_id.clone();
    let kid = exec.thread(&auth, thread.clone()).children().await.unwrap()[0].clone();
    let queued = child_tasks(&runtime, &auth, &kid).await[0].clone();
    let canceled = child.cancel_task(&auth, &queued.id, Some("not needed".into())).await.unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    until_history(&exec, &auth, &thread, "the cancel report", |history| {
        mentions(history, "[subagent alpha] was canceled")
    })
    .await;
    let kid = exec.thread(&auth, thread).children().await.unwrap()[0].clone();
    assert_eq!(kid.status, "terminated");
}

#[tokio::test]
async fn a_background_childs_result_wakes_a_parent_executor_in_another_process() {
    let (runtime, auth) = backend();
    let parent_of = |script: Vec<MockResponse>, child: AgentExecutor| {
        parent(&runtime, SubagentSpec::new("researcher", child), script)
    };
    // Process one creates the background child and goes away before the child ran.
    let first_child = child_executor(&runtime);
    first_child.shutdown().await;
    let first = parent_of(
        vec![
            create_background("alpha", "find A"),
            MockResponse::Text("started".into()),
        ],
        first_child.clone(),
    );
    let task = ask(&first, &auth, "go").await;
    assert_eq!(task.state(), TaskState::Completed);
    let thread = task.thread_id.clone();
    first.shutdown().await;
    drop((first, first_child));

    // Process two runs the parent's agent (and its effect scheduler) and nothing else.
    let second = parent_of(vec![MockResponse::Text("thanks, alpha".into())], child_executor(&runtime));
    second
        .start_effects_with(keel_agent::EffectConfig {
            recheck: Duration::from_millis(20),
            ..Default::default()
        })
        .unwrap();
    // Process three runs only the child's agent: no parent executor lives here, so the
    // result it queues on the parent thread must reach process two through the store.
    let third_child = child_executor(&runtime);
    assert_eq!(third_child.recover(&auth).await.unwrap(), 1);
    until_history(&second, &auth, &thread, "the parent's answer to the result", answered_alpha).await;
    assert_eq!(runtime.thread_store().queue_len(&auth, &thread).await.unwrap(), 0);
    second.shutdown().await;
    third_child.shutdown().await;
}
