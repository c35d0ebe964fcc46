//! From a checked `keel.toml` to running agents: one [`AgentExecutor`] per declared agent, on
//! one shared runtime, with the Rust tools a program adds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_agent::{
    AcceptAll, Agent, AgentBuilder, AgentExecutor, AsyncHttpTool, ExecutorConfig, LlmNegotiator,
    SessionStatusTool, StopRules, SubagentSpec, Tool, ToolSource,
};
use keel_core::{AgentCard, AgentResult, AgentSkill, ModelPrice, RunBudget};
use keel_llm::{Llm, LlmRequest, LlmResponse, LlmStream, ModelProfile};
use keel_policy::{CapabilityPolicy, CapabilityRule};
use keel_runtime::Runtime;

use super::error::ConfigError;
use super::types::{AgentConfig, BuiltinTool, ModelConfig, Negotiate, RuleConfig};
use super::LoadedConfig;
use crate::delegation::RemoteAgentTool;
use crate::http_tool::HttpTool;
use keel_mcp::{McpTool, McpToolSet};

type ExecutorConfigFn = dyn Fn(&str) -> ExecutorConfig + Send + Sync;

/// Builds the agents a `keel.toml` declares. Start one with [`LoadedConfig::agents`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use keel::prelude::*;
/// let config = keel::Config::parse(
///     "[[agents]]\nname = \"helper\"\ndescription = \"Helps.\"\n",
///     "keel.toml",
/// )?;
/// let add_one = FnTool::new("add_one", "Add one.", serde_json::json!({"type": "object"}),
///     |args, _ctx| async move { Ok(serde_json::json!(args["n"].as_i64().unwrap_or(0) + 1)) });
/// let runtime = std::sync::Arc::new(DefaultRuntime::offline());
/// let agents = config.agents().tool("helper", add_one).build(runtime)?;
/// assert_eq!(agents.default_agent().name, "helper");
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct AgentSetBuilder<'a> {
    config: &'a LoadedConfig,
    tools: HashMap<String, Vec<Arc<dyn Tool>>>,
    executor_config: Option<Box<ExecutorConfigFn>>,
    /// Each agent's MCP tools, once [`AgentSetBuilder::connect`] started the servers.
    mcp_tools: Option<HashMap<String, Arc<McpToolSet>>>,
}

/// One agent of the file, running.
#[derive(Clone)]
pub struct ConfiguredAgent {
    /// Its name (and path, `/agents/{name}/`).
    pub name: String,
    /// Its executor.
    pub executor: AgentExecutor,
    /// The tools its MCP servers give it (a tool source of the executor's agent), when it
    /// has servers.
    pub mcp: Option<Arc<McpToolSet>>,
}

impl ConfiguredAgent {
    /// The tools its MCP servers give it now (none without servers).
    pub fn mcp_tools(&self) -> Vec<Arc<McpTool>> {
        self.mcp
            .as_ref()
            .map(|set| set.mcp_tools())
            .unwrap_or_default()
    }
}

/// The agents of a file, in the file's order, and which one is the default.
#[derive(Clone)]
pub struct AgentSet {
    agents: Vec<ConfiguredAgent>,
    default: usize,
}

impl AgentSet {
    /// The agent also served at `/`.
    pub fn default_agent(&self) -> &ConfiguredAgent {
        &self.agents[self.default]
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&ConfiguredAgent> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// Every agent, in the file's order.
    pub fn iter(&self) -> impl Iterator<Item = &ConfiguredAgent> {
        self.agents.iter()
    }
}

impl LoadedConfig {
    /// Start building the file's agents.
    pub fn agents(&self) -> AgentSetBuilder<'_> {
        AgentSetBuilder {
            config: self,
            tools: HashMap::new(),
            executor_config: None,
            mcp_tools: None,
        }
    }
}

impl AgentSetBuilder<'_> {
    /// Give the agent named `agent` a tool written in Rust, besides those the file declares.
    pub fn tool(self, agent: &str, tool: impl Tool + 'static) -> Self {
        self.tool_shared(agent, Arc::new(tool))
    }

    /// [`AgentSetBuilder::tool`] with a shared tool.
    pub fn tool_shared(mut self, agent: &str, tool: Arc<dyn Tool>) -> Self {
        self.tools.entry(agent.to_owned()).or_default().push(tool);
        self
    }

    /// The executor settings of each agent, by name (default: the server's lease TTL and
    /// asynchronous tool timeout, no callback route).
    pub fn executor_config(
        mut self,
        config: impl Fn(&str) -> ExecutorConfig + Send + Sync + 'static,
    ) -> Self {
        self.executor_config = Some(Box::new(config));
        self
    }

    /// Start the MCP servers the file declares (every one some agent gets, once, all at
    /// once), then build every agent on `runtime` as [`AgentSetBuilder::build`] does, with
    /// its servers' tools. A server that does not start is an error naming the server, its
    /// field and its command or URL. A file without MCP servers starts nothing.
    pub async fn connect(self, runtime: Arc<dyn Runtime>) -> Result<AgentSet, ConfigError> {
        self.connected().await?.build(runtime)
    }

    /// Start the MCP servers the file declares, as [`AgentSetBuilder::connect`] does, and
    /// keep their tools for [`AgentSetBuilder::build`] and
    /// [`AgentSetBuilder::agent_builder`].
    pub async fn connected(mut self) -> Result<Self, ConfigError> {
        self.mcp_tools = Some(super::mcp::connect(self.config).await?);
        Ok(self)
    }

    /// Build every agent on `runtime` (subagents before the agents that use them). A file
    /// whose agents get MCP servers needs them started: use [`AgentSetBuilder::connect`].
    pub fn build(self, runtime: Arc<dyn Runtime>) -> Result<AgentSet, ConfigError> {
        let config = self.config;
        let (built, _) = self.build_until(&runtime, None)?;
        let default_name = config.default_agent().name().to_owned();
        let mcp_tools = self.mcp_tools.unwrap_or_default();
        let agents: Vec<ConfiguredAgent> = config
            .agents
            .iter()
            .map(|a| ConfiguredAgent {
                name: a.name().to_owned(),
                executor: built[a.name()].clone(),
                mcp: mcp_tools.get(a.name()).cloned(),
            })
            .collect();
        let default = agents
            .iter()
            .position(|a| a.name == default_name)
            .unwrap_or(0);
        Ok(AgentSet { agents, default })
    }

    /// The definition of agent `name` (the file's default agent when `None`) as
    /// [`AgentSetBuilder::build`] makes it, not yet built: what a replay re-drives with
    /// recorded answers in place of its model and tools. The subagents it uses are built
    /// on `runtime`. A file whose agents get MCP servers needs them started first
    /// ([`AgentSetBuilder::connected`]).
    pub fn agent_builder(
        &self,
        name: Option<&str>,
        runtime: Arc<dyn Runtime>,
    ) -> Result<AgentBuilder, ConfigError> {
        let config = self.config;
        let name = name.unwrap_or_else(|| config.default_agent().name());
        if config.agent(name).is_none() {
            let known: Vec<String> = config
                .agents
                .iter()
                .map(|a| format!("`{}`", a.name()))
                .collect();
            return Err(ConfigError::whole(
                &config.path,
                "agents",
                format!("no agent `{name}` (the file has {})", known.join(", ")),
            ));
        }
        let (_, builder) = self.build_until(&runtime, Some(name))?;
        builder
            .ok_or_else(|| ConfigError::whole(&config.path, "agents", format!("no agent `{name}`")))
    }

    /// Build the agents in [`build_order`] on `runtime`, up to agent `until` when given:
    /// that one's definition is handed back unbuilt (every subagent it uses is built by
    /// then).
    fn build_until(
        &self,
        runtime: &Arc<dyn Runtime>,
        until: Option<&str>,
    ) -> Result<(HashMap<String, AgentExecutor>, Option<AgentBuilder>), ConfigError> {
        let config = self.config;
        let path = &config.path;
        if self.mcp_tools.is_none() && config.uses_mcp() {
            return Err(ConfigError::whole(
                path,
                "mcp",
                "the file declares MCP servers, which must be started: build its agents with \
                 `connect` instead of `build`",
            ));
        }
        let no_mcp = HashMap::new();
        let mcp_tools = self.mcp_tools.as_ref().unwrap_or(&no_mcp);
        if let Some(unknown) = self.tools.keys().find(|name| config.agent(name).is_none()) {
            return Err(ConfigError::whole(
                path,
                "agents",
                format!("a Rust tool was added to `{unknown}`, which the file does not declare"),
            ));
        }
        let mut built: HashMap<String, AgentExecutor> = HashMap::new();
        for agent in build_order(config) {
            let extra = self.tools.get(agent.name()).cloned().unwrap_or_default();
            let source = mcp_tools
                .get(agent.name())
                .map(|set| set.clone() as Arc<dyn ToolSource>);
            let in_agent = |err: keel_core::AgentError| {
                ConfigError::whole(path, format!("agents.{}", agent.name()), err.to_string())
            };
            let builder = agent_builder(config, agent, &built, extra, source).map_err(in_agent)?;
            if until == Some(agent.name()) {
                return Ok((built, Some(builder)));
            }
            let built_agent = builder.build().map_err(in_agent)?;
            let executor_config = match &self.executor_config {
                Some(make) => make(agent.name()),
                None => ExecutorConfig {
                    lease_ttl: Duration::from_secs_f64(config.server.lease_ttl_seconds),
                    async_tool_timeout: Duration::from_secs_f64(
                        config.server.async_tool_timeout_seconds,
                    ),
                    drain_timeout: Duration::from_secs_f64(config.server.drain_timeout_seconds),
                    ..ExecutorConfig::default()
                },
            };
            let executor =
                AgentExecutor::with_config(built_agent, runtime.clone(), executor_config);
            built.insert(agent.name().to_owned(), executor);
        }
        Ok((built, None))
    }
}

/// The agents in an order where every subagent comes before its parents (the file was
/// checked for cycles).
fn build_order(config: &LoadedConfig) -> Vec<&AgentConfig> {
    fn visit<'a>(config: &'a LoadedConfig, agent: &'a AgentConfig, out: &mut Vec<&'a AgentConfig>) {
        if out.iter().any(|a| a.name() == agent.name()) {
            return;
        }
        for sub in &agent.subagents {
            if let Some(child) = config.agent(sub.agent.get_ref()) {
                visit(config, child, out);
            }
        }
        out.push(agent);
    }
    let mut out = Vec::new();
    for agent in &config.agents {
        visit(config, agent, &mut out);
    }
    out
}

/// The definition of `agent`, with the executors of the subagents it uses (`built`) and the
/// tools a program or MCP servers add (`extra`).
fn agent_builder(
    config: &LoadedConfig,
    agent: &AgentConfig,
    built: &HashMap<String, AgentExecutor>,
    extra: Vec<Arc<dyn Tool>>,
    source: Option<Arc<dyn ToolSource>>,
) -> AgentResult<AgentBuilder> {
    let mut card = AgentCard::new(agent.name(), &agent.description, "http://127.0.0.1/");
    card.version.clone_from(&agent.version);
    card.capabilities.has_llm = true;
    for skill in &agent.skills {
        let mut card_skill =
            AgentSkill::new(&skill.id, &skill.description).with_tags(skill.tags.iter().cloned());
        if let Some(name) = &skill.name {
            card_skill.name.clone_from(name);
        }
        for example in &skill.examples {
            card_skill = card_skill.with_example(example);
        }
        card = card.with_skill(card_skill);
    }
    let price = config
        .prices
        .get(agent.model.id.get_ref())
        .and_then(|price| keel_core::ModelPrice::per_million(price.input, price.output));
    let llm = model(&agent.model, price)?;
    let mut builder = Agent::builder(card)
        .instructions(config.instructions_of(agent))
        .llm_shared(llm.clone())
        .policy(policy(agent))
        .budget(RunBudget {
            max_steps: agent.budget.max_steps,
            max_llm_calls: agent.budget.max_llm_calls,
            max_tool_calls: agent.budget.max_tool_calls,
            max_input_tokens: agent.budget.max_input_tokens,
            max_output_tokens: agent.budget.max_output_tokens,
            max_runtime_seconds: agent.budget.max_runtime_seconds,
            max_cost_micros: agent.budget.max_cost_micros(),
        })
        .stop_rules(StopRules {
            lifecycle_tools: agent.tools.builtin.contains(&BuiltinTool::Lifecycle),
            stop_tool: agent.stop.stop_tool.as_ref().map(|t| t.get_ref().clone()),
            stop_on_response: agent.stop.stop_on_response,
            max_steps: agent.stop.max_steps,
            max_session_turns: agent.stop.max_session_turns,
            max_invalid_repeats: agent.stop.max_invalid_repeats,
        })
        .human_handoff(agent.tools.builtin.contains(&BuiltinTool::AskHuman));
    if let Some(compaction) = &agent.compaction {
        builder = builder.compaction(compaction.auto());
    }
    builder = match agent.negotiate {
        Negotiate::Accept => builder.negotiator(AcceptAll),
        Negotiate::Model => builder.negotiator(LlmNegotiator::new(llm)),
    };
    if agent.tools.builtin.contains(&BuiltinTool::SessionStatus) {
        builder = builder.tool(SessionStatusTool);
    }
    if agent.tools.run_code {
        builder = with_run_code(builder)?;
    }
    for tool in &agent.tools.http {
        let timeout = tool.timeout_seconds.map(Duration::from_secs_f64);
        if tool.asynchronous {
            let mut async_tool = AsyncHttpTool::new(
                tool.name.get_ref(),
                &tool.description,
                tool.parameters.get_ref().clone(),
                tool.url.value(),
            );
            if let Some(timeout) = timeout {
                async_tool = async_tool.with_timeout(timeout);
            }
            builder = builder.tool(async_tool);
        } else {
            let mut http = HttpTool::new(
                tool.name.get_ref(),
                &tool.description,
                tool.method.get_ref(),
                tool.url.clone(),
            )?
            .with_parameters(tool.parameters.get_ref().clone())
            .with_capabilities(tool.capabilities.iter().cloned())
            .idempotent(tool.idempotent);
            for (name, value) in &tool.headers {
                http = http.with_header(name, value.clone())?;
            }
            if let Some(timeout) = timeout {
                http = http.with_timeout(timeout);
            }
            builder = builder.tool(http);
        }
    }
    for remote in &agent.remote_agents {
        builder = builder.tool(RemoteAgentTool::new(
            remote.name.get_ref(),
            &remote.description,
            remote.url.value(),
        ));
    }
    for sub in &agent.subagents {
        let child = built[sub.agent.get_ref()].clone();
        let mut spec = SubagentSpec::new(
            sub.kind
                .clone()
                .unwrap_or_else(|| sub.agent.get_ref().clone()),
            child,
        )
        .resumable(sub.resumable);
        if let Some(description) = &sub.description {
            spec = spec.description(description);
        }
        if let Some(max) = sub.max_instances {
            spec = spec.max_instances(max);
        }
        builder = builder.subagent(spec);
    }
    for tool in extra {
        builder = builder.tool_shared(tool);
    }
    if let Some(source) = source {
        builder = builder.tool_source(source);
    }
    Ok(builder)
}

#[cfg(feature = "sandbox")]
fn with_run_code(builder: AgentBuilder) -> AgentResult<AgentBuilder> {
    Ok(crate::code::with_run_code(builder))
}

#[cfg(not(feature = "sandbox"))]
fn with_run_code(_builder: AgentBuilder) -> AgentResult<AgentBuilder> {
    Err(keel_core::AgentError::invalid_input(
        "tools.run_code",
        "this build has no code sandbox (the `keel` crate's `sandbox` feature)",
    ))
}

fn policy(agent: &AgentConfig) -> CapabilityPolicy {
    let rule = |r: RuleConfig| match r {
        RuleConfig::Allow => CapabilityRule::Allow,
        RuleConfig::Deny => CapabilityRule::Deny,
        RuleConfig::RequireApproval => CapabilityRule::RequireApproval,
    };
    let declared = &agent.policy;
    let mut policy = CapabilityPolicy::new().with_default(rule(declared.default));
    for (patterns, r) in [
        (&declared.allow, CapabilityRule::Allow),
        (&declared.deny, CapabilityRule::Deny),
        (&declared.require_approval, CapabilityRule::RequireApproval),
    ] {
        for pattern in patterns {
            policy = policy.with_rule(pattern, r);
        }
    }
    policy
}

/// The model an agent declares, with its request settings, profile and `price` (from
/// `[prices]`).
fn model(declared: &ModelConfig, price: Option<ModelPrice>) -> AgentResult<Arc<dyn Llm>> {
    let api_key = declared.api_key.as_ref().map(|key| key.value());
    let llm = keel_llm::llm_from_spec_with_key(declared.id.get_ref(), api_key)?;
    if declared.temperature.is_none()
        && declared.max_output_tokens.is_none()
        && declared.context_window.is_none()
        && price.is_none()
    {
        return Ok(llm);
    }
    let mut profile = llm.profile();
    if let Some(price) = price {
        profile = profile.with_price(price);
    }
    if let Some(window) = declared.context_window {
        profile = profile.with_context_window(window);
    }
    if let Some(max) = declared.max_output_tokens {
        profile = profile.with_max_output_tokens(max);
    }
    Ok(Arc::new(TunedLlm {
        inner: llm,
        temperature: declared.temperature,
        max_output_tokens: declared.max_output_tokens,
        profile,
    }))
}

/// A model with the file's settings: every request gets the temperature and output cap the
/// file gives, unless the request sets its own, and the profile says the declared context
/// window.
struct TunedLlm {
    inner: Arc<dyn Llm>,
    temperature: Option<f64>,
    max_output_tokens: Option<u64>,
    profile: ModelProfile,
}

impl TunedLlm {
    fn tune(&self, mut request: LlmRequest) -> LlmRequest {
        request.temperature = request.temperature.or(self.temperature);
        request.max_output_tokens = request.max_output_tokens.or(self.max_output_tokens);
        request
    }
}

#[async_trait]
impl Llm for TunedLlm {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }
    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        self.inner.complete(self.tune(request)).await
    }
    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        self.inner.stream(self.tune(request))
    }
    fn profile(&self) -> ModelProfile {
        self.profile.clone()
    }
}
