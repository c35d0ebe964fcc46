//! Conformance checks of [`MemoryService`]: JSON values round-trip per tenant, `save_if_absent`
//! claims a key once, and TTLs expire.

use std::time::Duration;

use serde_json::json;

use super::fresh_tenant;
use crate::MemoryService;

/// JSON values round-trip, delete reports existence, tenants are isolated.
pub async fn memory_round_trip(memory: &dyn MemoryService) {
    let (alice, bob) = (fresh_tenant(), fresh_tenant());
    let value = json!({"s": "ü", "n": 1.5, "b": true, "a": [1, null, {"x": []}], "z": null});
    memory
        .save_serialized(&alice, "key/with:odd chars ✓", value.clone())
        .await
        .unwrap();
    assert_eq!(
        memory
            .load_serialized(&alice, "key/with:odd chars ✓")
            .await
            .unwrap(),
        Some(value.clone())
    );
    assert_eq!(
        memory
            .load_serialized(&bob, "key/with:odd chars ✓")
            .await
            .unwrap(),
        None,
        "tenant isolation"
    );
    memory.save_serialized(&alice, "k", json!(1)).await.unwrap();
    memory.save_serialized(&alice, "k", json!(2)).await.unwrap();
    assert_eq!(
        memory.load_serialized(&alice, "k").await.unwrap(),
        Some(json!(2)),
        "save replaces"
    );
    assert!(
        !memory.delete(&bob, "k").await.unwrap(),
        "delete across tenants"
    );
    assert!(memory.delete(&alice, "k").await.unwrap());
    assert!(
        !memory.delete(&alice, "k").await.unwrap(),
        "second delete finds nothing"
    );
    assert_eq!(memory.load_serialized(&alice, "k").await.unwrap(), None);
}

/// `save_if_absent` is a claim: of many concurrent callers exactly one stores its value,
/// the key stays taken until deleted (or expired), and tenants claim separately.
pub async fn memory_save_if_absent_claims_once(memory: &dyn MemoryService) {
    let (alice, bob) = (fresh_tenant(), fresh_tenant());
    let long = Duration::from_secs(3600);
    let claim = |n: usize| memory.save_if_absent(&alice, "claim", json!(n), long);
    let (a, b, c, d) = tokio::join!(claim(0), claim(1), claim(2), claim(3));
    let won: Vec<bool> = [a, b, c, d].into_iter().map(Result::unwrap).collect();
    assert_eq!(
        won.iter().filter(|w| **w).count(),
        1,
        "exactly one concurrent claim wins: {won:?}"
    );
    let winner = won.iter().position(|w| *w).unwrap();
    assert_eq!(
        memory.load_serialized(&alice, "claim").await.unwrap(),
        Some(json!(winner)),
        "the winner's value is stored"
    );
    assert!(
        memory
            .save_if_absent(&bob, "claim", json!("bob"), long)
            .await
            .unwrap(),
        "another tenant's key is free"
    );
    assert!(memory.delete(&alice, "claim").await.unwrap());
    assert!(
        memory
            .save_if_absent(&alice, "claim", json!("again"), long)
            .await
            .unwrap(),
        "a deleted claim can be taken again"
    );
}

/// A value saved with a TTL is readable until it expires and gone after.
pub async fn memory_ttl(memory: &dyn MemoryService) {
    let auth = fresh_tenant();
    memory
        .save_serialized_with_ttl(&auth, "long", json!("stays"), Duration::from_secs(3600))
        .await
        .unwrap();
    memory
        .save_serialized_with_ttl(&auth, "short", json!("goes"), Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(
        memory.load_serialized(&auth, "long").await.unwrap(),
        Some(json!("stays"))
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    // Expiry is a matter of time passing: poll for it, bounded.
    while memory
        .load_serialized(&auth, "short")
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a 50 ms TTL value must expire"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        memory.load_serialized(&auth, "long").await.unwrap(),
        Some(json!("stays"))
    );
}

/// Deleting a key whose TTL has run out reports that nothing was there, even when nothing
/// read the key since it expired.
pub async fn memory_delete_of_expired_key_is_false(memory: &dyn MemoryService) {
    let auth = fresh_tenant();
    memory
        .save_serialized_with_ttl(&auth, "short", json!("goes"), Duration::from_millis(20))
        .await
        .unwrap();
    // Wait out the TTL on the wall clock only: a read could remove the key by itself.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        !memory.delete(&auth, "short").await.unwrap(),
        "delete of an expired key must answer false"
    );
    assert_eq!(memory.load_serialized(&auth, "short").await.unwrap(), None);
}
