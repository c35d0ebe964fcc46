// The read-and-watch API (`keel_agent::reads`): pages and their tokens, filters, tenant
// isolation with the exact not-found kinds, and watches that replay the durable log and then
// follow it live, with no gap and no duplicate, on the executor that runs the task and on a
// replica that shares only the store.

use std::sync::Arc;

use keel_agent::reads::{Reads, TaskChange, TaskQuery, ThreadPosition};
use keel_agent::{Agent, AgentExecutor};
use keel_core::{AgentCard, AgentError, Message, TaskEvent, TaskId, TaskState, ThreadId};
use keel_llm::MockLlm;
use keel_policy::{CapabilityPolicy, CapabilityRule};
use keel_runtime::{AuthContext, Runtime, TaskOrder};
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use super::fixture::{backend, call_then_answer, object_tool, send_in, start};

fn agent(name: &str) -> Agent {
    Agent::builder(AgentCard::new(name, "reads tests", "http://127.0.0.1:0"))
        .build()
        .unwrap()
}

/// An executor of agent `name` on a fresh store of this backend.
fn executor(name: &str) -> (AgentExecutor, AuthContext, Arc<dyn Runtime>) {
    let (runtime, auth) = backend();
    (AgentExecutor::new(agent(name), runtime.clone()), auth, runtime)
}

fn other_tenant() -> AuthContext {
    AuthContext::new("reads-other-app", "reads-other-user")
}

/// Every item of every page of `query`, following the tokens.
async fn all_pages(reads: &Reads, auth: &AuthContext, mut query: TaskQuery) -> Vec<Vec<TaskId>> {
    let mut pages = Vec::new();
    loop {
        let page = reads.tasks(auth, &query).await.unwrap();
        pages.push(page.items.iter().map(|t| t.id.clone()).collect());
        match page.next_page_token {
            Some(token) => query.page_token = Some(token),
            None => return pages,
        }
    }
}

#[tokio::test]
async fn task_pages_follow_their_tokens_and_filter_by_thread_state_and_agent() {
    let (exec, auth, runtime) = executor("alpha");
    let (a, b) = (ThreadId::from("reads-a"), ThreadId::from("reads-b"));
    let mut created = Vec::new();
    for (text, thread) in [("1", &a), ("2", &b), ("3", &a), ("4", &a), ("5", &b)] {
        created.push(send_in(&exec, &auth, thread, text).await.id);
    }
    // A second agent on the same store.
    let beta = AgentExecutor::new(agent("beta"), runtime);
    let betas = send_in(&beta, &auth, &a, "6").await.id;
    let reads = exec.reads();

    let by_two = TaskQuery {
        page_size: Some(2),
        ..TaskQuery::default()
    };
    let pages = all_pages(&reads, &auth, by_two.clone()).await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 2]);
    let mut expected = created.clone();
    expected.push(betas.clone());
    assert_eq!(pages.concat(), expected, "oldest first, each task once");

    let in_a = all_pages(
        &reads,
        &auth,
        TaskQuery {
            thread_id: Some(a.clone()),
            ..by_two.clone()
        },
    )
    .await
    .concat();
    assert_eq!(
        in_a,
        [
            created[0].clone(),
            created[2].clone(),
            created[3].clone(),
            betas.clone()
        ]
    );

    let alphas = all_pages(
        &reads,
        &auth,
        TaskQuery {
            agent: Some("alpha".into()),
            ..by_two.clone()
        },
    )
    .await;
    assert_eq!(alphas.concat(), created, "the agent filter pages without a gap");
    assert!(alphas.iter().all(|page| page.len() <= 2));
    let only_beta = reads
        .tasks(
            &auth,
            &TaskQuery {
                agent: Some("beta".into()),
                ..TaskQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        only_beta.items.iter().map(|t| &t.id).collect::<Vec<_>>(),
        [&betas]
    );

    let waiting = reads
        .tasks(
            &auth,
            &TaskQuery {
                state: Some(TaskState::InputRequired),
                ..TaskQuery::default()
            },
        )
        .await
        .unwrap();
    assert!(waiting.items.is_empty() && waiting.next_page_token.is_none());
    let completed = reads
        .tasks(
            &auth,
            &TaskQuery {
                state: Some(TaskState::Completed),
                order: TaskOrder::RecentlyUpdated { since: None },
                ..TaskQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(completed.items.len(), 6);
    assert_eq!(completed.items[0].id, betas, "most recently updated first");

    for (query, field) in [
        (
            TaskQuery {
                page_token: Some("not a token".into()),
                order: TaskOrder::RecentlyUpdated { since: None },
                ..TaskQuery::default()
            },
            "page_token",
        ),
        (
            TaskQuery {
                page_size: Some(0),
                ..TaskQuery::default()
            },
            "page_size",
        ),
        (
            TaskQuery {
                page_size: Some(0),
                agent: Some("alpha".into()),
                ..TaskQuery::default()
            },
            "page_size",
        ),
    ] {
        match reads.tasks(&auth, &query).await {
            Err(AgentError::InvalidInput { field: named, .. }) => assert_eq!(named, field),
            other => panic!("{query:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn another_tenants_ids_answer_the_exact_not_found_kinds() {
    let (exec, auth, _) = executor("alpha");
    let thread = ThreadId::from("reads-private");
    let task = send_in(&exec, &auth, &thread, "mine").await;
    let reads = exec.reads();
    let other = other_tenant();

    // The owner reads them all.
    assert_eq!(reads.task(&auth, &task.id).await.unwrap().id, task.id);
    assert!(!reads.task_events(&auth, &task.id).await.unwrap().is_empty());
    assert_eq!(reads.thread(&auth, &thread).await.unwrap().thread_id, thread);
    assert!(!reads
        .thread_messages(&auth, &thread, 0, 10)
        .await
        .unwrap()
        .is_empty());
    let run = reads.latest_run(&auth, &task.id).await.unwrap().expect("a run record");
    assert!(reads.run(&auth, &run.run_id).await.unwrap().is_some());

    // Another tenant finds nothing, exactly as for ids that never existed.
    let not_task = |result: Result<_, AgentError>| {
        matches!(result, Err(AgentError::TaskNotFound { task_id }) if task_id == task.id)
    };
    assert!(not_task(reads.task(&other, &task.id).await.map(|_| ())));
    assert!(not_task(
        reads.task_with_history(&other, &task.id, None).await.map(|_| ())
    ));
    assert!(not_task(reads.task_events(&other, &task.id).await.map(|_| ())));
    let mut watch = reads.watch_task(&other, &task.id, 0);
    assert!(not_task(watch.next().await.expect("an answer").map(|_| ())));
    assert!(watch.next().await.is_none(), "an error ends the watch");

    let not_thread = |result: Result<(), AgentError>| {
        matches!(result, Err(AgentError::ThreadNotFound { thread_id }) if thread_id == thread)
    };
    assert!(not_thread(reads.thread(&other, &thread).await.map(|_| ())));
    assert!(not_thread(
        reads.thread_messages(&other, &thread, 0, 10).await.map(|_| ())
    ));
    assert!(not_thread(
        reads.thread_queue(&other, &thread, 10).await.map(|_| ())
    ));
    assert!(!reads.thread_exists(&other, &thread).await.unwrap());
    assert!(reads
        .tasks(&other, &TaskQuery::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert_eq!(reads.run(&other, &run.run_id).await.unwrap(), None);
    assert_eq!(reads.latest_run(&other, &task.id).await.unwrap(), None);
}

#[tokio::test]
async fn pending_approvals_list_the_waiting_requests_of_the_tenant() {
    let write = object_tool("write_record", "Write a record", |_args, _ctx| async { Ok(json!("written")) })
    .with_capabilities(["records.write"]);
    let llm = MockLlm::scripted(call_then_answer("write_record", json!({}), "done"));
    let agent = Agent::builder(AgentCard::new("gated", "reads tests", "http://127.0.0.1:0"))
        .llm(llm)
        .tool(write)
        .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval))
        .build()
        .unwrap();
    let (runtime, auth) = backend();
    let exec = AgentExecutor::new(agent, runtime);
    let thread = ThreadId::from("reads-gated");
    let task = send_in(&exec, &auth, &thread, "write").await;
    assert_eq!(task.state(), TaskState::InputRequired);
    let reads = exec.reads();

    let pending = reads
        .pending_approvals(&auth, None, None, None)
        .await
        .unwrap();
    assert_eq!(pending.items.len(), 1);
    assert_eq!(pending.items[0].task_id, task.id);
    assert_eq!(pending.items[0].thread_id, thread);
    assert_eq!(pending.items[0].request.action.capabilities, ["records.write"]);
    let elsewhere = ThreadId::from("reads-elsewhere");
    assert!(reads
        .pending_approvals(&auth, Some(&elsewhere), None, None)
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(reads
        .pending_approvals(&other_tenant(), None, None, None)
        .await
        .unwrap()
        .items
        .is_empty());
}

/// An agent whose one tool waits for a permit, so a test can watch a run before it ends.
fn gated_agent(gate: Arc<Semaphore>) -> Agent {
    let wait = object_tool("wait", "Wait for the gate", move |_args: Value, _ctx| {
        let gate = gate.clone();
        async move {
            gate.acquire().await.expect("the gate stays open").forget();
            Ok(json!("through"))
        }
    });
    let llm = MockLlm::scripted(call_then_answer("wait", json!({}), "finished"));
    Agent::builder(AgentCard::new("gated", "reads tests", "http://127.0.0.1:0"))
        .llm(llm)
        .tool(wait)
        .build()
        .unwrap()
}

/// Start a gated task without waiting for its run.
async fn start_gated(exec: &AgentExecutor, auth: &AuthContext, thread: &ThreadId) -> TaskId {
    start(exec, auth, Message::user("go").in_thread(thread.clone())).await.id
}

/// Watch from `after` until the terminal status; the changes, in order.
async fn watch_to_the_end(reads: &Reads, auth: &AuthContext, task: &TaskId, after: u64) -> Vec<TaskChange> {
    let mut watch = reads.watch_task(auth, task, after);
    let mut seen = Vec::new();
    while let Some(change) = watch.next().await {
        seen.push(change.unwrap());
    }
    seen
}

/// The changes are the log's events after `after`, each once, numbered without a gap.
fn assert_the_log_after(changes: &[TaskChange], log: &[TaskEvent], after: u64) {
    let seqs: Vec<u64> = changes.iter().map(|c| c.seq).collect();
    let expected: Vec<u64> = (after + 1..=log.len() as u64).collect();
    assert_eq!(seqs, expected, "no gap, no duplicate");
    for change in changes {
        assert_eq!(change.event, log[(change.seq - 1) as usize]);
    }
    assert!(changes.last().is_some_and(TaskChange::is_terminal));
}

/// Watch a gated task from sequence 0: the first read (the log so far) comes before the gate
/// opens, so everything after it (the tool's result, the answer, the end) arrives live. The
/// changes must be the whole log, each event once, numbered without a gap.
async fn watch_through_the_gate(reads: &Reads, auth: &AuthContext, task: &TaskId, gate: &Semaphore) {
    let mut watch = reads.watch_task(auth, task, 0);
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.seq, 1, "from the log's first event");
    gate.add_permits(1);
    let mut changes = vec![first];
    while let Some(change) = watch.next().await {
        changes.push(change.unwrap());
    }
    let log = reads.task_events(auth, task).await.unwrap();
    assert_the_log_after(&changes, &log, 0);
    assert_eq!(watch.position(), log.len() as u64);
}

#[tokio::test]
async fn a_watch_from_zero_replays_the_log_then_follows_it_live() {
    let gate = Arc::new(Semaphore::new(0));
    let (runtime, auth) = backend();
    let exec = AgentExecutor::new(gated_agent(gate.clone()), runtime);
    let task = start_gated(&exec, &auth, &ThreadId::from("reads-live")).await;
    let reads = exec.reads();
    watch_through_the_gate(&reads, &auth, &task, &gate).await;
}

#[tokio::test]
async fn a_watch_from_n_yields_only_the_later_events() {
    let (exec, auth, _) = executor("alpha");
    let task = send_in(&exec, &auth, &ThreadId::from("reads-from-n"), "hello").await;
    let reads = exec.reads();
    let log = reads.task_events(&auth, &task.id).await.unwrap();
    assert!(log.len() > 2, "{log:?}");
    let changes = watch_to_the_end(&reads, &auth, &task.id, 2).await;
    assert_the_log_after(&changes, &log, 2);
}

#[tokio::test]
async fn a_watch_on_a_replica_sees_the_events_of_a_task_run_by_another() {
    let gate = Arc::new(Semaphore::new(0));
    let (runtime, auth) = backend();
    let runner = AgentExecutor::new(gated_agent(gate.clone()), runtime.clone());
    // The replica shares the store only: its local signal never hears of the runner's work.
    let replica = AgentExecutor::new(gated_agent(Arc::new(Semaphore::new(0))), runtime);
    let task = start_gated(&runner, &auth, &ThreadId::from("reads-replica")).await;
    let reads = replica.reads();
    watch_through_the_gate(&reads, &auth, &task, &gate).await;
}

/// The next `count` changes of a thread watch.
async fn take(watch: &mut keel_agent::reads::ThreadWatch, count: usize) -> Vec<TaskChange> {
    let mut out = Vec::new();
    while out.len() < count {
        out.push(watch.next().await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_thread_watch_follows_every_task_of_the_thread_and_resumes_from_its_position() {
    let (exec, auth, _) = executor("alpha");
    let thread = ThreadId::from("reads-thread-watch");
    let reads = exec.reads();
    let mut watch = reads.watch_thread(&auth, &thread, ThreadPosition::default());
    let first = send_in(&exec, &auth, &thread, "one").await;
    let first_log = reads.task_events(&auth, &first.id).await.unwrap();
    let seen = take(&mut watch, first_log.len()).await;
    assert_the_log_after(&seen, &first_log, 0);
    // Resume from the position in a new watch: only the second task's events come.
    let position = ThreadPosition::parse(&watch.position().token()).unwrap();
    assert_eq!(position.of(&first.id), first_log.len() as u64);
    let second = send_in(&exec, &auth, &thread, "two").await;
    let second_log = reads.task_events(&auth, &second.id).await.unwrap();
    let mut resumed = reads.watch_thread(&auth, &thread, position);
    let later = take(&mut resumed, second_log.len()).await;
    assert!(later.iter().all(|c| c.task_id == second.id), "{later:?}");
    assert_the_log_after(&later, &second_log, 0);
    match ThreadPosition::parse("not a position") {
        Err(AgentError::InvalidInput { field, .. }) => assert_eq!(field, "position"),
        other => panic!("{other:?}"),
    }
}

/// A run as the last release stored it: a report of version 7, the task, thread and agent
/// every event shares written once on the report (decision 93), the final status carrying
/// the task.
fn report_of_version_7(run_id: &str) -> Value {
    json!({
        "version": 7, "run_id": run_id, "task_id": "old-task", "thread_id": "old-thread",
        "agent_name": "clerk",
        "started_at": "2026-01-02T03:04:05.100Z", "finished_at": "2026-01-02T03:04:05.400Z",
        "final_state": "completed", "approvals": [], "artifacts": [],
        "model": {"started_calls": 1, "calls": 1, "input_tokens": 12, "output_tokens": 3,
                  "latency_ms": 250, "models": ["mock"]},
        "budget": {"usage": {"steps": 1, "llm_calls": 1, "tool_calls": 0, "input_tokens": 12,
                             "output_tokens": 3, "runtime_seconds": 0.3}},
        "event_count": 2,
        "events": [
            {"version": 1, "type": "llm.call.completed", "run_id": run_id, "sequence": 1,
             "step": 1, "summary": "mock answered: 12 in / 3 out tokens",
             "payload": {"model": "mock", "input_tokens": 12, "output_tokens": 3,
                         "latency_ms": 250},
             "timestamp": "2026-01-02T03:04:05.350Z"},
            {"version": 1, "type": "task.status", "run_id": run_id, "sequence": 2,
             "summary": "task completed",
             "payload": {"state": "completed", "task": {"id": "old-task"}},
             "final": true, "timestamp": "2026-01-02T03:04:05.400Z"}
        ]
    })
}

/// Decision 257: runs are stored in a form of their own and rendered on read; a report
/// stored by the last release (version 7) still reads, rendered the same, and an older one
/// is refused naming its version, on every backend.
#[tokio::test]
async fn a_report_stored_by_the_last_release_reads_and_an_older_one_is_refused_by_version() {
    let (exec, auth, runtime) = executor("alpha");
    let store = runtime.run_store();
    let record = |run_id: &str, report: Value| keel_runtime::RunRecord {
        run_id: run_id.into(),
        task_id: Some("old-task".into()),
        thread_id: Some("old-thread".into()),
        trace_id: None,
        agent_name: Some("clerk".into()),
        recorded_at: chrono::Utc::now(),
        report,
    };
    store
        .save_run_report(&auth, &record("run-v7", report_of_version_7("run-v7")))
        .await
        .unwrap();
    let mut v6 = report_of_version_7("run-v6");
    v6["version"] = json!(6);
    store.save_run_report(&auth, &record("run-v6", v6.clone())).await.unwrap();
    let reads = exec.reads();

    let read = reads.run(&auth, &"run-v7".into()).await.unwrap().expect("the run");
    let report = read.report;
    assert_eq!(report["version"], 7);
    assert_eq!(report["final_state"], "completed");
    assert_eq!(report["model"]["input_tokens"], 12);
    // The ids written once are every event's again.
    let events = report["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e["task_id"] == "old-task" && e["agent_name"] == "clerk"));
    assert_eq!(events[1]["payload"]["task"]["id"], "old-task");

    let err = reads.run(&auth, &"run-v6".into()).await.unwrap_err();
    assert_eq!(err.kind(), keel_core::ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("version 6"), "{err}");
    // A list shows the row it cannot render as it is stored, and the others rendered.
    let listed = reads
        .runs(&auth, &keel_runtime::RunQuery::default())
        .await
        .unwrap();
    let by_id = |id: &str| listed.iter().find(|r| r.run_id.as_str() == id).unwrap();
    assert_eq!(by_id("run-v6").report, v6);
    assert_eq!(by_id("run-v7").report, report);

    // A run of this Keel is stored in the form of version 8 and read as a report of 7.
    let task = send_in(&exec, &auth, &ThreadId::new(), "hi").await;
    let run = reads.latest_run(&auth, &task.id).await.unwrap().expect("a run");
    let stored = store.get_run_report(&auth, &run.run_id).await.unwrap().unwrap();
    assert_eq!(stored.report["version"], keel_events::STORED_RUN_VERSION);
    assert_eq!(run.report["version"], keel_events::RUN_REPORT_VERSION);
    let rendered = reads.run(&auth, &run.run_id).await.unwrap().unwrap().report;
    assert_eq!(rendered, run.report);
    assert_eq!(rendered["final_state"], "completed");
    assert!(rendered["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["version"] == 1 && e["run_id"] == run.run_id.as_str()));
}
