//! Per-thread leases: at most one flow executes on a thread at a time, across processes.
//!
//! A lease has an expiry and a fencing token that grows with every acquisition of the
//! thread. Writes made under a lease carry it, and a store refuses a write whose token is not
//! the thread's current one or whose lease has expired, so a holder that stalled past its
//! expiry cannot overwrite the work of the next holder.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentError, AgentResult, ThreadId};
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

impl Lease {
    /// The error for a write or renewal under this lease once it is not the thread's current,
    /// unexpired lease: [`AgentError::LeaseLost`] naming the thread and this token. Every
    /// backend refuses a stale holder with it.
    pub fn lost(&self) -> AgentError {
        AgentError::LeaseLost {
            thread_id: self.thread_id.clone(),
            token: self.token,
        }
    }

    /// The fence of every write made under a lease: `Ok` when the thread's current lease
    /// (`current`: its token and expiry, `None` when the thread has none) is this lease and
    /// has not expired at `now`; [`Lease::lost`] otherwise. Backends that read the current
    /// lease themselves (memory, SQLite) call it inside the step that then writes, so the
    /// check and the write are atomic.
    pub fn check_fence(
        &self,
        current: Option<(u64, DateTime<Utc>)>,
        now: DateTime<Utc>,
    ) -> AgentResult<()> {
        match current {
            Some((token, expires_at)) if token == self.token && expires_at > now => Ok(()),
            _ => Err(self.lost()),
        }
    }
}

/// Whether a thread's current lease (held by `current_holder` until `current_expiry`, or none)
/// keeps `holder` from taking it at `now`: a live lease does, unless `reclaim` and it is
/// `holder`'s own (see [`ThreadLeases::reclaim_lease`]). The rule of
/// [`ThreadLeases::take_lease`] in every backend that decides it outside a script.
pub fn lease_blocks(
    current: Option<(&str, DateTime<Utc>)>,
    holder: &str,
    reclaim: bool,
    now: DateTime<Utc>,
) -> bool {
    current.is_some_and(|(current_holder, expires_at)| {
        expires_at > now && !(reclaim && current_holder == holder)
    })
}

/// A lease TTL as a `chrono` duration, to add to the clock; its bounds are checked by
/// [`Validated`](crate::Validated), and one past `chrono`'s range is an internal error.
pub fn lease_ttl(ttl: Duration) -> AgentResult<chrono::Duration> {
    chrono::Duration::from_std(ttl).map_err(AgentError::internal)
}

/// What [`ThreadLeases::take_lease`] is asked: `holder` wants `thread_id`'s lease for `ttl`,
/// and with `reclaim` also when it holds a live one itself.
#[derive(Debug, Clone, Copy)]
pub struct LeaseAsk<'a> {
    /// The thread.
    pub thread_id: &'a ThreadId,
    /// Who asks.
    pub holder: &'a str,
    /// How long the lease lives unless renewed.
    pub ttl: Duration,
    /// Whether `holder`'s own live lease is taken over (see [`ThreadLeases::reclaim_lease`]).
    pub reclaim: bool,
}

impl LeaseAsk<'_> {
    /// The lease this ask is granted: fencing token `token`, lapsing at `expires_at`.
    pub fn granted(&self, token: u64, expires_at: DateTime<Utc>) -> Lease {
        Lease {
            thread_id: self.thread_id.clone(),
            holder: self.holder.to_owned(),
            token,
            expires_at,
        }
    }
}

/// What [`ThreadLeases::renew_lease`] is asked: `lease` extended to `ttl` from now.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRenewal<'a> {
    /// The held lease.
    pub lease: &'a Lease,
    /// How long from now it lives unless renewed again.
    pub ttl: Duration,
}

impl LeaseRenewal<'_> {
    /// The renewed lease: the same lease (its token kept), lapsing at `expires_at`.
    pub fn renewed(&self, expires_at: DateTime<Utc>) -> Lease {
        Lease {
            expires_at,
            ..self.lease.clone()
        }
    }
}

/// Acquire, renew and release thread leases.
#[async_trait]
pub trait ThreadLeases: Send + Sync {
    /// Take the thread's lease for `ttl` when it is free, or, with `reclaim`, also when
    /// `holder` itself holds a live one (the rule is [`lease_blocks`]); `Ok(None)` when it
    /// stays with its holder. The new lease gets a token greater than every earlier one of the
    /// thread. What a backend implements; callers say which of the two they mean with
    /// [`ThreadLeases::acquire_lease`] or [`ThreadLeases::reclaim_lease`]. A backend that
    /// cannot tell its holders apart may take `reclaim` as `false`: a restarted process then
    /// waits for its old leases to lapse.
    async fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>>;

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
    ) -> AgentResult<Option<Lease>> {
        let ask = LeaseAsk {
            thread_id,
            holder,
            ttl,
            reclaim: false,
        };
        self.take_lease(auth, &ask).await
    }

    /// [`ThreadLeases::acquire_lease`] that also takes a live lease `holder` itself holds: a
    /// process restarted under the same holder name (a stable instance id) takes its own
    /// threads back at once instead of waiting for its old leases to lapse. The lease gets a
    /// new token, so writes under the one it replaces are refused (`LeaseLost`). A live lease
    /// of another holder is `Ok(None)`, as for `acquire_lease`. Sound only while no two live
    /// processes share a holder name.
    async fn reclaim_lease(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        holder: &str,
        ttl: Duration,
    ) -> AgentResult<Option<Lease>> {
        let ask = LeaseAsk {
            thread_id,
            holder,
            ttl,
            reclaim: true,
        };
        self.take_lease(auth, &ask).await
    }

    /// Extend a held lease by `ttl` from now, keeping its token. An expired, released or
    /// taken-over lease is [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost); `ttl`
    /// has the bounds of [`ThreadLeases::acquire_lease`].
    async fn renew_lease(
        &self,
        auth: &AuthContext,
        lease: &Lease,
        ttl: Duration,
    ) -> AgentResult<Lease> {
        self.extend_lease(auth, &LeaseRenewal { lease, ttl }).await
    }

    /// Carry out [`ThreadLeases::renew_lease`]: what a backend implements.
    async fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease>;

    /// Give the lease up. Releasing a lease that was already lost is not an error. After a
    /// release the lease is dead like an expired one: writing or renewing with it is
    /// [`AgentError::LeaseLost`](keel_core::AgentError::LeaseLost).
    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(token: u64) -> Lease {
        Lease {
            thread_id: ThreadId::from("t"),
            holder: "w".into(),
            token,
            expires_at: Utc::now(),
        }
    }

    #[test]
    fn the_fence_passes_only_the_current_unexpired_lease() {
        let now = Utc::now();
        let later = now + chrono::Duration::seconds(1);
        assert!(lease(2).check_fence(Some((2, later)), now).is_ok());
        for current in [None, Some((3, later)), Some((1, later)), Some((2, now))] {
            assert!(
                matches!(
                    lease(2).check_fence(current, now),
                    Err(AgentError::LeaseLost { token: 2, .. })
                ),
                "{current:?}"
            );
        }
    }

    #[test]
    fn a_live_lease_blocks_others_and_reclaim_lets_its_holder_through() {
        let now = Utc::now();
        let live = Some(("a", now + chrono::Duration::seconds(1)));
        let lapsed = Some(("a", now));
        assert!(!lease_blocks(None, "b", false, now));
        assert!(!lease_blocks(lapsed, "b", false, now));
        assert!(lease_blocks(live, "b", false, now));
        assert!(lease_blocks(live, "b", true, now));
        assert!(lease_blocks(live, "a", false, now));
        assert!(!lease_blocks(live, "a", true, now));
    }
}
