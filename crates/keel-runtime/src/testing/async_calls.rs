//! Conformance checks of [`AsyncCallStore`]: lookup by id alone, and the compare-and-set that
//! lets exactly one of several concurrent callbacks deliver a result.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{fresh_tenant, fresh_thread};
use crate::{AsyncCall, AsyncCallState, AsyncCallStore, AuthContext};

fn fresh_call(state: AsyncCallState) -> AsyncCall {
    AsyncCall {
        call_id: uuid::Uuid::now_v7().to_string(),
        auth: fresh_tenant(),
        thread_id: fresh_thread(),
        state,
        record: json!({"task_id": "t-1", "secret_sha256": "ab", "nested": {"ünïcode": [1, 2.5]}}),
    }
}

/// The call stored under `call_id`, if any.
async fn stored(store: &dyn AsyncCallStore, call_id: &str) -> Option<AsyncCall> {
    store.find_async_call(call_id).await.expect("find")
}

/// Whether the compare-and-set moves the call `call_id` from `from` to `to` for `auth`.
async fn moves(
    store: &dyn AsyncCallStore,
    auth: &AuthContext,
    call_id: &str,
    (from, to): (AsyncCallState, AsyncCallState),
    record: Value,
) -> bool {
    store
        .transition_async_call(auth, call_id, from, to, record)
        .await
        .expect("transition")
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
    let found = stored(store, &call.call_id)
        .await
        .expect("a saved call is found by id");
    assert_eq!(found, call, "a call reads back as saved");
    assert!(
        stored(store, "no-such-call").await.is_none(),
        "an unknown call id is Ok(None)"
    );
    let mut replaced = call.clone();
    replaced.record = json!({"replaced": true});
    store.put_async_call(&replaced).await.expect("put again");
    let found = stored(store, &call.call_id).await;
    assert_eq!(found, Some(replaced), "saving again replaces the call");
}

/// A transition happens only from the named state and only for the owning tenant; anything
/// else answers `false` and changes nothing.
pub async fn async_call_store_transition_is_compare_and_set(store: &dyn AsyncCallStore) {
    use AsyncCallState::{Delivered, Expired, Pending};
    let call = fresh_call(Pending);
    store.put_async_call(&call).await.expect("put");
    let (owner, id, other) = (&call.auth, call.call_id.as_str(), fresh_tenant());
    assert!(
        !moves(store, &other, id, (Pending, Delivered), json!("x")).await,
        "another tenant cannot move a call"
    );
    assert!(
        !moves(store, owner, id, (Delivered, Expired), json!("x")).await,
        "a call that is not in the `from` state does not move"
    );
    assert!(
        !moves(
            store,
            owner,
            "no-such-call",
            (Pending, Delivered),
            json!("x")
        )
        .await,
        "an unknown call does not move"
    );
    let unchanged = stored(store, &call.call_id).await;
    assert_eq!(
        unchanged,
        Some(call.clone()),
        "refused transitions change nothing"
    );

    let record = json!({"output": {"file": "v.mp4"}});
    assert!(
        moves(store, owner, id, (Pending, Delivered), record.clone()).await,
        "the owner moves a pending call"
    );
    let moved = stored(store, &call.call_id).await.expect("still there");
    assert_eq!(moved.state, Delivered);
    assert_eq!(moved.record, record);
    assert_eq!(moved.auth, call.auth);
    assert_eq!(moved.thread_id, call.thread_id);
    assert!(
        !moves(store, owner, id, (Pending, Expired), json!("late")).await,
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
    let winner = stored(store.as_ref(), &call.call_id)
        .await
        .expect("still there");
    assert_eq!(winner.record, json!({"attempt": winners[0]}));
}
