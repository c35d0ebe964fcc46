//! PostgreSQL-specific behaviour: one tenant's rows are out of reach of another's through
//! every store method (the conformance suite's tenancy check, on Postgres's own wiring); two
//! pools (two processes) on one schema; migrations at once and a schema newer than this
//! code; connections the server drops.

use std::sync::Arc;
use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, Task, TaskEvent};
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, StepStore, TaskManager, TaskWrite, ThreadHistory, ThreadLeases};
use keel_store_postgres::testing::TestSchema;
use keel_store_postgres::PostgresStore;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn no_store_method_reaches_another_tenants_rows() {
    let (schema, store) = TestSchema::with_store().await.unwrap();
    let services = store.services(Arc::new(MockLlm::new()));
    keel_runtime::testing::no_store_method_reaches_another_tenants_rows(&services).await;
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
    // `b` takes the thread over once `a`'s lease lapsed.
    let (old, _new) = keel_runtime::testing::lease_taken_over(&a, &b, &auth, &thread).await;
    let event = TaskEvent::Message {
        message: Message::user("late"),
    };
    let err = a
        .persist_step(
            &auth,
            &old,
            &[LlmMessage::user("late")],
            &task,
            TaskWrite::LogOnly,
            &[event],
        )
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
    let (name, store) = schema.named_store().await.unwrap();
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
                    &task,
                    TaskWrite::LogOnly,
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
