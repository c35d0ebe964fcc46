//! [`Validated`]: the checks on what callers send (key-value sizes, lease and claim TTLs),
//! applied once around any backend instead of inside each one.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::conversation::LlmMessage;
use keel_core::{AgentResult, ThreadId};
use serde_json::Value;

use crate::{
    check_lease_ttl, AuthContext, ChildThread, ClaimedTimer, HistoryEntry, KvLimits, Lease,
    QueuedItem, SubagentRegistry, ThreadHistory, ThreadKv, ThreadLeases, ThreadQueue, ThreadTimers,
    TimerRecord,
};

/// A backend's thread store and timers behind the input checks every backend shares: a
/// key or value over its [`KvLimits`] cap and a lease or claim TTL outside 1 ms ..= 24 h are
/// [`AgentError::InvalidInput`](keel_core::AgentError::InvalidInput) before the backend is
/// called. The key-count cap (`max_keys`) needs the backend's own atomic check, so each
/// backend applies that one. [`Services`](crate::Services) constructors wrap their backend in
/// it; a custom backend gets the same checks by being wrapped too.
#[derive(Debug, Clone)]
pub struct Validated<S> {
    inner: S,
    kv_limits: KvLimits,
}

impl<S> Validated<S> {
    /// `inner` behind the checks, with the key-value caps `kv_limits` (the backend's own, so
    /// both sides agree).
    pub fn new(inner: S, kv_limits: KvLimits) -> Self {
        Self { inner, kv_limits }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: ThreadHistory> ThreadHistory for Validated<S> {
    async fn append_history(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        messages: &[LlmMessage],
    ) -> AgentResult<u64> {
        self.inner.append_history(auth, lease, messages).await
    }

    async fn read_history(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        after_seq: u64,
        limit: usize,
    ) -> AgentResult<Vec<HistoryEntry>> {
        self.inner
            .read_history(auth, thread_id, after_seq, limit)
            .await
    }
}

#[async_trait]
impl<S: ThreadQueue> ThreadQueue for Validated<S> {
    async fn push_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        payload: Value,
    ) -> AgentResult<QueuedItem> {
        self.inner.push_queue(auth, thread_id, payload).await
    }

    async fn peek_queue(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        limit: usize,
    ) -> AgentResult<Vec<QueuedItem>> {
        self.inner.peek_queue(auth, thread_id, limit).await
    }

    async fn ack_queue(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ids: &[String],
    ) -> AgentResult<()> {
        self.inner.ack_queue(auth, lease, ids).await
    }

    async fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize> {
        self.inner.queue_len(auth, thread_id).await
    }

    async fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize> {
        self.inner.tenant_queue_len(auth).await
    }

    async fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>> {
        self.inner.queued_threads(auth).await
    }
}

#[async_trait]
impl<S: ThreadKv> ThreadKv for Validated<S> {
    async fn kv_get(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
    ) -> AgentResult<Option<Value>> {
        self.inner.kv_get(auth, thread_id, key).await
    }

    async fn kv_set(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        key: &str,
        value: Value,
    ) -> AgentResult<()> {
        self.kv_limits.check_value(key, &value)?;
        self.inner.kv_set(auth, thread_id, key, value).await
    }

    async fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>> {
        self.inner.kv_keys(auth, thread_id).await
    }
}

#[async_trait]
impl<S: SubagentRegistry> SubagentRegistry for Validated<S> {
    async fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()> {
        self.inner.register_child(auth, child).await
    }

    async fn children(
        &self,
        auth: &AuthContext,
        parent: &ThreadId,
    ) -> AgentResult<Vec<ChildThread>> {
        self.inner.children(auth, parent).await
    }

    async fn child(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
    ) -> AgentResult<Option<ChildThread>> {
        self.inner.child(auth, child).await
    }

    async fn set_child_status(
        &self,
        auth: &AuthContext,
        child: &ThreadId,
        status: &str,
    ) -> AgentResult<()> {
        self.inner.set_child_status(auth, child, status).await
    }
}

#[async_trait]
impl<S: ThreadLeases> ThreadLeases for Validated<S> {
    async fn acquire_lease(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        holder: &str,
        ttl: Duration,
    ) -> AgentResult<Option<Lease>> {
        check_lease_ttl(ttl)?;
        self.inner.acquire_lease(auth, thread_id, holder, ttl).await
    }

    async fn reclaim_lease(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        holder: &str,
        ttl: Duration,
    ) -> AgentResult<Option<Lease>> {
        check_lease_ttl(ttl)?;
        self.inner.reclaim_lease(auth, thread_id, holder, ttl).await
    }

    async fn renew_lease(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ttl: Duration,
    ) -> AgentResult<Lease> {
        check_lease_ttl(ttl)?;
        self.inner.renew_lease(auth, lease, ttl).await
    }

    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()> {
        self.inner.release_lease(auth, lease).await
    }
}

#[async_trait]
impl<S: ThreadTimers> ThreadTimers for Validated<S> {
    async fn schedule_timer(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        agent: &str,
        name: &str,
        payload: Value,
        due_at: DateTime<Utc>,
    ) -> AgentResult<TimerRecord> {
        self.inner
            .schedule_timer(auth, thread_id, agent, name, payload, due_at)
            .await
    }

    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool> {
        self.inner.cancel_timer(auth, id).await
    }

    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Vec<TimerRecord>> {
        self.inner.thread_timers(auth, thread_id).await
    }

    async fn claim_due_timers(
        &self,
        agent: &str,
        now: DateTime<Utc>,
        limit: usize,
        claim_ttl: Duration,
    ) -> AgentResult<Vec<ClaimedTimer>> {
        check_lease_ttl(claim_ttl)?;
        self.inner
            .claim_due_timers(agent, now, limit, claim_ttl)
            .await
    }

    async fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool> {
        self.inner.complete_timer(claim).await
    }

    async fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>> {
        self.inner.next_timer_at(agent).await
    }
}
