//! Golden-run support: [`normalize`] turns a run's events into JSON without the volatile
//! parts (ids, timestamps, durations), for snapshot tests that must not change between
//! runs.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::RunEvent;

/// Keys removed wherever they appear: times and durations that differ on every run.
fn is_volatile_time(key: &str) -> bool {
    key == "timestamp" || key.ends_with("_at") || key.ends_with("_ms") || key == "runtime_seconds"
}

/// Keys whose string values are ids: replaced by stable placeholders.
fn is_id(key: &str) -> bool {
    key == "id" || key.ends_with("_id")
}

/// The events as a JSON array with volatile fields normalized:
///
/// - timestamps, `*_at` and duration (`*_ms`, `runtime_seconds`) fields are removed;
/// - every id (`id`, `*_id`: run, task, thread, action, span, request, artifact, message
///   ids) is replaced by `<id-N>`, numbered by first appearance, so the same id stays the
///   same placeholder and correlations (an action's `action.requested` and its
///   `action.completed`) remain visible;
/// - everything else (sequence, type, summary, payload, `final`) is kept.
///
/// Two runs of a deterministic scenario normalize to equal values.
pub fn normalize(events: &[RunEvent]) -> Value {
    let mut ids = HashMap::new();
    let mut items = Vec::with_capacity(events.len());
    for event in events {
        // A RunEvent holds only string-keyed JSON, so this cannot fail; an event that
        // somehow did would show up as null rather than abort the test run.
        let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
        normalize_value(&mut value, &mut ids);
        items.push(value);
    }
    Value::Array(items)
}

fn normalize_value(value: &mut Value, ids: &mut HashMap<String, String>) {
    match value {
        Value::Object(map) => {
            let old = std::mem::take(map);
            let mut kept = Map::new();
            for (key, mut child) in old {
                if is_volatile_time(&key) {
                    continue;
                }
                if is_id(&key) {
                    if let Value::String(id) = &child {
                        let next = ids.len() + 1;
                        let placeholder = ids
                            .entry(id.clone())
                            .or_insert_with(|| format!("<id-{next}>"));
                        child = Value::String(placeholder.clone());
                    }
                } else {
                    normalize_value(&mut child, ids);
                }
                kept.insert(key, child);
            }
            *map = kept;
        }
        Value::Array(items) => items.iter_mut().for_each(|item| normalize_value(item, ids)),
        _ => {}
    }
}
