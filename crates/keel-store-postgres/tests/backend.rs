//! PostgreSQL-specific behaviour: one tenant's rows are out of reach of another's through
//! every store method (tenants whose names run together, `ab`/`c` and `a`/`bc`, and the same
//! ids); two pools (two processes) on one schema; migrations at once and a schema newer than
//! this code; connections the server drops.

use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, RunId, Task, TaskEvent};
use keel_runtime::{
    AsyncCall, AsyncCallState, AsyncCallStore, AuthContext, ChildThread, ListTasksFilter,
    MemoryService, RunQuery, RunRecord, RunStore, StepStore, SubagentRegistry, TaskManager,
    TaskRecord, ThreadHistory, ThreadKv, ThreadLeases, ThreadQueue, ThreadTimers,
};
use keel_store_postgres::testing::TestSchema;
use keel_store_postgres::PostgresStore;
use serde_json::json;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn no_store_method_reaches_another_tenants_rows() {
    let schema = TestSchema::new().await.unwrap();
    let store = schema.store().await.unwrap();
    let (alice, mallory) = (AuthContext::new("ab", "c"), AuthContext::new("a", "bc"));

    // Alice's rows, one of each kind.
    let task = Task::create(Message::user("private"));
    let thread = task.thread_id.clone();
    let event = TaskEvent::Message {
        message: Message::user("private"),
    };
    store
        .save_task_with_events(&alice, &task, std::slice::from_ref(&event))
        .await
        .unwrap();
    store
        .save_serialized(&alice, "secret", json!("alice's"))
        .await
        .unwrap();
    store
        .kv_set(&alice, &thread, "secret", json!(1))
        .await
        .unwrap();
    let lease = store
        .acquire_lease(&alice, &thread, "alice", TTL)
        .await
        .unwrap()
        .unwrap();
    store
        .append_history(&alice, &lease, &[LlmMessage::user("private")])
        .await
        .unwrap();
    let item = store.push_queue(&alice, &thread, json!(1)).await.unwrap();
    let child = ChildThread {
        thread_id: thread.clone(),
        parent_thread_id: thread.clone(),
        name: "helper".into(),
        agent: "helper".into(),
        status: "running".into(),
        resumable: true,
        created_at: chrono::Utc::now(),
        metadata: Default::default(),
    };
    store.register_child(&alice, &child).await.unwrap();
    let timer = store
        .schedule_timer(&alice, &thread, "agent", "t", json!(1), chrono::Utc::now())
        .await
        .unwrap();
    let call = AsyncCall {
        call_id: "call-1".into(),
        auth: alice.clone(),
        thread_id: thread.clone(),
        state: AsyncCallState::Pending,
        record: json!({}),
    };
    store.put_async_call(&call).await.unwrap();
    store
        .save_task_record(&alice, &TaskRecord::of(&task, Some("agent")).unwrap())
        .await
        .unwrap();
    let run_id = RunId::new();
    let report = RunRecord {
        run_id: run_id.clone(),
        task_id: Some(task.id.clone()),
        thread_id: Some(thread.clone()),
        trace_id: None,
        agent_name: Some("agent".into()),
        recorded_at: chrono::Utc::now(),
        report: json!({}),
    };
    store.save_run_report(&alice, &report).await.unwrap();

    // Tasks.
    assert_eq!(store.get_task(&mallory, &task.id).await.unwrap(), None);
    let not_found = |err: AgentError| matches!(err, AgentError::TaskNotFound { .. });
    assert!(not_found(
        store.get_task_events(&mallory, &task.id).await.unwrap_err()
    ));
    assert!(not_found(
        store
            .add_task_event(&mallory, &task.id, &event)
            .await
            .unwrap_err()
    ));
    let listed = store
        .list_tasks(&mallory, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!((listed.items.len(), listed.total_size), (0, 0));
    // Memory.
    assert_eq!(
        store.load_serialized(&mallory, "secret").await.unwrap(),
        None
    );
    assert!(!store.delete(&mallory, "secret").await.unwrap());
    // Threads: history, queue, key-value store, subagents.
    assert!(store
        .read_history(&mallory, &thread, 0, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.queue_len(&mallory, &thread).await.unwrap(), 0);
    assert_eq!(store.tenant_queue_len(&mallory).await.unwrap(), 0);
    assert!(store.queued_threads(&mallory).await.unwrap().is_empty());
    assert!(store
        .peek_queue(&mallory, &thread, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.kv_get(&mallory, &thread, "secret").await.unwrap(),
        None
    );
    assert!(store.kv_keys(&mallory, &thread).await.unwrap().is_empty());
    assert_eq!(store.child(&mallory, &thread).await.unwrap(), None);
    assert!(store.children(&mallory, &thread).await.unwrap().is_empty());
    let err = store
        .set_child_status(&mallory, &thread, "done")
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
    // Alice's lease fences nothing of Mallory's, and Mallory's nothing of Alice's.
    for err in [
        store
            .append_history(&mallory, &lease, &[LlmMessage::user("forged")])
            .await
            .unwrap_err(),
        store
            .ack_queue(&mallory, &lease, std::slice::from_ref(&item.id))
            .await
            .unwrap_err(),
        store
            .persist_step(
                &mallory,
                &lease,
                &[],
                &task.id,
                std::slice::from_ref(&event),
            )
            .await
            .unwrap_err(),
        store.renew_lease(&mallory, &lease, TTL).await.unwrap_err(),
    ] {
        assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
    }
    store.release_lease(&mallory, &lease).await.unwrap();
    let theirs = store
        .acquire_lease(&mallory, &thread, "mallory", TTL)
        .await
        .unwrap()
        .expect("the same thread id is another thread in another tenant");
    let err = store
        .persist_step(
            &mallory,
            &theirs,
            &[],
            &task.id,
            std::slice::from_ref(&event),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::TaskNotFound { .. }), "{err:?}");
    store
        .ack_queue(&mallory, &theirs, std::slice::from_ref(&item.id))
        .await
        .unwrap();
    // Timers, asynchronous calls, runs.
    assert!(!store.cancel_timer(&mallory, &timer.id).await.unwrap());
    assert!(store
        .thread_timers(&mallory, &thread)
        .await
        .unwrap()
        .is_empty());
    assert!(!store
        .transition_async_call(
            &mallory,
            "call-1",
            AsyncCallState::Pending,
            AsyncCallState::Delivered,
            json!({"forged": true}),
        )
        .await
        .unwrap());
    assert_eq!(store.get_run_report(&mallory, &run_id).await.unwrap(), None);
    let everything = RunQuery::default();
    assert!(store
        .find_task_records(&mallory, &everything)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .find_run_reports(&mallory, &everything)
        .await
        .unwrap()
        .is_empty());

    // Alice still has all of it, untouched.
    assert_eq!(
        store.get_task_events(&alice, &task.id).await.unwrap(),
        [event]
    );
    assert_eq!(store.queue_len(&alice, &thread).await.unwrap(), 1);
    assert_eq!(
        store
            .read_history(&alice, &thread, 0, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.thread_timers(&alice, &thread).await.unwrap().len(), 1);
    assert_eq!(
        store
            .find_async_call("call-1")
            .await
            .unwrap()
            .unwrap()
            .state,
        AsyncCallState::Pending
    );
    assert_eq!(store.child(&alice, &thread).await.unwrap(), Some(child));
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_holder_in_another_pool_is_refused_and_writes_nothing() {
    let schema = TestSchema::new().await.unwrap();
    let (a, b) = (schema.store().await.unwrap(), schema.store().await.unwrap());
    let auth = AuthContext::new("acme", "ops");
    let task = Task::create(Message::user("hi"));
    let thread = task.thread_id.clone();
    a.save_task(&auth, &task).await.unwrap();
    let old = a
        .acquire_lease(&auth, &thread, "a", Duration::from_millis(1))
        .await
        .unwrap()
        .unwrap();
    // `b` takes the thread over once `a`'s lease lapsed.
    let new = keel_runtime::testing::eventually("b takes the lapsed lease", || async {
        b.acquire_lease(&auth, &thread, "b", TTL).await.unwrap()
    })
    .await;
    assert!(new.token > old.token);
    let event = TaskEvent::Message {
        message: Message::user("late"),
    };
    let err = a
        .persist_step(&auth, &old, &[LlmMessage::user("late")], &task.id, &[event])
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::LeaseLost { token, .. } if token == old.token),
        "{err:?}"
    );
    // Nothing of the refused step was written: neither history nor log.
    assert!(b
        .read_history(&auth, &thread, 0, 10)
        .await
        .unwrap()
        .is_empty());
    assert!(b.get_task_events(&auth, &task.id).await.unwrap().is_empty());
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn many_pools_connecting_at_once_migrate_a_new_schema_once() {
    let schema = TestSchema::new().await.unwrap();
    let connects = (0..6).map(|_| {
        let schema = schema.clone();
        tokio::spawn(async move { schema.store().await.map(|_| ()) })
    });
    for connect in connects {
        connect.await.unwrap().unwrap();
    }
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_newer_than_this_code_is_refused() {
    let schema = TestSchema::new().await.unwrap();
    drop(schema.store().await.unwrap());
    let (client, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("UPDATE keel_schema_version SET version = version + 1")
        .await
        .unwrap();
    let err = schema.store().await.unwrap_err();
    assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");
    assert!(err.to_string().contains("newer"), "{err}");
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_port_is_store_unavailable() {
    let err = PostgresStore::connect("postgres://postgres@127.0.0.1:1/test?sslmode=disable")
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::StoreUnavailable { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_the_server_drops_are_replaced_and_a_step_commits_whole_or_not_at_all() {
    let schema = TestSchema::new().await.unwrap();
    let name = format!("keel_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::connect_with_pool_size(&schema.url_named(&name), 2)
        .await
        .unwrap();
    let auth = AuthContext::new("acme", "ops");
    let task = Task::create(Message::user("hi"));
    store.save_task(&auth, &task).await.unwrap();
    let lease = store
        .acquire_lease(&auth, &task.thread_id, "a", TTL)
        .await
        .unwrap()
        .unwrap();
    let mut committed = 0;
    for round in 0..5 {
        // The server drops every connection of the store's pool, as a restart does.
        schema.end_connections(&name).await.unwrap();
        let event = TaskEvent::Message {
            message: Message::user(format!("step {round}")),
        };
        let history = [LlmMessage::user(format!("step {round}"))];
        // A call on a dropped connection fails as unavailable; the pool then connects anew.
        let written = keel_runtime::testing::eventually("a step commits", || async {
            match store
                .persist_step(
                    &auth,
                    &lease,
                    &history,
                    &task.id,
                    std::slice::from_ref(&event),
                )
                .await
            {
                Ok(()) => Some(()),
                Err(AgentError::StoreUnavailable { .. }) => None,
                Err(other) => panic!("{other:?}"),
            }
        })
        .await;
        let () = written;
        committed += 1;
    }
    // Each step's rows are there once: none half-written, none twice.
    let history = store
        .read_history(&auth, &task.thread_id, 0, 100)
        .await
        .unwrap();
    let events = store.get_task_events(&auth, &task.id).await.unwrap();
    assert_eq!((history.len(), events.len()), (committed, committed));
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tls_failure_is_a_storage_error_that_names_sslmode() {
    // The test server either offers TLS with a certificate this machine does not trust
    // (Debian's default) or no TLS at all: `sslmode=require` fails the handshake either way.
    let url =
        keel_store_postgres::testing::server_url().replace("sslmode=disable", "sslmode=require");
    let err = PostgresStore::connect(&url).await.unwrap_err();
    assert!(matches!(err, AgentError::Storage { .. }), "{err:?}");
    assert!(err.to_string().contains("sslmode=disable"), "{err}");
}
