//! Conformance checks of a [`ThreadStore`]'s history and inbox queue: contiguous seqs read
//! back in order, FIFO under concurrent producers, seqs that only grow, and a zero limit.

use std::collections::HashSet;
use std::sync::Arc;

use keel_core::conversation::LlmMessage;
use serde_json::json;

use super::{concurrently, fresh_tenant, fresh_thread, leased, tenant_and_thread, try_lease};
use crate::ThreadStore;

/// The newest entries before a seq read back in order with their seqs: the tail, a page
/// before a seq, a page that reaches the start, a limit of zero, another tenant's nothing.
pub async fn history_read_before(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let lease = try_lease(threads, &auth, &thread, "w1").await.unwrap();
    let batch: Vec<LlmMessage> = (1..=7).map(|i| LlmMessage::user(format!("m{i}"))).collect();
    threads.append_history(&auth, &lease, &batch).await.unwrap();
    let read = |before: u64, limit: usize| {
        let (auth, thread) = (auth.clone(), thread.clone());
        async move {
            threads
                .read_history_before(&auth, &thread, before, limit)
                .await
                .unwrap()
                .iter()
                .map(|e| {
                    assert_eq!(e.message.content, format!("m{}", e.seq), "seq {}", e.seq);
                    e.seq
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(read(u64::MAX, 3).await, [5, 6, 7], "the tail");
    assert_eq!(read(5, 3).await, [2, 3, 4], "a page before seq 5");
    assert_eq!(read(3, 10).await, [1, 2], "a page that reaches the start");
    assert_eq!(read(100, 2).await, [6, 7], "a bound past the end");
    assert!(
        read(1, 10).await.is_empty(),
        "nothing before the first entry"
    );
    assert!(read(u64::MAX, 0).await.is_empty(), "limit 0");
    assert!(
        threads
            .read_history_before(&fresh_tenant(), &thread, u64::MAX, 10)
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );
}

/// History entries get contiguous seqs from 1 and read back in order, by range.
pub async fn history_append_and_read(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    assert!(
        threads
            .read_history(&auth, &thread, 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "unknown thread has no history"
    );
    let lease = try_lease(threads, &auth, &thread, "w1").await.unwrap();
    let batch: Vec<LlmMessage> = (0..5).map(|i| LlmMessage::user(format!("m{i}"))).collect();
    assert_eq!(
        threads.append_history(&auth, &lease, &batch).await.unwrap(),
        5
    );
    assert_eq!(
        threads
            .append_history(&auth, &lease, &[LlmMessage::assistant("a", vec![])])
            .await
            .unwrap(),
        6
    );
    let all = threads.read_history(&auth, &thread, 0, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(all[0].message, batch[0], "messages round-trip");
    let middle = threads.read_history(&auth, &thread, 2, 2).await.unwrap();
    assert_eq!(
        middle
            .iter()
            .map(|e| e.message.content.as_str())
            .collect::<Vec<_>>(),
        ["m2", "m3"]
    );
    assert!(
        threads
            .read_history(&fresh_tenant(), &thread, 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );
}

/// Concurrent producers: every item is queued once, each producer's items in its order;
/// peek does not remove; ack does (idempotently) and needs the lease.
pub async fn queue_fifo_under_concurrent_producers(threads: Arc<dyn ThreadStore>) {
    let (auth, thread) = tenant_and_thread();
    concurrently(
        &threads,
        &auth,
        &thread,
        8,
        |threads, auth, thread, p| async move {
            for i in 0..25 {
                threads
                    .push_queue(&auth, &thread, json!({"p": p, "i": i}))
                    .await
                    .unwrap();
            }
        },
    )
    .await;
    assert_eq!(threads.queue_len(&auth, &thread).await.unwrap(), 200);
    let items = threads.peek_queue(&auth, &thread, 1000).await.unwrap();
    assert_eq!(items.len(), 200, "peek must not lose items");
    assert!(
        items.windows(2).all(|w| w[0].seq < w[1].seq),
        "items come oldest first"
    );
    let ids: HashSet<_> = items.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids.len(), 200, "ids are unique");
    for p in 0..8 {
        let order: Vec<i64> = items
            .iter()
            .filter(|i| i.payload["p"] == p)
            .map(|i| i.payload["i"].as_i64().unwrap())
            .collect();
        assert_eq!(
            order,
            (0..25).collect::<Vec<_>>(),
            "producer {p}'s items keep their order"
        );
    }
    assert_eq!(
        threads.queue_len(&auth, &thread).await.unwrap(),
        200,
        "peek does not remove"
    );
    let lease = try_lease(threads.as_ref(), &auth, &thread, "consumer")
        .await
        .unwrap();
    let first: Vec<String> = items[..10].iter().map(|i| i.id.clone()).collect();
    threads.ack_queue(&auth, &lease, &first).await.unwrap();
    threads.ack_queue(&auth, &lease, &first).await.unwrap();
    assert_eq!(
        threads.queue_len(&auth, &thread).await.unwrap(),
        190,
        "ack removes, once"
    );
    let next = threads.peek_queue(&auth, &thread, 1).await.unwrap();
    assert_eq!(next[0].id, items[10].id, "the front moves on");
    assert_eq!(
        threads.queue_len(&fresh_tenant(), &thread).await.unwrap(),
        0,
        "tenant isolation"
    );
}

/// A limit of 0 reads nothing, from history and queue alike.
pub async fn history_and_queue_limit_zero_is_empty(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let lease = leased(threads, &auth, &thread).await;
    threads
        .append_history(
            &auth,
            &lease,
            &[LlmMessage::user("a"), LlmMessage::user("b")],
        )
        .await
        .unwrap();
    threads
        .push_queue(&auth, &thread, json!({"n": 1}))
        .await
        .unwrap();
    for (from, limit, len, what) in [
        (0, 0, 0, "read_history with limit 0"),
        (1, 0, 0, "read_history with limit 0 from the middle"),
        (0, 1, 1, "read_history with limit 1"),
    ] {
        let read = threads.read_history(&auth, &thread, from, limit).await;
        assert_eq!(read.unwrap().len(), len, "{what}");
    }
    for (limit, len, what) in [
        (0, 0, "peek_queue with limit 0"),
        (1, 1, "peek_queue with limit 1"),
    ] {
        let peeked = threads.peek_queue(&auth, &thread, limit).await;
        assert_eq!(peeked.unwrap().len(), len, "{what}");
    }
}

/// Queue seqs only grow: after every item is acknowledged and the queue is empty, the next
/// item gets a larger seq than any before it.
pub async fn queue_seqs_grow_after_the_queue_empties(threads: &dyn ThreadStore) {
    let (auth, thread) = tenant_and_thread();
    let lease = leased(threads, &auth, &thread).await;
    let mut last_seq = 0;
    for round in 0..3 {
        let mut acked = Vec::new();
        for i in 0..2 {
            let item = threads
                .push_queue(&auth, &thread, json!({"round": round, "i": i}))
                .await
                .unwrap();
            assert!(
                item.seq > last_seq,
                "queue seqs must grow, even after the queue emptied (round {round}: {} after {last_seq})",
                item.seq
            );
            last_seq = item.seq;
            acked.push(item.id);
        }
        threads.ack_queue(&auth, &lease, &acked).await.unwrap();
        assert_eq!(threads.queue_len(&auth, &thread).await.unwrap(), 0);
        assert!(threads
            .peek_queue(&auth, &thread, 10)
            .await
            .unwrap()
            .is_empty());
    }
}

/// A tenant's queued work is counted over all its threads and lists the threads that hold
/// some: a push adds, an ack removes, an emptied queue's thread leaves the list, and another
/// tenant sees none of it.
pub async fn queue_counts_per_tenant(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let (a, b) = (fresh_thread(), fresh_thread());
    assert_eq!(threads.tenant_queue_len(&auth).await.unwrap(), 0);
    assert!(threads.queued_threads(&auth).await.unwrap().is_empty());
    let mut first_of_a = Vec::new();
    for i in 0..3 {
        let item = threads
            .push_queue(&auth, &a, json!({"i": i}))
            .await
            .unwrap();
        first_of_a.push(item.id);
    }
    let only_of_b = threads
        .push_queue(&auth, &b, json!({"i": 0}))
        .await
        .unwrap();
    assert_eq!(threads.tenant_queue_len(&auth).await.unwrap(), 4);
    let listed: HashSet<_> = threads
        .queued_threads(&auth)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(listed, HashSet::from([a.clone(), b.clone()]));
    let other = fresh_tenant();
    assert_eq!(
        threads.tenant_queue_len(&other).await.unwrap(),
        0,
        "tenant isolation"
    );
    assert!(threads.queued_threads(&other).await.unwrap().is_empty());

    let lease_b = leased(threads, &auth, &b).await;
    threads
        .ack_queue(&auth, &lease_b, &[only_of_b.id])
        .await
        .unwrap();
    let lease_a = leased(threads, &auth, &a).await;
    threads
        .ack_queue(&auth, &lease_a, &first_of_a[..1])
        .await
        .unwrap();
    // Acknowledging again removes nothing more.
    threads
        .ack_queue(&auth, &lease_a, &first_of_a[..1])
        .await
        .unwrap();
    assert_eq!(threads.tenant_queue_len(&auth).await.unwrap(), 2);
    assert_eq!(
        threads.queued_threads(&auth).await.unwrap(),
        vec![a.clone()]
    );
    threads
        .ack_queue(&auth, &lease_a, &first_of_a[1..])
        .await
        .unwrap();
    assert_eq!(threads.tenant_queue_len(&auth).await.unwrap(), 0);
    assert!(threads.queued_threads(&auth).await.unwrap().is_empty());
}
