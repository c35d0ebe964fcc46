//! Conformance checks of [`AsyncCallStore`]: lookup by id alone, and the compare-and-set that
//! lets exactly one of several concurrent callbacks deliver a result.

use std::sync::Arc;

use serde_json::json;

use super::{fresh_tenant, fresh_thread};
use crate::{AsyncCall, AsyncCallState, AsyncCallStore};

fn fresh_call(state: AsyncCallState) -> AsyncCall {
    AsyncCall {
        call_id: uuid::Uuid::now_v7().to_string(),
        auth: fresh_tenant(),
        thread_id: fresh_thread(),
        state,
        record: json!({"task_id": "t-1", "secret_sha256": "ab", "nested": {"ünïcode": [1, 2.5]}}),
    }
}

/// Every [`AsyncCallStore`] check.
pub async fn async_call_store_all(store: Arc<dyn AsyncCallStore>) {
    async_call_store_round_trip(store.as_ref()).await;
    async_call_store_transition_is_compare_and_set(store.as_ref()).await;
    async_call_store_one_of_concurrent_transitions_wins(store).await;
}

/// A saved call is found by its id alone, with its tenant, thread, state and record; an
/// unknown id is `Ok(None)`; saving again replaces.
pub async fn async_call_store_round_trip(store: &dyn AsyncCallStore) {
    let call = fresh_call(AsyncCallState::Pending);
    store.put_async_call(&call).await.expect("put");
    let found = store
        .find_async_call(&call.call_id)
        .await
        .expect("find")
        .expect("a saved call is found by id");
    assert_eq!(found, call, "a call reads back as saved");
    assert!(
        store
            .find_async_call("no-such-call")
            .await
            .expect("find")
            .is_none(),
        "an unknown call id is Ok(None)"
    );
    let mut replaced = call.clone();
    replaced.record = json!({"replaced": true});
    store.put_async_call(&replaced).await.expect("put again");
    let found = store.find_async_call(&call.call_id).await.expect("find");
    assert_eq!(found, Some(replaced), "saving again replaces the call");
}

/// A transition happens only from the named state and only for the owning tenant; anything
/// else answers `false` and changes nothing.
pub async fn async_call_store_transition_is_compare_and_set(store: &dyn AsyncCallStore) {
    use AsyncCallState::{Delivered, Expired, Pending};
    let call = fresh_call(Pending);
    store.put_async_call(&call).await.expect("put");
    let other = fresh_tenant();
    assert!(
        !store
            .transition_async_call(&other, &call.call_id, Pending, Delivered, json!("x"))
            .await
            .expect("transition"),
        "another tenant cannot move a call"
    );
    assert!(
        !store
            .transition_async_call(&call.auth, &call.call_id, Delivered, Expired, json!("x"))
            .await
            .expect("transition"),
        "a call that is not in the `from` state does not move"
    );
    assert!(
        !store
            .transition_async_call(&call.auth, "no-such-call", Pending, Delivered, json!("x"))
            .await
            .expect("transition"),
        "an unknown call does not move"
    );
    let unchanged = store.find_async_call(&call.call_id).await.expect("find");
    assert_eq!(
        unchanged,
        Some(call.clone()),
        "refused transitions change nothing"
    );

    let record = json!({"output": {"file": "v.mp4"}});
    assert!(
        store
            .transition_async_call(
                &call.auth,
                &call.call_id,
                Pending,
                Delivered,
                record.clone()
            )
            .await
            .expect("transition"),
        "the owner moves a pending call"
    );
    let moved = store
        .find_async_call(&call.call_id)
        .await
        .expect("find")
        .expect("still there");
    assert_eq!(moved.state, Delivered);
    assert_eq!(moved.record, record);
    assert_eq!(moved.auth, call.auth);
    assert_eq!(moved.thread_id, call.thread_id);
    assert!(
        !store
            .transition_async_call(&call.auth, &call.call_id, Pending, Expired, json!("late"))
            .await
            .expect("transition"),
        "a delivered call cannot expire"
    );
}

/// Of many concurrent transitions of one pending call, exactly one succeeds and its record
/// is the one stored.
pub async fn async_call_store_one_of_concurrent_transitions_wins(store: Arc<dyn AsyncCallStore>) {
    let call = fresh_call(AsyncCallState::Pending);
    store.put_async_call(&call).await.expect("put");
    let attempts = (0..16).map(|i| {
        let (store, call) = (store.clone(), call.clone());
        tokio::spawn(async move {
            let won = store
                .transition_async_call(
                    &call.auth,
                    &call.call_id,
                    AsyncCallState::Pending,
                    AsyncCallState::Delivered,
                    json!({"attempt": i}),
                )
                .await
                .expect("transition");
            (i, won)
        })
    });
    let mut winners = Vec::new();
    for attempt in attempts.collect::<Vec<_>>() {
        let (i, won) = attempt.await.expect("task");
        if won {
            winners.push(i);
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one concurrent transition wins: {winners:?}"
    );
    let stored = store
        .find_async_call(&call.call_id)
        .await
        .expect("find")
        .expect("still there");
    assert_eq!(stored.record, json!({"attempt": winners[0]}));
}
