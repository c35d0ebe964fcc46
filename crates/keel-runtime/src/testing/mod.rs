//! The backend conformance suite: plain `pub async fn` checks that any implementation of
//! Keel's store traits must pass. Keel's memory, SQLite and Redis stores run them in their
//! tests; a custom backend should too:
//!
//! ```toml
//! [dev-dependencies]
//! keel-runtime = { version = "0.1", features = ["testing"] }
//! ```
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use keel_runtime::{testing, InMemoryTaskManager};
//! testing::task_manager_round_trip(&InMemoryTaskManager::new()).await;
//! # }
//! ```
//!
//! Each check panics with a message naming the broken rule. Checks use fresh random ids and
//! tenants, so they can share one database with other tests. [`run_all`] runs every check
//! against one store of each kind. Malformed stored data cannot be injected generically:
//! each backend's own tests corrupt a record and expect
//! [`AgentError::Storage`].
//!
//! The checks live in one module per contract: tasks, memory, thread history and queue,
//! leases, key-value, subagent registry, runs, steps, timers and async calls, and one across
//! them all: tenancy. All of them are re-exported here, so each is
//! `keel_runtime::testing::<check>`.

mod async_calls;
mod history;
mod kv;
mod leases;
mod memory;
mod runs;
mod steps;
mod subagents;
mod tasks;
mod tenancy;
mod timers;
mod wait;

pub use async_calls::*;
pub use history::*;
pub use kv::*;
pub use leases::*;
pub use memory::*;
pub use runs::*;
pub use steps::*;
pub use subagents::*;
pub use tasks::*;
pub use tenancy::*;
pub use timers::*;
pub use wait::{eventually, eventually_within, Reached, WAIT_DEADLINE};

use std::sync::Arc;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, AgentResult, ThreadId};

use crate::{AuthContext, KvLimits, Lease, MemoryService, RunStore, TaskManager, ThreadStore};

/// A tenant no other test uses.
pub fn fresh_tenant() -> AuthContext {
    AuthContext::new(
        format!("app-{}", uuid::Uuid::new_v4().simple()),
        "conformance",
    )
}

/// Every tool result in `task`'s history, in order: what the tool returned (or its error
/// text) and whether it failed. What a test of a run that called tools reads back.
pub fn tool_outputs(task: &keel_core::Task) -> Vec<(serde_json::Value, bool)> {
    task.history
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match &p.content {
            keel_core::PartContent::ToolOutput {
                output, is_error, ..
            } => Some((output.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

fn fresh_thread() -> ThreadId {
    ThreadId::from(format!("thread-{}", uuid::Uuid::new_v4().simple()))
}

/// A fresh thread of a fresh tenant: where most checks start.
fn tenant_and_thread() -> (AuthContext, ThreadId) {
    (fresh_tenant(), fresh_thread())
}

/// Try to lease `thread` for 30 s as `holder`: the lease, or `None` while another holds it.
async fn try_lease(
    threads: &dyn ThreadStore,
    auth: &AuthContext,
    thread: &ThreadId,
    holder: &str,
) -> Option<Lease> {
    threads
        .acquire_lease(auth, thread, holder, std::time::Duration::from_secs(30))
        .await
        .unwrap()
}

/// The lease of a thread that must be free, for 30 s, held by `w`: how most checks start.
async fn leased(threads: &dyn ThreadStore, auth: &AuthContext, thread: &ThreadId) -> Lease {
    try_lease(threads, auth, thread, "w")
        .await
        .expect("a fresh thread is free")
}

/// Append one user message under `lease`: the store's answer, for checks that expect a refusal.
async fn append_one(
    threads: &dyn ThreadStore,
    auth: &AuthContext,
    lease: &Lease,
    text: &str,
) -> AgentResult<u64> {
    threads
        .append_history(auth, lease, &[LlmMessage::user(text)])
        .await
}

/// Run `n` tasks at once against one tenant's thread, each given the store, the tenant, the
/// thread and its index, and collect their results in index order.
async fn concurrently<T, F, Fut>(
    threads: &Arc<dyn ThreadStore>,
    auth: &AuthContext,
    thread: &ThreadId,
    n: usize,
    task: F,
) -> Vec<T>
where
    F: Fn(Arc<dyn ThreadStore>, AuthContext, ThreadId, usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = (0..n)
        .map(|i| tokio::spawn(task(threads.clone(), auth.clone(), thread.clone(), i)))
        .collect();
    let mut results = Vec::with_capacity(n);
    for handle in handles {
        results.push(handle.await.unwrap());
    }
    results
}

/// Assert that `result` is [`AgentError::LeaseLost`]: what `what` (a write, an ack or a
/// renewal under a dead lease) must answer.
#[track_caller]
fn assert_lease_lost<T: std::fmt::Debug>(result: AgentResult<T>, what: &str) {
    assert!(
        matches!(result, Err(AgentError::LeaseLost { .. })),
        "{what}: {result:?}"
    );
}

/// Assert that `result` is [`AgentError::TaskNotFound`]: what `what` (a write naming a task
/// the tenant does not have) must answer.
#[track_caller]
fn assert_task_not_found<T: std::fmt::Debug>(result: AgentResult<T>, what: &str) {
    assert!(
        matches!(result, Err(AgentError::TaskNotFound { .. })),
        "{what}: {result:?}"
    );
}

/// How many entries the thread's history holds (up to 1,000, more than any check writes).
async fn history_len(threads: &dyn ThreadStore, auth: &AuthContext, thread: &ThreadId) -> usize {
    threads
        .read_history(auth, thread, 0, 1000)
        .await
        .unwrap()
        .len()
}

/// Run every check: tasks, memory, threads (with the store's key-value caps) and runs.
pub async fn run_all(
    tasks: &dyn TaskManager,
    memory: &dyn MemoryService,
    threads: Arc<dyn ThreadStore>,
    kv_limits: KvLimits,
    runs: &dyn RunStore,
) {
    task_manager_round_trip(tasks).await;
    task_manager_events_in_order(tasks).await;
    task_manager_save_with_events(tasks).await;
    task_manager_pagination(tasks).await;
    task_manager_recently_updated_order(tasks).await;
    task_manager_page_token_survives_changes(tasks).await;
    task_manager_state_filter_follows_saves(tasks).await;
    task_manager_listed_tasks_carry_no_history(tasks).await;
    task_manager_tenant_isolation(tasks).await;
    memory_round_trip(memory).await;
    memory_ttl(memory).await;
    memory_delete_of_expired_key_is_false(memory).await;
    memory_save_if_absent_claims_once(memory).await;
    history_append_and_read(threads.as_ref()).await;
    history_read_before(threads.as_ref()).await;
    history_and_queue_limit_zero_is_empty(threads.as_ref()).await;
    lease_exclusive_under_contention(threads.clone()).await;
    lease_fencing(threads.as_ref()).await;
    lease_is_dead_after_release(threads.as_ref()).await;
    lease_reclaimed_only_by_its_holder(threads.as_ref()).await;
    lease_ttl_bounds(threads.as_ref()).await;
    queue_fifo_under_concurrent_producers(threads.clone()).await;
    queue_seqs_grow_after_the_queue_empties(threads.as_ref()).await;
    queue_counts_per_tenant(threads.as_ref()).await;
    kv_semantics(threads.as_ref(), kv_limits).await;
    subagent_registry(threads.as_ref()).await;
    subagent_reparenting_leaves_the_old_parent(threads.as_ref()).await;
    run_store_index_and_search(runs).await;
    run_store_time_window_is_half_open(runs).await;
    run_store_contains_searches_the_stored_json(runs).await;
}

/// Run every check of the system-level stores: thread timers and the tenant listing. Kept
/// apart from [`run_all`] so a backend without timers can still run the rest.
pub async fn run_all_system(timers: Arc<dyn crate::ThreadTimers>, tasks: &dyn TaskManager) {
    timers_schedule_list_and_cancel(timers.as_ref()).await;
    timers_claim_only_what_is_due_and_reclaim_after_the_claim_lapses(timers.as_ref()).await;
    timers_are_claimed_once_under_contention(timers.clone()).await;
    timers_are_claimed_only_by_their_agent(timers.as_ref()).await;
    task_manager_lists_every_tenant(tasks).await;
}
