//! The summaries of the events whose summary their payload alone gives: the constructors
//! write them from here, and a stored run leaves such a summary out and has it rendered
//! from here again when it is read (decision 270).

use keel_core::TaskState;
use serde_json::Value;

use crate::EventType;

/// `queue.drained`.
pub(crate) const QUEUE_DRAINED: &str = "queue drained";
/// `llm.stream`.
pub(crate) const LLM_STREAM: &str = "model output";
/// `stop.evaluated`.
pub(crate) const STOP_EVALUATED: &str = "stop rules evaluated";
/// `tool_result.persisted`.
pub(crate) const TOOL_RESULT_PERSISTED: &str = "tool result persisted";

/// `task.status`.
pub(crate) fn task_status(state: TaskState) -> String {
    format!("task {}", state.as_str())
}

/// `task.artifact`, for an artifact of this name (or, unnamed, this kind).
pub(crate) fn task_artifact(name: &str) -> String {
    format!("artifact {name}")
}

/// `context.prepared`.
pub(crate) fn context_prepared(total_estimated_tokens: u64) -> String {
    format!("context prepared: ~{total_estimated_tokens} tokens")
}

/// `llm.call.started`.
pub(crate) fn llm_call_started(model: Option<&str>) -> String {
    format!("calling {}", model.unwrap_or("model"))
}

/// `llm.call.completed`.
pub(crate) fn llm_call_completed(model: Option<&str>, input: u64, output: u64) -> String {
    format!(
        "{} answered: {input} in / {output} out tokens",
        model.unwrap_or("model")
    )
}

/// `message.persisted`.
pub(crate) fn message_persisted(role: &str) -> String {
    format!("{role} message persisted")
}

/// `run.stopped`.
pub(crate) fn run_stopped(reason: &str) -> String {
    format!("run stopped: {reason}")
}

/// The summary the constructor of an `event_type` event writes for `payload`, when the
/// payload alone gives it; `None` for any other type, or a payload that does not hold what
/// the summary is made of (such an event keeps its summary where it is stored).
pub(crate) fn of(event_type: &EventType, payload: &Value) -> Option<String> {
    let text = |key: &str| payload.get(key).and_then(Value::as_str);
    let number = |key: &str| payload.get(key).and_then(Value::as_u64);
    let summary = match event_type.as_str() {
        "queue.drained" => QUEUE_DRAINED.to_owned(),
        "llm.stream" => LLM_STREAM.to_owned(),
        "stop.evaluated" => STOP_EVALUATED.to_owned(),
        "tool_result.persisted" => TOOL_RESULT_PERSISTED.to_owned(),
        "task.status" => task_status(text("state")?.parse().ok()?),
        "task.artifact" => {
            let artifact = payload.get("artifact")?;
            let name = artifact.get("name").or_else(|| artifact.get("kind"));
            task_artifact(name.and_then(Value::as_str)?)
        }
        "context.prepared" => context_prepared(
            payload
                .get("manifest")?
                .get("total_estimated_tokens")?
                .as_u64()?,
        ),
        "llm.call.started" => llm_call_started(text("model")),
        "llm.call.completed" => llm_call_completed(
            text("model"),
            number("input_tokens")?,
            number("output_tokens")?,
        ),
        "message.persisted" => message_persisted(text("role")?),
        "run.stopped" => run_stopped(text("reason")?),
        _ => return None,
    };
    Some(summary)
}
