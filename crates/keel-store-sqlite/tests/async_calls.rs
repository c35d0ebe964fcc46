//! The asynchronous-call store on a real SQLite file: the conformance checks, and the
//! compare-and-set holding between two stores opened on the same file (as two processes).

use std::sync::Arc;

use keel_runtime::{testing, AsyncCall, AsyncCallState, AsyncCallStore, AuthContext};
use keel_store_sqlite::SqliteStore;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_async_call_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("keel.db")).unwrap();
    testing::async_call_store_all(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_of_two_stores_on_one_file_delivers_a_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let a = Arc::new(SqliteStore::open(&path).unwrap());
    let b = Arc::new(SqliteStore::open(&path).unwrap());
    let auth = AuthContext::new("acme", "ops");
    for round in 0..8 {
        let call = AsyncCall {
            call_id: format!("call-{round}"),
            auth: auth.clone(),
            thread_id: "t".into(),
            state: AsyncCallState::Pending,
            record: json!({}),
        };
        a.put_async_call(&call).await.unwrap();
        let attempt = |store: Arc<SqliteStore>, who: &'static str| {
            let (auth, id) = (auth.clone(), call.call_id.clone());
            tokio::spawn(async move {
                store
                    .transition_async_call(
                        &auth,
                        &id,
                        AsyncCallState::Pending,
                        AsyncCallState::Delivered,
                        json!({"by": who}),
                    )
                    .await
                    .unwrap()
            })
        };
        let (x, y) = (attempt(a.clone(), "a"), attempt(b.clone(), "b"));
        let (x, y) = (x.await.unwrap(), y.await.unwrap());
        assert!(x ^ y, "exactly one store delivers (a: {x}, b: {y})");
        let stored = b.find_async_call(&call.call_id).await.unwrap().unwrap();
        assert_eq!(stored.record, json!({"by": if x { "a" } else { "b" }}));
    }
}
