//! Agents from a file: `keel.toml` declares the server and one or more agents (card, skills,
//! instructions, model, tools, subagents, remote agents, policy, budget, stop rules), and
//! [`Config::from_path`] loads and checks it in one call. [`Config::agents`] builds the
//! agents on a runtime, with any Rust tools a program adds to them. The reference of every
//! field is `docs/config.md`.
//!
//! ```
//! let config = keel::Config::parse(
//!     r#"
//!     [[agents]]
//!     name = "greeter"
//!     description = "Greets."
//!     "#,
//!     "keel.toml",
//! )?;
//! assert_eq!(config.default_agent().name(), "greeter");
//! # Ok::<(), keel::config::ConfigError>(())
//! ```

mod build;
mod error;
mod mcp;
mod secret;
mod types;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

pub use build::{AgentSet, AgentSetBuilder, ConfiguredAgent};
pub use error::{ConfigError, ConfigProblem};
pub use mcp::MCP_TIMEOUT_SECONDS;
pub use secret::{EnvString, MASK};
pub use types::*;

/// Tool names the engine keeps for its own tools.
const RESERVED_TOOL_NAMES: [&str; 6] = [
    keel_agent::SESSION_STOP_TOOL,
    keel_agent::SESSION_FAIL_TOOL,
    keel_agent::ASK_HUMAN_TOOL,
    keel_agent::SUBAGENT_CREATE_TOOL,
    keel_agent::SUBAGENT_MESSAGE_TOOL,
    keel_agent::SESSION_STATUS_TOOL,
];

/// The lease TTLs Keel accepts (`[server] lease_ttl_seconds`, `keel serve --lease-ttl`).
pub const LEASE_TTL_SECONDS: SecondsRange = SecondsRange::new(0.1, 86_400.0);

/// The asynchronous tool timeouts Keel accepts (`[server] async_tool_timeout_seconds`,
/// `--async-tool-timeout`).
pub const ASYNC_TOOL_TIMEOUT_SECONDS: SecondsRange = SecondsRange::new(0.001, 31_536_000.0);

/// The drain timeouts Keel accepts (`[server] drain_timeout_seconds`, `--drain-timeout`): 0
/// stops running tasks at once (still handing them on), an hour at most.
pub const DRAIN_TIMEOUT_SECONDS: SecondsRange = SecondsRange::new(0.0, 3_600.0);

/// The connection deadlines Keel accepts (`[server] header_timeout_seconds`,
/// `body_timeout_seconds`, `idle_timeout_seconds`; `keel serve --header-timeout`, ...).
pub const CONNECTION_TIMEOUT_SECONDS: SecondsRange = SecondsRange::new(0.001, 86_400.0);

/// The seconds a duration setting accepts, the file's and the command line's alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SecondsRange {
    /// The shortest.
    pub min: f64,
    /// The longest.
    pub max: f64,
}

impl SecondsRange {
    /// From `min` to `max` seconds, both included.
    pub const fn new(min: f64, max: f64) -> Self {
        Self { min, max }
    }

    /// `seconds` as a duration when in range; otherwise what the range is.
    ///
    /// ```
    /// use keel::config::LEASE_TTL_SECONDS;
    /// assert_eq!(LEASE_TTL_SECONDS.check(2.0), Ok(std::time::Duration::from_secs(2)));
    /// assert_eq!(LEASE_TTL_SECONDS.check(0.0).unwrap_err(), "use 0.1 to 86400 seconds");
    /// ```
    pub fn check(&self, seconds: f64) -> Result<std::time::Duration, String> {
        if seconds.is_finite() && (self.min..=self.max).contains(&seconds) {
            Ok(std::time::Duration::from_secs_f64(seconds))
        } else {
            Err(format!("use {} to {} seconds", self.min, self.max))
        }
    }
}

/// The file `keel serve` and `keel check` read when none is named.
pub const DEFAULT_CONFIG_FILE: &str = "keel.toml";

/// The commented `keel.toml` that `keel init` writes: two agents on the offline model, every
/// section shown.
pub const TEMPLATE: &str = include_str!("template.toml");

/// A checked `keel.toml`, with where it came from (instruction files are read relative to
/// it).
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The file's contents.
    pub config: Config,
    /// The file.
    pub path: PathBuf,
    /// Instructions of each agent, read from their files.
    instructions: HashMap<String, String>,
}

impl std::ops::Deref for LoadedConfig {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.config
    }
}

impl Config {
    /// Read and check `path`: syntax, types, unknown keys, `${VAR}` references, names that
    /// must refer to something, model ids, instruction files.
    pub fn from_path(path: impl AsRef<Path>) -> Result<LoadedConfig, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|err| ConfigError::whole(path, "", format!("cannot read the file: {err}")))?;
        Self::parse(&text, path)
    }

    /// Check `text` as if read from `path` (which names the file in errors and is where
    /// instruction files are looked up).
    pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<LoadedConfig, ConfigError> {
        let path = path.as_ref();
        // The typed parse stops at the first unset `${VAR}`, with its place; the others are
        // named with it, so a file is fixed in one go.
        let missing = text
            .parse::<toml::Table>()
            .map(|document| secret::missing_variables(&document, |name| std::env::var(name).ok()))
            .unwrap_or_default();
        // So are the provider keys (OPENAI_API_KEY, ...) of the models that take theirs from
        // the environment: variables to set as much as a `${VAR}` is.
        let models = text
            .parse::<toml::Table>()
            .map(|document| model_failures(raw_models(&document)))
            .unwrap_or_default();
        let also_missing = |mut error: ConfigError| {
            if error.message.contains("is not set") {
                if missing.len() > 1 {
                    let others: Vec<String> = missing[1..]
                        .iter()
                        .map(|(name, field)| format!("`{name}` ({field})"))
                        .collect();
                    error.message =
                        format!("{}; also not set: {}", error.message, others.join(", "));
                }
                error.message.push_str(&also(&models));
            }
            error
        };
        let deserializer = toml::de::Deserializer::parse(text)
            .map_err(|err| toml_error(path, text, err, String::new()))?;
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let field = err.path().to_string();
            also_missing(toml_error(path, text, err.into_inner(), field))
        })?;
        let instructions = config.check(text, path)?;
        Ok(LoadedConfig {
            config,
            path: path.to_owned(),
            instructions,
        })
    }

    /// The agent served at `/` as well as under its name.
    pub fn default_agent(&self) -> &AgentConfig {
        self.server
            .default_agent
            .as_ref()
            .and_then(|name| self.agent(name.get_ref()))
            .unwrap_or(&self.agents[0])
    }

    /// The agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name.get_ref() == name)
    }

    /// What serde cannot check: names that must be unique or refer to something, values in
    /// range, files that must exist. Returns each agent's instructions read from its file.
    fn check(&self, text: &str, path: &Path) -> Result<HashMap<String, String>, ConfigError> {
        let at = |span: std::ops::Range<usize>, field: String, message: String| {
            ConfigError::at(path, text, Some(span), field, message)
        };
        if self.agents.is_empty() {
            return Err(ConfigError::whole(
                path,
                "agents",
                "declare at least one agent ([[agents]] with a name and a description)",
            ));
        }
        let server = &self.server;
        LEASE_TTL_SECONDS
            .check(server.lease_ttl_seconds)
            .map_err(|range| ConfigError::whole(path, "server.lease_ttl_seconds", range))?;
        ASYNC_TOOL_TIMEOUT_SECONDS
            .check(server.async_tool_timeout_seconds)
            .map_err(|range| {
                ConfigError::whole(path, "server.async_tool_timeout_seconds", range)
            })?;
        DRAIN_TIMEOUT_SECONDS
            .check(server.drain_timeout_seconds)
            .map_err(|range| ConfigError::whole(path, "server.drain_timeout_seconds", range))?;
        for (field, seconds) in [
            (
                "server.header_timeout_seconds",
                server.header_timeout_seconds,
            ),
            ("server.body_timeout_seconds", server.body_timeout_seconds),
            ("server.idle_timeout_seconds", server.idle_timeout_seconds),
        ] {
            CONNECTION_TIMEOUT_SECONDS
                .check(seconds)
                .map_err(|range| ConfigError::whole(path, field, range))?;
        }
        if server.max_connections == 0 {
            return Err(ConfigError::whole(
                path,
                "server.max_connections",
                "use at least 1",
            ));
        }
        for (model, price) in &self.prices {
            if keel_core::ModelPrice::per_million(price.input, price.output).is_none() {
                return Err(ConfigError::whole(
                    path,
                    format!("prices.\"{model}\""),
                    "give `input` and `output` as dollars per million tokens, 0 or more",
                ));
            }
        }
        for (i, agent) in self.agents.iter().enumerate() {
            let Some(compaction) = &agent.compaction else {
                continue;
            };
            for (name, ratio) in [
                ("trigger_ratio", compaction.trigger_ratio),
                ("target_ratio", compaction.target_ratio),
            ] {
                if ratio.is_some_and(|ratio| !(ratio > 0.0 && ratio <= 1.0)) {
                    return Err(ConfigError::whole(
                        path,
                        format!("agents[{i}].compaction.{name}"),
                        "use a fraction of the context window, above 0 and at most 1",
                    ));
                }
            }
        }
        for (i, agent) in self.agents.iter().enumerate() {
            let Some(max) = agent.budget.max_cost else {
                continue;
            };
            let field = format!("agents[{i}].budget.max_cost");
            if !(max.is_finite() && (0.0..=1e12).contains(&max)) {
                return Err(ConfigError::whole(path, field, "use dollars, 0 or more"));
            }
            // A cost limit on a model with no price could never be enforced: refused here
            // rather than left to let every call through (decision 186).
            let model = agent.model.id.get_ref();
            if !self.prices.contains_key(model) {
                return Err(ConfigError::whole(
                    path,
                    field,
                    format!("`{model}` has no price: add [prices.\"{model}\"] with `input` and `output`"),
                ));
            }
        }
        for (i, key) in server.api_keys.iter().enumerate() {
            let tenant = key.tenant.get_ref();
            let valid = tenant
                .split_once('/')
                .is_some_and(|(app, user)| !app.is_empty() && !user.is_empty());
            if !valid {
                return Err(at(
                    key.tenant.span(),
                    format!("server.api_keys[{i}].tenant"),
                    format!("`{tenant}` must look like APP/USER"),
                ));
            }
            if key.key.value().is_empty() {
                return Err(ConfigError::whole(
                    path,
                    format!("server.api_keys[{i}].key"),
                    "the key is empty",
                ));
            }
        }
        for (i, entry) in server.push.allow_targets.iter().enumerate() {
            if let Err(reason) = entry.get_ref().parse::<keel_transport::PushTarget>() {
                return Err(at(
                    entry.span(),
                    format!("server.push.allow_targets[{i}]"),
                    reason,
                ));
            }
        }
        let names: Vec<&str> = self
            .agents
            .iter()
            .map(|a| a.name.get_ref().as_str())
            .collect();
        let mut seen = HashSet::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let name = agent.name.get_ref();
            if !is_plain_name(name) {
                return Err(at(
                    agent.name.span(),
                    format!("agents[{i}].name"),
                    format!("`{name}` must be letters, digits, `-` or `_` (it is a URL path)"),
                ));
            }
            if !seen.insert(name.as_str()) {
                return Err(at(
                    agent.name.span(),
                    format!("agents[{i}].name"),
                    format!("`{name}` names two agents"),
                ));
            }
        }
        if let Some(default) = &server.default_agent {
            if !names.contains(&default.get_ref().as_str()) {
                return Err(at(
                    default.span(),
                    "server.default_agent".into(),
                    format!("no agent is named `{}`", default.get_ref()),
                )
                .suggest_from(default.get_ref(), names.iter().copied()));
            }
        }
        let mut instructions = HashMap::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let field = |rest: &str| format!("agents[{i}].{rest}");
            if let Some(file) = &agent.instructions_file {
                if agent.instructions.is_some() {
                    return Err(at(
                        file.span(),
                        field("instructions_file"),
                        "give `instructions` or `instructions_file`, not both".into(),
                    ));
                }
                let full = path
                    .parent()
                    .unwrap_or_else(|| Path::new("."))
                    .join(file.get_ref());
                let read = std::fs::read_to_string(&full).map_err(|err| {
                    at(
                        file.span(),
                        field("instructions_file"),
                        format!("cannot read `{}`: {err}", full.display()),
                    )
                })?;
                instructions.insert(agent.name.get_ref().clone(), read);
            }
            let model = &agent.model;
            if let Some(key) = &model.api_key {
                // Only a reference: a key written into the file would sit in version control.
                if !key.is_secret() || key.value().is_empty() {
                    return Err(ConfigError::whole(
                        path,
                        field("model.api_key"),
                        "write the key as `${VAR}`, an environment variable that holds it",
                    ));
                }
            }
            let api_key = model.api_key.as_ref().map(EnvString::value);
            if let Err(err) = keel_llm::llm_from_spec_with_key(model.id.get_ref(), api_key) {
                // The later agents' models are named with it: every key to set, at once.
                let later = self.agents.iter().enumerate().skip(i + 1).map(|(j, a)| {
                    let key = a.model.api_key.as_ref().map(EnvString::value);
                    (j, a.model.id.get_ref().as_str(), key)
                });
                let reason = model_failure(&err) + &also(&model_failures(later));
                return Err(at(model.id.span(), field("model.id"), reason));
            }
            if let Some(temperature) = model.temperature {
                if !(0.0..=2.0).contains(&temperature) {
                    return Err(ConfigError::whole(
                        path,
                        field("model.temperature"),
                        "use 0.0 to 2.0",
                    ));
                }
            }
            // Tool names the file gives this agent: each once, none a built-in's.
            let mut tool_names: HashSet<&str> = HashSet::new();
            let named = agent
                .tools
                .http
                .iter()
                .enumerate()
                .map(|(j, t)| (&t.name, format!("tools.http[{j}].name")))
                .chain(
                    agent
                        .remote_agents
                        .iter()
                        .enumerate()
                        .map(|(j, r)| (&r.name, format!("remote_agents[{j}].name"))),
                );
            for (name, at_field) in named {
                let taken = RESERVED_TOOL_NAMES.contains(&name.get_ref().as_str())
                    || (agent.tools.run_code && name.get_ref() == "run_code");
                if taken || !tool_names.insert(name.get_ref()) {
                    return Err(at(
                        name.span(),
                        field(&at_field),
                        format!("the agent already has a tool named `{}`", name.get_ref()),
                    ));
                }
            }
            for (j, tool) in agent.tools.http.iter().enumerate() {
                if let Err(err) = jsonschema::validator_for(tool.parameters.get_ref()) {
                    return Err(at(
                        tool.parameters.span(),
                        field(&format!("tools.http[{j}].parameters")),
                        format!("not a valid JSON schema: {err}"),
                    ));
                }
                let method = tool.method.get_ref();
                if tool.asynchronous && !method.eq_ignore_ascii_case("POST") {
                    return Err(at(
                        tool.method.span(),
                        field(&format!("tools.http[{j}].method")),
                        "an asynchronous tool is always POSTed its invocation".into(),
                    ));
                }
                if reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).is_err() {
                    return Err(at(
                        tool.method.span(),
                        field(&format!("tools.http[{j}].method")),
                        format!("`{method}` is not an HTTP method"),
                    )
                    .suggest_from(
                        &method.to_ascii_uppercase(),
                        ["GET", "POST", "PUT", "PATCH", "DELETE"],
                    ));
                }
                if !tool.url.value().starts_with("http://")
                    && !tool.url.value().starts_with("https://")
                {
                    return Err(ConfigError::whole(
                        path,
                        field(&format!("tools.http[{j}].url")),
                        format!("`{}` must start with http:// or https://", tool.url),
                    ));
                }
            }
            for (j, sub) in agent.subagents.iter().enumerate() {
                let target = sub.agent.get_ref();
                if target == agent.name.get_ref() {
                    return Err(at(
                        sub.agent.span(),
                        field(&format!("subagents[{j}].agent")),
                        "an agent cannot be its own subagent".into(),
                    ));
                }
                if !names.contains(&target.as_str()) {
                    return Err(at(
                        sub.agent.span(),
                        field(&format!("subagents[{j}].agent")),
                        format!("no agent of this file is named `{target}`"),
                    )
                    .suggest_from(target, names.iter().copied()));
                }
            }
        }
        mcp::check(self, text, path)?;
        if let Some(cycle) = self.subagent_cycle() {
            return Err(ConfigError::whole(
                path,
                "agents.subagents",
                format!("subagents go round in a circle: {}", cycle.join(" -> ")),
            ));
        }
        Ok(instructions)
    }

    /// A chain of subagent references that comes back to where it started, if any.
    fn subagent_cycle(&self) -> Option<Vec<String>> {
        fn visit<'a>(
            config: &'a Config,
            name: &'a str,
            chain: &mut Vec<&'a str>,
            done: &mut HashSet<&'a str>,
        ) -> Option<Vec<String>> {
            if let Some(start) = chain.iter().position(|n| *n == name) {
                let mut cycle: Vec<String> =
                    chain[start..].iter().map(|n| (*n).to_owned()).collect();
                cycle.push(name.to_owned());
                return Some(cycle);
            }
            if !done.insert(name) {
                return None;
            }
            chain.push(name);
            for sub in config.agent(name).map(|a| &a.subagents[..]).unwrap_or(&[]) {
                if let Some(cycle) = visit(config, sub.agent.get_ref(), chain, done) {
                    return Some(cycle);
                }
            }
            chain.pop();
            None
        }
        let mut done = HashSet::new();
        self.agents
            .iter()
            .find_map(|a| visit(self, a.name.get_ref(), &mut Vec::new(), &mut done))
    }
}

/// Whether `name` is letters, digits, `-` and `_` only, and not empty: what an agent's name
/// (a URL path) and an MCP server's (a tool-name prefix) may be.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl AgentConfig {
    /// The agent's name.
    pub fn name(&self) -> &str {
        self.name.get_ref()
    }
}

/// A toml or serde error as a [`ConfigError`], with a suggestion for an unknown key.
fn toml_error(path: &Path, text: &str, error: toml::de::Error, field: String) -> ConfigError {
    let message = error.message().trim().to_owned();
    let field = if field == "." { String::new() } else { field };
    let suggestion = error::unknown_name(&message)
        .and_then(|(wrong, expected)| error::closest(wrong, expected).map(str::to_owned));
    let mut config_error = ConfigError::at(path, text, error.span(), field, message);
    config_error.suggestion = suggestion;
    config_error
}

impl LoadedConfig {
    /// The system instructions of `agent`: inline, or read from its file when loaded.
    pub fn instructions_of(&self, agent: &AgentConfig) -> String {
        self.instructions
            .get(agent.name())
            .cloned()
            .or_else(|| agent.instructions.clone())
            .unwrap_or_default()
    }
}

/// Why a model could not be built, as a file's reader is told.
fn model_failure(err: &keel_core::AgentError) -> String {
    match err {
        keel_core::AgentError::InvalidInput { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// The agents' models of `models` (index, model id, API key) that cannot be built, each with
/// its field and why (a provider key not set, most often).
fn model_failures<'a>(
    models: impl IntoIterator<Item = (usize, &'a str, Option<&'a str>)>,
) -> Vec<(String, String)> {
    models
        .into_iter()
        .filter_map(|(i, id, key)| {
            let err = keel_llm::llm_from_spec_with_key(id, key).err()?;
            Some((format!("agents[{i}].model.id"), model_failure(&err)))
        })
        .collect()
}

/// The models of a file not yet typed (`[[agents]]` tables' `model.id`) that take their key
/// from the provider's variable: one given as `model.api_key` is a `${VAR}`, named as such.
fn raw_models(document: &toml::Table) -> Vec<(usize, &str, Option<&str>)> {
    let agents = document.get("agents").and_then(toml::Value::as_array);
    agents
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, agent)| {
            let model = agent.get("model")?.as_table()?;
            if model.contains_key("api_key") {
                return None;
            }
            Some((i, model.get("id")?.as_str()?, None))
        })
        .collect()
}

/// `; also: FIELD: WHY; ...` for `failures` (field, why), or nothing when there are none.
fn also(failures: &[(String, String)]) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let said: Vec<String> = failures
        .iter()
        .map(|(field, why)| format!("{field}: {why}"))
        .collect();
    format!("; also: {}", said.join("; "))
}

#[cfg(test)]
mod tests;
