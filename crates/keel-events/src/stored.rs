//! A run as the engine stores it (decision 257): a small summary and the run's events, each
//! written without what every event of the run shares. The documented [`RunReport`] JSON
//! is rendered from it when it is read ([`RunReport::from_value`]); nothing of the report
//! that the events already say is written twice.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use keel_core::{
    stored, ActionId, BudgetUsage, Metadata, RunContext, RunId, TaskId, TaskState, ThreadId,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::rfc3339;
use crate::{summary, EventType, RunEvent, RunReport, RunSpans, Severity, RUN_EVENT_VERSION};

/// The version of the stored form of a run, which `RunStore` rows written by
/// [`ReportWriter`](crate::ReportWriter) carry. Reading one renders the [`RunReport`] of
/// version [`RUN_REPORT_VERSION`](crate::RUN_REPORT_VERSION). Version 9 (decision 270) leaves
/// out an event's summary when its payload gives it; version 10 (decision 273) a manifest's
/// per-section items and total when its section totals give them; version 11 (decision 281)
/// writes a model's streamed chunks as a list in the first one's entry and a status without
/// the answer's text it repeats, and leaves out an empty payload and `derived_spans: true`.
/// Versions 8, 9 and 10 are read as well ([`READ_STORED_RUN_VERSIONS`]).
pub const STORED_RUN_VERSION: u32 = 11;

/// The stored run versions this Keel reads: its own and the three before, whose events differ
/// only in carrying what a later version leaves out (summaries before 9, a manifest's items
/// and total before 10, an entry per streamed chunk, the answer's text twice, empty payloads
/// and `derived_spans: true` before 11).
pub const READ_STORED_RUN_VERSIONS: [u32; 4] = [8, 9, 10, STORED_RUN_VERSION];

/// A run as stored: its ids, where it ended, what it used and when, and its events.
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredRun {
    /// [`STORED_RUN_VERSION`].
    pub(crate) version: u32,
    pub(crate) run_id: Option<RunId>,
    pub(crate) task_id: Option<TaskId>,
    pub(crate) thread_id: Option<ThreadId>,
    pub(crate) trace_id: Option<Arc<str>>,
    pub(crate) agent_name: Option<String>,
    /// The span the run's span hangs under, when its events' spans are left out.
    parent_span_id: Option<Arc<str>>,
    /// Whether every event's span and parent span are the ones [`RunSpans`] derives from
    /// the run (as the run's emitter gave them), and so left out of the events. Written when
    /// they are not (decision 281): absent, it is `true` from version 11 and `false` before,
    /// when it was written only when `true`.
    derived_spans: Option<bool>,
    pub(crate) started_at: Option<DateTime<Utc>>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    pub(crate) final_state: Option<TaskState>,
    /// What the run used (its cost included), for a reader that lists runs without their
    /// events; a rendered report computes it again from the events.
    #[serde(default)]
    pub(crate) usage: BudgetUsage,
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub(crate) metadata: Metadata,
    #[serde(default)]
    pub(crate) events: Vec<StoredEvent>,
}

/// One event as stored: a [`RunEvent`] without its envelope version (when it is
/// [`RUN_EVENT_VERSION`]), its sequence number (when it follows the one before), its span
/// ids (when the run's are derived) and its run, task, thread, trace and agent when every
/// event of the run names the stored run's (a field some event does not share stays in
/// every event, as decision 93 has it, so that an event without one reads back without).
#[serde_with::skip_serializing_none]
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredEvent {
    version: Option<u32>,
    #[serde(rename = "type")]
    event_type: EventType,
    run_id: Option<RunId>,
    task_id: Option<TaskId>,
    thread_id: Option<ThreadId>,
    trace_id: Option<Arc<str>>,
    agent_name: Option<String>,
    sequence: Option<u64>,
    step: Option<u32>,
    span_id: Option<Arc<str>>,
    parent_span_id: Option<Arc<str>>,
    action_id: Option<ActionId>,
    parent_action_id: Option<ActionId>,
    delegation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Severity::is_info")]
    severity: Severity,
    /// Left out when it is the one [`summary::of`] renders from the payload (decision 270).
    summary: Option<String>,
    /// Left out when it is an empty object (decision 281), which is what a missing one reads
    /// as; versions before 11 always wrote it.
    #[serde(default = "empty_payload", skip_serializing_if = "is_empty_payload")]
    payload: Value,
    #[serde(rename = "final", default, skip_serializing_if = "std::ops::Not::not")]
    is_final: bool,
    /// When it was created, in nanoseconds after the run's `started_at` (absent: at it): a
    /// number of a few digits where a time takes thirty characters.
    elapsed_ns: Option<i64>,
    /// When it was created, for a run that has no `started_at` or an offset too large for
    /// nanoseconds (centuries).
    #[serde(default, serialize_with = "rfc3339_opt")]
    timestamp: Option<DateTime<Utc>>,
    /// In an `llm.stream` entry, the chunks the model streamed right after this one (decision
    /// 281), each as `[delta, elapsed_ns]`: an event each, which follows the one before in
    /// sequence and says what this one says but its delta and time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    chunks: Vec<(String, i64)>,
}

impl StoredRun {
    /// The stored form of `events` (in sequence order) with `metadata`.
    pub(crate) fn of(mut events: Vec<RunEvent>, metadata: Metadata) -> StoredRun {
        events.sort_by_key(|e| e.sequence);
        let summary = RunReport::stored_summary(&events);
        let trace_id = events.first().and_then(|e| e.trace_id.clone());
        // The run span's parent, as the run's own events name it.
        let parent_span_id = events
            .iter()
            .find(|e| e.step.is_none() && e.action_id.is_none())
            .and_then(|e| e.parent_span_id.clone());
        let derived_spans = match &summary.run_id {
            Some(run_id) => {
                let spans = spans_of(run_id, parent_span_id.as_deref());
                events.iter().all(|e| {
                    let (span, parent) = spans.span_of(&e.event_type, e.step, e.action_id.as_ref());
                    e.span_id.as_ref() == Some(&span) && e.parent_span_id == parent
                })
            }
            None => false,
        };
        let mut run = StoredRun {
            version: STORED_RUN_VERSION,
            run_id: summary.run_id,
            task_id: summary.task_id,
            thread_id: summary.thread_id,
            trace_id,
            agent_name: summary.agent_name,
            parent_span_id: parent_span_id.filter(|_| derived_spans),
            derived_spans: (!derived_spans).then_some(false),
            started_at: summary.started_at,
            finished_at: summary.finished_at,
            final_state: summary.final_state,
            usage: summary.budget.usage,
            metadata,
            events: Vec::with_capacity(events.len()),
        };
        // Whether every event names the run's value of a field.
        fn shared<T: PartialEq>(
            events: &[RunEvent],
            run: &Option<T>,
            field: impl Fn(&RunEvent) -> Option<&T>,
        ) -> bool {
            run.is_some() && events.iter().all(|e| field(e) == run.as_ref())
        }
        let keep = [
            !shared(&events, &run.run_id, |e| Some(&e.run_id)),
            !shared(&events, &run.task_id, |e| e.task_id.as_ref()),
            !shared(&events, &run.thread_id, |e| e.thread_id.as_ref()),
            !shared(&events, &run.trace_id, |e| e.trace_id.as_ref()),
            !shared(&events, &run.agent_name, |e| e.agent_name.as_ref()),
        ];
        let mut previous = 0;
        let mut said = None;
        let mut answer = None;
        for event in events {
            let follows = event.sequence == previous + 1;
            let elapsed = run
                .started_at
                .and_then(|start| (event.timestamp - start).num_nanoseconds());
            previous = event.sequence;
            let (span_id, parent_span_id) = match derived_spans {
                true => (None, None),
                false => (event.span_id, event.parent_span_id),
            };
            let mut payload = event.payload;
            let derived = summary::of(&event.event_type, &payload);
            let summary =
                (derived.as_deref() != Some(event.summary.as_str())).then_some(event.summary);
            if event.event_type == EventType::TASK_ARTIFACT {
                answer = answer_text(&payload).map(str::to_owned);
            } else if let (Some(fields), Some(answer)) =
                (status_fields(&event.event_type, &mut payload), &answer)
            {
                stored::leave_out_given(fields, &answer_given(answer), |own, answer| {
                    own.as_str() == Some(*answer)
                });
            } else if event.event_type == EventType::CONTEXT_PREPARED {
                said = call_context(&payload);
                leave_out_run_ids(&mut payload, &run);
            } else if let Some(fields) = call_fields(&event.event_type, said.as_ref()) {
                if let Some(payload) = payload.as_object_mut() {
                    stored::leave_out_given(payload, fields, |own, said| own == said);
                }
            }
            let stored = StoredEvent {
                version: (event.version != RUN_EVENT_VERSION).then_some(event.version),
                event_type: event.event_type,
                run_id: Some(event.run_id).filter(|_| keep[0]),
                task_id: event.task_id.filter(|_| keep[1]),
                thread_id: event.thread_id.filter(|_| keep[2]),
                trace_id: event.trace_id.filter(|_| keep[3]),
                agent_name: event.agent_name.filter(|_| keep[4]),
                sequence: (!follows).then_some(event.sequence),
                step: event.step,
                span_id,
                parent_span_id,
                action_id: event.action_id,
                parent_action_id: event.parent_action_id,
                delegation_id: event.delegation_id,
                severity: event.severity,
                summary,
                payload,
                is_final: event.is_final,
                elapsed_ns: elapsed.filter(|n| *n != 0),
                timestamp: elapsed.is_none().then_some(event.timestamp),
                chunks: Vec::new(),
            };
            match run.events.last_mut() {
                Some(last) => {
                    if let Some(stored) = last.absorb(stored) {
                        run.events.push(stored);
                    }
                }
                None => run.events.push(stored),
            }
        }
        run
    }

    /// The run's events, each with what it shares with the run filled in again.
    pub(crate) fn into_events(self) -> (Vec<RunEvent>, Metadata) {
        // Version 8 wrote a manifest's ids whole, and 9 its tokens: none there means none.
        let manifests_leave_ids_out = self.version >= 9;
        let manifests_leave_tokens_out = self.version >= 10;
        let derived_spans = self.derived_spans.unwrap_or(self.version >= 11);
        let StoredRun {
            run_id,
            task_id,
            thread_id,
            trace_id,
            agent_name,
            parent_span_id,
            started_at,
            metadata,
            events,
            ..
        } = self;
        let spans = match (&run_id, derived_spans) {
            (Some(run_id), true) => Some(spans_of(run_id, parent_span_id.as_deref())),
            _ => None,
        };
        let mut previous = 0;
        let mut said = None;
        // A field no event holds was shared: each event has the run's.
        fn fill<'a, T>(
            events: &[StoredEvent],
            run: &'a Option<T>,
            field: impl Fn(&StoredEvent) -> bool,
        ) -> Option<&'a T> {
            run.as_ref().filter(|_| !events.iter().any(field))
        }
        // What a `context.prepared` manifest left out: the run's own ids, whether or not
        // every event shares them.
        let run_ids = [
            run_id.as_ref().map(RunId::as_str),
            thread_id.as_ref().map(ThreadId::as_str),
            agent_name.as_deref(),
        ];
        let shared_run_id = fill(&events, &run_id, |e| e.run_id.is_some());
        let shared_task_id = fill(&events, &task_id, |e| e.task_id.is_some());
        let shared_thread_id = fill(&events, &thread_id, |e| e.thread_id.is_some());
        let shared_trace_id = fill(&events, &trace_id, |e| e.trace_id.is_some());
        let shared_agent_name = fill(&events, &agent_name, |e| e.agent_name.is_some());
        let at = |elapsed_ns: Option<i64>| {
            started_at.map(|start| start + chrono::Duration::nanoseconds(elapsed_ns.unwrap_or(0)))
        };
        let mut answer = None;
        let mut read = Vec::with_capacity(events.iter().map(|e| 1 + e.chunks.len()).sum());
        for e in events {
            let sequence = e.sequence.unwrap_or(previous + 1);
            previous = sequence;
            let (span_id, parent_span_id) = match &spans {
                Some(spans) => {
                    let (span, parent) = spans.span_of(&e.event_type, e.step, e.action_id.as_ref());
                    (Some(span), parent)
                }
                None => (e.span_id, e.parent_span_id),
            };
            let mut payload = e.payload;
            if e.event_type == EventType::TASK_ARTIFACT {
                answer = answer_text(&payload).map(str::to_owned);
            } else if let (Some(fields), Some(answer)) =
                (status_fields(&e.event_type, &mut payload), &answer)
            {
                stored::fill_in_given(fields, &answer_given(answer), |answer| Value::from(*answer));
            } else if e.event_type == EventType::CONTEXT_PREPARED {
                if let Some(manifest) = payload.get_mut("manifest").and_then(Value::as_object_mut) {
                    if manifests_leave_ids_out {
                        stored::fill_in_ids(manifest, &manifest_ids(run_ids));
                    }
                    if manifests_leave_tokens_out {
                        fill_in_derived_tokens(manifest);
                    }
                }
                said = call_context(&payload);
            } else if let Some(fields) =
                call_fields(&e.event_type, said.as_ref()).filter(|_| manifests_leave_tokens_out)
            {
                if let Some(payload) = payload.as_object_mut() {
                    stored::fill_in_given(payload, fields, Value::clone);
                }
            }
            // Written when it is not the one its payload gives (version 9), or always (8).
            let summary = e
                .summary
                .or_else(|| summary::of(&e.event_type, &payload))
                .unwrap_or_default();
            let event = RunEvent {
                version: e.version.unwrap_or(RUN_EVENT_VERSION),
                event_type: e.event_type,
                // Written from `Some`, or left out as the run's.
                run_id: e
                    .run_id
                    .or_else(|| shared_run_id.cloned())
                    .unwrap_or_default(),
                task_id: e.task_id.or_else(|| shared_task_id.cloned()),
                thread_id: e.thread_id.or_else(|| shared_thread_id.cloned()),
                trace_id: e.trace_id.or_else(|| shared_trace_id.cloned()),
                agent_name: e.agent_name.or_else(|| shared_agent_name.cloned()),
                sequence,
                step: e.step,
                span_id,
                parent_span_id,
                action_id: e.action_id,
                parent_action_id: e.parent_action_id,
                delegation_id: e.delegation_id,
                severity: e.severity,
                summary,
                payload,
                is_final: e.is_final,
                // Written with one or the other; a row that has neither reads as the epoch
                // rather than not at all.
                timestamp: e.timestamp.or(at(e.elapsed_ns)).unwrap_or_default(),
            };
            // Each chunk is the event again with its own delta, time and sequence.
            let head = read.len();
            read.push(event);
            for (delta, elapsed_ns) in e.chunks {
                previous += 1;
                let mut chunk = read[head].clone();
                chunk.sequence = previous;
                chunk.payload = serde_json::json!({ "delta": delta });
                chunk.timestamp = at(Some(elapsed_ns)).unwrap_or_default();
                read.push(chunk);
            }
        }
        (read, metadata)
    }
}

impl StoredEvent {
    /// Take `next` into this entry as one of its [`chunks`](StoredEvent::chunks) when both
    /// are `llm.stream` events that say nothing but a delta and a time (each its own), the
    /// same of all else, and `next` follows this entry's last in sequence; else hand it back.
    fn absorb(&mut self, mut next: StoredEvent) -> Option<StoredEvent> {
        let streamed = |e: &StoredEvent| {
            e.event_type == EventType::LLM_STREAM
                && e.summary.is_none()
                && !e.is_final
                && e.timestamp.is_none()
                && delta(&e.payload).is_some()
        };
        // All an event says but its sequence, payload and time.
        fn rest(e: &StoredEvent) -> impl PartialEq + '_ {
            (
                (
                    e.version,
                    &e.run_id,
                    &e.task_id,
                    &e.thread_id,
                    &e.trace_id,
                    &e.agent_name,
                ),
                (e.step, &e.span_id, &e.parent_span_id, &e.action_id),
                (&e.parent_action_id, &e.delegation_id, e.severity),
            )
        }
        let joins = streamed(self)
            && streamed(&next)
            && next.sequence.is_none()
            && next.chunks.is_empty()
            && rest(self) == rest(&next);
        if let (true, Value::Object(payload)) = (joins, &mut next.payload) {
            // `streamed` saw the delta: it moves into the chunk, uncopied.
            if let Some(Value::String(text)) = payload.remove("delta") {
                self.chunks.push((text, next.elapsed_ns.unwrap_or(0)));
                return None;
            }
        }
        Some(next)
    }
}

/// The delta of an `llm.stream` payload that says nothing else.
fn delta(payload: &Value) -> Option<&str> {
    match payload.as_object() {
        Some(fields) if fields.len() == 1 => fields.get("delta")?.as_str(),
        _ => None,
    }
}

/// The text of a `task.artifact` payload's artifact when it is one text part: an answer, as
/// the engine writes it.
fn answer_text(payload: &Value) -> Option<&str> {
    match payload
        .get("artifact")?
        .get("parts")?
        .as_array()?
        .as_slice()
    {
        [part] if part.get("type").and_then(Value::as_str) == Some("text") => {
            part.get("text")?.as_str()
        }
        _ => None,
    }
}

/// A `task.status` payload's fields, which may repeat the run's answer (decision 281).
fn status_fields<'a>(
    event_type: &EventType,
    payload: &'a mut Value,
) -> Option<&'a mut serde_json::Map<String, Value>> {
    (*event_type == EventType::TASK_STATUS)
        .then(|| payload.as_object_mut())
        .flatten()
}

/// What a status after the run's `answer` is stored without when it says it (its `message`,
/// left out), as [`stored::leave_out_given`] takes it: a status without a message then says
/// so with `null`.
fn answer_given(answer: &str) -> [(&'static str, Option<&str>); 1] {
    [("message", Some(answer))]
}

/// What a stored event without a payload reads as (decision 281).
fn empty_payload() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Whether a payload is the empty object a stored event leaves out.
fn is_empty_payload(payload: &Value) -> bool {
    payload.as_object().is_some_and(serde_json::Map::is_empty)
}

/// The spans of run `run_id` under `parent`, as its emitter derived them.
fn spans_of(run_id: &RunId, parent: Option<&str>) -> RunSpans {
    let mut context = RunContext::new();
    context.run_id = run_id.clone();
    context.parent_span_id = parent.map(str::to_owned);
    RunSpans::of(&context)
}

/// [`rfc3339`] of a time that may be absent (skipped then, see `StoredEvent`).
fn rfc3339_opt<S: serde::Serializer>(
    time: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => rfc3339(time, serializer),
        None => serializer.serialize_none(),
    }
}

/// Leave out of a `context.prepared` payload's manifest each id that is the run's (one the
/// manifest does not name is written `null`, since a missing one reads back as the run's),
/// and what its section totals give ([`leave_out_derived_tokens`]).
fn leave_out_run_ids(payload: &mut Value, run: &StoredRun) {
    if let Some(manifest) = payload.get_mut("manifest").and_then(Value::as_object_mut) {
        let run_ids = [
            run.run_id.as_ref().map(|id| id.as_str()),
            run.thread_id.as_ref().map(|id| id.as_str()),
            run.agent_name.as_deref(),
        ];
        stored::leave_out_ids(manifest, &manifest_ids(run_ids));
        leave_out_derived_tokens(manifest);
    }
}

/// A manifest's sections, in the order `keel-llm` writes its items, each with the field of
/// the section's total.
const MANIFEST_SECTIONS: [(&str, &str); 4] = [
    ("system", "system_tokens"),
    ("tools", "tool_prompt_tokens"),
    ("history", "history_tokens"),
    ("user", "user_tokens"),
];

/// What a manifest's four section totals give (decision 273): its `context_items`, one per
/// section with the section's total, in order, and its `total_estimated_tokens`, their sum.
/// `None` for a manifest without all four totals, which leaves out nothing.
fn derived_tokens(
    manifest: &serde_json::Map<String, Value>,
) -> Option<[(&'static str, Option<Value>); 2]> {
    let mut total = 0u64;
    let mut items = Vec::with_capacity(MANIFEST_SECTIONS.len());
    for (section, key) in MANIFEST_SECTIONS {
        let tokens = manifest.get(key)?.as_u64()?;
        total = total.checked_add(tokens)?;
        items.push(serde_json::json!({"section": section, "tokens": tokens}));
    }
    Some([
        ("context_items", Some(Value::Array(items))),
        ("total_estimated_tokens", Some(Value::from(total))),
    ])
}

/// Leave out of a manifest the items and total its section totals give.
fn leave_out_derived_tokens(manifest: &mut serde_json::Map<String, Value>) {
    if let Some(derived) = derived_tokens(manifest) {
        stored::leave_out_given(manifest, &derived, |own, derived| own == derived);
    }
}

/// The reverse of [`leave_out_derived_tokens`].
fn fill_in_derived_tokens(manifest: &mut serde_json::Map<String, Value>) {
    if let Some(derived) = derived_tokens(manifest) {
        stored::fill_in_given(manifest, &derived, Value::clone);
    }
}

/// What a `context.prepared` payload's manifest says that the model calls after it repeat
/// (decision 273): the provider and model, and the total a started call estimates.
fn call_context(payload: &Value) -> Option<[(&'static str, Option<Value>); 3]> {
    let manifest = payload.get("manifest")?;
    let field = |key: &str| manifest.get(key).filter(|v| !v.is_null()).cloned();
    Some([
        ("provider", field("provider")),
        ("model", field("model")),
        ("estimated_input_tokens", field("total_estimated_tokens")),
    ])
}

/// The fields of a model call's payload that its step's manifest said (`said`): a started
/// call's provider, model and estimate, a completed call's provider and model.
fn call_fields<'a>(
    event_type: &EventType,
    said: Option<&'a [(&'static str, Option<Value>); 3]>,
) -> Option<&'a [(&'static str, Option<Value>)]> {
    let said = said?;
    if *event_type == EventType::LLM_CALL_STARTED {
        Some(&said[..])
    } else if *event_type == EventType::LLM_CALL_COMPLETED {
        Some(&said[..2])
    } else {
        None
    }
}

/// The ids a `context.prepared` manifest names and its run's stored form names once
/// (decision 270), each with the run's value.
fn manifest_ids([run, thread, agent]: [Option<&str>; 3]) -> [(&'static str, Option<&str>); 3] {
    [
        ("run_id", run),
        ("thread_id", thread),
        ("agent_name", agent),
    ]
}
