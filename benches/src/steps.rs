//! The engine's per-step persistence, as a workload: each thread takes its lease once, then
//! per step appends the assistant's tool call and the tool's result to the thread history
//! under the lease, adds a task event and saves the task snapshot, in that order, each
//! awaited before the next (as the engine does).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_core::{AgentError, AgentResult, Message, Task, TaskEvent, ThreadId};
use keel_llm::{LlmMessage, ToolCall};
use keel_runtime::{AuthContext, Lease, TaskManager, ThreadStore};
use serde_json::json;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::Rate;

/// How long a measurement runs, and the most steps it takes (whichever ends it first).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Wall time.
    pub duration: Duration,
    /// Steps across all threads.
    pub max_steps: u64,
}

/// Longer than any measurement, so no lease needs renewing.
const LEASE_TTL: Duration = Duration::from_secs(3600);

/// Run `concurrency` threads, each on its own conversation thread and task, stepping until
/// the budget is spent; the rate counts steps from the moment every thread is set up.
pub async fn persisted_steps(
    tasks: Arc<dyn TaskManager>,
    threads: Arc<dyn ThreadStore>,
    concurrency: usize,
    budget: Budget,
) -> AgentResult<Rate> {
    // One tenant per measurement, so measurements on one store never see each other's data.
    let auth = AuthContext::new("keel-bench", uuid::Uuid::new_v4().simple().to_string());
    let start = Arc::new(Barrier::new(concurrency + 1));
    let taken = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (tasks, threads, auth) = (tasks.clone(), threads.clone(), auth.clone());
        let (start, taken) = (start.clone(), taken.clone());
        workers.push(tokio::spawn(async move {
            // Set up, then wait at the barrier even when set-up failed, so it never hangs.
            let setup = set_up(tasks.as_ref(), threads.as_ref(), &auth).await;
            start.wait().await;
            let (mut task, lease) = setup?;
            let steps = run_steps(
                tasks.as_ref(),
                threads.as_ref(),
                &auth,
                &mut task,
                &lease,
                budget,
                &taken,
            )
            .await;
            threads.release_lease(&auth, &lease).await?;
            steps
        }));
    }
    start.wait().await;
    let began = Instant::now();
    let mut steps = 0;
    let mut failure = None;
    for worker in workers {
        match worker.await {
            Ok(Ok(n)) => steps += n,
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(AgentError::internal(format!("a bench thread failed: {e}"))),
        }
    }
    let elapsed = began.elapsed();
    match failure {
        Some(e) => Err(e),
        None => Ok(Rate {
            ops: steps,
            elapsed,
        }),
    }
}

/// A working task on a fresh thread, saved, and the thread's lease.
async fn set_up(
    tasks: &dyn TaskManager,
    threads: &dyn ThreadStore,
    auth: &AuthContext,
) -> AgentResult<(Task, Lease)> {
    let thread = ThreadId::from(format!("bench-{}", uuid::Uuid::new_v4().simple()));
    let mut task = Task::new(thread.clone());
    task.begin()?;
    tasks.save_task(auth, &task).await?;
    let lease = threads
        .acquire_lease(auth, &thread, "bench", LEASE_TTL)
        .await?
        .ok_or_else(|| AgentError::internal("a fresh thread was already leased"))?;
    Ok((task, lease))
}

async fn run_steps(
    tasks: &dyn TaskManager,
    threads: &dyn ThreadStore,
    auth: &AuthContext,
    task: &mut Task,
    lease: &Lease,
    budget: Budget,
    taken: &AtomicU64,
) -> AgentResult<u64> {
    let deadline = Instant::now() + budget.duration;
    let mut steps = 0u64;
    while Instant::now() < deadline && taken.fetch_add(1, Ordering::Relaxed) < budget.max_steps {
        let call = ToolCall::new(
            "lookup_weather",
            json!({"city": "Paris", "units": "metric"}),
        );
        let messages = [
            LlmMessage::assistant("Let me look that up.", vec![call.clone()]),
            LlmMessage::tool_result(&call, r#"{"temperature_c": 18, "sky": "light rain"}"#),
        ];
        threads.append_history(auth, lease, &messages).await?;
        let mut message = Message::agent(format!("called lookup_weather (step {steps})"));
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        tasks
            .add_task_event(auth, &task.id, &TaskEvent::Message { message })
            .await?;
        task.metadata.insert("steps".into(), json!(steps + 1));
        tasks.save_task(auth, task).await?;
        steps += 1;
    }
    Ok(steps)
}
