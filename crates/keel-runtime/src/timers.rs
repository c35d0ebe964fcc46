//! Durable thread timers: the store behind scheduled effects (Standard Agents §2, "a scheduled
//! effect alarm fires"). A timer belongs to one tenant's thread and survives restarts; any
//! process sharing the store may fire it, and a claim makes sure only one does at a time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentResult, ThreadId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::AuthContext;

/// One scheduled timer: fire effect `name` with `payload` on a thread at `due_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerRecord {
    /// The timer's id (a UUID v7 string, given by [`ThreadTimers::schedule_timer`]).
    pub id: String,
    /// The tenant that owns the thread; claims across tenants carry it to the firing.
    pub auth: AuthContext,
    /// The thread the effect runs on.
    pub thread_id: ThreadId,
    /// The agent (its card name) whose scheduler fires it: only that agent's
    /// [`ThreadTimers::claim_due_timers`] claims it. Empty in timers stored before timers had
    /// owners; any agent's scheduler claims those.
    #[serde(default)]
    pub agent: String,
    /// The effect's name (a handler the agent registered).
    pub name: String,
    /// What the handler gets.
    pub payload: Value,
    /// When it is due.
    pub due_at: DateTime<Utc>,
    /// When it was scheduled.
    pub created_at: DateTime<Utc>,
    /// How many times it has been claimed (0 until the first claim); more than one means a
    /// claimer died before completing it and the timer is fired again.
    #[serde(default)]
    pub attempts: u32,
}

/// A timer claimed by [`ThreadTimers::claim_due_timers`]: nobody else can claim it until
/// `claim_expires_at`, and only this claim can complete it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedTimer {
    /// The timer (with `attempts` counting this claim).
    pub timer: TimerRecord,
    /// The claim's token, unique per claim.
    pub claim: String,
    /// When the claim lapses and the timer becomes claimable again.
    pub claim_expires_at: DateTime<Utc>,
}

/// Durable timers of threads, across tenants.
///
/// Tenant-scoped calls (`schedule`, `cancel`, `list`) take an [`AuthContext`] like every store;
/// claiming and completing are system-level: a scheduler claims due timers of every tenant,
/// and each record carries its tenant. Each timer belongs to one agent (the card name of the
/// agent that runs its thread), and a scheduler claims only its own agent's timers, so agents
/// sharing a store (a parent and its subagent kinds, or unrelated agents) never take each
/// other's. Firing is at least once: a claim that is not completed
/// within its TTL (the claimer died) lets the timer be claimed again, so a timer is never lost,
/// and while a claim lives no other claimer gets the timer, so two processes sharing one store
/// do not fire it twice in the normal case.
#[async_trait]
pub trait ThreadTimers: Send + Sync {
    /// Store a timer for `thread_id`, fired by `agent`'s scheduler, due at `due_at` (a time in
    /// the past is due at once) and return it with its new id. Builds the record and hands it
    /// to [`ThreadTimers::insert_timer`].
    async fn schedule_timer(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        agent: &str,
        name: &str,
        payload: Value,
        due_at: DateTime<Utc>,
    ) -> AgentResult<TimerRecord> {
        let timer = TimerRecord {
            // UUID v7, so ids sort by creation time (decision 5).
            id: uuid::Uuid::now_v7().to_string(),
            auth: auth.clone(),
            thread_id: thread_id.clone(),
            agent: agent.to_owned(),
            name: name.to_owned(),
            payload,
            due_at,
            created_at: Utc::now(),
            attempts: 0,
        };
        self.insert_timer(&timer).await?;
        Ok(timer)
    }

    /// Store a new, never claimed timer, claimable from its `due_at`: what a backend
    /// implements behind [`ThreadTimers::schedule_timer`].
    async fn insert_timer(&self, timer: &TimerRecord) -> AgentResult<()>;

    /// Remove the tenant's timer `id`, claimed or not; `false` when this tenant has no such
    /// timer (unknown, already fired, or another tenant's).
    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool>;

    /// The thread's pending timers (claimed ones included), soonest first.
    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Vec<TimerRecord>>;

    /// Atomically claim up to `limit` of `agent`'s timers (and ownerless ones, see
    /// [`TimerRecord::agent`]) of any tenant that are due at `now` and not under a live claim,
    /// soonest first, each for `claim_ttl`. Behind [`Validated`](crate::Validated), a
    /// `claim_ttl` outside 1 ms ..= 24 h is
    /// [`AgentError::InvalidInput`](keel_core::AgentError::InvalidInput) naming `ttl`. Runs
    /// [`ThreadTimers::claim_timers`] with the claim's expiry.
    async fn claim_due_timers(
        &self,
        agent: &str,
        now: DateTime<Utc>,
        limit: usize,
        claim_ttl: Duration,
    ) -> AgentResult<Vec<ClaimedTimer>> {
        let expires_at = now + crate::lease_ttl(claim_ttl)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let round = TimerClaimRound {
            agent,
            now,
            limit,
            expires_at,
        };
        self.claim_timers(round).await
    }

    /// Claim the timers of `round` (at least one), soonest first: what a backend implements
    /// behind [`ThreadTimers::claim_due_timers`].
    async fn claim_timers(&self, round: TimerClaimRound<'_>) -> AgentResult<Vec<ClaimedTimer>>;

    /// Remove a timer that was fired under `claim`. `false` (and nothing changes) when the
    /// claim is no longer the timer's (it lapsed and was claimed again) or the timer is gone.
    async fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool>;

    /// The earliest time any timer `agent` would claim becomes claimable (its due time, or
    /// the end of its live claim), of any tenant; `None` when there is none. Schedulers sleep
    /// until then.
    async fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>>;
}

/// One claim of due timers as a backend runs it: up to `limit` of `agent`'s timers (and
/// ownerless ones) that are claimable at `now`, each claimed until `expires_at`.
#[derive(Debug, Clone, Copy)]
pub struct TimerClaimRound<'a> {
    /// The agent whose scheduler claims.
    pub agent: &'a str,
    /// The time a timer must be claimable by.
    pub now: DateTime<Utc>,
    /// The most timers to claim (at least 1).
    pub limit: usize,
    /// When each claim lapses.
    pub expires_at: DateTime<Utc>,
}

impl TimerClaimRound<'_> {
    /// `timer` (with `attempts` counting this claim) claimed in this round under `claim`.
    pub fn claimed(&self, timer: TimerRecord, claim: String) -> ClaimedTimer {
        ClaimedTimer {
            timer,
            claim,
            claim_expires_at: self.expires_at,
        }
    }
}

/// Whether `agent`'s scheduler claims `timer`: its own, or an ownerless one.
pub fn timer_claimable_by(timer: &TimerRecord, agent: &str) -> bool {
    timer.agent == agent || timer.agent.is_empty()
}

struct MemoryTimer {
    namespace: String,
    record: TimerRecord,
    /// When it may be claimed: the due time, then the end of each claim.
    ready_at: DateTime<Utc>,
    claim: Option<String>,
}

/// [`ThreadTimers`] in process memory: nothing survives a restart.
#[derive(Default)]
pub struct InMemoryThreadTimers {
    timers: Mutex<HashMap<String, MemoryTimer>>,
}

impl InMemoryThreadTimers {
    /// No timers.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, MemoryTimer>> {
        self.timers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ThreadTimers for InMemoryThreadTimers {
    async fn insert_timer(&self, timer: &TimerRecord) -> AgentResult<()> {
        self.lock().insert(
            timer.id.clone(),
            MemoryTimer {
                namespace: timer.auth.namespace(),
                record: timer.clone(),
                ready_at: timer.due_at,
                claim: None,
            },
        );
        Ok(())
    }

    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> AgentResult<bool> {
        let mut timers = self.lock();
        match timers.get(id) {
            Some(timer) if timer.namespace == auth.namespace() => {
                timers.remove(id);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> AgentResult<Vec<TimerRecord>> {
        let namespace = auth.namespace();
        let mut found: Vec<TimerRecord> = self
            .lock()
            .values()
            .filter(|t| t.namespace == namespace && &t.record.thread_id == thread_id)
            .map(|t| t.record.clone())
            .collect();
        found.sort_by(|a, b| (a.due_at, &a.id).cmp(&(b.due_at, &b.id)));
        Ok(found)
    }

    async fn claim_timers(&self, round: TimerClaimRound<'_>) -> AgentResult<Vec<ClaimedTimer>> {
        let mut timers = self.lock();
        let mut due: Vec<(DateTime<Utc>, String)> = timers
            .values()
            .filter(|t| t.ready_at <= round.now && timer_claimable_by(&t.record, round.agent))
            .map(|t| (t.ready_at, t.record.id.clone()))
            .collect();
        due.sort();
        let mut claimed = Vec::new();
        for (_, id) in due.into_iter().take(round.limit) {
            let Some(timer) = timers.get_mut(&id) else {
                continue;
            };
            let claim = uuid::Uuid::new_v4().simple().to_string();
            timer.ready_at = round.expires_at;
            timer.claim = Some(claim.clone());
            timer.record.attempts += 1;
            claimed.push(round.claimed(timer.record.clone(), claim));
        }
        Ok(claimed)
    }

    async fn complete_timer(&self, claim: &ClaimedTimer) -> AgentResult<bool> {
        let mut timers = self.lock();
        match timers.get(&claim.timer.id) {
            Some(timer) if timer.claim.as_deref() == Some(claim.claim.as_str()) => {
                timers.remove(&claim.timer.id);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn next_timer_at(&self, agent: &str) -> AgentResult<Option<DateTime<Utc>>> {
        Ok(self
            .lock()
            .values()
            .filter(|t| timer_claimable_by(&t.record, agent))
            .map(|t| t.ready_at)
            .min())
    }
}
