//! [`ThreadLeases`] over Redis: the lease is a key set with `SET PX` by one script, holding
//! `<token>:<holder>`; the token comes from a per-thread `INCR` counter that is never deleted,
//! so tokens grow strictly even across release and expiry. Redis expires the key itself, so
//! an expired lease is simply a missing key and every fenced script refuses it.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentError, AgentResult};
use keel_runtime::{AuthContext, Lease, LeaseAsk, LeaseRenewal, ThreadLeases};

use crate::keys::kind;
use crate::scripts;
use crate::RedisStore;

/// The lease TTL in whole milliseconds (what `PX` takes); its bounds (1 ms ..= 24 h) are
/// checked by `keel_runtime::Validated`. Rounded up, so a lease never lapses before the time
/// asked for.
fn ttl_millis(ttl: Duration) -> AgentResult<u64> {
    Ok(u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(86_400_000))
}

/// The expiry the server computed (its clock, in ms since the epoch).
fn expiry(millis: i64) -> AgentResult<DateTime<Utc>> {
    DateTime::from_timestamp_millis(millis).ok_or_else(|| {
        AgentError::storage(format!(
            "Redis reported a lease expiry of {millis} ms, which is not a valid time"
        ))
    })
}

#[async_trait]
impl ThreadLeases for RedisStore {
    async fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>> {
        let ttl_ms = ttl_millis(ask.ttl)?;
        let keys = self.keys(auth);
        let granted: Option<(u64, i64)> = scripts::TAKE_LEASE
            .key(keys.of(kind::LEASE, ask.thread_id.as_str()))
            .key(keys.of(kind::LEASE_TOKEN, ask.thread_id.as_str()))
            .arg(ask.holder)
            .arg(ttl_ms)
            .arg(u8::from(ask.reclaim))
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("acquire lease", &e))?;
        granted
            .map(|(token, expires_ms)| Ok(ask.granted(token, expiry(expires_ms)?)))
            .transpose()
    }

    async fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease> {
        let lease = renewal.lease;
        let ttl_ms = ttl_millis(renewal.ttl)?;
        let expires_ms: i64 = scripts::RENEW_LEASE
            .key(self.keys(auth).of(kind::LEASE, lease.thread_id.as_str()))
            .arg(lease.token)
            .arg(ttl_ms)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("renew lease", &e))?;
        if expires_ms < 0 {
            return Err(lease.lost());
        }
        Ok(renewal.renewed(expiry(expires_ms)?))
    }

    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()> {
        // Only the holder's own lease is deleted; a lost lease releases nothing, quietly.
        scripts::RELEASE_LEASE
            .key(self.keys(auth).of(kind::LEASE, lease.thread_id.as_str()))
            .arg(lease.token)
            .invoke_async::<i64>(&mut self.con())
            .await
            .map_err(|e| self.fail("release lease", &e))?;
        Ok(())
    }
}
