//! Subagents (Standard Agents §7–§8): child agents that run on child threads of their own,
//! linked to the parent thread in the store's [`SubagentRegistry`](keel_runtime::SubagentRegistry).
//!
//! A [`SubagentSpec`] registered on the parent's builder gives the parent's model the built-in
//! tools `subagent_create` and (when a spec is resumable) `subagent_message`. A call creates
//! (or reuses) a child thread, registers it as a [`ChildThread`], and sends the message to the
//! child's own [`AgentExecutor`] on the same runtime with a child [`RunContext`] (new run id,
//! `parent_run_id`, `agent_chain` extended, same trace, permissions and budget).
//!
//! The child's result is delivered to the parent exactly once:
//! - by default (`wait` true) the call blocks and the child's answer (or failure) is the tool
//!   result the parent's model sees;
//! - with `wait: false` the call returns at once, and when the child's task ends a message
//!   carrying the child's name and a result summary is queued on the parent thread — with
//!   [`ParentCommunication::Auto`] only; with [`ParentCommunication::Explicit`] nothing is
//!   queued and the child uses [`ThreadState::notify_parent`](crate::ThreadState::notify_parent).
//!
//! Non-resumable children are terminated once they delivered. Canceling the parent's run while
//! it waits cancels the child's task; terminating the parent thread terminates its children.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::{AgentError, AgentResult, Message, Task, TaskState, ThreadId};
use keel_runtime::{AuthContext, ChildThread};
use serde_json::{json, Value};

use crate::{AgentExecutor, SendOptions, Tool, ToolContext};

/// The name of the built-in tool that creates a subagent.
pub const SUBAGENT_CREATE_TOOL: &str = "subagent_create";
/// The name of the built-in tool that messages an existing (resumable) subagent.
pub const SUBAGENT_MESSAGE_TOOL: &str = "subagent_message";

/// Registry metadata key: the spec a child was created from.
const META_SPEC: &str = "subagent";
/// Registry metadata key: how the child talks back to its parent.
const META_COMMUNICATION: &str = "parent_communication";

/// How a child's completion or failure reaches its parent when the parent does not wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParentCommunication {
    /// A message with the child's name and a result summary is queued on the parent thread.
    #[default]
    Auto,
    /// Nothing is queued; the child reports with `notify_parent` / `set_status`.
    Explicit,
}

impl ParentCommunication {
    fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Explicit => "explicit",
        }
    }
}

/// A kind of subagent the parent's model may create: a child agent with its own executor on
/// the parent's runtime, and the rules for its instances.
///
/// ```
/// use std::sync::Arc;
/// use keel_agent::{Agent, AgentExecutor, SubagentSpec};
/// use keel_core::AgentCard;
/// use keel_llm::MockLlm;
/// use keel_runtime::{InMemoryRuntime, Runtime};
/// let runtime: Arc<dyn Runtime> = Arc::new(InMemoryRuntime::new(Arc::new(MockLlm::new())));
/// let child = Agent::builder(AgentCard::new("researcher", "Researches", "http://127.0.0.1:0"))
///     .build()
///     .unwrap();
/// let parent = Agent::builder(AgentCard::new("lead", "Delegates", "http://127.0.0.1:0"))
///     .subagent(
///         SubagentSpec::new("researcher", AgentExecutor::new(child, runtime.clone()))
///             .max_instances(2)
///             .resumable(true),
///     )
///     .build()
///     .unwrap();
/// assert!(parent.tool_specs().iter().any(|t| t.name == "subagent_create"));
/// ```
#[derive(Clone)]
pub struct SubagentSpec {
    name: String,
    description: String,
    executor: AgentExecutor,
    max_instances: Option<usize>,
    resumable: bool,
    parent_communication: ParentCommunication,
    init_user_message_property: String,
    init_agent_name_property: String,
}

impl std::fmt::Debug for SubagentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentSpec")
            .field("name", &self.name)
            .field("agent", &self.executor.agent().card().name)
            .field("max_instances", &self.max_instances)
            .field("resumable", &self.resumable)
            .field("parent_communication", &self.parent_communication)
            .finish_non_exhaustive()
    }
}

impl SubagentSpec {
    /// A subagent kind named `name`, run by `executor` (which should share the parent's
    /// runtime, so that the registry and both threads live in the same store).
    pub fn new(name: impl Into<String>, executor: AgentExecutor) -> Self {
        let description = executor.agent().card().description.clone();
        Self {
            name: name.into(),
            description,
            executor,
            max_instances: None,
            resumable: false,
            parent_communication: ParentCommunication::Auto,
            init_user_message_property: "message".into(),
            init_agent_name_property: "name".into(),
        }
    }

    /// What the subagent is for, for the parent's model (default: the child card's
    /// description).
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The most live (not terminated) instances the parent thread may hold at once.
    #[must_use]
    pub fn max_instances(mut self, max: usize) -> Self {
        self.max_instances = Some(max);
        self
    }

    /// Whether instances stay alive after answering, to be messaged again.
    #[must_use]
    pub fn resumable(mut self, resumable: bool) -> Self {
        self.resumable = resumable;
        self
    }

    /// How a child's result reaches the parent when the parent does not wait.
    #[must_use]
    pub fn parent_communication(mut self, mode: ParentCommunication) -> Self {
        self.parent_communication = mode;
        self
    }

    /// The `subagent_create` argument holding the initial user message
    /// (`initUserMessageProperty`, default `message`).
    #[must_use]
    pub fn init_user_message_property(mut self, property: impl Into<String>) -> Self {
        self.init_user_message_property = property.into();
        self
    }

    /// The `subagent_create` argument holding the child's display name
    /// (`initAgentNameProperty`, default `name`).
    #[must_use]
    pub fn init_agent_name_property(mut self, property: impl Into<String>) -> Self {
        self.init_agent_name_property = property.into();
        self
    }

    /// The kind's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's executor.
    pub fn executor(&self) -> &AgentExecutor {
        &self.executor
    }
}

/// The specs of one parent agent, shared by its built-in tools.
pub(crate) type Specs = Arc<Vec<SubagentSpec>>;

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

/// Terminate every registered child of `parent` whose spec is known (best effort): called
/// when the parent thread is terminated.
pub(crate) async fn terminate_children(
    specs: &Specs,
    auth: &AuthContext,
    children: Vec<ChildThread>,
) {
    for child in children {
        if child.status == "terminated" {
            continue;
        }
        let Some(spec) = spec_of(specs, &child) else {
            continue;
        };
        if let Err(err) = spec
            .executor
            .thread(auth, child.thread_id.clone())
            .terminate()
            .await
        {
            tracing::warn!(error = %err, child = %child.thread_id, "could not terminate a subagent");
        }
    }
}

fn spec_of<'a>(specs: &'a Specs, child: &ChildThread) -> Option<&'a SubagentSpec> {
    let kind = child.metadata.get(META_SPEC).and_then(Value::as_str)?;
    specs.iter().find(|s| s.name == kind)
}

fn string_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn tool_error(tool: &str, message: impl Into<String>) -> AgentError {
    AgentError::ToolFailed {
        tool: tool.to_owned(),
        message: message.into(),
    }
}

/// Live instances: registered and not terminated.
async fn live_children(ctx: &ToolContext) -> AgentResult<Vec<ChildThread>> {
    Ok(ctx
        .thread
        .children()
        .await?
        .into_iter()
        .filter(|c| c.status != "terminated")
        .collect())
}

struct CreateTool {
    specs: Specs,
}

struct MessageTool {
    specs: Specs,
}

#[async_trait]
impl Tool for CreateTool {
    fn name(&self) -> &str {
        SUBAGENT_CREATE_TOOL
    }

    fn description(&self) -> &str {
        "Create a subagent on a thread of its own and give it a task. By default waits for \
         its answer; with `wait: false` returns at once and the answer arrives later as a \
         message."
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
        let live = live_children(ctx).await?;
        if let Some(existing) = live.iter().find(|c| c.name == name) {
            let hint = if existing.resumable {
                format!("send it a message with `{SUBAGENT_MESSAGE_TOOL}` instead")
            } else {
                "choose another name".to_owned()
            };
            return Err(tool_error(
                tool,
                format!("a subagent named `{name}` already exists; {hint}"),
            ));
        }
        let instances: Vec<&ChildThread> = live
            .iter()
            .filter(|c| c.metadata.get(META_SPEC).and_then(Value::as_str) == Some(&spec.name))
            .collect();
        if let Some(max) = spec.max_instances {
            if instances.len() >= max {
                let names: Vec<String> =
                    instances.iter().map(|c| format!("`{}`", c.name)).collect();
                let instead = if spec.resumable {
                    format!("send a message to one of them with `{SUBAGENT_MESSAGE_TOOL}` instead")
                } else {
                    "wait for one of them to finish, or do the work yourself".to_owned()
                };
                return Err(tool_error(
                    tool,
                    format!(
                        "cannot create another `{}` subagent: at most {max} may exist at once, \
                         and these exist: {}; {instead}",
                        spec.name,
                        names.join(", ")
                    ),
                ));
            }
        }
        let child_thread = ThreadId::new();
        let mut metadata = keel_core::Metadata::default();
        metadata.insert(META_SPEC.into(), json!(spec.name));
        metadata.insert(
            META_COMMUNICATION.into(),
            json!(spec.parent_communication.as_str()),
        );
        let entry = ChildThread {
            thread_id: child_thread.clone(),
            parent_thread_id: ctx.thread_id.clone(),
            name: name.to_owned(),
            agent: spec.executor.agent().card().name.clone(),
            status: "running".into(),
            resumable: spec.resumable,
            created_at: Utc::now(),
            metadata,
        };
        ctx.runtime
            .thread_store()
            .register_child(&ctx.auth, &entry)
            .await?;
        let wait = args.get("wait").and_then(Value::as_bool).unwrap_or(true);
        deliver(spec, ctx, &entry, message, wait).await
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
                "wait": {"type": "boolean"}
            },
            "required": ["name", "message"]
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let tool = SUBAGENT_MESSAGE_TOOL;
        let name = string_arg(&args, "name").unwrap_or_default().trim();
        let message = string_arg(&args, "message").unwrap_or_default().to_owned();
        let live = live_children(ctx).await?;
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
        ctx.runtime
            .thread_store()
            .set_child_status(&ctx.auth, &child.thread_id, "running")
            .await?;
        let wait = args.get("wait").and_then(Value::as_bool).unwrap_or(true);
        deliver(spec, ctx, child, message, wait).await
    }
}

/// Send `text` to the child and deliver its result: as the tool result when the parent
/// waits, else (auto communication) as a message queued on the parent thread.
async fn deliver(
    spec: &SubagentSpec,
    ctx: &ToolContext,
    child: &ChildThread,
    text: String,
    wait: bool,
) -> AgentResult<Value> {
    let child_exec = spec.executor.clone();
    let mut run = ctx.run.child(child.agent.clone());
    run.thread_id = Some(child.thread_id.clone());
    let message = Message::user(text).in_thread(child.thread_id.clone());
    let submitted = child_exec
        .send_message(
            &ctx.auth,
            message,
            SendOptions {
                return_immediately: true,
                run_context: Some(run),
                ..Default::default()
            },
        )
        .await?;
    let task_id = submitted.id.clone();
    // Canceling the parent's run cancels the child's task (the tool's own future may be
    // dropped at that moment, so the watch runs on its own).
    let cancel_watch = {
        let (exec, auth, token, task_id) = (
            child_exec.clone(),
            ctx.auth.clone(),
            ctx.cancel.clone(),
            task_id.clone(),
        );
        tokio::spawn(async move {
            token.cancelled().await;
            let _ = exec
                .cancel_task(&auth, &task_id, Some("parent canceled".into()))
                .await;
        })
    };
    if wait {
        let outcome = child_exec.wait_for_rest(&ctx.auth, &task_id).await;
        cancel_watch.abort();
        let task = outcome?;
        settle(spec, &ctx.auth, child, &task, None).await?;
        let summary = summary(&task);
        return match task.state() {
            TaskState::Completed => Ok(json!({"subagent": child.name, "result": summary})),
            state => Err(tool_error(
                SUBAGENT_CREATE_TOOL,
                format!("subagent `{}` ended {state}: {summary}", child.name),
            )),
        };
    }
    // Not waiting: the child's end is delivered to the parent thread later.
    let parent = ctx.thread.clone();
    let name = child.name.clone();
    let (spec, auth, child) = (spec.clone(), ctx.auth.clone(), child.clone());
    tokio::spawn(async move {
        let outcome = spec.executor.wait_for_rest(&auth, &task_id).await;
        cancel_watch.abort();
        match outcome {
            Ok(task) => {
                if let Err(err) = settle(&spec, &auth, &child, &task, Some(&parent)).await {
                    tracing::warn!(error = %err, child = %child.thread_id, "could not deliver a subagent's result");
                }
            }
            Err(err) => tracing::warn!(error = %err, "lost track of a subagent's task"),
        }
    });
    Ok(json!({
        "subagent": name,
        "status": "started",
        "note": "the answer will arrive as a message"
    }))
}

/// After the child's task rests: update the registry, queue the result on the parent when
/// asked to (auto communication), and terminate a non-resumable child.
async fn settle(
    spec: &SubagentSpec,
    auth: &AuthContext,
    child: &ChildThread,
    task: &Task,
    notify: Option<&crate::ThreadState>,
) -> AgentResult<()> {
    let child_state = spec.executor.thread(auth, child.thread_id.clone());
    child_state.set_status(&task.state().to_string()).await?;
    if let Some(parent) = notify {
        if spec.parent_communication == ParentCommunication::Auto {
            let verb = match task.state() {
                TaskState::Completed => "completed",
                TaskState::Failed => "failed",
                TaskState::Canceled => "was canceled",
                _ => "needs input",
            };
            parent
                .queue_message(format!(
                    "[subagent {}] {verb}: {}",
                    child.name,
                    summary(task)
                ))
                .await?;
        }
    }
    if !spec.resumable && task.state().is_terminal() {
        child_state.terminate().await?;
    }
    Ok(())
}

/// The child's answer or failure as text.
fn summary(task: &Task) -> String {
    task.status()
        .message
        .as_ref()
        .map(Message::text)
        .unwrap_or_default()
}
