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

mod async_calls;
mod wait;

pub use async_calls::*;
pub use wait::{eventually, Reached, WAIT_DEADLINE};

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use keel_core::conversation::LlmMessage;
use keel_core::{
    AgentError, Message, RunContext, RunId, Task, TaskEvent, TaskId, TaskState, ThreadId, TraceId,
};
use serde_json::{json, Value};

use crate::{
    load_task_with_history, AuthContext, ChildThread, KvLimits, ListTasksFilter, MemoryService,
    Page, RunQuery, RunRecord, RunStore, TaskManager, TaskRecord, ThreadStore,
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
    task_manager_page_token_survives_changes(tasks).await;
    task_manager_state_filter_follows_saves(tasks).await;
    task_manager_listed_tasks_carry_no_history(tasks).await;
    task_manager_tenant_isolation(tasks).await;
    memory_round_trip(memory).await;
    memory_ttl(memory).await;
    memory_delete_of_expired_key_is_false(memory).await;
    memory_save_if_absent_claims_once(memory).await;
    history_append_and_read(threads.as_ref()).await;
    history_and_queue_limit_zero_is_empty(threads.as_ref()).await;
    lease_exclusive_under_contention(threads.clone()).await;
    lease_fencing(threads.as_ref()).await;
    lease_is_dead_after_release(threads.as_ref()).await;
    lease_ttl_bounds(threads.as_ref()).await;
    queue_fifo_under_concurrent_producers(threads.clone()).await;
    queue_seqs_grow_after_the_queue_empties(threads.as_ref()).await;
    kv_semantics(threads.as_ref(), kv_limits).await;
    subagent_registry(threads.as_ref()).await;
    subagent_reparenting_leaves_the_old_parent(threads.as_ref()).await;
    run_store_index_and_search(runs).await;
    run_store_time_window_is_half_open(runs).await;
    run_store_contains_searches_the_stored_json(runs).await;
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

/// `save_if_absent` is a claim: of many concurrent callers exactly one stores its value,
/// the key stays taken until deleted (or expired), and tenants claim separately.
pub async fn memory_save_if_absent_claims_once(memory: &dyn MemoryService) {
    let (alice, bob) = (fresh_tenant(), fresh_tenant());
    let long = Duration::from_secs(3600);
    let claim = |n: usize| memory.save_if_absent(&alice, "claim", json!(n), long);
    let (a, b, c, d) = tokio::join!(claim(0), claim(1), claim(2), claim(3));
    let won: Vec<bool> = [a, b, c, d].into_iter().map(Result::unwrap).collect();
    assert_eq!(
        won.iter().filter(|w| **w).count(),
        1,
        "exactly one concurrent claim wins: {won:?}"
    );
    let winner = won.iter().position(|w| *w).unwrap();
    assert_eq!(
        memory.load_serialized(&alice, "claim").await.unwrap(),
        Some(json!(winner)),
        "the winner's value is stored"
    );
    assert!(
        memory
            .save_if_absent(&bob, "claim", json!("bob"), long)
            .await
            .unwrap(),
        "another tenant's key is free"
    );
    assert!(memory.delete(&alice, "claim").await.unwrap());
    assert!(
        memory
            .save_if_absent(&alice, "claim", json!("again"), long)
            .await
            .unwrap(),
        "a deleted claim can be taken again"
    );
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
    // The same through the text form the engine writes.
    let text = json!({"events": 5, "final": "completed", "note": "as text"});
    let json_text = keel_core::stored::JsonText::of(&text).unwrap();
    runs.save_run_report_json(&auth, record.clone(), json_text)
        .await
        .unwrap();
    let stored = runs.get_run_report(&auth, &run_id).await.unwrap().unwrap();
    assert_eq!(stored.report, text, "save_run_report_json replaces too");
    runs.save_run_report(&auth, &record).await.unwrap();
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

/// The ids of a page's items, for comparing listings.
fn ids(page: &Page<Task>) -> Vec<TaskId> {
    page.items.iter().map(|t| t.id.clone()).collect()
}

/// A page token keeps its place while the list changes: the next page neither repeats nor
/// skips a task that still matches when earlier tasks leave the filter, and a well-formed
/// token past the end (every later task left the filter) yields an empty last page with no
/// next token, not an error.
pub async fn task_manager_page_token_survives_changes(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let mut all = Vec::new();
    for _ in 0..6 {
        let task = Task::new(thread.clone());
        tasks.save_task(&auth, &task).await.unwrap();
        all.push(task);
    }
    let submitted = |page_token: Option<String>| ListTasksFilter {
        thread_id: Some(thread.clone()),
        state: Some(TaskState::Submitted),
        page_size: Some(2),
        page_token,
    };
    let first = tasks.list_tasks(&auth, &submitted(None)).await.unwrap();
    assert_eq!(ids(&first), [all[0].id.clone(), all[1].id.clone()]);
    let token = first
        .next_page_token
        .expect("six tasks need more than one page");

    // A task before the token leaves the filter: the next page must still start at task 2.
    all[0].complete("done").unwrap();
    tasks.save_task(&auth, &all[0]).await.unwrap();
    let second = tasks
        .list_tasks(&auth, &submitted(Some(token)))
        .await
        .unwrap();
    assert_eq!(
        ids(&second),
        [all[2].id.clone(), all[3].id.clone()],
        "a page token must not skip tasks when earlier ones leave the filter"
    );
    assert_eq!(
        second.total_size, 5,
        "total_size counts the current matches"
    );
    let token = second.next_page_token.expect("two tasks still follow");

    // Every task after the token leaves the filter: the token now points past the end.
    for task in &mut all[4..] {
        task.complete("done").unwrap();
        tasks.save_task(&auth, task).await.unwrap();
    }
    let past = tasks
        .list_tasks(&auth, &submitted(Some(token)))
        .await
        .unwrap_or_else(|e| panic!("a well-formed token past the end is not an error: {e}"));
    assert!(
        past.items.is_empty(),
        "a token past the end yields an empty page"
    );
    assert_eq!(past.next_page_token, None, "and it is the last page");
    assert_eq!(past.total_size, 3, "total_size counts the current matches");
}

/// Listing by state reflects the latest save: a task whose state changed leaves the old
/// state's listing and joins the new one, with or without a thread filter, and keeps its
/// place in unfiltered listings.
pub async fn task_manager_state_filter_follows_saves(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let (mut a, b) = (Task::new(thread.clone()), Task::new(thread.clone()));
    tasks.save_task(&auth, &a).await.unwrap();
    tasks.save_task(&auth, &b).await.unwrap();
    let listing = |state: Option<TaskState>, thread_id: Option<ThreadId>| ListTasksFilter {
        thread_id,
        state,
        ..Default::default()
    };
    for thread_id in [None, Some(thread.clone())] {
        let page = tasks
            .list_tasks(
                &auth,
                &listing(Some(TaskState::Submitted), thread_id.clone()),
            )
            .await
            .unwrap();
        assert_eq!(ids(&page), [a.id.clone(), b.id.clone()]);
        let page = tasks
            .list_tasks(&auth, &listing(Some(TaskState::Working), thread_id))
            .await
            .unwrap();
        assert_eq!(page.total_size, 0);
    }

    a.begin().unwrap();
    tasks.save_task(&auth, &a).await.unwrap();
    a.complete("done").unwrap();
    tasks.save_task(&auth, &a).await.unwrap();
    for thread_id in [None, Some(thread.clone())] {
        let what = if thread_id.is_some() {
            "with a thread filter"
        } else {
            "by state alone"
        };
        let page = tasks
            .list_tasks(
                &auth,
                &listing(Some(TaskState::Submitted), thread_id.clone()),
            )
            .await
            .unwrap();
        assert_eq!(
            ids(&page),
            std::slice::from_ref(&b.id),
            "a re-saved task leaves its old state's listing ({what})"
        );
        assert_eq!(page.total_size, 1, "{what}");
        let page = tasks
            .list_tasks(&auth, &listing(Some(TaskState::Working), thread_id.clone()))
            .await
            .unwrap();
        assert_eq!(
            page.total_size, 0,
            "a state passed through is not listed ({what})"
        );
        let page = tasks
            .list_tasks(&auth, &listing(Some(TaskState::Completed), thread_id))
            .await
            .unwrap();
        assert_eq!(
            ids(&page),
            std::slice::from_ref(&a.id),
            "a re-saved task joins its new state's listing ({what})"
        );
        assert_eq!(page.total_size, 1, "{what}");
    }
    let page = tasks
        .list_tasks(&auth, &listing(None, Some(thread)))
        .await
        .unwrap();
    assert_eq!(
        ids(&page),
        [a.id.clone(), b.id.clone()],
        "a state change does not move a task in unfiltered listings"
    );
}

/// Listed tasks are snapshots without history, as `get_task` returns them.
pub async fn task_manager_listed_tasks_carry_no_history(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let mut task = Task::create(Message::user("question"));
    task.add_message(Message::agent("answer"));
    assert_eq!(task.history.len(), 2);
    tasks.save_task(&auth, &task).await.unwrap();
    for filter in [
        ListTasksFilter::default(),
        ListTasksFilter {
            thread_id: Some(task.thread_id.clone()),
            state: Some(TaskState::Submitted),
            ..Default::default()
        },
    ] {
        let page = tasks.list_tasks(&auth, &filter).await.unwrap();
        assert_eq!(page.items.len(), 1, "{filter:?}");
        assert!(
            page.items[0].history.is_empty(),
            "listed tasks carry no history ({filter:?})"
        );
    }
}

/// Deleting a key whose TTL has run out reports that nothing was there, even when nothing
/// read the key since it expired.
pub async fn memory_delete_of_expired_key_is_false(memory: &dyn MemoryService) {
    let auth = fresh_tenant();
    memory
        .save_serialized_with_ttl(&auth, "short", json!("goes"), Duration::from_millis(20))
        .await
        .unwrap();
    // Wait out the TTL on the wall clock only: a read could remove the key by itself.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        !memory.delete(&auth, "short").await.unwrap(),
        "delete of an expired key must answer false"
    );
    assert_eq!(memory.load_serialized(&auth, "short").await.unwrap(), None);
}

/// A limit of 0 reads nothing, from history and queue alike.
pub async fn history_and_queue_limit_zero_is_empty(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let lease = threads
        .acquire_lease(&auth, &thread, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    threads
        .append_history(
            &auth,
            &lease,
            &[LlmMessage::user("a"), LlmMessage::user("b")],
        )
        .await
        .unwrap();
    threads
        .push_queue(&auth, &thread, json!({"n": 1}))
        .await
        .unwrap();
    assert!(
        threads
            .read_history(&auth, &thread, 0, 0)
            .await
            .unwrap()
            .is_empty(),
        "read_history with limit 0"
    );
    assert!(
        threads
            .read_history(&auth, &thread, 1, 0)
            .await
            .unwrap()
            .is_empty(),
        "read_history with limit 0 from the middle"
    );
    assert!(
        threads
            .peek_queue(&auth, &thread, 0)
            .await
            .unwrap()
            .is_empty(),
        "peek_queue with limit 0"
    );
    assert_eq!(
        threads
            .read_history(&auth, &thread, 0, 1)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        threads.peek_queue(&auth, &thread, 1).await.unwrap().len(),
        1
    );
}

/// A released lease is dead: writing, acknowledging and renewing with it are `LeaseLost`,
/// nothing lands, and the thread can be leased again with a larger token.
pub async fn lease_is_dead_after_release(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let lease = threads
        .acquire_lease(&auth, &thread, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let item = threads
        .push_queue(&auth, &thread, json!("pending"))
        .await
        .unwrap();
    threads.release_lease(&auth, &lease).await.unwrap();
    let err = threads
        .append_history(&auth, &lease, &[LlmMessage::user("after release")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "write after release: {err:?}"
    );
    let err = threads
        .ack_queue(&auth, &lease, std::slice::from_ref(&item.id))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "ack after release: {err:?}"
    );
    let err = threads
        .renew_lease(&auth, &lease, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "renew after release: {err:?}"
    );
    assert!(
        threads
            .read_history(&auth, &thread, 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "nothing was written after release"
    );
    assert_eq!(
        threads.queue_len(&auth, &thread).await.unwrap(),
        1,
        "nothing was acknowledged after release"
    );
    let again = threads
        .acquire_lease(&auth, &thread, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a released thread can be leased again");
    assert!(
        again.token > lease.token,
        "fencing tokens grow across release"
    );
}

/// Lease TTLs must lie in 1 ms ..= 24 h (see [`crate::check_lease_ttl`]); anything else is
/// `InvalidInput` naming `ttl`, for acquire and renew alike, and changes nothing.
pub async fn lease_ttl_bounds(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let bad = [
        Duration::ZERO,
        Duration::from_micros(1),
        Duration::from_micros(999),
        Duration::from_secs(86_400) + Duration::from_millis(1),
    ];
    let is_ttl_error =
        |err: &AgentError| matches!(err, AgentError::InvalidInput { field, .. } if field == "ttl");
    for ttl in bad {
        let err = threads
            .acquire_lease(&auth, &thread, "w", ttl)
            .await
            .unwrap_err();
        assert!(is_ttl_error(&err), "acquire with ttl {ttl:?}: {err:?}");
    }
    let lease = threads
        .acquire_lease(&auth, &thread, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("rejected acquisitions must not hold the thread");
    for ttl in bad {
        let err = threads.renew_lease(&auth, &lease, ttl).await.unwrap_err();
        assert!(is_ttl_error(&err), "renew with ttl {ttl:?}: {err:?}");
    }
    threads
        .append_history(&auth, &lease, &[LlmMessage::user("still held")])
        .await
        .expect("a rejected renewal leaves the lease as it was");
    threads
        .renew_lease(&auth, &lease, Duration::from_secs(86_400))
        .await
        .expect("24 h is allowed");
    threads.release_lease(&auth, &lease).await.unwrap();
    threads
        .acquire_lease(&auth, &fresh_thread(), "w", Duration::from_millis(1))
        .await
        .expect("1 ms is allowed")
        .expect("a fresh thread is free");
}

/// Queue seqs only grow: after every item is acknowledged and the queue is empty, the next
/// item gets a larger seq than any before it.
pub async fn queue_seqs_grow_after_the_queue_empties(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let lease = threads
        .acquire_lease(&auth, &thread, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let mut last_seq = 0;
    for round in 0..3 {
        let mut acked = Vec::new();
        for i in 0..2 {
            let item = threads
                .push_queue(&auth, &thread, json!({"round": round, "i": i}))
                .await
                .unwrap();
            assert!(
                item.seq > last_seq,
                "queue seqs must grow, even after the queue emptied (round {round}: {} after {last_seq})",
                item.seq
            );
            last_seq = item.seq;
            acked.push(item.id);
        }
        threads.ack_queue(&auth, &lease, &acked).await.unwrap();
        assert_eq!(threads.queue_len(&auth, &thread).await.unwrap(), 0);
        assert!(threads
            .peek_queue(&auth, &thread, 10)
            .await
            .unwrap()
            .is_empty());
    }
}

/// Re-registering a child under another parent moves it: the old parent no longer lists it.
pub async fn subagent_reparenting_leaves_the_old_parent(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let (old_parent, new_parent) = (fresh_thread(), fresh_thread());
    let sibling = ChildThread {
        thread_id: fresh_thread(),
        parent_thread_id: old_parent.clone(),
        name: "stays".into(),
        agent: "researcher".into(),
        status: "running".into(),
        resumable: true,
        created_at: Utc::now(),
        metadata: Default::default(),
    };
    let mut child = ChildThread {
        thread_id: fresh_thread(),
        name: "moves".into(),
        created_at: Utc::now() + chrono::Duration::milliseconds(1),
        ..sibling.clone()
    };
    threads.register_child(&auth, &sibling).await.unwrap();
    threads.register_child(&auth, &child).await.unwrap();
    assert_eq!(
        threads.children(&auth, &old_parent).await.unwrap(),
        [sibling.clone(), child.clone()]
    );

    child.parent_thread_id = new_parent.clone();
    child.status = "handed over".into();
    threads.register_child(&auth, &child).await.unwrap();
    assert_eq!(
        threads.children(&auth, &old_parent).await.unwrap(),
        [sibling],
        "a re-registered child leaves its old parent's list"
    );
    assert_eq!(
        threads.children(&auth, &new_parent).await.unwrap(),
        [child.clone()],
        "and joins its new parent's"
    );
    assert_eq!(
        threads.child(&auth, &child.thread_id).await.unwrap(),
        Some(child),
        "the entry is replaced"
    );
}

/// `since` is inclusive and `until` exclusive: a record at exactly `until` is not found, one at
/// exactly `since` is, so adjacent windows never share a record. Checked for task records and
/// run reports.
pub async fn run_store_time_window_is_half_open(runs: &dyn RunStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let t0 = Utc::now();
    let t1 = t0 + chrono::Duration::milliseconds(1);
    let nanosecond = chrono::Duration::nanoseconds(1);
    let mut task = Task::new(thread.clone());
    for (at, text) in [(t0, "first"), (t1, "second")] {
        let mut record = TaskRecord::of(&task, None).unwrap();
        record.recorded_at = at;
        record.task.metadata.insert("which".into(), json!(text));
        runs.save_task_record(&auth, &record).await.unwrap();
        let report = RunRecord {
            run_id: RunId::new(),
            task_id: Some(task.id.clone()),
            thread_id: Some(thread.clone()),
            trace_id: None,
            agent_name: None,
            recorded_at: at,
            report: json!({"which": text}),
        };
        runs.save_run_report(&auth, &report).await.unwrap();
    }
    task.metadata.clear();

    let window = |since, until| RunQuery {
        thread_id: Some(thread.clone()),
        since,
        until,
        ..Default::default()
    };
    let cases = [
        (window(None, Some(t0)), vec![], "until is exclusive"),
        (
            window(None, Some(t0 + nanosecond)),
            vec!["first"],
            "one nanosecond later includes it",
        ),
        (
            window(Some(t0), Some(t1)),
            vec!["first"],
            "[t0, t1) holds only the first",
        ),
        (
            window(Some(t1), Some(t1 + nanosecond)),
            vec!["second"],
            "since is inclusive",
        ),
        (
            window(Some(t0), None),
            vec!["second", "first"],
            "open-ended, newest first",
        ),
    ];
    for (query, expected, rule) in cases {
        let found: Vec<Value> = runs
            .find_task_records(&auth, &query)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.task.metadata["which"].clone())
            .collect();
        assert_eq!(found, expected, "task records: {rule}");
        let found: Vec<Value> = runs
            .find_run_reports(&auth, &query)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.report["which"].clone())
            .collect();
        assert_eq!(found, expected, "run reports: {rule}");
    }
}

/// `contains` is a case-sensitive substring of the record's stored JSON, the same text on
/// every backend (see [`RunQuery`]): compact, keys sorted, strings JSON-escaped, non-ASCII as
/// is, `%` and `_` literal, the envelope included.
pub async fn run_store_contains_searches_the_stored_json(runs: &dyn RunStore) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let notes = [
        "Grüße: 50%_off, say \"hi\" C:\\tmp",
        "grüße: 50 percent off",
    ];
    for note in notes {
        let mut task = Task::new(thread.clone());
        task.metadata.insert("note".into(), json!(note));
        runs.save_task_record(&auth, &TaskRecord::of(&task, Some("gamma")).unwrap())
            .await
            .unwrap();
        let report = RunRecord {
            run_id: RunId::new(),
            task_id: Some(task.id.clone()),
            thread_id: Some(thread.clone()),
            trace_id: None,
            agent_name: Some("gamma".into()),
            recorded_at: Utc::now(),
            report: json!({"note": note, "zeta": 1, "alpha": 2}),
        };
        runs.save_run_report(&auth, &report).await.unwrap();
    }
    let envelope = format!("\"format\":{}", keel_core::stored::FORMAT_VERSION);
    let cases: [(&str, usize, &str); 12] = [
        ("Grüße", 1, "case-sensitive, non-ASCII matched as is"),
        ("grüße", 1, "case-sensitive"),
        ("GRÜSSE", 0, "no case folding"),
        ("50%_off", 1, "% and _ are literal"),
        ("5_%", 0, "% and _ are not patterns"),
        ("50%", 1, "% is literal"),
        (r#"say \"hi\""#, 1, "quotes are matched JSON-escaped"),
        (
            r#"say "hi""#,
            0,
            "unescaped quotes are not in the JSON text",
        ),
        (r"C:\\tmp", 1, "backslashes are matched JSON-escaped"),
        (
            r#""agent_name":"gamma","recorded_at""#,
            2,
            "compact JSON with keys in sorted order",
        ),
        (&envelope, 2, "the stored envelope is part of the text"),
        ("no such text", 0, "absent text"),
    ];
    for (needle, expected, rule) in cases {
        let query = RunQuery {
            thread_id: Some(thread.clone()),
            contains: Some(needle.to_owned()),
            ..Default::default()
        };
        assert_eq!(
            runs.find_task_records(&auth, &query).await.unwrap().len(),
            expected,
            "task records containing {needle:?}: {rule}"
        );
    }
    for (needle, expected, rule) in [
        ("Grüße", 1, "non-ASCII matched as is"),
        (r#""alpha":2,"note""#, 2, "report keys in sorted order"),
        (r#""zeta":1,"alpha""#, 0, "not in insertion order"),
        (
            envelope.as_str(),
            2,
            "the stored envelope is part of the text",
        ),
    ] {
        let query = RunQuery {
            thread_id: Some(thread.clone()),
            contains: Some(needle.to_owned()),
            ..Default::default()
        };
        assert_eq!(
            runs.find_run_reports(&auth, &query).await.unwrap().len(),
            expected,
            "run reports containing {needle:?}: {rule}"
        );
    }
}

/// A [`StepStore`](crate::StepStore) writes history and task log together: both land, and a
/// stale lease or an unknown task writes neither.
pub async fn step_store_writes_history_and_log_together(
    steps: &dyn crate::StepStore,
    tasks: &dyn TaskManager,
    threads: &dyn ThreadStore,
) {
    let auth = fresh_tenant();
    let task = Task::create(Message::user("q"));
    tasks.save_task(&auth, &task).await.unwrap();
    let lease = threads
        .acquire_lease(&auth, &task.thread_id, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let event = TaskEvent::Message {
        message: Message::agent("a"),
    };
    let history = [LlmMessage::assistant("a", vec![]), LlmMessage::user("b")];
    steps
        .persist_step(
            &auth,
            &lease,
            &history,
            &task.id,
            std::slice::from_ref(&event),
        )
        .await
        .unwrap();
    let stored = threads
        .read_history(&auth, &task.thread_id, 0, 10)
        .await
        .unwrap();
    assert_eq!(
        stored.iter().map(|e| e.message.clone()).collect::<Vec<_>>(),
        history,
        "history lands in order"
    );
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        vec![event.clone()],
        "the log entry lands"
    );

    let err = steps
        .persist_step(
            &auth,
            &lease,
            &history,
            &TaskId::new(),
            std::slice::from_ref(&event),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::TaskNotFound { .. }),
        "unknown task: {err:?}"
    );
    assert_eq!(
        threads
            .read_history(&auth, &task.thread_id, 0, 10)
            .await
            .unwrap()
            .len(),
        2,
        "nothing written for an unknown task"
    );

    threads.release_lease(&auth, &lease).await.unwrap();
    let _next = threads
        .acquire_lease(&auth, &task.thread_id, "w2", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let err = steps
        .persist_step(
            &auth,
            &lease,
            &history,
            &task.id,
            std::slice::from_ref(&event),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { .. }),
        "stale lease: {err:?}"
    );
    assert_eq!(
        threads
            .read_history(&auth, &task.thread_id, 0, 10)
            .await
            .unwrap()
            .len(),
        2,
        "nothing written with a stale lease"
    );
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap().len(),
        1,
        "no log entry with a stale lease"
    );
}

/// Run every check of the system-level stores: thread timers and the tenant listing. Kept
/// apart from [`run_all`] so a backend without timers can still run the rest.
pub async fn run_all_system(timers: Arc<dyn crate::ThreadTimers>, tasks: &dyn TaskManager) {
    timers_schedule_list_and_cancel(timers.as_ref()).await;
    timers_claim_only_what_is_due_and_reclaim_after_the_claim_lapses(timers.as_ref()).await;
    timers_are_claimed_once_under_contention(timers.clone()).await;
    timers_are_claimed_only_by_their_agent(timers.as_ref()).await;
    task_manager_lists_every_tenant(tasks).await;
}

/// The agent the timer checks schedule for (the one that claims them).
const TIMER_AGENT: &str = "conformance-agent";

/// The claims of `claimed` that belong to `auth` (a shared store may hold other tests' timers).
fn claims_of(claimed: Vec<crate::ClaimedTimer>, auth: &AuthContext) -> Vec<crate::ClaimedTimer> {
    claimed
        .into_iter()
        .filter(|c| &c.timer.auth == auth)
        .collect()
}

/// Timers are tenant-scoped: listed per thread soonest first, invisible to and not cancelable
/// by another tenant, and canceled exactly once.
pub async fn timers_schedule_list_and_cancel(timers: &dyn crate::ThreadTimers) {
    let (auth, other) = (fresh_tenant(), fresh_tenant());
    let thread = fresh_thread();
    let now = Utc::now();
    let later = timers
        .schedule_timer(
            &auth,
            &thread,
            TIMER_AGENT,
            "later",
            json!({"n": 2}),
            now + chrono::Duration::hours(2),
        )
        .await
        .unwrap();
    let sooner = timers
        .schedule_timer(
            &auth,
            &thread,
            TIMER_AGENT,
            "sooner",
            json!({"n": [1, "ü"]}),
            now + chrono::Duration::hours(1),
        )
        .await
        .unwrap();
    assert_ne!(later.id, sooner.id, "ids are unique");
    assert_eq!(sooner.auth, auth, "the record carries its tenant");
    assert_eq!(sooner.attempts, 0, "a new timer was never claimed");
    let listed = timers.thread_timers(&auth, &thread).await.unwrap();
    assert_eq!(
        listed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [sooner.id.as_str(), later.id.as_str()],
        "a thread's timers are listed soonest first"
    );
    assert_eq!(listed[0], sooner, "a timer round-trips");
    assert!(
        timers
            .thread_timers(&other, &thread)
            .await
            .unwrap()
            .is_empty(),
        "another tenant sees no timers"
    );
    assert!(
        timers
            .thread_timers(&auth, &fresh_thread())
            .await
            .unwrap()
            .is_empty(),
        "another thread has no timers"
    );
    assert!(
        !timers.cancel_timer(&other, &sooner.id).await.unwrap(),
        "another tenant cannot cancel a timer"
    );
    assert!(
        timers.cancel_timer(&auth, &sooner.id).await.unwrap(),
        "cancel removes the timer"
    );
    assert!(
        !timers.cancel_timer(&auth, &sooner.id).await.unwrap(),
        "a second cancel finds nothing"
    );
    assert!(
        !timers.cancel_timer(&auth, "no-such-timer").await.unwrap(),
        "unknown id is false"
    );
    assert_eq!(
        timers.thread_timers(&auth, &thread).await.unwrap(),
        vec![later.clone()],
        "the other timer stays"
    );
    let claimed = claims_of(
        timers
            .claim_due_timers(
                TIMER_AGENT,
                now + chrono::Duration::hours(3),
                1000,
                Duration::from_secs(60),
            )
            .await
            .unwrap(),
        &auth,
    );
    assert_eq!(
        claimed
            .iter()
            .map(|c| c.timer.id.as_str())
            .collect::<Vec<_>>(),
        [later.id.as_str()],
        "a canceled timer is never claimed"
    );
    assert!(
        timers.cancel_timer(&auth, &later.id).await.unwrap(),
        "a claimed timer can be canceled"
    );
    assert!(
        !timers.complete_timer(&claimed[0]).await.unwrap(),
        "completing a canceled timer is false"
    );
}

/// Only due timers are claimed; a live claim hides a timer from other claimers, a lapsed one
/// lets it be claimed again (at least once), and only the current claim completes it.
pub async fn timers_claim_only_what_is_due_and_reclaim_after_the_claim_lapses(
    timers: &dyn crate::ThreadTimers,
) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let now = Utc::now();
    let due_at = now + chrono::Duration::hours(1);
    let timer = timers
        .schedule_timer(&auth, &thread, TIMER_AGENT, "ping", json!(null), due_at)
        .await
        .unwrap();
    let next = timers
        .next_timer_at(TIMER_AGENT)
        .await
        .unwrap()
        .expect("a timer is stored");
    assert!(
        next <= due_at,
        "next_timer_at is no later than the soonest timer"
    );
    let ttl = Duration::from_secs(60);
    assert!(
        claims_of(
            timers
                .claim_due_timers(TIMER_AGENT, now, 1000, ttl)
                .await
                .unwrap(),
            &auth
        )
        .is_empty(),
        "a timer that is not due is not claimed"
    );
    assert!(
        matches!(
            timers
                .claim_due_timers(TIMER_AGENT, now, 10, Duration::ZERO)
                .await,
            Err(AgentError::InvalidInput { .. })
        ),
        "a zero claim TTL is invalid input"
    );
    let at = due_at + chrono::Duration::seconds(1);
    let first = claims_of(
        timers
            .claim_due_timers(TIMER_AGENT, at, 1000, ttl)
            .await
            .unwrap(),
        &auth,
    );
    assert_eq!(first.len(), 1, "a due timer is claimed");
    assert_eq!(first[0].timer.id, timer.id);
    assert_eq!(first[0].timer.attempts, 1, "the first claim is attempt 1");
    assert_eq!(first[0].timer.payload, json!(null));
    assert!(
        claims_of(
            timers
                .claim_due_timers(TIMER_AGENT, at + chrono::Duration::seconds(30), 1000, ttl)
                .await
                .unwrap(),
            &auth
        )
        .is_empty(),
        "a live claim hides the timer"
    );
    assert_eq!(
        timers.thread_timers(&auth, &thread).await.unwrap().len(),
        1,
        "a claimed timer is still listed"
    );
    let lapsed = at + chrono::Duration::seconds(61);
    let second = claims_of(
        timers
            .claim_due_timers(TIMER_AGENT, lapsed, 1000, ttl)
            .await
            .unwrap(),
        &auth,
    );
    assert_eq!(
        second.len(),
        1,
        "a lapsed claim makes the timer claimable again"
    );
    assert_eq!(second[0].timer.attempts, 2, "the second claim is attempt 2");
    assert_ne!(
        second[0].claim, first[0].claim,
        "each claim has its own token"
    );
    assert!(
        !timers.complete_timer(&first[0]).await.unwrap(),
        "a lapsed claim cannot complete the timer"
    );
    assert!(
        timers.complete_timer(&second[0]).await.unwrap(),
        "the live claim completes it"
    );
    assert!(
        timers
            .thread_timers(&auth, &thread)
            .await
            .unwrap()
            .is_empty(),
        "a completed timer is gone"
    );
    assert!(
        !timers.complete_timer(&second[0]).await.unwrap(),
        "completing twice is false"
    );
}

/// Claimers racing on one store never get the same timer: every due timer is claimed by
/// exactly one of them.
pub async fn timers_are_claimed_once_under_contention(timers: Arc<dyn crate::ThreadTimers>) {
    let auth = fresh_tenant();
    let now = Utc::now();
    let mut ids = HashSet::new();
    for i in 0..20 {
        let timer = timers
            .schedule_timer(
                &auth,
                &fresh_thread(),
                TIMER_AGENT,
                "tick",
                json!(i),
                now - chrono::Duration::seconds(1),
            )
            .await
            .unwrap();
        ids.insert(timer.id);
    }
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let timers = timers.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..10 {
                    got.extend(
                        timers
                            .claim_due_timers(TIMER_AGENT, now, 3, Duration::from_secs(600))
                            .await
                            .unwrap(),
                    );
                }
                got
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for claimer in claimers {
        claimed.extend(claims_of(claimer.await.unwrap(), &auth));
    }
    let claimed_ids: Vec<String> = claimed.iter().map(|c| c.timer.id.clone()).collect();
    let unique: HashSet<String> = claimed_ids.iter().cloned().collect();
    assert_eq!(unique.len(), claimed_ids.len(), "no timer is claimed twice");
    assert_eq!(unique, ids, "every due timer is claimed");
    for claim in &claimed {
        assert!(timers.complete_timer(claim).await.unwrap());
    }
}

/// A scheduler claims only its own agent's timers (and ownerless ones): two agents sharing a
/// store each get theirs, and `next_timer_at` looks only at what the agent would claim.
pub async fn timers_are_claimed_only_by_their_agent(timers: &dyn crate::ThreadTimers) {
    let auth = fresh_tenant();
    let thread = fresh_thread();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (a, b, idle) = (
        format!("agent-a-{unique}"),
        format!("agent-b-{unique}"),
        format!("agent-idle-{unique}"),
    );
    let now = Utc::now();
    let past = now - chrono::Duration::seconds(1);
    let ta = timers
        .schedule_timer(&auth, &thread, &a, "tick", json!("a"), past)
        .await
        .unwrap();
    assert_eq!(ta.agent, a, "the record names its agent");
    let tb = timers
        .schedule_timer(&auth, &thread, &b, "tick", json!("b"), past)
        .await
        .unwrap();
    let far = now + chrono::Duration::hours(1);
    let ta_far = timers
        .schedule_timer(&auth, &thread, &a, "later", json!("a2"), far)
        .await
        .unwrap();
    assert_eq!(
        timers.next_timer_at(&idle).await.unwrap(),
        None,
        "an agent with no timers has nothing to wait for"
    );
    let next_b = timers
        .next_timer_at(&b)
        .await
        .unwrap()
        .expect("b has a timer");
    assert!(
        next_b <= tb.due_at,
        "next_timer_at sees the agent's own timer"
    );
    let ttl = Duration::from_secs(60);
    assert!(
        claims_of(
            timers
                .claim_due_timers(&idle, now, 1000, ttl)
                .await
                .unwrap(),
            &auth
        )
        .is_empty(),
        "an agent claims no other agent's timers"
    );
    let got_a = claims_of(
        timers.claim_due_timers(&a, now, 1000, ttl).await.unwrap(),
        &auth,
    );
    assert_eq!(
        got_a
            .iter()
            .map(|c| c.timer.id.as_str())
            .collect::<Vec<_>>(),
        [ta.id.as_str()],
        "agent a claims its due timer only"
    );
    assert_eq!(got_a[0].timer.agent, a, "a claimed timer names its agent");
    let next_a = timers
        .next_timer_at(&a)
        .await
        .unwrap()
        .expect("a has timers");
    assert!(
        next_a > now,
        "next_timer_at ignores other agents' due timers (b's is due, a's are claimed or later)"
    );
    let got_b = claims_of(
        timers.claim_due_timers(&b, now, 1000, ttl).await.unwrap(),
        &auth,
    );
    assert_eq!(
        got_b
            .iter()
            .map(|c| c.timer.id.as_str())
            .collect::<Vec<_>>(),
        [tb.id.as_str()],
        "agent b claims its own timer, untouched by a's claim"
    );
    // An ownerless timer (stored before timers had owners) goes to whichever agent claims.
    let legacy = timers
        .schedule_timer(&auth, &thread, "", "old", json!(null), past)
        .await
        .unwrap();
    let got_legacy = claims_of(
        timers
            .claim_due_timers(&idle, now, 1000, ttl)
            .await
            .unwrap(),
        &auth,
    );
    assert_eq!(
        got_legacy
            .iter()
            .map(|c| c.timer.id.as_str())
            .collect::<Vec<_>>(),
        [legacy.id.as_str()],
        "any agent claims an ownerless timer"
    );
    for claim in got_a.iter().chain(&got_b).chain(&got_legacy) {
        assert!(timers.complete_timer(claim).await.unwrap());
    }
    assert!(timers.cancel_timer(&auth, &ta_far.id).await.unwrap());
    assert_eq!(
        timers.next_timer_at(&b).await.unwrap(),
        None,
        "b's timer is gone"
    );
}

/// `tenants` lists every tenant that saved a task, with names that round-trip exactly.
pub async fn task_manager_lists_every_tenant(tasks: &dyn TaskManager) {
    let odd = AuthContext::new(
        format!("app:{}/x", uuid::Uuid::new_v4().simple()),
        "user/1:ü",
    );
    let plain = fresh_tenant();
    for auth in [&odd, &plain] {
        tasks
            .save_task(auth, &Task::create(Message::user("hi")))
            .await
            .unwrap();
    }
    let listed = tasks.tenants().await.unwrap();
    assert!(
        listed.contains(&odd),
        "a tenant with separators in its names is listed"
    );
    assert!(listed.contains(&plain), "every tenant with tasks is listed");
    let unique: HashSet<_> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "each tenant is listed once");
}
