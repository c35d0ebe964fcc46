//! [`ThreadTimers`] over PostgreSQL: the `thread_timers` table, read across tenants by the
//! schedulers, claimed with `FOR UPDATE SKIP LOCKED` so that concurrent schedulers (in this
//! process or others) take disjoint timers without waiting on each other.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{AuthContext, ClaimedTimer, ThreadTimers, TimerClaimRound, TimerRecord};

use crate::codec::{decode_record, encode_record, from_nanos, to_nanos, to_sql_int};
use crate::PostgresStore;

const SCHEDULE: &str = "\
INSERT INTO thread_timers (id, tenant, thread_id, agent, due_at, ready_at, body)
VALUES ($1, $2, $3, $4, $5, $5, $6)";
const CANCEL: &str = "DELETE FROM thread_timers WHERE id = $1 AND tenant = $2";
const OF_THREAD: &str = "SELECT id, body, attempts FROM thread_timers \
     WHERE tenant = $1 AND thread_id = $2 ORDER BY due_at, id";
/// Claim up to `$3` timers of agent `$4` (or ownerless, `''`) ready at `$1` until `$2`; each
/// claim is `$5:<id>`. Rows another claimer holds are skipped, not waited for.
const CLAIM: &str = "\
UPDATE thread_timers t
SET ready_at = $2, claim = $5 || ':' || t.id, attempts = t.attempts + 1
FROM (
    SELECT id, ready_at FROM thread_timers
    WHERE agent IN ($4, '') AND ready_at <= $1
    ORDER BY ready_at, id LIMIT $3
    FOR UPDATE SKIP LOCKED
) due
WHERE t.id = due.id
RETURNING t.id, t.body, t.attempts, t.claim, due.ready_at";
const COMPLETE: &str = "DELETE FROM thread_timers WHERE id = $1 AND claim = $2";
const NEXT: &str = "SELECT MIN(ready_at) FROM thread_timers WHERE agent IN ($1, '')";

/// A stored timer with its claim count from the column (the body keeps the scheduled form).
fn timer_of(body: &str, attempts: i32, id: &str) -> AgentResult<TimerRecord> {
    let mut timer: TimerRecord = decode_record(body, &format!("timer {id}"))?;
    timer.attempts = u32::try_from(attempts).unwrap_or(0);
    Ok(timer)
}

#[async_trait]
impl ThreadTimers for PostgresStore {
    async fn insert_timer(&self, timer: &TimerRecord) -> AgentResult<()> {
        let body = encode_record(timer)?;
        self.execute(
            SCHEDULE,
            &[
                &timer.id,
                &timer.auth.namespace(),
                &timer.thread_id.as_str(),
                &timer.agent,
                &to_nanos(timer.due_at),
                &body,
            ],
            "scheduling a timer",
        )
        .await?;
        Ok(())
    }

    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool> {
        let removed = self
            .execute(CANCEL, &[&id, &auth.namespace()], "canceling a timer")
            .await?;
        Ok(removed > 0)
    }

    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Vec<TimerRecord>> {
        let rows = self
            .query(
                OF_THREAD,
                &[&auth.namespace(), &thread_id.as_str()],
                "listing a thread's timers",
            )
            .await?;
        rows.iter()
            .map(|row| timer_of(row.get(1), row.get(2), row.get(0)))
            .collect()
    }

    async fn claim_timers(&self, round: TimerClaimRound<'_>) -> AgentResult<Vec<ClaimedTimer>> {
        let batch = uuid::Uuid::new_v4().simple().to_string();
        let rows = self
            .query(
                CLAIM,
                &[
                    &to_nanos(round.now),
                    &to_nanos(round.expires_at),
                    &to_sql_int(round.limit),
                    &round.agent,
                    &batch,
                ],
                "claiming due timers",
            )
            .await?;
        // `RETURNING` follows no order: put the claims in due order, as the other stores do.
        let mut claimed = rows
            .iter()
            .map(|row| {
                let id: &str = row.get(0);
                let ready_at: i64 = row.get(4);
                let claim = round.claimed(timer_of(row.get(1), row.get(2), id)?, row.get(3));
                Ok(((ready_at, id.to_owned()), claim))
            })
            .collect::<AgentResult<Vec<_>>>()?;
        claimed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(claimed.into_iter().map(|(_, claim)| claim).collect())
    }

    async fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool> {
        let removed = self
            .execute(
                COMPLETE,
                &[&claim.timer.id, &claim.claim],
                "completing a timer",
            )
            .await?;
        Ok(removed > 0)
    }

    async fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>> {
        let row = self
            .query_one(NEXT, &[&agent], "reading the next timer")
            .await?;
        Ok(row.get::<_, Option<i64>>(0).map(from_nanos))
    }
}
