//! Subagent kinds: [`SubagentSpec`] and its options, as a parent agent declares them.

use std::any::Any;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use keel_core::{AgentCard, AgentResult, Message, Task, TaskId, ThreadId};
use keel_runtime::{AuthContext, ChildThread};
use serde_json::Value;

use super::keys::*;
use crate::effects::EffectConfig;
use crate::environment::Environment;
use crate::executor::config::SendOptions;
use crate::thread_state::{ThreadHost, ThreadState};

/// What subagents need of a child kind's executor. The executor implements it; subagents
/// never name the executor itself, so the executor can use them without an import loop.
#[async_trait]
pub(crate) trait ChildExecutor: Send + Sync {
    /// The child agent's card.
    fn agent_card(&self) -> &AgentCard;
    /// The handle of one of the child's threads.
    fn thread(&self, auth: &AuthContext, thread_id: ThreadId) -> ThreadState;
    /// Send a message to the child (see `AgentExecutor::send_message`).
    async fn send_message(
        &self,
        auth: &AuthContext,
        message: Message,
        options: SendOptions,
    ) -> AgentResult<Task>;
    /// Wait until the child's task rests with an answer, and answer it.
    async fn wait_for_rest(&self, auth: &AuthContext, task_id: &TaskId) -> AgentResult<Task>;
    /// Cancel the child's task.
    async fn cancel_task(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        reason: Option<String>,
    ) -> AgentResult<Task>;
    /// Start the child's effect scheduler (and its own kinds').
    fn start_effects_with(&self, config: EffectConfig) -> AgentResult<()>;
    /// Register `parent` as an executor that runs `kind` children on this one, so that a
    /// result queued on a parent thread wakes it.
    fn add_parent(&self, kind: &str, parent: Weak<dyn ThreadHost>);
    /// The executor itself, for [`SubagentSpec::executor`].
    fn as_any(&self) -> &dyn Any;
}

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
    pub(super) fn as_str(self) -> &'static str {
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
    pub(super) name_env: Option<String>,
    pub(super) description_env: Option<String>,
    pub(super) scoped_env: Vec<String>,
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
    pub(super) name: String,
    pub(super) description: String,
    pub(super) executor: Arc<dyn ChildExecutor>,
    pub(super) max_instances: Option<usize>,
    pub(super) resumable: bool,
    pub(super) parent_communication: ParentCommunication,
    pub(super) init_user_message_property: String,
    pub(super) init_agent_name_property: String,
    pub(super) init_attachments_property: String,
    pub(super) optional: Option<String>,
    pub(super) immediate: Option<ImmediateEnv>,
    pub(super) scoped_env: Vec<String>,
}

impl std::fmt::Debug for SubagentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentSpec")
            .field("name", &self.name)
            .field("agent", &self.executor.agent_card().name)
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
    /// A kind named `name` whose children `executor` runs (see `SubagentSpec::new`).
    pub(crate) fn with_executor(name: String, executor: Arc<dyn ChildExecutor>) -> Self {
        let description = executor.agent_card().description.clone();
        Self {
            name,
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

    /// The child's executor, as subagents reach it.
    pub(crate) fn child(&self) -> &dyn ChildExecutor {
        self.executor.as_ref()
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

pub(super) fn spec_of<'a>(specs: &'a Specs, child: &ChildThread) -> Option<&'a SubagentSpec> {
    let kind = child.metadata.get(META_SPEC).and_then(Value::as_str)?;
    specs.iter().find(|s| s.name == kind)
}
