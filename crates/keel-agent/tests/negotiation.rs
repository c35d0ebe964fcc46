//! Negotiation before a task starts: an agent with skills asks the runtime's model which
//! skill fits unless it set a negotiator; an agent without skills accepts without a call.

use std::sync::Arc;

use keel_agent::{AcceptAll, Agent, AgentExecutor, SendOptions};
use keel_core::{AgentCard, AgentSkill, Message, Task, TaskState};
use keel_llm::{MockLlm, MockResponse};
use keel_runtime::Services;

fn card(with_skills: bool) -> AgentCard {
    let card = AgentCard::new("desk", "a help desk", "http://127.0.0.1:0");
    if with_skills {
        card.with_skill(AgentSkill::new("translate", "Translates text"))
            .with_skill(AgentSkill::new("summarize", "Summarizes text"))
    } else {
        card
    }
}

/// The runtime's model answers negotiation with `verdict`; the agent's own model answers
/// the task.
fn executor(
    agent: impl FnOnce(Arc<MockLlm>) -> Agent,
    verdict: &str,
) -> (AgentExecutor, Arc<MockLlm>) {
    let runtime_model = Arc::new(MockLlm::scripted(vec![MockResponse::Text(verdict.into())]));
    let runtime = Arc::new(Services::in_memory(runtime_model.clone()));
    let agent_model = Arc::new(MockLlm::scripted(vec![MockResponse::Text(
        "bonjour".into(),
    )]));
    (
        AgentExecutor::new(agent(agent_model), runtime),
        runtime_model,
    )
}

/// Send `text` as the runtime's caller and wait for the task.
async fn ask(exec: &AgentExecutor, text: &str) -> Task {
    let auth = exec.runtime().auth_service().auth_context();
    exec.send_message(&auth, Message::user(text), SendOptions::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn an_agent_with_skills_negotiates_with_the_runtimes_model_by_default() {
    let (exec, runtime_model) = executor(
        |llm| Agent::builder(card(true)).llm_shared(llm).build().unwrap(),
        r#"{"decision": "accept", "skill": "translate"}"#,
    );
    let task = ask(&exec, "say hello in French").await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(
        task.metadata["skill"], "translate",
        "the model's choice is recorded"
    );
    assert_eq!(runtime_model.requests().len(), 1, "one negotiation call");
}

#[tokio::test]
async fn the_runtimes_model_can_reject_before_the_task_starts() {
    let (exec, _) = executor(
        |llm| Agent::builder(card(true)).llm_shared(llm).build().unwrap(),
        r#"{"decision": "reject", "reason": "we only translate and summarize"}"#,
    );
    let task = ask(&exec, "book me a flight").await;
    assert_eq!(task.state(), TaskState::Rejected);
}

#[tokio::test]
async fn without_skills_or_with_accept_all_no_model_is_asked() {
    for with_skills in [false, true] {
        let (exec, runtime_model) = executor(
            |llm| {
                let builder = Agent::builder(card(with_skills)).llm_shared(llm);
                // With skills, accept-all must be chosen; without, it is the default.
                let builder = if with_skills {
                    builder.negotiator(AcceptAll)
                } else {
                    builder
                };
                builder.build().unwrap()
            },
            r#"{"decision": "reject", "reason": "never asked"}"#,
        );
        let task = ask(&exec, "hi").await;
        assert_eq!(task.state(), TaskState::Completed, "skills: {with_skills}");
        assert!(runtime_model.requests().is_empty(), "skills: {with_skills}");
        assert!(!task.metadata.contains_key("skill"));
    }
}
