// Scheduled effects (Standard Agents §2): durable timers that fire on their thread, start a
// turn when it is idle, are injected when it is busy, and never fire once canceled or once
// the thread is terminated.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_agent::reads::TaskQuery;
use keel_agent::{Agent, AgentExecutor};
use keel_core::{AgentCard, AgentError, Message, Task, TaskState, ThreadId};
use keel_events::{EventSink, InMemoryEventSink};
use keel_llm::{LlmRole, MockLlm};
use keel_runtime::testing::eventually;
use keel_runtime::{
    AuthContext, ClaimedTimer, RunQuery, Runtime, Services, ThreadTimers,
    TimerClaimRound, TimerRecord,
};
use serde_json::{json, Value};
use tokio::sync::watch;
use super::fixture::{backend, call_then_answer, object_tool, send};

fn card() -> AgentCard {
    AgentCard::new("effects", "scheduled effect tests", "http://127.0.0.1:0")
}

/// Which effects fired, by payload `tag`.
type Fired = Arc<Mutex<Vec<String>>>;

/// An agent whose `remind` effect records its payload's tag and queues a message.
fn reminding(builder: keel_agent::AgentBuilder, fired: Fired) -> Agent {
    builder
        .effect("remind", move |thread, payload: Value| {
            let fired = fired.clone();
            async move {
                let tag = payload["tag"].as_str().unwrap_or_default().to_owned();
                fired.lock().unwrap().push(tag.clone());
                thread.queue_message(format!("reminder {tag}")).await?;
                Ok(())
            }
        })
        .build()
        .unwrap()
}

/// An executor with an event sink, its scheduler not started yet.
fn unstarted(agent: Agent) -> (AgentExecutor, AuthContext, Arc<InMemoryEventSink>) {
    let (runtime, auth) = backend();
    let exec = AgentExecutor::new(agent, runtime);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone() as Arc<dyn EventSink>);
    (exec, auth, sink)
}

/// An executor of the [`reminding`] agent whose scheduler is not started yet, its caller,
/// its events and the tags its effects fired.
fn unstarted_reminder() -> (AgentExecutor, AuthContext, Arc<InMemoryEventSink>, Fired) {
    let fired = Fired::default();
    let (exec, auth, sink) = unstarted(reminding(Agent::builder(card()), fired.clone()));
    (exec, auth, sink, fired)
}

fn started(agent: Agent) -> (AgentExecutor, AuthContext, Arc<InMemoryEventSink>) {
    let (exec, auth, sink) = unstarted(agent);
    exec.start_effects().unwrap();
    (exec, auth, sink)
}

async fn completed_turn(exec: &AgentExecutor, auth: &AuthContext, thread: &ThreadId) -> Task {
    let reads = exec.reads();
    let query = TaskQuery {
        thread_id: Some(thread.clone()),
        state: Some(TaskState::Completed),
        ..TaskQuery::default()
    };
    eventually("a completed turn", || async {
        reads.tasks(auth, &query).await.unwrap().items.into_iter().next()
    })
    .await
}

fn event_types(sink: &InMemoryEventSink) -> Vec<String> {
    sink.events()
        .iter()
        .map(|e| e.event_type.as_str().to_owned())
        .filter(|t| t.starts_with("effect."))
        .collect()
}

#[tokio::test]
async fn a_due_effect_fires_on_its_thread_and_starts_a_turn() {
    // The scheduler starts only after the pending timer is listed: a slow store or a busy
    // machine would otherwise let it fire before the listing.
    let (exec, auth, sink, fired) = unstarted_reminder();
    let thread = ThreadId::new();
    let state = exec.thread(&auth, thread.clone());
    let timer = state
        .schedule_effect("remind", json!({"tag": "a"}), Duration::from_millis(30))
        .await
        .unwrap();
    assert_eq!(state.scheduled_effects().await.unwrap(), vec![timer.clone()]);
    exec.start_effects().unwrap();
    let task = completed_turn(&exec, &auth, &thread).await;
    assert_eq!(task.status().message.as_ref().unwrap().text(), "You said: reminder a");
    assert_eq!(*fired.lock().unwrap(), ["a"]);
    assert!(state.scheduled_effects().await.unwrap().is_empty(), "a fired timer is gone");
    assert_eq!(event_types(&sink), ["effect.scheduled", "effect.fired"]);
    // The markers are durable: each is a run record of the thread in the run store.
    let records = exec
        .runtime()
        .run_store()
        .find_run_reports(
            &auth,
            &RunQuery {
                thread_id: Some(thread.clone()),
                contains: Some("effect.fired".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "the fired marker is in the run store");
}

#[tokio::test]
async fn a_canceled_effect_never_fires() {
    // Scheduled and canceled before the scheduler starts, so the test does not race it.
    let (exec, auth, sink, fired) = unstarted_reminder();
    let thread = ThreadId::new();
    let state = exec.thread(&auth, thread.clone());
    let now = chrono::Utc::now();
    let canceled = state
        .schedule_effect_at("remind", json!({"tag": "canceled"}), now)
        .await
        .unwrap();
    // Due after the canceled one: once it fired, the canceled one would have fired first.
    state
        .schedule_effect_at(
            "remind",
            json!({"tag": "kept"}),
            now + chrono::Duration::milliseconds(1),
        )
        .await
        .unwrap();
    assert!(state.cancel_effect(&canceled.id).await.unwrap());
    assert!(!state.cancel_effect(&canceled.id).await.unwrap(), "canceled once");
    let other = exec.thread(&auth, ThreadId::new());
    assert!(
        !other.cancel_effect(&canceled.id).await.unwrap(),
        "another thread cannot cancel it"
    );
    exec.start_effects().unwrap();
    completed_turn(&exec, &auth, &thread).await;
    assert_eq!(*fired.lock().unwrap(), ["kept"]);
    assert_eq!(
        event_types(&sink),
        ["effect.scheduled", "effect.scheduled", "effect.canceled", "effect.fired"]
    );
}

#[tokio::test]
async fn a_terminated_threads_effect_is_dropped_and_never_fires() {
    let (exec, auth, sink, fired) = unstarted_reminder();
    let doomed = exec.thread(&auth, ThreadId::new());
    let timer = doomed
        .schedule_effect("remind", json!({"tag": "doomed"}), Duration::ZERO)
        .await
        .unwrap();
    doomed.terminate().await.unwrap();
    exec.start_effects().unwrap();
    let dropped = eventually("the dropped marker", || async {
        sink.events()
            .into_iter()
            .find(|e| e.event_type.as_str() == "effect.dropped")
    })
    .await;
    assert_eq!(dropped.payload["timer_id"], json!(timer.id));
    assert!(fired.lock().unwrap().is_empty(), "the handler never ran");
    assert!(doomed.scheduled_effects().await.unwrap().is_empty(), "the timer is gone");
    let err = doomed
        .schedule_effect("remind", json!({}), Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::ThreadTerminated { .. }), "{err:?}");
}

#[tokio::test]
async fn an_unknown_effect_is_invalid_input() {
    let (exec, auth, _sink) = started(reminding(Agent::builder(card()), Fired::default()));
    let err = exec
        .schedule_effect(&auth, &ThreadId::new(), "nope", json!({}), chrono::Utc::now())
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
}

#[tokio::test]
async fn an_effect_name_under_keel_is_refused_when_the_agent_is_built() {
    // `keel:wake` is the runtime's own timer: a handler registered there would never run.
    for name in ["keel:wake", ""] {
        let err = Agent::builder(card())
            .effect(name, |_thread, _payload| async { Ok(()) })
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "effect.name"),
            "{name:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn an_effect_due_while_the_thread_is_busy_is_injected_before_the_next_model_call() {
    let fired = Fired::default();
    let runtime = super::runtime();
    let store = runtime.thread_store();
    // The tool schedules an effect due at once and holds the step until it is queued on the
    // thread: the effect then fires inside the running flow.
    let tool = object_tool("soon", "Schedule now", move |_a, ctx| {
        let store = store.clone();
        async move {
            ctx.thread
                .schedule_effect("remind", json!({"tag": "busy"}), Duration::ZERO)
                .await?;
            eventually("the effect queued on the thread", || async {
                let queued = store
                    .peek_queue(&ctx.auth, ctx.thread.thread_id(), 16)
                    .await
                    .unwrap();
                queued.iter().any(|i| i.payload["kind"] == "effect")
            })
            .await;
            Ok(json!("queued"))
        }
    });
    let llm = Arc::new(MockLlm::scripted(call_then_answer("soon", json!({}), "saw it")));
    let agent = reminding(Agent::builder(card()).llm_shared(llm.clone()).tool(tool), fired.clone());
    let auth = runtime.auth_service().auth_context();
    let exec = AgentExecutor::new(agent, runtime);
    exec.start_effects().unwrap();
    let task = send(&exec, &auth, Message::user("go")).await;
    assert_eq!(task.state(), TaskState::Completed);
    assert_eq!(*fired.lock().unwrap(), ["busy"]);
    let second_call = &llm.requests()[1];
    let last = second_call.messages.last().unwrap();
    assert_eq!((last.role, last.content.as_str()), (LlmRole::User, "reminder busy"));
}

/// What the scheduler's last `next_timer_at` answered (`None` before its first read).
type NextReads = watch::Receiver<Option<Option<chrono::DateTime<chrono::Utc>>>>;

/// The backend's timers, reporting every answer of `next_timer_at`: the scheduler reads it
/// right before it sleeps, so a test can tell the scheduler has gone to sleep toward a timer
/// whatever the store's latency.
struct WatchedTimers {
    inner: Arc<dyn ThreadTimers>,
    next_read: watch::Sender<Option<Option<chrono::DateTime<chrono::Utc>>>>,
    /// The runtime the timers come from, kept alive as long as they are used.
    _runtime: Arc<dyn Runtime>,
}

#[async_trait::async_trait]
impl ThreadTimers for WatchedTimers {
    async fn insert_timer(&self, timer: &TimerRecord) -> keel_core::AgentResult<()> {
        self.inner.insert_timer(timer).await
    }
    async fn cancel_timer(&self, auth: &AuthContext, id: &str) -> keel_core::AgentResult<bool> {
        self.inner.cancel_timer(auth, id).await
    }
    async fn thread_timers(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
    ) -> keel_core::AgentResult<Vec<TimerRecord>> {
        self.inner.thread_timers(auth, thread_id).await
    }
    async fn claim_timers(
        &self,
        round: TimerClaimRound<'_>,
    ) -> keel_core::AgentResult<Vec<ClaimedTimer>> {
        self.inner.claim_timers(round).await
    }
    async fn complete_timer(&self, claim: &ClaimedTimer) -> keel_core::AgentResult<bool> {
        self.inner.complete_timer(claim).await
    }
    async fn next_timer_at(
        &self,
        agent: &str,
    ) -> keel_core::AgentResult<Option<chrono::DateTime<chrono::Utc>>> {
        let next = self.inner.next_timer_at(agent).await?;
        self.next_read.send_replace(Some(next));
        Ok(next)
    }
}

/// `super::runtime()` with its timers watched (see [`WatchedTimers`]).
fn with_watched_timers(runtime: Arc<dyn Runtime>) -> (Arc<dyn Runtime>, NextReads) {
    let (next_read, reads) = watch::channel(None);
    let timers = WatchedTimers {
        inner: runtime.thread_timers().expect("the backend keeps thread timers"),
        next_read,
        _runtime: runtime.clone(),
    };
    let watched = Services::of(runtime.as_ref()).with_timers(timers);
    (Arc::new(watched), reads)
}

#[tokio::test]
async fn scheduling_a_nearer_effect_wakes_the_sleeping_scheduler() {
    let fired = Fired::default();
    let (runtime, mut next_reads) = with_watched_timers(super::runtime());
    let auth = runtime.auth_service().auth_context();
    let exec = AgentExecutor::new(reminding(Agent::builder(card()), fired.clone()), runtime);
    let thread = ThreadId::new();
    let state = exec.thread(&auth, thread.clone());
    state
        .schedule_effect("remind", json!({"tag": "far"}), Duration::from_secs(3600))
        .await
        .unwrap();
    // The scheduler would sleep an hour (until the far timer, and it never rechecks sooner):
    // only the wake-up from scheduling the near one can make it fire.
    exec.start_effects_with(keel_agent::EffectConfig {
        recheck: Duration::from_secs(3600),
        ..Default::default()
    })
    .unwrap();
    // Only once the scheduler has read the far timer as the next one is it asleep toward it;
    // scheduling the near one earlier would let it simply read the near one.
    let asleep = next_reads.wait_for(|read| matches!(read, Some(Some(_))));
    tokio::time::timeout(Duration::from_secs(10), asleep)
        .await
        .expect("the scheduler reads the next timer")
        .unwrap();
    state
        .schedule_effect("remind", json!({"tag": "near"}), Duration::from_millis(20))
        .await
        .unwrap();
    let task = completed_turn(&exec, &auth, &thread).await;
    assert_eq!(task.status().message.as_ref().unwrap().text(), "You said: reminder near");
    assert_eq!(*fired.lock().unwrap(), ["near"]);
    assert_eq!(state.scheduled_effects().await.unwrap().len(), 1, "the far one still waits");
}

#[tokio::test]
async fn two_agents_on_one_store_each_fire_only_their_own_effects() {
    // One store, two agents, the same effect name: each timer belongs to the agent that
    // scheduled it, so one agent's scheduler never takes (and drops, or runs with its own
    // handler) the other's.
    let (runtime, auth) = backend();
    let fired = Fired::default();
    let agent = |name: &str| {
        let (fired, tag) = (fired.clone(), name.to_owned());
        Agent::builder(AgentCard::new(name, "two agents", "http://127.0.0.1:0"))
            .effect("ping", move |_thread, payload: Value| {
                let (fired, tag) = (fired.clone(), tag.clone());
                async move {
                    fired.lock().unwrap().push(format!("{tag}:{}", payload["for"].as_str().unwrap_or_default()));
                    Ok(())
                }
            })
            .build()
            .unwrap()
    };
    let alpha = AgentExecutor::new(agent("alpha"), runtime.clone());
    let beta = AgentExecutor::new(agent("beta"), runtime.clone());
    let beta_sink = Arc::new(InMemoryEventSink::new());
    beta.add_event_sink(beta_sink.clone() as Arc<dyn EventSink>);
    let alpha_sink = Arc::new(InMemoryEventSink::new());
    alpha.add_event_sink(alpha_sink.clone() as Arc<dyn EventSink>);
    let (alpha_thread, beta_thread) = (ThreadId::new(), ThreadId::new());
    // Beta's timer is due first, while only alpha's scheduler runs.
    let beta_timer = beta
        .thread(&auth, beta_thread.clone())
        .schedule_effect("ping", json!({"for": "beta"}), Duration::ZERO)
        .await
        .unwrap();
    alpha
        .thread(&auth, alpha_thread.clone())
        .schedule_effect("ping", json!({"for": "alpha"}), Duration::from_millis(20))
        .await
        .unwrap();
    alpha.start_effects().unwrap();
    eventually("alpha's effect", || async {
        event_types(&alpha_sink).contains(&"effect.fired".to_owned()).then_some(())
    })
    .await;
    eventually("alpha's timer removed", || async {
        alpha
            .thread(&auth, alpha_thread.clone())
            .scheduled_effects()
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(*fired.lock().unwrap(), ["alpha:alpha"], "alpha fired its own effect only");
    assert!(
        !event_types(&alpha_sink).contains(&"effect.dropped".to_owned()),
        "alpha dropped nothing: {:?}",
        event_types(&alpha_sink)
    );
    assert_eq!(
        beta.thread(&auth, beta_thread.clone()).scheduled_effects().await.unwrap(),
        vec![beta_timer],
        "beta's due timer waits for beta's scheduler, unclaimed"
    );
    beta.start_effects().unwrap();
    eventually("beta's effect", || async {
        event_types(&beta_sink).contains(&"effect.fired".to_owned()).then_some(())
    })
    .await;
    assert_eq!(*fired.lock().unwrap(), ["alpha:alpha", "beta:beta"]);
    assert_eq!(event_types(&beta_sink), ["effect.scheduled", "effect.fired"]);
    alpha.shutdown().await;
    beta.shutdown().await;
}
