//! Two `keel serve` processes on one Redis serve the same agent safely: a thread's work never
//! runs concurrently, and a task accepted by one is readable and cancelable through the other.

mod support;

use keel::core::ThreadId;
use keel::services::{AuthContext, ThreadHistory};
use support::{redis_url, uuid_like, KeelServer, Rpc};

fn two_servers(prefix: &str) -> (KeelServer, KeelServer) {
    let url = redis_url();
    let args = ["--store", url.as_str(), "--redis-prefix", prefix];
    (KeelServer::start_with(&args), KeelServer::start_with(&args))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_accepted_by_one_process_is_read_and_canceled_through_the_other() {
    let prefix = format!("keel-test-{}:", uuid_like());
    let (a, b) = two_servers(&prefix);
    support::accepted_by_one_canceled_through_the_other(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_threads_work_never_runs_concurrently_across_processes() {
    let prefix = format!("keel-test-{}:", uuid_like());
    let (a, b) = two_servers(&prefix);
    let (rpc_a, rpc_b) = (Rpc::new(&a), Rpc::new(&b));
    let thread = format!("thread-{}", uuid_like());
    let mut sends = Vec::new();
    for i in 0..16 {
        let (rpc, thread) = (if i % 2 == 0 { &rpc_a } else { &rpc_b }, thread.clone());
        sends.push(async move { rpc.send(&format!("turn {i}"), Some(&thread), false).await });
    }
    let tasks = futures::future::join_all(sends).await;
    for task in &tasks {
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    }
    // Different threads progress on both processes meanwhile.
    let other = rpc_b.send("elsewhere", None, false).await;
    assert_eq!(other["status"]["state"], "TASK_STATE_COMPLETED");

    // The thread's durable history is a clean sequence: each task's user message directly
    // followed by its answer, never interleaved with another task's.
    let store = keel::redis::RedisStore::connect(&redis_url())
        .await
        .unwrap()
        .with_prefix(prefix);
    let auth = AuthContext::new("default-app", "default-user");
    let history = store
        .read_history(&auth, &ThreadId::from(thread), 0, 1000)
        .await
        .unwrap();
    assert_eq!(history.len(), 32, "16 turns of user + answer");
    for pair in history.chunks(2) {
        let (user, answer) = (&pair[0].message, &pair[1].message);
        assert_eq!(
            answer.content,
            format!("You said: {}", user.content),
            "interleaved history: {history:#?}"
        );
        assert_eq!(
            user.metadata["keel.task_id"],
            answer.metadata["keel.task_id"]
        );
    }
}
