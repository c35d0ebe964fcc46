//! What a recorded run holds for a replay, read from its report's events only: the model's
//! answer at each step, each tool call's result, each approval's decision.

use std::collections::BTreeMap;

use keel_core::{AgentError, AgentResult, ApprovalDecision};
use keel_events::payload::{
    ActionCompletedPayload, ActionFailedPayload, ActionPayload, ApprovalDecidedPayload,
    LlmCallCompletedPayload, LlmStreamPayload, TaskStatusPayload,
};
use keel_events::{EventType, RunEvent, RunReport, RUN_REPORT_VERSION};
use keel_llm::{LlmResponse, ToolCall, Usage};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One model call as recorded: what the model answered and the model that answered.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedStep {
    /// The step it belongs to.
    pub step: u32,
    /// The provider, as `llm.call.completed` names it.
    pub provider: Option<String>,
    /// The model, as `llm.call.completed` names it.
    pub model: Option<String>,
    /// The answer: its text (the `llm.stream` deltas) and tool calls (the step's
    /// `action.requested` events that answer a model call), with the recorded usage.
    pub response: LlmResponse,
    /// The text chunks the answer streamed in (its `llm.stream` events), in order.
    pub chunks: Vec<String>,
}

/// One tool call's recorded outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedToolCall {
    /// The tool.
    pub tool: String,
    /// The arguments it was called with (as the report keeps them: redacted).
    pub arguments: Value,
    /// Its output, or the error it failed with.
    pub outcome: Result<Value, String>,
}

/// A recorded run, ready to be replayed: built from a [`RunReport`] (from the run store
/// through `reads`, or an exported JSON file).
#[derive(Debug, Clone)]
pub struct Recording {
    /// The report it was read from; its events are what a replay is compared against.
    pub report: RunReport,
    /// The model calls, in order.
    pub steps: Vec<RecordedStep>,
    /// The tool calls that ran, in order.
    pub tool_calls: Vec<RecordedToolCall>,
    /// The approval decisions, in order.
    pub approvals: Vec<ApprovalDecision>,
    /// The user's message the run answered, when the export carries it (under `input`
    /// beside the report's fields: a report's task snapshots carry no history).
    pub input: Option<keel_core::Message>,
}

fn payload<T: DeserializeOwned>(event: &RunEvent) -> AgentResult<T> {
    serde_json::from_value(event.payload.clone()).map_err(|e| {
        AgentError::invalid_input(
            "recording",
            format!(
                "event {} ({}) has a payload this Keel cannot read: {e}",
                event.sequence, event.event_type
            ),
        )
    })
}

impl Recording {
    /// Read a recording from exported JSON (a run report). A report of another version than
    /// [`RUN_REPORT_VERSION`] is [`AgentError::InvalidInput`] saying which version it is and
    /// which one this Keel replays, never a guess.
    pub fn from_json(json: &Value) -> AgentResult<Self> {
        if let Some(found) = json.get("version").and_then(Value::as_u64) {
            if found != u64::from(RUN_REPORT_VERSION) {
                return Err(AgentError::invalid_input(
                    "recording.version",
                    format!(
                        "a run recorded in report format {found} cannot be replayed: this Keel \
                         replays format {RUN_REPORT_VERSION}; record the run again with this Keel"
                    ),
                ));
            }
        }
        let mut recording = Self::from_report(RunReport::from_value(json.clone())?)?;
        recording.input = match json.get("input") {
            Some(input) => Some(
                serde_json::from_value(input.clone())
                    .map_err(|e| AgentError::invalid_input("recording.input", e.to_string()))?,
            ),
            None => None,
        };
        Ok(recording)
    }

    /// Read a recording from an exported run's file (`keel runs export RUN -o FILE`), as
    /// [`Recording::from_json`] reads its JSON; a file that cannot be read or is not JSON is
    /// [`AgentError::InvalidInput`] naming it.
    pub fn read(path: &std::path::Path) -> AgentResult<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            AgentError::invalid_input("replay.file", format!("{}: {e}", path.display()))
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| {
            AgentError::invalid_input(
                "replay.file",
                format!("{} is not JSON: {e}", path.display()),
            )
        })?;
        Self::from_json(&json)
    }

    /// Read a recording from a report.
    pub fn from_report(report: RunReport) -> AgentResult<Self> {
        let mut steps: Vec<RecordedStep> = Vec::new();
        // A model call's text streams before its `llm.call.completed`; its tool calls are
        // requested after it (an `action.requested` carries no step of its own).
        let mut chunks: Vec<String> = Vec::new();
        let mut requested: BTreeMap<String, (String, Value)> = BTreeMap::new();
        let mut tool_calls = Vec::new();
        let mut approvals = Vec::new();
        let mut final_text = None;
        for event in &report.events {
            let kind = &event.event_type;
            if *kind == EventType::LLM_CALL_COMPLETED {
                let p: LlmCallCompletedPayload = payload(event)?;
                steps.push(RecordedStep {
                    step: event.step.unwrap_or(0),
                    provider: p.provider,
                    model: p.model,
                    response: LlmResponse {
                        content: (!chunks.is_empty()).then(|| chunks.concat()),
                        usage: Usage {
                            input_tokens: p.input_tokens,
                            output_tokens: p.output_tokens,
                        },
                        ..LlmResponse::default()
                    },
                    chunks: std::mem::take(&mut chunks),
                });
            } else if *kind == EventType::LLM_STREAM {
                let p: LlmStreamPayload = payload(event)?;
                chunks.push(p.delta);
            } else if *kind == EventType::ACTION_REQUESTED {
                let p: ActionPayload = payload(event)?;
                let action = p.action;
                // Only a model's tool call carries the call id it answers. A run resumed after
                // a pause requests its waiting call again: one call of the model's still.
                let call_id = action.metadata.get("call_id").and_then(Value::as_str);
                if let (Some(call_id), Some(step), None) =
                    (call_id, steps.last_mut(), &action.parent_action_id)
                {
                    if step.response.tool_calls.iter().any(|c| c.id == call_id) {
                        requested.insert(action.id.to_string(), (action.name, action.payload));
                        continue;
                    }
                    step.response.tool_calls.push(ToolCall {
                        id: call_id.to_owned(),
                        name: action.name.clone(),
                        arguments: action.payload.clone(),
                    });
                }
                requested.insert(action.id.to_string(), (action.name, action.payload));
            } else if *kind == EventType::ACTION_COMPLETED || *kind == EventType::ACTION_FAILED {
                let (action_id, outcome) = if *kind == EventType::ACTION_COMPLETED {
                    let p: ActionCompletedPayload = payload(event)?;
                    (p.action_id, Ok(p.output))
                } else {
                    let p: ActionFailedPayload = payload(event)?;
                    (p.action_id, Err(p.error))
                };
                if let Some((tool, arguments)) = requested.get(action_id.as_ref()) {
                    tool_calls.push(RecordedToolCall {
                        tool: tool.clone(),
                        arguments: arguments.clone(),
                        outcome,
                    });
                }
            } else if *kind == EventType::APPROVAL_DECIDED {
                let p: ApprovalDecidedPayload = payload(event)?;
                approvals.push(p.decision);
            } else if *kind == EventType::TASK_STATUS && event.is_final {
                let p: TaskStatusPayload = payload(event)?;
                final_text = p.message;
            }
        }
        // A model that did not stream its last answer: the final status says it.
        if let Some(last) = steps.last_mut() {
            if last.response.content.is_none() && last.response.tool_calls.is_empty() {
                last.response.content = final_text;
            }
        }
        Ok(Self {
            report,
            steps,
            tool_calls,
            approvals,
            input: None,
        })
    }

    /// The recorded events, the reference a replay is compared against.
    pub fn events(&self) -> &[RunEvent] {
        &self.report.events
    }

    /// Whether the run paused for a person's decision (an approval it waited for in
    /// `input-required`, decided later) rather than having it decided at once by a handler.
    pub fn paused_for_approval(&self) -> bool {
        let waiting = serde_json::json!(keel_core::TaskState::InputRequired);
        self.events().iter().any(|e| {
            e.event_type.as_str() == "task.status" && e.payload.get("state") == Some(&waiting)
        }) && !self.approvals.is_empty()
    }
}
