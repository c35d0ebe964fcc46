//! Tasks: one unit of requested work inside a thread, with an enforced lifecycle.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{AgentError, AgentResult, Artifact, Message, Metadata, TaskId, ThreadId};

/// Where a task is in its lifecycle. The values are A2A's; the transition table is the brief's
/// decision 1 (see [`TaskState::can_transition_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Not a real state: only accepted as input meaning "any" or "unknown".
    Unspecified,
    /// Accepted, not started.
    Submitted,
    /// Being worked on.
    Working,
    /// Waiting for more input from the user.
    InputRequired,
    /// Waiting for the user to authenticate.
    AuthRequired,
    /// Finished successfully. Terminal.
    Completed,
    /// Finished with an error. Terminal.
    Failed,
    /// Canceled by a caller. Terminal.
    Canceled,
    /// Refused by the agent. Terminal.
    Rejected,
}

impl TaskState {
    /// Every state, in a fixed order (handy for tests and tables).
    pub const ALL: [TaskState; 9] = [
        TaskState::Unspecified,
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::AuthRequired,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::Rejected,
    ];

    /// Whether the state has no exits.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// Whether the transition table allows `self -> next`. Repeating the current state is
    /// allowed (it is a no-op), except for [`TaskState::Unspecified`], which a task never has.
    ///
    /// ```
    /// use keel_core::TaskState::*;
    /// assert!(Working.can_transition_to(Canceled));
    /// assert!(!Submitted.can_transition_to(Completed));
    /// assert!(!Completed.can_transition_to(Working));
    /// ```
    pub fn can_transition_to(self, next: TaskState) -> bool {
        use TaskState::*;
        if self == next {
            return self != Unspecified;
        }
        match self {
            Submitted => matches!(next, Working | Failed | Canceled | Rejected),
            Working => matches!(
                next,
                Completed | Failed | Canceled | InputRequired | AuthRequired | Rejected
            ),
            InputRequired | AuthRequired => matches!(next, Working | Failed | Canceled),
            Unspecified | Completed | Failed | Canceled | Rejected => false,
        }
    }

    /// The kebab-case name used in Keel's JSON (`input-required`).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Unspecified => "unspecified",
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::AuthRequired => "auth-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::Rejected => "rejected",
        }
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskState {
    type Err = AgentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| AgentError::invalid_input("state", format!("unknown task state `{s}`")))
    }
}

/// One recorded lifecycle change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateTransition {
    /// The state before the change.
    pub previous_state: TaskState,
    /// The state after it.
    pub new_state: TaskState,
    /// When it happened.
    pub timestamp: DateTime<Utc>,
}

/// The current status of a task: its state, an optional message explaining it, and when it
/// was set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The lifecycle state.
    pub state: TaskState,
    /// A message from the agent that goes with the state (the answer, the question, the error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// When the state was entered.
    pub timestamp: DateTime<Utc>,
}

impl TaskStatus {
    /// The text of the status message (the answer, the question, the error), when there is
    /// one.
    pub fn text(&self) -> Option<String> {
        self.message.as_ref().map(Message::text)
    }
}

/// One unit of requested work inside a thread.
///
/// The state can only change through [`Task::update_state`] and the helpers built on it, so
/// no sequence of calls escapes the transition table, and every change lands in
/// [`Task::state_history`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The task's id.
    pub id: TaskId,
    /// The thread the task belongs to (A2A `contextId`).
    #[serde(alias = "session_id")]
    pub thread_id: ThreadId,
    status: TaskStatus,
    /// Messages exchanged for this task, oldest first. Stores keep them in the event log and
    /// rebuild this list on demand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// Outputs produced by the task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Application metadata (and `run_context`, `error`, `cancel_reason`).
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// Flow and orchestration state (seed 001's `flow_state`): what a multi-step flow keeps
    /// about where it is, apart from the application's `metadata`. Stored with the task;
    /// not sent over A2A (decision 123).
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub flow_state: Metadata,
    /// Every lifecycle change, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_history: Vec<StateTransition>,
    /// When the task was created.
    pub created_at: DateTime<Utc>,
}

impl Task {
    /// A copy of the task without its history: what a store keeps as the task's record, the
    /// messages living in its event log. Copying them only to drop them would cost a run an
    /// allocation per message part at every status change.
    pub fn clone_without_history(&self) -> Task {
        // Destructured in full, so a field added to tasks cannot be left out here.
        let Task {
            id,
            thread_id,
            status,
            history: _,
            artifacts,
            metadata,
            flow_state,
            state_history,
            created_at,
        } = self;
        Task {
            id: id.clone(),
            thread_id: thread_id.clone(),
            status: status.clone(),
            history: Vec::new(),
            artifacts: artifacts.clone(),
            metadata: metadata.clone(),
            flow_state: flow_state.clone(),
            state_history: state_history.clone(),
            created_at: *created_at,
        }
    }

    /// A new submitted task in the given thread.
    pub fn new(thread_id: ThreadId) -> Self {
        Self::with_id(TaskId::new(), thread_id)
    }

    /// A new submitted task with a caller-chosen id (in-process callers may pick ids first).
    pub fn with_id(id: TaskId, thread_id: ThreadId) -> Self {
        let now = Utc::now();
        Self {
            id,
            thread_id,
            status: TaskStatus {
                state: TaskState::Submitted,
                message: None,
                timestamp: now,
            },
            history: Vec::new(),
            artifacts: Vec::new(),
            metadata: Metadata::new(),
            flow_state: Metadata::new(),
            state_history: Vec::new(),
            created_at: now,
        }
    }

    /// A new submitted task whose history starts with `message`. The thread is the message's
    /// thread, or a fresh one; the message is stamped with the task and thread ids.
    pub fn create(mut message: Message) -> Self {
        let thread_id = message.thread_id.clone().unwrap_or_default();
        let mut task = Self::new(thread_id);
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        task.history.push(message);
        task
    }

    /// A new submitted task whose first message asks for one model inference of `prompt`
    /// ([`Message::infer`]).
    ///
    /// ```
    /// let task = keel_core::Task::create_infer("Calculate this");
    /// assert_eq!(task.history.len(), 1);
    /// assert_eq!(task.state(), keel_core::TaskState::Submitted);
    /// ```
    pub fn create_infer(prompt: impl Into<String>) -> Self {
        Self::create(Message::infer(prompt))
    }

    /// [`Task::create_infer`] with every optional field of the seed's `create_infer(...)`;
    /// `metadata` goes on the message.
    pub fn create_infer_with(
        prompt: Option<String>,
        user: Option<String>,
        output_schema: Option<serde_json::Value>,
        metadata: Metadata,
    ) -> Self {
        Self::create(Message::infer_with(prompt, user, output_schema, metadata))
    }

    /// The current status.
    pub fn status(&self) -> &TaskStatus {
        &self.status
    }

    /// The current state.
    pub fn state(&self) -> TaskState {
        self.status.state
    }

    /// Rebuild a task from stored parts without replaying transitions (for stores and wire
    /// mappings that already hold a valid status).
    pub fn from_parts(id: TaskId, thread_id: ThreadId, status: TaskStatus) -> Self {
        let mut task = Self::with_id(id, thread_id);
        task.created_at = status.timestamp;
        task.status = status;
        task
    }

    /// Move to `next`, recording the change. Repeating the current state is a no-op; a change
    /// the table forbids is [`AgentError::InvalidTransition`] and leaves the task untouched.
    pub fn update_state(&mut self, next: TaskState) -> AgentResult<&mut Self> {
        let current = self.status.state;
        if !current.can_transition_to(next) {
            return Err(AgentError::InvalidTransition {
                from: current,
                to: next,
            });
        }
        if current != next {
            let now = Utc::now();
            self.state_history.push(StateTransition {
                previous_state: current,
                new_state: next,
                timestamp: now,
            });
            self.status = TaskStatus {
                state: next,
                message: None,
                timestamp: now,
            };
        }
        Ok(self)
    }

    /// Move to `next` and attach a status message.
    pub fn update_status(
        &mut self,
        next: TaskState,
        message: Option<Message>,
    ) -> AgentResult<&mut Self> {
        self.update_state(next)?;
        if let Some(message) = message {
            self.set_status_message(message);
        }
        Ok(self)
    }

    /// Attach a message to the current status without changing the state.
    pub fn set_status_message(&mut self, mut message: Message) -> &mut Self {
        message.task_id = Some(self.id.clone());
        message.thread_id = Some(self.thread_id.clone());
        self.status.message = Some(message);
        self
    }

    /// Mark the task as being worked on.
    pub fn begin(&mut self) -> AgentResult<&mut Self> {
        self.update_state(TaskState::Working)
    }

    fn through_working(&mut self, next: TaskState) -> AgentResult<()> {
        if !self.status.state.can_transition_to(next) && self.status.state == TaskState::Submitted {
            self.begin()?;
        }
        self.update_state(next).map(|_| ())
    }

    /// Ask for more input; a submitted task passes through working first.
    pub fn require_input(&mut self, message: Option<Message>) -> AgentResult<&mut Self> {
        self.through_working(TaskState::InputRequired)?;
        if let Some(message) = message {
            self.update_status(TaskState::InputRequired, Some(message))?;
        }
        Ok(self)
    }

    /// Wait for the client to authorize (A2A `auth-required`), with `message` saying what is
    /// needed; a submitted task passes through working first. A message to the task then
    /// resumes it, as input does.
    pub fn require_auth(&mut self, message: Option<Message>) -> AgentResult<&mut Self> {
        self.through_working(TaskState::AuthRequired)?;
        if let Some(message) = message {
            self.update_status(TaskState::AuthRequired, Some(message))?;
        }
        Ok(self)
    }

    /// Complete with an agent answer, which becomes the status message and joins the history.
    /// A submitted task passes through working first.
    pub fn complete(&mut self, response_text: impl Into<String>) -> AgentResult<&mut Self> {
        self.through_working(TaskState::Completed)?;
        let mut answer = Message::agent(response_text);
        answer.task_id = Some(self.id.clone());
        answer.thread_id = Some(self.thread_id.clone());
        self.history.push(answer.clone());
        self.status.message = Some(answer);
        Ok(self)
    }

    /// Fail with an error message, kept in `metadata.error`. From submitted this is a direct
    /// transition.
    pub fn fail(&mut self, error_message: impl Into<String>) -> AgentResult<&mut Self> {
        let error_message = error_message.into();
        self.update_status(
            TaskState::Failed,
            Some(Message::agent(error_message.clone())),
        )?;
        self.metadata
            .insert("error".into(), serde_json::Value::String(error_message));
        Ok(self)
    }

    /// Cancel, keeping the reason in `metadata.cancel_reason`. Canceling a terminal task
    /// (canceled included) is [`AgentError::TaskNotCancelable`].
    pub fn cancel(&mut self, reason: Option<&str>) -> AgentResult<&mut Self> {
        let state = self.status.state;
        if state.is_terminal() {
            return Err(AgentError::TaskNotCancelable {
                task_id: self.id.clone(),
                state,
            });
        }
        self.update_state(TaskState::Canceled)?;
        if let Some(reason) = reason {
            self.metadata.insert(
                "cancel_reason".into(),
                serde_json::Value::String(reason.to_owned()),
            );
        }
        Ok(self)
    }

    /// Append a message to the history, stamping it with this task's ids.
    pub fn add_message(&mut self, mut message: Message) -> &mut Self {
        message.task_id = Some(self.id.clone());
        message.thread_id = Some(self.thread_id.clone());
        self.history.push(message);
        self
    }

    /// Append an output artifact.
    pub fn add_artifact(&mut self, artifact: Artifact) -> &mut Self {
        self.artifacts.push(artifact);
        self
    }

    /// Record an artifact update as A2A's `TaskArtifactUpdateEvent` means it: with `append`,
    /// `artifact`'s parts extend the artifact of the same id (one artifact sent in chunks);
    /// otherwise it replaces the artifact of that id, or is added when the task has none.
    /// An `append` for an id the task does not hold adds the chunk as a new artifact, so a
    /// reader that missed the first chunk still keeps what arrived.
    ///
    /// ```
    /// use keel_core::{Artifact, Part, Task, Message};
    /// let mut task = Task::create(Message::user("hi"));
    /// let first = Artifact::text("chunk-1 ");
    /// let mut second = Artifact::text("chunk-2");
    /// second.id = first.id.clone();
    /// task.apply_artifact(first, false);
    /// task.apply_artifact(second, true);
    /// assert_eq!(task.artifacts.len(), 1);
    /// assert_eq!(task.artifacts[0].parts, vec![Part::text("chunk-1 "), Part::text("chunk-2")]);
    /// ```
    pub fn apply_artifact(&mut self, artifact: Artifact, append: bool) -> &mut Self {
        match self.artifacts.iter_mut().find(|a| a.id == artifact.id) {
            Some(existing) if append => existing.parts.extend(artifact.parts),
            Some(existing) => *existing = artifact,
            None => self.artifacts.push(artifact),
        }
        self
    }

    /// The most recent message in the history. Artifacts are not messages: to find the
    /// latest message *or* artifact, as the seed's default lifecycle reads its input, use
    /// [`Task::last_item`].
    pub fn last_message(&self) -> Option<&Message> {
        self.history.last()
    }

    /// The most recent message or artifact, by timestamp; on a tie the artifact, since an
    /// output is produced after the message that asked for it. O(1): only the last of each
    /// list is looked at.
    ///
    /// ```
    /// use keel_core::{Artifact, Message, Part, Task, TaskItem};
    /// let mut task = Task::create(Message::user("hi"));
    /// assert!(matches!(task.last_item(), Some(TaskItem::Message(_))));
    /// task.add_artifact(Artifact::new().with_part(Part::tool_call("c1", "echo", serde_json::json!({}))));
    /// let item = task.last_item().unwrap();
    /// assert!(matches!(item, TaskItem::Artifact(_)));
    /// assert_eq!(item.parts().len(), 1);
    /// ```
    pub fn last_item(&self) -> Option<TaskItem<'_>> {
        match (self.history.last(), self.artifacts.last()) {
            (Some(message), Some(artifact)) if message.timestamp > artifact.timestamp => {
                Some(TaskItem::Message(message))
            }
            (_, Some(artifact)) => Some(TaskItem::Artifact(artifact)),
            (Some(message), None) => Some(TaskItem::Message(message)),
            (None, None) => None,
        }
    }
}

/// A message or an artifact of a task: what [`Task::last_item`] returns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskItem<'a> {
    /// A message of the history.
    Message(&'a Message),
    /// An output artifact.
    Artifact(&'a Artifact),
}

impl<'a> TaskItem<'a> {
    /// Its parts.
    pub fn parts(&self) -> &'a [crate::Part] {
        match self {
            TaskItem::Message(message) => &message.parts,
            TaskItem::Artifact(artifact) => &artifact.parts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use TaskState::*;

    #[test]
    fn an_artifact_update_without_append_replaces_and_an_unknown_append_adds() {
        let mut task = Task::create(Message::user("hi"));
        let first = Artifact::text("draft");
        let mut revised = Artifact::text("final");
        revised.id = first.id.clone();
        task.apply_artifact(first, false)
            .apply_artifact(revised, false);
        assert_eq!(task.artifacts.len(), 1);
        assert_eq!(task.artifacts[0].parts, vec![crate::Part::text("final")]);
        task.apply_artifact(Artifact::text("orphan chunk"), true);
        assert_eq!(task.artifacts.len(), 2);
    }

    #[test]
    fn require_auth_from_submitted_passes_through_working_and_input_resumes_it() {
        let mut task = Task::create(Message::user("hi"));
        task.require_auth(Some(Message::agent("sign in"))).unwrap();
        assert_eq!(task.state(), AuthRequired);
        assert_eq!(task.status().message.as_ref().unwrap().text(), "sign in");
        task.begin().unwrap();
        assert_eq!(task.state(), Working);
    }

    #[test]
    fn flow_state_round_trips_apart_from_metadata() {
        let mut task = Task::create_infer("plan");
        task.flow_state
            .insert("node".into(), serde_json::json!("review"));
        let json = serde_json::to_value(task.clone_without_history()).unwrap();
        assert_eq!(json["flow_state"]["node"], "review");
        let back: Task = serde_json::from_value(json).unwrap();
        assert_eq!(back.flow_state, task.flow_state);
        assert!(back.metadata.is_empty());
    }

    #[test]
    fn last_item_is_the_newest_of_messages_and_artifacts() {
        let mut task = Task::create(Message::user("first"));
        let mut artifact = Artifact::text("out");
        artifact.timestamp = task.history[0].timestamp - chrono::Duration::seconds(1);
        task.add_artifact(artifact);
        assert!(matches!(task.last_item(), Some(TaskItem::Message(m)) if m.text() == "first"));
        task.artifacts[0].timestamp = task.history[0].timestamp + chrono::Duration::seconds(1);
        assert!(matches!(task.last_item(), Some(TaskItem::Artifact(a)) if a.parts.len() == 1));
        assert_eq!(task.last_message().unwrap().text(), "first");
        assert!(Task::new(ThreadId::new()).last_item().is_none());
    }

    #[test]
    fn complete_from_submitted_passes_through_working() {
        let mut task = Task::create(Message::user("hi"));
        task.complete("hello").unwrap();
        let changes: Vec<_> = task
            .state_history
            .iter()
            .map(|t| (t.previous_state, t.new_state))
            .collect();
        assert_eq!(changes, vec![(Submitted, Working), (Working, Completed)]);
        assert_eq!(task.status().message.as_ref().unwrap().text(), "hello");
        assert_eq!(task.history.len(), 2);
    }

    #[test]
    fn direct_jump_to_completed_is_rejected_and_names_both_states() {
        let mut task = Task::new(ThreadId::new());
        let err = task.update_state(Completed).unwrap_err();
        assert_eq!(
            err,
            AgentError::InvalidTransition {
                from: Submitted,
                to: Completed
            }
        );
        assert_eq!(task.state(), Submitted);
        assert!(task.state_history.is_empty());
    }

    #[test]
    fn repeating_the_current_state_is_a_no_op() {
        let mut task = Task::new(ThreadId::new());
        task.begin().unwrap();
        task.begin().unwrap();
        assert_eq!(task.state_history.len(), 1);
    }

    #[test]
    fn working_task_can_be_canceled_with_reason() {
        let mut task = Task::new(ThreadId::new());
        task.begin().unwrap();
        task.cancel(Some("user asked")).unwrap();
        assert_eq!(task.state(), Canceled);
        assert_eq!(task.metadata["cancel_reason"], "user asked");
    }

    #[test]
    fn cancel_of_terminal_task_is_not_cancelable() {
        let mut task = Task::new(ThreadId::new());
        task.complete("done").unwrap();
        let err = task.cancel(None).unwrap_err();
        assert!(matches!(
            err,
            AgentError::TaskNotCancelable {
                state: Completed,
                ..
            }
        ));
    }

    #[test]
    fn fail_records_error_in_metadata() {
        let mut task = Task::new(ThreadId::new());
        task.fail("api down").unwrap();
        assert_eq!(task.state(), Failed);
        assert_eq!(task.metadata["error"], "api down");
    }

    #[test]
    fn require_input_from_submitted_passes_through_working() {
        let mut task = Task::new(ThreadId::new());
        task.require_input(Some(Message::agent("which city?")))
            .unwrap();
        assert_eq!(task.state(), InputRequired);
        assert_eq!(task.state_history.len(), 2);
        task.begin().unwrap();
        task.complete("ok").unwrap();
    }

    #[test]
    fn transition_table_matches_the_brief() {
        let allowed: &[(TaskState, &[TaskState])] = &[
            (Submitted, &[Working, Failed, Canceled, Rejected]),
            (
                Working,
                &[
                    Completed,
                    Failed,
                    Canceled,
                    InputRequired,
                    AuthRequired,
                    Rejected,
                ],
            ),
            (InputRequired, &[Working, Failed, Canceled]),
            (AuthRequired, &[Working, Failed, Canceled]),
            (Completed, &[]),
            (Failed, &[]),
            (Canceled, &[]),
            (Rejected, &[]),
            (Unspecified, &[]),
        ];
        for (from, tos) in allowed {
            for to in TaskState::ALL {
                let expected = tos.contains(&to) || (to == *from && *from != Unspecified);
                assert_eq!(from.can_transition_to(to), expected, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn task_round_trips_through_json() {
        let mut task = Task::create(Message::user("hi"));
        task.add_artifact(Artifact::text("result"));
        task.metadata.insert("k".into(), serde_json::json!([1, 2]));
        task.complete("done").unwrap();
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json["status"]["state"], "completed");
        let back: Task = serde_json::from_value(json).unwrap();
        assert_eq!(back, task);
    }

    #[test]
    fn legacy_session_id_is_read_as_thread_id() {
        let task = Task::new(ThreadId::from("th-1"));
        let mut json = serde_json::to_value(&task).unwrap();
        let obj = json.as_object_mut().unwrap();
        let thread = obj.remove("thread_id").unwrap();
        obj.insert("session_id".into(), thread);
        let back: Task = serde_json::from_value(json).unwrap();
        assert_eq!(back.thread_id, "th-1");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Update(TaskState),
        Begin,
        RequireInput,
        Complete,
        Fail,
        Cancel,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            proptest::sample::select(TaskState::ALL.to_vec()).prop_map(Op::Update),
            Just(Op::Begin),
            Just(Op::RequireInput),
            Just(Op::Complete),
            Just(Op::Fail),
            Just(Op::Cancel),
        ]
    }

    proptest! {
        #[test]
        fn no_sequence_of_calls_escapes_the_transition_table(ops in proptest::collection::vec(op(), 0..40)) {
            let mut task = Task::new(ThreadId::new());
            for op in ops {
                let before = task.state();
                let before_len = task.state_history.len();
                let result = match op {
                    Op::Update(s) => task.update_state(s).map(|_| ()),
                    Op::Begin => task.begin().map(|_| ()),
                    Op::RequireInput => task.require_input(None).map(|_| ()),
                    Op::Complete => task.complete("x").map(|_| ()),
                    Op::Fail => task.fail("x").map(|_| ()),
                    Op::Cancel => task.cancel(None).map(|_| ()),
                };
                if result.is_err() {
                    prop_assert_eq!(task.state(), before);
                    prop_assert_eq!(task.state_history.len(), before_len);
                }
                if before.is_terminal() {
                    prop_assert_eq!(task.state(), before);
                }
            }
            // Every recorded change is allowed by the table and the chain is connected.
            let mut state = Submitted;
            for change in &task.state_history {
                prop_assert_eq!(change.previous_state, state);
                prop_assert!(change.previous_state.can_transition_to(change.new_state));
                prop_assert_ne!(change.previous_state, change.new_state);
                state = change.new_state;
            }
            prop_assert_eq!(state, task.state());
        }
    }
}
