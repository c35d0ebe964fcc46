//! Agent cards: an agent's identity, skills, capabilities and security requirements.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How the agent is reached (seed 001's transport types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// Request/response over HTTP (A2A JSON-RPC or REST).
    #[default]
    Http,
    /// Server-sent events.
    Sse,
    /// A WebSocket.
    Websocket,
    /// In-process, no network.
    Runtime,
}

/// The agent's responsibility in a system topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentRole {
    /// Does work handed to it.
    #[default]
    Worker,
    /// Coordinates other agents.
    Orchestrator,
    /// Routes requests to other agents.
    Router,
    /// Observes and reports.
    Observer,
}

/// What the agent can do, beyond A2A's flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentCapabilities {
    /// Streams task events.
    pub streaming: bool,
    /// Sends push notifications (webhooks).
    pub push_notifications: bool,
    /// Keeps detailed state history.
    pub state_transition_history: bool,
    /// Has a model.
    pub has_llm: bool,
    /// Maximum concurrent tasks.
    pub max_concurrency: u32,
    /// Processes several messages per request.
    pub message_batching: bool,
    /// Calls tools.
    pub tool_calling: bool,
    /// Reasons in several steps.
    pub multi_step_reasoning: bool,
    /// Respects timeouts.
    pub timeout_support: bool,
    /// Delegates to other agents.
    pub delegation: bool,
    /// Retrieval-augmented generation.
    pub rag: bool,
    /// Has a code execution sandbox.
    pub code_execution: bool,
}

impl Default for AgentCapabilities {
    fn default() -> Self {
        Self {
            streaming: false,
            push_notifications: false,
            state_transition_history: false,
            has_llm: false,
            max_concurrency: 1,
            message_batching: false,
            tool_calling: false,
            multi_step_reasoning: false,
            timeout_support: false,
            delegation: true,
            rag: false,
            code_execution: false,
        }
    }
}

impl AgentCapabilities {
    /// Names of the enabled boolean capabilities, in declaration order.
    ///
    /// ```
    /// let caps = keel_core::AgentCapabilities { tool_calling: true, ..Default::default() };
    /// assert_eq!(caps.enabled(), vec!["tool_calling", "delegation"]);
    /// ```
    pub fn enabled(&self) -> Vec<&'static str> {
        [
            ("streaming", self.streaming),
            ("push_notifications", self.push_notifications),
            ("state_transition_history", self.state_transition_history),
            ("has_llm", self.has_llm),
            ("message_batching", self.message_batching),
            ("tool_calling", self.tool_calling),
            ("multi_step_reasoning", self.multi_step_reasoning),
            ("timeout_support", self.timeout_support),
            ("delegation", self.delegation),
            ("rag", self.rag),
            ("code_execution", self.code_execution),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect()
    }
}

/// Something the agent can do, advertised to callers.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSkill {
    /// Unique, human-readable id.
    pub id: String,
    /// Display name (defaults to the id).
    #[serde(default)]
    pub name: String,
    /// What the skill does.
    #[serde(default)]
    pub description: String,
    /// JSON schema of accepted input.
    pub input_schema: Option<Value>,
    /// JSON schema of produced output.
    pub output_schema: Option<Value>,
    /// Categories.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Example requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
}

impl AgentSkill {
    /// A skill with an id and a description.
    pub fn new(id: impl Into<String>, description: impl Into<String>) -> Self {
        let id = id.into();
        Self {
            name: id.clone(),
            id,
            description: description.into(),
            input_schema: None,
            output_schema: None,
            tags: Vec::new(),
            examples: Vec::new(),
        }
    }

    /// Add tags.
    #[must_use]
    pub fn with_tags<I: IntoIterator<Item = S>, S: Into<String>>(mut self, tags: I) -> Self {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// Add an example request.
    #[must_use]
    pub fn with_example(mut self, example: impl Into<String>) -> Self {
        self.examples.push(example.into());
        self
    }

    /// Set the input schema.
    #[must_use]
    pub fn with_input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// Set the output schema.
    #[must_use]
    pub fn with_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }
}

/// How callers authenticate.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SecurityScheme {
    /// An API key in a header, query parameter or cookie.
    ApiKey {
        /// `header`, `query` or `cookie`.
        location: String,
        /// The header, parameter or cookie name.
        name: String,
        /// Explanation for callers.
        description: Option<String>,
    },
    /// HTTP authentication (`bearer`, `basic`).
    Http {
        /// The scheme name.
        scheme: String,
        /// Hint at the token format (`JWT`).
        bearer_format: Option<String>,
        /// Explanation for callers.
        description: Option<String>,
    },
    /// OAuth 2.0 with its flows, as A2A describes them.
    #[serde(rename = "oauth2")]
    OAuth2 {
        /// The flows object.
        flows: Value,
        /// Explanation for callers.
        description: Option<String>,
    },
    /// OpenID Connect discovery.
    OpenIdConnect {
        /// The discovery URL.
        open_id_connect_url: String,
        /// Explanation for callers.
        description: Option<String>,
    },
    /// Mutual TLS.
    #[serde(rename = "mutualTLS")]
    MutualTls {
        /// Explanation for callers.
        description: Option<String>,
    },
}

/// An agent's identity and capability declaration.
///
/// ```
/// use keel_core::{AgentCard, AgentSkill};
/// let card = AgentCard::new("weather_agent", "Weather service", "http://127.0.0.1:8080")
///     .with_skill(AgentSkill::new("forecast", "Forecast for a city"));
/// assert!(card.prompt_format().contains("forecast"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCard {
    /// Agent name.
    pub name: String,
    /// What the agent is for.
    pub description: String,
    /// Service endpoint URL.
    pub url: String,
    /// How it is reached.
    #[serde(default)]
    pub transport: TransportKind,
    /// The agent's version.
    #[serde(default = "default_version")]
    pub version: String,
    /// The protocol version it speaks.
    #[serde(default = "default_protocol_version")]
    pub protocol_version: String,
    /// Supported features.
    #[serde(default)]
    pub capabilities: AgentCapabilities,
    /// What it can do.
    #[serde(default)]
    pub skills: Vec<AgentSkill>,
    /// Accepted input MIME types.
    #[serde(default = "default_formats")]
    pub input_formats: Vec<String>,
    /// Produced output MIME types.
    #[serde(default = "default_formats")]
    pub output_formats: Vec<String>,
    /// Authentication schemes by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub security_schemes: BTreeMap<String, SecurityScheme>,
    /// Role in a system topology.
    #[serde(default)]
    pub role: AgentRole,
    /// Discovery tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

fn default_version() -> String {
    "1.0.0".into()
}

fn default_protocol_version() -> String {
    "1.0".into()
}

fn default_formats() -> Vec<String> {
    vec!["text/plain".into()]
}

impl AgentCard {
    /// A card with the required fields and defaults for the rest.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        url: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            url: url.into(),
            transport: TransportKind::Http,
            version: default_version(),
            protocol_version: default_protocol_version(),
            capabilities: AgentCapabilities::default(),
            skills: Vec::new(),
            input_formats: default_formats(),
            output_formats: default_formats(),
            security_schemes: BTreeMap::new(),
            role: AgentRole::Worker,
            tags: Vec::new(),
        }
    }

    /// Add a skill.
    #[must_use]
    pub fn with_skill(mut self, skill: AgentSkill) -> Self {
        self.skills.push(skill);
        self
    }

    /// Add tags.
    #[must_use]
    pub fn with_tags<I: IntoIterator<Item = S>, S: Into<String>>(mut self, tags: I) -> Self {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }

    /// A human-readable description of the agent and its skills for a model's system prompt,
    /// so that other agents know what to delegate to it.
    pub fn prompt_format(&self) -> String {
        let mut out = format!("Agent: {}\nDescription: {}\n", self.name, self.description);
        out.push_str(&format!("Role: {}\n", serde_plain_name(&self.role)));
        if !self.tags.is_empty() {
            out.push_str(&format!("Tags: {}\n", self.tags.join(", ")));
        }
        out.push_str(&format!(
            "Input formats: {}\nOutput formats: {}\n",
            self.input_formats.join(", "),
            self.output_formats.join(", ")
        ));
        let enabled = self.capabilities.enabled();
        if !enabled.is_empty() {
            out.push_str(&format!("Capabilities: {}\n", enabled.join(", ")));
        }
        if self.skills.is_empty() {
            out.push_str("Skills: none declared\n");
        } else {
            out.push_str("Skills:\n");
            for skill in &self.skills {
                out.push_str(&format!("- {}: {}\n", skill.id, skill.description));
                if let Some(schema) = &skill.input_schema {
                    out.push_str(&format!("  input schema: {schema}\n"));
                }
                if !skill.examples.is_empty() {
                    out.push_str(&format!("  examples: {}\n", skill.examples.join("; ")));
                }
            }
        }
        out
    }
}

fn serde_plain_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn card_round_trips_with_every_field() {
        let mut card = AgentCard::new("a", "b", "http://x")
            .with_skill(
                AgentSkill::new("s", "does s")
                    .with_tags(["t"])
                    .with_example("do s")
                    .with_input_schema(json!({"type": "object"}))
                    .with_output_schema(json!({"type": "string"})),
            )
            .with_tags(["finance"]);
        card.role = AgentRole::Orchestrator;
        card.transport = TransportKind::Websocket;
        card.security_schemes.insert(
            "key".into(),
            SecurityScheme::ApiKey {
                location: "header".into(),
                name: "X-Api-Key".into(),
                description: None,
            },
        );
        card.security_schemes.insert(
            "bearer".into(),
            SecurityScheme::Http {
                scheme: "bearer".into(),
                bearer_format: Some("JWT".into()),
                description: None,
            },
        );
        card.security_schemes.insert(
            "mtls".into(),
            SecurityScheme::MutualTls { description: None },
        );
        let json = serde_json::to_value(&card).unwrap();
        assert_eq!(json["security_schemes"]["mtls"]["type"], "mutualTLS");
        let back: AgentCard = serde_json::from_value(json).unwrap();
        assert_eq!(back, card);
    }

    #[test]
    fn minimal_card_gets_defaults() {
        let card: AgentCard =
            serde_json::from_value(json!({"name": "w", "description": "d", "url": "http://x"}))
                .unwrap();
        assert_eq!(card.version, "1.0.0");
        assert_eq!(card.input_formats, vec!["text/plain"]);
        assert!(card.capabilities.delegation);
        assert_eq!(card.capabilities.max_concurrency, 1);
    }

    #[test]
    fn prompt_format_lists_skills_and_capabilities() {
        let card = AgentCard::new("weather", "Weather info", "http://x")
            .with_skill(AgentSkill::new("forecast", "Forecast").with_example("Athens"));
        let text = card.prompt_format();
        assert!(text.contains("Agent: weather"));
        assert!(text.contains("- forecast: Forecast"));
        assert!(text.contains("Capabilities: delegation"));
        assert!(text.contains("examples: Athens"));
    }
}
