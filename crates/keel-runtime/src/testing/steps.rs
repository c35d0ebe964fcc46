//! Conformance check of [`StepStore`](crate::StepStore): history and task log are written
//! together or not at all.

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, Task, TaskEvent, TaskId};

use super::{assert_lease_lost, fresh_tenant, history_len, leased, try_lease};
use crate::{TaskManager, ThreadStore};

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
    let lease = leased(threads, &auth, &task.thread_id).await;
    let event = TaskEvent::Message {
        message: Message::agent("a"),
    };
    let history = [LlmMessage::assistant("a", vec![]), LlmMessage::user("b")];
    let unknown_task = TaskId::new();
    // The step under test, with the lease and task varied by each case.
    let persist = |lease, task_id| {
        steps.persist_step(
            &auth,
            lease,
            &history,
            task_id,
            std::slice::from_ref(&event),
        )
    };
    persist(&lease, &task.id).await.unwrap();
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

    let err = persist(&lease, &unknown_task).await.unwrap_err();
    assert!(
        matches!(err, AgentError::TaskNotFound { .. }),
        "unknown task: {err:?}"
    );
    assert_eq!(
        history_len(threads, &auth, &task.thread_id).await,
        2,
        "nothing written for an unknown task"
    );

    threads.release_lease(&auth, &lease).await.unwrap();
    try_lease(threads, &auth, &task.thread_id, "w2")
        .await
        .expect("a released thread is free");
    assert_lease_lost(persist(&lease, &task.id).await, "stale lease");
    assert_eq!(
        history_len(threads, &auth, &task.thread_id).await,
        2,
        "nothing written with a stale lease"
    );
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap().len(),
        1,
        "no log entry with a stale lease"
    );
}
