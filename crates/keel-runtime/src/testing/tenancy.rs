//! Conformance check of tenancy across every store at once: one tenant's rows of each kind
//! are out of reach of another tenant through every store method, whose answer is the exact
//! one for "not there" (`None`, empty, `false`, [`AgentError::TaskNotFound`],
//! [`AgentError::LeaseLost`]), and the owner's rows stay untouched.

use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, RunId, Task, TaskEvent, ThreadId};
use serde_json::json;

use super::assert_task_not_found;
use crate::{
    AsyncCall, AsyncCallState, AuthContext, ChildThread, Lease, ListTasksFilter, QueuedItem,
    RunQuery, RunRecord, Services, TaskRecord, TaskWrite,
};

const TTL: Duration = Duration::from_secs(30);

/// A tenant's rows in the tenant-scoped stores, as [`write_tenant_rows`] left them.
pub struct TenantRows {
    /// A task saved with one event.
    pub task: Task,
    /// The task's thread, leased, with one history entry, one queued item and one
    /// key-value entry (`secret`).
    pub thread: ThreadId,
    /// The task's one event.
    pub event: TaskEvent,
    /// The thread's lease, held by `owner`.
    pub lease: Lease,
    /// The thread's queued item.
    pub item: QueuedItem,
}

/// Write one row of each tenant-scoped kind for `auth`: a task with one event, the memory
/// value `secret`, and on the task's thread a key-value entry, a lease, a history entry and
/// a queued item. Backends use it to inspect how their storage lays a tenant's rows out.
pub async fn write_tenant_rows(services: &Services, auth: &AuthContext) -> TenantRows {
    let task = Task::create(Message::user("private"));
    let thread = task.thread_id.clone();
    let event = TaskEvent::Message {
        message: Message::user("private"),
    };
    services
        .tasks
        .save_task_with_events(auth, &task, std::slice::from_ref(&event))
        .await
        .unwrap();
    services
        .memory
        .save_serialized(auth, "secret", json!("owner's"))
        .await
        .unwrap();
    let threads = services.threads.as_ref();
    threads
        .kv_set(auth, &thread, "secret", json!(1))
        .await
        .unwrap();
    let lease = threads
        .acquire_lease(auth, &thread, "owner", TTL)
        .await
        .unwrap()
        .expect("a new thread is free");
    threads
        .append_history(auth, &lease, &[LlmMessage::user("private")])
        .await
        .unwrap();
    let item = threads.push_queue(auth, &thread, json!(1)).await.unwrap();
    TenantRows {
        task,
        thread,
        event,
        lease,
        item,
    }
}

/// Two fresh tenants whose names run together alike (`…ab`/`c` and `…a`/`bc`), so a
/// backend that joins app and user without a separator is caught.
fn run_together_tenants() -> (AuthContext, AuthContext) {
    let app = uuid::Uuid::new_v4().simple().to_string();
    (
        AuthContext::new(format!("{app}ab"), "c"),
        AuthContext::new(format!("{app}a"), "bc"),
    )
}

/// No store method reaches another tenant's rows: with Alice's rows of every kind written
/// (tasks, memory, thread history, queue, key-value store, subagent registry, timers, an
/// asynchronous call, run records), Mallory, whose names run together with Alice's, reads
/// nothing of them, cannot write under Alice's lease, finds the same thread id to be a
/// thread of her own, and Alice's rows are untouched afterwards. The step writes and timers
/// are checked when `services` has them.
pub async fn no_store_method_reaches_another_tenants_rows(services: &Services) {
    let (alice, mallory) = run_together_tenants();
    let (tasks, threads) = (services.tasks.as_ref(), services.threads.as_ref());
    let rows = write_tenant_rows(services, &alice).await;
    let TenantRows {
        task,
        thread,
        event,
        lease,
        item,
    } = &rows;
    let child = ChildThread::running(thread.clone(), thread.clone(), "helper", "helper");
    threads.register_child(&alice, &child).await.unwrap();
    let timer = match &services.timers {
        Some(timers) => Some(
            timers
                .schedule_timer(&alice, thread, "agent", "t", json!(1), chrono::Utc::now())
                .await
                .unwrap(),
        ),
        None => None,
    };
    let call_id = format!("call-{}", uuid::Uuid::new_v4().simple());
    let call = AsyncCall {
        call_id: call_id.clone(),
        auth: alice.clone(),
        thread_id: thread.clone(),
        state: AsyncCallState::Pending,
        record: json!({}),
    };
    services.async_calls.put_async_call(&call).await.unwrap();
    let runs = services.runs.as_ref();
    runs.save_task_record(&alice, &TaskRecord::of(task, Some("agent")).unwrap())
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
    runs.save_run_report(&alice, &report).await.unwrap();

    // Tasks.
    assert_eq!(tasks.get_task(&mallory, &task.id).await.unwrap(), None);
    let not_found = |err: AgentError| matches!(err, AgentError::TaskNotFound { .. });
    assert!(not_found(
        tasks.get_task_events(&mallory, &task.id).await.unwrap_err()
    ));
    assert!(not_found(
        tasks
            .add_task_event(&mallory, &task.id, event)
            .await
            .unwrap_err()
    ));
    let listed = tasks
        .list_tasks(&mallory, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!((listed.items.len(), listed.total_size), (0, 0));
    // Memory.
    let memory = services.memory.as_ref();
    assert_eq!(
        memory.load_serialized(&mallory, "secret").await.unwrap(),
        None
    );
    assert!(!memory.delete(&mallory, "secret").await.unwrap());
    // Threads: history, queue, key-value store, subagents.
    assert!(threads
        .read_history(&mallory, thread, 0, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(threads.queue_len(&mallory, thread).await.unwrap(), 0);
    assert_eq!(threads.tenant_queue_len(&mallory).await.unwrap(), 0);
    assert!(threads.queued_threads(&mallory).await.unwrap().is_empty());
    assert!(threads
        .peek_queue(&mallory, thread, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        threads.kv_get(&mallory, thread, "secret").await.unwrap(),
        None
    );
    assert!(threads.kv_keys(&mallory, thread).await.unwrap().is_empty());
    assert_eq!(threads.child(&mallory, thread).await.unwrap(), None);
    assert!(threads.children(&mallory, thread).await.unwrap().is_empty());
    let err = threads
        .set_child_status(&mallory, thread, "done")
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
    // Alice's lease fences nothing of Mallory's, and Mallory's nothing of Alice's.
    let mut refused = vec![
        threads
            .append_history(&mallory, lease, &[LlmMessage::user("forged")])
            .await
            .unwrap_err(),
        threads
            .ack_queue(&mallory, lease, std::slice::from_ref(&item.id))
            .await
            .unwrap_err(),
        threads.renew_lease(&mallory, lease, TTL).await.unwrap_err(),
    ];
    if let Some(steps) = &services.steps {
        let events = std::slice::from_ref(event);
        let err = steps.persist_step(&mallory, lease, &[], task, TaskWrite::LogOnly, events);
        refused.push(err.await.unwrap_err());
    }
    for err in refused {
        assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
    }
    threads.release_lease(&mallory, lease).await.unwrap();
    let theirs = threads
        .acquire_lease(&mallory, thread, "mallory", TTL)
        .await
        .unwrap()
        .expect("the same thread id is another thread in another tenant");
    if let Some(steps) = &services.steps {
        let events = std::slice::from_ref(event);
        let persisted =
            steps.persist_step(&mallory, &theirs, &[], task, TaskWrite::LogOnly, events);
        assert_task_not_found(persisted.await, "a step on another tenant's task");
    }
    threads
        .ack_queue(&mallory, &theirs, std::slice::from_ref(&item.id))
        .await
        .unwrap();
    // Timers, asynchronous calls, runs.
    if let (Some(timers), Some(timer)) = (&services.timers, &timer) {
        assert!(!timers.cancel_timer(&mallory, &timer.id).await.unwrap());
        assert!(timers
            .thread_timers(&mallory, thread)
            .await
            .unwrap()
            .is_empty());
    }
    assert!(!services
        .async_calls
        .transition_async_call(
            &mallory,
            &call_id,
            AsyncCallState::Pending,
            AsyncCallState::Delivered,
            json!({"forged": true}),
        )
        .await
        .unwrap());
    assert_eq!(runs.get_run_report(&mallory, &run_id).await.unwrap(), None);
    let everything = RunQuery::default();
    assert!(runs
        .find_task_records(&mallory, &everything)
        .await
        .unwrap()
        .is_empty());
    assert!(runs
        .find_run_reports(&mallory, &everything)
        .await
        .unwrap()
        .is_empty());

    // Alice still has all of it, untouched.
    assert_eq!(
        tasks.get_task_events(&alice, &task.id).await.unwrap(),
        std::slice::from_ref(event)
    );
    assert_eq!(threads.queue_len(&alice, thread).await.unwrap(), 1);
    let history = threads.read_history(&alice, thread, 0, 10).await.unwrap();
    assert_eq!(history.len(), 1);
    if let Some(timers) = &services.timers {
        assert_eq!(timers.thread_timers(&alice, thread).await.unwrap().len(), 1);
    }
    let call = services.async_calls.find_async_call(&call_id).await;
    assert_eq!(call.unwrap().unwrap().state, AsyncCallState::Pending);
    assert_eq!(threads.child(&alice, thread).await.unwrap(), Some(child));
}
