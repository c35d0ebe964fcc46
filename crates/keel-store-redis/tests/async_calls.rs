//! The asynchronous-call store against a real Redis (`REDIS_URL`), under a fresh prefix.

mod support;

use std::sync::Arc;

use keel_runtime::testing;

#[tokio::test(flavor = "multi_thread")]
async fn redis_async_call_store_passes_the_conformance_suite() {
    let (prefix, store) = support::fresh_store().await;
    testing::async_call_store_all(Arc::new(store)).await;
    support::clean_up(&prefix).await;
}
