//! What the engine writes into a task's metadata, typed: why its last run stopped, the
//! asynchronous call it waits for, an approval pending or decided, the negotiated skill. The
//! keys and their JSON are those of the task's metadata (`stop_reason`, `awaiting_tool_call`,
//! `pending_approval`, `approval_decision`, `skill`); other keys are left alone.

use keel_core::{ApprovalDecision, ApprovalRequest, Metadata, Task};
use serde::{Deserialize, Serialize};

/// Task metadata key of an action waiting for approval.
pub(crate) const PENDING_APPROVAL: &str = "pending_approval";
/// Task metadata key of the decision about it.
pub(crate) const APPROVAL_DECISION: &str = "approval_decision";

/// Declares [`EngineMeta`] from one list of its fields and their keys, so that reading and
/// updating a task's metadata go through each key once and no list of keys is kept apart
/// from the fields.
macro_rules! engine_meta {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $key:expr;)*) => {
        /// The engine's part of a task's metadata.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub(crate) struct EngineMeta {
            $($(#[$doc])* pub(crate) $field: Option<$ty>,)*
        }

        impl EngineMeta {
            /// The keys the engine owns, in the order of the fields.
            #[cfg(test)]
            const KEYS: &'static [&'static str] = &[$($key),*];

            /// The engine's part of `metadata`, each key read where it is (no copy of the
            /// map or of its values is made to read it).
            pub(crate) fn of(metadata: &Metadata) -> Self {
                Self { $($field: read(metadata, $key),)* }
            }

            /// Change the engine's part of `task`'s metadata with `change`: a field it sets
            /// is written, a field it clears is removed, and every other key stays as it is.
            pub(crate) fn update(task: &mut Task, change: impl FnOnce(&mut EngineMeta)) {
                let before = Self::of(&task.metadata);
                let mut after = before.clone();
                change(&mut after);
                $(
                    if after.$field != before.$field {
                        write(&mut task.metadata, $key, after.$field.as_ref());
                    }
                )*
            }
        }
    };
}

engine_meta! {
    /// Why the last run stopped (`response`, `max_steps`, `awaiting_tool`, ...).
    stop_reason: String = "stop_reason";
    /// The asynchronous call the task waits for.
    awaiting_tool_call: String = "awaiting_tool_call";
    /// An action waiting for approval (stored redacted).
    pending_approval: ApprovalRequest = PENDING_APPROVAL;
    /// The decision about it, until a run applies it.
    approval_decision: ApprovalDecision = APPROVAL_DECISION;
    /// The skill the negotiator accepted the task for.
    skill: String = "skill";
    /// The agent the task was sent to: on a thread two agents share, only that agent's
    /// executor runs it. Kept in the snapshot every new task writes anyway, rather than in a
    /// key of its own (a write more per task).
    agent: String = "agent";
}

/// The value of `key`, read in place. A value that does not parse reads as absent, as each
/// key was read before it was typed.
fn read<T: for<'de> Deserialize<'de>>(metadata: &Metadata, key: &str) -> Option<T> {
    T::deserialize(metadata.get(key)?).ok()
}

/// Write `value` under `key`, or remove the key when it is `None`. A value that cannot be
/// written as JSON leaves the key as it was.
fn write<T: Serialize>(metadata: &mut Metadata, key: &str, value: Option<&T>) {
    match value.map(serde_json::to_value) {
        Some(Ok(value)) => {
            metadata.insert(key.to_owned(), value);
        }
        Some(Err(_)) => {}
        None => {
            metadata.remove(key);
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
    fn each_field_reads_and_writes_its_key() {
        let full = EngineMeta {
            stop_reason: Some("response".into()),
            awaiting_tool_call: Some("acall-1".into()),
            pending_approval: None,
            approval_decision: None,
            skill: Some("s".into()),
            agent: Some("a".into()),
        };
        let mut task = Task::create(keel_core::Message::user("hi"));
        EngineMeta::update(&mut task, |m| *m = full.clone());
        let written: Vec<&str> = task.metadata.keys().map(String::as_str).collect();
        assert_eq!(
            written,
            ["agent", "awaiting_tool_call", "skill", "stop_reason"]
        );
        for key in written {
            assert!(
                EngineMeta::KEYS.contains(&key),
                "{key} is not a field's key"
            );
        }
        assert_eq!(EngineMeta::of(&task.metadata), full);
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
