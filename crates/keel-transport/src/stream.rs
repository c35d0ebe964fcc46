//! Task streams (`SendStreamingMessage`, `SubscribeToTask`): the typed events, and the follower
//! that turns a task's durable event log into a gap-free, duplicate-free stream.
//!
//! # What a stream carries
//!
//! 1. `Task`: the task as it stands when the stream starts (its history, artifacts and the
//!    latest status the log holds).
//! 2. Then, in log order, one `StatusUpdate` per status change and one `ArtifactUpdate` per
//!    artifact (or chunk, with `append` / `last_chunk`) recorded after that point.
//! 3. A `SendStreamingMessage` stream ends after the first status that is terminal
//!    (completed, failed, canceled, rejected) or interrupted (input-required, auth-required),
//!    as A2A v1.0 says. When the `Task` event itself already holds such a status (one reached
//!    by this turn), the stream ends right after it. A `SubscribeToTask` stream ends only at a
//!    terminal status: a subscription to a task waiting for input stays open through the
//!    follow-up that completes it (as A2A's reference server does), until the client closes it.
//! 4. When the server shuts down first, the stream ends with one more `StatusUpdate` that is
//!    not stored: the task's state unchanged (not terminal, so not `final` for v0.3), with an
//!    agent message marked `status_kind: server_going_away` saying that the task goes on
//!    elsewhere and can be followed again with `SubscribeToTask`.
//!
//! Messages in the log (the user's message, tool calls and results) are the task's history;
//! they travel in the `Task` event's `history`, not as stream events: A2A reserves a `Message`
//! stream event for agents that answer without a task.
//!
//! # How it follows
//!
//! The follower reads the task's snapshot, then its event log, and then follows the log from
//! the end of what it read with the engine's watch ([`keel_agent::reads::TaskWatch`]), which
//! wakes on the executor's local signal ([`keel_agent::AgentExecutor::task_updates`]) or at
//! most every [`POLL_INTERVAL`] (so a task run by another process sharing the store is
//! followed too) and reads the log again from the last sequence number seen. A status change is saved to the snapshot before its event is appended, so a status
//! can appear in the snapshot before the log; status updates not newer than the status already
//! sent are skipped. Nothing that the stream consumer does (including going away) touches the
//! run: the run is the engine's.

use std::collections::VecDeque;

use keel_agent::reads::{Reads, TaskWatch};
use keel_core::{
    AgentResult, Artifact, Message, MessageId, StatusKind, Task, TaskEvent, TaskId, TaskState,
    TaskStatus, ThreadId,
};
use keel_runtime::AuthContext;
use tokio::sync::watch;

/// How often a follower re-reads the store when no local signal arrives (the engine's watch
/// interval).
pub use keel_agent::reads::POLL_INTERVAL;

/// One event of a task stream, in Keel's models (A2A `StreamResponse`).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The task as it stands (always the first event of a task stream).
    Task(Box<Task>),
    /// A message from an agent that answered without a task (the only event of its stream).
    Message(Box<Message>),
    /// The task's status changed.
    StatusUpdate {
        /// The task.
        task_id: TaskId,
        /// Its thread (A2A `contextId`).
        thread_id: ThreadId,
        /// The new status.
        status: TaskStatus,
    },
    /// An artifact was produced, or a chunk of one.
    ArtifactUpdate {
        /// The task.
        task_id: TaskId,
        /// Its thread (A2A `contextId`).
        thread_id: ThreadId,
        /// The artifact (or chunk).
        artifact: Artifact,
        /// Whether this chunk extends an earlier one with the same artifact id.
        append: bool,
        /// Whether this is the artifact's last chunk.
        last_chunk: bool,
    },
}

impl StreamEvent {
    /// Whether a stream ends after this event: a bare message, or a task or status that is
    /// terminal or interrupted.
    ///
    /// ```
    /// use keel_core::{TaskState, TaskStatus};
    /// use keel_transport::StreamEvent;
    /// let done = StreamEvent::StatusUpdate {
    ///     task_id: "t".into(),
    ///     thread_id: "c".into(),
    ///     status: TaskStatus {
    ///         state: TaskState::InputRequired,
    ///         message: None,
    ///         timestamp: chrono::Utc::now(),
    ///     },
    /// };
    /// assert!(done.is_final());
    /// ```
    pub fn is_final(&self) -> bool {
        match self {
            StreamEvent::Task(task) => ends_stream(task.state()),
            StreamEvent::Message(_) => true,
            StreamEvent::StatusUpdate { status, .. } => ends_stream(status.state),
            StreamEvent::ArtifactUpdate { .. } => false,
        }
    }

    /// Whether a `SubscribeToTask` stream ends after this event: a bare message, or a task or
    /// status that is terminal (an interrupted task goes on after its follow-up).
    pub(crate) fn ends_subscription(&self) -> bool {
        match self {
            StreamEvent::Task(task) => task.state().is_terminal(),
            StreamEvent::Message(_) => true,
            StreamEvent::StatusUpdate { status, .. } => status.state.is_terminal(),
            StreamEvent::ArtifactUpdate { .. } => false,
        }
    }
}

impl StreamEvent {
    /// The normalized run event for this stream event, built by
    /// [`RunEvent::from_task_event`](keel_events::RunEvent::from_task_event), the one path
    /// from task events to run events: a status update is a `task.status`, an artifact
    /// update a `task.artifact`, and the task itself a `task.status` carrying the task, from
    /// which [`RunEvent::run_context`](keel_events::RunEvent::run_context) recovers its run
    /// context. A bare message has none. Number it with an
    /// [`EventEmitter`](keel_events::EventEmitter) for the run being followed.
    ///
    /// ```
    /// use keel_core::{Message, RunContext, Task};
    /// use keel_events::{EventEmitter, InMemoryEventSink};
    /// use keel_transport::StreamEvent;
    /// let mut task = Task::create(Message::user("hi"));
    /// let context = RunContext::new();
    /// context.attach_to_task(&mut task)?;
    /// task.complete("done")?;
    /// let emitter = EventEmitter::new(&context, std::sync::Arc::new(InMemoryEventSink::new()));
    /// let event = emitter.create(StreamEvent::Task(Box::new(task)).run_event().unwrap());
    /// assert!(event.is_final);
    /// assert_eq!(event.run_context()?.map(|c| c.run_id), Some(context.run_id));
    /// # Ok::<(), keel_core::AgentError>(())
    /// ```
    pub fn run_event(&self) -> Option<keel_events::RunEventBuilder> {
        let task_event = match self {
            StreamEvent::Task(task) => {
                let update = TaskEvent::status_of(task, self.is_final());
                return keel_events::RunEvent::from_task_event(&update, Some(task));
            }
            StreamEvent::Message(_) => return None,
            StreamEvent::StatusUpdate {
                task_id,
                thread_id,
                status,
            } => TaskEvent::StatusUpdate {
                task_id: task_id.clone(),
                thread_id: thread_id.clone(),
                status: status.clone(),
                is_final: self.is_final(),
            },
            StreamEvent::ArtifactUpdate {
                task_id,
                thread_id,
                artifact,
                append,
                last_chunk,
            } => TaskEvent::ArtifactUpdate {
                task_id: task_id.clone(),
                thread_id: thread_id.clone(),
                artifact: artifact.clone(),
                append: *append,
                last_chunk: *last_chunk,
            },
        };
        keel_events::RunEvent::from_task_event(&task_event, None)
    }
}

impl StreamEvent {
    /// The stream event a log event travels as (streams and push notifications): status and
    /// artifact updates only; messages are the task's history.
    pub(crate) fn of_log(event: TaskEvent) -> Option<StreamEvent> {
        match event {
            TaskEvent::StatusUpdate {
                task_id,
                thread_id,
                status,
                ..
            } => Some(StreamEvent::StatusUpdate {
                task_id,
                thread_id,
                status,
            }),
            TaskEvent::ArtifactUpdate {
                task_id,
                thread_id,
                artifact,
                append,
                last_chunk,
            } => Some(StreamEvent::ArtifactUpdate {
                task_id,
                thread_id,
                artifact,
                append,
                last_chunk,
            }),
            TaskEvent::Message { .. } => None,
        }
    }
}

/// The text of the last event of a stream that the server's shutdown ends early.
const GOING_AWAY_TEXT: &str = "The server is shutting down. This task is not finished and \
goes on in another process (a replica, or this server once restarted): follow it again with \
SubscribeToTask, or read it with GetTask.";

/// The last event of a stream that the server's shutdown ends before its task rests: a status
/// update with the task's state as it stands (`status`'s) and a message saying the server is
/// going away ([`StatusKind::ServerGoingAway`], [`GOING_AWAY_TEXT`]). It is not stored: the
/// task's own log never shows it.
pub(crate) fn going_away(
    task_id: &TaskId,
    thread_id: &ThreadId,
    status: &TaskStatus,
) -> StreamEvent {
    let mut message = Message::agent(GOING_AWAY_TEXT).with_status_kind(StatusKind::ServerGoingAway);
    message.task_id = Some(task_id.clone());
    message.thread_id = Some(thread_id.clone());
    StreamEvent::StatusUpdate {
        task_id: task_id.clone(),
        thread_id: thread_id.clone(),
        status: TaskStatus {
            state: status.state,
            message: Some(message),
            // Later than the status it repeats, as every status update of a stream is.
            timestamp: chrono::Utc::now().max(status.timestamp),
        },
    }
}

/// Whether a stream ends at this state: terminal or interrupted.
pub(crate) fn ends_stream(state: TaskState) -> bool {
    state.is_terminal() || matches!(state, TaskState::InputRequired | TaskState::AuthRequired)
}

/// Where a follower starts.
pub(crate) enum Start {
    /// After `SendStreamingMessage`: the turn began with this (persisted) user message; only a
    /// status recorded after it ends the stream.
    Turn(MessageId),
    /// `SubscribeToTask`: a terminal status ends the stream, including the one the task holds
    /// when the stream starts; an interrupted one does not (the follow-up goes on).
    Subscription,
}

enum Phase {
    Start,
    Follow,
    Done,
}

/// Follows one task's event log (through the engine's [`TaskWatch`]). Drive it with
/// [`Follower::next`].
pub(crate) struct Follower {
    reads: Reads,
    auth: AuthContext,
    task_id: TaskId,
    /// The task's thread, known once the snapshot is read.
    thread_id: Option<ThreadId>,
    history_length: Option<usize>,
    start: Start,
    closing: watch::Receiver<bool>,
    phase: Phase,
    /// Opened once the snapshot and the log's prefix are read, from the end of that prefix.
    watch: Option<TaskWatch>,
    last_status: Option<TaskStatus>,
    pending: VecDeque<StreamEvent>,
}

impl Follower {
    pub(crate) fn new(
        reads: Reads,
        auth: AuthContext,
        task_id: TaskId,
        history_length: Option<usize>,
        start: Start,
        closing: watch::Receiver<bool>,
    ) -> Self {
        Self {
            reads,
            auth,
            task_id,
            thread_id: None,
            history_length,
            start,
            closing,
            phase: Phase::Start,
            watch: None,
            last_status: None,
            pending: VecDeque::new(),
        }
    }

    /// The next event; `None` once the stream has ended. An error ends the stream.
    pub(crate) async fn next(&mut self) -> Option<AgentResult<StreamEvent>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            let step = match self.phase {
                Phase::Done => return None,
                Phase::Start => self.begin().await,
                Phase::Follow => self.follow().await,
            };
            if let Err(err) = step {
                self.phase = Phase::Done;
                return Some(Err(err));
            }
        }
    }

    /// Read the snapshot and the log, queue the `Task` event. A message's stream
    /// (`Start::Turn`) shows the task as it stood when the turn began, then what the turn has
    /// logged since as status and artifact updates: the same sequence however far the run
    /// got before the stream was first read (a fast task's stream is not one finished task).
    async fn begin(&mut self) -> AgentResult<()> {
        // Snapshot first, then the log: everything the snapshot shows is then either in the
        // log prefix read below or (a status saved before its event) skipped by timestamp.
        let mut task = self.reads.task(&self.auth, &self.task_id).await?;
        let mut events = self.reads.task_events(&self.auth, &self.task_id).await?;
        let seen = u64::try_from(events.len()).unwrap_or(u64::MAX);
        let turn_start = match &self.start {
            Start::Turn(message_id) => events
                .iter()
                .position(|e| matches!(e, TaskEvent::Message { message } if &message.message_id == message_id))
                .map(|i| i + 1),
            Start::Subscription => None,
        };
        // The turn's own events follow the `Task` event; the task shows what came before.
        let mut turn = turn_start.map_or_else(Vec::new, |start| events.split_off(start));
        let mut history = Vec::new();
        let mut log_status: Option<TaskStatus> = None;
        let turn_artifacts: Vec<_> = turn
            .iter()
            .filter_map(|e| match e {
                TaskEvent::ArtifactUpdate { artifact, .. } => Some(artifact.id.clone()),
                _ => None,
            })
            .collect();
        task.artifacts.retain(|a| !turn_artifacts.contains(&a.id));
        let known: Vec<_> = task.artifacts.iter().map(|a| a.id.clone()).collect();
        for event in &events {
            match event {
                TaskEvent::Message { message } => history.push(message.clone()),
                TaskEvent::StatusUpdate { status, .. } => log_status = Some(status.clone()),
                TaskEvent::ArtifactUpdate {
                    artifact, append, ..
                } => {
                    if !known.contains(&artifact.id) {
                        merge_artifact(&mut task.artifacts, artifact, *append);
                    }
                }
            }
        }
        // An answer to a waiting task is logged with the status that resumes it (working):
        // the task the turn's stream starts with is that one, not the wait it ended.
        if turn_start.is_some() && log_status.as_ref().is_some_and(|s| ends_stream(s.state)) {
            if let Some(TaskEvent::StatusUpdate { status, .. }) = turn.first() {
                log_status = Some(status.clone());
                turn.remove(0);
            }
        }
        match (turn_start, log_status) {
            // The task as the turn found it: its last status before the turn, or submitted.
            (Some(_), status) => {
                let status = status.unwrap_or(TaskStatus {
                    state: TaskState::Submitted,
                    message: None,
                    timestamp: task.created_at,
                });
                task = with_status(task, status);
            }
            (None, Some(status)) if status.timestamp > task.status().timestamp => {
                task = with_status(task, status);
            }
            (None, _) => {}
        }
        if let Some(keep) = self.history_length {
            history.drain(..history.len().saturating_sub(keep));
        }
        task.history = history;
        self.watch = Some(self.reads.watch_task(&self.auth, &self.task_id, seen));
        self.last_status = Some(task.status().clone());
        self.thread_id = Some(task.thread_id.clone());
        let ends = match self.start {
            Start::Turn(_) => false,
            Start::Subscription => task.state().is_terminal(),
        };
        self.pending.push_back(StreamEvent::Task(Box::new(task)));
        self.phase = if ends { Phase::Done } else { Phase::Follow };
        for event in turn {
            self.accept(event);
        }
        Ok(())
    }

    /// The next change of the log; on the server's closing, what the log holds now and then
    /// the end.
    async fn follow(&mut self) -> AgentResult<()> {
        let Some(watch) = self.watch.as_mut() else {
            self.phase = Phase::Done;
            return Ok(());
        };
        if *self.closing.borrow() {
            // The server is shutting down and its runs have stopped: nothing more will come
            // from this process, and the stream must not hold the shutdown up. What the log
            // holds now is sent; a task not at rest by then goes on elsewhere, which the last
            // event says.
            let changes = watch.ready().await?;
            for change in changes {
                self.accept(change.event);
            }
            if !matches!(self.phase, Phase::Done) {
                if let (Some(thread_id), Some(status)) = (&self.thread_id, &self.last_status) {
                    self.pending
                        .push_back(going_away(&self.task_id, thread_id, status));
                }
                self.phase = Phase::Done;
            }
            return Ok(());
        }
        let closing = &mut self.closing;
        tokio::select! {
            change = watch.next() => match change {
                Some(change) => self.accept(change?.event),
                // The log ended with a terminal status the stream had already sent.
                None => self.phase = Phase::Done,
            },
            () = changed(closing) => {}
        }
        Ok(())
    }

    /// Queue the stream event of one log change (none for a message, or for a status not
    /// newer than the one sent); a status that ends the stream ends it.
    fn accept(&mut self, event: TaskEvent) {
        if matches!(self.phase, Phase::Done) {
            return;
        }
        let Some(event) = StreamEvent::of_log(event) else {
            return;
        };
        if let StreamEvent::StatusUpdate { status, .. } = &event {
            if self
                .last_status
                .as_ref()
                .is_some_and(|last| status.timestamp <= last.timestamp)
            {
                return;
            }
            self.last_status = Some(status.clone());
            let ends = match self.start {
                Start::Turn(_) => ends_stream(status.state),
                Start::Subscription => status.state.is_terminal(),
            };
            if ends {
                self.phase = Phase::Done;
            }
        }
        self.pending.push_back(event);
    }
}

/// Wait for a change; a closed channel never changes again.
pub(crate) async fn changed<T>(receiver: &mut watch::Receiver<T>) {
    if receiver.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn merge_artifact(artifacts: &mut Vec<Artifact>, artifact: &Artifact, append: bool) {
    match artifacts.iter_mut().find(|a| a.id == artifact.id) {
        Some(existing) if append => existing.parts.extend(artifact.parts.iter().cloned()),
        Some(existing) => *existing = artifact.clone(),
        None => artifacts.push(artifact.clone()),
    }
}

/// The task with another current status (the snapshot lagging behind its log).
fn with_status(task: Task, status: TaskStatus) -> Task {
    let mut out = Task::from_parts(task.id, task.thread_id, status);
    out.history = task.history;
    out.artifacts = task.artifacts;
    out.metadata = task.metadata;
    out.state_history = task.state_history;
    out.created_at = task.created_at;
    out
}
