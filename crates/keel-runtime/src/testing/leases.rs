//! Conformance checks of [`ThreadStore`] leases: one holder at a time, fencing by token,
//! release, reclaiming by the same holder, and the TTL bounds.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use keel_core::AgentError;
use serde_json::json;

use super::{
    append_one, assert_lease_lost, concurrently, eventually, fresh_tenant, fresh_thread,
    history_len, leased, tenant_and_thread, try_lease,
};
use crate::{AuthContext, Lease, ThreadLeases, ThreadStore};
use keel_core::ThreadId;

/// Assert that `lease` is dead (`why` says how it died): writing, acknowledging `acked` and
/// renewing with it are all [`AgentError::LeaseLost`].
async fn assert_dead(
    threads: &dyn ThreadStore,
    auth: &AuthContext,
    lease: &Lease,
    acked: &[String],
    why: &str,
) {
    assert_lease_lost(
        append_one(threads, auth, lease, why).await,
        &format!("write {why}"),
    );
    assert_lease_lost(
        threads.ack_queue(auth, lease, acked).await,
        &format!("ack {why}"),
    );
    assert_lease_lost(
        threads
            .renew_lease(auth, lease, Duration::from_secs(30))
            .await,
        &format!("renew {why}"),
    );
}

/// `a` takes a short lease on `thread` and `b`, a second store over the same data, takes the
/// thread over once that lease lapsed: the stale lease and the new one. How a backend's own
/// tests set up a stale holder in another process.
pub async fn lease_taken_over(
    a: &dyn ThreadLeases,
    b: &dyn ThreadLeases,
    auth: &AuthContext,
    thread: &ThreadId,
) -> (Lease, Lease) {
    let old = a
        .acquire_lease(auth, thread, "a", Duration::from_millis(30))
        .await
        .unwrap()
        .expect("a fresh thread is free");
    let new = eventually(
        "the lease of `a` lapses and `b` takes the thread",
        || async {
            b.acquire_lease(auth, thread, "b", Duration::from_secs(30))
                .await
                .unwrap()
        },
    )
    .await;
    assert!(new.token > old.token, "tokens grow across stores");
    (old, new)
}

/// Many tasks racing for one thread's lease: exactly one wins; other threads are independent.
pub async fn lease_exclusive_under_contention(threads: Arc<dyn ThreadStore>) {
    let (auth, thread) = tenant_and_thread();
    let won = concurrently(
        &threads,
        &auth,
        &thread,
        32,
        |threads, auth, thread, i| async move {
            try_lease(threads.as_ref(), &auth, &thread, &format!("w{i}")).await
        },
    )
    .await;
    let winners = won.iter().filter(|lease| lease.is_some()).count();
    assert_eq!(winners, 1, "exactly one racer may hold a thread's lease");
    let other = try_lease(threads.as_ref(), &auth, &fresh_thread(), "w").await;
    assert!(other.is_some(), "another thread's lease is independent");
    let other_tenant = try_lease(threads.as_ref(), &fresh_tenant(), &thread, "w").await;
    assert!(
        other_tenant.is_some(),
        "another tenant's thread of the same id is independent"
    );
}

/// Tokens grow; a holder whose lease expired or was taken over cannot write, renew or ack.
pub async fn lease_fencing(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let short = threads
        .acquire_lease(&auth, &thread, "slow", Duration::from_millis(40))
        .await
        .unwrap()
        .unwrap();
    let renewed = threads
        .renew_lease(&auth, &short, Duration::from_millis(40))
        .await
        .unwrap();
    assert_eq!(renewed.token, short.token, "renewal keeps the token");
    assert!(renewed.expires_at >= short.expires_at);
    // Wait (bounded) for the lease to lapse: an expired lease must not be usable even before
    // anyone else takes the thread.
    let lapsed = renewed.expires_at + chrono::Duration::milliseconds(5);
    eventually(
        "the renewed lease lapses",
        || async move { Utc::now() > lapsed },
    )
    .await;
    assert_dead(threads, &auth, &renewed, &[], "with an expired lease").await;

    let next = try_lease(threads, &auth, &thread, "fast").await.unwrap();
    assert!(next.token > renewed.token, "fencing tokens must grow");
    assert_dead(threads, &auth, &renewed, &[], "with a taken-over lease").await;
    threads.release_lease(&auth, &renewed).await.unwrap();
    assert!(
        try_lease(threads, &auth, &thread, "third").await.is_none(),
        "releasing a stale lease must not free the current holder's lease"
    );
    append_one(threads, &auth, &next, "ok").await.unwrap();
    assert_eq!(
        history_len(threads, &auth, &thread).await,
        1,
        "only the holder's write landed"
    );
    threads.release_lease(&auth, &next).await.unwrap();
    threads.release_lease(&auth, &next).await.unwrap();
    let after = try_lease(threads, &auth, &thread, "fourth").await.unwrap();
    assert!(after.token > next.token);
}

/// A released lease is dead: writing, acknowledging and renewing with it are `LeaseLost`,
/// nothing lands, and the thread can be leased again with a larger token.
pub async fn lease_is_dead_after_release(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let lease = leased(threads, &auth, &thread).await;
    let item = threads
        .push_queue(&auth, &thread, json!("pending"))
        .await
        .unwrap();
    threads.release_lease(&auth, &lease).await.unwrap();
    assert_dead(
        threads,
        &auth,
        &lease,
        std::slice::from_ref(&item.id),
        "after release",
    )
    .await;
    assert_eq!(
        history_len(threads, &auth, &thread).await,
        0,
        "nothing was written after release"
    );
    assert_eq!(
        threads.queue_len(&auth, &thread).await.unwrap(),
        1,
        "nothing was acknowledged after release"
    );
    let again = try_lease(threads, &auth, &thread, "w")
        .await
        .expect("a released thread can be leased again");
    assert!(
        again.token > lease.token,
        "fencing tokens grow across release"
    );
}

/// `reclaim_lease` takes a live lease back only for the holder that holds it, with a larger
/// token that fences the replaced lease out; another holder's live lease is refused (and
/// `acquire_lease` never takes a live lease, its holder's included); a free thread is taken
/// as `acquire_lease` would take it.
pub async fn lease_reclaimed_only_by_its_holder(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let old = try_lease(threads, &auth, &thread, "instance-a")
        .await
        .unwrap();
    assert!(
        try_reclaim(threads, (&auth, &thread), "instance-b")
            .await
            .is_none(),
        "another holder's live lease is not reclaimed"
    );
    assert!(
        try_lease(threads, &auth, &thread, "instance-a")
            .await
            .is_none(),
        "acquire never takes a live lease"
    );
    let new = try_reclaim(threads, (&auth, &thread), "instance-a")
        .await
        .expect("the holder takes its own live lease back");
    assert_eq!(new.holder, "instance-a");
    assert!(new.token > old.token, "a reclaimed lease has a new token");
    assert_lease_lost(
        append_one(threads, &auth, &old, "stale").await,
        "the replaced lease is fenced out",
    );
    append_one(threads, &auth, &new, "fresh").await.unwrap();
    let history = threads.read_history(&auth, &thread, 0, 10).await.unwrap();
    assert_eq!(history.len(), 1, "only the reclaimed lease wrote");
    let free = fresh_thread();
    assert!(
        try_reclaim(threads, (&auth, &free), "instance-b")
            .await
            .is_some(),
        "a free thread is taken"
    );
}

/// Try to reclaim `thread`'s lease for 30 s as `holder`: the lease, or `None` while another
/// holder holds it (the `reclaim_lease` twin of `try_lease`).
async fn try_reclaim(
    threads: &dyn ThreadStore,
    (auth, thread): (&AuthContext, &ThreadId),
    holder: &str,
) -> Option<Lease> {
    threads
        .reclaim_lease(auth, thread, holder, Duration::from_secs(30))
        .await
        .unwrap()
}

/// Lease TTLs must lie in 1 ms ..= 24 h (see [`crate::check_lease_ttl`]); anything else is
/// `InvalidInput` naming `ttl`, for acquire and renew alike, and changes nothing.
pub async fn lease_ttl_bounds(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let bad = [
        Duration::ZERO,
        Duration::from_micros(1),
        Duration::from_micros(999),
        Duration::from_secs(86_400) + Duration::from_millis(1),
    ];
    let is_ttl_error =
        |err: &AgentError| matches!(err, AgentError::InvalidInput { field, .. } if field == "ttl");
    for ttl in bad {
        let err = threads
            .acquire_lease(&auth, &thread, "w", ttl)
            .await
            .unwrap_err();
        assert!(is_ttl_error(&err), "acquire with ttl {ttl:?}: {err:?}");
    }
    let lease = try_lease(threads, &auth, &thread, "w")
        .await
        .expect("rejected acquisitions must not hold the thread");
    for ttl in bad {
        let err = threads.renew_lease(&auth, &lease, ttl).await.unwrap_err();
        assert!(is_ttl_error(&err), "renew with ttl {ttl:?}: {err:?}");
    }
    append_one(threads, &auth, &lease, "still held")
        .await
        .expect("a rejected renewal leaves the lease as it was");
    threads
        .renew_lease(&auth, &lease, Duration::from_secs(86_400))
        .await
        .expect("24 h is allowed");
    threads.release_lease(&auth, &lease).await.unwrap();
    threads
        .acquire_lease(&auth, &fresh_thread(), "w", Duration::from_millis(1))
        .await
        .expect("1 ms is allowed")
        .expect("a fresh thread is free");
}
