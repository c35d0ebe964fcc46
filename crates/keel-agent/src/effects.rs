//! Scheduled effects (Standard Agents §2: "a scheduled effect alarm fires"): a named effect
//! with a JSON payload, stored as a durable timer in the runtime's
//! [`ThreadTimers`](keel_runtime::ThreadTimers), that fires after a restart too.
//!
//! An agent registers a handler per effect name ([`AgentBuilder::effect`](crate::AgentBuilder::effect)).
//! The executor's scheduler ([`AgentExecutor::start_effects`]) sleeps until the nearest timer
//! is due (woken early when this process schedules a nearer one, and looking again at least
//! every [`EFFECT_RECHECK`] for timers other processes scheduled), claims due timers of every
//! tenant, and puts each on its thread's durable queue. The thread's worker, holding the
//! thread's lease, then runs the handler with the thread's [`ThreadState`]: what the handler
//! queues starts a turn when the thread is idle, or is injected into the running
//! conversation before its next model call. A terminated thread never fires: its timer is
//! dropped with an `effect.dropped` marker.
//!
//! Firing is at least once: a timer is removed only after its handler ran. A process that
//! dies after claiming it leaves the claim to lapse after [`EFFECT_CLAIM_TTL`]; the next
//! claimer queues it again, or, when it already waits in the thread's queue, makes sure a
//! worker drives that thread. Canceling works until the handler runs.
//!
//! Timers belong to an agent (its card name): a scheduler claims only its own agent's, so
//! agents sharing a store (a parent and its subagent kinds, or unrelated agents) each fire
//! their own effects. The same timers carry *wakes*: a timer with the reserved name
//! [`WAKE_EFFECT`] has no handler; its claimer starts a worker for the thread if the thread's
//! queue holds work, and keeps it until it finds the queue empty. Work queued where nobody
//! may run it at once (a child's result queued on a parent whose executor lives in another
//! process, or work a process left when it stopped) is thereby picked up by the owning
//! agent's scheduler, in whatever process claims the wake.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use keel_core::{AgentError, AgentResult, RunContext, ThreadId};
use keel_events::payload::{
    EffectCanceledPayload, EffectDroppedPayload, EffectFiredPayload, EffectScheduledPayload,
};
use keel_events::{
    EventEmitter, EventSink, MultiSink, RedactionPolicy, RunEvent, RunEventBuilder, RunRecorder,
};
use keel_runtime::{AuthContext, ClaimedTimer, LogLevel, RunRecord, ThreadTimers, TimerRecord};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::thread_state::{EffectFn, ThreadHost, ThreadState};
use crate::work::{QueuedEffect, QueuedWork};

/// How long a claimed timer is reserved for the scheduler that claimed it. Claiming, queueing
/// and completing take a few store round trips; past this a claim is presumed dead and the
/// timer is fired again.
pub const EFFECT_CLAIM_TTL: Duration = Duration::from_secs(60);

/// The longest the scheduler sleeps without looking at the store, so timers scheduled by
/// other processes sharing it are not missed. (Timers scheduled by this process wake it at
/// once.)
pub const EFFECT_RECHECK: Duration = Duration::from_secs(5);

/// Tuning of the effect scheduler ([`AgentExecutor::start_effects_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectConfig {
    /// How long a claimed timer is reserved for this scheduler (default
    /// [`EFFECT_CLAIM_TTL`]); after a crash, the timers this process claimed fire elsewhere
    /// after this long.
    pub claim_ttl: Duration,
    /// The longest sleep between looks at the store (default [`EFFECT_RECHECK`]).
    pub recheck: Duration,
}

impl Default for EffectConfig {
    fn default() -> Self {
        Self {
            claim_ttl: EFFECT_CLAIM_TTL,
            recheck: EFFECT_RECHECK,
        }
    }
}

/// The reserved effect name of a wake timer: no handler runs; the claimer makes sure a
/// worker drives the thread while its queue holds work.
pub const WAKE_EFFECT: &str = "keel:wake";

/// How many due timers one claim takes.
const CLAIM_BATCH: usize = 64;

/// Wrap a closure as an [`EffectFn`].
pub(crate) fn effect_fn<F, Fut>(handler: F) -> EffectFn
where
    F: Fn(ThreadState, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = AgentResult<()>> + Send + 'static,
{
    Arc::new(move |thread, payload| handler(thread, payload).boxed())
}

impl ThreadState {
    /// Schedule effect `name` (a handler the agent registered) to fire on this thread with
    /// `payload` after `delay`. Durable: it fires after a restart too. A terminated thread is
    /// [`AgentError::ThreadTerminated`], an unknown effect [`AgentError::InvalidInput`], and a
    /// runtime without [`ThreadTimers`] [`AgentError::Unsupported`].
    pub async fn schedule_effect(
        &self,
        name: &str,
        payload: Value,
        delay: Duration,
    ) -> AgentResult<TimerRecord> {
        let delay = chrono::Duration::from_std(delay)
            .map_err(|_| AgentError::invalid_input("delay", "is too long"))?;
        self.schedule_effect_at(name, payload, Utc::now() + delay)
            .await
    }

    /// Schedule effect `name` to fire at `at` (a time in the past fires at once); see
    /// [`ThreadState::schedule_effect`].
    pub async fn schedule_effect_at(
        &self,
        name: &str,
        payload: Value,
        at: DateTime<Utc>,
    ) -> AgentResult<TimerRecord> {
        if self.host.effect_handler(name).is_none() {
            return Err(AgentError::invalid_input(
                "effect",
                format!(
                    "agent `{}` has no handler for effect `{name}`",
                    self.agent_name()
                ),
            ));
        }
        self.ensure_open().await?;
        let timer = timers(self.host.as_ref())?
            .schedule_timer(
                &self.auth,
                &self.thread_id,
                self.host.agent_name(),
                name,
                payload,
                at,
            )
            .await?;
        self.host.effect_scheduler().wake();
        effect_marker(
            self.host.as_ref(),
            &self.auth,
            &self.thread_id,
            RunEvent::effect_scheduled(EffectScheduledPayload {
                timer_id: timer.id.clone(),
                name: name.to_owned(),
                due_at: timer.due_at,
            }),
        )
        .await;
        Ok(timer)
    }

    /// Cancel one of this thread's scheduled effects; `false` when the thread has no such
    /// pending effect (unknown, another thread's, or already fired).
    pub async fn cancel_effect(&self, timer_id: &str) -> AgentResult<bool> {
        let timers = timers(self.host.as_ref())?;
        let pending = timers.thread_timers(&self.auth, &self.thread_id).await?;
        let Some(timer) = pending
            .into_iter()
            .find(|t| t.id == timer_id && t.name != WAKE_EFFECT)
        else {
            return Ok(false);
        };
        let canceled = timers.cancel_timer(&self.auth, timer_id).await?;
        if canceled {
            effect_marker(
                self.host.as_ref(),
                &self.auth,
                &self.thread_id,
                RunEvent::effect_canceled(EffectCanceledPayload {
                    timer_id: timer.id,
                    name: timer.name,
                }),
            )
            .await;
        }
        Ok(canceled)
    }

    /// This thread's pending effects, soonest first (wakes, which are the runtime's, are
    /// not listed).
    pub async fn scheduled_effects(&self) -> AgentResult<Vec<TimerRecord>> {
        let mut pending = timers(self.host.as_ref())?
            .thread_timers(&self.auth, &self.thread_id)
            .await?;
        pending.retain(|t| t.name != WAKE_EFFECT);
        Ok(pending)
    }
}

/// Start `host`'s effect scheduler with `config`: `true` when it starts now, `false` when it
/// was running already. A claim TTL outside 1 ms ..= 24 h or a zero recheck is
/// [`AgentError::InvalidInput`]; a runtime without thread timers is
/// [`AgentError::Unsupported`]. It stops when the executor shuts down or is dropped.
pub(crate) fn start_scheduler(
    host: &Arc<dyn ThreadHost>,
    config: EffectConfig,
) -> AgentResult<bool> {
    // The claim TTL has the bounds of a lease TTL; a zero recheck would spin.
    keel_runtime::check_lease_ttl(config.claim_ttl)?;
    if config.recheck.is_zero() {
        return Err(AgentError::invalid_input(
            "recheck",
            "must be longer than zero",
        ));
    }
    let timers = timers(host.as_ref())?;
    if !host.effect_scheduler().start() {
        return Ok(false);
    }
    let me = Arc::downgrade(host);
    let wake = host.effect_scheduler().waker();
    let stop = host.shutting_down().clone();
    let agent = host.agent_name().to_owned();
    let span = tracing::info_span!("effects", agent = %agent);
    host.tracker().spawn(tracing::Instrument::instrument(
        run_scheduler(me, agent, timers, wake, stop, config),
        span,
    ));
    Ok(true)
}

fn timers(host: &dyn ThreadHost) -> AgentResult<Arc<dyn ThreadTimers>> {
    host.runtime()
        .thread_timers()
        .ok_or_else(|| AgentError::Unsupported {
            what: "scheduled effects: this runtime keeps no thread timers".into(),
        })
}

/// The scheduler loop. It holds the executor only weakly, so dropping the executor ends it.
async fn run_scheduler(
    me: Weak<dyn ThreadHost>,
    agent: String,
    timers: Arc<dyn ThreadTimers>,
    wake: Arc<Notify>,
    stop: CancellationToken,
    config: EffectConfig,
) {
    // The runtime's log, held apart from the executor, which the loop holds only weakly.
    let Some(logging) = me.upgrade().map(|host| host.runtime().logging_service()) else {
        return;
    };
    loop {
        if stop.is_cancelled() {
            break;
        }
        let Some(host) = me.upgrade() else { break };
        let mut pause = Duration::ZERO;
        match timers
            .claim_due_timers(&agent, Utc::now(), CLAIM_BATCH, config.claim_ttl)
            .await
        {
            Ok(claimed) => {
                let full = claimed.len() == CLAIM_BATCH;
                for claim in claimed {
                    deliver_effect(host.as_ref(), claim).await;
                }
                if full {
                    continue;
                }
            }
            Err(err) => {
                logging.log(LogLevel::Warn, &format!("cannot claim due timers: {err}"));
                pause = config.recheck;
            }
        }
        drop(host);
        let sleep = match timers.next_timer_at(&agent).await {
            Ok(Some(next)) => (next - Utc::now())
                .to_std()
                // Due already (scheduled while we claimed, or another process's claim just
                // moved): look again soon, but never spin.
                .unwrap_or(Duration::from_millis(10))
                .min(config.recheck),
            Ok(None) => config.recheck,
            Err(err) => {
                logging.log(
                    LogLevel::Warn,
                    &format!("cannot read the next timer: {err}"),
                );
                config.recheck
            }
        }
        .max(pause);
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = wake.notified() => {}
            () = stop.cancelled() => break,
        }
    }
    logging.log(LogLevel::Debug, "effect scheduler stopped");
}

/// A claimed timer goes to its thread's queue, unless it is already there (an earlier
/// claim queued it and lapsed while it waited): then its thread only gets a driver, which
/// also covers a queue a dead process left with nobody working it. The timer stays
/// stored until its handler has run, so a crash anywhere before that fires it again
/// rather than losing it. A terminated thread's timer is removed with a marker.
async fn deliver_effect(host: &dyn ThreadHost, claim: ClaimedTimer) {
    if claim.timer.name == WAKE_EFFECT {
        deliver_wake(host, &claim).await;
        return;
    }
    let timer = &claim.timer;
    let (auth, thread_id) = (&timer.auth, &timer.thread_id);
    let Some(me) = host.shared() else { return };
    let thread = ThreadState {
        auth: auth.clone(),
        thread_id: thread_id.clone(),
        host: me,
        cancel: CancellationToken::new(),
    };
    match thread.is_terminated().await {
        Ok(true) => {
            let Ok(timers) = timers(host) else { return };
            if let Err(err) = timers.complete_timer(&claim).await {
                host.log(
                    LogLevel::Warn,
                    &format!("cannot remove the timer {}: {err}", timer.id),
                );
                return;
            }
            drop_effect(
                host,
                auth,
                thread_id,
                &timer.id,
                &timer.name,
                "thread terminated",
            )
            .await;
        }
        Ok(false) => {
            let queued = match host
                .runtime()
                .thread_store()
                .peek_queue(auth, thread_id, usize::MAX)
                .await
            {
                Ok(items) => items.iter().any(|item| {
                    matches!(
                        serde_json::from_value(item.payload.clone()),
                        Ok(QueuedWork::Effect(QueuedEffect { timer_id, .. })) if timer_id == timer.id
                    )
                }),
                Err(err) => {
                    host.log(LogLevel::Warn, &format!("cannot read the queue of the effect {}: {err}", timer.id));
                    return;
                }
            };
            if queued {
                host.schedule(auth, thread_id);
                return;
            }
            let work = QueuedWork::Effect(QueuedEffect {
                timer_id: timer.id.clone(),
                name: timer.name.clone(),
                payload: timer.payload.clone(),
                due_at: timer.due_at,
            });
            if let Err(err) = host.enqueue(auth, thread_id, work).await {
                host.log(
                    LogLevel::Warn,
                    &format!("cannot queue the due effect {}: {err}", timer.id),
                );
            }
        }
        Err(err) => {
            host.log(
                LogLevel::Warn,
                &format!("cannot check the thread of the effect {}: {err}", timer.id),
            );
        }
    }
}

/// A claimed wake: while the thread's queue holds work, make sure a worker drives it and
/// keep the claim, which lapses after the claim TTL and brings the wake back to look
/// again (so a crash of this process before the work ran strands nothing); once the
/// queue is seen empty, the wake is done.
async fn deliver_wake(host: &dyn ThreadHost, claim: &ClaimedTimer) {
    let (auth, thread_id) = (&claim.timer.auth, &claim.timer.thread_id);
    match host
        .runtime()
        .thread_store()
        .queue_len(auth, thread_id)
        .await
    {
        Ok(0) => {
            let Ok(timers) = timers(host) else { return };
            if let Err(err) = timers.complete_timer(claim).await {
                host.log(
                    LogLevel::Warn,
                    &format!("cannot remove the wake {}: {err}", claim.timer.id),
                );
            }
        }
        Ok(_) => host.schedule(auth, thread_id),
        Err(err) => {
            host.log(
                LogLevel::Warn,
                &format!(
                    "cannot read the queue of the wake {}: {err}",
                    claim.timer.id
                ),
            );
        }
    }
}

/// Durably ask `agent`'s scheduler, in whatever process claims the wake, to drive the
/// thread from `at` on while its queue holds work (see [`WAKE_EFFECT`]). A runtime
/// without timers has nothing durable to record this in: the work then waits for the
/// next work on its thread, as before. Failures are logged: the work itself is queued.
pub(crate) async fn request_wake(
    host: &dyn ThreadHost,
    auth: &AuthContext,
    thread_id: &ThreadId,
    agent: &str,
    at: DateTime<Utc>,
) {
    let Ok(timers) = timers(host) else { return };
    match timers
        .schedule_timer(auth, thread_id, agent, WAKE_EFFECT, Value::Null, at)
        .await
    {
        Ok(_) if agent == host.agent_name() => host.effect_scheduler().wake(),
        Ok(_) => {}
        Err(err) => {
            host.log(
                LogLevel::Warn,
                &format!("cannot record a wake for queued work on {thread_id}: {err}"),
            );
        }
    }
}

/// After this executor queued work that no task record would bring back (a message or a
/// tool call), record a wake due when a crashed holder's lease would have lapsed, so the
/// work runs even if this process stops before its worker takes it. Only an executor
/// whose scheduler runs records one: without a scheduler nothing would ever remove it.
pub(crate) async fn guard_queued(host: &dyn ThreadHost, auth: &AuthContext, thread_id: &ThreadId) {
    if !host.effect_scheduler().started() {
        return;
    }
    let after = chrono::Duration::from_std(host.lease_ttl())
        .unwrap_or_else(|_| chrono::Duration::seconds(30));
    request_wake(host, auth, thread_id, host.agent_name(), Utc::now() + after).await;
}

/// Run a queued effect's handler on the thread, as the holder of its lease, then remove
/// its timer. An effect whose timer is gone (canceled while it waited in the queue, or
/// already fired through a duplicate queue entry) does nothing.
pub(crate) async fn fire_effect(
    host: &dyn ThreadHost,
    auth: &AuthContext,
    thread_id: &ThreadId,
    effect: QueuedEffect,
) -> AgentResult<()> {
    let Some(me) = host.shared() else {
        return Ok(());
    };
    let timers = timers(host)?;
    let pending = timers.thread_timers(auth, thread_id).await?;
    if !pending.iter().any(|t| t.id == effect.timer_id) {
        host.log(
            LogLevel::Debug,
            &format!("the queued effect {} is no longer pending", effect.timer_id),
        );
        return Ok(());
    }
    let thread = ThreadState {
        auth: auth.clone(),
        thread_id: thread_id.clone(),
        host: me,
        cancel: CancellationToken::new(),
    };
    let handler = host.effect_handler(&effect.name);
    let dropped = if thread.is_terminated().await? {
        Some("thread terminated")
    } else if handler.is_none() {
        Some("the agent has no handler for it")
    } else {
        None
    };
    if let Some(reason) = dropped {
        timers.cancel_timer(auth, &effect.timer_id).await?;
        drop_effect(
            host,
            auth,
            thread_id,
            &effect.timer_id,
            &effect.name,
            reason,
        )
        .await;
        return Ok(());
    }
    let Some(handler) = handler else {
        return Ok(());
    };
    // A handler's panic or error is the handler's failure, not the thread's: it is
    // reported and the queue goes on.
    let outcome = AssertUnwindSafe(handler(thread, effect.payload.clone()))
        .catch_unwind()
        .await;
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(err)) => Some(err.to_string()),
        Err(_) => Some("the effect handler panicked".to_owned()),
    };
    if let Some(error) = &error {
        host.log(
            LogLevel::Warn,
            &format!(
                "the handler of the effect `{}` failed: {error}",
                effect.name
            ),
        );
    }
    timers.cancel_timer(auth, &effect.timer_id).await?;
    effect_marker(
        host,
        auth,
        thread_id,
        RunEvent::effect_fired(EffectFiredPayload {
            timer_id: effect.timer_id,
            name: effect.name,
            due_at: effect.due_at,
            error,
        }),
    )
    .await;
    Ok(())
}

/// Fire the effects among `items` (queued work peeked by a running flow) and acknowledge
/// them; `true` when any fired, so the caller looks at the queue again for what they
/// queued.
pub(crate) async fn fire_queued_effects(
    host: &dyn ThreadHost,
    auth: &AuthContext,
    lease: &keel_runtime::Lease,
    items: &[keel_runtime::QueuedItem],
) -> AgentResult<bool> {
    let mut fired = Vec::new();
    for item in items {
        // Every step looks at the queue, whose head is usually the run's own task: only
        // an effect is decoded.
        if item.payload.get("kind").and_then(Value::as_str) != Some("effect") {
            continue;
        }
        if let Ok(QueuedWork::Effect(effect)) = QueuedWork::deserialize(&item.payload) {
            fire_effect(host, auth, &lease.thread_id, effect).await?;
            fired.push(item.id.clone());
        }
    }
    if fired.is_empty() {
        return Ok(false);
    }
    host.runtime()
        .thread_store()
        .ack_queue(auth, lease, &fired)
        .await?;
    Ok(true)
}

async fn drop_effect(
    host: &dyn ThreadHost,
    auth: &AuthContext,
    thread_id: &ThreadId,
    timer_id: &str,
    name: &str,
    reason: &str,
) {
    effect_marker(
        host,
        auth,
        thread_id,
        RunEvent::effect_dropped(EffectDroppedPayload {
            timer_id: timer_id.to_owned(),
            name: name.to_owned(),
            reason: reason.to_owned(),
        }),
    )
    .await;
}

/// Report an effect's life (`effect.scheduled`, `.fired`, `.canceled`, `.dropped`): a
/// normalized event to every sink of the executor, and a run record of the thread in the
/// run store, so the marker is durable like a run's events. Failures are logged: a
/// marker never stops the effect.
pub(crate) async fn effect_marker(
    host: &dyn ThreadHost,
    auth: &AuthContext,
    thread_id: &ThreadId,
    event: RunEventBuilder,
) {
    let agent_name = host.agent_name().to_owned();
    let context = RunContext::new()
        .with_thread(thread_id.clone())
        .with_agent(agent_name.clone());
    let recorder = Arc::new(RunRecorder::new());
    let mut sinks = MultiSink::new().with(recorder.clone());
    for sink in host.sinks().iter() {
        sinks = sinks.with(Arc::clone(sink) as Arc<dyn EventSink>);
    }
    let emitter = EventEmitter::new(&context, Arc::new(sinks)).with_agent_name(agent_name.clone());
    if let Err(err) = emitter.emit(event).await {
        host.log(LogLevel::Warn, &format!("an event sink failed: {err}"));
    }
    let result = async {
        let report = recorder
            .report()
            .redacted_json(&RedactionPolicy::default())?;
        host.runtime()
            .run_store()
            .save_run_report(
                auth,
                &RunRecord {
                    run_id: context.run_id.clone(),
                    task_id: None,
                    thread_id: Some(thread_id.clone()),
                    trace_id: Some(context.trace_id.clone()),
                    agent_name: Some(agent_name),
                    recorded_at: Utc::now(),
                    report,
                },
            )
            .await
    }
    .await;
    if let Err(err) = result {
        host.log(
            LogLevel::Warn,
            &format!("could not record an effect marker: {err}"),
        );
    }
}
