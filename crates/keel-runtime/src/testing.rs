//! The backend conformance suite: plain `pub async fn` checks that any implementation of
//! Keel's store traits must pass. Keel's memory, SQLite and Redis stores run them in their
//! tests; a custom backend should too:
//!
//! ```toml
//! [dev-dependencies]
//! keel-runtime = { version = "0.1", features = ["testing"] }
//! ```
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use keel_runtime::{testing, InMemoryTaskManager};
//! testing::task_manager_round_trip(&InMemoryTaskManager::new()).await;
//! # }
//! ```
//!
//! Each check panics with a message naming the broken rule. Checks use fresh random ids and
//! tenants, so they can share one database with other tests. [`run_all`] runs every check
//! against one store of each kind. Malformed stored data cannot be injected generically:
//! each backend's own tests corrupt a record and expect [`AgentError::Storage`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use keel_core::{
    AgentError, Message, RunContext, RunId, Task, TaskEvent, TaskId, TaskState, ThreadId, TraceId,
};
use keel_llm::LlmMessage;
use serde_json::{json, Value};

use crate::{
    load_task_with_history, AuthContext, ChildThread, KvLimits, ListTasksFilter, MemoryService,
    RunQuery, RunRecord, RunStore, TaskManager, TaskRecord, ThreadStore,
};

/// A tenant no other test uses.
pub fn fresh_tenant() -> AuthContext {
    AuthContext::new(
        format!("app-{}", uuid::Uuid::new_v4().simple()),
        "conformance",
    )
}

fn fresh_thread() -> ThreadId {
    ThreadId::from(format!("thread-{}", uuid::Uuid::new_v4().simple()))
}

/// Run every check: tasks, memory, threads (with the store's key-value caps) and runs.
pub async fn run_all(
    tasks: &dyn TaskManager,
    memory: &dyn MemoryService,
    threads: Arc<dyn ThreadStore>,
    kv_limits: KvLimits,
    runs: &dyn RunStore,
) {
    task_manager_round_trip(tasks).await;
    task_manager_events_in_order(tasks).await;
    task_manager_pagination(tasks).await;
    task_manager_tenant_isolation(tasks).await;
    memory_round_trip(memory).await;
    memory_ttl(memory).await;
    history_append_and_read(threads.as_ref()).await;
    lease_exclusive_under_contention(threads.clone()).await;
    lease_fencing(threads.as_ref()).await;
    queue_fifo_under_concurrent_producers(threads.clone()).await;
    kv_semantics(threads.as_ref(), kv_limits).await;
    subagent_registry(threads.as_ref()).await;
    run_store_index_and_search(runs).await;
}

/// Unknown ids read as `None`; save is an upsert; snapshots round-trip (without history).
pub async fn task_manager_round_trip(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    assert_eq!(
        tasks.get_task(&auth, &TaskId::new()).await.unwrap(),
        None,
        "unknown task must be Ok(None)"
    );
    let mut task = Task::create(Message::user("hello ünïcödé ✓"));
    task.metadata
        .insert("k".into(), json!({"nested": [1, 2.5, null, "x"]}));
    RunContext::new().attach_to_task(&mut task).unwrap();
    tasks.save_task(&auth, &task).await.unwrap();
    let mut expected = task.clone();
    expected.history.clear();
    assert_eq!(
        tasks.get_task(&auth, &task.id).await.unwrap(),
        Some(expected),
        "snapshot must round-trip"
    );

    task.complete("done").unwrap();
    tasks.save_task(&auth, &task).await.unwrap();
    let stored = tasks.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(
        stored.state(),
        TaskState::Completed,
        "save must replace the snapshot"
    );
    assert_eq!(
        stored.state_history, task.state_history,
        "state history must round-trip"
    );
    let page = tasks
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(page.total_size, 1, "an upsert must not add a second task");
}

/// Events come back in the order appended; unknown tasks are `TaskNotFound`; the history is
/// rebuilt from message events.
pub async fn task_manager_events_in_order(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let task = Task::create(Message::user("q"));
    tasks.save_task(&auth, &task).await.unwrap();
    let mut expected = Vec::new();
    for i in 0..40 {
        let event = if i % 3 == 0 {
            TaskEvent::StatusUpdate {
                task_id: task.id.clone(),
                thread_id: task.thread_id.clone(),
                status: task.status().clone(),
                is_final: false,
            }
        } else {
            TaskEvent::Message {
                message: Message::agent(format!("m{i}")),
            }
        };
        tasks.add_task_event(&auth, &task.id, &event).await.unwrap();
        expected.push(event);
    }
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        expected,
        "events must keep their order"
    );
    let full = load_task_with_history(tasks, &auth, &task.id, Some(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        full.history.iter().map(Message::text).collect::<Vec<_>>(),
        ["m37", "m38"]
    );

    let unknown = TaskId::new();
    let err = tasks
        .add_task_event(
            &auth,
            &unknown,
            &TaskEvent::Message {
                message: Message::user("x"),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AgentError::TaskNotFound {
            task_id: unknown.clone()
        },
        "append to unknown task"
    );
    let err = tasks.get_task_events(&auth, &unknown).await.unwrap_err();
    assert_eq!(
        err,
        AgentError::TaskNotFound { task_id: unknown },
        "events of unknown task"
    );
}

/// Listing filters by thread and state, pages in creation order without gaps or duplicates,
/// and rejects bad page tokens and a zero page size.
pub async fn task_manager_pagination(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let (thread_a, thread_b) = (fresh_thread(), fresh_thread());
    let mut in_a = Vec::new();
    for i in 0..7 {
        let mut task = Task::new(thread_a.clone());
        if i % 2 == 0 {
            task.complete("x").unwrap();
        }
        tasks.save_task(&auth, &task).await.unwrap();
        in_a.push(task.id);
    }
    for _ in 0..2 {
        tasks
            .save_task(&auth, &Task::new(thread_b.clone()))
            .await
            .unwrap();
    }
    // Re-saving an early task must not move it in the order.
    let first = tasks.get_task(&auth, &in_a[0]).await.unwrap().unwrap();
    tasks.save_task(&auth, &first).await.unwrap();

    let mut filter = ListTasksFilter {
        thread_id: Some(thread_a.clone()),
        page_size: Some(3),
        ..Default::default()
    };
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = tasks.list_tasks(&auth, &filter).await.unwrap();
        assert_eq!(page.total_size, 7, "total_size counts every match");
        assert!(page.items.len() <= 3, "page_size must be honoured");
        seen.extend(page.items.into_iter().map(|t| t.id));
        pages += 1;
        match page.next_page_token {
            Some(token) => filter.page_token = Some(token),
            None => break,
        }
        assert!(pages < 10, "pagination must end");
    }
    assert_eq!(
        seen, in_a,
        "pages must list the thread's tasks in creation order, once each"
    );

    let completed = ListTasksFilter {
        thread_id: Some(thread_a),
        state: Some(TaskState::Completed),
        ..Default::default()
    };
    let page = tasks.list_tasks(&auth, &completed).await.unwrap();
    assert_eq!(page.total_size, 4, "state filter");
    assert!(page.items.iter().all(|t| t.state() == TaskState::Completed));

    let all = tasks
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(all.total_size, 9, "no filter lists the tenant's tasks");

    let bad = ListTasksFilter {
        page_token: Some("not-a-token".into()),
        ..Default::default()
    };
    assert!(
        matches!(tasks.list_tasks(&auth, &bad).await, Err(AgentError::InvalidInput { ref field, .. }) if field == "page_token"),
        "a bad page token is InvalidInput naming page_token"
    );
    let zero = ListTasksFilter {
        page_size: Some(0),
        ..Default::default()
    };
    assert!(
        matches!(tasks.list_tasks(&auth, &zero).await, Err(AgentError::InvalidInput { ref field, .. }) if field == "page_size"),
        "page_size 0 is InvalidInput naming page_size"
    );
}

/// One tenant can never read, list, append to or overwrite another's tasks.
pub async fn task_manager_tenant_isolation(tasks: &dyn TaskManager) {
    let (alice, mallory) = (fresh_tenant(), fresh_tenant());
    let task = Task::create(Message::user("alice's secret"));
    tasks.save_task(&alice, &task).await.unwrap();
    assert_eq!(
        tasks.get_task(&mallory, &task.id).await.unwrap(),
        None,
        "read across tenants"
    );
    let listed = tasks
        .list_tasks(
            &mallory,
            &ListTasksFilter {
                thread_id: Some(task.thread_id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.total_size, 0, "list across tenants");
    let err = tasks
        .add_task_event(
            &mallory,
            &task.id,
            &TaskEvent::Message {
                message: Message::user("x"),
            },
        )
        .await;
    assert!(
        matches!(err, Err(AgentError::TaskNotFound { .. })),
        "append across tenants"
    );
    let mut forged = task.clone();
    forged.fail("overwritten").unwrap();
    tasks.save_task(&mallory, &forged).await.unwrap();
    let still = tasks.get_task(&alice, &task.id).await.unwrap().unwrap();
    assert_eq!(
        still.state(),
        TaskState::Submitted,
        "a save by another tenant must not touch this tenant's task"
    );
}

/// JSON values round-trip, delete reports existence, tenants are isolated.
pub async fn memory_round_trip(memory: &dyn MemoryService) {
    let (alice, bob) = (fresh_tenant(), fresh_tenant());
    let value = json!({"s": "ü", "n": 1.5, "b": true, "a": [1, null, {"x": []}], "z": null});
    memory
        .save_serialized(&alice, "key/with:odd chars ✓", value.clone())
        .await
        .unwrap();
    assert_eq!(
        memory
            .load_serialized(&alice, "key/with:odd chars ✓")
            .await
            .unwrap(),
        Some(value.clone())
    );
    assert_eq!(
        memory
            .load_serialized(&bob, "key/with:odd chars ✓")
            .await
            .unwrap(),
        None,
        "tenant isolation"
    );
    memory.save_serialized(&alice, "k", json!(1)).await.unwrap();
    memory.save_serialized(&alice, "k", json!(2)).await.unwrap();
    assert_eq!(
        memory.load_serialized(&alice, "k").await.unwrap(),
        Some(json!(2)),
        "save replaces"
    );
    assert!(
        !memory.delete(&bob, "k").await.unwrap(),
        "delete across tenants"
    );
    assert!(memory.delete(&alice, "k").await.unwrap());
    assert!(
        !memory.delete(&alice, "k").await.unwrap(),
        "second delete finds nothing"
    );
    assert_eq!(memory.load_serialized(&alice, "k").await.unwrap(), None);
}

/// A value saved with a TTL is readable until it expires and gone after.
pub async fn memory_ttl(memory: &dyn MemoryService) {
    let auth = fresh_tenant();
    memory
        .save_serialized_with_ttl(&auth, "long", json!("stays"), Duration::from_secs(3600))
        .await
        .unwrap();
    memory
        .save_serialized_with_ttl(&auth, "short", json!("goes"), Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(
        memory.load_serialized(&auth, "long").await.unwrap(),
        Some(json!("stays"))
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    // Expiry is a matter of time passing: poll for it, bounded.
    while memory
        .load_serialized(&auth, "short")
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a 50 ms TTL value must expire"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        memory.load_serialized(&auth, "long").await.unwrap(),
        Some(json!("stays"))
    );
}

/// History entries get contiguous seqs from 1 and read back in order, by range.
pub async fn history_append_and_read(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    assert!(
        threads
            .read_history(&auth, &thread, 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "unknown thread has no history"
    );
    let lease = threads
        .acquire_lease(&auth, &thread, "w1", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let batch: Vec<LlmMessage> = (0..5).map(|i| LlmMessage::user(format!("m{i}"))).collect();
    assert_eq!(
        threads.append_history(&auth, &lease, &batch).await.unwrap(),
        5
    );
    assert_eq!(
        threads
            .append_history(&auth, &lease, &[LlmMessage::assistant("a", vec![])])
            .await
            .unwrap(),
        6
    );
    let all = threads.read_history(&auth, &thread, 0, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(all[0].message, batch[0], "messages round-trip");
    let middle = threads.read_history(&auth, &thread, 2, 2).await.unwrap();
    assert_eq!(
        middle
            .iter()
            .map(|e| e.message.content.as_str())
            .collect::<Vec<_>>(),
        ["m2", "m3"]
    );
    assert!(
        threads
            .read_history(&fresh_tenant(), &thread, 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );
}

/// Many tasks racing for one thread's lease: exactly one wins; other threads are independent.
pub async fn lease_exclusive_under_contention(threads: Arc<dyn ThreadStore>) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let mut racers = Vec::new();
    for i in 0..32 {
        let threads = threads.clone();
        let (auth, thread) = (auth.clone(), thread.clone());
        racers.push(tokio::spawn(async move {
            threads
                .acquire_lease(&auth, &thread, &format!("w{i}"), Duration::from_secs(30))
                .await
                .unwrap()
        }));
    }
    let mut winners = 0;
    for racer in racers {
        winners += usize::from(racer.await.unwrap().is_some());
    }
    assert_eq!(winners, 1, "exactly one racer may hold a thread's lease");
    let other = threads
        .acquire_lease(&auth, &fresh_thread(), "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(other.is_some(), "another thread's lease is independent");
    let other_tenant = threads
        .acquire_lease(&fresh_tenant(), &thread, "w", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        other_tenant.is_some(),
        "another tenant's thread of the same id is independent"
    );
}

/// Tokens grow; a holder whose lease expired or was taken over cannot write, renew or ack.
pub async fn lease_fencing(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let short = threads
        .acquire_lease(&auth, &thread, "slow", Duration::from_millis(40))
        .await
        .unwrap()
        .unwrap();
    let renewed = threads
        .renew_lease(&auth, &short, Duration::from_millis(40))
        .await
        .unwrap();
    assert_eq!(renewed.token, short.token, "renewal keeps the token");
    assert!(renewed.expires_at >= short.expires_at);
    // Wait (bounded) for the lease to lapse: an expired lease must not be usable even before
    // anyone else takes the thread.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while Utc::now() <= renewed.expires_at + chrono::Duration::milliseconds(5) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let err = threads
        .append_history(&auth, &renewed, &[LlmMessage::user("late")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "write with an expired lease: {err:?}"
    );
    let err = threads
        .renew_lease(&auth, &renewed, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "renew of an expired lease"
    );

    let next = threads
        .acquire_lease(&auth, &thread, "fast", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(next.token > renewed.token, "fencing tokens must grow");
    let err = threads
        .append_history(&auth, &renewed, &[LlmMessage::user("stale")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "write with a taken-over lease"
    );
    let err = threads.ack_queue(&auth, &renewed, &[]).await.unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "ack with a taken-over lease"
    );
    threads.release_lease(&auth, &renewed).await.unwrap();
    assert!(
        threads
            .acquire_lease(&auth, &thread, "third", Duration::from_secs(30))
            .await
            .unwrap()
            .is_none(),
        "releasing a stale lease must not free the current holder's lease"
    );
    threads
        .append_history(&auth, &next, &[LlmMessage::user("ok")])
        .await
        .unwrap();
    assert_eq!(
        threads
            .read_history(&auth, &thread, 0, 10)
            .await
            .unwrap()
            .len(),
        1,
        "only the holder's write landed"
    );
    threads.release_lease(&auth, &next).await.unwrap();
    threads.release_lease(&auth, &next).await.unwrap();
    let after = threads
        .acquire_lease(&auth, &thread, "fourth", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert!(after.token > next.token);
}

/// Concurrent producers: every item is queued once, each producer's items in its order;
/// peek does not remove; ack does (idempotently) and needs the lease.
pub async fn queue_fifo_under_concurrent_producers(threads: Arc<dyn ThreadStore>) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let mut producers = Vec::new();
    for p in 0..8 {
        let threads = threads.clone();
        let (auth, thread) = (auth.clone(), thread.clone());
        producers.push(tokio::spawn(async move {
            for i in 0..25 {
                threads
                    .push_queue(&auth, &thread, json!({"p": p, "i": i}))
                    .await
                    .unwrap();
            }
        }));
    }
    for producer in producers {
        producer.await.unwrap();
    }
    assert_eq!(threads.queue_len(&auth, &thread).await.unwrap(), 200);
    let items = threads.peek_queue(&auth, &thread, 1000).await.unwrap();
    assert_eq!(items.len(), 200, "peek must not lose items");
    assert!(
        items.windows(2).all(|w| w[0].seq < w[1].seq),
        "items come oldest first"
    );
    let ids: HashSet<_> = items.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids.len(), 200, "ids are unique");
    for p in 0..8 {
        let order: Vec<i64> = items
            .iter()
            .filter(|i| i.payload["p"] == p)
            .map(|i| i.payload["i"].as_i64().unwrap())
            .collect();
        assert_eq!(
            order,
            (0..25).collect::<Vec<_>>(),
            "producer {p}'s items keep their order"
        );
    }
    assert_eq!(
        threads.queue_len(&auth, &thread).await.unwrap(),
        200,
        "peek does not remove"
    );
    let lease = threads
        .acquire_lease(&auth, &thread, "consumer", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let first: Vec<String> = items[..10].iter().map(|i| i.id.clone()).collect();
    threads.ack_queue(&auth, &lease, &first).await.unwrap();
    threads.ack_queue(&auth, &lease, &first).await.unwrap();
    assert_eq!(
        threads.queue_len(&auth, &thread).await.unwrap(),
        190,
        "ack removes, once"
    );
    let next = threads.peek_queue(&auth, &thread, 1).await.unwrap();
    assert_eq!(next[0].id, items[10].id, "the front moves on");
    assert_eq!(
        threads.queue_len(&fresh_tenant(), &thread).await.unwrap(),
        0,
        "tenant isolation"
    );
}

/// §14: JSON round-trip, null deletes, per-thread isolation, caps with errors naming them.
pub async fn kv_semantics(threads: &dyn ThreadStore, limits: KvLimits) {
    let auth = fresh_tenant();
    let (thread, sibling) = (fresh_thread(), fresh_thread());
    assert_eq!(
        threads.kv_get(&auth, &thread, "missing").await.unwrap(),
        None,
        "never written is None"
    );
    for (key, value) in [
        ("object", json!({"a": {"b": [1, 2, {"c": null}]}})),
        ("array", json!([1, "two", 3.5, false])),
        ("string", json!("ünïcödé")),
        ("number", json!(-12.25)),
        ("bool", json!(true)),
    ] {
        threads
            .kv_set(&auth, &thread, key, value.clone())
            .await
            .unwrap();
        assert_eq!(
            threads.kv_get(&auth, &thread, key).await.unwrap(),
            Some(value),
            "{key} round-trips"
        );
    }
    assert_eq!(
        threads.kv_keys(&auth, &thread).await.unwrap(),
        ["array", "bool", "number", "object", "string"]
    );
    threads
        .kv_set(&auth, &thread, "string", Value::Null)
        .await
        .unwrap();
    assert_eq!(
        threads.kv_get(&auth, &thread, "string").await.unwrap(),
        None,
        "null deletes"
    );
    threads
        .kv_set(&auth, &thread, "never-set", Value::Null)
        .await
        .unwrap();
    assert_eq!(
        threads.kv_get(&auth, &sibling, "object").await.unwrap(),
        None,
        "threads are isolated"
    );
    assert_eq!(
        threads
            .kv_get(&fresh_tenant(), &thread, "object")
            .await
            .unwrap(),
        None,
        "tenants are isolated"
    );

    let long_key = "k".repeat(limits.max_key_bytes + 1);
    let err = threads
        .kv_set(&auth, &thread, &long_key, json!(1))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("max_key_bytes"),
        "key cap error names the cap: {err}"
    );
    let big = json!("x".repeat(limits.max_value_bytes));
    let err = threads
        .kv_set(&auth, &thread, "big", big)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("max_value_bytes"),
        "value cap error names the cap: {err}"
    );
    assert_eq!(
        threads.kv_get(&auth, &thread, "big").await.unwrap(),
        None,
        "a rejected write stores nothing"
    );
    let err = threads
        .kv_set(&auth, &thread, "", json!(1))
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "empty key");

    if limits.max_keys <= 64 {
        let full = fresh_thread();
        for i in 0..limits.max_keys {
            threads
                .kv_set(&auth, &full, &format!("k{i}"), json!(i))
                .await
                .unwrap();
        }
        let err = threads
            .kv_set(&auth, &full, "one-more", json!(1))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("max_keys"),
            "key count cap error names the cap: {err}"
        );
        threads
            .kv_set(&auth, &full, "k0", json!("replaced"))
            .await
            .unwrap();
    }
}

/// Children are registered under their parent, listed oldest first, and their status updates.
pub async fn subagent_registry(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let parent = fresh_thread();
    let mut children = Vec::new();
    for i in 0..3 {
        let child = ChildThread {
            thread_id: fresh_thread(),
            parent_thread_id: parent.clone(),
            name: format!("researcher {i}"),
            agent: "researcher".into(),
            status: "running".into(),
            resumable: i == 0,
            created_at: Utc::now() + chrono::Duration::milliseconds(i),
            metadata: Default::default(),
        };
        threads.register_child(&auth, &child).await.unwrap();
        children.push(child);
    }
    assert_eq!(
        threads.children(&auth, &parent).await.unwrap(),
        children,
        "children oldest first"
    );
    assert_eq!(
        threads
            .child(&auth, &children[1].thread_id)
            .await
            .unwrap()
            .as_ref(),
        Some(&children[1])
    );
    threads
        .set_child_status(&auth, &children[1].thread_id, "completed")
        .await
        .unwrap();
    assert_eq!(
        threads
            .child(&auth, &children[1].thread_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        "completed"
    );
    let err = threads
        .set_child_status(&auth, &fresh_thread(), "x")
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::InvalidInput { .. }),
        "status of an unregistered child"
    );
    assert!(
        threads
            .children(&fresh_tenant(), &parent)
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );
}

/// Records are found by each index, by time range and by text; newest first; reports upsert.
pub async fn run_store_index_and_search(runs: &dyn RunStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let trace = TraceId::new();
    let mut task = Task::new(thread.clone());
    let ctx = RunContext {
        trace_id: trace.clone(),
        ..RunContext::new()
    };
    ctx.attach_to_task(&mut task).unwrap();
    let before = Utc::now() - chrono::Duration::seconds(1);
    runs.save_task_record(&auth, &TaskRecord::of(&task, Some("alpha")).unwrap())
        .await
        .unwrap();
    task.complete("the answer is 42").unwrap();
    runs.save_task_record(&auth, &TaskRecord::of(&task, Some("alpha")).unwrap())
        .await
        .unwrap();
    runs.save_task_record(
        &auth,
        &TaskRecord::of(&Task::new(fresh_thread()), Some("beta")).unwrap(),
    )
    .await
    .unwrap();

    let by_task = runs
        .find_task_records(
            &auth,
            &RunQuery {
                task_id: Some(task.id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(by_task.len(), 2, "every snapshot is kept");
    assert_eq!(by_task[0].state, TaskState::Completed, "newest first");
    for query in [
        RunQuery {
            run_id: Some(ctx.run_id.clone()),
            ..Default::default()
        },
        RunQuery {
            thread_id: Some(thread.clone()),
            ..Default::default()
        },
        RunQuery {
            trace_id: Some(trace.clone()),
            ..Default::default()
        },
        RunQuery {
            agent_name: Some("alpha".into()),
            ..Default::default()
        },
    ] {
        assert_eq!(
            runs.find_task_records(&auth, &query).await.unwrap().len(),
            2,
            "{query:?}"
        );
    }
    let text = RunQuery {
        contains: Some("the answer is 42".into()),
        ..Default::default()
    };
    assert_eq!(
        runs.find_task_records(&auth, &text).await.unwrap().len(),
        1,
        "text search"
    );
    let window = RunQuery {
        since: Some(before),
        until: Some(Utc::now() + chrono::Duration::seconds(1)),
        ..Default::default()
    };
    assert_eq!(
        runs.find_task_records(&auth, &window).await.unwrap().len(),
        3,
        "time window"
    );
    let future = RunQuery {
        since: Some(Utc::now() + chrono::Duration::hours(1)),
        ..Default::default()
    };
    assert!(runs
        .find_task_records(&auth, &future)
        .await
        .unwrap()
        .is_empty());
    let limited = RunQuery {
        limit: Some(1),
        ..Default::default()
    };
    assert_eq!(
        runs.find_task_records(&auth, &limited).await.unwrap().len(),
        1,
        "limit"
    );
    assert!(matches!(
        runs.find_task_records(
            &auth,
            &RunQuery {
                limit: Some(0),
                ..Default::default()
            }
        )
        .await,
        Err(AgentError::InvalidInput { .. })
    ));
    assert!(
        runs.find_task_records(&fresh_tenant(), &RunQuery::default())
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );

    let run_id = RunId::new();
    let mut record = RunRecord {
        run_id: run_id.clone(),
        task_id: Some(task.id.clone()),
        thread_id: Some(thread.clone()),
        trace_id: Some(trace.clone()),
        agent_name: Some("alpha".into()),
        recorded_at: Utc::now(),
        report: json!({"events": 3, "final": "completed"}),
    };
    assert_eq!(
        runs.get_run_report(&auth, &run_id).await.unwrap(),
        None,
        "unknown run is None"
    );
    runs.save_run_report(&auth, &record).await.unwrap();
    record.report = json!({"events": 4, "final": "completed", "note": "replaced"});
    runs.save_run_report(&auth, &record).await.unwrap();
    let stored = runs.get_run_report(&auth, &run_id).await.unwrap().unwrap();
    assert_eq!(stored.report, record.report, "save_run_report replaces");
    let found = runs
        .find_run_reports(
            &auth,
            &RunQuery {
                trace_id: Some(trace),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    let found = runs
        .find_run_reports(
            &auth,
            &RunQuery {
                contains: Some("replaced".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "report text search");
    assert_eq!(
        runs.get_run_report(&fresh_tenant(), &run_id).await.unwrap(),
        None,
        "tenant isolation"
    );
}
