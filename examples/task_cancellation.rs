//! Live cancellation: start a long run, cancel it from another task, print the final
//! `canceled` status and its reason. Runs offline.
//!
//! Run with `cargo run -p keel --example task_cancellation`.

use std::sync::Arc;

use keel::prelude::*;

#[tokio::main]
async fn main() -> Result<(), AgentError> {
    let runtime = Arc::new(DefaultRuntime::offline());
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(keel::demo::agent()?, runtime);

    // The demo agent's `sleep` tool waits, but stops as soon as its run is canceled.
    let task = executor
        .send_message(
            &auth,
            Message::user(r#"/sleep {"seconds": 300}"#),
            SendOptions {
                return_immediately: true,
                ..Default::default()
            },
        )
        .await?;
    println!("started task {} ({})", task.id, task.state());

    let canceler = {
        let (executor, auth, task_id) = (executor.clone(), auth.clone(), task.id.clone());
        tokio::spawn(async move {
            executor
                .cancel_task(&auth, &task_id, Some("the user closed the window".into()))
                .await
        })
    };
    let canceled = canceler
        .await
        .map_err(|e| AgentError::internal(format!("cancel task panicked: {e}")))??;

    println!("task {} is now {}", canceled.id, canceled.state());
    println!("reason: {}", canceled.metadata["cancel_reason"]);
    for change in &canceled.state_history {
        println!("  {} -> {}", change.previous_state, change.new_state);
    }
    Ok(())
}
