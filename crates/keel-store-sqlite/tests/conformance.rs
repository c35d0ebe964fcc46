//! The backend conformance suite of `keel-runtime`, run against a real SQLite file.
//!
//! Each check is its own test (so a failure names the broken contract), on its own file; one
//! more test runs the whole suite on one shared file, as a deployment would use it.

use std::sync::Arc;

use keel_llm::MockLlm;
use keel_runtime::{testing, KvLimits, ThreadStore, ThreadTimers};
use keel_store_sqlite::SqliteStore;
use tempfile::TempDir;

/// A small key-count cap, so the suite exercises `max_keys` (it does when the cap is ≤ 64).
const LIMITS: KvLimits = KvLimits {
    max_keys: 16,
    ..KvLimits::DEFAULT
};

/// A store on a fresh file; keep the directory alive as long as the store.
fn file_store() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("keel.db"))
        .expect("open SQLite store")
        .with_kv_limits(LIMITS);
    (dir, store)
}

/// The store's threads as `SqliteStore::services` wires them: behind the shared input checks.
fn threads(store: &SqliteStore) -> Arc<dyn ThreadStore> {
    store.services(Arc::new(MockLlm::new())).threads
}

/// The store's timers as `SqliteStore::services` wires them.
fn timers(store: &SqliteStore) -> Arc<dyn ThreadTimers> {
    let timers = store.services(Arc::new(MockLlm::new())).timers;
    timers.expect("SQLite keeps timers")
}

#[tokio::test(flavor = "multi_thread")]
async fn run_all_on_one_file() {
    let (_dir, store) = file_store();
    testing::run_all(&store, &store, threads(&store), LIMITS, &store).await;
    testing::step_store_writes_history_and_log_together(&store, &store, &store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_all_in_memory() {
    let store = SqliteStore::open_in_memory()
        .expect("open in-memory store")
        .with_kv_limits(LIMITS);
    testing::run_all(&store, &store, threads(&store), LIMITS, &store).await;
    testing::step_store_writes_history_and_log_together(&store, &store, &store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_round_trip() {
    let (_dir, store) = file_store();
    testing::task_manager_round_trip(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_events_in_order() {
    let (_dir, store) = file_store();
    testing::task_manager_events_in_order(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_save_with_events() {
    let (_dir, store) = file_store();
    testing::task_manager_save_with_events(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn step_store_writes_history_and_log_together() {
    let (_dir, store) = file_store();
    testing::step_store_writes_history_and_log_together(&store, &store, &store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_pagination() {
    let (_dir, store) = file_store();
    testing::task_manager_pagination(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_recently_updated_order() {
    let (_dir, store) = file_store();
    testing::task_manager_recently_updated_order(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_tenant_isolation() {
    let (_dir, store) = file_store();
    testing::task_manager_tenant_isolation(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_round_trip() {
    let (_dir, store) = file_store();
    testing::memory_round_trip(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_ttl() {
    let (_dir, store) = file_store();
    testing::memory_ttl(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn history_append_and_read() {
    let (_dir, store) = file_store();
    testing::history_append_and_read(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_exclusive_under_contention() {
    let (_dir, store) = file_store();
    testing::lease_exclusive_under_contention(threads(&store)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_fencing() {
    let (_dir, store) = file_store();
    testing::lease_fencing(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_fifo_under_concurrent_producers() {
    let (_dir, store) = file_store();
    testing::queue_fifo_under_concurrent_producers(threads(&store)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kv_semantics() {
    let (_dir, store) = file_store();
    testing::kv_semantics(threads(&store).as_ref(), LIMITS).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subagent_registry() {
    let (_dir, store) = file_store();
    testing::subagent_registry(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_store_index_and_search() {
    let (_dir, store) = file_store();
    testing::run_store_index_and_search(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_page_token_survives_changes() {
    let (_dir, store) = file_store();
    testing::task_manager_page_token_survives_changes(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_state_filter_follows_saves() {
    let (_dir, store) = file_store();
    testing::task_manager_state_filter_follows_saves(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_manager_listed_tasks_carry_no_history() {
    let (_dir, store) = file_store();
    testing::task_manager_listed_tasks_carry_no_history(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_delete_of_expired_key_is_false() {
    let (_dir, store) = file_store();
    testing::memory_delete_of_expired_key_is_false(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn history_and_queue_limit_zero_is_empty() {
    let (_dir, store) = file_store();
    testing::history_and_queue_limit_zero_is_empty(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_is_dead_after_release() {
    let (_dir, store) = file_store();
    testing::lease_is_dead_after_release(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lease_ttl_bounds() {
    let (_dir, store) = file_store();
    testing::lease_ttl_bounds(threads(&store).as_ref()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_seqs_grow_after_the_queue_empties() {
    let (_dir, store) = file_store();
    testing::queue_seqs_grow_after_the_queue_empties(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_counts_per_tenant() {
    let (_dir, store) = file_store();
    testing::queue_counts_per_tenant(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn subagent_reparenting_leaves_the_old_parent() {
    let (_dir, store) = file_store();
    testing::subagent_reparenting_leaves_the_old_parent(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_store_time_window_is_half_open() {
    let (_dir, store) = file_store();
    testing::run_store_time_window_is_half_open(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_store_contains_searches_the_stored_json() {
    let (_dir, store) = file_store();
    testing::run_store_contains_searches_the_stored_json(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timers_and_tenants_on_one_file() {
    let (_dir, store) = file_store();
    testing::run_all_system(timers(&store), &store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timers_are_claimed_once_by_two_stores_on_one_file() {
    // Two stores on one file are two writers, as two processes would be.
    let (dir, store) = file_store();
    let other = SqliteStore::open(dir.path().join("keel.db")).expect("open the file again");
    let auth = testing::fresh_tenant();
    let thread = keel_core::ThreadId::new();
    use keel_runtime::ThreadTimers;
    let timer = store
        .schedule_timer(
            &auth,
            &thread,
            "agent",
            "t",
            serde_json::json!(1),
            chrono::Utc::now(),
        )
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let ttl = std::time::Duration::from_secs(60);
    let (a, b) = tokio::join!(
        store.claim_due_timers("agent", now, 10, ttl),
        other.claim_due_timers("agent", now, 10, ttl)
    );
    let ids: Vec<String> = a
        .unwrap()
        .into_iter()
        .chain(b.unwrap())
        .map(|c| c.timer.id)
        .collect();
    assert_eq!(ids, vec![timer.id], "exactly one store claims the timer");
}
