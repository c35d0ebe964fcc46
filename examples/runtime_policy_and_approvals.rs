//! Policy and approvals, offline: the model asks to delete a record; the tool builds a
//! preview; policy requires approval; the application approves; every step is captured as a
//! normalized event. Then a stricter per-run permission prevents a second side effect.
//!
//! Run with `cargo run -p keel --example runtime_policy_and_approvals`.

use std::sync::Arc;

use keel::events::{InMemoryEventSink, RunEvent};
use keel::llm::{MockResponse, ToolCall};
use keel::policy::{approve_request, ApprovalFn, CapabilityPolicy, CapabilityRule};
use keel::prelude::*;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    let delete = FnTool::new(
        "delete_record",
        "Delete a customer record.",
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
        |args, _ctx| async move {
            Ok(json!(format!(
                "deleted {}",
                args["id"].as_str().unwrap_or("?")
            )))
        },
    )
    .with_capabilities(["records.delete"])
    .with_preview(|args| {
        Some(
            Artifact::text(format!(
                "Record {} will be deleted permanently.",
                args["id"]
            ))
            .of_kind("preview"),
        )
    });

    let model = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new(
            "delete_record",
            json!({"id": "cust-42"}),
        )]),
        MockResponse::Text("Record cust-42 is deleted.".into()),
        MockResponse::ToolCalls(vec![ToolCall::new(
            "delete_record",
            json!({"id": "cust-43"}),
        )]),
        MockResponse::Text("I could not delete cust-43.".into()),
    ]));
    let agent = Agent::builder(AgentCard::new(
        "records",
        "Manages records",
        "http://127.0.0.1:0",
    ))
    .llm_shared(model)
    .tool(delete)
    .policy(CapabilityPolicy::new().with_rule("records.*", CapabilityRule::RequireApproval))
    .approval_handler(ApprovalFn::new(
        |request: keel::core::ApprovalRequest, _ctx: RunContext| async move {
            println!(
                "approval asked: {} ({})",
                request.action.name, request.reason
            );
            for preview in &request.action.previews {
                println!(
                    "  preview: {}",
                    preview.parts[0].as_text().unwrap_or_default()
                );
            }
            println!("  -> approved by the operator");
            Ok(approve_request(&request, "operator"))
        },
    ))
    .build()?;

    let runtime = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(agent, runtime);
    let events = Arc::new(InMemoryEventSink::new());
    executor.add_event_sink(events.clone());

    let task = executor
        .send_message(
            &auth,
            Message::user("Delete customer 42"),
            SendOptions::default(),
        )
        .await?;
    println!(
        "first task: {} ({})",
        task.state(),
        task.status()
            .message
            .as_ref()
            .map(Message::text)
            .unwrap_or_default()
    );
    print_events(&events.events());

    // A stricter run: its permissions deny deletes outright, whatever the approver would say.
    events.clear();
    let mut strict = RunContext::new();
    strict
        .permissions
        .insert("records.delete".into(), json!("deny"));
    let task = executor
        .send_message(
            &auth,
            Message::user("Delete customer 43"),
            SendOptions {
                run_context: Some(strict),
                ..Default::default()
            },
        )
        .await?;
    println!(
        "second task: {} ({})",
        task.state(),
        task.status()
            .message
            .as_ref()
            .map(Message::text)
            .unwrap_or_default()
    );
    for event in events.events().iter().filter(|e| e.is("action.denied")) {
        println!("denied: {}", event.payload["reason"]);
    }
    Ok(())
}

fn print_events(events: &[RunEvent]) {
    for event in events {
        println!(
            "  #{:<2} {:<20} {}",
            event.sequence,
            event.event_type.as_str(),
            event.summary
        );
    }
}
