//! LISTEN/NOTIFY across pools (as across processes): a store hears the task events and the
//! memory values (cancel requests) another pool commits, and its listener comes back after
//! the server drops it, saying that changes may have been missed.

use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{Message, Task, TaskEvent, TaskId};
use keel_runtime::{AuthContext, MemoryService, StepStore, TaskManager, TaskWrite, ThreadLeases};
use keel_store_postgres::testing::TestSchema;
use keel_store_postgres::{Changes, PostgresStore, StoreChange};
use serde_json::json;

/// A bound on waiting for a change that must come, so that a broken listener fails the test
/// rather than hanging it (never a measure of how soon it came).
const AT_MOST: Duration = Duration::from_secs(60);

/// The next change other than [`StoreChange::Missed`].
async fn next_change(changes: &mut Changes) -> StoreChange {
    tokio::time::timeout(AT_MOST, async {
        loop {
            match changes.recv().await.expect("the store is alive") {
                StoreChange::Missed => {}
                change => return change,
            }
        }
    })
    .await
    .expect("a change was heard")
}

fn message(text: &str) -> TaskEvent {
    TaskEvent::Message {
        message: Message::user(text),
    }
}

fn events_of(auth: &AuthContext, task_id: &TaskId) -> StoreChange {
    StoreChange::TaskEvents {
        auth: auth.clone(),
        task_id: task_id.clone(),
        own_write: false,
    }
}

/// A fresh schema with two stores on it (two pools, as two processes): one listening, with
/// its changes, and one writing; and the tenant the tests write as.
struct TwoPools {
    schema: TestSchema,
    listener: PostgresStore,
    changes: Changes,
    writer: PostgresStore,
    auth: AuthContext,
}

impl TwoPools {
    async fn new() -> Self {
        let schema = TestSchema::new().await.unwrap();
        let (listener, writer) = (schema.store().await.unwrap(), schema.store().await.unwrap());
        let changes = listener.changes().await.unwrap();
        let auth = AuthContext::new("acme", "ops");
        Self {
            schema,
            listener,
            changes,
            writer,
            auth,
        }
    }

    /// Check that the next change the listener hears, other than [`StoreChange::Missed`], is
    /// `expected`.
    async fn hears(&mut self, expected: StoreChange) {
        assert_eq!(next_change(&mut self.changes).await, expected);
    }

    /// Close both pools, then drop the schema.
    async fn drop_schema(self) {
        let Self {
            schema,
            listener,
            changes,
            writer,
            ..
        } = self;
        drop((listener, writer));
        schema.drop_schema().await.unwrap();
        drop(changes);
    }
}

/// Save `task` with one message event `text` through `writer`, and wait until `changes`
/// hears it.
async fn save_and_hear(
    writer: &PostgresStore,
    changes: &mut Changes,
    auth: &AuthContext,
    task: &Task,
    text: &str,
) {
    writer
        .save_task_with_events(auth, task, &[message(text)])
        .await
        .unwrap();
    assert_eq!(next_change(changes).await, events_of(auth, &task.id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_hears_its_own_writes_as_its_own_and_another_pools_as_not() {
    let mut pools = TwoPools::new().await;
    let auth = pools.auth.clone();
    let (mine, theirs) = (
        Task::create(Message::user("mine")),
        Task::create(Message::user("theirs")),
    );
    pools
        .listener
        .save_task_with_events(&auth, &mine, &[message("mine")])
        .await
        .unwrap();
    pools
        .hears(StoreChange::TaskEvents {
            auth: auth.clone(),
            task_id: mine.id.clone(),
            own_write: true,
        })
        .await;
    save_and_hear(&pools.writer, &mut pools.changes, &auth, &theirs, "theirs").await;
    pools.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_events_appended_through_another_pool_are_heard() {
    let mut pools = TwoPools::new().await;
    let auth = pools.auth.clone();
    let task = Task::create(Message::user("hi"));

    // A snapshot saved with events, an event appended, a persisted step: each is heard.
    save_and_hear(&pools.writer, &mut pools.changes, &auth, &task, "one").await;
    pools
        .writer
        .add_task_event(&auth, &task.id, &message("two"))
        .await
        .unwrap();
    pools.hears(events_of(&auth, &task.id)).await;
    let lease = pools
        .writer
        .acquire_lease(&auth, &task.thread_id, "w", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    pools
        .writer
        .persist_step(
            &auth,
            &lease,
            &[LlmMessage::user("three")],
            &task,
            TaskWrite::LogOnly,
            &[message("three")],
        )
        .await
        .unwrap();
    pools.hears(events_of(&auth, &task.id)).await;
    // What was heard is what the log holds.
    let heard = pools.listener.get_task_events(&auth, &task.id).await;
    assert_eq!(heard.unwrap().len(), 3);
    pools.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_request_saved_through_another_pool_is_heard() {
    let mut pools = TwoPools::new().await;
    let auth = pools.auth.clone();
    let key = format!("keel:cancel:{}", TaskId::new());
    pools
        .writer
        .save_serialized_with_ttl(&auth, &key, json!("stop"), Duration::from_secs(60))
        .await
        .unwrap();
    pools
        .hears(StoreChange::Memory {
            auth: auth.clone(),
            key: key.clone(),
        })
        .await;
    // A claim that stores nothing is not announced; one that stores is.
    assert!(!pools
        .writer
        .save_if_absent(&auth, &key, json!("again"), Duration::from_secs(60))
        .await
        .unwrap());
    let other = format!("{key}-2");
    assert!(pools
        .writer
        .save_if_absent(&auth, &other, json!("x"), Duration::from_secs(60))
        .await
        .unwrap());
    pools.hears(StoreChange::Memory { auth, key: other }).await;
    pools.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stores_in_other_schemas_are_not_heard() {
    let (ours, theirs) = (
        TestSchema::new().await.unwrap(),
        TestSchema::new().await.unwrap(),
    );
    let listener = ours.store().await.unwrap();
    let (writer, stranger) = (ours.store().await.unwrap(), theirs.store().await.unwrap());
    let mut changes = listener.changes().await.unwrap();
    let auth = AuthContext::new("acme", "ops");
    let (mine, other) = (
        Task::create(Message::user("mine")),
        Task::create(Message::user("theirs")),
    );
    // The other schema's write commits first; the first change heard is still ours.
    stranger
        .save_task_with_events(&auth, &other, &[message("theirs")])
        .await
        .unwrap();
    save_and_hear(&writer, &mut changes, &auth, &mine, "mine").await;
    drop((listener, writer, stranger));
    ours.drop_schema().await.unwrap();
    theirs.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_listener_comes_back_after_the_server_drops_it_and_says_changes_were_missed() {
    let schema = TestSchema::new().await.unwrap();
    let (name, listener) = schema.named_store().await.unwrap();
    let writer = schema.store().await.unwrap();
    let mut changes = listener.changes().await.unwrap();
    // Its first LISTEN is announced too (what came before it was not heard).
    assert_eq!(changes.recv().await, Some(StoreChange::Missed));
    schema.end_connections(&name).await.unwrap();
    // Listening again, it says so before anything else.
    let again = tokio::time::timeout(AT_MOST, changes.recv()).await.unwrap();
    assert_eq!(again, Some(StoreChange::Missed));
    let auth = AuthContext::new("acme", "ops");
    let task = Task::create(Message::user("hi"));
    save_and_hear(&writer, &mut changes, &auth, &task, "after").await;
    drop((listener, writer));
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_listener_ends_with_the_last_clone_of_its_store() {
    let (schema, store) = TestSchema::with_store().await.unwrap();
    let mut changes = store.clone().changes().await.unwrap();
    assert_eq!(changes.recv().await, Some(StoreChange::Missed));
    drop(store);
    let ended = tokio::time::timeout(AT_MOST, changes.recv()).await.unwrap();
    assert_eq!(ended, None);
    schema.drop_schema().await.unwrap();
}
