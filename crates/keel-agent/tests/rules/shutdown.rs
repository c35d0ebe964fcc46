// A shutdown hands work on: running tasks stop at their next step (or, past the drain, where
// they are), stay unfinished rather than canceled, and the next executor on the store resumes
// them at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, ExecutorConfig, FnTool, SendOptions};
use keel_core::{AgentCard, Message, TaskState};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_runtime::{AuthContext, Runtime};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

/// A tool that counts its calls, says when one started, and answers only once the test
/// lets it (one permit per call). Not idempotent: a call cut off is never run again.
struct Gate {
    calls: Arc<AtomicUsize>,
    started: Arc<Notify>,
    open: Arc<Semaphore>,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            calls: Arc::new(AtomicUsize::new(0)),
            started: Arc::new(Notify::new()),
            open: Arc::new(Semaphore::new(0)),
        }
    }

    fn tool(&self) -> FnTool {
        let (calls, started, open) = (self.calls.clone(), self.started.clone(), self.open.clone());
        super::fixture::object_tool("charge", "Charge the card once", move |_, _| {
            let (calls, started, open) = (calls.clone(), started.clone(), open.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                open.acquire().await.expect("the gate stays open").forget();
                Ok(json!("charged"))
            }
        })
    }
}

/// The model: call `charge`, then answer after its result, whoever runs the step.
fn model() -> Arc<MockLlm> {
    Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("charge", json!({}))]),
        MockResponse::Text("charged once".into()),
    ]))
}

fn executor_on(runtime: Arc<dyn Runtime>, llm: &Arc<MockLlm>, gate: &Gate, drain: Duration) -> AgentExecutor {
    let agent = Agent::builder(AgentCard::new("payer", "charges cards", "http://127.0.0.1:0"))
        .llm_shared(llm.clone())
        .tool(gate.tool())
        .build()
        .unwrap();
    let config = ExecutorConfig {
        drain_timeout: drain,
        ..ExecutorConfig::default()
    };
    AgentExecutor::with_config(agent, runtime, config)
}

/// A payer on this backend: its store, model, gate, caller and executor (with `drain`).
struct Payer {
    runtime: Arc<dyn Runtime>,
    llm: Arc<MockLlm>,
    gate: Gate,
    auth: AuthContext,
    exec: AgentExecutor,
}

fn payer(drain: Duration) -> Payer {
    let (runtime, llm, gate) = (super::runtime(), model(), Gate::new());
    let auth = runtime.auth_service().auth_context();
    let exec = executor_on(runtime.clone(), &llm, &gate, drain);
    Payer {
        runtime,
        llm,
        gate,
        auth,
        exec,
    }
}

/// Shut `exec` down while `during` runs: once the shutdown has begun (its first poll stops
/// the executor taking work), `during` goes on, and then the shutdown is awaited. Answers
/// what both answered.
async fn shutdown_during<T>(
    exec: &AgentExecutor,
    during: impl std::future::Future<Output = T>,
) -> (keel_agent::HandedOn, T) {
    let shutdown = exec.shutdown();
    tokio::pin!(shutdown);
    assert!(futures::poll!(&mut shutdown).is_pending());
    let answer = during.await;
    (shutdown.await, answer)
}

/// The task started on `exec`, once its `charge` call is in flight.
async fn charging(exec: &AgentExecutor, auth: &AuthContext, gate: &Gate) -> keel_core::Task {
    let started = gate.started.notified();
    let task = super::fixture::start(exec, auth, Message::user("charge my card")).await;
    started.await;
    task
}

/// A second executor on the same store (a restarted process, under another holder name)
/// resumes the task: it must finish well within one lease TTL, so the first one released its
/// thread rather than leaving its lease to lapse.
async fn resumed_elsewhere(runtime: Arc<dyn Runtime>, llm: &Arc<MockLlm>, gate: &Gate, auth: &AuthContext, task_id: &keel_core::TaskId) -> keel_core::Task {
    let next = executor_on(runtime, llm, gate, Duration::from_secs(10));
    assert_eq!(next.recover_all().await.unwrap(), 1);
    let done = keel_runtime::testing::eventually("the task to finish in the next executor", || {
        let next = next.clone();
        async move {
            let task = next.get_task(auth, task_id, None).await.unwrap();
            task.state().is_terminal().then_some(task)
        }
    })
    .await;
    next.shutdown().await;
    done
}

#[tokio::test]
async fn shutdown_lets_a_tool_call_finish_and_hands_the_task_on_uncanceled() {
    let Payer { runtime, llm, gate, auth, exec } = payer(Duration::from_secs(30));
    let task = charging(&exec, &auth, &gate).await;

    // The call in flight goes on after the shutdown began.
    let (handed, ()) = shutdown_during(&exec, async { gate.open.add_permits(1) }).await;
    assert_eq!(handed.drained, vec![task.id.clone()]);
    assert!(handed.interrupted.is_empty(), "{handed:?}");

    // The call's result was persisted; the next step was left for the next process.
    let stored = exec.get_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(stored.state(), TaskState::Working);
    let outputs: Vec<_> = keel_runtime::testing::tool_outputs(&stored)
        .into_iter()
        .map(|(output, _)| output)
        .collect();
    assert_eq!(outputs, vec![json!("charged")]);
    assert_eq!(llm.requests().len(), 1, "the second step was not begun");

    let done = resumed_elsewhere(runtime, &llm, &gate, &auth, &task.id).await;
    assert_eq!(done.state(), TaskState::Completed, "{:?}", done.status());
    assert_eq!(done.status().message.as_ref().unwrap().text(), "charged once");
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1, "the tool ran once");
    assert_eq!(llm.requests().len(), 2, "no model call was made twice");
}

#[tokio::test]
async fn a_drain_that_runs_out_stops_the_call_where_it_is_and_the_tool_is_not_run_again() {
    let Payer { runtime, llm, gate, auth, exec } = payer(Duration::from_millis(100));
    let task = charging(&exec, &auth, &gate).await;

    // The gate stays shut: the call outlasts the drain.
    let handed = exec.shutdown().await;
    assert!(handed.drained.is_empty(), "{handed:?}");
    assert_eq!(handed.interrupted, vec![task.id.clone()]);
    assert!(!exec.is_running(&auth, &task.id));
    let stored = exec.get_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(stored.state(), TaskState::Working);

    // The call may have charged the card: it is not run again, and the model hears so.
    let done = resumed_elsewhere(runtime, &llm, &gate, &auth, &task.id).await;
    assert_eq!(done.state(), TaskState::Completed, "{:?}", done.status());
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1, "the tool ran at most once");
    let requests = llm.requests();
    let seen = requests.last().unwrap().messages.iter().map(|m| m.content.clone()).collect::<Vec<_>>().join("\n");
    assert!(seen.contains("its result was never saved"), "{seen}");
}

#[tokio::test]
async fn a_blocked_sender_is_answered_with_the_unfinished_task_when_the_shutdown_ends() {
    let Payer { gate, auth, exec, .. } = payer(Duration::from_millis(100));
    let started = gate.started.notified();
    let blocked = tokio::spawn({
        let (exec, auth) = (exec.clone(), auth.clone());
        async move {
            exec.send_message(&auth, Message::user("charge my card"), SendOptions::default())
                .await
        }
    });
    started.await;
    let handed = exec.shutdown().await;
    let answer = blocked.await.unwrap().unwrap();
    assert_eq!(handed.interrupted, vec![answer.id.clone()]);
    assert_eq!(answer.state(), TaskState::Working);
}

#[tokio::test]
async fn a_message_sent_during_the_drain_is_kept_for_the_next_process() {
    let Payer { gate, auth, exec, .. } = payer(Duration::from_secs(30));
    let first = charging(&exec, &auth, &gate).await;
    let (handed, late) = shutdown_during(&exec, async {
        // Accepted and stored, but not started here.
        let late = super::fixture::start(&exec, &auth, Message::user("hello")).await;
        gate.open.add_permits(1);
        late
    })
    .await;
    assert_eq!(handed.drained, vec![first.id.clone()]);
    let late = exec.get_task(&auth, &late.id, None).await.unwrap();
    assert_eq!(late.state(), TaskState::Submitted);
    assert!(!exec.is_running(&auth, &late.id));
}

#[tokio::test]
async fn a_cancel_asked_during_the_drain_still_cancels() {
    let Payer { gate, auth, exec, .. } = payer(Duration::from_secs(30));
    let task = charging(&exec, &auth, &gate).await;
    let asked = exec.cancel_task(&auth, &task.id, Some("asked".into()));
    let (handed, canceled) = shutdown_during(&exec, asked).await;
    let canceled = canceled.unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
    assert_eq!(canceled.metadata["cancel_reason"], "asked");
    assert!(handed.is_empty(), "{handed:?}");
}
