//! Keel's backend conformance suite against a real Redis (`REDIS_URL`), under a fresh prefix
//! and with a small key-count cap so the cap is exercised.

mod support;

use std::sync::Arc;

use keel_llm::MockLlm;
use keel_runtime::testing;

#[tokio::test(flavor = "multi_thread")]
async fn redis_store_passes_the_conformance_suite() {
    let prefix = support::fresh_prefix();
    let store = support::capped_store(&prefix, 16).await;
    // The thread store as `RedisStore::services` wires it: behind the shared input checks.
    let threads = store.services(Arc::new(MockLlm::new())).threads;
    testing::run_all(&store, &store, threads, store.kv_limits(), &store).await;
    testing::step_store_writes_history_and_log_together(&store, &store, &store).await;
    testing::step_store_acks_and_releases_in_one_write(&store, &store).await;
    testing::step_store_saves_a_task_at_rest_with_its_run(&store, &store, &store).await;
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_timers_and_tenants_pass_the_conformance_suite() {
    let (prefix, store) = support::fresh_store().await;
    let timers = store.services(Arc::new(MockLlm::new())).timers;
    testing::run_all_system(timers.expect("Redis keeps timers"), &store).await;
    support::clean_up(&prefix).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_connections_claim_a_due_timer_once() {
    let (prefix, a, b) = support::fresh_two_stores().await;
    testing::timers_are_claimed_once_by_two_claimers(&a, &b).await;
    support::clean_up(&prefix).await;
}
