//! [`ThreadTimers`] over SQLite: the `thread_timers` table. Claims run in the writer's
//! transaction (and under SQLite's write lock across processes), so two claimers never get
//! the same timer while its claim lives.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{AuthContext, ClaimedTimer, ThreadTimers, TimerClaimRound, TimerRecord};
use rusqlite::params;

use crate::codec::{
    decode_record, encode_record, from_nanos, select_row, select_rows, to_nanos, usize_to_sql,
    SqlContext,
};
use crate::SqliteStore;

/// A stored timer with its claim count from the column (the body keeps the scheduled form).
fn timer_of(body: &str, attempts: i64, id: &str) -> AgentResult<TimerRecord> {
    let mut timer: TimerRecord = decode_record(body, &format!("timer {id}"))?;
    timer.attempts = u32::try_from(attempts).unwrap_or(u32::MAX);
    Ok(timer)
}

impl SqliteStore {
    /// Run `sql`, a timer `DELETE` bound to `args` (the id and one more condition), in a
    /// write job: whether a timer went. What cancelling and completing a timer share.
    async fn delete_timer(
        &self,
        sql: &'static str,
        args: (String, String),
        what: &'static str,
    ) -> AgentResult<bool> {
        self.write(move |conn| {
            let removed = conn
                .prepare_cached(sql)
                .and_then(|mut stmt| stmt.execute(params![args.0, args.1]))
                .context(what)?;
            Ok(removed > 0)
        })
        .await
    }
}

#[async_trait]
impl ThreadTimers for SqliteStore {
    async fn insert_timer(&self, timer: &TimerRecord) -> AgentResult<()> {
        let body = encode_record(timer)?;
        let (id, tenant, thread, agent) = (
            timer.id.clone(),
            self.tenant(&timer.auth).await?,
            timer.thread_id.as_str().to_owned(),
            timer.agent.clone(),
        );
        let due = to_nanos(timer.due_at);
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO thread_timers (id, tenant, thread_id, due_at, ready_at, body, agent) \
                 VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)",
            )
            .and_then(|mut stmt| stmt.execute(params![id, tenant, thread, due, body, agent]))
            .context("scheduling a timer")?;
            Ok(())
        })
        .await
    }

    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool> {
        let sql = "DELETE FROM thread_timers WHERE id = ?1 AND tenant = ?2";
        let args = (id.to_owned(), self.tenant(auth).await?);
        self.delete_timer(sql, args, "canceling a timer").await
    }

    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Vec<TimerRecord>> {
        let (tenant, thread) = (self.tenant(auth).await?, thread_id.as_str().to_owned());
        self.read(move |conn| {
            let rows: Vec<(String, String, i64)> = select_rows(
                conn,
                "SELECT id, body, attempts FROM thread_timers \
                 WHERE tenant = ?1 AND thread_id = ?2 ORDER BY due_at, id",
                params![tenant, thread],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                "listing a thread's timers",
            )?;
            rows.iter()
                .map(|(id, body, attempts)| timer_of(body, *attempts, id))
                .collect()
        })
        .await
    }

    async fn claim_timers(&self, round: TimerClaimRound<'_>) -> AgentResult<Vec<ClaimedTimer>> {
        let (now_n, expires_n) = (to_nanos(round.now), to_nanos(round.expires_at));
        let (limit, agent) = (usize_to_sql(round.limit), round.agent.to_owned());
        // The writer needs the round without its borrowed agent (copied above).
        let round = TimerClaimRound { agent: "", ..round };
        self.write(move |conn| {
            // '' marks a timer stored before timers had owners: any agent claims it.
            let rows: Vec<(String, String, i64)> = select_rows(
                conn,
                "SELECT id, body, attempts FROM thread_timers \
                 WHERE agent IN (?3, '') AND ready_at <= ?1 \
                 ORDER BY ready_at, id LIMIT ?2",
                params![now_n, limit, agent],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                "finding due timers",
            )?;
            let mut claimed = Vec::with_capacity(rows.len());
            for (id, body, attempts) in rows {
                let claim = uuid::Uuid::new_v4().simple().to_string();
                conn.prepare_cached(
                    "UPDATE thread_timers SET ready_at = ?2, claim = ?3, attempts = attempts + 1 \
                     WHERE id = ?1",
                )
                .and_then(|mut stmt| stmt.execute(params![id, expires_n, claim]))
                .context("claiming a timer")?;
                claimed.push(round.claimed(timer_of(&body, attempts + 1, &id)?, claim));
            }
            Ok(claimed)
        })
        .await
    }

    async fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool> {
        let sql = "DELETE FROM thread_timers WHERE id = ?1 AND claim = ?2";
        let args = (claim.timer.id.clone(), claim.claim.clone());
        self.delete_timer(sql, args, "completing a timer").await
    }

    async fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>> {
        let agent = agent.to_owned();
        self.read(move |conn| {
            let next: Option<i64> = select_row(
                conn,
                "SELECT MIN(ready_at) FROM thread_timers WHERE agent IN (?1, '')",
                [agent],
                |row| row.get(0),
                "reading the next timer",
            )?
            .flatten();
            Ok(next.map(from_nanos))
        })
        .await
    }
}
