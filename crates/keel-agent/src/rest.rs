//! When a task rests: the one definition every waiter uses (the engine's blocking calls, the
//! ephemeral runtime, remote delegation), so that they cannot disagree about it.

use keel_core::{Task, TaskState};

use crate::task_meta::{EngineMeta, APPROVAL_DECISION, PENDING_APPROVAL};

/// Why a task rests: nothing more happens to it until an input arrives from outside the
/// engine (a user's message, an approval decision, an asynchronous tool's callback), or ever.
///
/// A task rests when it is terminal; when it waits for input or an approval
/// (`input-required`, `auth-required`) and no approval decision is waiting to be applied; or
/// when it is `working` with `metadata.stop_reason == "awaiting_tool"` and its thread's queue
/// is empty (decision 23: a callback already delivered, or a deadline that passed, queues the
/// task, so a non-empty queue means the task is about to go on).
///
/// ```
/// use keel_agent::TaskRest;
/// use keel_core::Task;
/// let mut task = Task::new("t-1".into());
/// assert_eq!(TaskRest::of(&task, 0), None);
/// task.complete("done").unwrap();
/// assert_eq!(TaskRest::of(&task, 3), Some(TaskRest::Finished));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskRest {
    /// It ended: completed, failed, canceled or rejected.
    Finished,
    /// It waits for the user's input (a message naming the task).
    InputRequired,
    /// It waits for an approval decision.
    AwaitingApproval,
    /// It waits for an asynchronous tool's callback.
    AwaitingTool {
        /// The pending call.
        call_id: String,
    },
}

impl TaskRest {
    /// Why `task` rests, if it does; `queue_len` is the number of items in its thread's
    /// queue (only read for a task waiting for a tool: see [`TaskRest::needs_queue_len`]).
    pub fn of(task: &Task, queue_len: usize) -> Option<TaskRest> {
        let state = task.state();
        if state.is_terminal() {
            return Some(TaskRest::Finished);
        }
        match state {
            TaskState::InputRequired | TaskState::AuthRequired => {
                if task.metadata.contains_key(APPROVAL_DECISION) {
                    None
                } else if task.metadata.contains_key(PENDING_APPROVAL) {
                    Some(TaskRest::AwaitingApproval)
                } else {
                    Some(TaskRest::InputRequired)
                }
            }
            TaskState::Working if Self::awaits_tool(task) && queue_len == 0 => {
                let call_id = EngineMeta::of(&task.metadata)
                    .awaiting_tool_call
                    .unwrap_or_default();
                Some(TaskRest::AwaitingTool { call_id })
            }
            _ => None,
        }
    }

    /// Whether [`TaskRest::of`] depends on the queue length for this task, so that a waiter
    /// reads the queue only when it matters.
    pub fn needs_queue_len(task: &Task) -> bool {
        task.state() == TaskState::Working && Self::awaits_tool(task)
    }

    fn awaits_tool(task: &Task) -> bool {
        EngineMeta::of(&task.metadata).stop_reason.as_deref() == Some("awaiting_tool")
    }

    /// Whether a caller waiting for the task's answer stops here (the engine's blocking
    /// calls, a parent waiting for a subagent, a delegating tool): every rest but
    /// [`TaskRest::AwaitingTool`], since an asynchronous tool calls back by itself and the run
    /// then goes on; A2A's blocking send likewise waits for a terminal or interrupted task.
    /// The ephemeral runtime stops at every rest (decision 23).
    pub fn answers(&self) -> bool {
        !matches!(self, TaskRest::AwaitingTool { .. })
    }

    /// A short name: `finished`, `input_required`, `awaiting_approval`, `awaiting_tool`.
    pub fn as_str(&self) -> &'static str {
        match self {
            TaskRest::Finished => "finished",
            TaskRest::InputRequired => "input_required",
            TaskRest::AwaitingApproval => "awaiting_approval",
            TaskRest::AwaitingTool { .. } => "awaiting_tool",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn working() -> Task {
        let mut task = Task::new("t".into());
        task.begin().unwrap();
        task
    }

    #[test]
    fn terminal_tasks_rest_whatever_the_queue() {
        for end in [TaskState::Completed, TaskState::Failed, TaskState::Canceled] {
            let mut task = working();
            task.update_status(end, None).unwrap();
            assert_eq!(TaskRest::of(&task, 5), Some(TaskRest::Finished));
            assert!(!TaskRest::needs_queue_len(&task));
        }
    }

    #[test]
    fn submitted_and_plain_working_tasks_do_not_rest() {
        assert_eq!(TaskRest::of(&Task::new("t".into()), 0), None);
        assert_eq!(TaskRest::of(&working(), 0), None);
    }

    #[test]
    fn waiting_for_input_or_approval_rests_until_a_decision_is_in() {
        let mut task = working();
        task.require_input(None).unwrap();
        assert_eq!(TaskRest::of(&task, 2), Some(TaskRest::InputRequired));
        task.metadata
            .insert(PENDING_APPROVAL.into(), json!({"request_id": "r"}));
        assert_eq!(TaskRest::of(&task, 0), Some(TaskRest::AwaitingApproval));
        task.metadata
            .insert(APPROVAL_DECISION.into(), json!({"request_id": "r"}));
        assert_eq!(
            TaskRest::of(&task, 0),
            None,
            "the decision is being applied"
        );
    }

    #[test]
    fn waiting_for_a_tool_rests_only_with_an_empty_queue() {
        let mut task = working();
        task.metadata
            .insert("stop_reason".into(), json!("awaiting_tool"));
        task.metadata
            .insert("awaiting_tool_call".into(), json!("call-1"));
        assert!(TaskRest::needs_queue_len(&task));
        assert_eq!(
            TaskRest::of(&task, 0),
            Some(TaskRest::AwaitingTool {
                call_id: "call-1".into()
            })
        );
        assert_eq!(TaskRest::of(&task, 1), None, "its callback is queued");
        let rest = TaskRest::of(&task, 0).unwrap();
        assert_eq!(rest.as_str(), "awaiting_tool");
        assert!(!rest.answers());
        assert!(TaskRest::Finished.answers() && TaskRest::InputRequired.answers());
    }
}
