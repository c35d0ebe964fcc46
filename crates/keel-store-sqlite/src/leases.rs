//! [`ThreadLeases`] over SQLite, and the fence that every lease-holder write checks.
//!
//! Every lease operation runs as one job on the writer thread, so "look at the current lease,
//! decide, write" happens inside one transaction: two racers (in this process or, through
//! SQLite's write lock, in another) can never both see the thread free.

use async_trait::async_trait;
use chrono::Utc;
use keel_core::AgentResult;
use keel_runtime::{
    lease_blocks, lease_ttl, AuthContext, Lease, LeaseAsk, LeaseRenewal, ThreadLeases,
};
use rusqlite::{params, Connection};

use crate::codec::{from_nanos, from_sql_int, select_row, to_nanos, SqlContext};
use crate::threads::ThreadCounter;
use crate::SqliteStore;

/// Refuse unless `lease` is the thread's current lease and has not expired. Runs inside the
/// writer's transaction, before the write it guards, so the check and the write are atomic.
pub(crate) fn check_fence(conn: &Connection, tenant: &str, lease: &Lease) -> AgentResult<()> {
    let current: Option<(i64, i64)> = select_row(
        conn,
        "SELECT token, expires_at FROM leases WHERE tenant = ?1 AND thread_id = ?2",
        params![tenant, lease.thread_id.as_str()],
        |row| Ok((row.get(0)?, row.get(1)?)),
        "reading a thread's lease",
    )?;
    // A stored token that is not a u64 was never issued, so no lease matches it.
    let current = current
        .and_then(|(token, expires_at)| Some((u64::try_from(token).ok()?, from_nanos(expires_at))));
    lease.check_fence(current, Utc::now())
}

/// Release `lease`, only while it is the thread's current one: releasing a stale lease must not
/// free the thread under its new holder.
pub(crate) fn delete_lease(conn: &Connection, tenant: &str, lease: &Lease) -> AgentResult<()> {
    // A token past i64 was never issued, so there is nothing of it to release.
    let Ok(token) = i64::try_from(lease.token) else {
        return Ok(());
    };
    conn.prepare_cached("DELETE FROM leases WHERE tenant = ?1 AND thread_id = ?2 AND token = ?3")
        .and_then(|mut stmt| stmt.execute(params![tenant, lease.thread_id.as_str(), token]))
        .context("releasing a lease")?;
    Ok(())
}

#[async_trait]
impl ThreadLeases for SqliteStore {
    async fn take_lease(&self, auth: &AuthContext, ask: &LeaseAsk) -> AgentResult<Option<Lease>> {
        let ttl = lease_ttl(ask.ttl)?;
        let (tenant, thread_id) = (self.tenant(auth).await?, ask.thread_id.clone());
        let (holder, reclaim) = (ask.holder.to_owned(), ask.reclaim);
        let granted = self.write(move |conn| {
            let now = Utc::now();
            let held: Option<(i64, String)> = select_row(
                conn,
                "SELECT expires_at, holder FROM leases WHERE tenant = ?1 AND thread_id = ?2",
                params![tenant, thread_id.as_str()],
                |row| Ok((row.get(0)?, row.get(1)?)),
                "reading a thread's lease",
            )?;
            let current = held.as_ref().map(|(expires_at, current)| {
                (current.as_str(), from_nanos(*expires_at))
            });
            if lease_blocks(current, &holder, reclaim, now) {
                return Ok(None);
            }
            // The token counter lives in `threads`, not in the lease row, so it keeps growing
            // across release (which deletes the lease row).
            let token = ThreadCounter::LeaseToken.next(conn, &tenant, &thread_id)?;
            let expires_at = now + ttl;
            conn.prepare_cached(
                "INSERT INTO leases (tenant, thread_id, holder, token, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (tenant, thread_id) DO UPDATE SET \
                 holder = excluded.holder, token = excluded.token, expires_at = excluded.expires_at",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    tenant,
                    thread_id.as_str(),
                    holder,
                    token,
                    to_nanos(expires_at)
                ])
            })
            .context("writing a lease")?;
            Ok(Some((from_sql_int(token, "lease token")?, expires_at)))
        })
        .await?;
        Ok(granted.map(|(token, expires_at)| ask.granted(token, expires_at)))
    }

    async fn extend_lease(&self, auth: &AuthContext, renewal: &LeaseRenewal) -> AgentResult<Lease> {
        let ttl = lease_ttl(renewal.ttl)?;
        let (tenant, lease) = (self.tenant(auth).await?, renewal.lease.clone());
        let expires_at = self
            .write(move |conn| {
                check_fence(conn, &tenant, &lease)?;
                let expires_at = Utc::now() + ttl;
                conn.prepare_cached(
                    "UPDATE leases SET expires_at = ?3 WHERE tenant = ?1 AND thread_id = ?2",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        tenant,
                        lease.thread_id.as_str(),
                        to_nanos(expires_at)
                    ])
                })
                .context("renewing a lease")?;
                Ok(expires_at)
            })
            .await?;
        Ok(renewal.renewed(expires_at))
    }

    async fn release_lease(&self, auth: &AuthContext, lease: &Lease) -> AgentResult<()> {
        let (tenant, lease) = (self.tenant(auth).await?, lease.clone());
        self.write(move |conn| delete_lease(conn, &tenant, &lease))
            .await
    }
}
