// Explicit parts run without the model loop: `infer` parts make one model call each (no
// tools, output checked against its schema), an `error` part fails the task and a `status`
// part asking for input leaves it input-required (seed 001's default lifecycle).

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor};
use keel_core::{AgentCard, Message, Part, PartContent, Role, Task, TaskState};
use keel_llm::{MockLlm, MockResponse};
use keel_runtime::AuthContext;
use serde_json::json;
use super::fixture::{backend, echo_tool, send};

fn executor(llm: Arc<MockLlm>) -> (AgentExecutor, AuthContext) {
    let agent = Agent::builder(AgentCard::new("inferrer", "infers", "http://127.0.0.1:0"))
        .instructions("Be exact.")
        .llm_shared(llm)
        .tool(echo_tool())
        .build()
        .unwrap();
    let (runtime, auth) = backend();
    (AgentExecutor::new(agent, runtime), auth)
}

fn infer_outputs(task: &Task) -> Vec<serde_json::Value> {
    task.history
        .iter()
        .filter(|m| m.role == Role::Agent)
        .flat_map(|m| &m.parts)
        .filter_map(|p| match &p.content {
            PartContent::InferOutput { output } => Some(output.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_infer_part_is_one_model_call_without_tools() {
    let llm = Arc::new(MockLlm::scripted(vec![MockResponse::Text("I am exact.".into())]));
    let (exec, auth) = executor(llm.clone());
    let task = send(&exec, &auth, Message::infer("Who are you?")).await;
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    assert_eq!(infer_outputs(&task), [json!("I am exact.")]);
    assert_eq!(task.artifacts[0].parts[0].as_text(), Some("I am exact."));
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert!(requests[0].tools.is_empty());
    let sent: Vec<_> = requests[0].messages.iter().map(|m| m.content.clone()).collect();
    assert_eq!(sent, ["Be exact.", "Who are you?"]);
}

#[tokio::test]
async fn an_infer_part_with_an_output_schema_completes_only_with_output_that_follows_it() {
    let schema = json!({"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]});
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::Text("```json\n{\"sum\": 5}\n```".into()),
        MockResponse::Text("{\"total\": 5}".into()),
    ]));
    let (exec, auth) = executor(llm.clone());
    let task = send(
        &exec,
        &auth,
        Message::infer_with(Some("2 + 3".into()), None, Some(schema.clone()), Default::default()),
    )
    .await;
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    assert_eq!(infer_outputs(&task), [json!({"sum": 5})]);
    assert_eq!(llm.requests()[0].output_schema.as_ref(), Some(&schema));

    let task = send(
        &exec,
        &auth,
        Message::infer_with(Some("2 + 3".into()), None, Some(schema), Default::default()),
    )
    .await;
    assert_eq!(task.state(), TaskState::Failed);
    let error = task.metadata["error"].to_string();
    assert!(error.contains("schema"), "{error}");
}

#[tokio::test]
async fn tool_calls_and_infers_of_one_message_run_in_order() {
    let llm = Arc::new(MockLlm::scripted(vec![MockResponse::Text("inferred".into())]));
    let (exec, auth) = executor(llm.clone());
    let message = Message::new(
        Role::User,
        vec![
            Part::tool_call("c1", "echo", json!({"say": "hi"})),
            Part::infer("then infer"),
        ],
    );
    let task = send(&exec, &auth, message).await;
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    let kinds: Vec<_> = task
        .history
        .iter()
        .flat_map(|m| m.parts.iter().map(|p| p.content.type_name()))
        .collect();
    assert_eq!(kinds, ["tool_call", "infer", "tool_output", "infer_output", "text"]);
    assert_eq!(llm.requests().len(), 1);
}

#[tokio::test]
async fn an_error_part_fails_the_task_and_a_status_part_asks_for_input() {
    let llm = Arc::new(MockLlm::scripted(vec![]));
    let (exec, auth) = executor(llm.clone());
    let failed = send(
        &exec,
        &auth,
        Message::new(Role::User, vec![Part::error("upstream broke")]),
    )
    .await;
    assert_eq!(failed.state(), TaskState::Failed);
    assert!(failed.metadata["error"].to_string().contains("upstream broke"));

    let waiting = send(
        &exec,
        &auth,
        Message::new(
            Role::User,
            vec![Part::status(TaskState::InputRequired, Some("Which city?".into()))],
        ),
    )
    .await;
    assert_eq!(waiting.state(), TaskState::InputRequired);
    assert_eq!(waiting.status().message.as_ref().unwrap().text(), "Which city?");
    assert!(llm.requests().is_empty(), "no part here asks the model");
}
