//! Keel's own task metadata on the wire: one object under [`KEEL_METADATA_KEY`], its fields in
//! camelCase and its states by their wire names, beside the caller's own keys, which pass
//! unchanged.
//!
//! Inside Keel (stores, engine, run reports) a task's metadata keeps the engine's snake_case
//! keys (`run_context`, `stop_reason`, `pending_approval`, ...); only this pair of functions
//! knows the wire form, so every binding (JSON-RPC, HTTP+JSON, streams, push, the v0.3 layer,
//! gRPC) shows callers the same block and Keel's client reads it back into the same task:
//!
//! | inside Keel | `metadata.keel.` on the wire |
//! |---|---|
//! | `Task.created_at` | `createdAt` |
//! | `Task.state_history` (`previous_state: "working"`) | `stateHistory` (`previousState: "TASK_STATE_WORKING"`) |
//! | `run_context.run_id`, `.thread_id`, `.trace_id` | `runId`, `threadId`, `traceId`: always (seed 000's mirror of the common ids) |
//! | `run_context` | `runContext`, camelCase: only when it holds more than those ids (see below) |
//! | `stop_reason`, `cancel_reason`, `error` | `stopReason`, `cancelReason`, `error` |
//! | `pending_approval` | `pendingApproval`, camelCase; previews as A2A artifacts |
//! | `agent`, `skill`, `awaiting_tool_call`, `approval_decision` | not sent: the engine's own bookkeeping ([`INTERNAL_KEYS`], decision 253) |
//!
//! Free-form values keep their keys as they were written: an action's `payload` and
//! `metadata`, a run context's `permissions` (capability names) and `metadata` (the
//! application's). A Keel value that does not read as its type stays at the top level as it
//! is, so nothing is dropped; decoding leaves unknown fields of the block under its key.
//!
//! The full run context goes back only when it holds more than the three ids: what the
//! engine creates for a task nobody gave a context is only those ids, so anything beyond
//! them (budget, permissions, workspace, agent chain, parent run, application metadata, a
//! cancellation) came from the caller that sent it, and a task is served only to its own
//! tenant (decision 108).

use chrono::{DateTime, Utc};
use keel_core::{
    ApprovalDecision, ApprovalRequest, Metadata, RunContext, RunId, StateTransition, Task,
    ThreadId, TraceId, RUN_CONTEXT_KEY,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::codec::{lower_camel, to_json};
use super::task::{artifact_from_wire, artifact_to_wire, state_from_name, state_name};

/// The one task metadata key under which Keel's own fields travel on the wire, in camelCase.
///
/// ```
/// use keel_core::{Message, Task};
/// let mut task = Task::create(Message::user("hi"));
/// task.complete("done")?;
/// let wire = keel_transport::task_json(&task);
/// let keel = &wire["metadata"][keel_transport::KEEL_METADATA_KEY];
/// assert_eq!(keel["stateHistory"][1]["newState"], "TASK_STATE_COMPLETED");
/// # Ok::<(), keel_core::AgentError>(())
/// ```
pub const KEEL_METADATA_KEY: &str = "keel";

/// The engine's task metadata keys that never go out: its own bookkeeping (the agent that
/// runs the task, the negotiated skill, the asynchronous call it waits for, an approval
/// decision until a run applies it), which no caller sent and no document promises. The one
/// place the wire's answer is trimmed, so every binding sends the same lean task (decision
/// 253). A task from an older server that sent them still reads back ([`PLAIN_KEYS`]).
pub(crate) const INTERNAL_KEYS: [&str; 4] =
    ["agent", "skill", "awaiting_tool_call", "approval_decision"];

/// Keel's task metadata keys whose values travel unchanged, with their wire names (read
/// back from any server; written only when not in [`INTERNAL_KEYS`]).
const PLAIN_KEYS: [(&str, &str); 6] = [
    ("stop_reason", "stopReason"),
    ("awaiting_tool_call", "awaitingToolCall"),
    ("skill", "skill"),
    ("agent", "agent"),
    ("cancel_reason", "cancelReason"),
    ("error", "error"),
];
const PENDING_APPROVAL: (&str, &str) = ("pending_approval", "pendingApproval");
const APPROVAL_DECISION: (&str, &str) = ("approval_decision", "approvalDecision");
const RUN_CONTEXT: &str = "runContext";
const STATE_HISTORY: &str = "stateHistory";
const CREATED_AT: &str = "createdAt";
const RUN_ID: &str = "runId";
const THREAD_ID: &str = "threadId";
const TRACE_ID: &str = "traceId";

/// Where older Keel servers put the state history and creation time: read, never written.
const LEGACY_STATE_HISTORY: &str = "keel.stateHistory";
const LEGACY_CREATED_AT: &str = "keel.createdAt";

/// Fields of a run context whose keys are not Keel's.
const RUN_CONTEXT_FREE_FORM: &[&str] = &["permissions", "metadata"];
/// Fields of an approval request whose keys are not Keel's (previews and the result are
/// mapped as artifacts).
const APPROVAL_FREE_FORM: &[&str] = &["payload", "metadata", "previews", "result"];

/// A state change as the wire shows it.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTransition {
    previous_state: String,
    new_state: String,
    timestamp: DateTime<Utc>,
}

/// What [`metadata_from_wire`] reads back: the task's metadata in Keel's own form and the
/// task fields that travel in it.
#[derive(Debug, Default)]
pub(crate) struct TaskMetadata {
    /// The metadata, with Keel's keys as the engine writes them.
    pub metadata: Metadata,
    /// `Task.state_history`.
    pub state_history: Vec<StateTransition>,
    /// `Task.created_at`, when sent.
    pub created_at: Option<DateTime<Utc>>,
}

/// A task's metadata as the wire shows it: the caller's keys as they are, Keel's under
/// [`KEEL_METADATA_KEY`] in camelCase.
pub(crate) fn metadata_to_wire(task: &Task) -> Metadata {
    let mut metadata = task.metadata.clone();
    for key in INTERNAL_KEYS {
        metadata.remove(key);
    }
    // A `keel` object already in the metadata holds fields an older or newer peer sent that
    // this version does not know: they stay in the block. A `keel` value that is no object is
    // an application's own: rather than drop it, the task goes out as it is stored.
    let mut block = match metadata.remove(KEEL_METADATA_KEY) {
        Some(Value::Object(fields)) => fields,
        Some(other) => {
            metadata.insert(KEEL_METADATA_KEY.into(), other);
            return metadata;
        }
        None => Map::new(),
    };
    block.insert(CREATED_AT.into(), to_json(&task.created_at));
    if !task.state_history.is_empty() {
        let history: Vec<WireTransition> = task
            .state_history
            .iter()
            .map(|t| WireTransition {
                previous_state: state_name(t.previous_state),
                new_state: state_name(t.new_state),
                timestamp: t.timestamp,
            })
            .collect();
        block.insert(STATE_HISTORY.into(), to_json(&history));
    }
    if let Some(ctx) = metadata
        .get(RUN_CONTEXT_KEY)
        .and_then(|v| RunContext::deserialize(v).ok())
    {
        metadata.remove(RUN_CONTEXT_KEY);
        block.insert(RUN_ID.into(), Value::String(ctx.run_id.to_string()));
        if let Some(thread) = &ctx.thread_id {
            block.insert(THREAD_ID.into(), Value::String(thread.to_string()));
        }
        block.insert(TRACE_ID.into(), Value::String(ctx.trace_id.to_string()));
        if !ctx.holds_only_ids() {
            block.insert(
                RUN_CONTEXT.into(),
                camel_keys(to_json(&ctx), RUN_CONTEXT_FREE_FORM),
            );
        }
    }
    for (key, wire) in PLAIN_KEYS {
        if let Some(value) = metadata.remove(key) {
            block.insert(wire.into(), value);
        }
    }
    if let Some(value) = metadata
        .get(PENDING_APPROVAL.0)
        .and_then(approval_request_to_wire)
    {
        metadata.remove(PENDING_APPROVAL.0);
        block.insert(PENDING_APPROVAL.1.into(), value);
    }
    metadata.insert(KEEL_METADATA_KEY.into(), Value::Object(block));
    metadata
}

/// The inverse of [`metadata_to_wire`]: a wire task's metadata in Keel's own form. Older
/// servers' forms read too: Keel's keys at the top level pass as they are, and the
/// `keel.stateHistory` / `keel.createdAt` keys are taken.
pub(crate) fn metadata_from_wire(mut metadata: Metadata) -> TaskMetadata {
    let mut out = TaskMetadata::default();
    if let Some(history) = take_as::<Vec<StateTransition>>(&mut metadata, LEGACY_STATE_HISTORY) {
        out.state_history = history;
    }
    out.created_at = take_as(&mut metadata, LEGACY_CREATED_AT);
    let mut block = match metadata.remove(KEEL_METADATA_KEY) {
        Some(Value::Object(block)) => block,
        Some(other) => {
            metadata.insert(KEEL_METADATA_KEY.into(), other);
            out.metadata = metadata;
            return out;
        }
        None => {
            out.metadata = metadata;
            return out;
        }
    };
    if let Some(created_at) = take_as(&mut block, CREATED_AT) {
        out.created_at = Some(created_at);
    }
    if let Some(history) = block
        .get(STATE_HISTORY)
        .and_then(|v| transitions_from_wire(v.clone()))
    {
        block.remove(STATE_HISTORY);
        out.state_history = history;
    }
    if let Some(ctx) = run_context_from_wire(&mut block) {
        metadata.insert(RUN_CONTEXT_KEY.into(), to_json(&ctx));
    }
    for (key, wire) in PLAIN_KEYS {
        if let Some(value) = block.remove(wire) {
            metadata.insert(key.into(), value);
        }
    }
    if let Some(value) = block
        .get(PENDING_APPROVAL.1)
        .and_then(|v| approval_request_from_wire(v.clone()))
    {
        block.remove(PENDING_APPROVAL.1);
        metadata.insert(PENDING_APPROVAL.0.into(), value);
    }
    if let Some(decision) = block
        .get(APPROVAL_DECISION.1)
        .and_then(|v| ApprovalDecision::deserialize(snake_keys(v.clone(), &[])).ok())
    {
        block.remove(APPROVAL_DECISION.1);
        metadata.insert(APPROVAL_DECISION.0.into(), to_json(&decision));
    }
    if !block.is_empty() {
        metadata.insert(KEEL_METADATA_KEY.into(), Value::Object(block));
    }
    out.metadata = metadata;
    out
}

/// The run context of a wire block: `runContext` when sent, else the one its ids make.
fn run_context_from_wire(block: &mut Map<String, Value>) -> Option<RunContext> {
    let ids = match (block.get(RUN_ID), block.get(TRACE_ID)) {
        (Some(Value::String(run)), Some(Value::String(trace))) => Some(RunContext {
            run_id: RunId::from(run.as_str()),
            thread_id: block
                .get(THREAD_ID)
                .and_then(Value::as_str)
                .map(ThreadId::from),
            trace_id: TraceId::from(trace.as_str()),
            ..RunContext::new()
        }),
        _ => None,
    };
    let full = block
        .get(RUN_CONTEXT)
        .and_then(|v| RunContext::deserialize(snake_keys(v.clone(), RUN_CONTEXT_FREE_FORM)).ok());
    let ctx = full.or(ids)?;
    for key in [RUN_CONTEXT, RUN_ID, THREAD_ID, TRACE_ID] {
        block.remove(key);
    }
    Some(ctx)
}

fn transitions_from_wire(value: Value) -> Option<Vec<StateTransition>> {
    let wire: Vec<WireTransition> = serde_json::from_value(value).ok()?;
    wire.into_iter()
        .map(|t| {
            Some(StateTransition {
                previous_state: state_from_name(&t.previous_state)?,
                new_state: state_from_name(&t.new_state)?,
                timestamp: t.timestamp,
            })
        })
        .collect()
}

/// A stored pending approval in camelCase, its previews and result as A2A artifacts; `None`
/// when it does not read as an [`ApprovalRequest`].
fn approval_request_to_wire(value: &Value) -> Option<Value> {
    let request = ApprovalRequest::deserialize(value).ok()?;
    let mut wire = camel_keys(to_json(&request), APPROVAL_FREE_FORM);
    let action = wire.get_mut("action")?.as_object_mut()?;
    if !request.action.previews.is_empty() {
        let previews = request
            .action
            .previews
            .iter()
            .map(|a| to_json(&artifact_to_wire(a)))
            .collect();
        action.insert("previews".into(), Value::Array(previews));
    }
    if let Some(result) = &request.action.result {
        action.insert("result".into(), to_json(&artifact_to_wire(result)));
    }
    Some(wire)
}

/// The inverse of [`approval_request_to_wire`], as the engine stores it.
fn approval_request_from_wire(value: Value) -> Option<Value> {
    let mut keel = snake_keys(value, APPROVAL_FREE_FORM);
    let action = keel.get_mut("action")?.as_object_mut()?;
    let artifact = |wire: Value| -> Option<Value> {
        let wire: a2a::Artifact = serde_json::from_value(wire).ok()?;
        artifact_from_wire(wire, "pendingApproval.action")
            .ok()
            .map(|a| to_json(&a))
    };
    if let Some(Value::Array(previews)) = action.remove("previews") {
        let previews = previews.into_iter().map(artifact).collect::<Option<_>>()?;
        action.insert("previews".into(), Value::Array(previews));
    }
    if let Some(result) = action.remove("result") {
        action.insert("result".into(), artifact(result)?);
    }
    let request = ApprovalRequest::deserialize(&keel).ok()?;
    Some(to_json(&request))
}

/// Remove `key` and decode it; a value that does not decode stays.
fn take_as<T: serde::de::DeserializeOwned>(metadata: &mut Metadata, key: &str) -> Option<T> {
    let decoded = serde_json::from_value(metadata.get(key)?.clone()).ok()?;
    metadata.remove(key);
    Some(decoded)
}

/// `value` with every object key in lowerCamelCase, except inside the fields named in
/// `free_form` (whose keys are not Keel's).
fn camel_keys(value: Value, free_form: &[&str]) -> Value {
    rename_keys(value, free_form, &lower_camel)
}

/// The inverse of [`camel_keys`].
fn snake_keys(value: Value, free_form: &[&str]) -> Value {
    rename_keys(value, free_form, &snake_case)
}

fn rename_keys(value: Value, free_form: &[&str], rename: &dyn Fn(&str) -> String) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, field)| {
                    let field = if free_form.contains(&key.as_str()) {
                        field
                    } else {
                        rename_keys(field, free_form, rename)
                    };
                    (rename(&key), field)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|item| rename_keys(item, free_form, rename))
                .collect(),
        ),
        other => other,
    }
}

/// `requestId` → `request_id`.
fn snake_case(camel: &str) -> String {
    let mut snake = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            snake.push('_');
            snake.push(c.to_ascii_lowercase());
        } else {
            snake.push(c);
        }
    }
    snake
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{as_sent, tasks, waiting_for_approval};
    use keel_core::{Message, TaskState};
    use serde_json::json;

    /// Keel's keys as the engine writes them; none may reach the top level of the wire.
    const ENGINE_KEYS: [&str; 11] = [
        "run_context",
        "stop_reason",
        "awaiting_tool_call",
        "pending_approval",
        "approval_decision",
        "skill",
        "agent",
        "cancel_reason",
        "error",
        "keel.stateHistory",
        "keel.createdAt",
    ];

    /// Every key Keel names in `value`, skipping the fields whose keys are not Keel's.
    fn keel_keys(value: &Value, free_form: &[&str], out: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                for (key, field) in fields {
                    out.push(key.clone());
                    if !free_form.contains(&key.as_str()) {
                        keel_keys(field, free_form, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| keel_keys(i, free_form, out)),
            _ => {}
        }
    }

    #[test]
    fn keel_fields_travel_in_one_camel_case_block_beside_the_callers_keys() {
        for task in tasks() {
            let wire = metadata_to_wire(&task);
            for key in ENGINE_KEYS {
                assert!(!wire.contains_key(key), "{key} at the top level: {wire:?}");
            }
            for key in INTERNAL_KEYS {
                assert!(
                    wire[KEEL_METADATA_KEY].get(lower_camel(key)).is_none(),
                    "{key} went out: {wire:?}"
                );
            }
            for (key, value) in &task.metadata {
                if !ENGINE_KEYS.contains(&key.as_str()) {
                    assert_eq!(wire.get(key), Some(value), "the caller's {key}");
                }
            }
            let mut keys = Vec::new();
            let free_form = ["payload", "metadata", "permissions", "parts"];
            keel_keys(&wire[KEEL_METADATA_KEY], &free_form, &mut keys);
            assert!(
                keys.iter().all(|k| !k.contains('_')),
                "snake_case in the block: {keys:?}"
            );
        }
    }

    #[test]
    fn the_state_history_names_states_as_the_wire_does() {
        let task = &tasks()[1];
        let wire = metadata_to_wire(task);
        let history = &wire[KEEL_METADATA_KEY][STATE_HISTORY];
        assert_eq!(history[0]["previousState"], "TASK_STATE_SUBMITTED");
        assert_eq!(history[0]["newState"], "TASK_STATE_WORKING");
        assert_eq!(history[1]["newState"], "TASK_STATE_COMPLETED");
        assert!(history[1]["timestamp"].is_string());
        assert_eq!(
            wire[KEEL_METADATA_KEY][CREATED_AT],
            to_json(&task.created_at)
        );
    }

    #[test]
    fn a_task_nobody_gave_a_context_shows_only_its_ids() {
        let mut task = Task::create(Message::user("hi"));
        let ctx = RunContext::ensure_task_context(&mut task).unwrap();
        let block = metadata_to_wire(&task)[KEEL_METADATA_KEY].clone();
        assert_eq!(block[RUN_ID], ctx.run_id.as_str());
        assert_eq!(block[TRACE_ID], ctx.trace_id.as_str());
        assert_eq!(block[THREAD_ID], task.thread_id.as_str());
        assert!(block.get(RUN_CONTEXT).is_none(), "{block}");
        // and Keel's client reads the same context back
        let back = metadata_from_wire(metadata_to_wire(&task));
        assert_eq!(
            back.metadata[RUN_CONTEXT_KEY],
            task.metadata[RUN_CONTEXT_KEY]
        );
    }

    #[test]
    fn a_context_the_caller_sent_comes_back_in_camel_case_with_its_own_keys_as_sent() {
        let task = waiting_for_approval();
        let block = metadata_to_wire(&task)[KEEL_METADATA_KEY].clone();
        let ctx = &block[RUN_CONTEXT];
        assert_eq!(ctx["budget"], json!({"maxSteps": 8, "maxLlmCalls": 4}));
        assert_eq!(ctx["agentChain"], json!(["gateway"]));
        assert_eq!(ctx["workspaceUri"], "file:///workspace");
        assert_eq!(ctx["runId"], block[RUN_ID]);
        assert_eq!(
            ctx["permissions"],
            json!({"records.write": "require_approval"})
        );
        assert_eq!(ctx["metadata"], json!({"app_key": {"inner_key": 1}}));
    }

    #[test]
    fn a_pending_approval_is_camel_case_with_its_previews_as_a2a_artifacts() {
        let task = waiting_for_approval();
        let block = metadata_to_wire(&task)[KEEL_METADATA_KEY].clone();
        let pending = &block["pendingApproval"];
        assert_eq!(pending["requestId"], "req-1");
        assert!(pending["requestedAt"].is_string());
        assert_eq!(pending["action"]["kind"], "tool_call");
        assert_eq!(pending["action"]["payload"], json!({"record_id": "r1"}));
        assert_eq!(pending["action"]["metadata"], json!({"call_id": "call-1"}));
        let preview = &pending["action"]["previews"][0];
        assert!(preview["artifactId"].is_string(), "{preview}");
        assert_eq!(preview["parts"][0]["text"], "the row");
        assert_eq!(block["stopReason"], "approval_required");
        // The engine's keys that go out come back from the wire as it wrote them.
        let back = metadata_from_wire(metadata_to_wire(&task));
        assert_eq!(back.metadata, as_sent(task.clone()).metadata);
        assert_eq!(back.state_history, task.state_history);
        assert_eq!(back.created_at, Some(task.created_at));
    }

    #[test]
    fn an_older_servers_bookkeeping_keys_still_read_back() {
        let block = json!({"agent": "writer", "skill": "records", "awaitingToolCall": "acall-1",
            "approvalDecision": {"requestId": "req-1", "outcome": "approved",
                                 "decidedAt": "2026-01-01T00:00:00Z"}});
        let mut wire = Metadata::new();
        wire.insert(KEEL_METADATA_KEY.into(), block);
        let back = metadata_from_wire(wire).metadata;
        assert_eq!(back["agent"], "writer");
        assert_eq!(back["skill"], "records");
        assert_eq!(back["awaiting_tool_call"], "acall-1");
        assert_eq!(back["approval_decision"]["request_id"], "req-1");
        assert!(!back.contains_key(KEEL_METADATA_KEY), "{back:?}");
    }

    #[test]
    fn a_keel_value_that_does_not_read_stays_where_it_was() {
        let mut task = Task::create(Message::user("hi"));
        task.metadata
            .insert("pending_approval".into(), json!("not a request"));
        task.metadata.insert("run_context".into(), json!(42));
        let wire = metadata_to_wire(&task);
        assert_eq!(wire["pending_approval"], "not a request");
        assert_eq!(wire["run_context"], 42);
        assert_eq!(metadata_from_wire(wire).metadata, task.metadata);
    }

    #[test]
    fn an_older_servers_task_metadata_reads_as_it_did() {
        let mut task = Task::create(Message::user("hi"));
        RunContext::ensure_task_context(&mut task).unwrap();
        task.complete("done").unwrap();
        task.metadata
            .insert("stop_reason".into(), json!("response"));
        let mut old = task.metadata.clone();
        old.insert(LEGACY_STATE_HISTORY.into(), to_json(&task.state_history));
        old.insert(LEGACY_CREATED_AT.into(), to_json(&task.created_at));
        let back = metadata_from_wire(old);
        assert_eq!(back.metadata, task.metadata);
        assert_eq!(back.state_history, task.state_history);
        assert_eq!(back.state_history[1].new_state, TaskState::Completed);
        assert_eq!(back.created_at, Some(task.created_at));
    }

    #[test]
    fn unknown_fields_of_the_block_are_kept() {
        let mut wire = metadata_to_wire(&Task::create(Message::user("hi")));
        wire[KEEL_METADATA_KEY]
            .as_object_mut()
            .unwrap()
            .insert("fromANewerKeel".into(), json!(1));
        let back = metadata_from_wire(wire);
        assert_eq!(
            back.metadata[KEEL_METADATA_KEY],
            json!({"fromANewerKeel": 1})
        );
        let mut task = Task::create(Message::user("hi"));
        task.metadata = back.metadata;
        assert_eq!(
            metadata_to_wire(&task)[KEEL_METADATA_KEY]["fromANewerKeel"],
            1
        );
    }

    #[test]
    fn snake_and_camel_case_are_inverse_for_keels_field_names() {
        for name in ["request_id", "max_runtime_seconds", "agent_chain", "id"] {
            assert_eq!(snake_case(&lower_camel(name)), name);
        }
    }
}
