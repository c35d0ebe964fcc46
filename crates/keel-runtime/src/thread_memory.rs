//! In-memory thread storage: history, queue, key-value store, subagent registry and leases.

use std::collections::{BTreeMap, VecDeque};

use async_trait::async_trait;
use chrono::Utc;
use dashmap::DashMap;

use crate::scoped::{scoped, Scoped, ScopedParts};
use keel_core::conversation::LlmMessage;
use keel_core::{AgentResult, ThreadId};
use serde_json::Value;

use crate::{
    lease_blocks, lease_ttl, AuthContext, ChildThread, HistoryEntry, KvLimits, Lease, LeaseAsk,
    LeaseRenewal, QueuedItem, SubagentRegistry, ThreadHistory, ThreadKv, ThreadLeases, ThreadQueue,
};

#[derive(Default)]
struct ThreadData {
    history: Vec<LlmMessage>,
    queue: VecDeque<QueuedItem>,
    kv: BTreeMap<String, Value>,
    lease: Option<Lease>,
}

impl ThreadData {
    /// Whether `lease` is this thread's current, unexpired lease.
    fn check_fence(&self, lease: &Lease) -> AgentResult<()> {
        lease.check_fence(
            self.lease.as_ref().map(|l| (l.token, l.expires_at)),
            Utc::now(),
        )
    }
}

/// Thread storage in process memory: nothing survives a restart.
///
/// Retention is bounded so memory stays flat under load: past
/// [`InMemoryThreadStore::DEFAULT_MAX_THREADS`] (or the configured number of) threads, the
/// oldest idle ones (no live lease, nothing queued) are evicted with their history and
/// key-value store. Busy threads are never evicted. Fencing tokens and queue seqs come from
/// store-wide counters, so a thread created again after eviction never reuses one.
pub struct InMemoryThreadStore {
    threads: DashMap<Scoped<ThreadId>, ThreadData, foldhash::fast::RandomState>,
    children: DashMap<Scoped<ThreadId>, ChildThread, foldhash::fast::RandomState>,
    kv_limits: KvLimits,
    order: std::sync::Mutex<VecDeque<Scoped<ThreadId>>>,
    max_threads: usize,
    next_token: std::sync::atomic::AtomicU64,
    next_queue_seq: std::sync::atomic::AtomicU64,
    /// Per tenant namespace, its threads with queued work and how many items each holds:
    /// kept beside the queues so that a tenant's count and its queued threads cost no scan
    /// of every thread.
    queued:
        DashMap<String, std::collections::HashMap<ThreadId, usize>, foldhash::fast::RandomState>,
}

impl Default for InMemoryThreadStore {
    fn default() -> Self {
        Self {
            threads: DashMap::default(),
            children: DashMap::default(),
            kv_limits: KvLimits::default(),
            order: Default::default(),
            max_threads: Self::DEFAULT_MAX_THREADS,
            next_token: Default::default(),
            next_queue_seq: Default::default(),
            queued: DashMap::default(),
        }
    }
}

impl InMemoryThreadStore {
    /// How many threads are kept by default.
    pub const DEFAULT_MAX_THREADS: usize = 10_000;

    /// An empty store with the default [`KvLimits`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep at most `max` threads (at least 1), evicting idle ones beyond it.
    #[must_use]
    pub fn with_max_threads(mut self, max: usize) -> Self {
        self.max_threads = max.max(1);
        self
    }

    /// How many threads are held.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Whether no thread is held.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// The thread's data for writing, created (and counted for retention) when new.
    fn thread_entry(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> dashmap::mapref::one::RefMut<'_, Scoped<ThreadId>, ThreadData> {
        if let Some(thread) = self
            .threads
            .get_mut(&scoped(auth, thread_id) as &dyn ScopedParts<ThreadId>)
        {
            return thread;
        }
        let key = Self::key(auth, thread_id);
        // Evict before taking the entry: holding a map reference while removing other keys
        // could deadlock on a shared shard.
        self.evict_idle();
        self.order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(key.clone());
        self.threads.entry(key).or_default()
    }

    fn evict_idle(&self) {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let now = Utc::now();
        let mut looked = 0;
        while order.len() >= self.max_threads && looked < order.len() {
            let Some(oldest) = order.pop_front() else {
                break;
            };
            let idle = |t: &ThreadData| {
                t.queue.is_empty() && t.lease.as_ref().is_none_or(|l| l.expires_at <= now)
            };
            let gone = !self.threads.contains_key(&oldest)
                || self.threads.remove_if(&oldest, |_, t| idle(t)).is_some();
            if !gone {
                order.push_back(oldest);
                looked += 1;
            }
        }
    }

    /// Use other key-value caps.
    #[must_use]
    pub fn with_kv_limits(mut self, limits: KvLimits) -> Self {
        self.kv_limits = limits;
        self
    }

    fn key(auth: &AuthContext, thread_id: &ThreadId) -> Scoped<ThreadId> {
        Scoped::new(auth, thread_id.clone())
    }

    /// The entries at the indexes `range` picks out of the thread's history length, with
    /// their seqs (entry seq n sits at index n - 1); none for a thread never written.
    fn history_range(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        range: impl FnOnce(usize) -> std::ops::Range<usize>,
    ) -> Vec<HistoryEntry> {
        self.read_thread(auth, thread_id, |thread| {
            let range = range(thread.history.len());
            let first_seq = range.start as u64 + 1;
            (first_seq..)
                .zip(&thread.history[range])
                .map(|(seq, message)| HistoryEntry {
                    seq,
                    message: message.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
    }

    /// What `read` takes from the thread's data, or `None` for a thread never written: the
    /// one lookup every read of a thread goes through.
    fn read_thread<T>(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        read: impl FnOnce(&ThreadData) -> T,
    ) -> Option<T> {
        self.threads
            .get(&scoped(auth, thread_id) as &dyn ScopedParts<ThreadId>)
            .map(|thread| read(&thread))
    }

    /// The thread's data, locked for writing, when `lease` is its current, unexpired lease;
    /// [`AgentError::LeaseLost`] otherwise. A thread that was never leased has no entry, and
    /// a refused write must not create one: a client sending made-up leases would otherwise
    /// grow the map without bound.
    fn fenced(
        &self,
        auth: &AuthContext,
        lease: &Lease,
    ) -> AgentResult<dashmap::mapref::one::RefMut<'_, Scoped<ThreadId>, ThreadData>> {
        let thread = self
            .threads
            .get_mut(&scoped(auth, &lease.thread_id) as &dyn ScopedParts<ThreadId>)
            .ok_or_else(|| lease.lost())?;
        thread.check_fence(lease)?;
        Ok(thread)
    }
}

#[async_trait]
impl ThreadHistory for InMemoryThreadStore {
    async fn append_history(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        messages: &[LlmMessage],
    ) -> AgentResult<u64> {
        let mut thread = self.fenced(auth, lease)?;
        thread.history.extend_from_slice(messages);
        Ok(thread.history.len() as u64)
    }

    async fn read_history(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        // Entry seq n sits at index n - 1: `seq > after_seq` starts at index after_seq.
        let start = usize::try_from(after_seq).unwrap_or(usize::MAX);
        Ok(self.history_range(auth, thread_id, |len| {
            start.min(len)..start.saturating_add(limit).min(len)
        }))
    }

    async fn read_history_before(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        before_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        // Entry seq n sits at index n - 1: `seq < before_seq` ends before index before_seq - 1.
        let end = usize::try_from(before_seq.saturating_sub(1)).unwrap_or(usize::MAX);
        Ok(self.history_range(auth, thread_id, |len| {
            let end = end.min(len);
            end.saturating_sub(limit)..end
        }))
    }
}

#[async_trait]
impl ThreadQueue for InMemoryThreadStore {
    async fn push_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        let seq = self
            .next_queue_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mut thread = self.thread_entry(auth, thread_id);
        let item = QueuedItem {
            id: uuid::Uuid::now_v7().to_string(),
            seq,
            payload,
            enqueued_at: Utc::now(),
        };
        thread.queue.push_back(item.clone());
        *self
            .queued
            .entry(auth.namespace())
            .or_default()
            .entry(thread_id.clone())
            .or_default() += 1;
        Ok(item)
    }

    async fn peek_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>> {
        Ok(self
            .read_thread(auth, thread_id, |t| {
                t.queue.iter().take(limit).cloned().collect()
            })
            .unwrap_or_default())
    }

    async fn ack_queue(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        let mut thread = self.fenced(auth, lease)?;
        let before = thread.queue.len();
        thread.queue.retain(|item| !ids.contains(&item.id));
        let (left, removed) = (thread.queue.len(), before - thread.queue.len());
        if removed > 0 {
            if let Some(mut tenant) = self.queued.get_mut(&auth.namespace()) {
                if left == 0 {
                    tenant.remove(&lease.thread_id);
                } else {
                    tenant.insert(lease.thread_id.clone(), left);
                }
            }
            self.queued
                .remove_if(&auth.namespace(), |_, tenant| tenant.is_empty());
        }
        Ok(())
    }

    async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize> {
        Ok(self
            .read_thread(auth, thread_id, |t| t.queue.len())
            .unwrap_or(0))
    }

    async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
        Ok(self
            .queued
            .get(&auth.namespace())
            .map(|tenant| tenant.values().sum())
            .unwrap_or(0))
    }

    async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
        Ok(self
            .queued
            .get(&auth.namespace())
            .map(|tenant| tenant.keys().cloned().collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl ThreadKv for InMemoryThreadStore {
    async fn kv_get(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
    ) -> AgentResult<Option<Value>> {
        Ok(self
            .read_thread(auth, thread_id, |t| t.kv.get(key).cloned())
            .flatten())
    }

    async fn kv_set(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        // Size caps are checked by `Validated`; the key count needs the thread's lock.
        let mut thread = self.thread_entry(auth, thread_id);
        if value.is_null() {
            thread.kv.remove(key);
            return Ok(());
        }
        if !thread.kv.contains_key(key) && thread.kv.len() >= self.kv_limits.max_keys {
            return Err(self.kv_limits.too_many_keys());
        }
        thread.kv.insert(key.to_owned(), value);
        Ok(())
    }

    async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>> {
        Ok(self
            .read_thread(auth, thread_id, |t| t.kv.keys().cloned().collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl SubagentRegistry for InMemoryThreadStore {
    async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()> {
        self.children
            .insert(Self::key(auth, &child.thread_id), child.clone());
        Ok(())
    }

    async fn children(
        &self,
        auth: &AuthContext,
        parent: &ThreadId,
    ) -> AgentResult<Vec<ChildThread>> {
        let mut children: Vec<ChildThread> = self
            .children
            .iter()
            .filter(|c| c.key().is_of(auth) && &c.parent_thread_id == parent)
            .map(|c| c.value().clone())
            .collect();
        ChildThread::sort_oldest_first(&mut children);
        Ok(children)
    }

    async fn child(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
    ) -> AgentResult<Option<ChildThread>> {
        Ok(self
            .children
            .get(&scoped(auth, child) as &dyn ScopedParts<ThreadId>)
            .map(|c| c.clone()))
    }

    async fn set_child_status(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
        status: &str,
    ) -> AgentResult<()> {
        let mut entry = self
            .children
            .get_mut(&scoped(auth, child) as &dyn ScopedParts<ThreadId>)
            .ok_or_else(|| ChildThread::not_registered(child))?;
        entry.status = status.to_owned();
        Ok(())
    }
}

#[async_trait]
impl ThreadLeases for InMemoryThreadStore {
    async fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>> {
        let ttl = lease_ttl(ask.ttl)?;
        let mut thread = self.thread_entry(auth, ask.thread_id);
        let now = Utc::now();
        let current = thread
            .lease
            .as_ref()
            .map(|l| (l.holder.as_str(), l.expires_at));
        if lease_blocks(current, ask.holder, ask.reclaim, now) {
            return Ok(None);
        }
        let token = self
            .next_token
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let lease = ask.granted(token, now + ttl);
        thread.lease = Some(lease.clone());
        Ok(Some(lease))
    }

    async fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease> {
        let ttl = lease_ttl(renewal.ttl)?;
        let mut thread = self.fenced(auth, renewal.lease)?;
        let renewed = renewal.renewed(Utc::now() + ttl);
        thread.lease = Some(renewed.clone());
        Ok(renewed)
    }

    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()> {
        if let Some(mut thread) = self
            .threads
            .get_mut(&scoped(auth, &lease.thread_id) as &dyn ScopedParts<ThreadId>)
        {
            if thread
                .lease
                .as_ref()
                .is_some_and(|l| l.token == lease.token)
            {
                thread.lease = None;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::AgentError;
    use std::time::Duration;

    #[tokio::test]
    async fn writes_with_a_made_up_lease_create_no_thread() {
        let store = InMemoryThreadStore::new();
        let auth = AuthContext::new("app", "mallory");
        for i in 0..10 {
            let bogus = Lease {
                thread_id: ThreadId::from(format!("never-leased-{i}")),
                holder: "mallory".into(),
                token: 1,
                expires_at: Utc::now() + chrono::Duration::hours(1),
            };
            let err = store
                .append_history(&auth, &bogus, &[LlmMessage::user("x")])
                .await
                .unwrap_err();
            assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
            let err = store.ack_queue(&auth, &bogus, &[]).await.unwrap_err();
            assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
            let err = store
                .renew_lease(&auth, &bogus, Duration::from_secs(1))
                .await
                .unwrap_err();
            assert!(matches!(err, AgentError::LeaseLost { .. }), "{err:?}");
        }
        assert_eq!(store.threads.len(), 0, "refused writes must not allocate");
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;
    use crate::{ThreadKv, ThreadLeases};
    use std::time::Duration;

    #[tokio::test]
    async fn idle_threads_are_evicted_past_the_cap_and_busy_ones_are_kept() {
        let store = InMemoryThreadStore::new().with_max_threads(3);
        let auth = AuthContext::new("app", "user");
        let busy = ThreadId::from("busy");
        let lease = store
            .acquire_lease(&auth, &busy, "w", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        for i in 0..10 {
            store
                .kv_set(
                    &auth,
                    &ThreadId::from(format!("t{i}")),
                    "k",
                    serde_json::json!(i),
                )
                .await
                .unwrap();
        }
        assert!(store.len() <= 3, "held {} threads", store.len());
        assert_eq!(
            store
                .kv_get(&auth, &ThreadId::from("t9"), "k")
                .await
                .unwrap(),
            Some(serde_json::json!(9))
        );
        assert_eq!(
            store
                .kv_get(&auth, &ThreadId::from("t0"), "k")
                .await
                .unwrap(),
            None,
            "the oldest idle thread went"
        );
        store
            .renew_lease(&auth, &lease, Duration::from_secs(60))
            .await
            .expect("a busy thread is never evicted");
        // A thread created again gets a fresh, larger token: no stale lease can pass its fence.
        let again = store
            .acquire_lease(&auth, &ThreadId::from("t0"), "w", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        assert!(again.token > lease.token);
    }
}
