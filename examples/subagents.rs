//! Subagents: a lead agent delegates two research subtasks to two instances of a
//! `researcher` subagent, each on a child thread of its own, and merges their answers.
//! The lead's brief (a file in its thread's attachment store) is handed to the first child,
//! which gets a copy in its own store. Everything runs offline with scripted models. Prints
//! the parent's subagent registry, where each child's copy of the brief lives, each child's
//! answer as the parent's model saw it, and the merged answer.
//!
//! Run with `cargo run -p keel --example subagents`.

use std::sync::Arc;

use keel::agent::SubagentSpec;
use keel::llm::{LlmRole, MockResponse, ToolCall};
use keel::prelude::*;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    let runtime: Arc<dyn Runtime> = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();

    // The child: one researcher agent, with its own executor on the same runtime. Its
    // scripted model answers the two subtasks in the order they arrive.
    let researcher = Agent::builder(AgentCard::new(
        "researcher",
        "Researches one question and answers in a sentence.",
        "http://127.0.0.1:0",
    ))
    .instructions("Research the question and answer in one sentence.")
    .llm(MockLlm::scripted(vec![
        MockResponse::Text("Tokio is the most used async runtime for Rust.".into()),
        MockResponse::Text("Axum is a web framework built on Tokio and Tower.".into()),
    ]))
    .build()?;
    let researchers = AgentExecutor::new(researcher, runtime.clone());

    // The lead's thread holds a brief; only a copy of it ever reaches a child's thread.
    let thread_id = ThreadId::new();
    let brief = researchers
        .thread(&auth, thread_id.clone())
        .put_attachment(
            "brief.txt",
            Some("text/plain"),
            b"Focus on production services.",
        )
        .await?;
    let brief_uri = brief.uri.unwrap_or_default();
    println!("the lead's brief: {brief_uri}");

    // The parent: delegates both subtasks in one step, then merges.
    let lead = Agent::builder(AgentCard::new(
        "lead",
        "Splits a question into research subtasks and merges the answers.",
        "http://127.0.0.1:0",
    ))
    .instructions("Delegate research with subagent_create, then merge the answers.")
    .llm(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![
            ToolCall::new(
                "subagent_create",
                json!({"name": "runtime-research",
                       "message": "Which async runtime do Rust services use? See the brief.",
                       "attachments": [brief_uri]}),
            ),
            ToolCall::new(
                "subagent_create",
                json!({"name": "web-research", "message": "Which web framework pairs with it?"}),
            ),
        ]),
        MockResponse::Text(
            "Merged: Rust services mostly run on Tokio, and Axum (built on Tokio and Tower) \
             is the usual web framework on top of it."
                .into(),
        ),
    ]))
    .subagent(
        SubagentSpec::new("researcher", researchers.clone())
            .max_instances(2)
            .resumable(true),
    )
    .build()?;
    let executor = AgentExecutor::new(lead, runtime);

    let task = executor
        .send_message(
            &auth,
            Message::user("How do people build web services in Rust?").in_thread(thread_id),
            SendOptions::default(),
        )
        .await?;
    println!("task {} ended {}", task.id, task.state());

    let thread = executor.thread(&auth, task.thread_id.clone());
    println!("\nsubagent registry of thread {}:", task.thread_id);
    for child in thread.children().await? {
        println!(
            "  {:<18} agent={} status={} resumable={} thread={}",
            child.name, child.agent, child.status, child.resumable, child.thread_id
        );
        for file in researchers
            .thread(&auth, child.thread_id.clone())
            .attachments()
            .await?
        {
            println!("    its copy: {}", file.uri.unwrap_or_default());
        }
    }

    println!("\nchild answers, as the lead's model saw them:");
    for entry in thread.history().await? {
        if entry.message.role == LlmRole::Tool {
            println!("  {}", entry.message.content);
        }
    }

    let answer = task
        .status()
        .message
        .as_ref()
        .map(Message::text)
        .unwrap_or_default();
    println!("\nmerged answer: {answer}");
    Ok(())
}
