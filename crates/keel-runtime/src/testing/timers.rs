//! Conformance checks of [`ThreadTimers`](crate::ThreadTimers): tenant-scoped listing and
//! cancelation, claiming only what is due and only once, reclaiming after a claim lapses,
//! and per-agent claims.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use keel_core::AgentError;
use serde_json::json;

use keel_core::ThreadId;

use super::{fresh_tenant, fresh_thread, tenant_and_thread};
use crate::AuthContext;

/// The agent the timer checks schedule for (the one that claims them).
const TIMER_AGENT: &str = "conformance-agent";

/// The claims of `claimed` that belong to `auth` (a shared store may hold other tests' timers).
fn claims_of(claimed: Vec<crate::ClaimedTimer>, auth: &AuthContext) -> Vec<crate::ClaimedTimer> {
    claimed
        .into_iter()
        .filter(|c| &c.timer.auth == auth)
        .collect()
}

/// What `agent` claims at `at` (up to 1,000 timers, held for `ttl`) of `auth`'s timers.
async fn claim_for(
    timers: &dyn crate::ThreadTimers,
    agent: &str,
    at: chrono::DateTime<Utc>,
    ttl: Duration,
    auth: &AuthContext,
) -> Vec<crate::ClaimedTimer> {
    claims_of(
        timers.claim_due_timers(agent, at, 1000, ttl).await.unwrap(),
        auth,
    )
}

/// `auth`'s timers on `thread`, as the store lists them.
async fn timers_on(
    timers: &dyn crate::ThreadTimers,
    auth: &AuthContext,
    thread: &ThreadId,
) -> Vec<crate::TimerRecord> {
    timers.thread_timers(auth, thread).await.unwrap()
}

/// Assert that `claimed` is `timer` alone; `rule` says why it should be.
#[track_caller]
fn assert_claimed_only(claimed: &[crate::ClaimedTimer], timer: &crate::TimerRecord, rule: &str) {
    let ids: Vec<&str> = claimed.iter().map(|c| c.timer.id.as_str()).collect();
    assert_eq!(ids, [timer.id.as_str()], "{rule}");
}

/// When `agent`'s next timer is due, if it has one.
async fn next_at(timers: &dyn crate::ThreadTimers, agent: &str) -> Option<chrono::DateTime<Utc>> {
    timers.next_timer_at(agent).await.unwrap()
}

/// Schedule a timer that must be accepted.
async fn schedule(
    timers: &dyn crate::ThreadTimers,
    auth: &AuthContext,
    thread: &ThreadId,
    agent: &str,
    name: &str,
    payload: serde_json::Value,
    due_at: chrono::DateTime<Utc>,
) -> crate::TimerRecord {
    timers
        .schedule_timer(auth, thread, agent, name, payload, due_at)
        .await
        .unwrap()
}

/// Timers are tenant-scoped: listed per thread soonest first, invisible to and not cancelable
/// by another tenant, and canceled exactly once.
pub async fn timers_schedule_list_and_cancel(timers: &dyn crate::ThreadTimers) {
    let (auth, other) = (fresh_tenant(), fresh_tenant());
    let thread = fresh_thread();
    let now = Utc::now();
    let later = schedule(
        timers,
        &auth,
        &thread,
        TIMER_AGENT,
        "later",
        json!({"n": 2}),
        now + chrono::Duration::hours(2),
    )
    .await;
    let sooner = schedule(
        timers,
        &auth,
        &thread,
        TIMER_AGENT,
        "sooner",
        json!({"n": [1, "ü"]}),
        now + chrono::Duration::hours(1),
    )
    .await;
    assert_ne!(later.id, sooner.id, "ids are unique");
    assert_eq!(sooner.auth, auth, "the record carries its tenant");
    assert_eq!(sooner.attempts, 0, "a new timer was never claimed");
    let listed = timers_on(timers, &auth, &thread).await;
    assert_eq!(
        listed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [sooner.id.as_str(), later.id.as_str()],
        "a thread's timers are listed soonest first"
    );
    assert_eq!(listed[0], sooner, "a timer round-trips");
    assert!(
        timers_on(timers, &other, &thread).await.is_empty(),
        "another tenant sees no timers"
    );
    assert!(
        timers
            .thread_timers(&auth, &fresh_thread())
            .await
            .unwrap()
            .is_empty(),
        "another thread has no timers"
    );
    assert!(
        !timers.cancel_timer(&other, &sooner.id).await.unwrap(),
        "another tenant cannot cancel a timer"
    );
    assert!(
        timers.cancel_timer(&auth, &sooner.id).await.unwrap(),
        "cancel removes the timer"
    );
    assert!(
        !timers.cancel_timer(&auth, &sooner.id).await.unwrap(),
        "a second cancel finds nothing"
    );
    assert!(
        !timers.cancel_timer(&auth, "no-such-timer").await.unwrap(),
        "unknown id is false"
    );
    assert_eq!(
        timers_on(timers, &auth, &thread).await,
        vec![later.clone()],
        "the other timer stays"
    );
    let claimed = claims_of(
        timers
            .claim_due_timers(
                TIMER_AGENT,
                now + chrono::Duration::hours(3),
                1000,
                Duration::from_secs(60),
            )
            .await
            .unwrap(),
        &auth,
    );
    assert_claimed_only(&claimed, &later, "a canceled timer is never claimed");
    assert!(
        timers.cancel_timer(&auth, &later.id).await.unwrap(),
        "a claimed timer can be canceled"
    );
    assert!(
        !timers.complete_timer(&claimed[0]).await.unwrap(),
        "completing a canceled timer is false"
    );
}

/// Only due timers are claimed; a live claim hides a timer from other claimers, a lapsed one
/// lets it be claimed again (at least once), and only the current claim completes it.
pub async fn timers_claim_only_what_is_due_and_reclaim_after_the_claim_lapses(
    timers: &dyn crate::ThreadTimers,
) {
    let (auth, thread) = tenant_and_thread();
    let now = Utc::now();
    let due_at = now + chrono::Duration::hours(1);
    let timer = schedule(
        timers,
        &auth,
        &thread,
        TIMER_AGENT,
        "ping",
        json!(null),
        due_at,
    )
    .await;
    let next = next_at(timers, TIMER_AGENT)
        .await
        .expect("a timer is stored");
    assert!(
        next <= due_at,
        "next_timer_at is no later than the soonest timer"
    );
    let ttl = Duration::from_secs(60);
    assert!(
        claim_for(timers, TIMER_AGENT, now, ttl, &auth)
            .await
            .is_empty(),
        "a timer that is not due is not claimed"
    );
    assert!(
        matches!(
            timers
                .claim_due_timers(TIMER_AGENT, now, 10, Duration::ZERO)
                .await,
            Err(AgentError::InvalidInput { .. })
        ),
        "a zero claim TTL is invalid input"
    );
    let at = due_at + chrono::Duration::seconds(1);
    let first = claim_for(timers, TIMER_AGENT, at, ttl, &auth).await;
    assert_eq!(first.len(), 1, "a due timer is claimed");
    assert_eq!(first[0].timer.id, timer.id);
    assert_eq!(first[0].timer.attempts, 1, "the first claim is attempt 1");
    assert_eq!(first[0].timer.payload, json!(null));
    assert!(
        claim_for(
            timers,
            TIMER_AGENT,
            at + chrono::Duration::seconds(30),
            ttl,
            &auth
        )
        .await
        .is_empty(),
        "a live claim hides the timer"
    );
    assert_eq!(
        timers_on(timers, &auth, &thread).await.len(),
        1,
        "a claimed timer is still listed"
    );
    let lapsed = at + chrono::Duration::seconds(61);
    let second = claim_for(timers, TIMER_AGENT, lapsed, ttl, &auth).await;
    assert_eq!(
        second.len(),
        1,
        "a lapsed claim makes the timer claimable again"
    );
    assert_eq!(second[0].timer.attempts, 2, "the second claim is attempt 2");
    assert_ne!(
        second[0].claim, first[0].claim,
        "each claim has its own token"
    );
    assert!(
        !timers.complete_timer(&first[0]).await.unwrap(),
        "a lapsed claim cannot complete the timer"
    );
    assert!(
        timers.complete_timer(&second[0]).await.unwrap(),
        "the live claim completes it"
    );
    assert!(
        timers_on(timers, &auth, &thread).await.is_empty(),
        "a completed timer is gone"
    );
    assert!(
        !timers.complete_timer(&second[0]).await.unwrap(),
        "completing twice is false"
    );
}

/// Claimers racing on one store never get the same timer: every due timer is claimed by
/// exactly one of them.
pub async fn timers_are_claimed_once_under_contention(timers: Arc<dyn crate::ThreadTimers>) {
    let auth = fresh_tenant();
    let now = Utc::now();
    let mut ids = HashSet::new();
    for i in 0..20 {
        let timer = schedule(
            timers.as_ref(),
            &auth,
            &fresh_thread(),
            TIMER_AGENT,
            "tick",
            json!(i),
            now - chrono::Duration::seconds(1),
        )
        .await;
        ids.insert(timer.id);
    }
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let timers = timers.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..10 {
                    got.extend(
                        timers
                            .claim_due_timers(TIMER_AGENT, now, 3, Duration::from_secs(600))
                            .await
                            .unwrap(),
                    );
                }
                got
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for claimer in claimers {
        claimed.extend(claims_of(claimer.await.unwrap(), &auth));
    }
    let claimed_ids: Vec<String> = claimed.iter().map(|c| c.timer.id.clone()).collect();
    let unique: HashSet<String> = claimed_ids.iter().cloned().collect();
    assert_eq!(unique.len(), claimed_ids.len(), "no timer is claimed twice");
    assert_eq!(unique, ids, "every due timer is claimed");
    for claim in &claimed {
        assert!(timers.complete_timer(claim).await.unwrap());
    }
}

/// A scheduler claims only its own agent's timers (and ownerless ones): two agents sharing a
/// store each get theirs, and `next_timer_at` looks only at what the agent would claim.
pub async fn timers_are_claimed_only_by_their_agent(timers: &dyn crate::ThreadTimers) {
    let (auth, thread) = tenant_and_thread();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (a, b, idle) = (
        format!("agent-a-{unique}"),
        format!("agent-b-{unique}"),
        format!("agent-idle-{unique}"),
    );
    let now = Utc::now();
    let past = now - chrono::Duration::seconds(1);
    let ta = schedule(timers, &auth, &thread, &a, "tick", json!("a"), past).await;
    assert_eq!(ta.agent, a, "the record names its agent");
    let tb = schedule(timers, &auth, &thread, &b, "tick", json!("b"), past).await;
    let far = now + chrono::Duration::hours(1);
    let ta_far = schedule(timers, &auth, &thread, &a, "later", json!("a2"), far).await;
    assert_eq!(
        next_at(timers, &idle).await,
        None,
        "an agent with no timers has nothing to wait for"
    );
    let next_b = next_at(timers, &b).await.expect("b has a timer");
    assert!(
        next_b <= tb.due_at,
        "next_timer_at sees the agent's own timer"
    );
    let ttl = Duration::from_secs(60);
    assert!(
        claim_for(timers, &idle, now, ttl, &auth).await.is_empty(),
        "an agent claims no other agent's timers"
    );
    let got_a = claim_for(timers, &a, now, ttl, &auth).await;
    assert_claimed_only(&got_a, &ta, "agent a claims its due timer only");
    assert_eq!(got_a[0].timer.agent, a, "a claimed timer names its agent");
    let next_a = next_at(timers, &a).await.expect("a has timers");
    assert!(
        next_a > now,
        "next_timer_at ignores other agents' due timers (b's is due, a's are claimed or later)"
    );
    let got_b = claim_for(timers, &b, now, ttl, &auth).await;
    assert_claimed_only(
        &got_b,
        &tb,
        "agent b claims its own timer, untouched by a's claim",
    );
    // An ownerless timer (stored before timers had owners) goes to whichever agent claims.
    let legacy = schedule(timers, &auth, &thread, "", "old", json!(null), past).await;
    let got_legacy = claim_for(timers, &idle, now, ttl, &auth).await;
    assert_claimed_only(&got_legacy, &legacy, "any agent claims an ownerless timer");
    for claim in got_a.iter().chain(&got_b).chain(&got_legacy) {
        assert!(timers.complete_timer(claim).await.unwrap());
    }
    assert!(timers.cancel_timer(&auth, &ta_far.id).await.unwrap());
    assert_eq!(next_at(timers, &b).await, None, "b's timer is gone");
}

/// Two handles on one storage (two connections, two processes) claiming at once: a due timer
/// goes to exactly one of them.
pub async fn timers_are_claimed_once_by_two_claimers(
    a: &dyn crate::ThreadTimers,
    b: &dyn crate::ThreadTimers,
) {
    let auth = fresh_tenant();
    let agent = format!("agent-{}", uuid::Uuid::new_v4().simple());
    let now = Utc::now();
    let timer = schedule(a, &auth, &fresh_thread(), &agent, "t", json!(1), now).await;
    let ttl = Duration::from_secs(60);
    let (x, y) = tokio::join!(
        claim_for(a, &agent, now, ttl, &auth),
        claim_for(b, &agent, now, ttl, &auth)
    );
    let both: Vec<_> = x.into_iter().chain(y).collect();
    assert_claimed_only(
        &both,
        &timer,
        "exactly one of two claimers claims the timer",
    );
    assert!(
        b.complete_timer(&both[0]).await.unwrap(),
        "either handle completes the claimed timer"
    );
}
