//! The payload of each event type, as typed structs, and the [`RunEvent`] constructors that
//! build them. The engine emits through these constructors and the
//! [`RunRecorder`](crate::RunRecorder) reads the same structs back, so the two cannot drift.
//!
//! | type | payload | envelope fields set |
//! |---|---|---|
//! | `task.status` | [`TaskStatusPayload`] | `final` when the state is terminal or interrupted |
//! | `task.artifact` | [`TaskArtifactPayload`] | `action_id` from the artifact |
//! | `context.prepared` | [`ContextPreparedPayload`] | |
//! | `llm.call.started` | [`LlmCallStartedPayload`] | |
//! | `llm.call.completed` | [`LlmCallCompletedPayload`] | |
//! | `llm.stream` | [`LlmStreamPayload`] | |
//! | `budget.warning`, `budget.exceeded` | [`BudgetPayload`] | severity warning / error |
//! | `action.requested`, `action.started` | [`ActionPayload`] | `action_id`, `parent_action_id` |
//! | `action.policy` | [`ActionPolicyPayload`] | `action_id` |
//! | `action.completed` | [`ActionCompletedPayload`] | `action_id` |
//! | `action.denied` | [`ActionDeniedPayload`] | `action_id`, severity warning |
//! | `action.failed` | [`ActionFailedPayload`] | `action_id`, severity error |
//! | `approval.required` | [`ApprovalRequiredPayload`] | `action_id` |
//! | `approval.decided` | [`ApprovalDecidedPayload`] | `action_id` |
//!
//! The thread engine's markers, effects and subagents have theirs too (one constant, one
//! struct and one constructor each): `tool.async.*`, `queue.*`, `message.persisted`,
//! `tool_result.persisted`, `run.stopped`, `stop.evaluated`, `thread.terminated`,
//! `context.compacted` ([`ToolAsyncDeadlinePayload`]
//! and its neighbours), `effect.*` ([`EffectScheduledPayload`], ...) and `subagent.*`
//! ([`SubagentCreatedPayload`], ...).
//!
//! Every field a reader does not need is optional or defaulted, so events written by an
//! older Keel still read.

use keel_core::{
    ActionId, ApprovalDecision, ApprovalOutcome, ApprovalRequest, Artifact, BudgetUsage,
    ContextManifest, RunAction, Task, TaskEvent, TaskId, TaskState, TaskStatus,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{summary, EventType, RunEvent, RunEventBuilder, Severity};

mod effects;
mod engine;
mod subagents;

pub use effects::{
    EffectCanceledPayload, EffectDroppedPayload, EffectFiredPayload, EffectScheduledPayload,
};
pub use engine::{
    ContextCompactedPayload, MessagePersistedPayload, QueueInjectedPayload, RunStoppedPayload,
    StopEvaluatedPayload, ThreadTerminatedPayload, ToolAsyncAcknowledgedPayload,
    ToolAsyncDeadlinePayload, ToolAsyncProgressPayload, ToolAsyncResultPayload,
    ToolResultPersistedPayload,
};
pub use subagents::{
    ScopedVariablesRoute, SubagentBootstrapPayload, SubagentCreatedPayload, SubagentEndedPayload,
    SubagentFile, SubagentMessagedPayload, SubagentStatusPayload,
};

/// `task.status`: the task's new state.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatusPayload {
    /// The new state.
    pub state: TaskState,
    /// The status message's text, if any.
    pub message: Option<String>,
    /// The serialized task (Keel JSON), when the event was built with it
    /// ([`RunEvent::task_status_of`]); the engine's statuses name the task instead.
    pub task: Option<Value>,
}

/// `task.artifact`: an artifact or a chunk of one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskArtifactPayload {
    /// The artifact (or chunk).
    pub artifact: Artifact,
    /// Whether this chunk extends an earlier one with the same id.
    #[serde(default)]
    pub append: bool,
    /// Whether it is the artifact's last chunk.
    #[serde(default)]
    pub last_chunk: bool,
}

/// `context.prepared`: what is about to enter the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextPreparedPayload {
    /// The estimate.
    pub manifest: ContextManifest,
}

/// `llm.call.started`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmCallStartedPayload {
    /// Model provider.
    pub provider: Option<String>,
    /// Model name.
    pub model: Option<String>,
    /// The manifest's `total_estimated_tokens`.
    #[serde(default)]
    pub estimated_input_tokens: u64,
}

/// `llm.call.completed`: usage and latency of one call.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmCallCompletedPayload {
    /// Model provider.
    pub provider: Option<String>,
    /// Model name.
    pub model: Option<String>,
    /// Input tokens (provider usage, or a local estimate).
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens (provider usage, or a local estimate when it reports none).
    #[serde(default)]
    pub output_tokens: u64,
    /// Wall-clock latency of the call.
    pub latency_ms: Option<u64>,
    /// Why the model stopped (`stop`, `tool_calls`, `length`).
    pub finish_reason: Option<String>,
    /// What the call cost in micro-dollars, its tokens at the model's price (absent when the
    /// model has no price; decision 185).
    pub cost_micros: Option<u64>,
}

/// `llm.stream`: a chunk of model output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmStreamPayload {
    /// The text added.
    pub delta: String,
}

/// `budget.warning` and `budget.exceeded`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetPayload {
    /// The limit's field name (`max_steps`, ...), as `BudgetLimit::as_str` spells it.
    pub limit: String,
    /// How much is used.
    pub used: u64,
    /// The configured maximum.
    pub max: u64,
    /// The run's whole usage at that moment, when the emitter knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<BudgetUsage>,
}

/// `action.requested` and `action.started`: the complete action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionPayload {
    /// The action.
    pub action: RunAction,
}

/// `action.policy`: the combined policy decision. `decision` is `allow`, `deny` or
/// `require_approval` — the serde form of `keel_policy::PolicyDecision` flattened next to
/// the action id, so a policy decision serialized into this payload reads back as-is.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionPolicyPayload {
    /// The action judged.
    pub action_id: ActionId,
    /// `allow`, `deny` or `require_approval`.
    pub decision: String,
    /// Why (deny and require approval).
    pub reason: Option<String>,
    /// The capability that caused it.
    pub capability: Option<String>,
}

/// `action.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionCompletedPayload {
    /// The action.
    pub action_id: ActionId,
    /// What it returned (a tool's JSON output, a delegated agent's answer).
    #[serde(default)]
    pub output: Value,
    /// Artifacts it produced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// How long it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// `action.denied`: refused by policy or an approver; it did not run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionDeniedPayload {
    /// The action.
    pub action_id: ActionId,
    /// Why.
    pub reason: String,
}

/// `action.failed`: it ran and failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionFailedPayload {
    /// The action.
    pub action_id: ActionId,
    /// What went wrong.
    pub error: String,
    /// How long it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// `approval.required`: the request handed to the approver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequiredPayload {
    /// The request (with the complete action).
    pub request: ApprovalRequest,
}

/// `approval.decided`: the approver's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecidedPayload {
    /// The action the request was about.
    pub action_id: ActionId,
    /// The decision (its `request_id` correlates it with the request).
    pub decision: ApprovalDecision,
}

/// Serialize a payload. The payload structs hold only string-keyed JSON, which cannot
/// fail to serialize; should a future field break that, the event still goes out and
/// says why its payload is missing instead of aborting the run.
pub(crate) fn to_payload<T: Serialize + ?Sized>(payload: &T) -> Value {
    serde_json::to_value(payload)
        .unwrap_or_else(|e| serde_json::json!({ "payload_error": e.to_string() }))
}

/// `task.status` for a status update: what [`RunEvent::from_task_event`] and the task helpers
/// share.
fn status_event(
    task_id: &TaskId,
    status: &TaskStatus,
    is_final: bool,
    task: Option<&Task>,
) -> RunEventBuilder {
    RunEvent::task_status(TaskStatusPayload {
        state: status.state,
        message: status.text(),
        task: task.map(to_payload),
    })
    .task(task_id.clone())
    .final_boundary(is_final)
}

/// Whether a status ends the task's turn: terminal, or waiting for input or auth.
fn ends_turn(state: TaskState) -> bool {
    state.is_terminal() || matches!(state, TaskState::InputRequired | TaskState::AuthRequired)
}

impl RunEvent {
    /// `task.status`; final when the state is terminal, input-required or auth-required.
    pub fn task_status(payload: TaskStatusPayload) -> RunEventBuilder {
        let state = payload.state;
        let is_final = ends_turn(state);
        let severity = match state {
            TaskState::Failed => Severity::Error,
            _ => Severity::Info,
        };
        RunEvent::builder(EventType::TASK_STATUS, summary::task_status(state))
            .payload_from(payload)
            .severity(severity)
            .final_boundary(is_final)
    }

    /// The normalized event for a task event, the form the durable task log and the A2A
    /// transport carry: a status update becomes `task.status`, an artifact update
    /// `task.artifact`; a history message has no event of its own (`None`). This is the one
    /// path from task events to run events: the engine's own task events and an
    /// application's (see [`EventEmitter::emit_task_event`](crate::EventEmitter::emit_task_event))
    /// go through it.
    ///
    /// With `task`, the serialized task rides on a status update, so that a reader of the
    /// event (a final status, above all) recovers the task and its [`RunContext`] with
    /// [`RunEvent::run_context`]. The event's `final` flag is the task event's.
    ///
    /// ```
    /// use keel_core::{Message, RunContext, Task, TaskEvent};
    /// use keel_events::{EventEmitter, InMemoryEventSink, RunEvent};
    /// let mut task = Task::create(Message::user("hi"));
    /// let context = RunContext::new();
    /// context.attach_to_task(&mut task)?;
    /// task.complete("done")?;
    /// let update = TaskEvent::StatusUpdate {
    ///     task_id: task.id.clone(),
    ///     thread_id: task.thread_id.clone(),
    ///     status: task.status().clone(),
    ///     is_final: true,
    /// };
    /// let emitter = EventEmitter::new(&context, std::sync::Arc::new(InMemoryEventSink::new()));
    /// let event = emitter.create(RunEvent::from_task_event(&update, Some(&task)).unwrap());
    /// assert!(event.is_final);
    /// let recovered = event.run_context()?.expect("the final status carries the task");
    /// assert_eq!(recovered.run_id, context.run_id);
    /// assert_eq!(Some(recovered), RunContext::from_task(&task)?);
    /// # Ok::<(), keel_core::AgentError>(())
    /// ```
    pub fn from_task_event(event: &TaskEvent, task: Option<&Task>) -> Option<RunEventBuilder> {
        match event {
            TaskEvent::StatusUpdate {
                task_id,
                status,
                is_final,
                ..
            } => Some(status_event(task_id, status, *is_final, task)),
            TaskEvent::ArtifactUpdate {
                task_id,
                artifact,
                append,
                last_chunk,
                ..
            } => {
                Some(RunEvent::task_artifact(artifact, *append, *last_chunk).task(task_id.clone()))
            }
            TaskEvent::Message { .. } => None,
        }
    }

    /// `task.status` for a task's current state, carrying the serialized task: for a reader
    /// with no store to read the task from (an application recording a stream it follows).
    /// Built by [`RunEvent::from_task_event`] from the task's status update.
    pub fn task_status_of(task: &Task) -> RunEventBuilder {
        status_event(&task.id, task.status(), ends_turn(task.state()), Some(task))
    }

    /// `task.status` for a task's current state, naming the task, its state and its status
    /// message but not carrying the task: what the engine emits, a run's final status
    /// included (decision 255). The task lives in the task store; a copy in every run's
    /// report and stream would be written only to be superseded.
    pub fn task_state_of(task: &Task) -> RunEventBuilder {
        status_event(&task.id, task.status(), ends_turn(task.state()), None)
    }

    /// `task.artifact`.
    pub fn task_artifact(artifact: &Artifact, append: bool, last_chunk: bool) -> RunEventBuilder {
        let name = artifact.name.as_deref().unwrap_or(artifact.kind.as_str());
        let mut builder = RunEvent::builder(EventType::TASK_ARTIFACT, summary::task_artifact(name))
            .payload_from(TaskArtifactPayload {
                artifact: artifact.clone(),
                append,
                last_chunk,
            });
        if let Some(action_id) = &artifact.action_id {
            builder = builder.action(action_id.clone());
        }
        builder
    }

    /// `context.prepared`.
    pub fn context_prepared(manifest: &ContextManifest) -> RunEventBuilder {
        RunEvent::builder(
            EventType::CONTEXT_PREPARED,
            summary::context_prepared(manifest.total_estimated_tokens),
        )
        .payload_from(ContextPreparedPayload {
            manifest: manifest.clone(),
        })
    }

    /// `llm.call.started`.
    pub fn llm_call_started(payload: LlmCallStartedPayload) -> RunEventBuilder {
        let summary = summary::llm_call_started(payload.model.as_deref());
        RunEvent::builder(EventType::LLM_CALL_STARTED, summary).payload_from(payload)
    }

    /// `llm.call.completed`.
    pub fn llm_call_completed(payload: LlmCallCompletedPayload) -> RunEventBuilder {
        let summary = summary::llm_call_completed(
            payload.model.as_deref(),
            payload.input_tokens,
            payload.output_tokens,
        );
        RunEvent::builder(EventType::LLM_CALL_COMPLETED, summary).payload_from(payload)
    }

    /// `llm.stream`.
    pub fn llm_stream(delta: impl Into<String>) -> RunEventBuilder {
        RunEvent::builder(EventType::LLM_STREAM, summary::LLM_STREAM).payload_from(
            LlmStreamPayload {
                delta: delta.into(),
            },
        )
    }

    /// `budget.warning`.
    pub fn budget_warning(payload: BudgetPayload) -> RunEventBuilder {
        let summary = format!(
            "budget {} at {} of {}",
            payload.limit, payload.used, payload.max
        );
        RunEvent::builder(EventType::BUDGET_WARNING, summary)
            .payload_from(payload)
            .severity(Severity::Warning)
    }

    /// `budget.exceeded`.
    pub fn budget_exceeded(payload: BudgetPayload) -> RunEventBuilder {
        let summary = format!(
            "budget {} exceeded: used {} of {}",
            payload.limit, payload.used, payload.max
        );
        RunEvent::builder(EventType::BUDGET_EXCEEDED, summary)
            .payload_from(payload)
            .severity(Severity::Error)
    }

    fn for_action(event_type: EventType, verb: &str, action: &RunAction) -> RunEventBuilder {
        let summary = format!("{} `{}` {verb}", action.kind, action.name);
        let mut builder = RunEvent::builder(event_type, summary).action(action.id.clone());
        if let Some(parent) = &action.parent_action_id {
            builder = builder.parent_action(parent.clone());
        }
        builder.payload_from(ActionPayload {
            action: action.clone(),
        })
    }

    /// `action.requested`.
    pub fn action_requested(action: &RunAction) -> RunEventBuilder {
        RunEvent::for_action(EventType::ACTION_REQUESTED, "requested", action)
    }

    /// `action.started`.
    pub fn action_started(action: &RunAction) -> RunEventBuilder {
        RunEvent::for_action(EventType::ACTION_STARTED, "started", action)
    }

    /// `action.policy`.
    pub fn action_policy(payload: ActionPolicyPayload) -> RunEventBuilder {
        let summary = match &payload.reason {
            Some(reason) => format!("policy: {} ({reason})", payload.decision),
            None => format!("policy: {}", payload.decision),
        };
        let severity = if payload.decision == "deny" {
            Severity::Warning
        } else {
            Severity::Info
        };
        RunEvent::builder(EventType::ACTION_POLICY, summary)
            .action(payload.action_id.clone())
            .payload_from(payload)
            .severity(severity)
    }

    /// `action.completed`.
    pub fn action_completed(payload: ActionCompletedPayload) -> RunEventBuilder {
        RunEvent::builder(EventType::ACTION_COMPLETED, "action completed")
            .action(payload.action_id.clone())
            .payload_from(payload)
    }

    /// `action.denied`.
    pub fn action_denied(action_id: ActionId, reason: impl Into<String>) -> RunEventBuilder {
        let payload = ActionDeniedPayload {
            action_id,
            reason: reason.into(),
        };
        RunEvent::builder(
            EventType::ACTION_DENIED,
            format!("action denied: {}", payload.reason),
        )
        .action(payload.action_id.clone())
        .payload_from(payload)
        .severity(Severity::Warning)
    }

    /// `action.failed`.
    pub fn action_failed(payload: ActionFailedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::ACTION_FAILED,
            format!("action failed: {}", payload.error),
        )
        .action(payload.action_id.clone())
        .payload_from(payload)
        .severity(Severity::Error)
    }

    /// `approval.required`. Redact the request before persisting it elsewhere
    /// ([`RedactionPolicy::redact_approval_request`](crate::RedactionPolicy::redact_approval_request)).
    pub fn approval_required(request: &ApprovalRequest) -> RunEventBuilder {
        let summary = format!(
            "approval required for `{}`: {}",
            request.action.name, request.reason
        );
        RunEvent::builder(EventType::APPROVAL_REQUIRED, summary)
            .action(request.action.id.clone())
            .payload_from(ApprovalRequiredPayload {
                request: request.clone(),
            })
    }

    /// `approval.decided`, for the decision answering `request`.
    pub fn approval_decided(
        request: &ApprovalRequest,
        decision: &ApprovalDecision,
    ) -> RunEventBuilder {
        let (verb, severity) = match decision.outcome {
            ApprovalOutcome::Approved => ("approved", Severity::Info),
            ApprovalOutcome::Denied => ("denied", Severity::Warning),
        };
        RunEvent::builder(
            EventType::APPROVAL_DECIDED,
            format!("`{}` {verb}", request.action.name),
        )
        .action(request.action.id.clone())
        .payload_from(ApprovalDecidedPayload {
            action_id: request.action.id.clone(),
            decision: decision.clone(),
        })
        .severity(severity)
    }
}

#[cfg(test)]
mod tests;
