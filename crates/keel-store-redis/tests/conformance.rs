//! Keel's backend conformance suite against a real Redis (`REDIS_URL`), under a fresh prefix
//! and with a small key-count cap so the cap is exercised.

mod support;

use std::sync::Arc;

use keel_runtime::{testing, KvLimits, ThreadStore};

#[tokio::test(flavor = "multi_thread")]
async fn redis_store_passes_the_conformance_suite() {
    let prefix = support::fresh_prefix();
    let limits = KvLimits {
        max_keys: 16,
        ..KvLimits::DEFAULT
    };
    let store = support::store(&prefix).await.with_kv_limits(limits);
    let threads: Arc<dyn ThreadStore> = Arc::new(store.clone());
    testing::run_all(&store, &store, threads, limits, &store).await;
    testing::step_store_writes_history_and_log_together(&store, &store, &store).await;
    support::clean_up(&prefix).await;
}
