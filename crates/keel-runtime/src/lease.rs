//! Per-thread leases: at most one flow executes on a thread at a time, across processes.
//!
//! A lease has an expiry and a fencing token that grows with every acquisition of the
//! thread. Writes made under a lease carry it, and a store refuses a write whose token is not
//! the thread's current one or whose lease has expired, so a holder that stalled past its
//! expiry cannot overwrite the work of the next holder.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentResult, ThreadId};
use serde::{Deserialize, Serialize};

use crate::AuthContext;

/// A held lease on one thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The thread.
    pub thread_id: ThreadId,
    /// Who holds it (a process or worker id).
    pub holder: String,
    /// The fencing token: strictly greater than every earlier token of this thread.
    pub token: u64,
    /// When it lapses unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// Acquire, renew and release thread leases.
#[async_trait]
pub trait ThreadLeases: Send + Sync {
    /// Take the thread's lease for `ttl`, or `Ok(None)` when someone else holds a live one.
    /// Behind [`Validated`](crate::Validated) (as every [`Services`](crate::Services)
    /// constructor wires a backend), a `ttl` outside 1 ms ..= 24 h is
    /// [`AgentError::InvalidInput`](keel_core::AgentError::InvalidInput) naming `ttl`.
    async fn acquire_lease(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        holder: &str,
        ttl: Duration,
    ) -> AgentResult<Option<Lease>>;

    /// [`ThreadLeases::acquire_lease`] that also takes a live lease `holder` itself holds: a
    /// process restarted under the same holder name (a stable instance id) takes its own
    /// threads back at once instead of waiting for its old leases to lapse. The lease gets a
    /// new token, so writes under the one it replaces are refused (`LeaseLost`). A live lease
    /// of another holder is `Ok(None)`, as for `acquire_lease`. Sound only while no two live
    /// processes share a holder name. The default, for backends that do not offer it, is
    /// `acquire_lease`: the restarted process waits for its old leases to lapse.
    async fn reclaim_lease(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        holder: &str,
        ttl: Duration,
    ) -> AgentResult<Option<Lease>> {
        self.acquire_lease(auth, thread_id, holder, ttl).await
    }

    /// Extend a held lease by `ttl` from now, keeping its token. An expired, released or
    /// taken-over lease is [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost); `ttl`
    /// has the bounds of [`ThreadLeases::acquire_lease`].
    async fn renew_lease(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ttl: Duration,
    ) -> AgentResult<Lease>;

    /// Give the lease up. Releasing a lease that was already lost is not an error. After a
    /// release the lease is dead like an expired one: writing or renewing with it is
    /// [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost).
    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()>;
}
