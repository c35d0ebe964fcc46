//! What the engine writes into a task's metadata, typed: why its last run stopped, the
//! asynchronous call it waits for, an approval pending or decided, the negotiated skill. The
//! keys and their JSON are those of the task's metadata (`stop_reason`, `awaiting_tool_call`,
//! `pending_approval`, `approval_decision`, `skill`); other keys are left alone.

use keel_core::{ApprovalDecision, ApprovalRequest, Metadata, Task};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The engine's part of a task's metadata.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct EngineMeta {
    /// Why the last run stopped (`response`, `max_steps`, `awaiting_tool`, ...).
    #[serde(deserialize_with = "lenient")]
    pub(crate) stop_reason: Option<String>,
    /// The asynchronous call the task waits for.
    #[serde(deserialize_with = "lenient")]
    pub(crate) awaiting_tool_call: Option<String>,
    /// An action waiting for approval (stored redacted).
    #[serde(deserialize_with = "lenient")]
    pub(crate) pending_approval: Option<ApprovalRequest>,
    /// The decision about it, until a run applies it.
    #[serde(deserialize_with = "lenient")]
    pub(crate) approval_decision: Option<ApprovalDecision>,
    /// The skill the negotiator accepted the task for.
    #[serde(deserialize_with = "lenient")]
    pub(crate) skill: Option<String>,
    /// The agent the task was sent to: on a thread two agents share, only that agent's
    /// executor runs it. Kept in the snapshot every new task writes anyway, rather than in a
    /// key of its own (a write more per task).
    #[serde(deserialize_with = "lenient")]
    pub(crate) agent: Option<String>,
}

/// Task metadata key of an action waiting for approval.
pub(crate) const PENDING_APPROVAL: &str = "pending_approval";
/// Task metadata key of the decision about it.
pub(crate) const APPROVAL_DECISION: &str = "approval_decision";

/// The keys [`EngineMeta`] owns (checked against its fields by a test).
const KEYS: [&str; 6] = [
    "stop_reason",
    "awaiting_tool_call",
    PENDING_APPROVAL,
    APPROVAL_DECISION,
    "skill",
    "agent",
];

/// A value that does not parse reads as absent, as each key was read before it was typed.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Ok(Option::<Value>::deserialize(deserializer)?.and_then(|v| serde_json::from_value(v).ok()))
}

impl EngineMeta {
    /// The engine's part of `metadata`.
    pub(crate) fn of(metadata: &Metadata) -> Self {
        let mine: Metadata = KEYS
            .iter()
            .filter_map(|key| Some(((*key).to_owned(), metadata.get(*key)?.clone())))
            .collect();
        serde_json::from_value(Value::Object(mine)).unwrap_or_default()
    }

    /// Change the engine's part of `task`'s metadata with `change`: a field it sets is
    /// written, a field it clears is removed, and every other key stays as it is.
    pub(crate) fn update(task: &mut Task, change: impl FnOnce(&mut EngineMeta)) {
        let before = Self::of(&task.metadata);
        let mut after = before.clone();
        change(&mut after);
        let (Ok(Value::Object(before)), Ok(Value::Object(after))) =
            (serde_json::to_value(&before), serde_json::to_value(&after))
        else {
            return;
        };
        for key in KEYS {
            match (before.get(key), after.get(key)) {
                (old, Some(new)) if old != Some(new) => {
                    task.metadata.insert(key.to_owned(), new.clone());
                }
                (Some(_), None) => {
                    task.metadata.remove(key);
                }
                _ => {}
            }
        }
    }
}

/// Remove a pending approval and its decision from `task`'s metadata, whatever they hold;
/// `true` when there was either.
pub(crate) fn clear_approval(task: &mut Task) -> bool {
    task.metadata.remove(PENDING_APPROVAL).is_some()
        | task.metadata.remove(APPROVAL_DECISION).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_keys_are_the_fields() {
        let full = EngineMeta {
            stop_reason: Some("response".into()),
            awaiting_tool_call: Some("acall-1".into()),
            pending_approval: None,
            approval_decision: None,
            skill: Some("s".into()),
            agent: Some("a".into()),
        };
        let Value::Object(written) = serde_json::to_value(&full).unwrap() else {
            panic!("not an object");
        };
        for key in written.keys() {
            assert!(KEYS.contains(&key.as_str()), "{key} is not in KEYS");
        }
        assert_eq!(EngineMeta::of(&written), full);
    }

    #[test]
    fn an_update_writes_what_changed_and_leaves_other_keys() {
        let mut task = Task::create(keel_core::Message::user("hi"));
        task.metadata.insert("custom".into(), json!(1));
        task.metadata
            .insert("pending_approval".into(), json!("not a request"));
        EngineMeta::update(&mut task, |m| m.stop_reason = Some("awaiting_tool".into()));
        assert_eq!(task.metadata["stop_reason"], json!("awaiting_tool"));
        assert_eq!(task.metadata["custom"], json!(1));
        // A value the engine cannot read is left as it is, unless it is changed.
        assert_eq!(task.metadata["pending_approval"], json!("not a request"));
        EngineMeta::update(&mut task, |m| m.stop_reason = None);
        assert!(!task.metadata.contains_key("stop_reason"));
    }
}
