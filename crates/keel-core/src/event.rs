//! Task events: the append-only log from which a task's history is rebuilt.

use serde::{Deserialize, Serialize};

use crate::{Artifact, Message, TaskId, TaskStatus, ThreadId};

/// One entry of a task's durable event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TaskEvent {
    /// The task's status changed.
    StatusUpdate {
        /// The task.
        task_id: TaskId,
        /// Its thread.
        thread_id: ThreadId,
        /// The new status.
        status: TaskStatus,
        /// Whether this is the last event of the task.
        #[serde(rename = "final")]
        is_final: bool,
    },
    /// An artifact was produced or extended.
    ArtifactUpdate {
        /// The task.
        task_id: TaskId,
        /// Its thread.
        thread_id: ThreadId,
        /// The artifact (or chunk).
        artifact: Artifact,
        /// Whether this chunk extends an earlier one with the same id.
        #[serde(default)]
        append: bool,
        /// Whether this is the artifact's last chunk.
        #[serde(default)]
        last_chunk: bool,
    },
    /// A message joined the task's history.
    Message {
        /// The message.
        message: Message,
    },
}

impl TaskEvent {
    /// The message, if this event carries one for the history.
    pub fn as_message(&self) -> Option<&Message> {
        match self {
            TaskEvent::Message { message } => Some(message),
            _ => None,
        }
    }

    /// The status update that reports `task`'s current status: the one constructor of what
    /// the engine, the stores' tests and the stream write whenever a task's status changes.
    pub fn status_of(task: &crate::Task, is_final: bool) -> Self {
        TaskEvent::StatusUpdate {
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            status: task.status().clone(),
            is_final,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Task, TaskState};

    #[test]
    fn events_round_trip() {
        let mut task = Task::create(Message::user("x"));
        task.complete("y").unwrap();
        let events = vec![
            TaskEvent::Message {
                message: task.history[0].clone(),
            },
            TaskEvent::status_of(&task, true),
            TaskEvent::ArtifactUpdate {
                task_id: task.id.clone(),
                thread_id: task.thread_id.clone(),
                artifact: Artifact::text("a"),
                append: false,
                last_chunk: true,
            },
        ];
        for event in events {
            let json = serde_json::to_value(&event).unwrap();
            let back: TaskEvent = serde_json::from_value(json).unwrap();
            assert_eq!(back, event);
        }
        assert_eq!(task.state(), TaskState::Completed);
    }
}
