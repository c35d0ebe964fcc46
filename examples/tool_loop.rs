//! An agent with one tool, driven by the scripted offline model: the model asks for the
//! tool, Keel validates the arguments, runs it, persists every step and hands the result
//! back, and the model answers. Prints the task's persisted history.
//!
//! Run with `cargo run -p keel --example tool_loop`.

use std::sync::Arc;

use keel::llm::{MockResponse, ToolCall};
use keel::prelude::*;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    let weather = FnTool::new(
        "get_weather",
        "Current weather for a city.",
        json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"]
        }),
        |args, _ctx| async move { Ok(json!({"city": args["city"], "sky": "sunny", "celsius": 24})) },
    );
    let model = MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new(
            "get_weather",
            json!({"city": "Athens"}),
        )]),
        MockResponse::Text("It is sunny and 24 °C in Athens.".into()),
    ]);
    let agent = Agent::builder(AgentCard::new(
        "weather",
        "Weather answers",
        "http://127.0.0.1:0",
    ))
    .instructions("Answer weather questions with the get_weather tool.")
    .llm(model)
    .tool(weather)
    .build()?;

    let runtime = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(agent, runtime);
    let task = executor
        .send_message(
            &auth,
            Message::user("What's the weather in Athens?"),
            SendOptions::default(),
        )
        .await?;

    println!("task {} ended {}", task.id, task.state());
    for message in &task.history {
        for part in &message.parts {
            let content = serde_json::to_string(&part.content).unwrap_or_default();
            println!("  {:?}: {content}", message.role);
        }
    }
    Ok(())
}
