//! Typed identifiers, so a task id can never be passed where a thread id is expected.
//!
//! An id is shared text (`Arc<str>`): ids are copied into every event, message, record and
//! log line of a run, and a copy is a reference count, not an allocation.

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(std::sync::Arc<str>);

        // Most comparisons are of copies of one id (an event's run id against its report's),
        // which share their text: those are equal without reading it.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                std::sync::Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
            }
        }

        // By the text, as equality is.
        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }

        impl $name {
            /// A fresh, time-ordered (UUID v7) identifier.
            pub fn new() -> Self {
                let mut text = uuid::Uuid::encode_buffer();
                Self(std::sync::Arc::from(
                    &*uuid::Uuid::now_v7().hyphenated().encode_lower(&mut text),
                ))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The identifier as an owned string.
            pub fn into_string(self) -> String {
                self.0.to_string()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value.into())
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.into())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }
    };
}

id_type!(
    /// Identifies a [`Task`](crate::Task). Over A2A the server creates it.
    TaskId
);
id_type!(
    /// Identifies a thread: one ordered conversation (A2A `contextId`, a legacy `session_id`).
    ThreadId
);
id_type!(
    /// Identifies one run: an execution attempt of a task.
    RunId
);
id_type!(
    /// Identifies a [`Message`](crate::Message).
    MessageId
);
id_type!(
    /// Identifies an [`Artifact`](crate::Artifact).
    ArtifactId
);
id_type!(
    /// Identifies a [`RunAction`](crate::RunAction): one side-effecting operation.
    ActionId
);
id_type!(
    /// Correlates observability data across runs and agents.
    TraceId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_serialize_as_plain_strings() {
        let id = TaskId::from("t-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"t-1\"");
        let back: TaskId = serde_json::from_str("\"t-1\"").unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn ids_are_equal_by_text_whether_or_not_they_share_it() {
        use std::collections::HashSet;
        let id = TaskId::new();
        let copy = id.clone();
        let rebuilt = TaskId::from(id.as_str());
        assert_eq!(id, copy);
        assert_eq!(id, rebuilt);
        assert_ne!(id, TaskId::new());
        let set: HashSet<TaskId> = [id, copy, rebuilt].into_iter().collect();
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn fresh_ids_are_unique() {
        assert_ne!(ThreadId::new(), ThreadId::new());
    }
}
