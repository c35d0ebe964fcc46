//! [`ThreadLeases`] over PostgreSQL, and the fence every lease-holder write checks.
//!
//! Taking a lease is one statement that locks the thread's row in `threads` and decides on
//! the latest lease row (the rule of `keel_runtime::lease_blocks`, in SQL), so no other
//! process interleaves with it. Writes under a lease read the lease row `FOR SHARE` in the statement
//! that writes (`fence!`), so a takeover waits for them and a stale holder writes nothing.

use async_trait::async_trait;
use chrono::Utc;
use keel_core::AgentResult;
use keel_runtime::{lease_ttl, AuthContext, Lease, LeaseAsk, LeaseRenewal, ThreadLeases};

use crate::codec::{from_nanos, from_sql_int, query_opt, to_nanos, to_sql_int};
use crate::PostgresStore;

/// The `WITH` entry every fenced write starts with: one row when the lease (`$1` tenant, `$2`
/// thread, `$3` token) is the thread's current one and unexpired at `$4`, locked until the
/// write commits. The check of [`Lease::check_fence`], in SQL so that it and the write are
/// one statement (a macro, so that statements can `concat!` it).
macro_rules! fence {
    () => {
        "lease AS (
    SELECT 1 FROM leases
    WHERE tenant = $1 AND thread_id = $2 AND token = $3 AND expires_at > $4
    FOR SHARE
)"
    };
}
pub(crate) use fence;

/// The four fence parameters of `lease` at `now`.
pub(crate) fn fence_args(auth: &AuthContext, lease: &Lease) -> (String, String, i64, i64) {
    (
        auth.namespace(),
        lease.thread_id.as_str().to_owned(),
        to_sql_int(lease.token),
        to_nanos(Utc::now()),
    )
}

/// How many stripes [`WriteOrder`] has: enough that unrelated threads rarely share one.
const STRIPES: usize = 256;

/// Keeps the order in which this process sends a thread's lease operations around a release.
///
/// The engine acknowledges a thread's last queued item and releases its lease together,
/// sent in that order (one pipeline on Redis, one writer thread on SQLite). A pool runs the
/// two on different connections, where the release could commit first and the fenced
/// acknowledgement then be refused. So every other lease operation (taking, renewing, a
/// fenced write) holds a shared guard of its thread's stripe while it runs and a release
/// takes it exclusively. Tokio's lock queues them fairly: a release waits for the operations
/// sent before it, and those sent after it (a write, which is then refused as a write after a
/// release must be; a take, which then finds the thread free) wait for it.
pub(crate) struct WriteOrder(Box<[tokio::sync::RwLock<()>]>);

impl WriteOrder {
    pub(crate) fn new() -> Self {
        Self((0..STRIPES).map(|_| tokio::sync::RwLock::new(())).collect())
    }

    /// The lock of the stripe that `tenant`'s `thread` falls in: a lease operation holds it
    /// shared (`read`) while it runs, a release exclusively (`write`).
    pub(crate) fn stripe(&self, tenant: &str, thread: &str) -> &tokio::sync::RwLock<()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (tenant, thread).hash(&mut hasher);
        &self.0[(hasher.finish() % STRIPES as u64) as usize]
    }
}

/// Take the thread's lease in one statement: unless a live lease blocks the asker (the rule of
/// `keel_runtime::lease_blocks`: `$4` now, `$6` reclaim), issue the thread's next token and make it the
/// lease. The counter's upsert locks the thread's row, so two takers run one after the other;
/// the lease's upsert then decides on the latest lease (its `WHERE` is that rule again, read
/// after the wait), so the later taker is refused (it only used up a token: tokens need to
/// grow, not to be dense). `$5` is the new expiry.
const TAKE_LEASE: &str = "\
WITH blocked AS (
    SELECT 1 FROM leases
    WHERE tenant = $1 AND thread_id = $2 AND expires_at > $4 AND NOT ($6 AND holder = $3)
), counter AS (
    INSERT INTO threads (tenant, thread_id, last_lease_token)
    SELECT $1, $2, 1 WHERE NOT EXISTS (SELECT 1 FROM blocked)
    ON CONFLICT (tenant, thread_id) DO UPDATE SET last_lease_token = threads.last_lease_token + 1
    RETURNING last_lease_token
)
INSERT INTO leases (tenant, thread_id, holder, token, expires_at)
SELECT $1, $2, $3, last_lease_token, $5 FROM counter
ON CONFLICT (tenant, thread_id) DO UPDATE SET
    holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at
WHERE leases.expires_at <= $4 OR ($6 AND leases.holder = $3)
RETURNING token";
const RENEW: &str = "UPDATE leases SET expires_at = $5 \
     WHERE tenant = $1 AND thread_id = $2 AND token = $3 AND expires_at > $4";
const RELEASE: &str = "DELETE FROM leases WHERE tenant = $1 AND thread_id = $2 AND token = $3";

#[async_trait]
impl ThreadLeases for PostgresStore {
    async fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>> {
        let ttl = lease_ttl(ask.ttl)?;
        let (tenant, thread) = (auth.namespace(), ask.thread_id.as_str());
        let _in_order = self.order.stripe(&tenant, thread).read().await;
        let client = self.client().await?;
        let now = Utc::now();
        let expires_at = now + ttl;
        let row = query_opt(
            &client,
            TAKE_LEASE,
            &[
                &tenant,
                &thread,
                &ask.holder,
                &to_nanos(now),
                &to_nanos(expires_at),
                &ask.reclaim,
            ],
            "taking a lease",
        )
        .await?;
        match row {
            Some(row) => {
                let token = from_sql_int(row.get(0), "lease token")?;
                Ok(Some(ask.granted(token, expires_at)))
            }
            None => Ok(None),
        }
    }

    async fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease> {
        let lease = renewal.lease;
        let ttl = lease_ttl(renewal.ttl)?;
        let (tenant, thread, token, now) = fence_args(auth, lease);
        let expires_at = from_nanos(now) + ttl;
        let _in_order = self.order.stripe(&tenant, &thread).read().await;
        let renewed = self
            .execute(
                RENEW,
                &[&tenant, &thread, &token, &now, &to_nanos(expires_at)],
                "renewing a lease",
            )
            .await?;
        if renewed == 0 {
            return Err(lease.lost());
        }
        Ok(renewal.renewed(expires_at))
    }

    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()> {
        // Only the current holder's lease goes: releasing a stale lease must not free the
        // thread under its new holder.
        let (tenant, thread) = (auth.namespace(), lease.thread_id.as_str());
        let _after_writes = self.order.stripe(&tenant, thread).write().await;
        self.execute(
            RELEASE,
            &[&tenant, &thread, &to_sql_int(lease.token)],
            "releasing a lease",
        )
        .await?;
        Ok(())
    }
}
