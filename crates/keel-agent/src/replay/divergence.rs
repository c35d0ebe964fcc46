//! The first difference between a recorded run's events and a replay's, after the golden-run
//! normalization (`keel_events::normalize`) took ids, times and durations out of both.

use std::fmt;

use keel_events::{normalize, RunEvent, REDACTED};
use serde::Serialize;
use serde_json::Value;

/// Where a replay first did something else than the recording.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    /// The step of the recorded event (or of the replay's, when the recording had none): its
    /// own, or the step the events before it were in.
    pub step: Option<u32>,
    /// The event's sequence number in the recording (1-based; one past the end when the
    /// replay went on longer).
    pub sequence: u64,
    /// The recorded event's type (`context.prepared`, `action.policy`, ...), or the replay's.
    pub event: String,
    /// The JSON path of the field that differs (`payload.manifest.system_tokens`); `type`
    /// when a different event came, empty when one side has no event there.
    pub field: String,
    /// The recorded value (`null` when the recording ended).
    pub recorded: Value,
    /// The replay's value (`null` when the replay ended).
    pub now: Value,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = self
            .step
            .map_or_else(|| "no step".to_owned(), |s| format!("step {s}"));
        writeln!(
            f,
            "first divergence at {step}, event #{} `{}`, field `{}`:",
            self.sequence, self.event, self.field
        )?;
        writeln!(f, "- recorded: {}", self.recorded)?;
        write!(f, "+ now:      {}", self.now)
    }
}

/// The first divergence between `recorded` and `now`, or `None` when they agree once
/// normalized. Events are compared in order; inside an event the type comes first, then the
/// payload, then the other fields. A recorded value that redaction replaced matches any value.
///
/// A child's life (`subagent.*` events) is left out on both sides: a replay answers the
/// subagent tools from the recording and starts no child, so only the parent's calls and the
/// results it was given are compared.
pub fn first_divergence(recorded: &[RunEvent], now: &[RunEvent]) -> Option<Divergence> {
    let (recorded, now) = (&compared(recorded)[..], &compared(now)[..]);
    let old = as_items(normalize(recorded));
    let new = as_items(normalize(now));
    for index in 0..old.len().max(new.len()) {
        let (a, b) = (old.get(index), new.get(index));
        let source = recorded.get(index).or_else(|| now.get(index));
        let side = if index < recorded.len() {
            recorded
        } else {
            now
        };
        let step = step_at(side, index);
        // The recorded event's own number; past the recording's end, counted on from its last.
        let sequence = match recorded.get(index) {
            Some(event) => event.sequence,
            None => recorded.last().map_or(0, |e| e.sequence) + (index - recorded.len()) as u64 + 1,
        };
        let event = source.map_or_else(String::new, |e| e.event_type.to_string());
        match (a, b) {
            (Some(a), Some(b)) => {
                if let Some((field, recorded, now)) = event_difference(a, b) {
                    return Some(Divergence {
                        step,
                        sequence,
                        event,
                        field,
                        recorded,
                        now,
                    });
                }
            }
            (a, b) => {
                return Some(Divergence {
                    step,
                    sequence,
                    event,
                    field: String::new(),
                    recorded: a.map_or(Value::Null, |e| e["type"].clone()),
                    now: b.map_or(Value::Null, |e| e["type"].clone()),
                })
            }
        }
    }
    None
}

/// The events a replay is compared on: all but a child's life.
fn compared(events: &[RunEvent]) -> Vec<RunEvent> {
    events
        .iter()
        .filter(|e| !e.event_type.as_str().starts_with("subagent."))
        .cloned()
        .collect()
}

/// The step an event belongs to: its own, or the last one an earlier event named (an
/// action's events carry none of their own).
fn step_at(events: &[RunEvent], index: usize) -> Option<u32> {
    events[..=index.min(events.len().saturating_sub(1))]
        .iter()
        .rev()
        .find_map(|e| e.step)
}

/// The normalized events, without their sequence numbers: they are compared by position, and
/// the numbers shift by the events left out (a child's life).
fn as_items(value: Value) -> Vec<Value> {
    match value {
        Value::Array(mut items) => {
            for item in &mut items {
                if let Value::Object(fields) = item {
                    fields.remove("sequence");
                }
            }
            items
        }
        _ => Vec::new(),
    }
}

/// The first differing field of two normalized events: `type`, then `payload`, then the rest.
fn event_difference(a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    for key in ["type", "payload"] {
        if let Some(found) = difference(key.to_owned(), &a[key], &b[key]) {
            return Some(found);
        }
    }
    difference(String::new(), a, b)
}

fn difference(path: String, a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    if a == b || a.as_str() == Some(REDACTED) {
        return None;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|key| {
                let null = Value::Null;
                difference(
                    join(key),
                    x.get(key).unwrap_or(&null),
                    y.get(key).unwrap_or(&null),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (x, y))| difference(join(&i.to_string()), x, y)),
        _ => Some((path, a.clone(), b.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use keel_events::{EventEmitter, InMemoryEventSink};
    use serde_json::json;

    fn event(kind: &str, payload: Value) -> RunEvent {
        let emitter = EventEmitter::new(
            &keel_core::RunContext::new(),
            Arc::new(InMemoryEventSink::new()),
        );
        emitter.create(
            RunEvent::builder(keel_events::EventType::new(kind.to_owned()), "e")
                .payload(payload)
                .step(1),
        )
    }

    #[test]
    fn equal_runs_do_not_diverge_and_ids_do_not_count() {
        let a = vec![event("x", json!({"action_id": "a1", "n": 1}))];
        let b = vec![event("x", json!({"action_id": "b7", "n": 1}))];
        assert_eq!(first_divergence(&a, &b), None);
    }

    #[test]
    fn the_first_differing_payload_field_is_named() {
        let a = vec![event("x", json!({"m": {"system_tokens": 3}}))];
        let b = vec![event("x", json!({"m": {"system_tokens": 9}}))];
        let found = first_divergence(&a, &b).unwrap();
        assert_eq!(found.field, "payload.m.system_tokens");
        assert_eq!((found.recorded, found.now), (json!(3), json!(9)));
        assert_eq!(found.step, Some(1));
    }

    #[test]
    fn a_redacted_recorded_value_matches_anything() {
        let a = vec![event("x", json!({"api_key": REDACTED}))];
        let b = vec![event("x", json!({"api_key": "sk-live"}))];
        assert_eq!(first_divergence(&a, &b), None);
    }

    #[test]
    fn a_missing_event_is_reported_by_type() {
        let a = vec![event("x", json!({}))];
        let found = first_divergence(&a, &[]).unwrap();
        assert_eq!((found.recorded, found.now), (json!("x"), Value::Null));
    }
}
