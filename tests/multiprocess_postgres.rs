//! Two `keel serve` processes on one PostgreSQL database (a fresh schema of the server at
//! `KEEL_POSTGRES_URL`): a task accepted by one is read and canceled through the other, and a
//! thread's work never runs in both at once. The takeover of a killed process's work is in
//! `faults.rs`; subscribing across processes in `multiprocess_subscribe.rs`.

mod support;

use keel::core::ThreadId;
use keel::services::{AuthContext, ThreadHistory};
use support::{uuid_like, KeelServer, Rpc};

#[tokio::test(flavor = "multi_thread")]
async fn a_task_accepted_by_one_process_is_read_and_canceled_through_the_other() {
    let (schema, args) = support::postgres_store().await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (a, b) = (KeelServer::start_with(&args), KeelServer::start_with(&args));
    support::accepted_by_one_canceled_through_the_other(&a, &b).await;
    drop((a, b));
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn one_threads_work_never_runs_concurrently_across_processes() {
    let (schema, args) = support::postgres_store().await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (a, b) = (KeelServer::start_with(&args), KeelServer::start_with(&args));
    let (rpc_a, rpc_b) = (Rpc::new(&a), Rpc::new(&b));
    let thread = format!("thread-{}", uuid_like());
    let sends = (0..16).map(|i| {
        let (rpc, thread) = (if i % 2 == 0 { &rpc_a } else { &rpc_b }, thread.clone());
        async move { rpc.send(&format!("turn {i}"), Some(&thread), false).await }
    });
    for task in futures::future::join_all(sends).await {
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    }
    // The thread's durable history is a clean sequence: each task's user message directly
    // followed by its answer, never interleaved with another task's.
    let store = schema.store().await.unwrap();
    let auth = AuthContext::new("default-app", "default-user");
    let history = store
        .read_history(&auth, &ThreadId::from(thread), 0, 1000)
        .await
        .unwrap();
    assert_eq!(history.len(), 32, "16 turns of user + answer");
    for pair in history.chunks(2) {
        let (user, answer) = (&pair[0].message, &pair[1].message);
        assert_eq!(answer.content, format!("You said: {}", user.content));
        assert_eq!(
            user.metadata["keel.task_id"],
            answer.metadata["keel.task_id"]
        );
    }
    drop((a, b));
    schema.drop_schema().await.unwrap();
}
