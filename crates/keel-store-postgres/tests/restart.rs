//! A database restart under load, on a private PostgreSQL this test starts from the installed
//! binaries (never the shared server other tests use): writers keep persisting steps while the
//! server restarts; a write refused meanwhile is `StoreUnavailable`, every acknowledged write
//! is there afterwards, the pool and the change listener come back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, Task, TaskEvent};
use keel_runtime::{AuthContext, StepStore, TaskManager, TaskWrite, ThreadHistory, ThreadLeases};
use keel_store_postgres::testing::PrivateServer;
use keel_store_postgres::{PostgresStore, StoreChange};

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_under_load_loses_no_acknowledged_step_and_the_store_comes_back() {
    let Some(server) = PrivateServer::start() else {
        panic!("no PostgreSQL is installed (/usr/lib/postgresql/*/bin) to start a private one");
    };
    let store = PostgresStore::connect_with_pool_size(&server.url(), 4)
        .await
        .unwrap();
    let mut changes = store.changes().await.unwrap();
    // The first LISTEN's announcement.
    assert_eq!(changes.recv().await, Some(StoreChange::Missed));
    let auth = AuthContext::new("acme", "ops");
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    let (writing_tx, mut writing) = tokio::sync::mpsc::unbounded_channel();
    for w in 0..4 {
        let task = Task::create(Message::user("hi"));
        store.save_task(&auth, &task).await.unwrap();
        let lease = store
            .acquire_lease(&auth, &task.thread_id, "w", Duration::from_secs(600))
            .await
            .unwrap()
            .unwrap();
        let (store, auth, stop) = (store.clone(), auth.clone(), stop.clone());
        let writing_tx = writing_tx.clone();
        writers.push(tokio::spawn(async move {
            let (mut acknowledged, mut refused) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) || acknowledged < 20 {
                let text = format!("writer {w} step {acknowledged}");
                let event = TaskEvent::Message {
                    message: Message::user(text.clone()),
                };
                match store
                    .persist_step(
                        &auth,
                        &lease,
                        &[LlmMessage::user(text)],
                        &task,
                        TaskWrite::LogOnly,
                        &[event],
                    )
                    .await
                {
                    Ok(()) => {
                        acknowledged += 1;
                        if acknowledged == 1 {
                            let _ = writing_tx.send(());
                        }
                    }
                    Err(AgentError::StoreUnavailable { .. }) => {
                        refused += 1;
                        // A retry's pace while the server is away, not a wait for it.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(other) => panic!("a restart is StoreUnavailable, not {other:?}"),
                }
            }
            (task, acknowledged, refused)
        }));
    }
    for _ in 0..4 {
        writing.recv().await.unwrap();
    }
    // Under load, the server restarts (a fast shutdown: clients' connections are dropped).
    tokio::task::block_in_place(|| server.restart());
    stop.store(true, Ordering::Relaxed);
    let mut refused_in_all = 0;
    for writer in writers {
        let (task, acknowledged, refused) = writer.await.unwrap();
        refused_in_all += refused;
        // A step is there exactly as often as it was acknowledged, or once more when its
        // commit landed as the connection broke (the caller then saw it refused): never less.
        let events = store.get_task_events(&auth, &task.id).await.unwrap();
        let history = store
            .read_history(&auth, &task.thread_id, 0, 100_000)
            .await
            .unwrap();
        assert_eq!(events.len(), history.len(), "a step's rows commit together");
        assert!(
            events.len() >= acknowledged && events.len() <= acknowledged + refused,
            "{} stored, {acknowledged} acknowledged, {refused} refused",
            events.len()
        );
    }
    println!("refused during the restart: {refused_in_all}");
    // The listener is back, and says changes may have been missed.
    let back = tokio::time::timeout(Duration::from_secs(60), async {
        while changes.recv().await != Some(StoreChange::Missed) {}
    })
    .await;
    assert!(back.is_ok(), "the listener reconnected");
}
