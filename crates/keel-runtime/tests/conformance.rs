//! The in-memory stores pass the backend conformance suite.

use std::sync::Arc;

use keel_runtime::{
    testing, InMemoryMemoryService, InMemoryRunStore, InMemoryTaskManager, InMemoryThreadStore,
    KvLimits, Validated,
};

#[tokio::test]
async fn in_memory_stores_pass_the_conformance_suite() {
    let limits = KvLimits {
        max_keys: 16,
        ..KvLimits::DEFAULT
    };
    testing::run_all(
        &InMemoryTaskManager::new(),
        &InMemoryMemoryService::new(),
        // Behind the input checks, as `Services::in_memory` wires it.
        Arc::new(Validated::new(
            InMemoryThreadStore::new().with_kv_limits(limits),
            limits,
        )),
        limits,
        &InMemoryRunStore::new(),
    )
    .await;
}

#[tokio::test]
async fn in_memory_timers_and_tenants_pass_the_conformance_suite() {
    testing::run_all_system(
        Arc::new(Validated::new(
            keel_runtime::InMemoryThreadTimers::new(),
            KvLimits::DEFAULT,
        )),
        &InMemoryTaskManager::new(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_memory_async_call_store_passes_the_conformance_suite() {
    testing::async_call_store_all(Arc::new(keel_runtime::InMemoryAsyncCallStore::new())).await;
}

#[tokio::test]
async fn in_memory_stores_keep_every_tenants_rows_apart() {
    let services = keel_runtime::Services::in_memory(Arc::new(keel_llm::MockLlm::new()));
    testing::no_store_method_reaches_another_tenants_rows(&services).await;
}
