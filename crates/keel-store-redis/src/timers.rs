//! [`ThreadTimers`] over Redis, and the list of tenants for recovery: system-level keys under
//! `<prefix>{keel-system}:` (one hash tag, so every timer script touches one slot). Due
//! timers sit in one sorted set scored by when each becomes claimable (its due time, then
//! its claim's expiry); a Lua script claims atomically, so processes sharing the server never
//! get the same timer while a claim lives.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentResult, ThreadId};
use keel_runtime::{AuthContext, ClaimedTimer, ThreadTimers, TimerClaimRound, TimerRecord};

use crate::encoding::{decode, encode, micros};
use crate::keys::system;
use crate::scripts;
use crate::RedisStore;

impl RedisStore {
    /// `<prefix>{keel-system}:`, the base of every system-level key.
    pub(crate) fn system_base(&self) -> String {
        format!("{}{}", self.prefix, system::BASE)
    }

    fn timer_key(&self, id: &str) -> String {
        format!("{}{}{id}", self.system_base(), system::TIMER)
    }

    fn thread_timers_key(&self, auth: &AuthContext, thread_id: &ThreadId) -> String {
        // The namespace is length-prefixed, so namespace + thread never collide.
        format!(
            "{}{}{}:{}",
            self.system_base(),
            system::TIMERS_OF,
            auth.namespace(),
            thread_id.as_str()
        )
    }

    /// The due index of `agent`'s timers; the empty agent's (timers stored before timers had
    /// owners) is the original `timers-due`, which every agent's claim also reads.
    fn due_key(&self, agent: &str) -> String {
        if agent.is_empty() {
            format!("{}{}", self.system_base(), system::TIMERS_DUE)
        } else {
            format!("{}{}:{agent}", self.system_base(), system::TIMERS_DUE)
        }
    }

    /// Record that `auth` has tasks, once per tenant and process: the set only grows, so a
    /// repeated `SADD` would be wasted round trips on the hot path of saving a task.
    pub(crate) async fn note_tenant(&self, auth: &AuthContext) -> AgentResult<()> {
        let namespace = auth.namespace();
        if self
            .known_tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&namespace)
        {
            return Ok(());
        }
        redis::cmd("SADD")
            .arg(format!("{}{}", self.system_base(), system::TENANTS))
            .arg(&namespace)
            .query_async::<()>(&mut self.con())
            .await
            .map_err(|e| self.fail("SADD tenants", &e))?;
        self.known_tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(namespace);
        Ok(())
    }

    /// Every tenant that saved a task through any process sharing this server and prefix.
    pub(crate) async fn list_tenants(&self) -> AgentResult<Vec<AuthContext>> {
        let key = format!("{}{}", self.system_base(), system::TENANTS);
        let namespaces: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&key)
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("SMEMBERS tenants", &e))?;
        AuthContext::from_stored_namespaces(&namespaces, &format!("Redis key `{key}`"))
    }

    fn timer_of(&self, id: &str, body: &str, attempts: i64) -> AgentResult<TimerRecord> {
        let mut timer: TimerRecord = decode(&self.timer_key(id), body)?;
        timer.attempts = u32::try_from(attempts).unwrap_or(u32::MAX);
        Ok(timer)
    }

    async fn remove_timer(&self, id: &str, owner: &str, claim: &str) -> AgentResult<bool> {
        let removed: i64 = scripts::REMOVE_TIMER
            .key(self.timer_key(id))
            .arg(id)
            .arg(owner)
            .arg(claim)
            .arg(self.system_base())
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("remove timer", &e))?;
        Ok(removed == 1)
    }
}

#[async_trait]
impl ThreadTimers for RedisStore {
    async fn insert_timer(&self, timer: &TimerRecord) -> AgentResult<()> {
        scripts::SCHEDULE_TIMER
            .key(self.due_key(&timer.agent))
            .key(self.timer_key(&timer.id))
            .key(self.thread_timers_key(&timer.auth, &timer.thread_id))
            .arg(&timer.id)
            .arg(micros(timer.due_at))
            .arg(timer.auth.namespace())
            .arg(timer.thread_id.as_str())
            .arg(encode(timer)?)
            .arg(&timer.agent)
            .invoke_async::<i64>(&mut self.con())
            .await
            .map_err(|e| self.fail("schedule timer", &e))?;
        Ok(())
    }

    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool> {
        self.remove_timer(id, &auth.namespace(), "").await
    }

    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Vec<TimerRecord>> {
        let rows: Vec<(String, String, i64)> = scripts::THREAD_TIMERS
            .key(self.thread_timers_key(auth, thread_id))
            .arg(self.system_base())
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("list timers", &e))?;
        rows.iter()
            .map(|(id, body, attempts)| self.timer_of(id, body, *attempts))
            .collect()
    }

    async fn claim_timers(&self, round: TimerClaimRound<'_>) -> AgentResult<Vec<ClaimedTimer>> {
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        let rows: Vec<(String, String, i64, String)> = scripts::CLAIM_TIMERS
            .key(self.due_key(round.agent))
            .key(self.due_key(""))
            .arg(micros(round.now))
            .arg(round.limit)
            .arg(micros(round.expires_at))
            .arg(self.system_base())
            .arg(&prefix)
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| self.fail("claim timers", &e))?;
        rows.into_iter()
            .map(|(id, body, attempts, claim)| {
                Ok(round.claimed(self.timer_of(&id, &body, attempts)?, claim))
            })
            .collect()
    }

    async fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool> {
        self.remove_timer(&claim.timer.id, "", &claim.claim).await
    }

    async fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>> {
        let mut pipe = redis::pipe();
        for key in [self.due_key(agent), self.due_key("")] {
            pipe.cmd("ZRANGE").arg(key).arg(0).arg(0).arg("WITHSCORES");
        }
        let firsts: Vec<Vec<(String, f64)>> = pipe
            .query_async(&mut self.con())
            .await
            .map_err(|e| self.fail("ZRANGE timers", &e))?;
        Ok(firsts
            .iter()
            .filter_map(|first| first.first())
            .filter_map(|(_, score)| {
                // Scores are whole microseconds (exact in an f64 until 2255).
                #[allow(clippy::cast_possible_truncation)] // see above
                DateTime::from_timestamp_micros(*score as i64)
            })
            .min())
    }
}
