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

/// The whole suite, then the step check (which `run_all` leaves out), on one store.
async fn run_all(store: &SqliteStore) {
    testing::run_all(store, store, threads(store), LIMITS, store).await;
    testing::step_store_writes_history_and_log_together(store, store, store).await;
    testing::step_store_folds_a_task_with_its_queue_item_and_its_start(store, store, store).await;
    testing::step_store_acks_and_releases_in_one_write(store, store).await;
    testing::step_store_saves_a_task_at_rest_with_its_run(store, store, store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_all_on_one_file() {
    let (_dir, store) = file_store();
    run_all(&store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_all_in_memory() {
    let store = SqliteStore::open_in_memory()
        .expect("open in-memory store")
        .with_kv_limits(LIMITS);
    run_all(&store).await;
}

/// One test a check, named after it, each on a fresh file: `|store| { check(args); … }`, the
/// arguments written in terms of `store`.
macro_rules! each_check_on_its_own_file {
    (|$store:ident| { $($check:ident($($arg:expr),*);)* }) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $check() {
                let (_dir, $store) = file_store();
                testing::$check($($arg),*).await;
            }
        )*
    };
}

each_check_on_its_own_file!(|store| {
    task_manager_round_trip(&store);
    task_manager_events_in_order(&store);
    task_manager_save_with_events(&store);
    step_store_writes_history_and_log_together(&store, &store, &store);
    step_store_folds_a_task_with_its_queue_item_and_its_start(&store, &store, &store);
    step_store_saves_a_task_at_rest_with_its_run(&store, &store, &store);
    task_manager_pagination(&store);
    task_manager_recently_updated_order(&store);
    task_manager_tenant_isolation(&store);
    memory_round_trip(&store);
    memory_ttl(&store);
    memory_save_if_absent_claims_once(&store);
    history_append_and_read(&store);
    lease_exclusive_under_contention(threads(&store));
    lease_fencing(&store);
    lease_reclaimed_only_by_its_holder(&store);
    queue_fifo_under_concurrent_producers(threads(&store));
    kv_semantics(threads(&store).as_ref(), LIMITS);
    subagent_registry(&store);
    run_store_index_and_search(&store);
    task_manager_page_token_survives_changes(&store);
    task_manager_state_filter_follows_saves(&store);
    task_manager_listed_tasks_carry_no_history(&store);
    memory_delete_of_expired_key_is_false(&store);
    history_and_queue_limit_zero_is_empty(&store);
    lease_is_dead_after_release(&store);
    lease_ttl_bounds(threads(&store).as_ref());
    queue_seqs_grow_after_the_queue_empties(&store);
    queue_counts_per_tenant(&store);
    subagent_reparenting_leaves_the_old_parent(&store);
    run_store_time_window_is_half_open(&store);
    run_store_contains_searches_the_stored_json(&store);
});

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
    testing::timers_are_claimed_once_by_two_claimers(&store, &other).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_store_method_reaches_another_tenants_rows() {
    let (_dir, store) = file_store();
    let services = store.services(Arc::new(MockLlm::new()));
    testing::no_store_method_reaches_another_tenants_rows(&services).await;
}
