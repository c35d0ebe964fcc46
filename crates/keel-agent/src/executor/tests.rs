//! The executor's own unit tests: how a run context is adopted, logging, and a cancel
//! nobody answers.

use super::*;
use std::time::Duration;

use keel_core::RunBudget;
use keel_runtime::LogLevel;
use serde_json::{json, Value};

fn with_context(permissions: Value, max_steps: Option<u32>) -> Task {
    let mut task = Task::create(Message::user("hi"));
    let mut ctx = RunContext::new().with_budget(RunBudget {
        max_steps,
        ..Default::default()
    });
    ctx.permissions = serde_json::from_value(permissions).unwrap();
    ctx.attach_to_task(&mut task).unwrap();
    task
}

fn incoming(permissions: Value, max_steps: Option<u32>) -> RunContext {
    let mut ctx = RunContext::new().with_budget(RunBudget {
        max_steps,
        ..Default::default()
    });
    ctx.permissions = serde_json::from_value(permissions).unwrap();
    ctx
}

#[test]
fn a_new_task_adopts_the_callers_context() {
    let mut task = Task::create(Message::user("hi"));
    let ctx = incoming(json!({"records.*": "deny"}), Some(3));
    adopt_run_context(&mut task, ctx.clone()).unwrap();
    let adopted = RunContext::from_task(&task).unwrap().unwrap();
    assert_eq!(adopted.run_id, ctx.run_id);
    assert_eq!(adopted.permissions, ctx.permissions);
    assert_eq!(adopted.budget.max_steps, Some(3));
}

#[test]
fn a_continuing_task_context_only_narrows() {
    // The budget takes the tighter limit, whichever side sets it.
    let mut task = with_context(json!({"records.*": "deny"}), Some(3));
    adopt_run_context(&mut task, incoming(json!({}), Some(10))).unwrap();
    let ctx = RunContext::from_task(&task).unwrap().unwrap();
    assert_eq!(ctx.budget.max_steps, Some(3));
    // Permissions left empty keep the task's (empty would mean "no narrowing").
    assert_eq!(ctx.permissions["records.*"], json!("deny"));

    // Other permissions are refused, naming the field, and change nothing.
    let before = task.metadata.clone();
    let err =
        adopt_run_context(&mut task, incoming(json!({"records.read": "allow"}), None)).unwrap_err();
    assert!(
        matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.metadata.run_context.permissions"),
        "{err:?}"
    );
    assert_eq!(task.metadata, before);

    // A task without permissions may take some: that only narrows.
    let mut open = with_context(json!({}), None);
    adopt_run_context(&mut open, incoming(json!({"records.*": false}), Some(2))).unwrap();
    let ctx = RunContext::from_task(&open).unwrap().unwrap();
    assert_eq!(ctx.permissions["records.*"], json!(false));
    assert_eq!(ctx.budget.max_steps, Some(2));
}

/// Records what the engine logs.
#[derive(Default)]
struct Recording {
    lines: std::sync::Mutex<Vec<(LogLevel, String)>>,
}

impl keel_runtime::LoggingService for Recording {
    fn log(&self, level: LogLevel, message: &str) {
        self.lines.lock().unwrap().push((level, message.to_owned()));
    }
}

/// In-memory services whose log is recorded.
fn recorded() -> (Arc<Recording>, Arc<keel_runtime::Services>) {
    let recording = Arc::new(Recording::default());
    let mut services = keel_runtime::Services::in_memory(Arc::new(keel_llm::MockLlm::new()));
    services.logging = recording.clone();
    (recording, Arc::new(services))
}

fn echo_agent() -> Agent {
    Agent::builder(keel_core::AgentCard::new("echo", "Echoes", "http://x"))
        .build()
        .unwrap()
}

/// A working task whose thread a live process named `elsewhere` holds, and that lease.
async fn working_task_held_elsewhere(
    runtime: &dyn Runtime,
    auth: &AuthContext,
) -> (Task, keel_runtime::Lease) {
    let mut task = Task::new(ThreadId::new());
    task.begin().unwrap();
    runtime.task_manager().save_task(auth, &task).await.unwrap();
    let lease = runtime
        .thread_store()
        .acquire_lease(auth, &task.thread_id, "elsewhere", Duration::from_secs(600))
        .await
        .unwrap()
        .unwrap();
    (task, lease)
}

#[tokio::test]
async fn the_engine_logs_through_the_runtimes_logging_service() {
    let (recording, runtime) = recorded();
    let auth = runtime.auth_service().auth_context();
    let agent = echo_agent();
    let executor = AgentExecutor::new(agent, runtime.clone());
    // Work the engine cannot read waits at the head of the thread's queue: the worker
    // drops it, saying so in the log, and goes on with the message behind it.
    let thread = ThreadId::new();
    runtime
        .thread_store()
        .push_queue(&auth, &thread, json!({"kind": "unheard_of"}))
        .await
        .unwrap();
    let task = executor
        .send_message(
            &auth,
            Message::user("hi").in_thread(thread),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    let lines = recording.lines.lock().unwrap().clone();
    assert!(
        lines.iter().any(|(level, line)| *level == LogLevel::Error
            && line.starts_with("dropping malformed queued work")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn a_cancel_the_threads_live_holder_never_answers_is_pending_after_a_bound() {
    let runtime = Arc::new(keel_runtime::Services::in_memory(Arc::new(
        keel_llm::MockLlm::new(),
    )));
    let auth = runtime.auth_service().auth_context();
    let agent = echo_agent();
    let config = ExecutorConfig {
        lease_ttl: Duration::from_millis(300),
        poll_interval: Duration::from_millis(20),
        ..ExecutorConfig::default()
    };
    let executor = AgentExecutor::with_config(agent, runtime.clone(), config);
    // A working task whose thread another live process holds, and which that process
    // does not stop.
    let (task, lease) = working_task_held_elsewhere(runtime.as_ref(), &auth).await;
    let threads = runtime.thread_store();
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        executor.cancel_task(&auth, &task.id, None),
    )
    .await
    .expect("the cancel is answered");
    assert!(
        matches!(&answer, Err(AgentError::CancelPending { task_id }) if *task_id == task.id),
        "{answer:?}"
    );
    let recorded = runtime
        .memory_service()
        .load_serialized(&auth, &cancel_key(&task.id))
        .await
        .unwrap();
    assert!(recorded.is_some(), "the cancel stays recorded");
    // Once the thread is free, a cancel ends the task.
    threads.release_lease(&auth, &lease).await.unwrap();
    let canceled = executor.cancel_task(&auth, &task.id, None).await.unwrap();
    assert_eq!(canceled.state(), TaskState::Canceled);
}

#[tokio::test]
async fn recovery_logs_each_task_it_resumes_and_how_long_another_holders_lease_may_keep_it() {
    let (recording, runtime) = recorded();
    let auth = runtime.auth_service().auth_context();
    let agent = echo_agent();
    let config = ExecutorConfig {
        holder: "restarted".into(),
        ..ExecutorConfig::default()
    };
    let executor = AgentExecutor::with_config(agent, runtime.clone(), config);
    // A working task whose thread a live process of another name still holds.
    let (task, _lease) = working_task_held_elsewhere(runtime.as_ref(), &auth).await;
    assert_eq!(executor.recover_all().await.unwrap(), 1);
    let resuming = format!(
        "resuming task {} (working) on thread {}",
        task.id, task.thread_id
    );
    let waiting = format!(
        "thread {}: its lease is held under another name than this process's (restarted); \
         its work resumes here when that lease lapses, within 30 s",
        task.thread_id
    );
    keel_runtime::testing::eventually("both lines in the log", || {
        let lines = recording.lines.lock().unwrap().clone();
        let found = |text: &str| {
            lines
                .iter()
                .any(|(level, line)| *level == LogLevel::Info && line.starts_with(text))
        };
        let done = found(&resuming) && found(&waiting);
        async move { done }
    })
    .await;
    assert!(executor.shutdown().await.is_empty());
}

/// The model's answer is logged once, as the step persists it; the final status says that
/// same message (one id) rather than a copy under an id of its own, and the stored task
/// reads the same way back.
#[tokio::test]
async fn the_final_status_carries_the_logged_answer_under_its_own_id() {
    let (_, runtime) = recorded();
    let auth = runtime.auth_service().auth_context();
    let executor = AgentExecutor::new(echo_agent(), runtime.clone());
    let task = executor
        .send_message(&auth, Message::user("hi"), SendOptions::default())
        .await
        .unwrap();
    let stored = executor.get_task(&auth, &task.id, None).await.unwrap();
    for task in [&task, &stored] {
        assert_eq!(task.state(), TaskState::Completed);
        let answers: Vec<&Message> = task
            .history
            .iter()
            .filter(|m| m.role == Role::Agent)
            .collect();
        assert_eq!(answers.len(), 1, "{:?}", task.history);
        let status = task.status().message.as_ref().unwrap();
        assert_eq!(status.message_id, answers[0].message_id);
        assert_eq!(status.text(), "You said: hi");
    }
}

/// A model answering with nothing is one assistant entry in the thread's history: the step
/// wrote it (an empty answer has no part for the task's log), so the run's ending does not
/// write it again.
#[tokio::test]
async fn an_empty_answer_is_written_to_the_history_once() {
    let (_, runtime) = recorded();
    let auth = runtime.auth_service().auth_context();
    let agent = Agent::builder(keel_core::AgentCard::new(
        "quiet",
        "Says nothing",
        "http://x",
    ))
    .llm(keel_llm::MockLlm::scripted(vec![
        keel_llm::MockResponse::Text(String::new()),
    ]))
    .build()
    .unwrap();
    let executor = AgentExecutor::new(agent, runtime.clone());
    let task = executor
        .send_message(&auth, Message::user("hi"), SendOptions::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    let history = runtime
        .thread_store()
        .read_history(&auth, &task.thread_id, 0, usize::MAX)
        .await
        .unwrap();
    let assistant = history
        .iter()
        .filter(|entry| entry.message.role == keel_llm::LlmRole::Assistant)
        .count();
    assert_eq!(assistant, 1, "{history:?}");
}

/// With the default tuning, hundreds of conversations wait on their tools (or models) at
/// once: a running thread holds memory, not a core (decision 276). Under the old default of
/// 48 slots a tenant, only 48 of these would reach the gate and the rest would queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_tuning_runs_hundreds_of_waiting_threads_at_once() {
    const AT_ONCE: usize = 300;
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (all_arrived, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Semaphore::new(0)),
    );
    let gate = {
        let (arrived, all_arrived, release) =
            (arrived.clone(), all_arrived.clone(), release.clone());
        crate::FnTool::new(
            "gate",
            "Wait for the test",
            json!({"type": "object"}),
            move |_, _| {
                let (arrived, all_arrived, release) =
                    (arrived.clone(), all_arrived.clone(), release.clone());
                async move {
                    if arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == AT_ONCE {
                        all_arrived.notify_one();
                    }
                    release
                        .acquire()
                        .await
                        .expect("the gate stays open")
                        .forget();
                    Ok(json!("through"))
                }
            },
        )
    };
    let agent = Agent::builder(keel_core::AgentCard::new("gated", "Waits", "http://x"))
        .tool(gate)
        .build()
        .unwrap();
    let (_, runtime) = recorded();
    let auth = runtime.auth_service().auth_context();
    let executor = Arc::new(AgentExecutor::new(agent, runtime));
    let sends: Vec<_> = (0..AT_ONCE)
        .map(|_| {
            let (executor, auth) = (executor.clone(), auth.clone());
            tokio::spawn(async move {
                executor
                    .send_message(&auth, Message::user("/gate"), SendOptions::default())
                    .await
            })
        })
        .collect();
    // A bound only so that a regression fails instead of hanging; the test goes on as soon as
    // the last thread arrives.
    let waited = tokio::time::timeout(Duration::from_secs(120), all_arrived.notified()).await;
    assert!(
        waited.is_ok(),
        "only {} of {AT_ONCE} threads reached the gate at once",
        arrived.load(std::sync::atomic::Ordering::SeqCst)
    );
    release.add_permits(AT_ONCE);
    for send in sends {
        assert_eq!(send.await.unwrap().unwrap().state(), TaskState::Completed);
    }
}
