//! Redis-specific behaviour: several stores (like several Keel processes) sharing one Redis,
//! lease contention across them, corrupted data, tenancy in the raw key space, and
//! connection failures.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, Task, TaskEvent, TaskId, TaskState, ThreadId};
use keel_llm::MockLlm;
use keel_runtime::{
    testing, AuthContext, ChildThread, ListTasksFilter, MemoryService, SubagentRegistry,
    TaskManager, ThreadHistory, ThreadKv, ThreadLeases, ThreadQueue, ThreadStore,
};
use keel_store_redis::RedisStore;
use serde_json::json;

fn tenant(user: &str) -> AuthContext {
    AuthContext::new(format!("app-{}", uuid::Uuid::new_v4().simple()), user)
}

fn fresh_thread() -> ThreadId {
    ThreadId::from(format!("thread-{}", uuid::Uuid::new_v4().simple()))
}

/// A new task whose first message says `text`, saved in `store`.
async fn saved_task(store: &RedisStore, auth: &AuthContext, text: &str) -> Task {
    let task = Task::create(Message::user(text));
    store.save_task(auth, &task).await.unwrap();
    task
}

/// The raw key of a task snapshot, as the crate docs lay it out.
fn task_key(prefix: &str, auth: &AuthContext, task: &TaskId) -> String {
    format!("{prefix}{{{}}}:task:{task}", auth.namespace())
}

/// Run `count` calls of `op` at once, alternating between the two stores (call `i` gets its
/// index); their answers, in call order.
async fn race<S, T, Fut>(stores: &[S; 2], count: usize, op: impl Fn(S, usize) -> Fut) -> Vec<T>
where
    S: Clone,
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let calls: Vec<_> = (0..count)
        .map(|i| tokio::spawn(op(stores[i % 2].clone(), i)))
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_saved_by_one_store_is_read_by_another() {
    let (prefix, a, b) = support::fresh_two_stores().await;
    let auth = tenant("shared");
    let task = saved_task(&a, &auth, "hello from a").await;
    a.add_task_event(
        &auth,
        &task.id,
        &TaskEvent::Message {
            message: task.history[0].clone(),
        },
    )
    .await
    .unwrap();
    let seen = b.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(seen.id, task.id);
    assert!(seen.history.is_empty(), "snapshots carry no history");
    assert_eq!(b.get_task_events(&auth, &task.id).await.unwrap().len(), 1);
    let listed = b
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(listed.total_size, 1);
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stores_with_different_prefixes_share_nothing() {
    let (p1, p2) = (support::fresh_prefix(), support::fresh_prefix());
    let (a, b) = (support::store(&p1).await, support::store(&p2).await);
    let auth = tenant("same-tenant");
    let task = saved_task(&a, &auth, "only under p1").await;
    assert_eq!(b.get_task(&auth, &task.id).await.unwrap(), None);
    support::clean_up(&p1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_contention_across_two_stores_has_exactly_one_winner() {
    let (prefix, a, b) = support::fresh_two_stores().await;
    let stores: [Arc<dyn ThreadStore>; 2] = [Arc::new(a), Arc::new(b)];
    let (auth, thread) = (tenant("racers"), fresh_thread());
    let leases = race(&stores, 64, |store, i| {
        let (auth, thread) = (auth.clone(), thread.clone());
        async move {
            let holder = format!("w{i}");
            store
                .acquire_lease(&auth, &thread, &holder, Duration::from_secs(30))
                .await
                .unwrap()
        }
    })
    .await;
    let winners = leases.iter().flatten().count();
    assert_eq!(winners, 1, "exactly one racer holds the lease");
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_holder_on_one_store_cannot_write_after_another_store_takes_over() {
    let (prefix, a, b) = support::fresh_two_stores().await;
    let (auth, thread) = (tenant("fencing"), fresh_thread());
    let (old, new) = testing::lease_taken_over(&a, &b, &auth, &thread).await;
    let err = a
        .append_history(&auth, &old, &[LlmMessage::user("late")])
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
    b.append_history(
        &auth,
        &new,
        &[LlmMessage::user("b1"), LlmMessage::user("b2")],
    )
    .await
    .unwrap();
    let history = a.read_history(&auth, &thread, 0, 10).await.unwrap();
    assert_eq!(history.len(), 2, "only the current holder's writes landed");

    b.release_lease(&auth, &new).await.unwrap();
    let again = a
        .acquire_lease(&auth, &thread, "a", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(again.token > new.token, "tokens grow even across release");
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_key_count_cap_holds_under_concurrent_writers_on_two_stores() {
    let prefix = support::fresh_prefix();
    let stores = [
        support::capped_store(&prefix, 10).await,
        support::capped_store(&prefix, 10).await,
    ];
    let (auth, thread) = (tenant("kv"), fresh_thread());
    let writes = race(&stores, 40, |store, i| {
        let (auth, thread) = (auth.clone(), thread.clone());
        async move {
            store
                .kv_set(&auth, &thread, &format!("k{i}"), json!(i))
                .await
        }
    })
    .await;
    let mut stored = 0;
    for write in writes {
        match write {
            Ok(()) => stored += 1,
            Err(err) => assert!(err.to_string().contains("max_keys"), "{err}"),
        }
    }
    assert_eq!(stored, 10, "exactly max_keys writes succeed");
    assert_eq!(stores[0].kv_keys(&auth, &thread).await.unwrap().len(), 10);
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_items_pushed_through_two_stores_are_each_queued_once() {
    let (prefix, a, b) = support::fresh_two_stores().await;
    let (auth, thread) = (tenant("queue"), fresh_thread());
    for i in 0..10 {
        let store = if i % 2 == 0 { &a } else { &b };
        store
            .push_queue(&auth, &thread, json!({ "i": i }))
            .await
            .unwrap();
    }
    let items = b.peek_queue(&auth, &thread, 100).await.unwrap();
    let order: Vec<i64> = items
        .iter()
        .map(|item| item.payload["i"].as_i64().unwrap())
        .collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>(), "one FIFO across stores");
    let ids: HashSet<_> = items.iter().map(|i| &i.id).collect();
    assert_eq!(ids.len(), 10);
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_stored_data_is_a_storage_error() {
    let (prefix, store) = support::fresh_store().await;
    let auth = tenant("corrupt");
    let task = saved_task(&store, &auth, "soon garbage").await;
    let key = task_key(&prefix, &auth, &task.id);
    let mut raw = support::raw().await;

    support::raw_cmd(&mut raw, &["SET", &key, "garbage {"]).await;
    let err = store.get_task(&auth, &task.id).await.unwrap_err();
    assert!(
        matches!(err, AgentError::Storage { .. }) && err.to_string().contains(&key),
        "garbage names its key: {err:?}"
    );
    let err = store
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");

    // Valid JSON of a format from the future is refused with a clear error, not misread.
    support::raw_cmd(&mut raw, &["SET", &key, r#"{"format": 99, "data": {}}"#]).await;
    let err = store.get_task(&auth, &task.id).await.unwrap_err();
    assert!(
        matches!(err, AgentError::Storage { .. }) && err.to_string().contains("newer"),
        "{err:?}"
    );

    // A key of the wrong Redis type is a storage error too, with a hint.
    support::raw_cmd(&mut raw, &["DEL", &key]).await;
    support::raw_cmd(&mut raw, &["RPUSH", &key, "x"]).await;
    let err = store.get_task(&auth, &task.id).await.unwrap_err();
    assert!(
        matches!(err, AgentError::Storage { .. }) && err.to_string().contains("WRONGTYPE"),
        "{err:?}"
    );

    // Corrupt memory values and history entries the same way.
    let memory_key = format!("{prefix}{{{}}}:memory:m", auth.namespace());
    support::raw_cmd(&mut raw, &["SET", &memory_key, "[1, 2"]).await;
    assert!(matches!(
        store.load_serialized(&auth, "m").await,
        Err(AgentError::Storage { .. })
    ));
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_read_anothers_keys() {
    let prefix = support::fresh_prefix();
    let services = support::store(&prefix)
        .await
        .services(Arc::new(MockLlm::new()));
    let alice = tenant("alice");
    testing::write_tenant_rows(&services, &alice).await;

    // Every key Alice's data produced sits under her namespace; the only system-level key
    // is the set of tenant names (for recovery), which holds no data.
    let namespace = format!("{prefix}{{{}}}:", alice.namespace());
    let tenants = format!("{prefix}{{keel-system}}:tenants");
    let keys = support::keys_under(&prefix).await;
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(
            key.starts_with(&namespace) || key == &tenants,
            "{key} is outside {namespace}"
        );
    }
    // And no store method reaches another tenant's keys.
    testing::no_store_method_reaches_another_tenants_rows(&services).await;
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connecting_to_a_closed_port_is_store_unavailable() {
    let err = RedisStore::connect("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    match err {
        AgentError::StoreUnavailable { .. } => {
            let message = err.to_string();
            assert!(
                message.contains("127.0.0.1:1"),
                "names the server: {message}"
            );
        }
        other => panic!("expected StoreUnavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connection_errors_never_show_the_password() {
    let err = RedisStore::connect("redis://keel:hunter2@127.0.0.1:1/0")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, AgentError::StoreUnavailable { .. }));
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        !format!("{err:?}").contains("hunter2"),
        "the source is masked too: {err:?}"
    );
    assert!(text.contains("keel:***@127.0.0.1:1"), "{text}");

    let err = RedisStore::connect("not a url hunter2").await.unwrap_err();
    assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");
}

/// How many tasks a listing with this thread and state filter counts.
async fn count(
    store: &RedisStore,
    auth: &AuthContext,
    thread: Option<&ThreadId>,
    state: Option<TaskState>,
) -> usize {
    store
        .list_tasks(
            auth,
            &ListTasksFilter {
                thread_id: thread.cloned(),
                state,
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .total_size
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resaved_task_moves_between_state_and_thread_indexes() {
    let (prefix, store) = support::fresh_store().await;
    let auth = tenant("indexes");
    let (thread, other) = (fresh_thread(), fresh_thread());
    let earlier = Task::new(thread.clone());
    store.save_task(&auth, &earlier).await.unwrap();
    let mut task = Task::new(thread.clone());
    store.save_task(&auth, &task).await.unwrap();
    let submitted = Some(TaskState::Submitted);
    let completed = Some(TaskState::Completed);
    assert_eq!(count(&store, &auth, Some(&thread), submitted).await, 2);

    task.complete("done").unwrap();
    store.save_task(&auth, &task).await.unwrap();
    assert_eq!(count(&store, &auth, None, submitted).await, 1);
    assert_eq!(count(&store, &auth, None, completed).await, 1);
    assert_eq!(count(&store, &auth, Some(&thread), submitted).await, 1);
    assert_eq!(count(&store, &auth, Some(&thread), completed).await, 1);

    task.thread_id = other.clone();
    store.save_task(&auth, &task).await.unwrap();
    assert_eq!(count(&store, &auth, Some(&thread), None).await, 1);
    assert_eq!(count(&store, &auth, Some(&thread), completed).await, 0);
    assert_eq!(count(&store, &auth, Some(&other), completed).await, 1);
    assert_eq!(count(&store, &auth, None, None).await, 2);

    // A re-save keeps the creation order.
    store.save_task(&auth, &earlier).await.unwrap();
    let all = store
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(
        all.items.iter().map(|t| &t.id).collect::<Vec<_>>(),
        [&earlier.id, &task.id]
    );
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_registered_under_a_new_parent_leaves_the_old_one() {
    let (prefix, store) = support::fresh_store().await;
    let auth = tenant("children");
    let (first, second) = (fresh_thread(), fresh_thread());
    let mut child = ChildThread::running(fresh_thread(), first.clone(), "helper", "helper");
    store.register_child(&auth, &child).await.unwrap();
    child.parent_thread_id = second.clone();
    store.register_child(&auth, &child).await.unwrap();
    assert!(store.children(&auth, &first).await.unwrap().is_empty());
    assert_eq!(store.children(&auth, &second).await.unwrap(), [child]);
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn save_task_with_events_writes_nothing_when_the_log_cannot_take_them() {
    let (prefix, store) = support::fresh_store().await;
    let auth = tenant("atomic");
    let task = Task::create(Message::user("q"));
    // The log's key holds a string, so its RPUSH cannot succeed: the snapshot, written by
    // the same call, must not be left without its events.
    let events_key = format!("{prefix}{{{}}}:task-events:{}", auth.namespace(), task.id);
    let mut raw = support::raw().await;
    support::raw_cmd(&mut raw, &["SET", &events_key, "not a list"]).await;
    let event = TaskEvent::Message {
        message: Message::agent("a"),
    };
    let err = store
        .save_task_with_events(&auth, &task, std::slice::from_ref(&event))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Storage { .. }) && err.to_string().contains(&events_key),
        "names the key: {err:?}"
    );
    assert_eq!(store.get_task(&auth, &task.id).await.unwrap(), None);
    let listed = store
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(listed.total_size, 0, "no index entry either");
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_stored_before_the_status_time_indexes_are_listed_by_update() {
    use keel_runtime::TaskOrder;
    let (prefix, store) = support::fresh_store().await;
    let auth = tenant("older");
    let thread = fresh_thread();
    let mut saved = Vec::new();
    for _ in 0..3 {
        let task = Task::new(thread.clone());
        store.save_task(&auth, &task).await.unwrap();
        saved.push(task.id);
    }
    // As an older Keel left them: no by-status-time indexes.
    let mut raw = support::raw().await;
    for key in support::keys_under(&prefix).await {
        if key.contains(":tasks-by-update") {
            let _: () = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    }
    let page = store
        .list_tasks(
            &auth,
            &ListTasksFilter {
                thread_id: Some(thread.clone()),
                order: TaskOrder::RecentlyUpdated { since: None },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page.total_size, 3);
    let mut listed: Vec<TaskId> = page.items.into_iter().map(|t| t.id).collect();
    listed.sort();
    saved.sort();
    assert_eq!(listed, saved);
    support::clean_up(&prefix).await;
}

/// Decision 278 on Redis: a run's ending (the final snapshot, its log entries and the run's
/// record) is one script, and so is the thread's last acknowledgement with the lease's
/// release; neither answers `Unsupported`, as the trait's default would, which would make the
/// engine send two of each.
#[tokio::test(flavor = "multi_thread")]
async fn a_runs_ending_and_the_last_acknowledgement_are_one_script_each() {
    use keel_runtime::{RunStore, StepStore};
    let (prefix, store) = support::fresh_store().await;
    let auth = tenant("ending");
    let mut task = saved_task(&store, &auth, "q").await;
    task.begin().unwrap();
    task.fail("done").unwrap();
    let record = testing::report_of(&task, Some("echo"), chrono::Utc::now(), json!(null));
    let report = keel_core::stored::JsonText::of(&json!({"final": "failed"})).unwrap();
    let status = TaskEvent::status_of(&task, true);
    store
        .save_task_and_run(
            &auth,
            &task,
            std::slice::from_ref(&status),
            &record,
            &report,
        )
        .await
        .unwrap();
    let saved = store.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(saved.state(), TaskState::Failed);
    assert_eq!(
        store.get_task_events(&auth, &task.id).await.unwrap(),
        [status]
    );
    let stored = store.get_run_report(&auth, &record.run_id).await.unwrap();
    assert_eq!(stored.map(|r| r.report), Some(json!({"final": "failed"})));
    let by_task = keel_runtime::RunQuery {
        task_id: Some(task.id.clone()),
        ..Default::default()
    };
    assert_eq!(
        store.find_run_reports(&auth, &by_task).await.unwrap().len(),
        1,
        "the record is in its task's index"
    );

    let thread = task.thread_id.clone();
    let lease = store
        .acquire_lease(&auth, &thread, "a", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let item = store
        .push_queue(&auth, &thread, json!({"n": 1}))
        .await
        .unwrap();
    store
        .ack_and_release(&auth, &lease, &[item.id])
        .await
        .unwrap();
    assert_eq!(store.queue_len(&auth, &thread).await.unwrap(), 0);
    assert!(
        store
            .acquire_lease(&auth, &thread, "b", Duration::from_secs(30))
            .await
            .unwrap()
            .is_some(),
        "the thread is free"
    );
    support::clean_up(&prefix).await;
}
