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
    LeaseAsk, LeaseRenewal, QueuedItem, SubagentRegistry, ThreadHistory, ThreadKv, ThreadLeases,
    ThreadQueue, ThreadTimers, TimerClaimRound, TimerRecord,
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

/// One `#[async_trait]` impl of `$trait` for `Validated<S>`, one method a line: each call goes
/// to the backend, after the check written behind `=>` when there is one. So the whole checked
/// surface reads as one table, and a pass-through cannot drift from the rest.
macro_rules! validated_impl {
    (impl $trait:ident {
        $(fn $name:ident(&$this:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty $(=> $check:expr)?;)*
    }) => {
        #[async_trait]
        impl<S: $trait> $trait for Validated<S> {
            $(async fn $name(&$this $(, $arg: $ty)*) -> $ret {
                $($check?;)?
                $this.inner.$name($($arg),*).await
            })*
        }
    };
}

validated_impl! {
    impl ThreadHistory {
        fn append_history(&self, auth: &AuthContext, lease: &Lease, messages: &[LlmMessage]) -> AgentResult<u64>;
        fn read_history(&self, auth: &AuthContext, thread_id: &ThreadId, after_seq: u64, limit: usize) -> AgentResult<Vec<HistoryEntry>>;
        fn read_history_before(&self, auth: &AuthContext, thread_id: &ThreadId, before_seq: u64, limit: usize) -> AgentResult<Vec<HistoryEntry>>;
    }
}

validated_impl! {
    impl ThreadQueue {
        fn push_queue(&self, auth: &AuthContext, thread_id: &ThreadId, payload: Value) -> AgentResult<QueuedItem>;
        fn peek_queue(&self, auth: &AuthContext, thread_id: &ThreadId, limit: usize) -> AgentResult<Vec<QueuedItem>>;
        fn ack_queue(&self, auth: &AuthContext, lease: &Lease, ids: &[String]) -> AgentResult<()>;
        fn queue_len(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<usize>;
        fn tenant_queue_len(&self, auth: &AuthContext) -> AgentResult<usize>;
        fn queued_threads(&self, auth: &AuthContext) -> AgentResult<Vec<ThreadId>>;
    }
}

validated_impl! {
    impl ThreadKv {
        fn kv_get(&self, auth: &AuthContext, thread_id: &ThreadId, key: &str) -> AgentResult<Option<Value>>;
        fn kv_set(&self, auth: &AuthContext, thread_id: &ThreadId, key: &str, value: Value) -> AgentResult<()>
            => self.kv_limits.check_value(key, &value);
        fn kv_keys(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<String>>;
    }
}

validated_impl! {
    impl SubagentRegistry {
        fn register_child(&self, auth: &AuthContext, child: &ChildThread) -> AgentResult<()>;
        fn children(&self, auth: &AuthContext, parent: &ThreadId) -> AgentResult<Vec<ChildThread>>;
        fn child(&self, auth: &AuthContext, child: &ThreadId) -> AgentResult<Option<ChildThread>>;
        fn set_child_status(&self, auth: &AuthContext, child: &ThreadId, status: &str) -> AgentResult<()>;
    }
}

validated_impl! {
    impl ThreadLeases {
        fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>>
            => check_lease_ttl(ask.ttl);
        fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease>
            => check_lease_ttl(renewal.ttl);
        fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()>;
    }
}

validated_impl! {
    impl ThreadTimers {
        fn insert_timer(&self, timer: &TimerRecord) -> AgentResult<()>;
        fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool>;
        fn thread_timers(&self, auth: &AuthContext, thread_id: &ThreadId) -> AgentResult<Vec<TimerRecord>>;
        fn claim_due_timers(&self, agent: &str, now: DateTime<Utc>, limit: usize, claim_ttl: Duration) -> AgentResult<Vec<ClaimedTimer>>
            => check_lease_ttl(claim_ttl);
        fn claim_timers(&self, round: TimerClaimRound<'_>) -> AgentResult<Vec<ClaimedTimer>>;
        fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool>;
        fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>>;
    }
}
