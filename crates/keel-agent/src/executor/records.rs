//! Run records: how a run ends is written down. The task's final (or resting) state, its
//! answer, artifact and stop reason; the `run.stopped` event; the run's report in the run
//! store. Also the writes of a task's status that every part shares,
//! and the making of a run's events, report and budget (`run_obs`).

use std::sync::Arc;

use chrono::Utc;
use keel_core::stored::JsonText;
use keel_core::{
    AgentError, AgentResult, Artifact, Message, Part, Role, RunContext, Task, TaskEvent, TaskId,
    TaskState, ThreadId,
};
use keel_events::payload::{RunStoppedPayload, ThreadTerminatedPayload};
use keel_events::{EventSink, RedactionPolicy, RunEvent, RunReport};
use keel_llm::LlmMessage;
use keel_runtime::RunRecord;
use keel_runtime::{AuthContext, LogLevel};
use serde_json::{json, Value};

use super::run::RunLoop;
use super::state::*;
use crate::observe::RunObs;
use crate::task_meta::EngineMeta;
use crate::thread_state::ThreadHost;
use crate::Negotiation;

impl RunLoop<'_> {
    /// Write how the run ended: the task's final (or resting) state, its answer, artifact and
    /// stop reason, then the run's report.
    pub(super) async fn finish(&mut self, outcome: Outcome) -> AgentResult<()> {
        let (inner, flow) = (self.inner, self.flow);
        let auth = &flow.auth;
        let obs = self.obs.clone();
        let task = &mut self.task;
        // A cancel flag has done its job once the run rests: a later run of a task that waits
        // (for input, a tool, an approval) must not find a stale one. A task that ends has no
        // later run, and its flag expires, so the common ending costs no write.
        if !matches!(
            outcome,
            Outcome::Answer { .. }
                | Outcome::Failed { .. }
                | Outcome::Abandoned
                | Outcome::HandedOn
        ) {
            let _ = inner
                .runtime
                .memory_service()
                .delete(auth, &cancel_key(&task.id))
                .await;
        }
        // Artifacts the run's tools added are in the log already; the snapshot takes them now.
        let produced = obs.take_artifacts();
        let named_outputs = !produced.is_empty();
        for (artifact, append) in produced {
            task.apply_artifact(artifact, append);
        }
        // Events of the ending that go to the task's log with its final status.
        let mut logged = Vec::new();
        match outcome {
            Outcome::Abandoned => return Ok(()),
            Outcome::HandedOn => {
                // The task stays as it is, working, and its queue item stays for the next
                // holder of the thread; the report so far is kept, as for a pause.
                flow.handed_on
                    .store(true, std::sync::atomic::Ordering::Release);
                obs.emit(RunEvent::run_stopped(RunStoppedPayload {
                    reason: "shutdown".to_owned(),
                    call_id: None,
                    state: task.state(),
                }))
                .await;
                self.save_records().await;
                inner
                    .driver
                    .drained
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(self.task.id.clone());
                return Ok(());
            }
            Outcome::AwaitingTool { call_id } => {
                // The task stays working; the callback queues it again.
                EngineMeta::update(task, |m| {
                    m.stop_reason = Some("awaiting_tool".into());
                    m.awaiting_tool_call = Some(call_id.clone());
                });
                obs.emit(RunEvent::run_stopped(RunStoppedPayload {
                    reason: "awaiting_tool".to_owned(),
                    call_id: Some(call_id),
                    state: task.state(),
                }))
                .await;
                self.save_records().await;
                let task = &self.task;
                inner.runtime.task_manager().save_task(auth, task).await?;
                inner.notices.task_saved_as(auth, task);
                return Ok(());
            }
            Outcome::Answer {
                text,
                reason,
                logged: answer_log,
            } => {
                let answer = match answer_log {
                    AnswerLog::Written(message) => *message,
                    AnswerLog::InHistory => {
                        let mut m = Message::agent(text.clone());
                        m.task_id = Some(task.id.clone());
                        m
                    }
                    AnswerLog::Unwritten => {
                        // The answer joins the history and the task's log together, marked with
                        // its stop reason: a run resumed after a crash right here ends from it.
                        let mut entry = LlmMessage::assistant(text.clone(), vec![]);
                        tag(&mut entry, &task.id);
                        entry.metadata.insert(META_STOP.into(), json!(reason));
                        inner.mark_side(std::slice::from_mut(&mut entry));
                        let message = Message::new(Role::Agent, vec![Part::text(&text)]);
                        inner.write_message(flow, &[entry], task, message).await?
                    }
                };
                // A run that added its own artifacts named its outputs; otherwise the answer
                // is the task's artifact.
                if !named_outputs {
                    let artifact = Artifact::text(text).named("answer");
                    // Written with the final status, below; its run event is built from the
                    // same task event, the one path from task events to run events.
                    let update = TaskEvent::ArtifactUpdate {
                        task_id: task.id.clone(),
                        thread_id: task.thread_id.clone(),
                        artifact: artifact.clone(),
                        append: false,
                        last_chunk: true,
                    };
                    if let Some(event) = RunEvent::from_task_event(&update, None) {
                        obs.emit(event).await;
                    }
                    logged.push(update);
                    task.add_artifact(artifact);
                }
                EngineMeta::update(task, |m| m.stop_reason = Some(reason.into()));
                task.update_status(TaskState::Completed, Some(answer))?;
            }
            Outcome::Failed { error, reason } => {
                EngineMeta::update(task, |m| m.stop_reason = Some(reason));
                task.fail(failure_text(&error))?;
            }
            Outcome::InputRequired { question } => {
                EngineMeta::update(task, |m| m.stop_reason = Some("input_required".into()));
                let message = inner
                    .record_event(auth, task, vec![Part::text(&question)])
                    .await?;
                task.update_status(TaskState::InputRequired, Some(message))?;
            }
            Outcome::AwaitingApproval { request } => {
                // Persisted redacted, so it can wait across restarts without keeping secrets.
                let stored = RedactionPolicy::default().redact_approval_request(&request)?;
                EngineMeta::update(task, |m| m.pending_approval = Some(stored));
                EngineMeta::update(task, |m| m.stop_reason = Some("approval_required".into()));
                let message = inner
                    .record_event(
                        auth,
                        task,
                        vec![Part::text(format!(
                            "Approval required for `{}`: {}",
                            request.action.name, request.reason
                        ))],
                    )
                    .await?;
                task.update_status(TaskState::InputRequired, Some(message))?;
            }
            Outcome::Canceled { reason } => {
                if reason == crate::thread_state::TERMINATED_REASON {
                    inner.thread_terminated(auth, &obs, &task.thread_id).await;
                }
                EngineMeta::update(task, |m| m.stop_reason = Some("canceled".into()));
                mark_canceled(task, &reason)?;
            }
        }
        if let Some(reason) = EngineMeta::of(&task.metadata).stop_reason {
            obs.emit(RunEvent::run_stopped(RunStoppedPayload {
                reason,
                call_id: None,
                state: task.state(),
            }))
            .await;
        }
        // The task's id, state and status message, not the task: whoever needs the task
        // reads it where it lives (decision 255).
        obs.emit(RunEvent::task_state_of(task)).await;
        // Subagents: a background child's result goes to its parent from here, durably.
        inner.agent.hooks.on_rest(inner, auth, task).await;
        self.rest_reported(logged).await?;
        inner.notices.task_saved_as(auth, &self.task);
        Ok(())
    }

    /// Write the task's final status after `events`, and the run's report: one write where
    /// the step store folds them (a failure of it fails the ending, as the status's alone
    /// would); otherwise two independent writes, sent together so that they share a round
    /// trip (one SQLite batch, one Redis pipeline), the report first, whose failure is
    /// logged, the task being persisted. Waiters are woken after this: whoever waits for the
    /// task must find the run fully reported.
    async fn rest_reported(&self, mut events: Vec<TaskEvent>) -> AgentResult<()> {
        let (inner, auth, task) = (self.inner, &self.flow.auth, &self.task);
        events.push(status_event(task));
        let record = inner.run_record(&self.obs, task);
        if let (Some(steps), Some((record, report))) = (inner.runtime.step_store(), &record) {
            match steps
                .save_task_and_run(auth, task, &events, record, report)
                .await
            {
                Err(AgentError::Unsupported { .. }) => {}
                saved => return saved,
            }
        }
        let report = async {
            if let Some((record, report)) = record {
                inner.store_run_record(auth, record, report).await;
            }
        };
        let tasks = inner.runtime.task_manager();
        let ((), saved) = tokio::join!(report, tasks.save_task_with_events(auth, task, &events));
        saved
    }

    /// The run's report (redacted) goes to the run store. A failure here is logged: the task
    /// itself is already persisted.
    async fn save_records(&self) {
        self.inner
            .save_records(&self.flow.auth, &self.obs, &self.task)
            .await;
    }
}

impl Inner {
    /// The run is ending because its thread was terminated: say so with `thread.terminated`,
    /// carrying the time the termination was recorded (seed 003 §10, §12).
    async fn thread_terminated(&self, auth: &AuthContext, obs: &RunObs, thread_id: &ThreadId) {
        let terminated_at = self
            .runtime
            .thread_store()
            .kv_get(auth, thread_id, crate::thread_state::TERMINATED_KEY)
            .await
            .ok()
            .flatten()
            .and_then(|at| serde_json::from_value(at).ok());
        obs.emit(RunEvent::thread_terminated(ThreadTerminatedPayload {
            thread_id: thread_id.clone(),
            terminated_at,
        }))
        .await;
    }

    /// The run's report (redacted) goes to the run store. A failure here is logged: the task
    /// itself is already persisted.
    pub(super) async fn save_records(&self, auth: &AuthContext, obs: &RunObs, task: &Task) {
        if let Some((record, report)) = self.run_record(obs, task) {
            self.store_run_record(auth, record, report).await;
        }
    }

    /// The record of the run `obs` watched over `task`, and its report (masked event by event
    /// while the run went, serialized once here); `None` for a task that names no run, or, with
    /// the error logged, when the report cannot be had.
    pub(super) fn run_record(&self, obs: &RunObs, task: &Task) -> Option<(RunRecord, JsonText)> {
        let record = || {
            // The run's record is its report; the task's home is the task store, so no
            // snapshot of it is written here (decision 258).
            let Some(ctx) = RunContext::from_task(task)? else {
                return Ok(None);
            };
            let record = RunRecord {
                run_id: ctx.run_id,
                task_id: Some(task.id.clone()),
                thread_id: Some(task.thread_id.clone()),
                trace_id: Some(ctx.trace_id),
                agent_name: Some(self.agent.card().name.clone()),
                recorded_at: Utc::now(),
                report: Value::Null,
            };
            Ok(Some((record, obs.take_report_json()?)))
        };
        record().unwrap_or_else(|err: AgentError| {
            self.report_unsaved(&err);
            None
        })
    }

    /// Store `record` with `report` in the run store; a failure is logged.
    async fn store_run_record(&self, auth: &AuthContext, record: RunRecord, report: JsonText) {
        let runs = self.runtime.run_store();
        if let Err(err) = runs.save_run_report_json(auth, record, report).await {
            self.report_unsaved(&err);
        }
    }

    fn report_unsaved(&self, err: &AgentError) {
        self.log(
            LogLevel::Warn,
            &format!("could not save the run report: {err}"),
        );
    }

    pub(super) async fn persist_status(&self, auth: &AuthContext, task: &Task) -> AgentResult<()> {
        self.persist_status_after(auth, task, Vec::new()).await
    }

    /// Save the task with `events` and then its status event appended to its log, in one
    /// store write (the status and what led to it commit together).
    pub(super) async fn persist_status_after(
        &self,
        auth: &AuthContext,
        task: &Task,
        mut events: Vec<TaskEvent>,
    ) -> AgentResult<()> {
        events.push(status_event(task));
        self.runtime
            .task_manager()
            .save_task_with_events(auth, task, &events)
            .await?;
        self.notices.task_saved_as(auth, task);
        Ok(())
    }

    /// A task its negotiator did not start comes to rest: rejected, or waiting for input or
    /// authorization with the agent's question in its log.
    pub(super) async fn rest_unstarted(
        &self,
        auth: &AuthContext,
        task: &mut Task,
        negotiation: Negotiation,
    ) -> AgentResult<()> {
        let (ask, for_auth) = match negotiation {
            Negotiation::Accept { .. } | Negotiation::Reply { .. } => return Ok(()),
            Negotiation::Reject { reason } => {
                task.update_status(TaskState::Rejected, Some(Message::agent(reason)))?;
                EngineMeta::update(task, |m| m.stop_reason = Some("rejected".into()));
                return self.persist_status(auth, task).await;
            }
            Negotiation::AskInput { question } => (question, false),
            Negotiation::AskAuth { request } => (request, true),
        };
        let ask = self.record_event(auth, task, vec![Part::text(ask)]).await?;
        if for_auth {
            task.require_auth(Some(ask))?;
        } else {
            task.require_input(Some(ask))?;
        }
        EngineMeta::update(task, |m| m.stop_reason = Some("negotiation".into()));
        self.persist_status(auth, task).await
    }

    /// Append an agent message of `parts` to the task's log.
    pub(super) async fn record_event(
        &self,
        auth: &AuthContext,
        task: &Task,
        parts: Vec<Part>,
    ) -> AgentResult<Message> {
        let mut message = Message::new(Role::Agent, parts);
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        self.runtime
            .task_manager()
            .add_task_event(
                auth,
                &task.id,
                &TaskEvent::Message {
                    message: message.clone(),
                },
            )
            .await?;
        self.notices.task_changed();
        Ok(message)
    }

    /// [`Self::run_obs`] of a run that ran before (paused for input, an approval or an
    /// asynchronous tool, or stopped by a restart): its stored report's events come first,
    /// and its new events are numbered after them. A store that cannot be reached stops the
    /// run (its queue item stays, and it resumes once the store answers); a report that
    /// cannot be read is logged, and the run reports afresh.
    pub(super) async fn resumed_run_obs(
        &self,
        auth: &AuthContext,
        context: &RunContext,
        task_id: &TaskId,
    ) -> AgentResult<RunObs> {
        let obs = self.run_obs(auth, context, task_id);
        let stored = match self
            .runtime
            .run_store()
            .get_run_report(auth, &context.run_id)
            .await
        {
            Ok(stored) => stored,
            Err(err @ AgentError::StoreUnavailable { .. }) => return Err(err),
            Err(err) => {
                self.log(
                    LogLevel::Warn,
                    &format!("cannot read the report of the run being resumed: {err}"),
                );
                None
            }
        };
        let Some(record) = stored else {
            return Ok(obs);
        };
        match RunReport::from_value(record.report) {
            Ok(report) => Ok(obs.continuing(report.events)),
            Err(err) => {
                self.log(
                    LogLevel::Warn,
                    &format!("the stored report of the run being resumed is unreadable: {err}"),
                );
                Ok(obs)
            }
        }
    }

    /// The events, budget and policy of a run of `task_id` of `auth` under `context`,
    /// reported to the executor's sinks.
    pub(super) fn run_obs(
        &self,
        auth: &AuthContext,
        context: &RunContext,
        task_id: &TaskId,
    ) -> RunObs {
        // The run's metrics and log lines come first, so that no failing sink hides an event;
        // a run that would neither count nor log has no meter (decision 187).
        let mut sinks: Vec<Arc<dyn EventSink>> = Vec::new();
        if crate::meter::wanted() {
            let tenant = crate::meter::tenant_label(auth);
            sinks.push(Arc::new(crate::meter::RunMeter::new(tenant)));
        }
        sinks.extend(self.notices.sinks());
        RunObs::new(
            &sinks,
            context,
            task_id,
            &self.agent.card().name,
            self.agent.budget_policy_for(context),
            self.agent.authorizer().clone(),
            self.runtime.logging_service(),
        )
    }
}

/// What a failed task tells its caller. A store's failure names its backend but not where
/// it lives or what it answered (a Redis URL, a file path, the server's reply): those go to
/// the server's log, as the transport does for the same errors (decision 101).
fn failure_text(error: &AgentError) -> String {
    match error {
        AgentError::Storage { backend, .. } | AgentError::StoreUnavailable { backend, .. } => {
            tracing::warn!(error = %error, "a task failed on a store error");
            let backend = if backend.is_empty() { "the" } else { backend };
            match error {
                AgentError::Storage { .. } => {
                    format!("storage error: the {backend} store failed; the server's log says why")
                }
                _ => format!("store unavailable: the {backend} store could not be reached"),
            }
        }
        other => other.to_string(),
    }
}

/// The log entry of `task`'s current status, final when the state is terminal: what every
/// status write of the engine appends.
pub(super) fn status_event(task: &Task) -> TaskEvent {
    TaskEvent::status_of(task, task.state().is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `error`'s text for the caller starts with `start` and names none of `hidden`.
    fn assert_told(error: &AgentError, start: &str, hidden: &[&str]) {
        let text = failure_text(error);
        assert!(text.starts_with(start), "{text}");
        assert!(hidden.iter().all(|h| !text.contains(h)), "{text}");
    }

    #[test]
    fn a_store_failure_tells_the_caller_its_backend_but_not_where_the_store_lives() {
        let unavailable = AgentError::store_unavailable(
            "redis",
            "XADD at redis://10.0.0.7:6379/",
            std::io::Error::other("connection refused"),
        );
        let store = "store unavailable: the redis store";
        assert_told(&unavailable, store, &["10.0.0.7", "refused"]);
        let broken = AgentError::storage_source(
            "sqlite",
            "read /srv/keel/keel.db",
            std::io::Error::other("disk I/O error"),
        );
        assert_told(
            &broken,
            "storage error: the sqlite store",
            &["/srv/keel", "disk"],
        );
        let other = AgentError::internal("boom");
        assert_eq!(failure_text(&other), other.to_string());
    }
}
