//! Conformance check of [`StepStore`](crate::StepStore): history and task log are written
//! together or not at all.

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, Task, TaskEvent, TaskState};
use serde_json::{json, Value};

use keel_core::stored::JsonText;

use super::runs::report_of;
use super::{
    assert_lease_lost, assert_task_not_found, fresh_tenant, history_len, leased, tenant_and_thread,
    try_lease,
};
use crate::TaskWrite::{LogOnly, SnapshotAndLog};
use crate::{RunRecord, RunStore, TaskManager, ThreadStore};

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
    let unknown_task = Task::new(task.thread_id.clone());
    // The step under test, with the lease and task varied by each case.
    let persist = |lease, task| {
        steps.persist_step(
            &auth,
            lease,
            &history,
            task,
            LogOnly,
            std::slice::from_ref(&event),
        )
    };
    persist(&lease, &task).await.unwrap();
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

    assert_task_not_found(persist(&lease, &unknown_task).await, "unknown task");
    assert_eq!(
        history_len(threads, &auth, &task.thread_id).await,
        2,
        "nothing written for an unknown task"
    );

    threads.release_lease(&auth, &lease).await.unwrap();
    try_lease(threads, &auth, &task.thread_id, "w2")
        .await
        .expect("a released thread is free");
    assert_lease_lost(persist(&lease, &task).await, "stale lease");
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

/// A [`StepStore`](crate::StepStore) that folds a run's writes (decision 260) writes each
/// fold whole: [`save_task_and_queue`](crate::StepStore::save_task_and_queue) leaves the task,
/// its log entries and its queue item; [`persist_step`](crate::StepStore::persist_step) with [`SnapshotAndLog`]
/// the task's new snapshot, its log entries and the history, and with a stale lease or for
/// an unknown task none of them.
pub async fn step_store_folds_a_task_with_its_queue_item_and_its_start(
    steps: &dyn crate::StepStore,
    tasks: &dyn TaskManager,
    threads: &dyn ThreadStore,
) {
    let auth = fresh_tenant();
    let mut task = Task::create(Message::user("q"));
    let message = TaskEvent::Message {
        message: Message::user("q"),
    };
    let payload = serde_json::json!({"task": task.id.as_str()});
    let item = steps
        .save_task_and_queue(
            &auth,
            &task,
            std::slice::from_ref(&message),
            payload.clone(),
        )
        .await
        .unwrap();
    let saved = tasks.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(saved.state(), task.state(), "the task is saved");
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        vec![message.clone()],
        "its log entry is saved with it"
    );
    let queued = threads
        .peek_queue(&auth, &task.thread_id, 10)
        .await
        .unwrap();
    assert_eq!(queued.len(), 1, "one item queued");
    assert_eq!((&queued[0].id, &queued[0].payload), (&item.id, &payload));

    let lease = leased(threads, &auth, &task.thread_id).await;
    task.begin().unwrap();
    let status = TaskEvent::status_of(&task, false);
    let input = [LlmMessage::user("q")];
    steps
        .persist_step(
            &auth,
            &lease,
            &input,
            &task,
            SnapshotAndLog,
            std::slice::from_ref(&status),
        )
        .await
        .unwrap();
    let saved = tasks.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(saved.state(), TaskState::Working, "the new status is saved");
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        vec![message.clone(), status.clone()],
        "the status event follows the message"
    );
    assert_eq!(history_len(threads, &auth, &task.thread_id).await, 1);

    let unknown = Task::new(task.thread_id.clone());
    let persisted = steps.persist_step(&auth, &lease, &input, &unknown, SnapshotAndLog, &[]);
    assert_task_not_found(persisted.await, "unknown task");
    assert!(
        tasks.get_task(&auth, &unknown.id).await.unwrap().is_none(),
        "an unknown task is not created"
    );

    threads.release_lease(&auth, &lease).await.unwrap();
    try_lease(threads, &auth, &task.thread_id, "w2")
        .await
        .expect("a released thread is free");
    let mut later = task.clone();
    later.fail("late").unwrap();
    assert_lease_lost(
        steps
            .persist_step(&auth, &lease, &input, &later, SnapshotAndLog, &[])
            .await,
        "stale lease",
    );
    let saved = tasks.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(
        saved.state(),
        TaskState::Working,
        "no snapshot with a stale lease"
    );
    assert_eq!(
        history_len(threads, &auth, &task.thread_id).await,
        1,
        "no history with a stale lease"
    );
}

/// A [`StepStore`](crate::StepStore) that folds a thread's last acknowledgement with its
/// lease's release ([`ack_and_release`](crate::StepStore::ack_and_release)) acknowledges the
/// item and frees the thread in one call; with a stale lease it is
/// [`AgentError::LeaseLost`], acknowledges nothing and leaves the new holder's lease alone.
/// A store that keeps the default ([`AgentError::Unsupported`]) passes as it is.
pub async fn step_store_acks_and_releases_in_one_write(
    steps: &dyn crate::StepStore,
    threads: &dyn ThreadStore,
) {
    let (auth, thread) = tenant_and_thread();
    let lease = leased(threads, &auth, &thread).await;
    let mut ids = Vec::new();
    for n in 0..2 {
        let item = threads
            .push_queue(&auth, &thread, serde_json::json!({ "n": n }))
            .await
            .unwrap();
        ids.push(item.id);
    }
    match steps.ack_and_release(&auth, &lease, &ids[..1]).await {
        Err(AgentError::Unsupported { .. }) => return,
        done => done.unwrap(),
    }
    let left = threads.peek_queue(&auth, &thread, 10).await.unwrap();
    assert_eq!(
        left.iter().map(|i| &i.id).collect::<Vec<_>>(),
        [&ids[1]],
        "the acknowledged item goes, the other stays"
    );
    let next = try_lease(threads, &auth, &thread, "w2")
        .await
        .expect("a released thread is free");

    assert_lease_lost(
        steps.ack_and_release(&auth, &lease, &ids[1..]).await,
        "stale lease",
    );
    assert_eq!(
        threads.peek_queue(&auth, &thread, 10).await.unwrap().len(),
        1,
        "nothing acknowledged with a stale lease"
    );
    assert!(
        try_lease(threads, &auth, &thread, "w3").await.is_none(),
        "the new holder's lease stays"
    );
    steps
        .ack_and_release(&auth, &next, &ids[1..])
        .await
        .unwrap();
    assert!(threads
        .peek_queue(&auth, &thread, 10)
        .await
        .unwrap()
        .is_empty());
}

/// A [`StepStore`](crate::StepStore) that folds a run's ending
/// ([`save_task_and_run`](crate::StepStore::save_task_and_run)) leaves the task's final
/// snapshot, its log entries after the earlier ones, and the run's record with the report
/// given as text, as the run store reads it back; a second ending of the same run replaces
/// its record. A store that keeps the default ([`AgentError::Unsupported`]) passes as it is.
pub async fn step_store_saves_a_task_at_rest_with_its_run(
    steps: &dyn crate::StepStore,
    tasks: &dyn TaskManager,
    runs: &dyn RunStore,
) {
    let auth = fresh_tenant();
    let mut task = Task::create(Message::user("q"));
    let asked = TaskEvent::Message {
        message: Message::user("q"),
    };
    tasks
        .save_task_with_events(&auth, &task, std::slice::from_ref(&asked))
        .await
        .unwrap();
    task.begin().unwrap();
    task.update_status(TaskState::Completed, Some(Message::agent("a")))
        .unwrap();
    let events = [
        TaskEvent::Message {
            message: Message::agent("a"),
        },
        TaskEvent::status_of(&task, true),
    ];
    let record = report_of(&task, Some("echo"), chrono::Utc::now(), Value::Null);
    let report = json!({"events": [{"type": "run.stopped"}], "final": "completed"});
    let text = JsonText::of(&report).unwrap();
    match steps
        .save_task_and_run(&auth, &task, &events, &record, &text)
        .await
    {
        Err(AgentError::Unsupported { .. }) => return,
        done => done.unwrap(),
    }
    let saved = tasks.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(
        saved.state(),
        TaskState::Completed,
        "the final status is saved"
    );
    let mut logged = vec![asked];
    logged.extend(events.iter().cloned());
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        logged,
        "the ending's entries follow the earlier ones"
    );
    let stored = runs
        .get_run_report(&auth, &record.run_id)
        .await
        .unwrap()
        .expect("the run's record is saved with the task");
    assert_eq!(
        stored,
        RunRecord {
            report,
            ..record.clone()
        },
        "the record reads back with its report"
    );

    let again = json!({"final": "completed", "note": "replaced"});
    steps
        .save_task_and_run(&auth, &task, &[], &record, &JsonText::of(&again).unwrap())
        .await
        .unwrap();
    let stored = runs.get_run_report(&auth, &record.run_id).await.unwrap();
    assert_eq!(
        stored.map(|r| r.report),
        Some(again),
        "a run's record is replaced"
    );
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap().len(),
        logged.len(),
        "no events, none appended"
    );
}
