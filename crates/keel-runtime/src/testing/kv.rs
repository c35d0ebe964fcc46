//! Conformance checks of a [`ThreadStore`]'s per-thread key-value store: JSON round-trip,
//! null deletes, isolation, and the caps of [`KvLimits`].

use keel_core::{AgentError, AgentResult};
use serde_json::{json, Value};

use super::{fresh_tenant, fresh_thread};
use crate::{KvLimits, ThreadStore};

/// Assert that a write past a cap failed with an error naming `cap`.
#[track_caller]
fn assert_names_cap(result: AgentResult<()>, cap: &str) {
    let err = result.expect_err(cap);
    assert!(
        err.to_string().contains(cap),
        "the {cap} cap error names the cap: {err}"
    );
}

/// §14: JSON round-trip, null deletes, per-thread isolation, caps with errors naming them.
pub async fn kv_semantics(threads: &dyn ThreadStore, limits: KvLimits) {
    let auth = fresh_tenant();
    let (thread, sibling) = (fresh_thread(), fresh_thread());
    assert_eq!(
        threads.kv_get(&auth, &thread, "missing").await.unwrap(),
        None,
        "never written is None"
    );
    for (key, value) in [
        ("object", json!({"a": {"b": [1, 2, {"c": null}]}})),
        ("array", json!([1, "two", 3.5, false])),
        ("string", json!("ünïcödé")),
        ("number", json!(-12.25)),
        ("bool", json!(true)),
    ] {
        threads
            .kv_set(&auth, &thread, key, value.clone())
            .await
            .unwrap();
        assert_eq!(
            threads.kv_get(&auth, &thread, key).await.unwrap(),
            Some(value),
            "{key} round-trips"
        );
    }
    assert_eq!(
        threads.kv_keys(&auth, &thread).await.unwrap(),
        ["array", "bool", "number", "object", "string"]
    );
    threads
        .kv_set(&auth, &thread, "string", Value::Null)
        .await
        .unwrap();
    threads
        .kv_set(&auth, &thread, "never-set", Value::Null)
        .await
        .expect("deleting a key never set is fine");
    let other = fresh_tenant();
    for (auth, thread, key, rule) in [
        (&auth, &thread, "string", "null deletes"),
        (&auth, &sibling, "object", "threads are isolated"),
        (&other, &thread, "object", "tenants are isolated"),
    ] {
        let read = threads.kv_get(auth, thread, key).await;
        assert_eq!(read.unwrap(), None, "{rule}");
    }

    let long_key = "k".repeat(limits.max_key_bytes + 1);
    assert_names_cap(
        threads.kv_set(&auth, &thread, &long_key, json!(1)).await,
        "max_key_bytes",
    );
    let big = json!("x".repeat(limits.max_value_bytes));
    assert_names_cap(
        threads.kv_set(&auth, &thread, "big", big).await,
        "max_value_bytes",
    );
    assert_eq!(
        threads.kv_get(&auth, &thread, "big").await.unwrap(),
        None,
        "a rejected write stores nothing"
    );
    let err = threads
        .kv_set(&auth, &thread, "", json!(1))
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "empty key");

    if limits.max_keys <= 64 {
        let full = fresh_thread();
        for i in 0..limits.max_keys {
            threads
                .kv_set(&auth, &full, &format!("k{i}"), json!(i))
                .await
                .unwrap();
        }
        assert_names_cap(
            threads.kv_set(&auth, &full, "one-more", json!(1)).await,
            "max_keys",
        );
        threads
            .kv_set(&auth, &full, "k0", json!("replaced"))
            .await
            .unwrap();
    }
}
