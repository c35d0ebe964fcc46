//! Metrics and log lines of a run, read off its event stream: every fact a run's metrics
//! count (a run started or ended, a step, a model call with its usage, a tool call with its
//! outcome, a policy decision, an approval) is already an event, so one sink counts them all
//! here, and no checkpoint of the engine counts anything itself. Nothing is counted (no
//! label is built) until the process says it installed a recorder ([`enable`]), and a run
//! gets no meter at all when it would neither count nor log (a library user's process);
//! `keel serve --metrics` turns it on (docs/observability.md lists every metric).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{AgentResult, TaskState};
use keel_events::payload::{LlmCallCompletedPayload, RunStoppedPayload};
use keel_events::{EventSink, EventType, RunEvent};
use metrics::Label;

/// Runs that emitted their first event (a run resumed after a pause is not started again).
pub const RUNS_STARTED: &str = "keel_runs_started_total";
/// Runs that came to a final state, by `outcome` (the task's state).
pub const RUNS_ENDED: &str = "keel_runs_ended_total";
/// Steps (a model call and its tool calls) that finished.
pub const STEPS: &str = "keel_steps_total";
/// Model calls that returned, by `provider` and `model`.
pub const MODEL_CALLS: &str = "keel_model_calls_total";
/// How long model calls took, by `provider` and `model`.
pub const MODEL_CALL_SECONDS: &str = "keel_model_call_duration_seconds";
/// Tokens of model calls, by `provider`, `model` and `direction` (`input`, `output`).
pub const MODEL_TOKENS: &str = "keel_model_tokens_total";
/// What priced model calls cost, in micro-dollars, by `provider` and `model` (decision 185).
pub const MODEL_COST: &str = "keel_model_cost_micros_total";
/// Tool calls (actions) that ended, by `tool` and `outcome` (`completed`, `failed`,
/// `denied`).
pub const TOOL_CALLS: &str = "keel_tool_calls_total";
/// How long tool calls that ran took, by `tool`.
pub const TOOL_CALL_SECONDS: &str = "keel_tool_call_duration_seconds";
/// Policy decisions on actions, by `decision`.
pub const POLICY_DECISIONS: &str = "keel_policy_decisions_total";
/// Approvals asked in this process and not yet decided.
pub const APPROVALS_WAITING: &str = "keel_approvals_waiting";

/// Tasks that came to rest in a state (their `task.status` event), by `state`.
pub const TASK_STATES: &str = "keel_task_states_total";
/// Thread leases this process lost while working or waiting to work a thread (another
/// process took it, or the store was out for a lease's time).
pub const LEASE_LOSSES: &str = "keel_lease_losses_total";
/// Threads this process took over from another that stopped working them (takeover sweep).
pub const TAKEOVERS: &str = "keel_takeovers_total";
/// Threads of this process waiting for a work slot (`max_threads`, per tenant too).
pub const QUEUE_DEPTH: &str = "keel_queue_depth";

/// Whether the process installed a recorder and wants runs counted ([`enable`]).
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Whether run metrics carry a `tenant` label ([`enable_tenant_labels`]).
static TENANT_LABELS: AtomicBool = AtomicBool::new(false);

/// Count every run's metrics from now on: the process installed a `metrics` recorder. Until
/// this is called, the meter builds no label and calls no `metrics` macro, so that a
/// process without a recorder pays nothing per event for them.
pub fn enable() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// Whether runs are counted ([`enable`] was called).
pub fn enabled() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// Label run metrics and the work-slot queue with the `tenant` (`app/user`) from now on.
/// Off by default: each tenant makes its own series of every such metric (decision 188).
pub fn enable_tenant_labels() {
    TENANT_LABELS.store(true, Ordering::Relaxed);
}

/// The `tenant` label value of `auth` when tenant labels are on and runs are counted.
pub(crate) fn tenant_label(auth: &keel_runtime::AuthContext) -> Option<String> {
    (enabled() && TENANT_LABELS.load(Ordering::Relaxed))
        .then(|| format!("{}/{}", auth.app_name, auth.user_name))
}

/// A thread lease was lost.
pub(crate) fn lease_lost() {
    if enabled() {
        metrics::counter!(LEASE_LOSSES).increment(1);
    }
}

/// The takeover sweep took `threads` threads.
pub(crate) fn took_over(threads: usize) {
    if enabled() && threads > 0 {
        metrics::counter!(TAKEOVERS).increment(threads as u64);
    }
}

/// A thread waiting for a work slot: counted in [`QUEUE_DEPTH`] while it lives.
pub(crate) struct Queued(Option<Vec<Label>>);

/// A log line of a run at `info` (or the `level:` given; target `keel::run`): the run, task,
/// trace and span of `event` first, then the line's own fields and message.
macro_rules! run_line {
    (level: $level:expr, $event:expr, $($rest:tt)+) => {
        tracing::event!(
            target: "keel::run",
            $level,
            run_id = %$event.run_id,
            task_id = task_id($event),
            trace_id = $event.trace_id.as_deref(),
            span_id = $event.span_id.as_deref(),
            $($rest)+
        )
    };
    ($event:expr, $($rest:tt)+) => {
        run_line!(level: tracing::Level::INFO, $event, $($rest)+)
    };
}

impl Queued {
    /// A thread of `auth` starts waiting.
    pub(crate) fn enter(auth: &keel_runtime::AuthContext) -> Self {
        if !enabled() {
            return Self(None);
        }
        let labels = with_tenant(Vec::new(), tenant_label(auth));
        metrics::gauge!(QUEUE_DEPTH, labels.clone()).increment(1.0);
        Self(Some(labels))
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some(labels) = self.0.take() {
            metrics::gauge!(QUEUE_DEPTH, labels).decrement(1.0);
        }
    }
}

/// `labels` with a `tenant` label added when there is one.
fn with_tenant(mut labels: Vec<Label>, tenant: Option<String>) -> Vec<Label> {
    if let Some(tenant) = tenant {
        labels.push(Label::new("tenant", tenant));
    }
    labels
}

/// Whether a run needs a meter: it counts, or its milestones would be logged (a subscriber
/// takes `info` lines of `keel::run`). Asked once per run, so a run that would do neither
/// has no meter among its sinks.
pub(crate) fn wanted() -> bool {
    enabled() || tracing::enabled!(target: "keel::run", tracing::Level::INFO)
}

/// The approvals this process saw asked and not yet decided, by run and action: the gauge is
/// their number, so that a decision this process never saw asked (asked before a restart)
/// does not take it below zero, and a run that ends while one waits (canceled) drops it.
static WAITING: LazyLock<Mutex<HashSet<(String, String)>>> = LazyLock::new(Mutex::default);

/// Counts one run's events and logs its milestones (target `keel::run`): at `info` one line
/// when the run stops (its agent, state, reason, steps and duration), and its tool calls and
/// approvals.
#[derive(Default)]
pub(crate) struct RunMeter {
    state: Mutex<Pending>,
    /// The run's tenant, when tenant labels are on.
    tenant: Option<String>,
}

/// What a later event of the run needs from an earlier one.
#[derive(Default)]
struct Pending {
    /// The tool name and start time of each action by id (its end events name only the id).
    actions: HashMap<String, (String, DateTime<Utc>)>,
    /// When the model call under way started, for providers that report no latency.
    model_call: Option<DateTime<Utc>>,
    /// When the run started (its first event), for the duration its stop line gives.
    started: Option<DateTime<Utc>>,
    /// The steps the run has taken so far, for its stop line.
    steps: u32,
}

#[async_trait]
impl EventSink for RunMeter {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        self.observe(event);
        Ok(())
    }
}

impl RunMeter {
    /// The meter of a run of `tenant` (`Some` only when tenant labels are on).
    pub(crate) fn new(tenant: Option<String>) -> Self {
        Self {
            state: Mutex::default(),
            tenant,
        }
    }

    /// `pairs` as labels, with the run's tenant when it has one.
    fn labels(&self, pairs: &[(&'static str, &str)]) -> Vec<Label> {
        let labels = pairs
            .iter()
            .map(|(key, value)| Label::new(*key, (*value).to_owned()))
            .collect();
        with_tenant(labels, self.tenant.clone())
    }

    /// Note what `event` says happened.
    pub(crate) fn observe(&self, event: &RunEvent) {
        // Borrowed: most events count nothing, and an event costs the engine no copy here.
        let agent = event.agent_name.as_deref().unwrap_or_default();
        let kind = &event.event_type;
        let counting = enabled();
        if event.sequence == 1 {
            self.pending().started = Some(event.timestamp);
            if counting {
                metrics::counter!(RUNS_STARTED, self.labels(&[("agent", agent)])).increment(1);
            }
            // At `debug`: a run logs one line at `info`, when it stops (issue 43 asks for one
            // line per request and one per run; each costs the formatter ~15k instructions).
            run_line!(
                level: tracing::Level::DEBUG,
                event,
                agent = %agent,
                "run started"
            );
        }
        if *kind == EventType::STOP_EVALUATED {
            self.pending().steps += 1;
            if counting {
                metrics::counter!(STEPS, self.labels(&[("agent", agent)])).increment(1);
            }
        } else if *kind == EventType::RUN_STOPPED {
            if let Ok(stopped) = event.payload_as::<RunStoppedPayload>() {
                self.run_stopped(event, agent, &stopped);
            }
        } else if *kind == EventType::TASK_STATUS {
            if let Some(state) = text(event, "/state").filter(|_| counting) {
                metrics::counter!(TASK_STATES, self.labels(&[("state", state)])).increment(1);
            }
        } else if *kind == EventType::LLM_CALL_STARTED {
            self.pending().model_call = Some(event.timestamp);
        } else if *kind == EventType::LLM_CALL_COMPLETED {
            let started = self.pending().model_call.take();
            if counting {
                if let Ok(call) = event.payload_as::<LlmCallCompletedPayload>() {
                    self.model_call(event, &call, started);
                }
            }
        } else if *kind == EventType::ACTION_REQUESTED || *kind == EventType::ACTION_STARTED {
            // The action's arguments are not read (nor copied): only its id and name.
            if let (Some(id), Some(name)) = (text(event, "/action/id"), text(event, "/action/name"))
            {
                self.pending()
                    .actions
                    .insert(id.to_owned(), (name.to_owned(), event.timestamp));
            }
        } else if let Some(outcome) = action_outcome(kind) {
            if let Some(id) = text(event, "/action_id") {
                let duration_ms = event.payload.get("duration_ms").and_then(|d| d.as_u64());
                self.tool_call(event, id, outcome, duration_ms, counting);
            }
        } else if *kind == EventType::ACTION_POLICY {
            if let Some(decision) = text(event, "/decision").filter(|_| counting) {
                metrics::counter!(POLICY_DECISIONS, self.labels(&[("decision", decision)]))
                    .increment(1);
            }
        } else if *kind == EventType::APPROVAL_REQUIRED {
            if let (Some(id), Some(action)) = (
                text(event, "/request/action/id"),
                text(event, "/request/action/name"),
            ) {
                run_line!(event, action, action_id = id, "approval required");
                waiting(|set| {
                    set.insert((event.run_id.to_string(), id.to_owned()));
                });
            }
        } else if *kind == EventType::APPROVAL_DECIDED {
            if let Some(id) = text(event, "/action_id") {
                run_line!(
                    event,
                    action_id = id,
                    outcome = text(event, "/decision/outcome"),
                    "approval decided"
                );
                waiting(|set| {
                    set.remove(&(event.run_id.to_string(), id.to_owned()));
                });
            }
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A run stopped: ended when its task's state is final, else paused (for input, an
    /// approval, an asynchronous tool).
    fn run_stopped(&self, event: &RunEvent, agent: &str, stopped: &RunStoppedPayload) {
        let ended = stopped.state.is_terminal();
        if ended {
            if enabled() {
                let labels = self.labels(&[("agent", agent), ("outcome", stopped.state.as_str())]);
                metrics::counter!(RUNS_ENDED, labels).increment(1);
            }
            // Approvals of a run that ended (canceled while one waited) wait no more.
            let run = event.run_id.to_string();
            waiting(|set| set.retain(|(waiting_run, _)| *waiting_run != run));
        }
        let (steps, duration_ms) = {
            let pending = self.pending();
            let took = pending.started.map(|started| event.timestamp - started);
            (pending.steps, took.map(|took| took.num_milliseconds()))
        };
        run_line!(
            event,
            agent = %agent,
            state = stopped.state.as_str(),
            reason = %stopped.reason,
            steps,
            duration_ms,
            "{}",
            if stopped.state == TaskState::Canceled {
                "run canceled"
            } else if ended {
                "run ended"
            } else {
                "run paused"
            }
        );
    }

    /// An action ended with `outcome`: counted when `counting`, and logged.
    fn tool_call(
        &self,
        event: &RunEvent,
        action_id: &str,
        outcome: &'static str,
        duration_ms: Option<u64>,
        counting: bool,
    ) {
        // A denied action never ran, so it took no time.
        let ran = outcome != "denied";
        let known = self.pending().actions.remove(action_id);
        let (tool, started) = match known {
            Some((tool, started)) => (tool, Some(started)),
            None => (String::new(), None),
        };
        let seconds = seconds(duration_ms, started, event.timestamp);
        if counting {
            metrics::counter!(
                TOOL_CALLS,
                self.labels(&[("tool", &tool), ("outcome", outcome)])
            )
            .increment(1);
        }
        if ran && counting {
            if let Some(seconds) = seconds {
                metrics::histogram!(TOOL_CALL_SECONDS, self.labels(&[("tool", &tool)]))
                    .record(seconds);
            }
        }
        run_line!(
            event,
            tool = %tool,
            action_id = %action_id,
            outcome,
            duration_ms = seconds.filter(|_| ran).map(|s| (s * 1000.0).round() as u64),
            "tool call"
        );
    }
}

/// Reads of a model call's payload for the meter.
impl RunMeter {
    /// A model call returned: its count, latency, tokens and cost.
    fn model_call(
        &self,
        event: &RunEvent,
        call: &LlmCallCompletedPayload,
        started: Option<DateTime<Utc>>,
    ) {
        let provider = call.provider.as_deref().unwrap_or_default();
        let model = call.model.as_deref().unwrap_or_default();
        let labels = self.labels(&[("provider", provider), ("model", model)]);
        metrics::counter!(MODEL_CALLS, labels.clone()).increment(1);
        if let Some(seconds) = seconds(call.latency_ms, started, event.timestamp) {
            metrics::histogram!(MODEL_CALL_SECONDS, labels.clone()).record(seconds);
        }
        for (direction, tokens) in [("input", call.input_tokens), ("output", call.output_tokens)] {
            let mut labels = labels.clone();
            labels.push(Label::from_static_parts("direction", direction));
            metrics::counter!(MODEL_TOKENS, labels).increment(tokens);
        }
        if let Some(cost) = call.cost_micros {
            metrics::counter!(MODEL_COST, labels).increment(cost);
        }
    }
}

/// A duration in seconds: the one the event reports, else the time between two events.
fn seconds(
    reported_ms: Option<u64>,
    started: Option<DateTime<Utc>>,
    ended: DateTime<Utc>,
) -> Option<f64> {
    match (reported_ms, started) {
        (Some(ms), _) => Some(ms as f64 / 1000.0),
        (None, Some(started)) => (ended - started)
            .to_std()
            .ok()
            .map(|elapsed| elapsed.as_secs_f64()),
        (None, None) => None,
    }
}

/// Change the set of waiting approvals and set the gauge to its size.
fn waiting(change: impl FnOnce(&mut HashSet<(String, String)>)) {
    let mut set = WAITING.lock().unwrap_or_else(|p| p.into_inner());
    change(&mut set);
    if enabled() {
        metrics::gauge!(APPROVALS_WAITING).set(set.len() as f64);
    }
}

/// The outcome label of an action's end event, `None` for other events.
fn action_outcome(kind: &EventType) -> Option<&'static str> {
    if *kind == EventType::ACTION_COMPLETED {
        Some("completed")
    } else if *kind == EventType::ACTION_FAILED {
        Some("failed")
    } else if *kind == EventType::ACTION_DENIED {
        Some("denied")
    } else {
        None
    }
}

/// The event's task id, for log lines.
fn task_id(event: &RunEvent) -> Option<&str> {
    event.task_id.as_ref().map(|id| id.as_str())
}

/// The text at `pointer` in an event's payload.
fn text<'a>(event: &'a RunEvent, pointer: &str) -> Option<&'a str> {
    event.payload.pointer(pointer).and_then(|v| v.as_str())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_core::{ApprovalDecision, ApprovalOutcome, ApprovalRequest, RunAction, RunContext};
    use keel_events::payload::ActionPolicyPayload;
    use keel_events::{EventEmitter, InMemoryEventSink, RunEventBuilder};
    use metrics_exporter_prometheus::PrometheusBuilder;
    use serde_json::json;

    use super::*;

    /// The value of `name` with `labels` in Prometheus text, as a scraper parses it.
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                _ => panic!("{name} is not a number"),
            })
    }

    /// The events of an action that policy sends to an approver, and the request.
    fn asked(action: &RunAction) -> (ApprovalRequest, Vec<RunEventBuilder>) {
        let request = ApprovalRequest {
            request_id: format!("r-{}", action.id),
            action: action.clone(),
            reason: "deploys are reviewed".into(),
            run_id: None,
            requested_at: Utc::now(),
        };
        let policy = RunEvent::action_policy(ActionPolicyPayload {
            action_id: action.id.clone(),
            decision: "require_approval".into(),
            reason: None,
            capability: None,
        });
        let events = vec![
            RunEvent::action_requested(action),
            policy,
            RunEvent::approval_required(&request),
        ];
        (request, events)
    }

    #[test]
    fn approvals_wait_until_decided_or_their_run_ends_and_denied_calls_take_no_time() {
        enable();
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let emitter = EventEmitter::new(&RunContext::new(), Arc::new(InMemoryEventSink::new()));
        let meter = RunMeter::new(None);
        let observe = |events: Vec<RunEventBuilder>| {
            metrics::with_local_recorder(&recorder, || {
                for event in events {
                    meter.observe(&emitter.create(event));
                }
            });
        };
        let waiting = || value(&handle.render(), APPROVALS_WAITING, &[]);

        let deploy = RunAction::tool_call("deploy", json!({"token": "not for metrics"}));
        let (request, events) = asked(&deploy);
        observe(events);
        assert_eq!(waiting(), Some(1.0));
        let decision = ApprovalDecision {
            request_id: request.request_id.clone(),
            outcome: ApprovalOutcome::Denied,
            reason: None,
            decided_by: Some("ops".into()),
            decided_at: Utc::now(),
        };
        observe(vec![
            RunEvent::approval_decided(&request, &decision),
            RunEvent::action_denied(deploy.id.clone(), "the approver said no"),
        ]);
        assert_eq!(waiting(), Some(0.0));
        let text = handle.render();
        let denied = [("tool", "deploy"), ("outcome", "denied")];
        assert_eq!(value(&text, TOOL_CALLS, &denied), Some(1.0));
        let require = [("decision", "require_approval")];
        assert_eq!(value(&text, POLICY_DECISIONS, &require), Some(1.0));
        assert!(
            !text.contains(TOOL_CALL_SECONDS),
            "a denied call never ran: {text}"
        );

        // A run canceled while an approval waits takes its approval off the gauge.
        let (_, events) = asked(&RunAction::tool_call("deploy", json!({})));
        observe(events);
        assert_eq!(waiting(), Some(1.0));
        observe(vec![RunEvent::run_stopped(RunStoppedPayload {
            reason: "canceled".into(),
            call_id: None,
            state: TaskState::Canceled,
        })]);
        assert_eq!(waiting(), Some(0.0));
        let text = handle.render();
        assert_eq!(value(&text, RUNS_STARTED, &[]), Some(1.0));
        let canceled = [("outcome", "canceled")];
        assert_eq!(value(&text, RUNS_ENDED, &canceled), Some(1.0));
    }
}
