//! `keel serve` resumes unfinished work of every tenant on start, not only the default one.

mod support;

use std::time::Duration;

use keel::core::{Message, RunContext, Task, TaskEvent, TaskState, ThreadId};
use keel::services::{AuthContext, Runtime};
use keel::{DefaultRuntime, StoreConfig};
use support::KeelServer;

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn keel_serve_resumes_a_task_another_tenant_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let tenant = AuthContext::new("other-app", "bob");
    let task_id = {
        // What a process that died right after accepting the message leaves in the store: a
        // submitted task with its message, and no process working on it.
        let runtime = DefaultRuntime::builder()
            .store(StoreConfig::Sqlite(path.clone()))
            .build()
            .await
            .unwrap();
        assert_ne!(runtime.auth_service().auth_context(), tenant);
        let mut task = Task::new(ThreadId::new());
        RunContext::ensure_task_context(&mut task).unwrap();
        let mut message = Message::user("hello").in_thread(task.thread_id.clone());
        message.task_id = Some(task.id.clone());
        let tasks = runtime.task_manager();
        tasks.save_task(&tenant, &task).await.unwrap();
        tasks
            .add_task_event(&tenant, &task.id, &TaskEvent::Message { message })
            .await
            .unwrap();
        task.id
    };
    let store = format!("sqlite:{}", path.display());
    let server = KeelServer::start_with(&["--store", store.as_str()]);
    // Watch the same file from here, as a second process would.
    let runtime = DefaultRuntime::builder()
        .store(StoreConfig::Sqlite(path.clone()))
        .build()
        .await
        .unwrap();
    support::wait_until(
        "keel serve to resume the other tenant's task",
        Duration::from_secs(20),
        || async {
            let task = runtime.task_manager().get_task(&tenant, &task_id).await;
            task.unwrap().unwrap().state()
        },
        |state| *state == TaskState::Completed,
    )
    .await;
    assert!(server.terminate().success());
}
