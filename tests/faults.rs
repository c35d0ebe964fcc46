//! Fault injection: a process stopped dead at a step boundary, or killed, under concurrent
//! load, on SQLite and Redis; the Redis store killed and the PostgreSQL server restarted
//! under load; a live
//! replica taking over a killed one's threads; a cancel answered while the thread is being
//! taken over; a flood that fills a thread's queue refused with a retry-later. After each fault, no acknowledged task is
//! lost, no model call whose answer was persisted is made again, the non-idempotent tool
//! (appending a journal line) ran once per call, and the thread history and each task's log
//! agree.
//!
//! The fault points and timings are drawn from a seed, printed by each test; set
//! `KEEL_FAULT_SEED` to run one again.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::routing::post;
use axum::{Json, Router};
use keel::agent::{
    AcceptAll, Agent, AgentExecutor, ExecutorConfig, FnTool, SendOptions, StopRules,
};
use keel::core::conversation::LlmMessage;
use keel::core::{
    AgentError, AgentResult, Message, PartContent, Task, TaskEvent, TaskId, TaskState,
};
use keel::llm::Llm;
use keel::services::{
    load_task_with_history, AsyncCallStore, AuthContext, AuthService, Lease, ListTasksFilter,
    LoggingService, MemoryService, Page, RunStore, Runtime, StepStore, TaskManager, TaskWrite,
    ThreadStore, ThreadTimers,
};
use keel::{DefaultRuntime, StoreConfig};
use serde_json::{json, Value};
use support::{redis_url, uuid_like, KeelServer, Rpc};
use tokio::sync::Notify;

/// The seed of this test: `KEEL_FAULT_SEED` when set, else a fresh one; printed either way.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("KEEL_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("{test}: KEEL_FAULT_SEED={seed}");
    seed
}

// ---------------------------------------------------------------------------------------
// The scripted model

/// An OpenAI-compatible model that, for the task whose user message is `job N` (the last
/// user message of the thread), asks for
/// `steps` journal lines (`job N line S`), one per step, and then answers `job N done`. It
/// counts its calls by (job, lines already answered), so that a call made twice shows.
/// While `hold` is set, a call with one line answered (or, when `hold_call` is set, only
/// the call with that number) counts itself in `held` and waits until `hold` is cleared: a
/// run can be caught between two steps.
#[derive(Clone)]
struct ScriptedModel {
    url: String,
    calls: Arc<Mutex<HashMap<(String, usize), usize>>>,
    hold: Arc<tokio::sync::watch::Sender<bool>>,
    held: Arc<AtomicUsize>,
    /// When not 0: the call with this number (counting every call from 1) is held too,
    /// whatever its step.
    hold_call: Arc<AtomicUsize>,
}

impl ScriptedModel {
    async fn start(steps: usize) -> ScriptedModel {
        let calls: Arc<Mutex<HashMap<(String, usize), usize>>> = Arc::default();
        let hold = Arc::new(tokio::sync::watch::Sender::new(false));
        let held = Arc::new(AtomicUsize::new(0));
        let hold_call = Arc::new(AtomicUsize::new(0));
        let made = Arc::new(AtomicUsize::new(0));
        let state = (
            calls.clone(),
            hold.clone(),
            held.clone(),
            hold_call.clone(),
            made,
        );
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| {
                let (calls, hold, held, hold_call, made) = state.clone();
                async move {
                    let messages = body["messages"].as_array().cloned().unwrap_or_default();
                    // The job is the thread's last user message (a thread may hold several).
                    let asked = messages.iter().rposition(|m| m["role"] == "user").unwrap_or(0);
                    let job = messages[asked]["content"].as_str().unwrap_or_default().to_owned();
                    let done = messages[asked..].iter().filter(|m| m["role"] == "tool").count();
                    *calls
                        .lock()
                        .unwrap()
                        .entry((job.clone(), done))
                        .or_default() += 1;
                    let number = made.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut holding = hold.subscribe();
                    let held_here = match hold_call.load(Ordering::SeqCst) {
                        0 => done == 1,
                        chosen => number == chosen,
                    };
                    if held_here && *holding.borrow_and_update() {
                        held.fetch_add(1, Ordering::SeqCst);
                        let _ = holding.wait_for(|hold| !hold).await;
                    }
                    let message = if done < steps {
                        json!({"role": "assistant", "content": null, "tool_calls": [{
                            "id": format!("call-{}-{}", job.replace(' ', "-"), done + 1),
                            "type": "function",
                            "function": {"name": "append_line", "arguments": json!({"line": format!("{job} line {}", done + 1)}).to_string()}
                        }]})
                    } else {
                        json!({"role": "assistant", "content": format!("{job} done")})
                    };
                    support::openai_reply(&body, message)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        ScriptedModel {
            url: format!("http://{address}/v1"),
            calls,
            hold,
            held,
            hold_call,
        }
    }

    /// The `--llm` spec for it.
    fn spec(&self) -> String {
        format!("openai-compatible:{}:scripted", self.url)
    }

    /// How many times the model was asked for `job`'s step after `done` lines.
    fn calls(&self, job: &str, done: usize) -> usize {
        self.calls
            .lock()
            .unwrap()
            .get(&(job.to_owned(), done))
            .copied()
            .unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------------
// A process stopped dead at a write

/// Where the stopped process stops: before its `n`th write (1-based) of a task or a step,
/// or right before a task is first marked finished (its answer persisted, its final status
/// not yet).
#[derive(Debug, Clone, Copy)]
enum StopAt {
    Write(usize),
    FinalStatus,
}

/// Counts the writes of tasks and steps, and stops the process at [`StopAt`]: the thread
/// that runs it parks for good, so nothing in its (single-threaded) runtime runs again (no
/// write, no lease renewal), as if it had been killed there, while the test goes on.
struct Gate {
    at: StopAt,
    writes: AtomicUsize,
    stopped: Arc<Notify>,
    /// Whether the write it stopped before was a model's answer (which is then asked for
    /// again, rightly).
    stopped_before_answer: AtomicBool,
}

impl Gate {
    fn pass(&self, finishing: bool, answer: bool) {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        let stop = match self.at {
            StopAt::Write(at) => n >= at,
            StopAt::FinalStatus => finishing,
        };
        if stop {
            self.stopped_before_answer.store(answer, Ordering::SeqCst);
            self.stopped.notify_one();
            loop {
                std::thread::park();
            }
        }
    }
}

struct GatedTasks {
    inner: Arc<dyn TaskManager>,
    gate: Arc<Gate>,
}

#[async_trait]
impl TaskManager for GatedTasks {
    async fn get_task(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Option<Task>> {
        self.inner.get_task(auth, task_id).await
    }
    async fn list_tasks(
        &self,
        auth: &AuthContext,
        filter: &ListTasksFilter,
    ) -> AgentResult<Page<Task>> {
        self.inner.list_tasks(auth, filter).await
    }
    async fn save_task(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        self.gate.pass(task.state().is_terminal(), false);
        self.inner.save_task(auth, task).await
    }
    async fn add_task_event(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        event: &TaskEvent,
    ) -> AgentResult<()> {
        self.gate.pass(false, false);
        self.inner.add_task_event(auth, task_id, event).await
    }
    async fn save_task_with_events(
        &self,
        auth: &AuthContext,
        task: &Task,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        self.gate.pass(task.state().is_terminal(), false);
        self.inner.save_task_with_events(auth, task, events).await
    }
    async fn get_task_events(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> AgentResult<Vec<TaskEvent>> {
        self.inner.get_task_events(auth, task_id).await
    }
    async fn tenants(&self) -> AgentResult<Vec<AuthContext>> {
        self.inner.tenants().await
    }
}

struct GatedSteps {
    inner: Arc<dyn StepStore>,
    gate: Arc<Gate>,
}

#[async_trait]
impl StepStore for GatedSteps {
    async fn persist_step(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        history: &[LlmMessage],
        task: &Task,
        write: TaskWrite,
        events: &[TaskEvent],
    ) -> AgentResult<()> {
        if write == TaskWrite::SnapshotAndLog {
            // A status goes through the gated task manager instead: the engine falls back to
            // it on `Unsupported`, so the gate sees every snapshot saved.
            return Err(AgentError::Unsupported {
                what: "a step that saves a snapshot, on this gated store".into(),
            });
        }
        let answer = history
            .iter()
            .any(|m| m.role == keel::core::conversation::LlmRole::Assistant);
        self.gate.pass(false, answer);
        self.inner
            .persist_step(auth, lease, history, task, write, events)
            .await
    }
}

/// A real store whose task and step writes go through a [`Gate`].
struct GatedRuntime {
    inner: DefaultRuntime,
    tasks: Arc<dyn TaskManager>,
    steps: Option<Arc<dyn StepStore>>,
}

impl Runtime for GatedRuntime {
    fn auth_service(&self) -> Arc<dyn AuthService> {
        self.inner.auth_service()
    }
    fn task_manager(&self) -> Arc<dyn TaskManager> {
        self.tasks.clone()
    }
    fn memory_service(&self) -> Arc<dyn MemoryService> {
        self.inner.memory_service()
    }
    fn logging_service(&self) -> Arc<dyn LoggingService> {
        self.inner.logging_service()
    }
    fn default_llm(&self) -> Arc<dyn Llm> {
        self.inner.default_llm()
    }
    fn thread_store(&self) -> Arc<dyn ThreadStore> {
        self.inner.thread_store()
    }
    fn run_store(&self) -> Arc<dyn RunStore> {
        self.inner.run_store()
    }
    fn step_store(&self) -> Option<Arc<dyn StepStore>> {
        self.steps.clone()
    }
    fn thread_timers(&self) -> Option<Arc<dyn ThreadTimers>> {
        self.inner.thread_timers()
    }
    fn async_call_store(&self) -> Arc<dyn AsyncCallStore> {
        self.inner.async_call_store()
    }
}

/// The journal tool of `keel serve`'s demo agent (`KEEL_DEMO_JOURNAL`), for an in-process
/// agent: appends a line to `path`; not idempotent.
fn journal_tool(path: PathBuf) -> FnTool {
    FnTool::new(
        "append_line",
        "Append a line to the journal.",
        json!({"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]}),
        move |args, _ctx| {
            let path = path.clone();
            async move {
                use std::io::Write;
                let line = args["line"].as_str().unwrap_or_default().to_owned();
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(AgentError::internal)?;
                // One write of the whole line, so that concurrent appends never interleave.
                file.write_all(format!("{line}\n").as_bytes())
                    .map_err(AgentError::internal)?;
                file.sync_all().map_err(AgentError::internal)?;
                Ok(json!("appended"))
            }
        },
    )
}

/// The demo agent's card with the journal tool, on `journal`.
fn journal_agent(journal: &Path) -> Agent {
    Agent::builder(keel::demo::card())
        .tool(journal_tool(journal.to_owned()))
        // As the served demo agent: no negotiation call, so every model call is a step's.
        .negotiator(AcceptAll)
        .build()
        .unwrap()
}

/// [`journal_agent`] whose run ends once the journal tool answered (its stop tool).
fn stop_tool_agent(journal: &Path) -> Agent {
    let rules = StopRules {
        stop_tool: Some("append_line".into()),
        ..StopRules::default()
    };
    Agent::builder(keel::demo::card())
        .tool(journal_tool(journal.to_owned()))
        .negotiator(AcceptAll)
        .stop_rules(rules)
        .build()
        .unwrap()
}

/// What a stopped process was sent: the tasks it acknowledged, by job.
type Acknowledged = Arc<Mutex<Vec<(String, TaskId)>>>;

/// Start a process (its own thread and single-threaded runtime) running `agent` (made for
/// the journal) on `store`, send it `jobs` (each a task on its own thread,
/// all at once), and stop it dead at `at`. Returns once it stopped, or finished every job
/// first; answers the acknowledged tasks and whether it stopped before persisting a model's
/// answer.
async fn run_until_stopped(
    store: StoreConfig,
    model: &ScriptedModel,
    journal: &Path,
    jobs: &[String],
    agent: fn(&Path) -> Agent,
    at: StopAt,
) -> (Vec<(String, TaskId)>, bool) {
    let gate = Arc::new(Gate {
        at,
        writes: AtomicUsize::new(0),
        stopped: Arc::new(Notify::new()),
        stopped_before_answer: AtomicBool::new(false),
    });
    let finished = Arc::new(Notify::new());
    let acknowledged: Acknowledged = Arc::default();
    let (spec, journal, jobs) = (model.spec(), journal.to_owned(), jobs.to_vec());
    let (victim_gate, victim_finished, victim_acknowledged) =
        (gate.clone(), finished.clone(), acknowledged.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let llm = keel::llm::llm_from_spec(&spec).unwrap();
            let inner = DefaultRuntime::builder()
                .llm_shared(llm)
                .store(store)
                .build()
                .await
                .unwrap();
            let runtime = GatedRuntime {
                tasks: Arc::new(GatedTasks {
                    inner: inner.task_manager(),
                    gate: victim_gate.clone(),
                }),
                steps: inner.step_store().map(|steps| {
                    Arc::new(GatedSteps {
                        inner: steps,
                        gate: victim_gate.clone(),
                    }) as Arc<dyn StepStore>
                }),
                inner,
            };
            let agent = agent(&journal);
            let config = ExecutorConfig {
                lease_ttl: Duration::from_secs(1),
                ..ExecutorConfig::default()
            };
            let executor = AgentExecutor::with_config(agent, Arc::new(runtime), config);
            let auth = executor.runtime().auth_service().auth_context();
            let sends = jobs.iter().map(|job| {
                let (executor, auth, acknowledged) =
                    (&executor, &auth, victim_acknowledged.clone());
                async move {
                    let options = SendOptions {
                        return_immediately: true,
                        ..SendOptions::default()
                    };
                    let task = executor
                        .send_message(auth, Message::user(job.as_str()), options)
                        .await
                        .unwrap();
                    acknowledged.lock().unwrap().push((job.clone(), task.id));
                }
            });
            futures::future::join_all(sends).await;
            let ids: Vec<TaskId> = victim_acknowledged
                .lock()
                .unwrap()
                .iter()
                .map(|(_, id)| id.clone())
                .collect();
            for id in ids {
                support::wait_until(
                    "the unstopped process to finish its jobs",
                    Duration::from_secs(60),
                    || executor.get_task(&auth, &id, None),
                    |task| task.as_ref().is_ok_and(|t| t.state().is_terminal()),
                )
                .await
                .unwrap();
            }
            victim_finished.notify_one();
            std::future::pending::<()>().await;
        });
    });
    tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            () = gate.stopped.notified() => {}
            () = finished.notified() => {}
        }
    })
    .await
    .expect("the process neither stopped nor finished");
    let acknowledged = acknowledged.lock().unwrap().clone();
    (
        acknowledged,
        gate.stopped_before_answer.load(Ordering::SeqCst),
    )
}

// ---------------------------------------------------------------------------------------
// Checks

/// Check one finished job: completed with its answer, each journal line once, each model
/// step asked for once (twice at most for a step whose answer was not yet persisted), and
/// the thread history and the task's log agree call by call.
async fn check_job(
    runtime: &DefaultRuntime,
    model: &ScriptedModel,
    journal: &str,
    steps: usize,
    job: &str,
    task_id: &TaskId,
) -> usize {
    let auth = runtime.auth_service().auth_context();
    let task = load_task_with_history(runtime.task_manager().as_ref(), &auth, task_id, None)
        .await
        .unwrap()
        .expect("an acknowledged task is never lost");
    assert_eq!(task.state(), TaskState::Completed, "{job}: {task:?}");
    let answer = task.status().message.as_ref().map(Message::text);
    assert_eq!(answer.as_deref(), Some(format!("{job} done").as_str()));
    check_journal(&task, journal, steps, job);
    // The task's log: every call with its output, once each.
    let mut calls: HashMap<String, (usize, usize)> = HashMap::new();
    for part in task.history.iter().flat_map(|m| &m.parts) {
        match &part.content {
            PartContent::ToolCall { call_id, .. } => {
                calls.entry(call_id.clone()).or_default().0 += 1
            }
            PartContent::ToolOutput { call_id, .. } => {
                calls.entry(call_id.clone()).or_default().1 += 1
            }
            _ => {}
        }
    }
    assert_eq!(calls.len(), steps, "{job}: {:?}", task.history);
    assert!(
        calls.values().all(|&counts| counts == (1, 1)),
        "{job}: each call and its output once in the task's log: {calls:?}"
    );
    // The thread history: one model answer per step, each call answered once.
    let history = runtime
        .thread_store()
        .read_history(&auth, &task.thread_id, 0, usize::MAX)
        .await
        .unwrap();
    let assistant = history
        .iter()
        .filter(|e| e.message.role == keel::core::conversation::LlmRole::Assistant)
        .count();
    assert_eq!(
        assistant,
        steps + 1,
        "{job}: one persisted model answer per step: {history:#?}"
    );
    let mut results: HashMap<&str, usize> = HashMap::new();
    for entry in &history {
        if let Some(id) = &entry.message.tool_call_id {
            *results.entry(id.as_str()).or_default() += 1;
        }
    }
    assert!(
        calls.keys().all(|id| results.get(id.as_str()) == Some(&1)),
        "{job}: each call answered once in the thread history: {results:?}"
    );
    // Model calls: each step once, but for a step whose answer was lost with the process.
    let mut repeated = 0;
    for done in 0..=steps {
        let calls = model.calls(job, done);
        assert!(
            (1..=2).contains(&calls),
            "{job}: step after {done} lines asked {calls} times"
        );
        repeated += calls - 1;
    }
    repeated
}

/// The journal tool is not idempotent: each of `job`'s lines is in the journal once, but for
/// a call the stop may have cut off before it ran, which the resumed run answers as
/// interrupted instead of running again (then the line is there at most once).
fn check_journal(task: &Task, journal: &str, steps: usize, job: &str) {
    for line in 1..=steps {
        let wanted = format!("{job} line {line}");
        let call = format!("call-{}-{line}", job.replace(' ', "-"));
        let interrupted = task.history.iter().flat_map(|m| &m.parts).any(|p| {
            matches!(&p.content, PartContent::ToolOutput { call_id, output, is_error: true, .. }
                if *call_id == call && output.as_str().is_some_and(|o| o.contains("its result was never saved")))
        });
        let times = journal.lines().filter(|l| *l == wanted).count();
        if interrupted {
            assert!(times <= 1, "`{wanted}` at most once:\n{journal}");
        } else {
            assert_eq!(
                times, 1,
                "`{wanted}` must be in the journal once:\n{journal}"
            );
        }
    }
}

/// A store shared by the stopped process, `keel serve` and the test's checks.
struct Store {
    config: StoreConfig,
    /// `--store` (and `--redis-prefix`) for `keel serve`.
    args: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Store {
    fn sqlite(dir: &Path) -> Store {
        let path = dir.join("keel.db");
        Store {
            args: vec!["--store".into(), format!("sqlite:{}", path.display())],
            config: StoreConfig::Sqlite(path),
            _dir: None,
        }
    }

    fn redis() -> Store {
        let url = redis_url();
        let prefix = format!("keel-faults-{}:", uuid_like());
        Store {
            args: vec![
                "--store".into(),
                url.clone(),
                "--redis-prefix".into(),
                prefix.clone(),
            ],
            config: StoreConfig::Redis { url, prefix },
            _dir: None,
        }
    }

    /// A fresh schema of the PostgreSQL at `KEEL_POSTGRES_URL` (left behind at the end, in
    /// the throwaway test database).
    async fn postgres() -> Store {
        let (schema, args) = support::postgres_store().await;
        Store {
            args,
            config: StoreConfig::Postgres { url: schema.url },
            _dir: None,
        }
    }

    async fn open(&self) -> DefaultRuntime {
        DefaultRuntime::builder()
            .store(self.config.clone())
            .build()
            .await
            .unwrap()
    }

    /// The store with `model` as its model, for an executor of the test's own.
    async fn open_for(&self, model: &ScriptedModel) -> DefaultRuntime {
        DefaultRuntime::builder()
            .llm_shared(keel::llm::llm_from_spec(&model.spec()).unwrap())
            .store(self.config.clone())
            .build()
            .await
            .unwrap()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let StoreConfig::Redis { url, prefix } = &self.config {
            delete_prefix(url, prefix);
        }
    }
}

/// Delete a test's Redis keys.
fn delete_prefix(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut con) = client.get_connection() else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut con)
        .unwrap_or_default();
    for chunk in keys.chunks(500) {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(chunk).query(&mut con);
    }
}

/// `keel serve` on `store` with the scripted model and the journal, and a 1 s lease TTL
/// unless `extra` names one.
fn serve(store: &Store, model: &ScriptedModel, journal: &Path, extra: &[&str]) -> KeelServer {
    let llm = model.spec();
    let mut args: Vec<&str> = store.args.iter().map(String::as_str).collect();
    args.extend(["--llm", llm.as_str()]);
    if !extra.contains(&"--lease-ttl") {
        args.extend(["--lease-ttl", "1"]);
    }
    args.extend_from_slice(extra);
    KeelServer::start_with_env(&args, &[("KEEL_DEMO_JOURNAL", journal.to_str().unwrap())])
}

async fn wait_done(rpc: &Rpc, task_id: &TaskId) {
    rpc.wait_for(task_id.as_str(), Duration::from_secs(30), |s| {
        matches!(
            s,
            "TASK_STATE_COMPLETED" | "TASK_STATE_FAILED" | "TASK_STATE_CANCELED"
        )
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Point 1: a persisted answer is not asked for again

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_answer_was_persisted_before_a_crash_finishes_without_a_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let store = Store::sqlite(dir.path());
    let model = ScriptedModel::start(1).await;
    let job = "job 1".to_owned();
    let (acknowledged, _) = run_until_stopped(
        store.config.clone(),
        &model,
        &journal,
        std::slice::from_ref(&job),
        journal_agent,
        StopAt::FinalStatus,
    )
    .await;
    assert_eq!(model.calls(&job, 1), 1, "the answer was asked for once");
    let server = serve(&store, &model, &journal, &[]);
    let task_id = &acknowledged[0].1;
    wait_done(&Rpc::new(&server), task_id).await;
    let runtime = store.open().await;
    let journal = std::fs::read_to_string(&journal).unwrap();
    let repeated = check_job(&runtime, &model, &journal, 1, &job, task_id).await;
    assert_eq!(repeated, 0, "no model call was made again");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_run_stopped_after_its_stop_tool_answered_ends_from_it_with_its_log_whole() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let store = Store::sqlite(dir.path());
    let model = ScriptedModel::start(1).await;
    let job = "job 1".to_owned();
    // Writes: the task, its working status, the model's call, the tool's result; the
    // process stops before the fifth, the run's answer from the stop tool.
    let (acknowledged, _) = run_until_stopped(
        store.config.clone(),
        &model,
        &journal,
        std::slice::from_ref(&job),
        stop_tool_agent,
        StopAt::Write(5),
    )
    .await;
    let task_id = &acknowledged[0].1;
    let runtime = store.open().await;
    let executor = AgentExecutor::with_config(
        stop_tool_agent(&journal),
        Arc::new(store.open_for(&model).await),
        ExecutorConfig {
            lease_ttl: Duration::from_secs(1),
            ..ExecutorConfig::default()
        },
    );
    executor.recover_all().await.unwrap();
    let auth = runtime.auth_service().auth_context();
    let task = support::wait_until(
        "the resumed run to end",
        Duration::from_secs(30),
        || executor.get_task(&auth, task_id, None),
        |task| task.as_ref().is_ok_and(|t| t.state().is_terminal()),
    )
    .await
    .unwrap();
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    assert_eq!(
        model.calls(&job, 1),
        0,
        "the stop tool ended the run: the model is not asked again"
    );
    // The answer is in the thread history and the task's log once each.
    let answers = task
        .history
        .iter()
        .filter(|m| m.role == keel::core::Role::Agent && m.text() == "appended")
        .count();
    let history = runtime
        .thread_store()
        .read_history(&auth, &task.thread_id, 0, usize::MAX)
        .await
        .unwrap();
    let in_history = history
        .iter()
        .filter(|e| {
            e.message.role == keel::core::conversation::LlmRole::Assistant
                && e.message.tool_calls.is_empty()
        })
        .count();
    assert_eq!((answers, in_history), (1, 1), "{:#?}", task.history);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_queued_into_a_running_task_shows_its_call_with_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let store = Store::sqlite(dir.path());
    let model = ScriptedModel::start(STEPS).await;
    model.hold.send_replace(true);
    let executor = AgentExecutor::new(
        journal_agent(&journal),
        Arc::new(store.open_for(&model).await),
    );
    let auth = executor.runtime().auth_service().auth_context();
    let options = SendOptions {
        return_immediately: true,
        ..SendOptions::default()
    };
    let task = executor
        .send_message(&auth, Message::user("job 1"), options)
        .await
        .unwrap();
    support::wait_until(
        "the run to reach its second step",
        Duration::from_secs(30),
        || async { model.held.load(Ordering::SeqCst) },
        |held| *held == 1,
    )
    .await;
    executor
        .thread(&auth, task.thread_id.clone())
        .queue_tool("append_line", json!({"line": "queued"}))
        .await
        .unwrap();
    model.hold.send_replace(false);
    let task = support::wait_until(
        "the run to end",
        Duration::from_secs(30),
        || executor.get_task(&auth, &task.id, None),
        |task| task.as_ref().is_ok_and(|t| t.state().is_terminal()),
    )
    .await
    .unwrap();
    assert_eq!(task.state(), TaskState::Completed, "{task:?}");
    let mut calls: HashMap<String, (usize, usize)> = HashMap::new();
    for part in task.history.iter().flat_map(|m| &m.parts) {
        match &part.content {
            PartContent::ToolCall { call_id, .. } => {
                calls.entry(call_id.clone()).or_default().0 += 1
            }
            PartContent::ToolOutput { call_id, .. } => {
                calls.entry(call_id.clone()).or_default().1 += 1
            }
            _ => {}
        }
    }
    assert_eq!(calls.len(), STEPS + 1, "{calls:?}");
    assert!(calls.values().all(|&c| c == (1, 1)), "{calls:?}");
}

// ---------------------------------------------------------------------------------------
// Points 1 and 4: stops at step boundaries under load

/// Jobs, lines per job.
const JOBS: usize = 4;
const STEPS: usize = 2;
/// The writes of one job: its task, its working status, a model answer and a tool result
/// per line, the final answer, the final status.
const WRITES_PER_JOB: usize = 2 + 2 * STEPS + 2;

async fn stop_at_a_boundary_and_recover(store: Store, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let model = ScriptedModel::start(STEPS).await;
    let run = uuid_like();
    let jobs: Vec<String> = (1..=JOBS).map(|i| format!("job {i} of {run}")).collect();
    let at = StopAt::Write(rng.usize(1..=JOBS * WRITES_PER_JOB));
    println!("stopping the process before write {at:?}");
    let (acknowledged, before_answer) = run_until_stopped(
        store.config.clone(),
        &model,
        &journal,
        &jobs,
        journal_agent,
        at,
    )
    .await;
    let server = serve(&store, &model, &journal, &[]);
    let rpc = Rpc::new(&server);
    for (_, task_id) in &acknowledged {
        wait_done(&rpc, task_id).await;
    }
    let runtime = store.open().await;
    let text = std::fs::read_to_string(&journal).unwrap_or_default();
    let mut repeated = 0;
    for (job, task_id) in &acknowledged {
        repeated += check_job(&runtime, &model, &text, STEPS, job, task_id).await;
    }
    // Only answers lost with the process are asked for again: the one it stopped before
    // persisting, and those still in flight when it stopped (one per other job at most).
    let in_flight = JOBS - 1 + usize::from(before_answer);
    assert!(
        repeated <= in_flight,
        "{repeated} model calls made again, at most {in_flight} could have been lost"
    );
    drop(server);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn stops_at_step_boundaries_under_load_on_sqlite_lose_and_repeat_nothing() {
    let seed = seed("sqlite step boundaries");
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::sqlite(dir.path());
    store._dir = Some(dir);
    stop_at_a_boundary_and_recover(store, seed).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn stops_at_step_boundaries_under_load_on_redis_lose_and_repeat_nothing() {
    let seed = seed("redis step boundaries");
    stop_at_a_boundary_and_recover(Store::redis(), seed).await;
}

/// `keel serve` killed (SIGKILL) while its model calls are in flight, under load; a new
/// process on the same store finishes every acknowledged task.
async fn kill_under_load_and_recover(store: Store, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let model = ScriptedModel::start(STEPS).await;
    // Calls made before the kill: each job makes STEPS + 1 when nothing fails.
    let call = rng.usize(1..=JOBS * (STEPS + 1));
    println!("killing the process at model call {call}");
    model.hold_call.store(call, Ordering::SeqCst);
    model.hold.send_replace(true);
    let run = uuid_like();
    let server = serve(&store, &model, &journal, &[]);
    let rpc = Rpc::new(&server);
    let mut sent = Vec::new();
    for i in 1..=JOBS {
        let job = format!("job {i} of {run}");
        let task = rpc.send(&job, None, true).await;
        sent.push((job, TaskId::from(task["id"].as_str().unwrap())));
    }
    support::wait_until(
        "the chosen model call",
        Duration::from_secs(30),
        || async { model.held.load(Ordering::SeqCst) },
        |held| *held >= 1,
    )
    .await;
    server.kill_hard();
    model.hold_call.store(0, Ordering::SeqCst);
    model.hold.send_replace(false);
    let server = serve(&store, &model, &journal, &[]);
    let rpc = Rpc::new(&server);
    for (_, task_id) in &sent {
        wait_done(&rpc, task_id).await;
    }
    let runtime = store.open().await;
    let text = std::fs::read_to_string(&journal).unwrap_or_default();
    let mut repeated = 0;
    for (job, task_id) in &sent {
        repeated += check_job(&runtime, &model, &text, STEPS, job, task_id).await;
    }
    assert!(
        repeated <= JOBS,
        "{repeated} model calls made again, at most one per job could have been in flight"
    );
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn kills_under_load_on_sqlite_lose_and_repeat_nothing() {
    let seed = seed("sqlite kill under load");
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::sqlite(dir.path());
    store._dir = Some(dir);
    kill_under_load_and_recover(store, seed).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn kills_under_load_on_redis_lose_and_repeat_nothing() {
    let seed = seed("redis kill under load");
    kill_under_load_and_recover(Store::redis(), seed).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn kills_under_load_on_postgres_lose_and_repeat_nothing() {
    let seed = seed("postgres kill under load");
    kill_under_load_and_recover(Store::postgres().await, seed).await;
}

// ---------------------------------------------------------------------------------------
// The store restarted under load

/// A `redis-server` of the test's own, on a free port, keeping an append-only file fsynced
/// at every write in a temp dir: what it acknowledged survives a kill. Killed when dropped.
struct PrivateRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    async fn start() -> PrivateRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let mut redis = PrivateRedis {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        redis.spawn().await;
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Start the server (again, on the same port and file) and wait until it answers PING,
    /// its append-only file loaded.
    async fn spawn(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is on PATH");
        self.child = Some(child);
        let url = self.url();
        support::wait_until(
            "the private redis-server to answer PING",
            Duration::from_secs(20),
            || {
                let url = url.clone();
                async move {
                    redis::Client::open(url.as_str())
                        .and_then(|client| client.get_connection())
                        .and_then(|mut con| redis::cmd("PING").query::<String>(&mut con))
                        .is_ok()
                }
            },
            |answered| *answered,
        )
        .await;
    }

    /// SIGKILL: no shutdown save, only what the append-only file holds survives.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `keel serve` on a private Redis, under load; the Redis is killed and restarted there (see
/// [`restart_under_load`]).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_restart_under_load_loses_no_acknowledged_task_and_runs_no_tool_twice() {
    let seed = seed("redis restart under load");
    let mut redis = PrivateRedis::start().await;
    let store = Store {
        args: vec!["--store".into(), redis.url()],
        config: StoreConfig::Redis {
            url: redis.url(),
            prefix: "keel:".into(),
        },
        _dir: None,
    };
    restart_under_load(&store, seed, async || {
        redis.kill();
        redis.spawn().await;
    })
    .await;
}

/// `keel serve` on a private PostgreSQL (never the one other tests share), under load; the
/// database restarts there with a fast shutdown, dropping every connection of the pool and
/// the change listener (see [`restart_under_load`]).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_restart_under_load_loses_no_acknowledged_task_and_runs_no_tool_twice() {
    let seed = seed("postgres restart under load");
    let Some(postgres) = keel_store_postgres::testing::PrivateServer::start() else {
        panic!("no PostgreSQL is installed (/usr/lib/postgresql/*/bin) to start a private one");
    };
    let store = Store {
        args: vec!["--store".into(), postgres.url()],
        config: StoreConfig::Postgres {
            url: postgres.url(),
        },
        _dir: None,
    };
    restart_under_load(&store, seed, async || {
        tokio::task::block_in_place(|| postgres.restart());
    })
    .await;
}

/// `keel serve` on `store`, under load (jobs on their own threads, one model call chosen by
/// the seed held); `restart` restarts the store there, then the held call goes on. Every
/// acknowledged task is still there and completes (runs the outage cut off resume from their
/// last persisted step instead of failing), and the journal tool ran at most once per call
/// (exactly once for each call with a saved result).
async fn restart_under_load(store: &Store, seed: u64, restart: impl AsyncFnOnce()) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let model = ScriptedModel::start(STEPS).await;
    let call = rng.usize(1..=JOBS * (STEPS + 1));
    println!("restarting the store at model call {call}");
    model.hold_call.store(call, Ordering::SeqCst);
    model.hold.send_replace(true);
    let server = serve(store, &model, &journal, &[]);
    let rpc = Rpc::new(&server);
    let run = uuid_like();
    let mut sent = Vec::new();
    for i in 1..=JOBS {
        let job = format!("job {i} of {run}");
        let task = rpc.send(&job, None, true).await;
        sent.push((job, TaskId::from(task["id"].as_str().unwrap())));
    }
    support::wait_until(
        "the chosen model call",
        Duration::from_secs(30),
        || async { model.held.load(Ordering::SeqCst) },
        |held| *held >= 1,
    )
    .await;
    restart().await;
    model.hold_call.store(0, Ordering::SeqCst);
    model.hold.send_replace(false);
    for (_, task_id) in &sent {
        wait_done(&rpc, task_id).await;
    }
    let runtime = store.open().await;
    let auth = runtime.auth_service().auth_context();
    let text = std::fs::read_to_string(&journal).unwrap_or_default();
    for (job, task_id) in &sent {
        let task = load_task_with_history(runtime.task_manager().as_ref(), &auth, task_id, None)
            .await
            .unwrap()
            .expect("an acknowledged task is never lost");
        // A run the outage interrupted is not the task's failure: it resumes once the
        // store answers.
        assert_eq!(task.state(), TaskState::Completed, "{job}: {task:?}");
        for line in 1..=STEPS {
            let wanted = format!("{job} line {line}");
            let times = text.lines().filter(|l| *l == wanted).count();
            assert!(times <= 1, "`{wanted}` ran {times} times:\n{text}");
        }
        check_journal(&task, &text, STEPS, job);
    }
    drop(server);
}

// ---------------------------------------------------------------------------------------
// Point 2: a live replica takes over

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_live_replica_takes_over_a_killed_replicas_running_and_queued_tasks() {
    a_live_replica_takes_over(Store::redis()).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_a_live_replica_takes_over_a_killed_replicas_running_and_queued_tasks() {
    a_live_replica_takes_over(Store::postgres().await).await;
}

/// Two replicas on `store`; the one that accepted every task is killed mid-run and the other
/// finishes each task with each tool call run once.
#[cfg(unix)]
async fn a_live_replica_takes_over(store: Store) {
    let seed = seed("replica takeover");
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let model = ScriptedModel::start(STEPS).await;
    model.hold.send_replace(true);
    let a = serve(&store, &model, &journal, &[]);
    let b = serve(&store, &model, &journal, &[]);
    let (rpc_a, rpc_b) = (Rpc::new(&a), Rpc::new(&b));
    let run = uuid_like();
    // Threads, each with a running task (held between its steps) and a queued one behind
    // it, all accepted by A.
    let threads = rng.usize(2..=3);
    let mut sent = Vec::new();
    for t in 0..threads {
        let thread = format!("thread-{t}-{run}");
        for turn in 0..2 {
            let job = format!("job {t}.{turn} of {run}");
            let task = rpc_a.send(&job, Some(&thread), true).await;
            sent.push((job, TaskId::from(task["id"].as_str().unwrap())));
        }
    }
    support::wait_until(
        "A's runs to reach their second step",
        Duration::from_secs(30),
        || async { model.held.load(Ordering::SeqCst) },
        |held| *held == threads,
    )
    .await;
    a.kill_hard();
    model.hold.send_replace(false);
    // B was never told about these threads: it must find them once A's leases lapse.
    for (_, task_id) in &sent {
        wait_done(&rpc_b, task_id).await;
    }
    let runtime = store.open().await;
    let text = std::fs::read_to_string(&journal).unwrap_or_default();
    for (job, task_id) in &sent {
        check_job_on_shared_thread(&runtime, &text, job, task_id).await;
    }
}

/// [`check_job`] for a task that shares its thread with another: completed with its
/// answer, each journal line once, its calls and outputs paired in its log.
async fn check_job_on_shared_thread(
    runtime: &DefaultRuntime,
    journal: &str,
    job: &str,
    task_id: &TaskId,
) {
    let auth = runtime.auth_service().auth_context();
    let task = load_task_with_history(runtime.task_manager().as_ref(), &auth, task_id, None)
        .await
        .unwrap()
        .expect("an acknowledged task is never lost");
    assert_eq!(task.state(), TaskState::Completed, "{job}: {task:?}");
    check_journal(&task, journal, STEPS, job);
    let mut calls: HashMap<String, (usize, usize)> = HashMap::new();
    for part in task.history.iter().flat_map(|m| &m.parts) {
        match &part.content {
            PartContent::ToolCall { call_id, .. } => {
                calls.entry(call_id.clone()).or_default().0 += 1
            }
            PartContent::ToolOutput { call_id, .. } => {
                calls.entry(call_id.clone()).or_default().1 += 1
            }
            _ => {}
        }
    }
    assert!(
        calls.len() == STEPS && calls.values().all(|&c| c == (1, 1)),
        "{job}: {calls:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Point 3: a cancel during a takeover is answered

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_sent_to_the_live_replica_right_after_the_other_died_is_answered() {
    let store = Store::redis();
    let mut args: Vec<&str> = store.args.iter().map(String::as_str).collect();
    args.extend(["--lease-ttl", "1"]);
    let (a, b) = (KeelServer::start_with(&args), KeelServer::start_with(&args));
    let (rpc_a, rpc_b) = (Rpc::new(&a), Rpc::new(&b));
    let task = rpc_a.send(r#"/sleep {"seconds": 300}"#, None, true).await;
    let id = task["id"].as_str().unwrap().to_owned();
    rpc_b
        .wait_for(&id, Duration::from_secs(20), |s| s == "TASK_STATE_WORKING")
        .await;
    a.kill_hard();
    // A's lease on the thread is still live for up to a TTL: the cancel must take it once
    // it lapses (or see B's takeover end the task), not wait for the task forever.
    let canceled = tokio::time::timeout(
        Duration::from_secs(30),
        rpc_b.call(
            "CancelTask",
            json!({"id": id, "metadata": {"reason": "A died"}}),
        ),
    )
    .await
    .expect("CancelTask was answered");
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    let task = rpc_b.get(&id).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_CANCELED", "{task}");
    // Canceled once: nothing runs it again.
    let again = rpc_b.call("CancelTask", json!({"id": id})).await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
}

// ---------------------------------------------------------------------------------------
// Point 8: a restart under the same instance id does not wait for its own leases

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_under_the_same_instance_id_resumes_its_threads_without_waiting_for_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.txt");
    let store = Store::sqlite(dir.path());
    let model = ScriptedModel::start(STEPS).await;
    model.hold.send_replace(true);
    // A lease far longer than this test may take: only a reclaimed lease lets it pass.
    let args = ["--lease-ttl", "3600", "--instance-id", "faults-replica-1"];
    let server = serve(&store, &model, &journal, &args);
    let job = "job 1".to_owned();
    let task = Rpc::new(&server).send(&job, None, true).await;
    let task_id = TaskId::from(task["id"].as_str().unwrap());
    support::wait_until(
        "the run to reach its second step",
        Duration::from_secs(30),
        || async { model.held.load(Ordering::SeqCst) },
        |held| *held == 1,
    )
    .await;
    server.kill_hard();
    model.hold.send_replace(false);
    let server = serve(&store, &model, &journal, &args);
    wait_done(&Rpc::new(&server), &task_id).await;
    let runtime = store.open().await;
    let text = std::fs::read_to_string(&journal).unwrap();
    check_job(&runtime, &model, &text, STEPS, &job, &task_id).await;
}

// ---------------------------------------------------------------------------------------
// A flood is refused, not queued without end

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn keel_serve_refuses_a_new_task_on_a_full_thread_queue_with_retry_later() {
    let server = KeelServer::start(&["--max-queued-per-thread", "1"]);
    let rpc = Rpc::new(&server);
    let thread = format!("flood-{}", uuid_like());
    // A long task runs (its queue item stays until it ends) and one more waits behind it.
    for text in [r#"/sleep {"seconds": 300}"#, "hello"] {
        let task = rpc.send(text, Some(&thread), true).await;
        assert!(task["id"].is_string(), "{task}");
    }
    let message = json!({
        "messageId": uuid_like(), "role": "ROLE_USER", "contextId": thread,
        "parts": [{"text": "one too many"}]
    });
    let refused = rpc
        .call(
            "SendMessage",
            json!({"message": message, "configuration": {"returnImmediately": true}}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32051, "{refused}");
    assert_eq!(
        refused["error"]["data"][0]["metadata"]["max"], "1",
        "{refused}"
    );
    // Another thread is not held back by this one's queue.
    let other = rpc.send("hello", None, false).await;
    assert_eq!(other["status"]["state"], "TASK_STATE_COMPLETED", "{other}");
}
