//! Scoped variables (§7.4–§7.5): values handed to a child sealed at rest, and the pending
//! requests that complete a subagent whose variables were missing.

use std::collections::HashMap;

use keel_core::{AgentError, AgentResult, RunContext, ThreadId};
use keel_runtime::ChildThread;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::delivery::*;
use super::keys::*;
use super::spec::Specs;
use crate::ThreadState;

/// A scoped-variable request as stored in the parent thread (§7.5).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PendingRecord {
    pub(super) request_id: String,
    pub(super) parent_thread_id: ThreadId,
    pub(super) subagent: String,
    pub(super) name: String,
    pub(super) message: String,
    #[serde(default)]
    pub(super) attachments: Vec<String>,
    pub(super) missing: Vec<String>,
    pub(super) run: RunContext,
    pub(super) created_at: String,
}

/// What a pending scoped-variable request (§7.5) says about itself: which subagent waits, and
/// which variables must be provided. It never holds a variable's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingVariables {
    /// The request's id.
    pub request_id: String,
    /// The thread that asked for the subagent.
    pub parent_thread_id: ThreadId,
    /// The subagent kind.
    pub subagent: String,
    /// The instance's name.
    pub name: String,
    /// The variables to provide.
    pub missing: Vec<String>,
    /// When the request was made (RFC 3339).
    pub created_at: String,
}

impl From<&PendingRecord> for PendingVariables {
    fn from(record: &PendingRecord) -> Self {
        Self {
            request_id: record.request_id.clone(),
            parent_thread_id: record.parent_thread_id.clone(),
            subagent: record.subagent.clone(),
            name: record.name.clone(),
            missing: record.missing.clone(),
            created_at: record.created_at.clone(),
        }
    }
}

/// The stored request `request_id` of the parent thread, if any.
async fn pending_record(
    parent: &ThreadState,
    request_id: &str,
) -> AgentResult<Option<PendingRecord>> {
    if request_id.is_empty() || request_id.contains(char::is_whitespace) {
        return Ok(None);
    }
    let Some(value) = parent
        .host
        .runtime()
        .thread_store()
        .kv_get(
            &parent.auth,
            &parent.thread_id,
            &format!("{PENDING_PREFIX}{request_id}"),
        )
        .await?
    else {
        return Ok(None);
    };
    serde_json::from_value(value).map(Some).map_err(|e| {
        AgentError::storage(format!(
            "scoped-variable request {request_id} is malformed: {e}"
        ))
    })
}

/// The pending scoped-variable request `request_id` of the `parent` thread (see
/// [`AgentExecutor::pending_variables`](crate::AgentExecutor::pending_variables)).
pub(crate) async fn pending_variables(
    parent: &ThreadState,
    request_id: &str,
) -> AgentResult<Option<PendingVariables>> {
    Ok(pending_record(parent, request_id)
        .await?
        .as_ref()
        .map(PendingVariables::from))
}

/// Complete a scoped-variable request of the `parent` thread, whose agent offers the kinds
/// `specs` (see [`AgentExecutor::provide_variables`](crate::AgentExecutor::provide_variables)).
pub(crate) async fn provide_variables(
    parent: ThreadState,
    specs: &Specs,
    request_id: &str,
    values: &HashMap<String, String>,
) -> AgentResult<Option<ChildThread>> {
    let (auth, parent_thread_id) = (parent.auth.clone(), parent.thread_id.clone());
    let runtime = parent.host.runtime().clone();
    let Some(record) = pending_record(&parent, request_id).await? else {
        return Ok(None);
    };
    let still_missing: Vec<&str> = record
        .missing
        .iter()
        .filter(|var| values.get(*var).is_none_or(|v| v.is_empty()))
        .map(String::as_str)
        .collect();
    if !still_missing.is_empty() {
        return Err(AgentError::invalid_input(
            "variables",
            format!(
                "these variables are still missing: {}",
                still_missing.join(", ")
            ),
        ));
    }
    let spec = specs
        .iter()
        .find(|s| s.name == record.subagent)
        .ok_or_else(|| {
            AgentError::invalid_input(
                "request",
                format!("subagent kind `{}` is no longer offered", record.subagent),
            )
        })?;
    parent.ensure_open().await?;
    if let Err(error) = check_room(spec, &parent, &record.name).await {
        // A concurrent completion may have started the child since the request was read
        // (it consumes the request first): the request is used up, which answers `None`
        // here as it would have a moment later, not a name conflict with that child.
        if pending_record(&parent, request_id).await?.is_none() {
            return Ok(None);
        }
        return Err(error);
    }
    let environment = parent.host.environment();
    let mut scoped = Vec::new();
    for var in &spec.scoped_env {
        let value = values
            .get(var)
            .cloned()
            .or_else(|| environment.var(var))
            .ok_or_else(|| AgentError::invalid_input("variables", format!("`{var}` is missing")))?;
        scoped.push((var.clone(), value));
    }
    // Concurrent completions (two POSTs at once, in any process on the store) race for
    // one claim; only its winner consumes the request and starts the child. A claim left
    // by a process that died here lapses, and the request can be completed again.
    let claimed = runtime
        .memory_service()
        .save_if_absent(
            &auth,
            &format!("keel:variables-claim:{parent_thread_id}:{request_id}"),
            Value::Bool(true),
            VARIABLES_CLAIM_TTL,
        )
        .await?;
    if !claimed {
        return Ok(None);
    }
    // The request is consumed before the child starts, so a repeated POST cannot start a
    // second one.
    runtime
        .thread_store()
        .kv_set(
            &auth,
            &parent_thread_id,
            &format!("{PENDING_PREFIX}{request_id}"),
            Value::Null,
        )
        .await?;
    let origin = Origin {
        auth,
        run: record.run.clone(),
        parent,
        cancel: CancellationToken::new(),
        events: None,
        call: None,
    };
    let (child, _) = start_child(
        spec,
        &origin,
        &record.name,
        record.message.clone(),
        &record.attachments,
        &scoped,
        false,
    )
    .await?;
    Ok(Some(child))
}
