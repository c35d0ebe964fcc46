//! The shape of `keel.toml`: one serde type per table, every table closed to unknown keys.
//! `docs/config.md` is the reference of every field; a test keeps the two in step.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use super::secret::EnvString;

/// A whole `keel.toml`: the server and the agents it serves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How the agents are served.
    #[serde(default)]
    pub server: ServerConfig,
    /// The agents, at least one; the first is the default unless `server.default_agent` says
    /// otherwise.
    pub agents: Vec<AgentConfig>,
    /// `[mcp.NAME]`: MCP servers shared by agents (one process or session for all of them).
    #[serde(default)]
    pub mcp: BTreeMap<String, McpServerConfig>,
    /// `[telemetry]`: where `keel serve` exports its traces.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[prices."MODEL"]`: what a model's tokens cost, by the model's id as agents write it
    /// (`openai:gpt-4o`); calls to a priced model record their cost (decision 185).
    #[serde(default)]
    pub prices: BTreeMap<String, PriceConfig>,
}

/// `[telemetry]`: the OTLP export of the runs' spans (docs/observability.md). The standard
/// `OTEL_*` environment variables win over it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL (`http://127.0.0.1:4318`); none: no export unless
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` names one.
    #[serde(default)]
    pub otlp_endpoint: Option<EnvString>,
    /// The `service.name` of the spans (`OTEL_SERVICE_NAME` wins; default `keel`).
    #[serde(default)]
    pub service_name: Option<String>,
    /// Put prompt and completion content on the spans, redacted.
    #[serde(default)]
    pub capture_content: bool,
}

#[cfg(feature = "otel")]
impl TelemetryConfig {
    /// What the exporter is given (the environment is read when it is installed).
    pub fn exporter(&self) -> keel_telemetry::TelemetryConfig {
        keel_telemetry::TelemetryConfig {
            endpoint: self.otlp_endpoint.as_ref().map(|e| e.value().to_owned()),
            service_name: self.service_name.clone(),
            capture_content: self.capture_content,
        }
    }
}

/// `[prices."MODEL"]`: a model's price in dollars (or the deployment's currency) per
/// million tokens.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Per million input (prompt) tokens.
    pub input: f64,
    /// Per million output (answer) tokens.
    pub output: f64,
}

/// `[server]`: where and how the agents are served.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    #[serde(default = "default_host")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[serde(default = "default_port")]
    pub port: u16,
    /// The URL clients use, when it differs from the listening address (behind a proxy).
    #[serde(default)]
    pub public_url: Option<EnvString>,
    /// Where tasks and threads are kept: `sqlite:PATH`, `redis://HOST:PORT`,
    /// `postgres://HOST/DATABASE` or `memory`.
    #[serde(default = "default_store")]
    pub store: EnvString,
    /// Prefix of every Redis key.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// The agent also served at `/` (default: the first agent).
    #[serde(default)]
    pub default_agent: Option<Spanned<String>>,
    /// API keys and the tenant each one maps to; with none, every caller is the one default
    /// tenant.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// Push notification targets.
    #[serde(default)]
    pub push: PushConfig,
    /// Seconds a thread lease lasts unless renewed.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_seconds: f64,
    /// Seconds an asynchronous tool call waits for its callback.
    #[serde(default = "default_async_tool_timeout")]
    pub async_tool_timeout_seconds: f64,
    /// Seconds a shutdown lets running tasks go on to their next step before it stops them
    /// where they are; either way they are handed on, not canceled.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_seconds: f64,
    /// Seconds a connection may take to send a request's headers.
    #[serde(default = "default_header_timeout")]
    pub header_timeout_seconds: f64,
    /// Seconds a request's body may take to arrive once its headers did.
    #[serde(default = "default_body_timeout")]
    pub body_timeout_seconds: f64,
    /// Seconds a keep-alive connection may stay open with no request in progress.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_seconds: f64,
    /// Most connections open at once; more wait to be accepted.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Serve Prometheus metrics at `/metrics` (docs/observability.md).
    #[serde(default)]
    pub metrics: bool,
    /// Label run metrics with the tenant (`app/user`): a series per tenant (decision 188).
    #[serde(default)]
    pub metrics_tenant_labels: bool,
    /// Serve the web console at `/console` (docs/console.md); unset, it is served when the
    /// server listens on a loopback address only.
    #[serde(default)]
    pub console: Option<bool>,
    /// How `keel serve` writes its log lines.
    #[serde(default)]
    pub log_format: LogFormat,
}

/// `[server] log_format`: how `keel serve` writes its log lines to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl ServerConfig {
    /// The connection deadlines and cap of this table (checked when the file was loaded).
    pub fn connection_limits(&self) -> keel_transport::ConnectionLimits {
        keel_transport::ConnectionLimits {
            header_timeout: std::time::Duration::from_secs_f64(self.header_timeout_seconds),
            body_timeout: std::time::Duration::from_secs_f64(self.body_timeout_seconds),
            idle_timeout: std::time::Duration::from_secs_f64(self.idle_timeout_seconds),
            max_connections: self.max_connections,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            public_url: None,
            store: default_store(),
            redis_prefix: default_redis_prefix(),
            default_agent: None,
            api_keys: Vec::new(),
            push: PushConfig::default(),
            lease_ttl_seconds: default_lease_ttl(),
            async_tool_timeout_seconds: default_async_tool_timeout(),
            drain_timeout_seconds: default_drain_timeout(),
            header_timeout_seconds: default_header_timeout(),
            body_timeout_seconds: default_body_timeout(),
            idle_timeout_seconds: default_idle_timeout(),
            max_connections: default_max_connections(),
            metrics: false,
            metrics_tenant_labels: false,
            console: None,
            log_format: LogFormat::Text,
        }
    }
}

fn default_drain_timeout() -> f64 {
    keel_agent::DEFAULT_DRAIN_TIMEOUT.as_secs_f64()
}
fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8080
}
fn default_store() -> EnvString {
    EnvString::plain("sqlite:./keel.db")
}
fn default_redis_prefix() -> String {
    "keel:".into()
}
fn default_lease_ttl() -> f64 {
    30.0
}
fn default_async_tool_timeout() -> f64 {
    3600.0
}
fn default_header_timeout() -> f64 {
    keel_transport::ConnectionLimits::DEFAULT_HEADER_TIMEOUT.as_secs_f64()
}
fn default_body_timeout() -> f64 {
    keel_transport::ConnectionLimits::DEFAULT_BODY_TIMEOUT.as_secs_f64()
}
fn default_idle_timeout() -> f64 {
    keel_transport::ConnectionLimits::DEFAULT_IDLE_TIMEOUT.as_secs_f64()
}
fn default_max_connections() -> usize {
    keel_transport::ConnectionLimits::DEFAULT_MAX_CONNECTIONS
}

/// `[[server.api_keys]]`: one API key and its tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The key (header `X-API-Key` or `Authorization: Bearer KEY`); write `${VAR}`.
    pub key: EnvString,
    /// The tenant, `APP/USER`.
    pub tenant: Spanned<String>,
}

/// `[server.push]`: where push notifications may go.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// Let webhooks reach loopback, private and link-local addresses (refused by default).
    #[serde(default)]
    pub allow_private_targets: bool,
    /// The only targets webhooks may reach, when given: URL prefixes
    /// (`https://hooks.example.com/a2a/`), host names (`hooks.example.com`,
    /// `*.example.com`) and IP addresses or CIDR blocks (`10.1.0.0/16`). A listed target is
    /// allowed even when private; anything else is refused.
    #[serde(default)]
    pub allow_targets: Vec<Spanned<String>>,
}

impl PushConfig {
    /// The allow list, parsed (the file was checked, so every entry parses).
    pub fn targets(&self) -> Vec<keel_transport::PushTarget> {
        self.allow_targets
            .iter()
            .filter_map(|entry| entry.get_ref().parse().ok())
            .collect()
    }
}

/// `[[agents]]`: one agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's name: its card's name and its path, `/agents/{name}/`.
    pub name: Spanned<String>,
    /// What it does, on its card.
    pub description: String,
    /// Its version, on its card.
    #[serde(default = "default_version")]
    pub version: String,
    /// The system instructions, inline.
    #[serde(default)]
    pub instructions: Option<String>,
    /// The system instructions, read from this file (relative to `keel.toml`).
    #[serde(default)]
    pub instructions_file: Option<Spanned<String>>,
    /// The model.
    #[serde(default)]
    pub model: ModelConfig,
    /// Skills listed on the card.
    #[serde(default)]
    pub skills: Vec<SkillConfig>,
    /// How a new task is taken on.
    #[serde(default)]
    pub negotiate: Negotiate,
    /// Tools declared without Rust.
    #[serde(default)]
    pub tools: ToolsConfig,
    /// Other agents of this file that the model may create as subagents.
    #[serde(default)]
    pub subagents: Vec<SubagentConfig>,
    /// Remote A2A agents the model may delegate to.
    #[serde(default)]
    pub remote_agents: Vec<RemoteAgentConfig>,
    /// `[agents.mcp.NAME]`: MCP servers of this agent alone.
    #[serde(default)]
    pub mcp: BTreeMap<String, McpServerConfig>,
    /// Which actions may run.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Limits of every run.
    #[serde(default)]
    pub budget: BudgetConfig,
    /// When a run stops.
    #[serde(default)]
    pub stop: StopConfig,
    /// Compact the thread's history before a model call that would not fit; none when
    /// absent.
    #[serde(default)]
    pub compaction: Option<CompactionConfig>,
}

/// `[agents.compaction]`: automatic compaction of what the model sees of a thread
/// (docs/compaction.md); every field but `strategy` has the engine's default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionConfig {
    /// `recent`, `tokens` or `summary`.
    pub strategy: keel_llm::CompactionStrategy,
    /// Compact when the estimated request exceeds this fraction of the context window.
    #[serde(default)]
    pub trigger_ratio: Option<f64>,
    /// The fraction of the window the compacted context aims for.
    #[serde(default)]
    pub target_ratio: Option<f64>,
    /// Most history messages `recent` keeps.
    #[serde(default)]
    pub max_messages: Option<usize>,
    /// Newest messages `summary` keeps verbatim.
    #[serde(default)]
    pub preserve_recent: Option<usize>,
    /// Longest summary, in tokens.
    #[serde(default)]
    pub summary_max_tokens: Option<u64>,
    /// The window to keep within, over the model profile's.
    #[serde(default)]
    pub context_window: Option<u64>,
}

impl CompactionConfig {
    /// The engine's setting: the engine's defaults, overridden by what the file says.
    pub fn auto(&self) -> keel_agent::AutoCompaction {
        let default = keel_agent::AutoCompaction::new(self.strategy);
        keel_agent::AutoCompaction {
            strategy: self.strategy,
            trigger_ratio: self.trigger_ratio.unwrap_or(default.trigger_ratio),
            target_ratio: self.target_ratio.unwrap_or(default.target_ratio),
            max_messages: self.max_messages.unwrap_or(default.max_messages),
            preserve_recent: self.preserve_recent.unwrap_or(default.preserve_recent),
            summary_max_tokens: self
                .summary_max_tokens
                .unwrap_or(default.summary_max_tokens),
            context_window: self.context_window.or(default.context_window),
        }
    }
}

/// `agents[].negotiate`: how an agent takes on a new task (decision 137).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Negotiate {
    /// Every task, with no model call.
    #[default]
    Accept,
    /// The agent's own model reads the first message and picks one of the card's skills,
    /// asks for more input or rejects it: one model call per new task.
    Model,
}

fn default_version() -> String {
    "0.1.0".into()
}

/// `[agents.model]`: which model and how it is asked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// `mock`, `openai:MODEL`, `anthropic:MODEL`, `gemini:MODEL` or
    /// `openai-compatible:URL:MODEL`.
    #[serde(default = "default_model")]
    pub id: Spanned<String>,
    /// Sampling temperature (the provider's default when absent).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The most tokens one answer may have.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// The model's context window in tokens, over the built-in table.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The API key, from the environment (`${VAR}`), over the provider's own variable.
    #[serde(default)]
    pub api_key: Option<EnvString>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            id: default_model(),
            temperature: None,
            max_output_tokens: None,
            context_window: None,
            api_key: None,
        }
    }
}

fn default_model() -> Spanned<String> {
    Spanned::new(0..0, "mock".into())
}

/// `[[agents.skills]]`: one skill on the card.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillConfig {
    /// Its id.
    pub id: String,
    /// Its name (default: the id).
    #[serde(default)]
    pub name: Option<String>,
    /// What it does.
    pub description: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example requests.
    #[serde(default)]
    pub examples: Vec<String>,
}

/// `[agents.tools]`: the tools an agent has, besides its subagents and remote agents.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// Built-in tools of the engine.
    #[serde(default)]
    pub builtin: Vec<BuiltinTool>,
    /// The sandboxed `run_code` tool (TypeScript or JavaScript, no I/O).
    #[serde(default)]
    pub run_code: bool,
    /// Tools that are HTTP endpoints.
    #[serde(default)]
    pub http: Vec<HttpToolConfig>,
}

/// A built-in tool of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltinTool {
    /// `ask_human`: the task waits in `input-required` for the human's answer.
    AskHuman,
    /// `session_stop` and `session_fail`: the model ends the task completed or failed.
    Lifecycle,
    /// `session_status`: a subagent reports progress to its parent.
    SessionStatus,
}

impl BuiltinTool {
    /// The name as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AskHuman => "ask_human",
            Self::Lifecycle => "lifecycle",
            Self::SessionStatus => "session_status",
        }
    }
}

/// `[[agents.tools.http]]`: a tool served by an HTTP endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    /// The name the model calls it by.
    pub name: Spanned<String>,
    /// What it does, for the model.
    pub description: String,
    /// The HTTP method (synchronous tools; an asynchronous tool always POSTs).
    #[serde(default = "default_method")]
    pub method: Spanned<String>,
    /// The URL; `{arg}` is replaced by that argument, percent-encoded.
    pub url: EnvString,
    /// Request headers; values may use `${VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, EnvString>,
    /// JSON schema of the arguments.
    #[serde(default = "default_parameters")]
    pub parameters: Spanned<Value>,
    /// Whether calling it twice with the same arguments is harmless.
    #[serde(default)]
    pub idempotent: bool,
    /// The endpoint answers later through the callback route instead of in its response.
    #[serde(default)]
    pub asynchronous: bool,
    /// Seconds to wait for the answer (synchronous) or the callback (asynchronous).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Capabilities a call needs, for the policy.
    #[serde(default)]
    pub capabilities: Vec<String>,
}

fn default_method() -> Spanned<String> {
    Spanned::new(0..0, "POST".into())
}

fn default_parameters() -> Spanned<Value> {
    Spanned::new(0..0, serde_json::json!({"type": "object"}))
}

/// `[mcp.NAME]` or `[agents.mcp.NAME]`: an MCP server whose tools an agent gets, named
/// `{NAME}_{tool}`. Give `command` (a stdio server) or `url` (streamable HTTP).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program of a stdio server.
    #[serde(default)]
    pub command: Option<Spanned<String>>,
    /// Its arguments; values may use `${VAR}`.
    #[serde(default)]
    pub args: Vec<EnvString>,
    /// Environment variables set for it; values may use `${VAR}`.
    #[serde(default)]
    pub env: BTreeMap<String, EnvString>,
    /// Its working directory, relative to `keel.toml` (default: Keel's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// The endpoint of a streamable HTTP server.
    #[serde(default)]
    pub url: Option<EnvString>,
    /// Headers sent to an HTTP server; values may use `${VAR}` (`Bearer ${TOKEN}`).
    #[serde(default)]
    pub headers: BTreeMap<String, EnvString>,
    /// When given, only these tools (their MCP names) are offered.
    #[serde(default)]
    pub allow_tools: Vec<String>,
    /// These tools (their MCP names) are never offered.
    #[serde(default)]
    pub deny_tools: Vec<String>,
    /// Seconds one call may take (default 60).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Seconds starting the server and its handshake may take (default 60).
    #[serde(default)]
    pub startup_timeout_seconds: Option<f64>,
    /// Capabilities every call to its tools needs, besides `mcp.NAME.TOOL`, `mcp.read` or
    /// `mcp.write`, and `mcp.destructive`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Flags of single tools (by MCP name) over what the server's annotations say.
    #[serde(default)]
    pub tools: BTreeMap<String, McpToolConfig>,
    /// For a shared server (`[mcp.NAME]`): the agents that get its tools (default: every
    /// agent).
    #[serde(default)]
    pub agents: Option<Vec<Spanned<String>>>,
}

/// `[mcp.NAME.tools.TOOL]`: one tool's flags, over the server's annotations.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolConfig {
    /// It changes nothing.
    #[serde(default)]
    pub read_only: Option<bool>,
    /// It may destroy or overwrite data.
    #[serde(default)]
    pub destructive: Option<bool>,
    /// Calling it twice with the same arguments is harmless.
    #[serde(default)]
    pub idempotent: Option<bool>,
}

impl McpServerConfig {
    /// How the server is shown (its command line or URL), every `${VAR}` masked.
    pub fn shown(&self) -> String {
        match (&self.command, &self.url) {
            (Some(command), _) => std::iter::once(command.get_ref().clone())
                .chain(self.args.iter().map(ToString::to_string))
                .collect::<Vec<_>>()
                .join(" "),
            (None, Some(url)) => url.to_string(),
            (None, None) => String::new(),
        }
    }
}

/// `[[agents.subagents]]`: another agent of the file as a kind of subagent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubagentConfig {
    /// The name of the agent (in this file) that children run.
    pub agent: Spanned<String>,
    /// The kind's name for the model (default: the agent's name).
    #[serde(default)]
    pub kind: Option<String>,
    /// What the kind is for (default: the agent's description).
    #[serde(default)]
    pub description: Option<String>,
    /// The most children of this kind alive at once per parent thread.
    #[serde(default)]
    pub max_instances: Option<usize>,
    /// Whether a child takes further messages after its first answer.
    #[serde(default)]
    pub resumable: bool,
}

/// `[[agents.remote_agents]]`: a remote A2A agent to delegate to, as a tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteAgentConfig {
    /// The tool's name.
    pub name: Spanned<String>,
    /// What the remote agent does, for the model.
    pub description: String,
    /// The remote agent's base URL (its card is at `.well-known/agent-card.json` under it).
    pub url: EnvString,
}

/// `[agents.policy]`: capability rules; a pattern may end in `*`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The rule for capabilities no pattern matches.
    #[serde(default = "default_rule")]
    pub default: RuleConfig,
    /// Capabilities that may run.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Capabilities that never run.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Capabilities that wait for an approval.
    #[serde(default)]
    pub require_approval: Vec<String>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            default: default_rule(),
            allow: Vec::new(),
            deny: Vec::new(),
            require_approval: Vec::new(),
        }
    }
}

fn default_rule() -> RuleConfig {
    RuleConfig::Allow
}

/// A policy rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleConfig {
    /// Run it.
    Allow,
    /// Never run it.
    Deny,
    /// Wait for an approval.
    RequireApproval,
}

/// `[agents.budget]`: limits of every run (a caller's run context can narrow them).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Model steps.
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// Model calls.
    #[serde(default)]
    pub max_llm_calls: Option<u32>,
    /// Tool calls.
    #[serde(default)]
    pub max_tool_calls: Option<u32>,
    /// Input tokens.
    #[serde(default)]
    pub max_input_tokens: Option<u64>,
    /// Output tokens.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Wall-clock seconds.
    #[serde(default)]
    pub max_runtime_seconds: Option<f64>,
    /// Dollars (the `[prices]` currency) of model calls; the agent's model needs a price.
    #[serde(default)]
    pub max_cost: Option<f64>,
}

impl BudgetConfig {
    /// `max_cost` in micro-dollars (the file was checked: it is finite and not negative).
    pub fn max_cost_micros(&self) -> Option<u64> {
        self.max_cost.map(|dollars| (dollars * 1e6).round() as u64)
    }
}

/// `[agents.stop]`: when a run stops, besides a final answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopConfig {
    /// The most model steps one task may take.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// The most turns a thread may hold.
    #[serde(default)]
    pub max_session_turns: Option<u32>,
    /// A tool whose successful call ends the task with its output.
    #[serde(default)]
    pub stop_tool: Option<Spanned<String>>,
    /// End the task when the model answers without tool calls.
    #[serde(default = "yes")]
    pub stop_on_response: bool,
    /// How many identical invalid tool calls the model may repeat.
    #[serde(default = "default_invalid_repeats")]
    pub max_invalid_repeats: u32,
}

impl Default for StopConfig {
    fn default() -> Self {
        Self {
            max_steps: default_max_steps(),
            max_session_turns: None,
            stop_tool: None,
            stop_on_response: true,
            max_invalid_repeats: default_invalid_repeats(),
        }
    }
}

fn default_max_steps() -> u32 {
    keel_agent::Agent::DEFAULT_MAX_STEPS
}
fn default_invalid_repeats() -> u32 {
    3
}
fn yes() -> bool {
    true
}
