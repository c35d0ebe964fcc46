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
//! Files cross thread boundaries by copy (§8.1–§8.2): attachments named in the parent's call
//! (`initAttachmentsProperty`) are copied into the child's attachment store and the child's
//! message refers to the copies; attachments the child's result refers to are copied back
//! into the parent's store and the result rewritten to refer to those.
//!
//! A kind may be `optional` (it exists only when an environment flag is on), `immediate` (it
//! is created before the parent's first model step, recursively) and may need *scoped
//! variables*: values from the parent's environment handed to the child sealed at rest and
//! never shown to a model. When one is missing, `subagent_create` answers a structured
//! bootstrap error and keeps a pending request that
//! [`AgentExecutor::provide_variables`] completes (§7.5).
//!
//! Every step leaves a marker in the parent run's event stream: `subagent.created`,
//! `subagent.messaged`, `subagent.returned`, `subagent.failed`,
//! `subagent.bootstrap_required`; a child reporting progress with [`SessionStatusTool`] emits
//! `subagent.status` in its own run.
//!
//! Non-resumable children are terminated once they delivered. Canceling the parent's run while
//! it waits cancels the child's task; terminating the parent thread terminates its children.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::{
    AgentError, AgentResult, FileContent, Message, Part, PartContent, RunContext, Task, TaskState,
    ThreadId,
};
use keel_events::{EventType, RunEvent};
use keel_llm::{LlmMessage, LlmRole};
use keel_runtime::{AuthContext, ChildThread};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::attachments::{copy_attachment, parse_uri, references_in};
use crate::executor::{Inner, QueuedWork};
use crate::observe::RunObs;
use crate::{AgentExecutor, Environment, SendOptions, ThreadState, Tool, ToolContext};

/// The name of the built-in tool that creates a subagent.
pub const SUBAGENT_CREATE_TOOL: &str = "subagent_create";
/// The name of the built-in tool that messages an existing (resumable) subagent.
pub const SUBAGENT_MESSAGE_TOOL: &str = "subagent_message";
/// The name of [`SessionStatusTool`].
pub const SESSION_STATUS_TOOL: &str = "session_status";

/// Registry metadata key: the spec a child was created from.
const META_SPEC: &str = "subagent";
/// Registry metadata key: the parent's agent (card name), whose scheduler wakes the parent
/// thread when a result is queued on it from another process.
const META_PARENT_AGENT: &str = "parent_agent";
/// Registry metadata key: how the child talks back to its parent.
const META_COMMUNICATION: &str = "parent_communication";
/// Child thread key-value store: sealed scoped variables, one key each.
const SCOPED_PREFIX: &str = "keel:scoped:";
/// How long a completion of scoped variables holds its request against concurrent ones.
const VARIABLES_CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(300);
/// Parent thread key-value store: pending scoped-variable requests, one key each.
const PENDING_PREFIX: &str = "keel:variables:";
/// Parent thread key-value store: set once the immediate kinds were started.
const IMMEDIATE_KEY: &str = "keel:immediate_activated";
/// Run-context metadata of a child task the parent does not wait for: where its result
/// goes. It travels in the child task's own snapshot, so the child's completion path can
/// deliver the result whichever process finishes it.
const META_DELIVERY: &str = "keel.subagent_delivery";

/// The marker types this module emits.
const EVENT_CREATED: &str = "subagent.created";
const EVENT_MESSAGED: &str = "subagent.messaged";
const EVENT_RETURNED: &str = "subagent.returned";
const EVENT_FAILED: &str = "subagent.failed";
const EVENT_STATUS: &str = "subagent.status";
const EVENT_BOOTSTRAP: &str = "subagent.bootstrap_required";

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

/// The object form of `immediate` (§7.3–§7.4): which environment variables name the child and
/// describe its task (both model-visible), and which are handed to it as scoped variables
/// (runtime-only: sealed at rest, never in a prompt).
///
/// ```
/// use keel_agent::ImmediateEnv;
/// let bootstrap = ImmediateEnv::new()
///     .name_env("SCOUT_NAME")
///     .description_env("SCOUT_TASK")
///     .scoped_env(["SCOUT_API_TOKEN"]);
/// # let _ = bootstrap;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImmediateEnv {
    name_env: Option<String>,
    description_env: Option<String>,
    scoped_env: Vec<String>,
}

impl ImmediateEnv {
    /// No hints: the child is named after its kind and given the parent's first message.
    pub fn new() -> Self {
        Self::default()
    }

    /// The variable whose value names the child (`nameEnv`).
    #[must_use]
    pub fn name_env(mut self, var: impl Into<String>) -> Self {
        self.name_env = Some(var.into());
        self
    }

    /// The variable whose value is the child's task (`descriptionEnv`).
    #[must_use]
    pub fn description_env(mut self, var: impl Into<String>) -> Self {
        self.description_env = Some(var.into());
        self
    }

    /// Variables handed to the child as scoped variables (`scopedEnv`).
    #[must_use]
    pub fn scoped_env<I, S>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scoped_env = vars.into_iter().map(Into::into).collect();
        self
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
/// use keel_runtime::{Runtime, Services};
/// let runtime: Arc<dyn Runtime> = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
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
    init_attachments_property: String,
    optional: Option<String>,
    immediate: Option<ImmediateEnv>,
    scoped_env: Vec<String>,
}

impl std::fmt::Debug for SubagentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentSpec")
            .field("name", &self.name)
            .field("agent", &self.executor.agent().card().name)
            .field("max_instances", &self.max_instances)
            .field("resumable", &self.resumable)
            .field("parent_communication", &self.parent_communication)
            .field("optional", &self.optional)
            .field("immediate", &self.immediate)
            .field("scoped_env", &self.scoped_env)
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
            init_attachments_property: "attachments".into(),
            optional: None,
            immediate: None,
            scoped_env: Vec::new(),
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

    /// The `subagent_create` argument holding the parent's attachments to hand to the child
    /// (`initAttachmentsProperty`, default `attachments`): a list of `keel-attachment://`
    /// references of the parent thread, copied into the child's store.
    #[must_use]
    pub fn init_attachments_property(mut self, property: impl Into<String>) -> Self {
        self.init_attachments_property = property.into();
        self
    }

    /// Offer this kind only when the environment flag `var` is `true`, `1` or `yes` (any
    /// case) in the parent agent's [`Environment`] when the parent is built (§7.3).
    #[must_use]
    pub fn optional(mut self, var: impl Into<String>) -> Self {
        self.optional = Some(var.into());
        self
    }

    /// Create one instance before the parent's first model step on a thread (§7.3), named
    /// after the kind and given the parent's first message.
    #[must_use]
    pub fn immediate(mut self, on: bool) -> Self {
        self.immediate = on.then(ImmediateEnv::new);
        self
    }

    /// Like [`SubagentSpec::immediate`], with the object form's environment hints; its
    /// `scoped_env` becomes the kind's [`SubagentSpec::scoped_env`].
    #[must_use]
    pub fn immediate_with(mut self, bootstrap: ImmediateEnv) -> Self {
        if !bootstrap.scoped_env.is_empty() {
            self.scoped_env = bootstrap.scoped_env.clone();
        }
        self.immediate = Some(bootstrap);
        self
    }

    /// Variables of the parent's environment every instance needs, handed over sealed (§7.5).
    #[must_use]
    pub fn scoped_env<I, S>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scoped_env = vars.into_iter().map(Into::into).collect();
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

/// The kinds that exist in `environment`: `optional` ones only when their flag is on.
pub(crate) fn enabled_specs(
    specs: Vec<SubagentSpec>,
    environment: &Environment,
) -> Vec<SubagentSpec> {
    specs
        .into_iter()
        .filter(|s| {
            s.optional
                .as_deref()
                .is_none_or(|flag| environment.flag(flag))
        })
        .collect()
}

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

/// Before the first model step on a thread: queue a `subagent_create` call for every
/// `immediate` kind, so it runs (and its result is in the history) before the model is
/// called. A child whose own agent has immediate kinds does the same on its first run, so
/// activation is recursive. Runs once per thread.
pub(crate) async fn activate_immediate(
    agent: &crate::Agent,
    ctx: &ToolContext,
    history: &[LlmMessage],
) -> AgentResult<()> {
    let immediate: Vec<&SubagentSpec> = agent
        .subagents
        .iter()
        .filter(|s| s.immediate.is_some())
        .collect();
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
    store
        .kv_set(
            &ctx.auth,
            &ctx.thread_id,
            IMMEDIATE_KEY,
            json!(Utc::now().to_rfc3339()),
        )
        .await?;
    let first_message = history
        .iter()
        .find(|m| m.role == LlmRole::User)
        .map(|m| m.content.clone());
    let environment = agent.environment();
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

fn spec_of<'a>(specs: &'a Specs, child: &ChildThread) -> Option<&'a SubagentSpec> {
    let kind = child.metadata.get(META_SPEC).and_then(Value::as_str)?;
    specs.iter().find(|s| s.name == kind)
}

fn string_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn attachments_arg(args: &Value, key: &str) -> Vec<String> {
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

fn tool_error(tool: &str, message: impl Into<String>) -> AgentError {
    AgentError::ToolFailed {
        tool: tool.to_owned(),
        message: message.into(),
    }
}

/// Where a delivery comes from: the parent's thread and run (a tool call, or the completion
/// of a scoped-variable request outside any run).
#[derive(Clone)]
struct Origin {
    auth: AuthContext,
    run: RunContext,
    parent: ThreadState,
    cancel: CancellationToken,
    events: Option<Arc<RunObs>>,
}

impl Origin {
    fn from_ctx(ctx: &ToolContext) -> Self {
        Self {
            auth: ctx.auth.clone(),
            run: ctx.run.clone(),
            parent: ctx.thread.clone(),
            cancel: ctx.cancel.clone(),
            events: ctx.events.clone(),
        }
    }

    async fn emit(&self, kind: &'static str, summary: String, payload: Value) {
        if let Some(events) = &self.events {
            events
                .emit(RunEvent::builder(EventType::new(kind), summary).payload(payload))
                .await;
        }
    }

    fn runtime(&self) -> &dyn keel_runtime::Runtime {
        self.parent.inner.runtime.as_ref()
    }
}

/// Live instances: registered and not terminated.
async fn live_children(parent: &ThreadState) -> AgentResult<Vec<ChildThread>> {
    Ok(parent
        .children()
        .await?
        .into_iter()
        .filter(|c| c.status != "terminated")
        .collect())
}

/// Whether one more instance named `name` of `spec` may be created; the error tells the model
/// what to do instead.
async fn check_room(spec: &SubagentSpec, parent: &ThreadState, name: &str) -> AgentResult<()> {
    let tool = SUBAGENT_CREATE_TOOL;
    let live = live_children(parent).await?;
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
            let names: Vec<String> = instances.iter().map(|c| format!("`{}`", c.name)).collect();
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
    Ok(())
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
        let environment = origin.parent.inner.agent.environment().clone();
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
            let error = json!({
                "error": "scoped_variables_missing",
                "subagent": spec.name,
                "name": name,
                "request_id": request.request_id,
                "missing": request.missing,
                "complete": {"get": format!("GET {path}"), "post": format!("POST {path}")},
                "note": "the subagent starts as soon as the missing variables are provided"
            });
            origin
                .emit(
                    EVENT_BOOTSTRAP,
                    format!("subagent `{name}` waits for scoped variables"),
                    error.clone(),
                )
                .await;
            return Err(tool_error(tool, error.to_string()));
        }
        start_child(spec, &origin, name, message, &attachments, &scoped, wait)
            .await
            .map(|(_, result)| result)
    }
}

/// Create the child thread: copy its attachments and seal its scoped variables into it,
/// register it, and deliver its first message.
async fn start_child(
    spec: &SubagentSpec,
    origin: &Origin,
    name: &str,
    text: String,
    attachments: &[String],
    scoped: &[(String, String)],
    wait: bool,
) -> AgentResult<(ChildThread, Value)> {
    let child_thread = ThreadId::new();
    // Everything the child needs is in its thread before it is registered or messaged.
    let message = child_message(origin, &child_thread, text, attachments).await?;
    let environment = origin.parent.inner.agent.environment();
    for (var, value) in scoped {
        let sealed = environment.seal(&scoped_context(&child_thread, var), value)?;
        origin
            .runtime()
            .thread_store()
            .kv_set(
                &origin.auth,
                &child_thread,
                &format!("{SCOPED_PREFIX}{var}"),
                json!(sealed),
            )
            .await?;
    }
    let mut metadata = keel_core::Metadata::default();
    metadata.insert(META_SPEC.into(), json!(spec.name));
    metadata.insert(
        META_PARENT_AGENT.into(),
        json!(origin.parent.inner.agent.card().name),
    );
    metadata.insert(
        META_COMMUNICATION.into(),
        json!(spec.parent_communication.as_str()),
    );
    let entry = ChildThread {
        thread_id: child_thread.clone(),
        parent_thread_id: origin.parent.thread_id.clone(),
        name: name.to_owned(),
        agent: spec.executor.agent().card().name.clone(),
        status: "running".into(),
        resumable: spec.resumable,
        created_at: Utc::now(),
        metadata,
    };
    origin
        .runtime()
        .thread_store()
        .register_child(&origin.auth, &entry)
        .await?;
    origin
        .emit(
            EVENT_CREATED,
            format!("subagent `{name}` created"),
            json!({
                "subagent": spec.name,
                "name": name,
                "child_thread_id": child_thread,
                "agent": entry.agent,
                "attachments": file_uris(&message),
                "wait": wait,
            }),
        )
        .await;
    let result = deliver(spec, origin, &entry, message, wait).await?;
    Ok((entry, result))
}

fn scoped_context(thread: &ThreadId, var: &str) -> String {
    format!("{thread}/{var}")
}

/// Read a sealed scoped variable of `thread`.
pub(crate) async fn read_scoped(thread: &ThreadState, var: &str) -> AgentResult<Option<String>> {
    let Some(sealed) = thread
        .inner
        .runtime
        .thread_store()
        .kv_get(
            &thread.auth,
            &thread.thread_id,
            &format!("{SCOPED_PREFIX}{var}"),
        )
        .await?
    else {
        return Ok(None);
    };
    let sealed = sealed.as_str().ok_or_else(|| {
        AgentError::storage(format!("scoped variable `{var}` is not a sealed string"))
    })?;
    thread
        .inner
        .agent
        .environment()
        .open(&scoped_context(&thread.thread_id, var), sealed)
        .map(Some)
}

/// The message for the child: the parent's attachments copied into the child's store, the
/// text's references to them rewritten to the copies, and the copies listed in the text (so
/// the child's model sees their child-local references) and as file parts.
async fn child_message(
    origin: &Origin,
    child_thread: &ThreadId,
    mut text: String,
    attachments: &[String],
) -> AgentResult<Message> {
    let mut files = Vec::new();
    for reference in attachments {
        let uri = match parse_uri(reference) {
            Some(_) => reference.clone(),
            None => crate::attachments::attachment_uri(&origin.parent.thread_id, reference),
        };
        let copy = copy_attachment(
            origin.runtime(),
            &origin.auth,
            &origin.parent.thread_id,
            child_thread,
            &uri,
        )
        .await
        .map_err(|e| tool_error(SUBAGENT_CREATE_TOOL, e.to_string()))?;
        if let Some(new_uri) = &copy.uri {
            text = text.replace(&uri, new_uri);
        }
        files.push(copy);
    }
    Ok(with_files(Message::user(text), files))
}

/// `message` with `files` listed at the end of its text and added as file parts.
fn with_files(message: Message, files: Vec<FileContent>) -> Message {
    if files.is_empty() {
        return message;
    }
    let listed: Vec<String> = files
        .iter()
        .map(|f| {
            format!(
                "- {} ({})",
                f.uri.as_deref().unwrap_or_default(),
                f.name.as_deref().unwrap_or("file")
            )
        })
        .collect();
    let text = format!("{}\n\nAttachments:\n{}", message.text(), listed.join("\n"));
    let mut out = Message::new(message.role, vec![Part::text(text)]);
    out.message_id = message.message_id;
    for file in files {
        out = out.with_part(Part::file(file));
    }
    out
}

fn file_uris(message: &Message) -> Vec<String> {
    message
        .parts
        .iter()
        .filter_map(|p| match &p.content {
            PartContent::File { file } => file.uri.clone(),
            _ => None,
        })
        .collect()
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
            .emit(
                EVENT_MESSAGED,
                format!("subagent `{name}` messaged"),
                json!({
                    "subagent": spec.name,
                    "name": name,
                    "child_thread_id": child.thread_id,
                    "attachments": file_uris(&message),
                }),
            )
            .await;
        let wait = args.get("wait").and_then(Value::as_bool).unwrap_or(true);
        deliver(spec, &origin, child, message, wait).await
    }
}

/// Where a background child's result goes (stored under [`META_DELIVERY`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeliveryMarker {
    parent_thread_id: ThreadId,
    subagent: String,
    name: String,
    communication: String,
}

/// Register `inner` as a parent of each of its kinds' executors, so that a child's result
/// queued on a parent thread wakes the executor that runs that thread.
pub(crate) fn link_parent(inner: &Arc<Inner>) {
    for spec in inner.agent.subagents.iter() {
        let mut parents = spec
            .executor
            .inner
            .parents
            .write()
            .unwrap_or_else(|p| p.into_inner());
        parents.retain(|p| p.strong_count() > 0);
        parents.push(Arc::downgrade(inner));
    }
}

/// Queue `message` on the parent thread of `child` (run by `child_inner`), durably, and make
/// sure the parent's executor runs it: woken at once when it lives in this process, and in
/// any case through a wake timer of the parent's agent (decision 53), which that agent's
/// scheduler, in whatever process claims it, turns into a worker for the parent thread. The
/// parent's executor, never the child's, runs it.
pub(crate) async fn queue_on_parent(
    child_inner: &Arc<Inner>,
    auth: &AuthContext,
    child: &ChildThread,
    message: Message,
) -> AgentResult<keel_runtime::QueuedItem> {
    let parent_thread = &child.parent_thread_id;
    let kind = child
        .metadata
        .get(META_SPEC)
        .and_then(Value::as_str)
        .unwrap_or_default();
    let store = child_inner.runtime.thread_store();
    if store
        .kv_get(auth, parent_thread, crate::thread_state::TERMINATED_KEY)
        .await?
        .is_some()
    {
        return Err(AgentError::ThreadTerminated {
            thread_id: parent_thread.clone(),
        });
    }
    let work = QueuedWork::Message {
        message: message.in_thread(parent_thread.clone()),
    };
    let payload = serde_json::to_value(&work).map_err(AgentError::internal)?;
    let item = store.push_queue(auth, parent_thread, payload).await?;
    let parents: Vec<Arc<Inner>> = child_inner
        .parents
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    let local = parents.iter().find(|p| {
        p.agent
            .subagents
            .iter()
            .any(|s| s.name == kind && Arc::ptr_eq(&s.executor.inner, child_inner))
    });
    if let Some(parent) = local {
        parent.schedule(auth, parent_thread);
    }
    // The registry names the parent's agent (written by the parent when it created the
    // child); a record from before that falls back to the local parent, if any.
    let parent_agent = child
        .metadata
        .get(META_PARENT_AGENT)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| local.map(|p| p.agent.card().name.clone()));
    match parent_agent {
        // Woken here already: the wake only guards against this process stopping before the
        // parent ran it, so it is due when a dead holder's lease would have lapsed.
        Some(agent) => {
            let at = match local {
                Some(parent) => {
                    Utc::now()
                        + chrono::Duration::from_std(parent.config.lease_ttl)
                            .unwrap_or_else(|_| chrono::Duration::seconds(30))
                }
                None => Utc::now(),
            };
            child_inner
                .request_wake(auth, parent_thread, &agent, at)
                .await;
        }
        None => tracing::debug!(
            parent = %parent_thread,
            "no parent agent known: the message waits for the next work on its thread"
        ),
    }
    Ok(item)
}

/// Called by the child's executor when one of its tasks rests: a task the parent did not
/// wait for delivers its result from here (registry status, attachments copied to the
/// parent, the message queued on the parent with auto communication, a non-resumable child
/// terminated). Failures are logged; the task's own state is persisted regardless.
pub(crate) async fn child_task_rested(inner: &Arc<Inner>, auth: &AuthContext, task: &Task) {
    let Ok(Some(run)) = RunContext::from_task(task) else {
        return;
    };
    let Some(marker) = run.metadata.get(META_DELIVERY) else {
        return;
    };
    let marker: DeliveryMarker = match serde_json::from_value(marker.clone()) {
        Ok(marker) => marker,
        Err(err) => {
            tracing::warn!(error = %err, task = %task.id, "malformed subagent delivery marker");
            return;
        }
    };
    if let Err(err) = deliver_from_child(inner, auth, task, &marker).await {
        tracing::warn!(error = %err, task = %task.id, "could not deliver a subagent's result");
    }
}

async fn deliver_from_child(
    inner: &Arc<Inner>,
    auth: &AuthContext,
    task: &Task,
    marker: &DeliveryMarker,
) -> AgentResult<()> {
    let store = inner.runtime.thread_store();
    // The registry, not the marker (which a caller could have put into a run context),
    // says who the parent is: a marker pointing elsewhere is ignored.
    let Some(child) = store.child(auth, &task.thread_id).await? else {
        return Ok(());
    };
    if child.parent_thread_id != marker.parent_thread_id {
        tracing::warn!(task = %task.id, "a subagent delivery marker names another parent; ignored");
        return Ok(());
    }
    store
        .set_child_status(auth, &child.thread_id, &task.state().to_string())
        .await?;
    if marker.communication == ParentCommunication::Auto.as_str() {
        let result = bring_back(
            inner.runtime.as_ref(),
            auth,
            &child.parent_thread_id,
            &child,
            task,
        )
        .await;
        let verb = match task.state() {
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "was canceled",
            _ => "needs input",
        };
        let message = with_files(
            Message::user(format!(
                "[subagent {}] {verb}: {}",
                marker.name, result.text
            )),
            result.files,
        );
        // A parent that is gone (terminated) does not keep the child alive.
        if let Err(err) = queue_on_parent(inner, auth, &child, message).await {
            tracing::warn!(error = %err, child = %child.thread_id, "could not queue a subagent's result on its parent");
        }
    }
    if !child.resumable && task.state().is_terminal() {
        // The child's only run is ending here: mark the thread terminated without canceling
        // that run (ThreadState::terminate would).
        store
            .kv_set(
                auth,
                &child.thread_id,
                crate::thread_state::TERMINATED_KEY,
                json!(Utc::now().to_rfc3339()),
            )
            .await?;
        store
            .set_child_status(auth, &child.thread_id, "terminated")
            .await?;
        if !inner.agent.subagents.is_empty() {
            let children = store.children(auth, &child.thread_id).await?;
            Box::pin(terminate_children(&inner.agent.subagents, auth, children)).await;
        }
    }
    Ok(())
}

/// Send `message` to the child and deliver its result: as the tool result when the parent
/// waits, else as a message queued on the parent thread by the child's own completion path
/// (auto communication; see [`child_task_rested`]).
async fn deliver(
    spec: &SubagentSpec,
    origin: &Origin,
    child: &ChildThread,
    message: Message,
    wait: bool,
) -> AgentResult<Value> {
    let child_exec = spec.executor.clone();
    let mut run = origin.run.child(child.agent.clone());
    run.thread_id = Some(child.thread_id.clone());
    // A delivery marker is this child's alone, never inherited by its own children.
    run.metadata.remove(META_DELIVERY);
    if !wait {
        let marker = DeliveryMarker {
            parent_thread_id: origin.parent.thread_id.clone(),
            subagent: spec.name.clone(),
            name: child.name.clone(),
            communication: spec.parent_communication.as_str().to_owned(),
        };
        run.metadata.insert(
            META_DELIVERY.into(),
            serde_json::to_value(&marker).map_err(AgentError::internal)?,
        );
    }
    let message = message.in_thread(child.thread_id.clone());
    let submitted = child_exec
        .send_message(
            &origin.auth,
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
            origin.auth.clone(),
            origin.cancel.clone(),
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
        let outcome = child_exec.wait_for_rest(&origin.auth, &task_id).await;
        cancel_watch.abort();
        let task = outcome?;
        let result = settle(spec, origin, child, &task).await?;
        return match task.state() {
            TaskState::Completed => {
                let mut answer = json!({"subagent": child.name, "result": result.text});
                if !result.files.is_empty() {
                    answer["attachments"] = result.files.iter().map(file_json).collect();
                }
                Ok(answer)
            }
            state => Err(tool_error(
                SUBAGENT_CREATE_TOOL,
                format!("subagent `{}` ended {state}: {}", child.name, result.text),
            )),
        };
    }
    // Not waiting: the child's completion path delivers its end to the parent thread. This
    // watcher only marks it in the parent run's event stream while this process lives.
    let name = child.name.clone();
    let (spec, origin, child) = (spec.clone(), origin.clone(), child.clone());
    tokio::spawn(async move {
        let outcome = spec.executor.wait_for_rest(&origin.auth, &task_id).await;
        cancel_watch.abort();
        match outcome {
            Ok(task) => mark_end(&spec, &origin, &child, &task, summary(&task), &[]).await,
            Err(err) => tracing::warn!(error = %err, "lost track of a subagent's task"),
        }
    });
    Ok(json!({
        "subagent": name,
        "status": "started",
        "note": "the answer will arrive as a message"
    }))
}

fn file_json(file: &FileContent) -> Value {
    json!({"uri": file.uri, "name": file.name, "media_type": file.media_type})
}

/// A child's result as the parent receives it: the text with references rewritten to the
/// parent's copies, and those copies.
struct ChildResult {
    text: String,
    files: Vec<FileContent>,
}

/// After the child's task rests, for a parent that waited: update the registry, bring the
/// result's attachments into the parent's store, mark it in the parent's event stream, and
/// terminate a non-resumable child.
async fn settle(
    spec: &SubagentSpec,
    origin: &Origin,
    child: &ChildThread,
    task: &Task,
) -> AgentResult<ChildResult> {
    let child_state = spec.executor.thread(&origin.auth, child.thread_id.clone());
    child_state.set_status(&task.state().to_string()).await?;
    let result = bring_back(
        origin.runtime(),
        &origin.auth,
        &origin.parent.thread_id,
        child,
        task,
    )
    .await;
    mark_end(
        spec,
        origin,
        child,
        task,
        result.text.clone(),
        &result.files,
    )
    .await;
    if !spec.resumable && task.state().is_terminal() {
        child_state.terminate().await?;
    }
    Ok(result)
}

/// `subagent.returned` or `subagent.failed` in the parent run's event stream.
async fn mark_end(
    spec: &SubagentSpec,
    origin: &Origin,
    child: &ChildThread,
    task: &Task,
    text: String,
    files: &[FileContent],
) {
    let completed = task.state() == TaskState::Completed;
    origin
        .emit(
            if completed {
                EVENT_RETURNED
            } else {
                EVENT_FAILED
            },
            format!("subagent `{}` ended {}", child.name, task.state()),
            json!({
                "subagent": spec.name,
                "name": child.name,
                "child_thread_id": child.thread_id,
                "task_id": task.id,
                "state": task.state().to_string(),
                "result": text,
                "attachments": files.iter().map(file_json).collect::<Vec<_>>(),
            }),
        )
        .await;
}

/// Copy every attachment of the child's thread that its result refers to (in the answer's
/// text, or as file parts of the answer or the artifacts) into the parent's store, and
/// rewrite the text to refer to the copies. A reference that cannot be copied is left as it
/// is (and logged): the answer still reaches the parent.
async fn bring_back(
    runtime: &dyn keel_runtime::Runtime,
    auth: &AuthContext,
    parent_thread: &ThreadId,
    child: &ChildThread,
    task: &Task,
) -> ChildResult {
    let mut text = summary(task);
    let mut references = references_in(&text, &child.thread_id);
    let parts = task
        .status()
        .message
        .iter()
        .flat_map(|m| m.parts.iter())
        .chain(task.artifacts.iter().flat_map(|a| a.parts.iter()));
    for part in parts {
        if let PartContent::File { file } = &part.content {
            if let Some(uri) = &file.uri {
                let ours = parse_uri(uri).is_some_and(|(thread, _)| thread == child.thread_id);
                if ours && !references.contains(uri) {
                    references.push(uri.clone());
                }
            }
        }
    }
    let mut files = Vec::new();
    for uri in references {
        match copy_attachment(runtime, auth, &child.thread_id, parent_thread, &uri).await {
            Ok(copy) => {
                if let Some(new_uri) = &copy.uri {
                    text = text.replace(&uri, new_uri);
                }
                files.push(copy);
            }
            Err(err) => {
                tracing::warn!(error = %err, %uri, "a subagent's attachment could not be copied")
            }
        }
    }
    ChildResult { text, files }
}

/// The child's answer or failure as text.
fn summary(task: &Task) -> String {
    task.status()
        .message
        .as_ref()
        .map(Message::text)
        .unwrap_or_default()
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
        ctx.emit(
            RunEvent::builder(
                EventType::new(EVENT_STATUS),
                format!("subagent status: {status}"),
            )
            .payload(json!({
                "child_thread_id": ctx.thread_id,
                "parent_thread_id": parent,
                "status": status,
            })),
        )
        .await;
        Ok(json!({"status": status}))
    }
}

/// A scoped-variable request as stored in the parent thread (§7.5).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PendingRecord {
    request_id: String,
    parent_thread_id: ThreadId,
    subagent: String,
    name: String,
    message: String,
    #[serde(default)]
    attachments: Vec<String>,
    missing: Vec<String>,
    run: RunContext,
    created_at: String,
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

impl AgentExecutor {
    async fn pending_record(
        &self,
        auth: &AuthContext,
        parent_thread_id: &ThreadId,
        request_id: &str,
    ) -> AgentResult<Option<PendingRecord>> {
        if request_id.is_empty() || request_id.contains(char::is_whitespace) {
            return Ok(None);
        }
        let Some(value) = self
            .runtime()
            .thread_store()
            .kv_get(
                auth,
                parent_thread_id,
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

    /// The pending scoped-variable request `request_id` of `parent_thread_id` (§7.5): which
    /// variables a deferred subagent still needs. `None` when there is no such request (or it
    /// was completed).
    pub async fn pending_variables(
        &self,
        auth: &AuthContext,
        parent_thread_id: &ThreadId,
        request_id: &str,
    ) -> AgentResult<Option<PendingVariables>> {
        Ok(self
            .pending_record(auth, parent_thread_id, request_id)
            .await?
            .as_ref()
            .map(PendingVariables::from))
    }

    /// Complete a scoped-variable request (§7.5): store the values (sealed, in the new child's
    /// thread) and start the deferred subagent at once, in the background; its result reaches
    /// the parent thread as a queued message (auto communication). Answers the new child, or
    /// `None` when there is no such request. A missing or empty value is
    /// [`AgentError::InvalidInput`] naming the variables, and nothing changes.
    pub async fn provide_variables(
        &self,
        auth: &AuthContext,
        parent_thread_id: &ThreadId,
        request_id: &str,
        values: &HashMap<String, String>,
    ) -> AgentResult<Option<ChildThread>> {
        let Some(record) = self
            .pending_record(auth, parent_thread_id, request_id)
            .await?
        else {
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
        let specs = &self.agent().subagents;
        let spec = specs
            .iter()
            .find(|s| s.name == record.subagent)
            .ok_or_else(|| {
                AgentError::invalid_input(
                    "request",
                    format!("subagent kind `{}` is no longer offered", record.subagent),
                )
            })?;
        let parent = self.thread(auth, parent_thread_id.clone());
        parent.ensure_open().await?;
        if let Err(error) = check_room(spec, &parent, &record.name).await {
            // A concurrent completion may have started the child since the request was read
            // (it consumes the request first): the request is used up, which answers `None`
            // here as it would have a moment later, not a name conflict with that child.
            if self
                .pending_record(auth, parent_thread_id, request_id)
                .await?
                .is_none()
            {
                return Ok(None);
            }
            return Err(error);
        }
        let environment = self.agent().environment();
        let mut scoped = Vec::new();
        for var in &spec.scoped_env {
            let value = values
                .get(var)
                .cloned()
                .or_else(|| environment.var(var))
                .ok_or_else(|| {
                    AgentError::invalid_input("variables", format!("`{var}` is missing"))
                })?;
            scoped.push((var.clone(), value));
        }
        // Concurrent completions (two POSTs at once, in any process on the store) race for
        // one claim; only its winner consumes the request and starts the child. A claim left
        // by a process that died here lapses, and the request can be completed again.
        let claimed = self
            .runtime()
            .memory_service()
            .save_if_absent(
                auth,
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
        self.runtime()
            .thread_store()
            .kv_set(
                auth,
                parent_thread_id,
                &format!("{PENDING_PREFIX}{request_id}"),
                Value::Null,
            )
            .await?;
        let origin = Origin {
            auth: auth.clone(),
            run: record.run.clone(),
            parent,
            cancel: CancellationToken::new(),
            events: None,
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
}
