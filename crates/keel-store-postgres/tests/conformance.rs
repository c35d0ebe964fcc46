//! Keel's backend conformance suite against a real PostgreSQL (`KEEL_POSTGRES_URL`), each
//! test in a fresh schema, with a small key-count cap so the cap is exercised.

use std::sync::Arc;

use keel_llm::MockLlm;
use keel_runtime::{testing, KvLimits};
use keel_store_postgres::testing::TestSchema;

#[tokio::test(flavor = "multi_thread")]
async fn postgres_store_passes_the_conformance_suite() {
    let (schema, store) = TestSchema::with_store().await.unwrap();
    let limits = KvLimits {
        max_keys: 16,
        ..KvLimits::DEFAULT
    };
    let store = store.with_kv_limits(limits);
    // The thread store as `PostgresStore::services` wires it: behind the shared input checks.
    let threads = store.services(Arc::new(MockLlm::new())).threads;
    testing::run_all(&store, &store, threads, limits, &store).await;
    testing::step_store_writes_history_and_log_together(&store, &store, &store).await;
    testing::step_store_folds_a_task_with_its_queue_item_and_its_start(&store, &store, &store)
        .await;
    testing::step_store_acks_and_releases_in_one_write(&store, &store).await;
    testing::step_store_saves_a_task_at_rest_with_its_run(&store, &store, &store).await;
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_timers_and_tenants_pass_the_conformance_suite() {
    let (schema, store) = TestSchema::with_store().await.unwrap();
    let timers = store.services(Arc::new(MockLlm::new())).timers;
    testing::run_all_system(timers.expect("Postgres keeps timers"), &store).await;
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_pools_claim_a_due_timer_once() {
    let schema = TestSchema::new().await.unwrap();
    let (a, b) = (schema.store().await.unwrap(), schema.store().await.unwrap());
    testing::timers_are_claimed_once_by_two_claimers(&a, &b).await;
    schema.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_async_call_store_passes_the_conformance_suite() {
    let (schema, store) = TestSchema::with_store().await.unwrap();
    testing::async_call_store_all(Arc::new(store)).await;
    schema.drop_schema().await.unwrap();
}
