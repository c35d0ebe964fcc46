//! Behaviour specific to the SQLite backend: durability across reopening, refusal of data and
//! schemas it cannot read, group commit, read counters, and errors that name the file.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, AgentResult, Message, RunContext, Task, TaskEvent};
use keel_runtime::testing::eventually;
use keel_runtime::{
    load_task_with_history, AuthContext, ListTasksFilter, MemoryService, TaskManager,
    ThreadHistory, ThreadKv, ThreadLeases, ThreadQueue,
};
use keel_store_sqlite::{SqliteStore, SCHEMA_VERSION};
use rusqlite::Connection;
use serde_json::json;
use tempfile::TempDir;

fn tenant() -> AuthContext {
    AuthContext::new("app", format!("user-{}", uuid::Uuid::new_v4().simple()))
}

fn db_path(dir: &TempDir) -> std::path::PathBuf {
    dir.path().join("keel.db")
}

/// Another connection holding SQLite's write lock, as another process could: writes sent
/// meanwhile pile up in the writer's queue.
/// A store on a new file in a temp dir (which must outlive it), and the tenant of the tests.
fn fresh_store() -> (TempDir, SqliteStore, AuthContext) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(db_path(&dir)).unwrap();
    (dir, store, tenant())
}

/// [`fresh_store`] whose tenant has been used once: a tenant's first use in a process makes
/// its key (one write job, decision 272), which the tests that count write jobs leave out.
async fn fresh_store_in_use() -> (TempDir, SqliteStore, AuthContext) {
    let (dir, store, auth) = fresh_store();
    store.get_task(&auth, &"none".into()).await.unwrap();
    (dir, store, auth)
}

/// `holder`'s lease on `thread` for 30 s, or `None` while another holder's is live.
async fn try_lease(
    store: &SqliteStore,
    auth: &AuthContext,
    thread: &keel_core::ThreadId,
    holder: &str,
) -> Option<keel_runtime::Lease> {
    store
        .acquire_lease(auth, thread, holder, Duration::from_secs(30))
        .await
        .unwrap()
}

/// A new task, saved in `store`, and a lease on its thread.
async fn leased_task(store: &SqliteStore, auth: &AuthContext) -> (Task, keel_runtime::Lease) {
    let task = saved_task(store, auth).await;
    let lease = try_lease(store, auth, &task.thread_id, "w")
        .await
        .expect("a new thread is free");
    (task, lease)
}

/// A new task, saved in `store`.
async fn saved_task(store: &SqliteStore, auth: &AuthContext) -> Task {
    let task = Task::create(Message::user("q"));
    store.save_task(auth, &task).await.unwrap();
    task
}

/// Append `message` to `task`'s log in `store`.
async fn add_message(store: &SqliteStore, auth: &AuthContext, task: &Task, message: Message) {
    store
        .add_task_event(auth, &task.id, &TaskEvent::Message { message })
        .await
        .unwrap();
}

/// The error of `result`, which must be a storage error.
fn storage_error<T: std::fmt::Debug>(result: AgentResult<T>) -> AgentError {
    let err = result.unwrap_err();
    assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");
    err
}

fn hold_write_lock(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("raw connection");
    conn.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    conn
}

#[tokio::test(flavor = "multi_thread")]
async fn data_survives_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let auth = tenant();
    let mut task = Task::create(Message::user("remember me"));
    RunContext::new().attach_to_task(&mut task).unwrap();
    let thread = task.thread_id.clone();
    let said = LlmMessage::user("hello");
    let (queued, token) = {
        let store = SqliteStore::open(db_path(&dir)).unwrap();
        store.save_task(&auth, &task).await.unwrap();
        add_message(&store, &auth, &task, task.history[0].clone()).await;
        store
            .kv_set(&auth, &thread, "plan", json!({"step": 2}))
            .await
            .unwrap();
        store
            .save_serialized(&auth, "cache", json!([1, 2, 3]))
            .await
            .unwrap();
        let queued = store
            .push_queue(&auth, &thread, json!({"say": "next"}))
            .await
            .unwrap();
        let lease = try_lease(&store, &auth, &thread, "w1").await.unwrap();
        store
            .append_history(&auth, &lease, std::slice::from_ref(&said))
            .await
            .unwrap();
        store.release_lease(&auth, &lease).await.unwrap();
        (queued, lease.token)
        // The store (and its writer thread) is dropped here.
    };

    let store = SqliteStore::open(db_path(&dir)).unwrap();
    let back = load_task_with_history(&store, &auth, &task.id, None)
        .await
        .unwrap()
        .expect("task survives");
    assert_eq!(back.id, task.id);
    assert_eq!(back.metadata, task.metadata);
    assert_eq!(back.history, task.history, "events survive");
    assert_eq!(
        store.kv_get(&auth, &thread, "plan").await.unwrap(),
        Some(json!({"step": 2}))
    );
    assert_eq!(
        store.load_serialized(&auth, "cache").await.unwrap(),
        Some(json!([1, 2, 3]))
    );
    assert_eq!(
        store.peek_queue(&auth, &thread, 10).await.unwrap(),
        vec![queued.clone()],
        "queued items survive, timestamps included"
    );
    let history = store.read_history(&auth, &thread, 0, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].message, said, "history survives");
    let lease = try_lease(&store, &auth, &thread, "w2").await.unwrap();
    assert!(
        lease.token > token,
        "lease tokens keep growing across reopening"
    );
    let next = store.push_queue(&auth, &thread, json!(2)).await.unwrap();
    assert!(
        next.seq > queued.seq,
        "queue seqs keep growing across reopening"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_stored_json_is_a_storage_error() {
    let (dir, store, auth) = fresh_store();
    let task = saved_task(&store, &auth).await;
    add_message(&store, &auth, &task, Message::agent("a")).await;
    store
        .kv_set(&auth, &task.thread_id, "k", json!(1))
        .await
        .unwrap();

    let raw = Connection::open(db_path(&dir)).unwrap();
    // Valid JSON of the wrong shape in the envelope, and text that is not JSON at all.
    raw.execute(
        "UPDATE tasks SET body = '{\"format\":1,\"data\":{\"id\":3}}'",
        [],
    )
    .unwrap();
    raw.execute("UPDATE task_events SET body = 'not json'", [])
        .unwrap();
    raw.execute("UPDATE thread_kv SET value = '{'", []).unwrap();
    drop(raw);

    let err = storage_error(store.get_task(&auth, &task.id).await);
    assert!(
        err.to_string().contains(task.id.as_str()),
        "the error names the record: {err}"
    );
    storage_error(store.list_tasks(&auth, &ListTasksFilter::default()).await);
    storage_error(store.get_task_events(&auth, &task.id).await);
    storage_error(store.kv_get(&auth, &task.thread_id, "k").await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_of_a_newer_format_is_refused() {
    let (dir, store, auth) = fresh_store();
    let task = saved_task(&store, &auth).await;
    let raw = Connection::open(db_path(&dir)).unwrap();
    raw.execute(
        "UPDATE tasks SET body = json_set(body, '$.format', 999)",
        [],
    )
    .unwrap();
    let err = storage_error(store.get_task(&auth, &task.id).await);
    assert!(err.to_string().contains("newer"), "{err}");
}

#[tokio::test]
async fn a_newer_schema_version_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(db_path(&dir)).unwrap());
    let raw = Connection::open(db_path(&dir)).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(raw);
    let err = storage_error(SqliteStore::open(db_path(&dir)));
    let text = err.to_string();
    assert!(text.contains("newer"), "{text}");
    assert!(
        text.contains(&(SCHEMA_VERSION + 1).to_string()),
        "names the version: {text}"
    );
    assert!(
        text.contains(&db_path(&dir).display().to_string()),
        "names the file: {text}"
    );
}

#[tokio::test]
async fn opening_in_a_missing_directory_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no").join("such").join("keel.db");
    let err = storage_error(SqliteStore::open(&path));
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error names the path: {err}"
    );
}

#[tokio::test]
async fn opening_a_file_that_is_not_a_database_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    let err = storage_error(SqliteStore::open(&path));
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "the error names the path: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_commits() {
    let (dir, store, auth) = fresh_store_in_use().await;
    let store = Arc::new(store);
    let before = store.stats();
    const WRITES: u64 = 64;

    let blocker = hold_write_lock(&db_path(&dir));
    let mut writers = Vec::new();
    for i in 0..WRITES {
        let (store, auth) = (store.clone(), auth.clone());
        writers.push(tokio::spawn(async move {
            let thread = format!("thread-{i}").into();
            store.kv_set(&auth, &thread, "n", json!(i)).await
        }));
    }
    eventually("every write is queued", || {
        let queued = store.stats().writes_submitted - before.writes_submitted == WRITES;
        async move { queued }
    })
    .await;
    blocker.execute_batch("COMMIT").unwrap();
    for writer in writers {
        writer.await.unwrap().unwrap();
    }

    let after = store.stats();
    let commits = after.commits - before.commits;
    assert_eq!(after.writes_finished - before.writes_finished, WRITES);
    assert!(
        commits < WRITES,
        "{WRITES} concurrent writes must share commits, took {commits}"
    );
    for i in 0..WRITES {
        let thread = format!("thread-{i}").into();
        assert_eq!(
            store.kv_get(&auth, &thread, "n").await.unwrap(),
            Some(json!(i)),
            "every acknowledged write is stored"
        );
    }
}

#[tokio::test]
async fn reads_go_to_the_reader_threads_and_are_counted() {
    let (_dir, store, auth) = fresh_store();
    let task = Task::create(Message::user("hi"));
    store.save_task(&auth, &task).await.unwrap();
    let before = store.stats();
    for _ in 0..5 {
        // Each read is sent after the write was acknowledged, so it sees it.
        assert!(store.get_task(&auth, &task.id).await.unwrap().is_some());
    }
    let after = store.stats();
    assert_eq!(after.reads_submitted - before.reads_submitted, 5);
    // One after the other, each read is alone in its batch.
    assert_eq!(after.read_batches - before.read_batches, 5);
    assert_eq!(after.writes_submitted, before.writes_submitted);

    // In memory, reads share the writer thread: no reader counters move.
    let memory = SqliteStore::open_in_memory().unwrap();
    memory.save_task(&auth, &task).await.unwrap();
    assert!(memory.get_task(&auth, &task.id).await.unwrap().is_some());
    assert_eq!(memory.stats().reads_submitted, 0);
    assert_eq!(memory.stats().read_batches, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_write_in_a_batch_fails_alone() {
    let (dir, store, auth) = fresh_store();
    let store = Arc::new(store);
    let thread: keel_core::ThreadId = "contended".into();
    let stale = try_lease(&store, &auth, &thread, "old").await.unwrap();
    store.release_lease(&auth, &stale).await.unwrap();
    let before = store.stats();

    let blocker = hold_write_lock(&db_path(&dir));
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for i in 0..16 {
        let (queue_store, queue_auth) = (store.clone(), auth.clone());
        good.push(tokio::spawn(async move {
            queue_store
                .push_queue(&queue_auth, &"contended".into(), json!(i))
                .await
        }));
        let (history_store, history_auth, stale) = (store.clone(), auth.clone(), stale.clone());
        bad.push(tokio::spawn(async move {
            history_store
                .append_history(&history_auth, &stale, &[LlmMessage::user("late")])
                .await
        }));
    }
    eventually("every write is queued", || {
        let queued = store.stats().writes_submitted - before.writes_submitted == 32;
        async move { queued }
    })
    .await;
    blocker.execute_batch("COMMIT").unwrap();
    for push in good {
        push.await.unwrap().unwrap();
    }
    for append in bad {
        let err = append.await.unwrap().unwrap_err();
        assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
    }
    assert_eq!(store.queue_len(&auth, &thread).await.unwrap(), 16);
    assert!(store
        .read_history(&auth, &thread, 0, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(store.stats().commits - before.commits < 32);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_stores_on_one_file_share_leases_like_two_processes() {
    let dir = tempfile::tempdir().unwrap();
    let first = SqliteStore::open(db_path(&dir)).unwrap();
    let second = SqliteStore::open(db_path(&dir)).unwrap();
    let auth = tenant();
    let thread = "shared".into();
    let lease = try_lease(&first, &auth, &thread, "process-1")
        .await
        .unwrap();
    assert!(
        try_lease(&second, &auth, &thread, "process-2")
            .await
            .is_none(),
        "the other process sees the live lease"
    );
    first.release_lease(&auth, &lease).await.unwrap();
    let taken = try_lease(&second, &auth, &thread, "process-2")
        .await
        .unwrap();
    assert!(taken.token > lease.token);
    let err = first
        .append_history(&auth, &lease, &[LlmMessage::user("stale")])
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_memory_values_are_swept_on_write() {
    let (dir, store, auth) = fresh_store();
    store
        .save_serialized_with_ttl(&auth, "brief", json!(1), Duration::from_millis(1))
        .await
        .unwrap();
    // Letting the 1 ms TTL run out on the wall clock is the behaviour under test (the store
    // reads the system time), not a wait for another task's state.
    tokio::time::sleep(Duration::from_millis(20)).await;
    store
        .save_serialized(&auth, "other", json!(2))
        .await
        .unwrap();
    let raw = Connection::open(db_path(&dir)).unwrap();
    let rows: i64 = raw
        .query_row("SELECT COUNT(*) FROM memory WHERE key = 'brief'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(rows, 0, "the expired row is gone from disk");
}

/// The writer's counters moved by exactly one job and one commit since `before`.
fn assert_one_write_job(store: &SqliteStore, before: keel_store_sqlite::StoreStats, what: &str) {
    let after = store.stats();
    assert_eq!(
        (
            after.writes_submitted - before.writes_submitted,
            after.writes_finished - before.writes_finished,
            after.commits - before.commits,
        ),
        (1, 1, 1),
        "{what} must be one write job in one commit"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn save_task_with_events_is_one_write_job() {
    let (_dir, store, auth) = fresh_store_in_use().await;
    let mut task = Task::create(Message::user("q"));
    let events: Vec<TaskEvent> = ["q", "a", "b"]
        .into_iter()
        .map(|text| TaskEvent::Message {
            message: Message::agent(text),
        })
        .collect();
    let before = store.stats();
    store
        .save_task_with_events(&auth, &task, &events)
        .await
        .unwrap();
    assert_one_write_job(&store, before, "a new task with three events");

    task.begin().unwrap();
    let before = store.stats();
    store
        .save_task_with_events(&auth, &task, &events[..1])
        .await
        .unwrap();
    assert_one_write_job(&store, before, "a status change with its event");
    assert_eq!(
        store.get_task_events(&auth, &task.id).await.unwrap().len(),
        4
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn save_task_with_events_writes_nothing_when_an_event_fails() {
    let (dir, store, auth) = fresh_store();
    // A trigger refusing the second event of any task, as a failing disk or a constraint
    // could: the snapshot and the first event, written before it, must not stay.
    Connection::open(db_path(&dir))
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_second_event BEFORE INSERT ON task_events \
             WHEN NEW.seq > 1 BEGIN SELECT RAISE(ABORT, 'refused by test'); END",
        )
        .unwrap();
    let task = Task::create(Message::user("q"));
    let events = [
        TaskEvent::Message {
            message: Message::agent("a"),
        },
        TaskEvent::Message {
            message: Message::agent("b"),
        },
    ];
    storage_error(store.save_task_with_events(&auth, &task, &events).await);
    assert_eq!(
        store.get_task(&auth, &task.id).await.unwrap(),
        None,
        "no snapshot without its events"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn persist_step_is_one_write_job() {
    use keel_runtime::{StepStore, TaskWrite};
    let (_dir, store, auth) = fresh_store();
    let (task, lease) = leased_task(&store, &auth).await;
    let before = store.stats();
    store
        .persist_step(
            &auth,
            &lease,
            &[LlmMessage::assistant("a", vec![]), LlmMessage::user("b")],
            &task,
            TaskWrite::LogOnly,
            &[TaskEvent::Message {
                message: Message::agent("a"),
            }],
        )
        .await
        .unwrap();
    assert_one_write_job(&store, before, "a step's history and log entry");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runs_ending_and_the_last_acknowledgement_are_one_write_job_each() {
    use keel_runtime::{RunStore, StepStore};
    let (_dir, store, auth) = fresh_store();
    let (mut task, lease) = leased_task(&store, &auth).await;
    task.begin().unwrap();
    task.fail("done").unwrap();
    let record =
        keel_runtime::testing::report_of(&task, Some("echo"), chrono::Utc::now(), json!(null));
    let report = keel_core::stored::JsonText::of(&json!({"final": "failed"})).unwrap();
    let status = TaskEvent::status_of(&task, true);
    let before = store.stats();
    store
        .save_task_and_run(&auth, &task, &[status], &record, &report)
        .await
        .unwrap();
    assert_one_write_job(&store, before, "a run's final status with its report");
    let stored = store.get_run_report(&auth, &record.run_id).await.unwrap();
    assert_eq!(stored.map(|r| r.report), Some(json!({"final": "failed"})));

    let item = store
        .push_queue(&auth, &task.thread_id, json!({"n": 1}))
        .await
        .unwrap();
    let before = store.stats();
    store
        .ack_and_release(&auth, &lease, &[item.id])
        .await
        .unwrap();
    assert_one_write_job(&store, before, "the last acknowledgement with the release");
    assert_eq!(store.queue_len(&auth, &task.thread_id).await.unwrap(), 0);
    assert!(
        try_lease(&store, &auth, &task.thread_id, "next")
            .await
            .is_some(),
        "the thread is free"
    );
}

#[tokio::test]
async fn services_hand_out_the_step_store() {
    let store = SqliteStore::open_in_memory().unwrap();
    let services = store.services(Arc::new(keel_llm::MockLlm::new()));
    assert!(
        keel_runtime::Runtime::step_store(&services).is_some(),
        "a SQLite runtime writes each persist point in one job"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_name_their_tenant_by_a_short_key_that_a_reopened_store_reads() {
    let (dir, store, alice) = fresh_store();
    let bob = tenant();
    let alices = saved_task(&store, &alice).await;
    let bobs = saved_task(&store, &bob).await;

    let raw = Connection::open(db_path(&dir)).unwrap();
    let column = |sql: &str| -> Vec<String> {
        let mut stmt = raw.prepare(sql).unwrap();
        let rows = stmt.query_map([], |row| row.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    };
    assert_eq!(
        column("SELECT name FROM tenants ORDER BY id"),
        [alice.namespace(), bob.namespace()]
    );
    assert_eq!(
        column("SELECT tenant FROM tasks ORDER BY seq"),
        ["1", "2"],
        "rows hold the key, not the namespace"
    );
    drop(store);

    // Another process on the file reads the keys the first one made, without writing.
    let store = SqliteStore::open(db_path(&dir)).unwrap();
    let before = store.stats();
    assert_eq!(
        store.get_task(&bob, &bobs.id).await.unwrap().map(|t| t.id),
        Some(bobs.id.clone())
    );
    assert_eq!(store.get_task(&bob, &alices.id).await.unwrap(), None);
    assert_eq!(store.stats().writes_submitted, before.writes_submitted);
    let mut tenants: Vec<String> = store
        .tenants()
        .await
        .unwrap()
        .iter()
        .map(AuthContext::namespace)
        .collect();
    tenants.sort();
    let mut expected = vec![alice.namespace(), bob.namespace()];
    expected.sort();
    assert_eq!(tenants, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_steps_log_entry_leaves_out_its_tasks_thread_and_reads_back_whole() {
    use keel_runtime::{StepStore, TaskWrite};
    let (dir, store, auth) = fresh_store();
    let (task, lease) = leased_task(&store, &auth).await;
    let mut answer = Message::agent("a");
    answer.task_id = Some(task.id.clone());
    answer.thread_id = Some(task.thread_id.clone());
    let event = TaskEvent::Message { message: answer };
    store
        .persist_step(
            &auth,
            &lease,
            &[],
            &task,
            TaskWrite::LogOnly,
            std::slice::from_ref(&event),
        )
        .await
        .unwrap();
    let body: String = Connection::open(db_path(&dir))
        .unwrap()
        .query_row(
            "SELECT body FROM task_events ORDER BY seq DESC LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(!body.contains(task.thread_id.as_str()), "{body}");
    assert!(!body.contains(task.id.as_str()), "{body}");
    let log = store.get_task_events(&auth, &task.id).await.unwrap();
    assert_eq!(log.last(), Some(&event));
}
