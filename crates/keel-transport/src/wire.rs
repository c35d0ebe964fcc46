//! The A2A v1.0 wire mapping: the only module that names `a2a-lf` types.
//!
//! Everything else in the crate speaks Keel's models (`keel-core`) and plain JSON values; this
//! module converts between them and the protobuf-JSON shapes of A2A v1.0 (camelCase fields,
//! `ROLE_USER`, `TASK_STATE_COMPLETED`).
//!
//! Keel fields that A2A lacks travel in A2A's own slots (brief, decision 2), under keys with the
//! reserved `keel.` prefix:
//!
//! | Keel | on the wire |
//! |---|---|
//! | typed part (`tool_call`, `tool_output`, `infer`, `infer_output`, `error`, `status`, `route`, `decision`) | data part: `data` = the part's fields (Keel JSON), `metadata["keel.partType"]` = the type |
//! | `json` part | data part: `data` = the document, `metadata["keel.partType"] = "json"` |
//! | file part that A2A cannot hold (both or neither of `uri`/`bytes`, non-canonical base64) | data part with `keel.partType = "file"` |
//! | `Message.timestamp`, `Artifact.timestamp` | `metadata["keel.timestamp"]` |
//! | `Artifact.kind` (when not `result`), `uri`, `action_id`, `media_type` | `metadata["keel.kind"]`, `["keel.uri"]`, `["keel.actionId"]`, `["keel.mediaType"]` |
//! | `Task.state_history`, `Task.created_at` | `metadata["keel.stateHistory"]`, `["keel.createdAt"]` |
//! | `Task.metadata` (`run_context`, `cancel_reason`, `error`, ...) | `metadata`, as is |
//! | card role, tags, transport, capability flags, skill schemas | params of the [`KEEL_CARD_EXTENSION_URI`] extension in `capabilities.extensions` |
//!
//! Decoding removes the `keel.` keys it understands and leaves everything else in `metadata`.

use std::collections::{BTreeMap, HashMap};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use keel_core::{
    AgentCapabilities, AgentCard, AgentError, AgentResult, AgentRole, AgentSkill, Artifact,
    FileContent, Message, Metadata, Part, PartContent, Role, SecurityScheme, StateTransition, Task,
    TaskState, TaskStatus, TransportKind,
};
use serde_json::{Map, Value};

use crate::push::{PushAuthentication, PushConfig};
use crate::stream::StreamEvent;
use crate::task_list::{TaskList, TaskListQuery};

/// The URI of the agent-card extension that carries Keel's card extras (role, tags, transport,
/// capability flags, skill input/output schemas) in its `params`.
pub const KEEL_CARD_EXTENSION_URI: &str = "https://keel.dev/extensions/card/v1";

/// The A2A protocol version this mapping speaks.
pub(crate) const PROTOCOL_VERSION: &str = "1.0";

/// The protocol binding of the JSON-RPC interface in `supportedInterfaces`.
pub(crate) const JSONRPC_BINDING: &str = a2a::TRANSPORT_PROTOCOL_JSONRPC;
/// The protocol binding of the REST interface in `supportedInterfaces`.
const HTTP_JSON_BINDING: &str = a2a::TRANSPORT_PROTOCOL_HTTP_JSON;

/// A protocol binding a server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// JSON-RPC 2.0 over HTTP.
    JsonRpc,
    /// HTTP+JSON (REST).
    HttpJson,
}

/// One entry of a card's `supportedInterfaces`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub url: String,
    pub binding: Binding,
    pub protocol_version: String,
}

/// Where a card says its interfaces are, for a client that speaks A2A 1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Endpoints {
    /// The JSON-RPC interface (a 1.x one when the card lists several).
    pub jsonrpc: Option<String>,
    /// The HTTP+JSON interface (a 1.x one when the card lists several).
    pub http_json: Option<String>,
}

const PART_TYPE_KEY: &str = "keel.partType";
const TIMESTAMP_KEY: &str = "keel.timestamp";
const KIND_KEY: &str = "keel.kind";
const URI_KEY: &str = "keel.uri";
const ACTION_ID_KEY: &str = "keel.actionId";
const MEDIA_TYPE_KEY: &str = "keel.mediaType";
const STATE_HISTORY_KEY: &str = "keel.stateHistory";
const CREATED_AT_KEY: &str = "keel.createdAt";

/// Part types that decode through Keel's own JSON form of [`PartContent`].
const TYPED_PARTS: &[&str] = &[
    "text",
    "file",
    "tool_call",
    "tool_output",
    "infer",
    "infer_output",
    "error",
    "status",
    "route",
    "decision",
];

type WireMetadata = HashMap<String, Value>;

fn wire_metadata(metadata: Metadata) -> Option<WireMetadata> {
    (!metadata.is_empty()).then(|| metadata.into_iter().collect())
}

fn keel_metadata(metadata: Option<WireMetadata>) -> Metadata {
    metadata.unwrap_or_default().into_iter().collect()
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    // Keel's models and a2a-lf's types serialize to JSON without failing (string keys, no
    // non-finite floats are produced by Keel); `Null` is the impossible fallback.
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Remove `key` and decode it; a value that does not decode stays in the metadata.
fn take<T: serde::de::DeserializeOwned>(metadata: &mut Metadata, key: &str) -> Option<T> {
    let value = metadata.get(key)?.clone();
    let decoded = serde_json::from_value(value).ok()?;
    metadata.remove(key);
    Some(decoded)
}

fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> AgentError {
    AgentError::invalid_input(field, reason.to_string())
}

// ---------------------------------------------------------------------------------------------
// Roles and states

fn role_to_wire(role: Role) -> a2a::Role {
    match role {
        Role::User => a2a::Role::User,
        Role::Agent => a2a::Role::Agent,
    }
}

fn role_from_wire(role: a2a::Role, field: &str) -> AgentResult<Role> {
    match role {
        a2a::Role::User => Ok(Role::User),
        a2a::Role::Agent => Ok(Role::Agent),
        a2a::Role::Unspecified => Err(invalid(
            format!("{field}.role"),
            "must be ROLE_USER or ROLE_AGENT",
        )),
    }
}

fn state_to_wire(state: TaskState) -> a2a::TaskState {
    match state {
        TaskState::Unspecified => a2a::TaskState::Unspecified,
        TaskState::Submitted => a2a::TaskState::Submitted,
        TaskState::Working => a2a::TaskState::Working,
        TaskState::InputRequired => a2a::TaskState::InputRequired,
        TaskState::AuthRequired => a2a::TaskState::AuthRequired,
        TaskState::Completed => a2a::TaskState::Completed,
        TaskState::Failed => a2a::TaskState::Failed,
        TaskState::Canceled => a2a::TaskState::Canceled,
        TaskState::Rejected => a2a::TaskState::Rejected,
    }
}

fn state_from_wire(state: a2a::TaskState) -> TaskState {
    match state {
        a2a::TaskState::Unspecified => TaskState::Unspecified,
        a2a::TaskState::Submitted => TaskState::Submitted,
        a2a::TaskState::Working => TaskState::Working,
        a2a::TaskState::InputRequired => TaskState::InputRequired,
        a2a::TaskState::AuthRequired => TaskState::AuthRequired,
        a2a::TaskState::Completed => TaskState::Completed,
        a2a::TaskState::Failed => TaskState::Failed,
        a2a::TaskState::Canceled => TaskState::Canceled,
        a2a::TaskState::Rejected => TaskState::Rejected,
    }
}

/// The wire name of a state (`TASK_STATE_COMPLETED`).
pub(crate) fn state_name(state: TaskState) -> String {
    match to_json(&state_to_wire(state)) {
        Value::String(name) => name,
        _ => String::new(),
    }
}

/// The state a wire name (`TASK_STATE_COMPLETED`) stands for.
pub(crate) fn state_from_name(name: &str) -> Option<TaskState> {
    serde_json::from_value::<a2a::TaskState>(Value::String(name.to_owned()))
        .ok()
        .map(state_from_wire)
}

// ---------------------------------------------------------------------------------------------
// Parts

/// The A2A content for a file part, when A2A can hold it exactly (one of bytes or uri, bytes in
/// canonical standard base64).
fn file_content_to_wire(file: &FileContent) -> Option<a2a::PartContent> {
    match (&file.bytes, &file.uri) {
        (Some(bytes), None) => {
            let raw = BASE64.decode(bytes).ok()?;
            (BASE64.encode(&raw) == *bytes).then_some(a2a::PartContent::Raw(raw))
        }
        (None, Some(uri)) => Some(a2a::PartContent::Url(uri.clone())),
        _ => None,
    }
}

/// A typed Keel part as an A2A data part: the part's fields, marked with `keel.partType`.
fn typed_part_to_wire(content: &PartContent, mut metadata: Metadata) -> a2a::Part {
    let type_name = content.type_name();
    let data = match content {
        PartContent::Json { content } => content.clone(),
        other => match to_json(other) {
            Value::Object(mut fields) => {
                fields.remove("type");
                Value::Object(fields)
            }
            value => value,
        },
    };
    metadata.insert(PART_TYPE_KEY.into(), Value::String(type_name.into()));
    a2a::Part {
        content: a2a::PartContent::Data(data),
        filename: None,
        media_type: None,
        metadata: wire_metadata(metadata),
    }
}

fn part_to_wire(part: &Part) -> a2a::Part {
    let metadata = part.metadata.clone();
    match &part.content {
        PartContent::Text { text } => a2a::Part {
            content: a2a::PartContent::Text(text.clone()),
            filename: None,
            media_type: None,
            metadata: wire_metadata(metadata),
        },
        PartContent::Data { data } => a2a::Part {
            content: a2a::PartContent::Data(data.clone()),
            filename: None,
            media_type: None,
            metadata: wire_metadata(metadata),
        },
        PartContent::File { file } => match file_content_to_wire(file) {
            Some(content) => a2a::Part {
                content,
                filename: file.name.clone(),
                media_type: file.media_type.clone(),
                metadata: wire_metadata(metadata),
            },
            None => typed_part_to_wire(&part.content, metadata),
        },
        other => typed_part_to_wire(other, metadata),
    }
}

fn part_from_wire(part: a2a::Part, field: &str) -> AgentResult<Part> {
    let mut metadata = keel_metadata(part.metadata);
    let content = match part.content {
        a2a::PartContent::Text(text) => PartContent::Text { text },
        a2a::PartContent::Raw(raw) => PartContent::File {
            file: FileContent {
                name: part.filename,
                media_type: part.media_type,
                uri: None,
                bytes: Some(BASE64.encode(raw)),
            },
        },
        a2a::PartContent::Url(uri) => PartContent::File {
            file: FileContent {
                name: part.filename,
                media_type: part.media_type,
                uri: Some(uri),
                bytes: None,
            },
        },
        a2a::PartContent::Data(data) => {
            let part_type = metadata
                .get(PART_TYPE_KEY)
                .and_then(Value::as_str)
                .map(str::to_owned);
            match part_type.as_deref() {
                Some("json") => {
                    metadata.remove(PART_TYPE_KEY);
                    PartContent::Json { content: data }
                }
                Some("data") => {
                    metadata.remove(PART_TYPE_KEY);
                    PartContent::Data { data }
                }
                Some(type_name) if TYPED_PARTS.contains(&type_name) => {
                    let Value::Object(mut fields) = data else {
                        return Err(invalid(
                            format!("{field}.data"),
                            format!("a `{type_name}` part needs an object"),
                        ));
                    };
                    fields.insert("type".into(), Value::String(type_name.into()));
                    let content = serde_json::from_value(Value::Object(fields)).map_err(|e| {
                        invalid(
                            format!("{field}.data"),
                            format!("not a valid `{type_name}` part: {e}"),
                        )
                    })?;
                    metadata.remove(PART_TYPE_KEY);
                    content
                }
                // A plain data part, or a type this version does not know: keep it as data
                // and leave the marker in the metadata.
                _ => PartContent::Data { data },
            }
        }
    };
    Ok(Part { content, metadata })
}

fn parts_from_wire(parts: Vec<a2a::Part>, field: &str) -> AgentResult<Vec<Part>> {
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| part_from_wire(part, &format!("{field}.parts[{i}]")))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Messages, artifacts, tasks

fn message_to_wire(message: &Message) -> a2a::Message {
    let mut metadata = message.metadata.clone();
    metadata.insert(TIMESTAMP_KEY.into(), to_json(&message.timestamp));
    a2a::Message {
        message_id: message.message_id.to_string(),
        context_id: message.thread_id.as_ref().map(ToString::to_string),
        task_id: message.task_id.as_ref().map(ToString::to_string),
        role: role_to_wire(message.role),
        parts: message.parts.iter().map(part_to_wire).collect(),
        metadata: wire_metadata(metadata),
        extensions: None,
        reference_task_ids: (!message.reference_task_ids.is_empty()).then(|| {
            message
                .reference_task_ids
                .iter()
                .map(ToString::to_string)
                .collect()
        }),
    }
}

fn message_from_wire(message: a2a::Message, field: &str) -> AgentResult<Message> {
    if message.message_id.is_empty() {
        return Err(invalid(format!("{field}.messageId"), "must not be empty"));
    }
    let role = role_from_wire(message.role, field)?;
    let parts = parts_from_wire(message.parts, field)?;
    let mut metadata = keel_metadata(message.metadata);
    let timestamp = take::<DateTime<Utc>>(&mut metadata, TIMESTAMP_KEY).unwrap_or_else(Utc::now);
    Ok(Message {
        message_id: message.message_id.into(),
        role,
        parts,
        task_id: message.task_id.filter(|id| !id.is_empty()).map(Into::into),
        thread_id: message
            .context_id
            .filter(|id| !id.is_empty())
            .map(Into::into),
        reference_task_ids: message
            .reference_task_ids
            .unwrap_or_default()
            .into_iter()
            .map(Into::into)
            .collect(),
        metadata,
        timestamp,
    })
}

fn artifact_to_wire(artifact: &Artifact) -> a2a::Artifact {
    let mut metadata = artifact.metadata.clone();
    if artifact.kind != Artifact::default().kind {
        metadata.insert(KIND_KEY.into(), Value::String(artifact.kind.clone()));
    }
    if let Some(uri) = &artifact.uri {
        metadata.insert(URI_KEY.into(), Value::String(uri.clone()));
    }
    if let Some(action_id) = &artifact.action_id {
        metadata.insert(ACTION_ID_KEY.into(), Value::String(action_id.to_string()));
    }
    if let Some(media_type) = &artifact.media_type {
        metadata.insert(MEDIA_TYPE_KEY.into(), Value::String(media_type.clone()));
    }
    metadata.insert(TIMESTAMP_KEY.into(), to_json(&artifact.timestamp));
    a2a::Artifact {
        artifact_id: artifact.id.to_string(),
        name: artifact.name.clone(),
        description: artifact.description.clone(),
        parts: artifact.parts.iter().map(part_to_wire).collect(),
        metadata: wire_metadata(metadata),
        extensions: None,
    }
}

fn artifact_from_wire(artifact: a2a::Artifact, field: &str) -> AgentResult<Artifact> {
    let mut metadata = keel_metadata(artifact.metadata);
    Ok(Artifact {
        id: artifact.artifact_id.into(),
        kind: take(&mut metadata, KIND_KEY).unwrap_or_else(|| Artifact::default().kind),
        name: artifact.name,
        description: artifact.description,
        uri: take(&mut metadata, URI_KEY),
        media_type: take(&mut metadata, MEDIA_TYPE_KEY),
        action_id: take::<String>(&mut metadata, ACTION_ID_KEY).map(Into::into),
        parts: parts_from_wire(artifact.parts, field)?,
        timestamp: take(&mut metadata, TIMESTAMP_KEY).unwrap_or_else(Utc::now),
        metadata,
    })
}

fn task_to_wire(task: &Task) -> a2a::Task {
    let mut metadata = task.metadata.clone();
    if !task.state_history.is_empty() {
        metadata.insert(STATE_HISTORY_KEY.into(), to_json(&task.state_history));
    }
    metadata.insert(CREATED_AT_KEY.into(), to_json(&task.created_at));
    a2a::Task {
        id: task.id.to_string(),
        context_id: task.thread_id.to_string(),
        status: status_to_wire(task.status()),
        artifacts: (!task.artifacts.is_empty())
            .then(|| task.artifacts.iter().map(artifact_to_wire).collect()),
        history: (!task.history.is_empty())
            .then(|| task.history.iter().map(message_to_wire).collect()),
        metadata: wire_metadata(metadata),
    }
}

fn status_to_wire(status: &TaskStatus) -> a2a::TaskStatus {
    a2a::TaskStatus {
        state: state_to_wire(status.state),
        message: status.message.as_ref().map(message_to_wire),
        timestamp: Some(status.timestamp),
    }
}

fn status_from_wire(status: a2a::TaskStatus, field: &str) -> AgentResult<TaskStatus> {
    Ok(TaskStatus {
        state: state_from_wire(status.state),
        message: status
            .message
            .map(|m| message_from_wire(m, &format!("{field}.message")))
            .transpose()?,
        timestamp: status.timestamp.unwrap_or_else(Utc::now),
    })
}

fn task_from_wire(task: a2a::Task) -> AgentResult<Task> {
    let status = status_from_wire(task.status, "task.status")?;
    let mut out = Task::from_parts(task.id.into(), task.context_id.into(), status);
    out.history = task
        .history
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, m)| message_from_wire(m, &format!("task.history[{i}]")))
        .collect::<AgentResult<_>>()?;
    out.artifacts = task
        .artifacts
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, a)| artifact_from_wire(a, &format!("task.artifacts[{i}]")))
        .collect::<AgentResult<_>>()?;
    let mut metadata = keel_metadata(task.metadata);
    out.state_history =
        take::<Vec<StateTransition>>(&mut metadata, STATE_HISTORY_KEY).unwrap_or_default();
    if let Some(created_at) = take(&mut metadata, CREATED_AT_KEY) {
        out.created_at = created_at;
    }
    out.metadata = metadata;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Agent cards

fn security_scheme_to_wire(name: &str, scheme: &SecurityScheme) -> Option<a2a::SecurityScheme> {
    Some(match scheme.clone() {
        SecurityScheme::ApiKey {
            location,
            name,
            description,
        } => a2a::SecurityScheme::ApiKey(a2a::ApiKeySecurityScheme {
            location,
            name,
            description,
        }),
        SecurityScheme::Http {
            scheme,
            bearer_format,
            description,
        } => a2a::SecurityScheme::HttpAuth(a2a::HttpAuthSecurityScheme {
            scheme,
            description,
            bearer_format,
        }),
        SecurityScheme::OAuth2 { flows, description } => {
            match serde_json::from_value::<a2a::OAuthFlows>(flows) {
                Ok(flows) => a2a::SecurityScheme::OAuth2(a2a::OAuth2SecurityScheme {
                    flows,
                    description,
                    oauth2_metadata_url: None,
                }),
                Err(err) => {
                    tracing::warn!(scheme = name, error = %err, "OAuth2 flows are not in A2A's shape; the scheme is left off the card");
                    return None;
                }
            }
        }
        SecurityScheme::OpenIdConnect {
            open_id_connect_url,
            description,
        } => a2a::SecurityScheme::OpenIdConnect(a2a::OpenIdConnectSecurityScheme {
            open_id_connect_url,
            description,
        }),
        SecurityScheme::MutualTls { description } => {
            a2a::SecurityScheme::MutualTls(a2a::MutualTlsSecurityScheme { description })
        }
    })
}

fn security_scheme_from_wire(scheme: a2a::SecurityScheme) -> SecurityScheme {
    match scheme {
        a2a::SecurityScheme::ApiKey(s) => SecurityScheme::ApiKey {
            location: s.location,
            name: s.name,
            description: s.description,
        },
        a2a::SecurityScheme::HttpAuth(s) => SecurityScheme::Http {
            scheme: s.scheme,
            bearer_format: s.bearer_format,
            description: s.description,
        },
        a2a::SecurityScheme::OAuth2(s) => SecurityScheme::OAuth2 {
            flows: to_json(&s.flows),
            description: s.description,
        },
        a2a::SecurityScheme::OpenIdConnect(s) => SecurityScheme::OpenIdConnect {
            open_id_connect_url: s.open_id_connect_url,
            description: s.description,
        },
        a2a::SecurityScheme::MutualTls(s) => SecurityScheme::MutualTls {
            description: s.description,
        },
    }
}

/// The params of the Keel card extension.
fn card_extension(card: &AgentCard) -> a2a::AgentExtension {
    let mut params = WireMetadata::new();
    params.insert("role".into(), to_json(&card.role));
    params.insert("transport".into(), to_json(&card.transport));
    params.insert("tags".into(), to_json(&card.tags));
    params.insert("capabilities".into(), to_json(&card.capabilities));
    let schemas: Map<String, Value> = card
        .skills
        .iter()
        .filter(|s| s.input_schema.is_some() || s.output_schema.is_some())
        .map(|s| {
            let mut entry = Map::new();
            if let Some(schema) = &s.input_schema {
                entry.insert("inputSchema".into(), schema.clone());
            }
            if let Some(schema) = &s.output_schema {
                entry.insert("outputSchema".into(), schema.clone());
            }
            (s.id.clone(), Value::Object(entry))
        })
        .collect();
    if !schemas.is_empty() {
        params.insert("skillSchemas".into(), Value::Object(schemas));
    }
    a2a::AgentExtension {
        uri: KEEL_CARD_EXTENSION_URI.into(),
        description: Some(
            "Keel card extras: role, tags, transport, capability flags, skill schemas".into(),
        ),
        required: Some(false),
        params: Some(params),
    }
}

#[cfg(test)]
fn card_to_wire(card: &AgentCard) -> a2a::AgentCard {
    card_to_wire_with(
        card,
        &[Interface {
            url: card.url.clone(),
            binding: Binding::JsonRpc,
            protocol_version: card.protocol_version.clone(),
        }],
    )
}

fn card_to_wire_with(card: &AgentCard, interfaces: &[Interface]) -> a2a::AgentCard {
    let skills = card
        .skills
        .iter()
        .map(|skill| a2a::AgentSkill {
            id: skill.id.clone(),
            name: skill.name.clone(),
            description: skill.description.clone(),
            tags: skill.tags.clone(),
            examples: (!skill.examples.is_empty()).then(|| skill.examples.clone()),
            input_modes: Some(card.input_formats.clone()),
            output_modes: Some(card.output_formats.clone()),
            security_requirements: None,
        })
        .collect();
    let security_schemes: HashMap<String, a2a::SecurityScheme> = card
        .security_schemes
        .iter()
        .filter_map(|(name, scheme)| Some((name.clone(), security_scheme_to_wire(name, scheme)?)))
        .collect();
    a2a::AgentCard {
        name: card.name.clone(),
        description: card.description.clone(),
        version: card.version.clone(),
        supported_interfaces: interfaces
            .iter()
            .map(|i| a2a::AgentInterface {
                url: i.url.clone(),
                protocol_binding: match i.binding {
                    Binding::JsonRpc => JSONRPC_BINDING.into(),
                    Binding::HttpJson => HTTP_JSON_BINDING.into(),
                },
                protocol_version: i.protocol_version.clone(),
                tenant: None,
            })
            .collect(),
        capabilities: a2a::AgentCapabilities {
            streaming: Some(card.capabilities.streaming),
            push_notifications: Some(card.capabilities.push_notifications),
            extensions: Some(vec![card_extension(card)]),
            extended_agent_card: Some(false),
        },
        default_input_modes: card.input_formats.clone(),
        default_output_modes: card.output_formats.clone(),
        skills,
        provider: None,
        documentation_url: None,
        icon_url: None,
        security_schemes: (!security_schemes.is_empty()).then_some(security_schemes),
        security_requirements: None,
        signatures: None,
    }
}

/// The interface of this binding, preferring one that speaks A2A 1.x.
fn find_interface<'a>(
    interfaces: &'a [a2a::AgentInterface],
    binding: &str,
) -> Option<&'a a2a::AgentInterface> {
    let of_binding = || {
        interfaces
            .iter()
            .filter(move |i| i.protocol_binding.eq_ignore_ascii_case(binding))
    };
    of_binding()
        .find(|i| i.protocol_version.starts_with("1."))
        .or_else(|| of_binding().next())
}

/// Keel's view of a wire card, and where its interfaces are.
fn card_from_wire(card: a2a::AgentCard) -> (AgentCard, Endpoints) {
    let jsonrpc = find_interface(&card.supported_interfaces, JSONRPC_BINDING);
    let endpoints = Endpoints {
        jsonrpc: jsonrpc.map(|i| i.url.clone()),
        http_json: find_interface(&card.supported_interfaces, HTTP_JSON_BINDING)
            .map(|i| i.url.clone()),
    };
    let interface = jsonrpc.or_else(|| card.supported_interfaces.first());
    let mut out = AgentCard::new(
        card.name,
        card.description,
        interface.map(|i| i.url.clone()).unwrap_or_default(),
    );
    if let Some(interface) = interface {
        out.protocol_version = interface.protocol_version.clone();
    }
    out.version = card.version;
    out.input_formats = card.default_input_modes;
    out.output_formats = card.default_output_modes;

    let params = card
        .capabilities
        .extensions
        .iter()
        .flatten()
        .find(|e| e.uri == KEEL_CARD_EXTENSION_URI)
        .and_then(|e| e.params.clone())
        .map(|p| p.into_iter().collect::<Metadata>())
        .unwrap_or_default();
    let mut params = params;
    out.role = take::<AgentRole>(&mut params, "role").unwrap_or_default();
    out.transport = take::<TransportKind>(&mut params, "transport").unwrap_or_default();
    out.tags = take(&mut params, "tags").unwrap_or_default();
    out.capabilities = take::<AgentCapabilities>(&mut params, "capabilities").unwrap_or_default();
    out.capabilities.streaming = card.capabilities.streaming.unwrap_or(false);
    out.capabilities.push_notifications = card.capabilities.push_notifications.unwrap_or(false);
    let schemas: Map<String, Value> = take(&mut params, "skillSchemas").unwrap_or_default();

    out.skills = card
        .skills
        .into_iter()
        .map(|skill| {
            let schema = schemas.get(&skill.id);
            AgentSkill {
                input_schema: schema.and_then(|s| s.get("inputSchema")).cloned(),
                output_schema: schema.and_then(|s| s.get("outputSchema")).cloned(),
                id: skill.id,
                name: skill.name,
                description: skill.description,
                tags: skill.tags,
                examples: skill.examples.unwrap_or_default(),
            }
        })
        .collect();
    out.security_schemes = card
        .security_schemes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, scheme)| (name, security_scheme_from_wire(scheme)))
        .collect::<BTreeMap<_, _>>();
    (out, endpoints)
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC params and results (server side)

/// A decoded `SendMessage` request.
#[derive(Debug)]
pub(crate) struct SendMessageCall {
    /// The message, in Keel's model.
    pub message: Message,
    /// `configuration.returnImmediately` (absent means false: blocking).
    pub return_immediately: bool,
    /// `configuration.historyLength`.
    pub history_length: Option<usize>,
    /// `configuration.taskPushNotificationConfig`: where to push this task's updates.
    pub push_config: Option<PushConfig>,
}

fn params_object(params: Value) -> AgentResult<Value> {
    match params {
        Value::Object(_) => Ok(params),
        Value::Null => Ok(Value::Object(Map::new())),
        _ => Err(invalid("params", "must be an object")),
    }
}

fn history_length(value: Option<i32>, field: &str) -> AgentResult<Option<usize>> {
    value
        .map(|n| usize::try_from(n).map_err(|_| invalid(field, "must not be negative")))
        .transpose()
}

fn decode<T: serde::de::DeserializeOwned>(params: Value) -> AgentResult<T> {
    serde_json::from_value(params).map_err(|e| invalid("params", e))
}

/// Decode `SendMessage` params (a `SendMessageRequest`).
pub(crate) fn decode_send_message(params: Value) -> AgentResult<SendMessageCall> {
    let params = params_object(params)?;
    match params.get("message") {
        None | Some(Value::Null) => return Err(invalid("message", "is required")),
        Some(Value::Object(_)) => {}
        Some(_) => return Err(invalid("message", "must be an object")),
    }
    let request: a2a::SendMessageRequest = decode(params)?;
    if request.message.parts.is_empty() {
        return Err(invalid("message.parts", "must contain at least one part"));
    }
    let config = request
        .configuration
        .unwrap_or(a2a::SendMessageConfiguration {
            accepted_output_modes: None,
            task_push_notification_config: None,
            history_length: None,
            return_immediately: None,
        });
    Ok(SendMessageCall {
        message: message_from_wire(request.message, "message")?,
        return_immediately: config.return_immediately.unwrap_or(false),
        history_length: history_length(config.history_length, "configuration.historyLength")?,
        push_config: config
            .task_push_notification_config
            .map(push_config_from_wire),
    })
}

// ---------------------------------------------------------------------------------------------
// Push notification configs

fn push_config_from_wire(config: a2a::TaskPushNotificationConfig) -> PushConfig {
    PushConfig {
        id: config.id.unwrap_or_default(),
        task_id: config.task_id.into(),
        url: config.url,
        token: config.token.filter(|t| !t.is_empty()),
        authentication: config.authentication.map(|a| PushAuthentication {
            scheme: a.scheme,
            credentials: a.credentials,
        }),
    }
}

fn push_config_to_wire(config: &PushConfig) -> a2a::TaskPushNotificationConfig {
    a2a::TaskPushNotificationConfig {
        url: config.url.clone(),
        id: Some(config.id.clone()),
        task_id: config.task_id.as_str().to_owned(),
        token: config.token.clone(),
        authentication: config
            .authentication
            .as_ref()
            .map(|a| a2a::AuthenticationInfo {
                scheme: a.scheme.clone(),
                credentials: a.credentials.clone(),
            }),
        tenant: None,
    }
}

/// Decode `CreateTaskPushNotificationConfig` params (a `TaskPushNotificationConfig`).
pub(crate) fn decode_create_push_config(params: Value) -> AgentResult<PushConfig> {
    let params = params_object(params)?;
    if params
        .get("url")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(invalid("url", "is required"));
    }
    let config: a2a::TaskPushNotificationConfig = decode(params)?;
    let config = push_config_from_wire(config);
    if config.task_id.as_str().is_empty() {
        return Err(invalid("taskId", "is required"));
    }
    Ok(config)
}

/// Decode `GetTaskPushNotificationConfig` / `DeleteTaskPushNotificationConfig` params: the
/// task id and the config id.
pub(crate) fn decode_push_config_ref(params: Value) -> AgentResult<(keel_core::TaskId, String)> {
    let request: a2a::GetTaskPushNotificationConfigRequest = decode(params_object(params)?)?;
    if request.task_id.is_empty() {
        return Err(invalid("taskId", "is required"));
    }
    if request.id.is_empty() {
        return Err(invalid("id", "is required"));
    }
    Ok((request.task_id.into(), request.id))
}

/// Decode `ListTaskPushNotificationConfigs` params: the task id (all configs of a task fit
/// one page, so the page size and token are accepted and ignored).
pub(crate) fn decode_list_push_configs(params: Value) -> AgentResult<keel_core::TaskId> {
    let request: a2a::ListTaskPushNotificationConfigsRequest = decode(params_object(params)?)?;
    if request.task_id.is_empty() {
        return Err(invalid("taskId", "is required"));
    }
    Ok(request.task_id.into())
}

/// A `TaskPushNotificationConfig`.
pub(crate) fn encode_push_config(config: &PushConfig) -> Value {
    to_json(&push_config_to_wire(config))
}

/// A `ListTaskPushNotificationConfigsResponse`.
pub(crate) fn encode_list_push_configs(configs: &[PushConfig]) -> Value {
    to_json(&a2a::ListTaskPushNotificationConfigsResponse {
        configs: configs.iter().map(push_config_to_wire).collect(),
        next_page_token: None,
    })
}

/// Decode `GetTask` params: the task id and the history length.
pub(crate) fn decode_get_task(params: Value) -> AgentResult<(keel_core::TaskId, Option<usize>)> {
    let request: a2a::GetTaskRequest = decode(params_object(params)?)?;
    if request.id.is_empty() {
        return Err(invalid("id", "must not be empty"));
    }
    Ok((
        request.id.into(),
        history_length(request.history_length, "historyLength")?,
    ))
}

/// Decode `CancelTask` params: the task id and the reason (`metadata.reason`, when a string).
pub(crate) fn decode_cancel_task(
    params: Value,
) -> AgentResult<(keel_core::TaskId, Option<String>)> {
    let request: a2a::CancelTaskRequest = decode(params_object(params)?)?;
    if request.id.is_empty() {
        return Err(invalid("id", "must not be empty"));
    }
    let reason = request
        .metadata
        .and_then(|m| m.get("reason").and_then(Value::as_str).map(str::to_owned));
    Ok((request.id.into(), reason))
}

/// A task as the wire `Task` object.
pub(crate) fn encode_task(task: &Task) -> Value {
    to_json(&task_to_wire(task))
}

/// A task as a `SendMessageResponse`: `{"task": {...}}`.
pub(crate) fn encode_send_message_result(task: &Task) -> Value {
    to_json(&a2a::SendMessageResponse::Task(task_to_wire(task)))
}

/// A card as the wire `AgentCard` object.
#[cfg(test)]
pub(crate) fn encode_card(card: &AgentCard) -> Value {
    to_json(&card_to_wire(card))
}

/// A card as the wire `AgentCard` object, listing these interfaces.
pub(crate) fn encode_card_with(card: &AgentCard, interfaces: &[Interface]) -> Value {
    to_json(&card_to_wire_with(card, interfaces))
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC params and results (client side)

/// `SendMessage` params for `message`.
pub(crate) fn encode_send_message(
    message: &Message,
    return_immediately: bool,
    history_length: Option<usize>,
) -> Value {
    let request = a2a::SendMessageRequest {
        message: message_to_wire(message),
        configuration: Some(a2a::SendMessageConfiguration {
            accepted_output_modes: None,
            task_push_notification_config: None,
            history_length: history_length.map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
            return_immediately: Some(return_immediately),
        }),
        metadata: None,
        tenant: None,
    };
    to_json(&request)
}

/// `GetTask` params.
pub(crate) fn encode_get_task(task_id: &keel_core::TaskId, history_length: Option<usize>) -> Value {
    to_json(&a2a::GetTaskRequest {
        id: task_id.to_string(),
        history_length: history_length.map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        tenant: None,
    })
}

/// `CancelTask` params; the reason travels as `metadata.reason`.
pub(crate) fn encode_cancel_task(task_id: &keel_core::TaskId, reason: Option<&str>) -> Value {
    to_json(&a2a::CancelTaskRequest {
        id: task_id.to_string(),
        metadata: reason.map(|r| HashMap::from([("reason".into(), Value::String(r.into()))])),
        tenant: None,
    })
}

fn bad_answer(what: &str, err: impl std::fmt::Display) -> AgentError {
    AgentError::internal(format!("the remote agent sent an invalid {what}: {err}"))
}

/// A wire `Task` object as Keel's task.
pub(crate) fn decode_task(result: Value) -> AgentResult<Task> {
    let task: a2a::Task = serde_json::from_value(result).map_err(|e| bad_answer("task", e))?;
    task_from_wire(task).map_err(|e| bad_answer("task", e))
}

/// A `SendMessageResponse` as Keel's task. An agent that answers with a bare message (allowed
/// by A2A) gets a completed task holding that message as its status message and history.
pub(crate) fn decode_send_message_result(result: Value) -> AgentResult<Task> {
    let response: a2a::SendMessageResponse =
        serde_json::from_value(result).map_err(|e| bad_answer("SendMessage result", e))?;
    match response {
        a2a::SendMessageResponse::Task(task) => {
            task_from_wire(task).map_err(|e| bad_answer("task", e))
        }
        a2a::SendMessageResponse::Message(message) => {
            let message =
                message_from_wire(message, "message").map_err(|e| bad_answer("message", e))?;
            let status = TaskStatus {
                state: TaskState::Completed,
                message: Some(message.clone()),
                timestamp: message.timestamp,
            };
            let mut task = Task::from_parts(
                message.task_id.clone().unwrap_or_default(),
                message.thread_id.clone().unwrap_or_default(),
                status,
            );
            task.history.push(message);
            Ok(task)
        }
    }
}

/// A wire `AgentCard` as Keel's card, with where its interfaces are.
pub(crate) fn decode_card(card: Value) -> AgentResult<(AgentCard, Endpoints)> {
    let card: a2a::AgentCard =
        serde_json::from_value(card).map_err(|e| bad_answer("agent card", e))?;
    Ok(card_from_wire(card))
}

// ---------------------------------------------------------------------------------------------
// ListTasks

fn page_size(value: Option<i32>) -> AgentResult<Option<u32>> {
    match value {
        None => Ok(None),
        Some(n) if (1..=TaskListQuery::MAX_PAGE_SIZE as i32).contains(&n) => {
            Ok(Some(n.unsigned_abs()))
        }
        Some(_) => Err(invalid(
            "pageSize",
            format!("must be between 1 and {}", TaskListQuery::MAX_PAGE_SIZE),
        )),
    }
}

/// Decode `ListTasks` params (a `ListTasksRequest`).
pub(crate) fn decode_list_tasks(params: Value) -> AgentResult<TaskListQuery> {
    let request: a2a::ListTasksRequest = decode(params_object(params)?)?;
    Ok(TaskListQuery {
        thread_id: request.context_id.filter(|c| !c.is_empty()).map(Into::into),
        state: request
            .status
            .map(state_from_wire)
            .filter(|s| *s != TaskState::Unspecified),
        page_size: page_size(request.page_size)?,
        page_token: request.page_token.filter(|t| !t.is_empty()),
        history_length: history_length(request.history_length, "historyLength")?,
        status_timestamp_after: request.status_timestamp_after,
        include_artifacts: request.include_artifacts.unwrap_or(false),
    })
}

/// A page of tasks as a `ListTasksResponse` (`nextPageToken` is `""` on the last page).
pub(crate) fn encode_list_tasks_result(list: &TaskList) -> Value {
    to_json(&a2a::ListTasksResponse {
        tasks: list.tasks.iter().map(task_to_wire).collect(),
        next_page_token: list.next_page_token.clone().unwrap_or_default(),
        page_size: i32::try_from(list.page_size).unwrap_or(i32::MAX),
        total_size: i32::try_from(list.total_size).unwrap_or(i32::MAX),
    })
}

/// `ListTasks` params for a query.
pub(crate) fn encode_list_tasks(query: &TaskListQuery) -> Value {
    to_json(&a2a::ListTasksRequest {
        context_id: query.thread_id.as_ref().map(ToString::to_string),
        status: query.state.map(state_to_wire),
        page_size: query
            .page_size
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        page_token: query.page_token.clone(),
        history_length: query
            .history_length
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        status_timestamp_after: query.status_timestamp_after,
        include_artifacts: query.include_artifacts.then_some(true),
        tenant: None,
    })
}

/// A `ListTasksResponse` as a page of Keel tasks.
pub(crate) fn decode_list_tasks_result(result: Value) -> AgentResult<TaskList> {
    let response: a2a::ListTasksResponse =
        serde_json::from_value(result).map_err(|e| bad_answer("ListTasks result", e))?;
    Ok(TaskList {
        tasks: response
            .tasks
            .into_iter()
            .map(task_from_wire)
            .collect::<AgentResult<_>>()
            .map_err(|e| bad_answer("task", e))?,
        next_page_token: Some(response.next_page_token).filter(|t| !t.is_empty()),
        page_size: u32::try_from(response.page_size).unwrap_or(0),
        total_size: usize::try_from(response.total_size).unwrap_or(0),
    })
}

// ---------------------------------------------------------------------------------------------
// Streams

/// Decode `SubscribeToTask` params: the task id.
pub(crate) fn decode_subscribe(params: Value) -> AgentResult<keel_core::TaskId> {
    let request: a2a::SubscribeToTaskRequest = decode(params_object(params)?)?;
    if request.id.is_empty() {
        return Err(invalid("id", "must not be empty"));
    }
    Ok(request.id.into())
}

/// `SubscribeToTask` params.
pub(crate) fn encode_subscribe(task_id: &keel_core::TaskId) -> Value {
    to_json(&a2a::SubscribeToTaskRequest {
        id: task_id.to_string(),
        tenant: None,
    })
}

/// A stream event as a `StreamResponse` (`{"task": ..}`, `{"statusUpdate": ..}`, ...).
pub(crate) fn encode_stream_event(event: &StreamEvent) -> Value {
    let response = match event {
        StreamEvent::Task(task) => a2a::StreamResponse::Task(task_to_wire(task)),
        StreamEvent::Message(message) => a2a::StreamResponse::Message(message_to_wire(message)),
        StreamEvent::StatusUpdate {
            task_id,
            thread_id,
            status,
        } => a2a::StreamResponse::StatusUpdate(a2a::TaskStatusUpdateEvent {
            task_id: task_id.to_string(),
            context_id: thread_id.to_string(),
            status: status_to_wire(status),
            metadata: None,
        }),
        StreamEvent::ArtifactUpdate {
            task_id,
            thread_id,
            artifact,
            append,
            last_chunk,
        } => a2a::StreamResponse::ArtifactUpdate(a2a::TaskArtifactUpdateEvent {
            task_id: task_id.to_string(),
            context_id: thread_id.to_string(),
            artifact: artifact_to_wire(artifact),
            append: append.then_some(true),
            last_chunk: last_chunk.then_some(true),
            metadata: None,
        }),
    };
    to_json(&response)
}

/// A `StreamResponse` as a Keel stream event.
pub(crate) fn decode_stream_event(value: Value) -> AgentResult<StreamEvent> {
    let response: a2a::StreamResponse =
        serde_json::from_value(value).map_err(|e| bad_answer("stream event", e))?;
    let bad = |e: AgentError| bad_answer("stream event", e);
    Ok(match response {
        a2a::StreamResponse::Task(task) => {
            StreamEvent::Task(Box::new(task_from_wire(task).map_err(bad)?))
        }
        a2a::StreamResponse::Message(message) => StreamEvent::Message(Box::new(
            message_from_wire(message, "message").map_err(bad)?,
        )),
        a2a::StreamResponse::StatusUpdate(update) => StreamEvent::StatusUpdate {
            task_id: update.task_id.into(),
            thread_id: update.context_id.into(),
            status: status_from_wire(update.status, "statusUpdate.status").map_err(bad)?,
        },
        a2a::StreamResponse::ArtifactUpdate(update) => StreamEvent::ArtifactUpdate {
            task_id: update.task_id.into(),
            thread_id: update.context_id.into(),
            artifact: artifact_from_wire(update.artifact, "artifactUpdate.artifact")
                .map_err(bad)?,
            append: update.append.unwrap_or(false),
            last_chunk: update.last_chunk.unwrap_or(false),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::{ActionId, RunContext, TaskId, ThreadId};
    use serde_json::json;

    fn every_part() -> Vec<Part> {
        let mut with_meta = Part::text("with metadata");
        with_meta.metadata.insert("lang".into(), json!("en"));
        let mut typed_with_meta = Part::tool_call("c9", "add", json!({"a": 1}));
        typed_with_meta
            .metadata
            .insert("origin".into(), json!({"step": 2}));
        vec![
            Part::text("t"),
            with_meta,
            Part::file(FileContent {
                name: Some("a.txt".into()),
                media_type: Some("text/plain".into()),
                uri: None,
                bytes: Some("aGk=".into()),
            }),
            Part::file(FileContent {
                name: None,
                media_type: Some("image/png".into()),
                uri: Some("https://example.com/a.png".into()),
                bytes: None,
            }),
            // A2A cannot hold these file parts as raw/url parts; they travel typed.
            Part::file(FileContent {
                name: Some("both".into()),
                media_type: None,
                uri: Some("https://example.com/b".into()),
                bytes: Some("aGk=".into()),
            }),
            Part::file(FileContent {
                name: None,
                media_type: None,
                uri: None,
                bytes: Some("aGk".into()),
            }),
            Part::file(FileContent::default()),
            Part::data(json!({"x": [1, 2]})),
            Part::data(json!("a bare string")),
            Part::json(json!({"ok": true})),
            Part::json(json!([1, "two"])),
            Part::tool_call("c1", "add", json!({"a": 1})),
            typed_with_meta,
            Part::tool_output("c1", "add", json!(2), false),
            Part::tool_output("c2", "add", json!("boom"), true),
            Part::infer("who are you?"),
            PartContent::Infer {
                prompt: None,
                user: Some("u".into()),
                output_schema: Some(json!({"type": "string"})),
            }
            .into(),
            Part::infer_output(json!("a bot")),
            Part::error("boom"),
            PartContent::Error {
                message: "bad".into(),
                code: Some("E1".into()),
                details: Some(json!({"line": 3})),
            }
            .into(),
            Part::status(TaskState::InputRequired, Some("which city?".into())),
            Part::route("quality", Some("ready".into())),
            Part::decision("approve", None),
        ]
    }

    fn through_wire_json<T: serde::Serialize + serde::de::DeserializeOwned>(value: T) -> T {
        serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap()
    }

    #[test]
    fn every_part_kind_round_trips_through_the_wire() {
        for part in every_part() {
            let wire = through_wire_json(part_to_wire(&part));
            let back = part_from_wire(wire, "part").unwrap();
            assert_eq!(back, part, "{}", part.content.type_name());
        }
    }

    #[test]
    fn typed_parts_travel_as_data_parts_marked_in_metadata() {
        let wire = to_json(&part_to_wire(&Part::tool_call(
            "c1",
            "add",
            json!({"a": 1}),
        )));
        assert_eq!(
            wire,
            json!({
                "data": {"call_id": "c1", "tool_name": "add", "args": {"a": 1}},
                "metadata": {"keel.partType": "tool_call"}
            })
        );
        let wire = to_json(&part_to_wire(&Part::json(json!({"ok": true}))));
        assert_eq!(
            wire,
            json!({"data": {"ok": true}, "metadata": {"keel.partType": "json"}})
        );
    }

    #[test]
    fn file_bytes_travel_as_raw_and_urls_as_url() {
        let wire = to_json(&part_to_wire(&Part::file(FileContent {
            name: Some("a.txt".into()),
            media_type: Some("text/plain".into()),
            uri: None,
            bytes: Some("aGk=".into()),
        })));
        assert_eq!(
            wire,
            json!({"raw": "aGk=", "filename": "a.txt", "mediaType": "text/plain"})
        );
        let wire = to_json(&part_to_wire(&Part::file(FileContent {
            uri: Some("https://x/y".into()),
            ..Default::default()
        })));
        assert_eq!(wire, json!({"url": "https://x/y"}));
    }

    #[test]
    fn plain_wire_parts_become_plain_keel_parts() {
        let parts: Vec<a2a::Part> = serde_json::from_value(json!([
            {"text": "hi"},
            {"data": {"k": 1}},
            {"data": 5, "metadata": {"keel.partType": "hologram"}},
            {"raw": "aGk=", "filename": "f"}
        ]))
        .unwrap();
        let parts = parts_from_wire(parts, "message").unwrap();
        assert_eq!(parts[0], Part::text("hi"));
        assert_eq!(parts[1], Part::data(json!({"k": 1})));
        assert_eq!(parts[2].content, PartContent::Data { data: json!(5) });
        assert_eq!(parts[2].metadata["keel.partType"], "hologram");
        assert_eq!(
            parts[3].content,
            PartContent::File {
                file: FileContent {
                    name: Some("f".into()),
                    bytes: Some("aGk=".into()),
                    ..Default::default()
                }
            }
        );
    }

    #[test]
    fn malformed_typed_part_is_invalid_input_naming_the_part() {
        let part: a2a::Part = serde_json::from_value(
            json!({"data": {"call_id": 1}, "metadata": {"keel.partType": "tool_call"}}),
        )
        .unwrap();
        let err = part_from_wire(part, "message.parts[0]").unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.parts[0].data"),
            "{err:?}"
        );
    }

    fn full_message() -> Message {
        let mut message = Message::user("hi").in_thread("th-1");
        for part in every_part() {
            message = message.with_part(part);
        }
        message.task_id = Some(TaskId::from("t-1"));
        message.reference_task_ids = vec![TaskId::from("t-0")];
        message.metadata.insert("k".into(), json!({"nested": [1]}));
        message
    }

    #[test]
    fn message_round_trips_through_the_wire() {
        for message in [Message::agent("plain"), full_message()] {
            let wire = through_wire_json(message_to_wire(&message));
            assert_eq!(message_from_wire(wire, "message").unwrap(), message);
        }
    }

    #[test]
    fn roles_are_role_user_and_role_agent_on_the_wire() {
        let wire = to_json(&message_to_wire(&Message::user("x")));
        assert_eq!(wire["role"], "ROLE_USER");
        let wire = to_json(&message_to_wire(&Message::agent("x")));
        assert_eq!(wire["role"], "ROLE_AGENT");
    }

    #[test]
    fn unspecified_role_is_invalid_input() {
        let wire: a2a::Message = serde_json::from_value(
            json!({"messageId": "m", "role": "ROLE_UNSPECIFIED", "parts": [{"text": "x"}]}),
        )
        .unwrap();
        let err = message_from_wire(wire, "message").unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.role"),
            "{err:?}"
        );
    }

    fn full_artifact() -> Artifact {
        let mut artifact = Artifact::text("report")
            .named("analysis")
            .of_kind("diagnostic")
            .for_action(ActionId::from("a-1"))
            .with_part(Part::json(json!({"score": 3})));
        artifact.description = Some("the report".into());
        artifact.uri = Some("file:///tmp/report.json".into());
        artifact.media_type = Some("application/json".into());
        artifact.metadata.insert("k".into(), json!(true));
        artifact
    }

    #[test]
    fn artifact_round_trips_through_the_wire() {
        for artifact in [Artifact::text("42"), full_artifact()] {
            let wire = through_wire_json(artifact_to_wire(&artifact));
            assert_eq!(artifact_from_wire(wire, "artifact").unwrap(), artifact);
        }
        let wire = to_json(&artifact_to_wire(&full_artifact()));
        assert_eq!(wire["metadata"]["keel.kind"], "diagnostic");
        assert_eq!(wire["metadata"]["keel.actionId"], "a-1");
    }

    fn tasks() -> Vec<Task> {
        let submitted = Task::create(Message::user("hi"));
        let mut completed = Task::create(full_message());
        completed.add_artifact(full_artifact());
        completed.metadata.insert("k".into(), json!([1, 2]));
        RunContext::ensure_task_context(&mut completed).unwrap();
        completed.complete("done").unwrap();
        let mut canceled = Task::new(ThreadId::from("th-9"));
        canceled.begin().unwrap();
        canceled.cancel(Some("user asked")).unwrap();
        let mut waiting = Task::new(ThreadId::new());
        waiting
            .require_input(Some(Message::agent("which city?")))
            .unwrap();
        vec![submitted, completed, canceled, waiting]
    }

    #[test]
    fn task_round_trips_through_the_wire() {
        for task in tasks() {
            let wire = through_wire_json(task_to_wire(&task));
            assert_eq!(task_from_wire(wire).unwrap(), task);
        }
    }

    #[test]
    fn task_extras_travel_in_metadata() {
        let tasks = tasks();
        let wire = encode_task(&tasks[1]);
        assert_eq!(wire["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(wire["contextId"], tasks[1].thread_id.as_str());
        assert!(wire["metadata"]["run_context"].is_object());
        assert_eq!(
            wire["metadata"]["keel.stateHistory"][1]["new_state"],
            "completed"
        );
        let wire = encode_task(&tasks[2]);
        assert_eq!(wire["metadata"]["cancel_reason"], "user asked");
        let wire = encode_send_message_result(&tasks[0]);
        assert_eq!(wire["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    }

    #[test]
    fn every_task_state_round_trips_by_wire_name() {
        for state in TaskState::ALL {
            let name = state_name(state);
            assert!(name.starts_with("TASK_STATE_"), "{name}");
            assert_eq!(state_from_name(&name), Some(state));
        }
        assert_eq!(
            state_name(TaskState::InputRequired),
            "TASK_STATE_INPUT_REQUIRED"
        );
    }

    fn full_card() -> AgentCard {
        let mut card = AgentCard::new("weather", "Weather service", "http://127.0.0.1:9/")
            .with_skill(
                AgentSkill::new("forecast", "Forecast for a city")
                    .with_tags(["weather"])
                    .with_example("Athens tomorrow?")
                    .with_input_schema(json!({"type": "object"}))
                    .with_output_schema(json!({"type": "string"})),
            )
            .with_skill(AgentSkill::new("plain", "No schemas"))
            .with_tags(["finance"]);
        card.role = AgentRole::Orchestrator;
        card.transport = TransportKind::Websocket;
        card.version = "2.1.0".into();
        card.input_formats = vec!["text/plain".into(), "application/json".into()];
        card.capabilities.tool_calling = true;
        card.capabilities.max_concurrency = 4;
        card.security_schemes.insert(
            "key".into(),
            SecurityScheme::ApiKey {
                location: "header".into(),
                name: "X-Api-Key".into(),
                description: Some("the key".into()),
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
            "oauth".into(),
            SecurityScheme::OAuth2 {
                flows: json!({"clientCredentials": {"tokenUrl": "https://x/token", "scopes": {"read": "Read"}}}),
                description: None,
            },
        );
        card.security_schemes.insert(
            "oidc".into(),
            SecurityScheme::OpenIdConnect {
                open_id_connect_url: "https://x/.well-known/openid-configuration".into(),
                description: None,
            },
        );
        card.security_schemes.insert(
            "mtls".into(),
            SecurityScheme::MutualTls { description: None },
        );
        card
    }

    #[test]
    fn card_round_trips_through_the_wire() {
        for card in [AgentCard::new("a", "b", "http://x/"), full_card()] {
            let wire = through_wire_json(card_to_wire(&card));
            let (back, endpoints) = card_from_wire(wire);
            assert_eq!(back, card);
            assert_eq!(endpoints.jsonrpc.as_deref(), Some(card.url.as_str()));
            assert_eq!(endpoints.http_json, None);
        }
    }

    #[test]
    fn card_extras_travel_in_the_keel_extension() {
        let wire = encode_card(&full_card());
        assert_eq!(
            wire["supportedInterfaces"],
            json!([{"url": "http://127.0.0.1:9/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}])
        );
        assert_eq!(wire["capabilities"]["streaming"], false);
        let ext = &wire["capabilities"]["extensions"][0];
        assert_eq!(ext["uri"], KEEL_CARD_EXTENSION_URI);
        assert_eq!(ext["params"]["role"], "orchestrator");
        assert_eq!(ext["params"]["tags"], json!(["finance"]));
        assert_eq!(
            ext["params"]["skillSchemas"]["forecast"]["inputSchema"],
            json!({"type": "object"})
        );
        assert_eq!(
            wire["securitySchemes"]["key"]["apiKeySecurityScheme"]["name"],
            "X-Api-Key"
        );
        assert_eq!(wire["skills"][0]["examples"], json!(["Athens tomorrow?"]));
    }

    #[test]
    fn send_message_params_decode_with_defaults() {
        let call = decode_send_message(json!({
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
            "configuration": {}
        }))
        .unwrap();
        assert!(!call.return_immediately);
        assert_eq!(call.history_length, None);
        assert_eq!(call.message.text(), "hi");
        let call = decode_send_message(json!({
            "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": "th"},
            "configuration": {"returnImmediately": true, "historyLength": 2}
        }))
        .unwrap();
        assert!(call.return_immediately);
        assert_eq!(call.history_length, Some(2));
        assert_eq!(call.message.thread_id.unwrap(), "th");
    }

    #[test]
    fn bad_send_message_params_are_invalid_input() {
        let msg = json!({"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]});
        for (params, field) in [
            (json!({}), "message"),
            (json!({"message": 42}), "message"),
            (json!([1]), "params"),
            (
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}),
                "message.parts",
            ),
            (
                json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": 1}]}}),
                "params",
            ),
            (
                json!({"message": {"messageId": "m", "role": "ROLE_UNSPECIFIED", "parts": [{"text": "x"}]}}),
                "message.role",
            ),
            (
                json!({"message": msg, "configuration": {"historyLength": -1}}),
                "configuration.historyLength",
            ),
        ] {
            let err = decode_send_message(params.clone()).unwrap_err();
            assert!(
                matches!(&err, AgentError::InvalidInput { field: f, .. } if f == field),
                "{params}: {err:?}"
            );
        }
    }

    #[test]
    fn cancel_reason_comes_from_metadata_reason() {
        let (id, reason) =
            decode_cancel_task(json!({"id": "t1", "metadata": {"reason": "enough"}})).unwrap();
        assert_eq!(id, "t1");
        assert_eq!(reason.as_deref(), Some("enough"));
        let params = encode_cancel_task(&TaskId::from("t1"), Some("enough"));
        assert_eq!(
            decode_cancel_task(params).unwrap().1.as_deref(),
            Some("enough")
        );
        assert!(decode_get_task(json!({"id": "t1", "historyLength": -3})).is_err());
        assert!(decode_get_task(json!({})).is_err());
    }

    #[test]
    fn client_params_decode_on_the_server_side() {
        let message = full_message();
        let call = decode_send_message(encode_send_message(&message, true, Some(3))).unwrap();
        assert_eq!(call.message, message);
        assert!(call.return_immediately);
        assert_eq!(call.history_length, Some(3));
        assert_eq!(
            decode_get_task(encode_get_task(&TaskId::from("t"), Some(1))).unwrap(),
            (TaskId::from("t"), Some(1))
        );
    }

    #[test]
    fn send_message_result_decodes_tasks_and_bare_messages() {
        let task = tasks().remove(1);
        assert_eq!(
            decode_send_message_result(encode_send_message_result(&task)).unwrap(),
            task
        );
        let reply = json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "hello"}], "contextId": "c"}});
        let task = decode_send_message_result(reply).unwrap();
        assert_eq!(task.state(), TaskState::Completed);
        assert_eq!(task.status().message.as_ref().unwrap().text(), "hello");
        assert_eq!(task.thread_id, "c");
    }

    #[test]
    fn our_error_codes_are_a2a_error_codes() {
        use crate::jsonrpc::*;
        use a2a::error_code as a2a_code;
        assert_eq!(PARSE_ERROR, a2a_code::PARSE_ERROR);
        assert_eq!(INVALID_REQUEST, a2a_code::INVALID_REQUEST);
        assert_eq!(METHOD_NOT_FOUND, a2a_code::METHOD_NOT_FOUND);
        assert_eq!(INVALID_PARAMS, a2a_code::INVALID_PARAMS);
        assert_eq!(INTERNAL_ERROR, a2a_code::INTERNAL_ERROR);
        assert_eq!(TASK_NOT_FOUND, a2a_code::TASK_NOT_FOUND);
        assert_eq!(TASK_NOT_CANCELABLE, a2a_code::TASK_NOT_CANCELABLE);
        assert_eq!(
            PUSH_NOTIFICATION_NOT_SUPPORTED,
            a2a_code::PUSH_NOTIFICATION_NOT_SUPPORTED
        );
        assert_eq!(UNSUPPORTED_OPERATION, a2a_code::UNSUPPORTED_OPERATION);
        assert_eq!(
            EXTENDED_CARD_NOT_CONFIGURED,
            a2a_code::EXTENDED_CARD_NOT_CONFIGURED
        );
        assert_eq!(VERSION_NOT_SUPPORTED, a2a_code::VERSION_NOT_SUPPORTED);
        assert_eq!(ERROR_INFO_TYPE, a2a::ERROR_INFO_TYPE);
        assert_eq!(ERROR_DOMAIN, a2a::PROTOCOL_DOMAIN);
        assert_eq!(crate::server::VERSION_HEADER, a2a::SVC_PARAM_VERSION);
    }
}
