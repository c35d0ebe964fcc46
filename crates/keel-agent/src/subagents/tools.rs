//! The built-in tools subagents give a model: `subagent_create`, `subagent_message`, and
//! a child's own `session_status`; and the `immediate` kinds started before the first step.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::{AgentError, AgentResult};
use keel_events::payload::{
    ScopedVariablesRoute, SubagentBootstrapPayload, SubagentMessagedPayload, SubagentStatusPayload,
};
use keel_events::RunEvent;
use keel_llm::{LlmMessage, LlmRole};
use serde_json::{json, Value};

use super::delivery::*;
use super::keys::*;
use super::scoped::*;
use super::spec::*;
use crate::thread_state::mark_now;
use crate::tool::{Tool, ToolContext};

/// Check the specs and build the built-in tools for them.
pub(crate) fn builtin_tools(specs: &Specs) -> AgentResult<Vec<Arc<dyn Tool>>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let mut seen = std::collections::HashSet::new();
    for spec in specs.iter() {
        if spec.name.is_empty() {
            return Err(AgentError::invalid_input(
                "subagent.name",
                "must not be empty",
            ));
        }
        if !seen.insert(spec.name.clone()) {
            return Err(AgentError::invalid_input(
                "subagent.name",
                format!("`{}` is declared twice", spec.name),
            ));
        }
        if spec.max_instances == Some(0) {
            return Err(AgentError::invalid_input(
                format!("subagent `{}`.max_instances", spec.name),
                "must be at least 1",
            ));
        }
    }
    let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(CreateTool {
        specs: specs.clone(),
    })];
    if specs.iter().any(|s| s.resumable) {
        tools.push(Arc::new(MessageTool {
            specs: specs.clone(),
        }));
    }
    Ok(tools)
}

/// Before the first model step on a thread: queue a `subagent_create` call for every
/// `immediate` kind, so it runs (and its result is in the history) before the model is
/// called. A child whose own agent has immediate kinds does the same on its first run, so
/// activation is recursive. Runs once per thread. The seed allows a bootstrap model pass
/// before the call; Keel runs none and takes the object form's hints as the arguments (see
/// "No bootstrap model pass" in `docs/decisions.md`).
pub(crate) async fn activate_immediate(
    specs: &Specs,
    ctx: &ToolContext,
    history: &[LlmMessage],
) -> AgentResult<()> {
    let immediate: Vec<&SubagentSpec> = specs.iter().filter(|s| s.immediate.is_some()).collect();
    if immediate.is_empty() {
        return Ok(());
    }
    let store = ctx.runtime.thread_store();
    if store
        .kv_get(&ctx.auth, &ctx.thread_id, IMMEDIATE_KEY)
        .await?
        .is_some()
    {
        return Ok(());
    }
    // Marked first: a crash in between loses the activation rather than creating twice.
    mark_now(&*store, &ctx.auth, &ctx.thread_id, IMMEDIATE_KEY).await?;
    let first_message = history
        .iter()
        .find(|m| m.role == LlmRole::User)
        .map(|m| m.content.clone());
    let environment = ctx.thread.host.environment();
    for spec in immediate {
        let bootstrap = spec.immediate.as_ref().cloned().unwrap_or_default();
        // Only nameEnv and descriptionEnv reach the call's arguments (model-visible);
        // scoped variables are read by the tool itself.
        let name = bootstrap
            .name_env
            .as_deref()
            .and_then(|var| environment.var(var))
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| spec.name.clone());
        let message = bootstrap
            .description_env
            .as_deref()
            .and_then(|var| environment.var(var))
            .filter(|v| !v.trim().is_empty())
            .or_else(|| first_message.clone())
            .unwrap_or_else(|| "Begin.".to_owned());
        let mut args = serde_json::Map::new();
        args.insert("subagent".into(), json!(spec.name));
        args.insert(spec.init_agent_name_property.clone(), json!(name));
        args.insert(spec.init_user_message_property.clone(), json!(message));
        ctx.thread
            .queue_tool(SUBAGENT_CREATE_TOOL, Value::Object(args))
            .await?;
    }
    Ok(())
}

pub(super) fn string_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

pub(super) fn attachments_arg(args: &Value, key: &str) -> Vec<String> {
    args.get(key)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

pub(super) struct CreateTool {
    pub(super) specs: Specs,
}

pub(super) struct MessageTool {
    pub(super) specs: Specs,
}

#[async_trait]
impl Tool for CreateTool {
    fn name(&self) -> &str {
        SUBAGENT_CREATE_TOOL
    }

    fn description(&self) -> &str {
        "Create a subagent on a thread of its own and give it a task. By default waits for \
         its answer; with `wait: false` returns at once and the answer arrives later as a \
         message. Files it should see go in the attachments list (keel-attachment:// \
         references of this thread)."
    }

    fn parameters(&self) -> Value {
        let mut properties = serde_json::Map::new();
        let kinds: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
        let described: Vec<String> = self
            .specs
            .iter()
            .map(|s| format!("`{}`: {}", s.name, s.description))
            .collect();
        properties.insert(
            "subagent".into(),
            json!({"type": "string", "enum": kinds,
                   "description": format!("Which subagent to create ({}).", described.join("; "))}),
        );
        for spec in self.specs.iter() {
            properties.insert(
                spec.init_agent_name_property.clone(),
                json!({"type": "string", "minLength": 1, "description": "A unique name for this instance."}),
            );
            properties.insert(
                spec.init_user_message_property.clone(),
                json!({"type": "string", "description": "The task for the subagent."}),
            );
            properties.insert(
                spec.init_attachments_property.clone(),
                json!({"type": "array", "items": {"type": "string"},
                       "description": "Attachments of this thread to hand to the subagent."}),
            );
        }
        properties.insert(
            "wait".into(),
            json!({"type": "boolean", "description": "Wait for the answer (default true)."}),
        );
        let mut required: Vec<String> = Vec::new();
        if self.specs.len() > 1 {
            required.push("subagent".into());
        }
        let first = &self.specs[0];
        for prop in [
            &first.init_agent_name_property,
            &first.init_user_message_property,
        ] {
            if self.specs.iter().all(|s| {
                &s.init_agent_name_property == prop || &s.init_user_message_property == prop
            }) {
                required.push(prop.clone());
            }
        }
        json!({"type": "object", "properties": properties, "required": required})
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let tool = SUBAGENT_CREATE_TOOL;
        let spec =
            match string_arg(&args, "subagent") {
                Some(kind) => self.specs.iter().find(|s| s.name == kind).ok_or_else(|| {
                    tool_error(tool, format!("there is no subagent kind `{kind}`"))
                })?,
                None if self.specs.len() == 1 => &self.specs[0],
                None => {
                    return Err(tool_error(
                        tool,
                        "say which `subagent` to create".to_string(),
                    ))
                }
            };
        let name = string_arg(&args, &spec.init_agent_name_property)
            .map(str::trim)
            .unwrap_or_default();
        if name.is_empty() {
            return Err(tool_error(
                tool,
                format!(
                    "`{}` must be a non-empty name for the new subagent",
                    spec.init_agent_name_property
                ),
            ));
        }
        let message = string_arg(&args, &spec.init_user_message_property)
            .unwrap_or_default()
            .to_owned();
        if message.trim().is_empty() {
            return Err(tool_error(
                tool,
                format!(
                    "`{}` must hold the task for the subagent",
                    spec.init_user_message_property
                ),
            ));
        }
        let attachments = attachments_arg(&args, &spec.init_attachments_property);
        let wait = args.get("wait").and_then(Value::as_bool).unwrap_or(true);
        let origin = Origin::from_ctx(ctx);
        check_room(spec, &origin.parent, name).await?;

        // Scoped variables come from the parent's environment; a missing one defers the
        // creation to a completion request (§7.5).
        let environment = origin.parent.host.environment().clone();
        let mut scoped = Vec::new();
        let mut missing = Vec::new();
        for var in &spec.scoped_env {
            match environment.var(var) {
                Some(value) => scoped.push((var.clone(), value)),
                None => missing.push(var.clone()),
            }
        }
        if !missing.is_empty() {
            let request = PendingRecord {
                request_id: keel_core::RunId::new().as_str().to_owned(),
                parent_thread_id: origin.parent.thread_id.clone(),
                subagent: spec.name.clone(),
                name: name.to_owned(),
                message,
                attachments,
                missing,
                run: origin.run.clone(),
                created_at: Utc::now().to_rfc3339(),
            };
            origin
                .runtime()
                .thread_store()
                .kv_set(
                    &origin.auth,
                    &origin.parent.thread_id,
                    &format!("{PENDING_PREFIX}{}", request.request_id),
                    serde_json::to_value(&request).map_err(AgentError::internal)?,
                )
                .await?;
            let path = format!(
                "/threads/{}/variables/{}",
                request.parent_thread_id, request.request_id
            );
            let error = SubagentBootstrapPayload {
                error: "scoped_variables_missing".to_owned(),
                subagent: spec.name.clone(),
                name: name.to_owned(),
                request_id: request.request_id,
                missing: request.missing,
                complete: ScopedVariablesRoute {
                    get: format!("GET {path}"),
                    post: format!("POST {path}"),
                },
                note: "the subagent starts as soon as the missing variables are provided"
                    .to_owned(),
            };
            // The model gets the same object as its tool's error.
            let text = serde_json::to_value(&error)
                .map_err(AgentError::internal)?
                .to_string();
            origin
                .emit(RunEvent::subagent_bootstrap_required(error))
                .await;
            return Err(tool_error(tool, text));
        }
        start_child(spec, &origin, name, message, &attachments, &scoped, wait)
            .await
            .map(|(_, result)| result)
    }
}

#[async_trait]
impl Tool for MessageTool {
    fn name(&self) -> &str {
        SUBAGENT_MESSAGE_TOOL
    }

    fn description(&self) -> &str {
        "Send a message to a subagent you created earlier (by its name). By default waits for \
         its answer; with `wait: false` returns at once."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "message": {"type": "string"},
                "attachments": {"type": "array", "items": {"type": "string"}},
                "wait": {"type": "boolean"}
            },
            "required": ["name", "message"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let tool = SUBAGENT_MESSAGE_TOOL;
        let name = string_arg(&args, "name").unwrap_or_default().trim();
        let text = string_arg(&args, "message").unwrap_or_default().to_owned();
        let origin = Origin::from_ctx(ctx);
        let live = live_children(&origin.parent).await?;
        let Some(child) = live.iter().find(|c| c.name == name) else {
            let names: Vec<String> = live.iter().map(|c| format!("`{}`", c.name)).collect();
            let existing = if names.is_empty() {
                "there are none".to_owned()
            } else {
                format!("these exist: {}", names.join(", "))
            };
            return Err(tool_error(
                tool,
                format!(
                    "no live subagent is named `{name}` ({existing}); create one with \
                     `{SUBAGENT_CREATE_TOOL}`"
                ),
            ));
        };
        if !child.resumable {
            return Err(tool_error(
                tool,
                format!("subagent `{name}` is not resumable; create a new one instead"),
            ));
        }
        let Some(spec) = spec_of(&self.specs, child) else {
            return Err(tool_error(
                tool,
                format!("subagent `{name}` belongs to no kind this agent knows"),
            ));
        };
        let message = child_message(
            &origin,
            &child.thread_id,
            text,
            &attachments_arg(&args, "attachments"),
        )
        .await?;
        ctx.runtime
            .thread_store()
            .set_child_status(&ctx.auth, &child.thread_id, "running")
            .await?;
        origin
            .emit(RunEvent::subagent_messaged(SubagentMessagedPayload {
                subagent: spec.name.clone(),
                name: name.to_owned(),
                child_thread_id: child.thread_id.clone(),
                attachments: file_uris(&message),
            }))
            .await;
        let wait = args.get("wait").and_then(Value::as_bool).unwrap_or(true);
        deliver(spec, &origin, child, message, wait).await
    }
}

/// A tool for a subagent's own model: report progress to the parent's registry without
/// ending the run (`sessionStatus`, §8.3). The status shows in the parent's
/// [`children`](crate::ThreadState::children); a `subagent.status` event marks it.
///
/// ```
/// use keel_agent::{Agent, SessionStatusTool};
/// use keel_core::AgentCard;
/// let child = Agent::builder(AgentCard::new("researcher", "Researches", "http://127.0.0.1:0"))
///     .tool(SessionStatusTool)
///     .build()
///     .unwrap();
/// assert!(child.tool_specs().iter().any(|t| t.name == "session_status"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionStatusTool;

#[async_trait]
impl Tool for SessionStatusTool {
    fn name(&self) -> &str {
        SESSION_STATUS_TOOL
    }

    fn description(&self) -> &str {
        "Tell the agent that created you how far you are (a short status such as \
         `searching` or `halfway`); you keep working."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"status": {"type": "string", "minLength": 1, "maxLength": 200}},
            "required": ["status"]
        })
    }

    fn idempotent(&self) -> bool {
        true
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let status = string_arg(&args, "status").unwrap_or_default().trim();
        if status.is_empty() {
            return Err(tool_error(
                SESSION_STATUS_TOOL,
                "`status` must not be empty",
            ));
        }
        let Some(parent) = ctx.thread.parent().await? else {
            return Err(tool_error(
                SESSION_STATUS_TOOL,
                "this thread is not a subagent; there is no parent to report to",
            ));
        };
        ctx.thread.set_status(status).await?;
        ctx.emit(RunEvent::subagent_status(SubagentStatusPayload {
            child_thread_id: ctx.thread_id.clone(),
            parent_thread_id: parent,
            status: status.to_owned(),
        }))
        .await;
        Ok(json!({"status": status}))
    }
}
