//! Agent definitions: a card, instructions, a model, tools and limits.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, RwLock};

use keel_core::{AgentCard, AgentError, AgentResult};
use keel_llm::{Llm, ToolSpec};
use serde_json::Value;

use crate::effects::effect_fn;
use crate::hooks::RunHooks;
use crate::subagents::{builtin_tools, enabled_specs, Specs, SubagentHooks};
use crate::thread_state::EffectFn;
use crate::tool_source::{ToolTable, WrapFn};
use crate::{Tool, ToolSource};

pub(crate) struct RegisteredTool {
    pub(crate) tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

impl RegisteredTool {
    /// The tool with its schema compiled; a schema that does not compile is
    /// [`AgentError::InvalidInput`].
    pub(crate) fn new(tool: Arc<dyn Tool>) -> AgentResult<Self> {
        let validator = jsonschema::validator_for(&tool.parameters()).map_err(|e| {
            AgentError::invalid_input(
                format!("parameters of tool `{}`", tool.name()),
                e.to_string(),
            )
        })?;
        Ok(Self { tool, validator })
    }

    /// Check arguments against the tool's schema; the error lists every violation.
    pub(crate) fn validate(&self, args: &Value) -> AgentResult<()> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(args)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(AgentError::invalid_input(
                format!("arguments of `{}`", self.tool.name()),
                problems.join("; "),
            ))
        }
    }
}

/// When a run stops, besides a final answer (Standard Agents §6). Checked in this order:
/// the lifecycle tools (`session_stop` / `session_fail`), the stop tool, stop-on-response,
/// then the safety limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRules {
    /// Offer the lifecycle tools `session_stop` (ends the task completed with its `result`)
    /// and `session_fail` (ends it failed with its `error`).
    pub lifecycle_tools: bool,
    /// A tool whose successful call ends the task completed with the tool's output.
    pub stop_tool: Option<String>,
    /// End the task when the model answers without tool calls (the default). When off, the
    /// answer is kept in the history and the loop goes on until another rule stops it.
    pub stop_on_response: bool,
    /// The most model steps one task may take.
    pub max_steps: u32,
    /// The most turns (user messages) a thread may hold; the next task on it fails.
    pub max_session_turns: Option<u32>,
    /// How many identical invalid tool calls the model may repeat before the run stops.
    pub max_invalid_repeats: u32,
}

impl Default for StopRules {
    fn default() -> Self {
        Self {
            lifecycle_tools: false,
            stop_tool: None,
            stop_on_response: true,
            max_steps: Agent::DEFAULT_MAX_STEPS,
            max_session_turns: None,
            max_invalid_repeats: 3,
        }
    }
}

/// The name of the lifecycle tool that ends a task completed.
pub const SESSION_STOP_TOOL: &str = "session_stop";
/// The name of the lifecycle tool that ends a task failed.
pub const SESSION_FAIL_TOOL: &str = "session_fail";
/// The name of the hand-off tool that asks the human for input.
pub const ASK_HUMAN_TOOL: &str = "ask_human";

/// An agent definition. Build one with [`Agent::builder`].
pub struct Agent {
    card: AgentCard,
    instructions: String,
    llm: Option<Arc<dyn Llm>>,
    /// The tools it was built with, checked.
    fixed: Vec<Arc<RegisteredTool>>,
    /// The tools whose list may change while it runs (see [`ToolSource`]).
    sources: Vec<Arc<dyn ToolSource>>,
    /// How replay wraps each tool, applied to the sources' tools too.
    wrap: Option<Arc<WrapFn>>,
    /// Its tools now: the fixed ones and the sources' at their last refresh.
    table: RwLock<Arc<ToolTable>>,
    /// Held while the sources refresh, so that concurrent runs fetch once.
    refreshing: tokio::sync::Mutex<()>,
    stop: StopRules,
    budget: keel_core::RunBudget,
    budget_policy: Arc<dyn keel_policy::BudgetPolicyFactory>,
    human_handoff: bool,
    authorizer: Arc<keel_policy::ActionAuthorizer>,
    /// `None`: negotiate with the runtime's model (an agent with skills that set none).
    negotiator: Option<Arc<dyn crate::Negotiator>>,
    code_runner: Option<Arc<dyn crate::CodeRunner>>,
    // Subagents: the kinds of child agents this agent may create (see `subagents`).
    pub(crate) subagents: Specs,
    /// What the executor calls at fixed points of a thread's life (subagents).
    pub(crate) hooks: Arc<dyn RunHooks>,
    /// The application's lifecycle hooks, in registration order.
    pub(crate) lifecycle: crate::lifecycle::HookList,
    environment: crate::Environment,
    /// Scheduled effects: the handler of each effect name.
    pub(crate) effects: HashMap<String, EffectFn>,
    compaction: Option<crate::AutoCompaction>,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.card.name)
            .field(
                "tools",
                &self
                    .table()
                    .specs
                    .iter()
                    .map(|t| &t.name)
                    .collect::<Vec<_>>(),
            )
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// The default step limit.
    pub const DEFAULT_MAX_STEPS: u32 = 8;

    /// Start building an agent with this card.
    pub fn builder(card: AgentCard) -> AgentBuilder {
        AgentBuilder {
            card,
            instructions: String::new(),
            llm: None,
            tools: Vec::new(),
            sources: Vec::new(),
            wrap: None,
            stop: StopRules::default(),
            budget: keel_core::RunBudget::default(),
            budget_policy: None,
            human_handoff: false,
            policy: None,
            approval_handler: None,
            negotiator: None,
            code_runner: None,
            subagents: Vec::new(),
            environment: crate::Environment::process(),
            effects: HashMap::new(),
            lifecycle: Default::default(),
            compaction: None,
        }
    }

    /// Automatic compaction of the thread history before a model call, when set
    /// ([`AgentBuilder::compaction`]).
    pub fn compaction(&self) -> Option<&crate::AutoCompaction> {
        self.compaction.as_ref()
    }

    /// Where the agent reads flags (`optional` subagents) and scoped variables.
    pub fn environment(&self) -> &crate::Environment {
        &self.environment
    }

    /// The agent's card.
    pub fn card(&self) -> &AgentCard {
        &self.card
    }

    /// The system instructions.
    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    /// The agent's own model, if it brings one (else the runtime's default is used).
    pub fn llm(&self) -> Option<&Arc<dyn Llm>> {
        self.llm.as_ref()
    }

    /// The most model steps one run may take.
    pub fn max_steps(&self) -> u32 {
        self.stop.max_steps
    }

    /// The stop rules.
    pub fn stop_rules(&self) -> &StopRules {
        &self.stop
    }

    /// The limits of every run of this agent; a caller's run context can only narrow them.
    pub fn budget(&self) -> &keel_core::RunBudget {
        &self.budget
    }

    /// The budget policy of a run under `context`: the agent's factory applied to the
    /// caller's budget narrowed by the agent's.
    pub(crate) fn budget_policy_for(
        &self,
        context: &keel_core::RunContext,
    ) -> Box<dyn keel_policy::BudgetPolicy> {
        self.budget_policy
            .policy_for(context.budget.narrowed_by(&self.budget))
    }

    /// Whether the `ask_human` hand-off tool is offered.
    pub fn human_handoff(&self) -> bool {
        self.human_handoff
    }

    /// Who decides, before a task starts, whether the agent takes it on, when that does not
    /// depend on the runtime: the negotiator set with [`AgentBuilder::negotiator`], or
    /// [`AcceptAll`](crate::AcceptAll) for an agent without skills. `None` for an agent with
    /// skills that set none: it negotiates with the runtime's model
    /// ([`Agent::negotiator_for`]).
    pub fn negotiator(&self) -> Option<&Arc<dyn crate::Negotiator>> {
        self.negotiator.as_ref()
    }

    /// The negotiator this agent uses on `runtime`: its own ([`Agent::negotiator`]), or, for
    /// an agent with skills that set none, an [`LlmNegotiator`](crate::LlmNegotiator) on the
    /// runtime's default model, which picks the skill (seed 002's default negotiator).
    pub fn negotiator_for(
        &self,
        runtime: &dyn keel_runtime::Runtime,
    ) -> Arc<dyn crate::Negotiator> {
        match &self.negotiator {
            Some(negotiator) => negotiator.clone(),
            None => Arc::new(crate::LlmNegotiator::new(runtime.default_llm())),
        }
    }

    /// What runs model-written code for [`ThreadState::run_code`](crate::ThreadState::run_code).
    pub fn code_runner(&self) -> Option<&Arc<dyn crate::CodeRunner>> {
        self.code_runner.as_ref()
    }

    /// The agent's policy and approval handler, which judge every action its runs prepare.
    pub fn authorizer(&self) -> &Arc<keel_policy::ActionAuthorizer> {
        &self.authorizer
    }

    /// The tools as offered to a model, built-in ones included: those of its
    /// [`ToolSource`]s as of their last refresh ([`Agent::refresh_tools`]).
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        self.table().specs.as_ref().clone()
    }

    /// The specs offered to a model, shared with the table they come from.
    pub(crate) fn shared_tool_specs(&self) -> Arc<Vec<ToolSpec>> {
        self.table().specs.clone()
    }

    /// Ask the agent's [`ToolSource`]s whether their tools changed and take the new ones:
    /// what [`Agent::tool_specs`] offers and what a call finds from then on. The engine calls
    /// it before each step and before a direct tool call; cheap when nothing changed.
    pub async fn refresh_tools(&self) {
        if self.sources.is_empty() {
            return;
        }
        let _refreshing = self.refreshing.lock().await;
        let mut changed = false;
        for source in &self.sources {
            changed |= source.refresh().await;
        }
        if !changed {
            return;
        }
        let table = ToolTable::new(
            &self.fixed,
            self.sourced_tools(),
            &self.builtin_specs(),
            false,
        )
        .expect("a table built leniently has no error");
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
    }

    /// The sources' tools now, wrapped as the fixed ones were.
    fn sourced_tools(&self) -> Vec<Arc<dyn Tool>> {
        sourced_tools(&self.sources, self.wrap.as_deref())
    }

    fn table(&self) -> Arc<ToolTable> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The specs of the tools the engine answers itself, as the stop rules and hand-off
    /// setting offer them.
    fn builtin_specs(&self) -> Vec<ToolSpec> {
        builtin_specs(&self.stop, self.human_handoff)
    }

    /// The tools it was built with, declared and built-in (the lifecycle and hand-off tools
    /// the engine answers itself are in [`Agent::tool_specs`] only), in order: what
    /// `keel tools` lists with their flags.
    /// Those of its [`ToolSource`]s come after, as of their last refresh.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.table().tools.iter().map(|t| t.tool.clone()).collect()
    }

    pub(crate) fn tool(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        self.table().get(name).cloned()
    }
}

/// The tools of `sources` now, each wrapped by `wrap` when given.
fn sourced_tools(sources: &[Arc<dyn ToolSource>], wrap: Option<&WrapFn>) -> Vec<Arc<dyn Tool>> {
    sources
        .iter()
        .flat_map(|source| source.tools())
        .map(|tool| match wrap {
            Some(wrap) => wrap(tool),
            None => tool,
        })
        .collect()
}

/// The specs of the tools the engine answers itself: the lifecycle tools and `ask_human`.
fn builtin_specs(stop: &StopRules, human_handoff: bool) -> Vec<ToolSpec> {
    let mut specs = Vec::new();
    if stop.lifecycle_tools {
        specs.push(ToolSpec {
            name: SESSION_STOP_TOOL.into(),
            description: "Finish the task successfully with a final result.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"result": {"type": "string"}},
                "required": ["result"]
            }),
        });
        specs.push(ToolSpec {
            name: SESSION_FAIL_TOOL.into(),
            description: "Give up on the task, explaining why.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"error": {"type": "string"}},
                "required": ["error"]
            }),
        });
    }
    if human_handoff {
        specs.push(ToolSpec {
            name: ASK_HUMAN_TOOL.into(),
            description: "Ask the human a question and wait for the answer.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"]
            }),
        });
    }
    specs
}

/// Builds an [`Agent`]; [`AgentBuilder::build`] checks the tools.
#[must_use]
pub struct AgentBuilder {
    card: AgentCard,
    instructions: String,
    llm: Option<Arc<dyn Llm>>,
    tools: Vec<Arc<dyn Tool>>,
    sources: Vec<Arc<dyn ToolSource>>,
    wrap: Option<Arc<WrapFn>>,
    stop: StopRules,
    budget: keel_core::RunBudget,
    budget_policy: Option<Arc<dyn keel_policy::BudgetPolicyFactory>>,
    human_handoff: bool,
    policy: Option<Arc<dyn keel_policy::Policy>>,
    approval_handler: Option<Arc<dyn keel_policy::ApprovalHandler>>,
    negotiator: Option<Arc<dyn crate::Negotiator>>,
    code_runner: Option<Arc<dyn crate::CodeRunner>>,
    subagents: Vec<crate::SubagentSpec>,
    environment: crate::Environment,
    effects: HashMap<String, EffectFn>,
    lifecycle: crate::lifecycle::HookList,
    compaction: Option<crate::AutoCompaction>,
}

impl AgentBuilder {
    /// Compact the thread history automatically when a model call's context would exceed
    /// the model's context window (see [`AutoCompaction`](crate::AutoCompaction)). Off by
    /// default: without it a long thread is sent whole and the provider decides.
    pub fn compaction(mut self, compaction: crate::AutoCompaction) -> Self {
        self.compaction = Some(compaction);
        self
    }

    /// Handle the scheduled effect `name` (replacing an earlier handler of that name): when a
    /// timer scheduled with [`ThreadState::schedule_effect`](crate::ThreadState::schedule_effect)
    /// fires, `handler` runs on the thread, holding its lease, with the timer's payload; what
    /// it queues ([`ThreadState::queue_message`](crate::ThreadState::queue_message),
    /// [`queue_tool`](crate::ThreadState::queue_tool)) starts a turn or is injected into the
    /// running one. An error or panic of the handler is reported on the `effect.fired` event.
    ///
    /// ```
    /// use keel_agent::Agent;
    /// use keel_core::AgentCard;
    /// let agent = Agent::builder(AgentCard::new("a", "reminders", "http://127.0.0.1:0"))
    ///     .effect("remind", |thread, payload| async move {
    ///         thread.queue_message(format!("Reminder: {payload}")).await?;
    ///         Ok(())
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = agent;
    /// ```
    pub fn effect<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(crate::ThreadState, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = AgentResult<()>> + Send + 'static,
    {
        self.effects.insert(name.into(), effect_fn(handler));
        self
    }

    /// Add lifecycle hooks: application code called before and after each step, model call
    /// and tool call of this agent's runs (see [`LifecycleHooks`](crate::LifecycleHooks)).
    /// Hooks added more than once are all called, in the order they were added.
    pub fn hooks(mut self, hooks: impl crate::LifecycleHooks + 'static) -> Self {
        self.lifecycle.0.push(Arc::new(hooks));
        self
    }

    /// Let the model create subagents of this kind (adds the built-in `subagent_create`
    /// tool, and `subagent_message` when a kind is resumable).
    pub fn subagent(mut self, spec: crate::SubagentSpec) -> Self {
        self.subagents.push(spec);
        self
    }

    /// Where the agent reads its flags and scoped variables (default: the process
    /// environment). `optional` subagent kinds are decided against it when the agent is built.
    pub fn environment(mut self, environment: crate::Environment) -> Self {
        self.environment = environment;
        self
    }

    /// The system instructions.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// The agent's own model.
    pub fn llm(mut self, llm: impl Llm + 'static) -> Self {
        self.llm = Some(Arc::new(llm));
        self
    }

    /// The agent's own model, shared.
    pub fn llm_shared(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Add a tool.
    pub fn tool(mut self, tool: impl Tool + 'static) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Add a shared tool.
    pub fn tool_shared(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Add tools whose list may change while the agent runs (an MCP server's): the agent
    /// offers the source's tools as of its last refresh, which the engine asks for before
    /// each step. Their names must differ from every other tool's when the agent is built;
    /// a name that collides later is left out with a warning.
    pub fn tool_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.sources.push(source);
        self
    }

    /// The most model steps one run may take (at least 1).
    pub fn max_steps(mut self, max_steps: u32) -> Self {
        self.stop.max_steps = max_steps;
        self
    }

    /// All stop rules at once.
    pub fn stop_rules(mut self, stop: StopRules) -> Self {
        self.stop = stop;
        self
    }

    /// Limits every run of this agent keeps to (model steps and calls, tool calls, tokens,
    /// time); a caller's `RunContext.budget` can narrow them, never widen them.
    pub fn budget(mut self, budget: keel_core::RunBudget) -> Self {
        self.budget = budget;
        self
    }

    /// What decides at the budget's checkpoints (before a step, a model call and a tool
    /// call, and after a model call's usage is known): one [`keel_policy::BudgetPolicy`] per
    /// run, made by `policy` from the run's budget. [`keel_policy::BudgetEnforcer`] when not
    /// set; a policy of one's own can allow a last call, compact first, or count in its own
    /// units.
    pub fn budget_policy(
        mut self,
        policy: impl keel_policy::BudgetPolicyFactory + 'static,
    ) -> Self {
        self.budget_policy = Some(Arc::new(policy));
        self
    }

    /// Offer the `session_stop` / `session_fail` lifecycle tools.
    pub fn lifecycle_tools(mut self, on: bool) -> Self {
        self.stop.lifecycle_tools = on;
        self
    }

    /// End the task when this tool has run successfully.
    pub fn stop_tool(mut self, name: impl Into<String>) -> Self {
        self.stop.stop_tool = Some(name.into());
        self
    }

    /// Whether a text answer ends the task (default true).
    pub fn stop_on_response(mut self, on: bool) -> Self {
        self.stop.stop_on_response = on;
        self
    }

    /// The most turns a thread may hold.
    pub fn max_session_turns(mut self, turns: u32) -> Self {
        self.stop.max_session_turns = Some(turns);
        self
    }

    /// The policy that judges every action (allow all when not set). A run's
    /// `RunContext.permissions` can narrow it, never widen it.
    pub fn policy(mut self, policy: impl keel_policy::Policy + 'static) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }

    /// Who decides actions that need approval. Without one, such an action stops the run
    /// (fail closed): the task waits in `input-required` with the pending request until
    /// `AgentExecutor::decide_approval` answers it.
    pub fn approval_handler(
        mut self,
        handler: impl keel_policy::ApprovalHandler + 'static,
    ) -> Self {
        self.approval_handler = Some(Arc::new(handler));
        self
    }

    /// Decide about each new task before it starts (accept, ask for input, reject). The
    /// default depends on the card: an agent with skills asks the runtime's default model
    /// which skill fits ([`LlmNegotiator`](crate::LlmNegotiator)); one without accepts
    /// everything. Set [`AcceptAll`](crate::AcceptAll) to accept without a model call.
    pub fn negotiator(mut self, negotiator: impl crate::Negotiator + 'static) -> Self {
        self.negotiator = Some(Arc::new(negotiator));
        self
    }

    /// What runs code for [`ThreadState::run_code`](crate::ThreadState::run_code) (the `keel`
    /// facade's `sandbox` feature offers one).
    pub fn code_runner(mut self, runner: impl crate::CodeRunner + 'static) -> Self {
        self.code_runner = Some(Arc::new(runner));
        self
    }

    /// Offer the `ask_human` tool: the task waits in `input-required` for the human's answer.
    pub fn human_handoff(mut self, on: bool) -> Self {
        self.human_handoff = on;
        self
    }

    /// The agent's own model, if it has one (else the runtime's default model answers); the
    /// replayer keeps its profile, and a fork goes on with it.
    pub fn model(&self) -> Option<&Arc<dyn Llm>> {
        self.llm.as_ref()
    }

    /// Replace every tool, the subagent tools and the sources' tools included, by what `wrap`
    /// makes of it (the replayer answers calls from a recording while the current definitions
    /// still declare name, schema and capabilities).
    pub(crate) fn map_tools(
        mut self,
        wrap: impl Fn(Arc<dyn Tool>) -> Arc<dyn Tool> + Send + Sync + 'static,
    ) -> Self {
        self.tools = self.tools.into_iter().map(&wrap).collect();
        self.wrap = Some(Arc::new(wrap));
        self
    }

    /// Check and build. A tool with an invalid JSON schema, a duplicate tool name or a zero
    /// step limit is [`AgentError::InvalidInput`].
    pub fn build(self) -> AgentResult<Agent> {
        if self.stop.max_steps == 0 {
            return Err(AgentError::invalid_input("max_steps", "must be at least 1"));
        }
        // Effect names under `keel:` are the runtime's own (the wake timer is `keel:wake`);
        // a handler registered there would never run.
        if let Some(name) = self
            .effects
            .keys()
            .find(|name| name.is_empty() || name.starts_with("keel:"))
        {
            return Err(AgentError::invalid_input(
                "effect.name",
                format!(
                    "`{name}` is not allowed: effect names are non-empty and `keel:` is reserved"
                ),
            ));
        }
        const RESERVED: [&str; 5] = [
            SESSION_STOP_TOOL,
            SESSION_FAIL_TOOL,
            ASK_HUMAN_TOOL,
            crate::SUBAGENT_CREATE_TOOL,
            crate::SUBAGENT_MESSAGE_TOOL,
        ];
        let mut tools = Vec::with_capacity(self.tools.len());
        let mut tool_index = HashSet::new();
        // Subagents: the built-in lifecycle tools join the checked tools below.
        let subagents = Arc::new(enabled_specs(self.subagents, &self.environment));
        let mut builtin = builtin_tools(&subagents)?;
        // A replay answers the subagent tools from its recording too: no child runs.
        if let Some(wrap) = &self.wrap {
            builtin = builtin.into_iter().map(|tool| wrap(tool)).collect();
        }
        let declared = self.tools.len();
        for (i, tool) in self.tools.into_iter().chain(builtin).enumerate() {
            let is_builtin = i >= declared;
            let name = tool.name().to_owned();
            if name.is_empty() {
                return Err(AgentError::invalid_input("tool.name", "must not be empty"));
            }
            if !is_builtin && RESERVED.contains(&name.as_str()) {
                return Err(AgentError::invalid_input(
                    "tool.name",
                    format!("`{name}` is reserved for a built-in tool"),
                ));
            }
            let registered = RegisteredTool::new(tool)?;
            if !tool_index.insert(name.clone()) {
                return Err(AgentError::invalid_input(
                    "tool.name",
                    format!("`{name}` is declared twice"),
                ));
            }
            tools.push(Arc::new(registered));
        }
        // The sources' tools as they are now: checked as strictly as the declared ones.
        let table = ToolTable::new(
            &tools,
            sourced_tools(&self.sources, self.wrap.as_deref()),
            &builtin_specs(&self.stop, self.human_handoff),
            true,
        )?;
        if let Some(stop_tool) = &self.stop.stop_tool {
            if table.get(stop_tool).is_none() {
                return Err(AgentError::invalid_input(
                    "stop_tool",
                    format!("`{stop_tool}` is not one of the agent's tools"),
                ));
            }
        }
        let mut card = self.card;
        card.capabilities.tool_calling |= !table.tools.is_empty() || !self.sources.is_empty();
        // Without skills there is nothing to choose between: accept without asking a model.
        let negotiator = self.negotiator.or_else(|| {
            card.skills
                .is_empty()
                .then(|| Arc::new(crate::AcceptAll) as Arc<dyn crate::Negotiator>)
        });
        Ok(Agent {
            card,
            instructions: self.instructions,
            llm: self.llm,
            fixed: tools,
            sources: self.sources,
            wrap: self.wrap,
            table: RwLock::new(Arc::new(table)),
            refreshing: tokio::sync::Mutex::new(()),
            stop: self.stop,
            budget: self.budget,
            budget_policy: self
                .budget_policy
                .unwrap_or_else(|| Arc::new(keel_policy::EnforceBudget)),
            human_handoff: self.human_handoff,
            authorizer: {
                let policy = self
                    .policy
                    .unwrap_or_else(|| Arc::new(keel_policy::CapabilityPolicy::new()));
                let mut authorizer = keel_policy::ActionAuthorizer::from_arc(policy);
                if let Some(handler) = self.approval_handler {
                    authorizer = authorizer.with_approval_handler_arc(handler);
                }
                Arc::new(authorizer)
            },
            negotiator,
            code_runner: self.code_runner,
            hooks: Arc::new(SubagentHooks::new(subagents.clone())),
            subagents,
            environment: self.environment,
            effects: self.effects,
            lifecycle: self.lifecycle,
            compaction: self.compaction,
        })
    }
}
