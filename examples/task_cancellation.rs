//! Live, best-effort cancellation with a tool that commits late: the run's normalized
//! events stream as they happen; the `transfer` tool prepares, waits on a slow remote
//! step, and checks for cancellation before it commits. The task is canceled while the
//! tool waits, so the ledger stays empty; the example prints the final normalized event.
//! Runs offline, and fails (exit code 1) if the side effect was committed.
//!
//! Run with `cargo run -p keel --example task_cancellation`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel::events::{EventSink, EventType, RunEvent};
use keel::llm::{MockResponse, ToolCall};
use keel::prelude::*;
use serde_json::json;
use tokio::sync::mpsc;

/// Forwards each normalized event to a channel: how an application streams a run.
struct Stream(mpsc::UnboundedSender<RunEvent>);

#[async_trait]
impl EventSink for Stream {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        // The receiver outlives the run here; a dropped receiver only means nobody watches.
        let _ = self.0.send(event.clone());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    // The external system the tool changes: a list of committed transfers.
    let ledger: Arc<Mutex<Vec<String>>> = Arc::default();
    let transfer = {
        let ledger = ledger.clone();
        FnTool::new(
            "transfer",
            "Move money between two accounts.",
            json!({
                "type": "object",
                "properties": {"to": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["to", "amount"]
            }),
            move |args, ctx| {
                let ledger = ledger.clone();
                async move {
                    // Prepare: nothing irreversible happens before the commit below.
                    let entry = format!("{} to {}", args["amount"], args["to"]);
                    // A slow remote step (a quote, a fraud check) that stops on cancel.
                    tokio::select! {
                        () = ctx.cancel.cancelled() => return Ok(json!("stopped before commit")),
                        () = tokio::time::sleep(Duration::from_secs(300)) => {}
                    }
                    // Commit late, and only if the run is still wanted.
                    if ctx.cancel.is_cancelled() {
                        return Ok(json!("stopped before commit"));
                    }
                    ledger.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
                    Ok(json!("committed"))
                }
            },
        )
    };
    let model = MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new(
            "transfer",
            json!({"to": "ACME", "amount": 120}),
        )]),
        MockResponse::Text("Done.".into()),
    ]);
    let agent = Agent::builder(AgentCard::new(
        "payments",
        "Moves money",
        "http://127.0.0.1:0",
    ))
    .instructions("Make the transfers the user asks for.")
    .llm(model)
    .tool(transfer)
    .build()?;

    let runtime = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(agent, runtime);
    let (events, mut stream) = mpsc::unbounded_channel();
    executor.add_event_sink(Arc::new(Stream(events)));

    let task = executor
        .send_message(
            &auth,
            Message::user("Send 120 to ACME"),
            SendOptions {
                return_immediately: true,
                ..Default::default()
            },
        )
        .await?;
    println!("started task {} ({})", task.id, task.state());

    // Stream the run; cancel once the transfer has started, then read on to the final event.
    let mut last = None;
    let mut canceler = None;
    while let Some(event) = stream.recv().await {
        println!(
            "  #{} {} {}",
            event.sequence, event.event_type, event.summary
        );
        if event.event_type == EventType::ACTION_STARTED && canceler.is_none() {
            let (executor, auth, task_id) = (executor.clone(), auth.clone(), task.id.clone());
            canceler = Some(tokio::spawn(async move {
                executor
                    .cancel_task(&auth, &task_id, Some("the user closed the window".into()))
                    .await
            }));
        }
        if event.is_final {
            last = Some(event);
            break;
        }
    }
    let canceled = match canceler {
        Some(canceler) => canceler
            .await
            .map_err(|e| AgentError::internal(format!("cancel task panicked: {e}")))??,
        None => return Err(AgentError::internal("the transfer never started")),
    };
    println!("task {} is now {}", canceled.id, canceled.state());
    println!("reason: {}", canceled.metadata["cancel_reason"]);

    let committed = ledger.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!("ledger: {committed:?}");
    let last = last.ok_or_else(|| AgentError::internal("the run ended without a final event"))?;
    println!("final event:");
    let mut shown = serde_json::to_value(&last).map_err(AgentError::internal)?;
    shown["payload"]["task"] = json!("(the task, in Keel's JSON)");
    println!(
        "{}",
        serde_json::to_string_pretty(&shown).map_err(AgentError::internal)?
    );

    if !committed.is_empty() || canceled.state() != TaskState::Canceled {
        return Err(AgentError::internal("the canceled transfer was committed"));
    }
    Ok(())
}
