//! The A2A v0.3 compatibility layer (JSON-RPC): v0.3 method names and JSON shapes, mapped onto
//! the v1.0 handlers by rewriting JSON at the edge, so v0.3 clients reach the same operations
//! and Keel's mapping to its models stays in one place (`wire`).
//!
//! | v0.3 | v1.0 |
//! |---|---|
//! | `message/send`, `message/stream` | `SendMessage`, `SendStreamingMessage` |
//! | `tasks/get`, `tasks/cancel`, `tasks/resubscribe` | `GetTask`, `CancelTask`, `SubscribeToTask` |
//! | `tasks/pushNotificationConfig/{set,get,list,delete}` | the push config operations (`{taskId, pushNotificationConfig}` ⇄ `TaskPushNotificationConfig`; `authentication.schemes[0]` ⇄ `scheme`) |
//! | `agent/getAuthenticatedExtendedCard` | `GetExtendedAgentCard` |
//! | part `{"kind":"text","text"}` / `{"kind":"data","data"}` / `{"kind":"file","file":{"bytes" or "uri","mimeType","name"}}` | `{"text"}` / `{"data"}` / `{"raw" or "url","mediaType","filename"}` |
//! | `{"kind":"message","role":"user" or "agent"}` | `{"role":"ROLE_USER" or "ROLE_AGENT"}` |
//! | `{"kind":"task","status":{"state":"input-required"}}` | `{"status":{"state":"TASK_STATE_INPUT_REQUIRED"}}` |
//! | `configuration.blocking` (default true) | `configuration.returnImmediately` = `blocking == false` |
//! | result of `message/send`: the Task or Message object itself | `{"task": ..}` / `{"message": ..}` |
//! | stream events: Task, Message, `{"kind":"status-update",..,"final"}`, `{"kind":"artifact-update",..}` | `StreamResponse` |
//!
//! v0.3 data parts hold objects only; a Keel data part with another JSON value travels as
//! `{"value": <it>}` with `metadata["keel.wrapped"] = true` and is unwrapped on the way in.

use serde_json::{json, Map, Value};

use crate::handlers::Operation;
use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use crate::stream::ends_stream;
use crate::wire;

const WRAPPED_KEY: &str = "keel.wrapped";

/// The protocol version of the v0.3 interface in the card.
pub(crate) const PROTOCOL_VERSION: &str = "0.3";

/// The operation of a v0.3 JSON-RPC method name.
pub(crate) fn operation(method: &str) -> Option<Operation> {
    Some(match method {
        "message/send" => Operation::SendMessage,
        "message/stream" => Operation::SendStreamingMessage,
        "tasks/get" => Operation::GetTask,
        "tasks/cancel" => Operation::CancelTask,
        "tasks/resubscribe" => Operation::SubscribeToTask,
        "tasks/pushNotificationConfig/set" => Operation::CreatePushConfig,
        "tasks/pushNotificationConfig/get" => Operation::GetPushConfig,
        "tasks/pushNotificationConfig/list" => Operation::ListPushConfigs,
        "tasks/pushNotificationConfig/delete" => Operation::DeletePushConfig,
        "agent/getAuthenticatedExtendedCard" => Operation::GetExtendedAgentCard,
        _ => return None,
    })
}

fn invalid(message: &str) -> RpcError {
    RpcError::new(INVALID_PARAMS, format!("invalid params: {message}"))
        .with("field", "params")
        .with("description", message)
}

fn object(value: Value, what: &str) -> Result<Map<String, Value>, RpcError> {
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        _ => Err(invalid(&format!("{what} must be an object"))),
    }
}

/// v0.3 params as the v1.0 params of the same operation.
pub(crate) fn params_to_v1(operation: Operation, params: Value) -> Result<Value, RpcError> {
    let mut params = object(params, "params")?;
    match operation {
        Operation::SendMessage | Operation::SendStreamingMessage => {
            if let Some(message) = params.remove("message") {
                params.insert("message".into(), message_to_v1(message)?);
            }
            if let Some(config) = params.remove("configuration") {
                let mut config = object(config, "configuration")?;
                let mut out = Map::new();
                match config.remove("pushNotificationConfig") {
                    None | Some(Value::Null) => {}
                    Some(push) => {
                        out.insert(
                            "taskPushNotificationConfig".into(),
                            Value::Object(push_config_to_v1(push, None)?),
                        );
                    }
                }
                if let Some(blocking) = config.remove("blocking") {
                    match blocking {
                        Value::Bool(b) => {
                            out.insert("returnImmediately".into(), Value::Bool(!b));
                        }
                        Value::Null => {}
                        _ => return Err(invalid("configuration.blocking must be a boolean")),
                    }
                }
                for key in ["historyLength", "acceptedOutputModes"] {
                    if let Some(value) = config.remove(key) {
                        out.insert(key.into(), value);
                    }
                }
                params.insert("configuration".into(), Value::Object(out));
            }
        }
        // A cancel's metadata carries its reason; the others have none in v1.0.
        Operation::GetTask | Operation::SubscribeToTask => {
            params.remove("metadata");
        }
        // v0.3: `{taskId, pushNotificationConfig: {id, url, token, authentication}}`.
        Operation::CreatePushConfig => {
            let task_id = params.remove("taskId").unwrap_or(Value::Null);
            let config = params
                .remove("pushNotificationConfig")
                .ok_or_else(|| invalid("pushNotificationConfig is required"))?;
            return Ok(Value::Object(push_config_to_v1(config, Some(task_id))?));
        }
        // v0.3: `{id: <task id>, pushNotificationConfigId}`.
        Operation::GetPushConfig | Operation::DeletePushConfig | Operation::ListPushConfigs => {
            let mut out = Map::new();
            if let Some(task_id) = params.remove("id") {
                out.insert("taskId".into(), task_id);
            }
            if let Some(config_id) = params.remove("pushNotificationConfigId") {
                out.insert("id".into(), config_id);
            }
            return Ok(Value::Object(out));
        }
        _ => {}
    }
    Ok(Value::Object(params))
}

/// A v0.3 `PushNotificationConfig` (authentication with a `schemes` list) as v1.0
/// `TaskPushNotificationConfig` fields.
fn push_config_to_v1(
    config: Value,
    task_id: Option<Value>,
) -> Result<Map<String, Value>, RpcError> {
    let mut config = object(config, "pushNotificationConfig")?;
    if let Some(Value::Object(mut auth)) = config.remove("authentication") {
        let scheme = match auth.remove("schemes") {
            Some(Value::Array(schemes)) => schemes.into_iter().next().unwrap_or(Value::Null),
            _ => auth.remove("scheme").unwrap_or(Value::Null),
        };
        let mut out = Map::new();
        out.insert("scheme".into(), scheme);
        if let Some(credentials) = auth.remove("credentials") {
            out.insert("credentials".into(), credentials);
        }
        config.insert("authentication".into(), Value::Object(out));
    }
    if let Some(task_id) = task_id {
        config.insert("taskId".into(), task_id);
    }
    Ok(config)
}

/// A v1.0 `TaskPushNotificationConfig` as v0.3 `TaskPushNotificationConfig`.
fn push_config_from_v1(config: Value) -> Value {
    let Value::Object(mut config) = config else {
        return config;
    };
    let task_id = config.remove("taskId").unwrap_or(Value::Null);
    config.remove("tenant");
    if let Some(Value::Object(mut auth)) = config.remove("authentication") {
        let scheme = auth.remove("scheme").unwrap_or(Value::Null);
        auth.insert("schemes".into(), json!([scheme]));
        config.insert("authentication".into(), Value::Object(auth));
    }
    json!({"taskId": task_id, "pushNotificationConfig": config})
}

fn message_to_v1(message: Value) -> Result<Value, RpcError> {
    let mut message = object(message, "message")?;
    message.remove("kind");
    if let Some(Value::String(role)) = message.get("role") {
        let role = match role.as_str() {
            "user" => "ROLE_USER",
            "agent" => "ROLE_AGENT",
            other => other,
        }
        .to_owned();
        message.insert("role".into(), Value::String(role));
    }
    if let Some(Value::Array(parts)) = message.remove("parts") {
        let parts = parts
            .into_iter()
            .map(part_to_v1)
            .collect::<Result<Vec<_>, _>>()?;
        message.insert("parts".into(), Value::Array(parts));
    }
    Ok(Value::Object(message))
}

fn part_to_v1(part: Value) -> Result<Value, RpcError> {
    let mut part = object(part, "part")?;
    let Some(Value::String(kind)) = part.remove("kind") else {
        // Already a v1.0 part: leave it to the v1.0 decoder.
        return Ok(Value::Object(part));
    };
    let mut out = Map::new();
    let mut metadata = match part.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    match kind.as_str() {
        "text" => {
            out.insert("text".into(), part.remove("text").unwrap_or(Value::Null));
        }
        "data" => {
            let mut data = part.remove("data").unwrap_or(Value::Null);
            if metadata.remove(WRAPPED_KEY) == Some(Value::Bool(true)) {
                data = data
                    .get_mut("value")
                    .map(Value::take)
                    .unwrap_or(Value::Null);
            }
            out.insert("data".into(), data);
        }
        "file" => {
            let mut file = object(part.remove("file").unwrap_or(Value::Null), "file")?;
            match (file.remove("bytes"), file.remove("uri")) {
                (Some(bytes), None) => out.insert("raw".into(), bytes),
                (None, Some(uri)) => out.insert("url".into(), uri),
                _ => return Err(invalid("a file part needs exactly one of bytes and uri")),
            };
            if let Some(name) = file.remove("name").filter(|v| !v.is_null()) {
                out.insert("filename".into(), name);
            }
            if let Some(mime) = file.remove("mimeType").filter(|v| !v.is_null()) {
                out.insert("mediaType".into(), mime);
            }
        }
        other => return Err(invalid(&format!("unknown part kind `{other}`"))),
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    Ok(Value::Object(out))
}

/// A v1.0 unary result as the v0.3 result of the same operation.
pub(crate) fn result_from_v1(operation: Operation, result: Value) -> Value {
    match operation {
        Operation::SendMessage => stream_event_from_v1(result),
        Operation::GetTask | Operation::CancelTask => task_from_v1(result),
        Operation::CreatePushConfig | Operation::GetPushConfig => push_config_from_v1(result),
        Operation::ListPushConfigs => match result.get("configs") {
            Some(Value::Array(configs)) => {
                Value::Array(configs.iter().cloned().map(push_config_from_v1).collect())
            }
            _ => json!([]),
        },
        Operation::DeletePushConfig => Value::Null,
        Operation::GetExtendedAgentCard => card_from_v1(result),
        _ => result,
    }
}

/// A v1.0 agent card with the v0.3 fields a v0.3 client needs added: `protocolVersion`
/// (`0.3.0`), `url` and `preferredTransport` naming the card's JSON-RPC 0.3 interface (the
/// only binding this server speaks v0.3 on, so `additionalInterfaces` lists just it),
/// `supportsAuthenticatedExtendedCard`, `security`, each skill's `security` and `tags`, and
/// the security schemes in v0.3's `type`-tagged shape. The v1.0 fields stay
/// (`supportedInterfaces` lists every interface with its `protocolVersion`), so a v1.0 client
/// that reads it leniently still finds its interfaces. Served to a caller that names 0.3 or
/// no version, at either card path, and not to one naming 1.0: the added fields are not in
/// the v1.0 proto, so a strict protobuf JSON parser refuses this form (decisions 200, 266).
pub(crate) fn card_from_v1(card: Value) -> Value {
    let Value::Object(mut card) = card else {
        return card;
    };
    let interfaces = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let v03 = interfaces.iter().find(|i| {
        i.get("protocolBinding").and_then(Value::as_str) == Some(wire::JSONRPC_BINDING)
            && i.get("protocolVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with("0.3"))
    });
    let url = v03
        .or_else(|| interfaces.first())
        .and_then(|i| i.get("url"))
        .cloned()
        .unwrap_or_else(|| json!(""));
    card.insert("protocolVersion".into(), json!(PROTOCOL_VERSION_FULL));
    card.insert("url".into(), url.clone());
    card.insert("preferredTransport".into(), json!(wire::JSONRPC_BINDING));
    card.insert(
        "additionalInterfaces".into(),
        json!([{"url": url, "transport": wire::JSONRPC_BINDING}]),
    );
    let extended = card
        .get("capabilities")
        .and_then(|c| c.get("extendedAgentCard"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    card.insert("supportsAuthenticatedExtendedCard".into(), json!(extended));
    for field in ["defaultInputModes", "defaultOutputModes", "skills"] {
        card.entry(field).or_insert_with(|| json!([]));
    }
    if let Some(Value::Array(skills)) = card.get_mut("skills") {
        for skill in skills.iter_mut().filter_map(Value::as_object_mut) {
            skill.entry("tags").or_insert_with(|| json!([]));
            if let Some(requirements) = skill.get("securityRequirements") {
                let security = security_from_v1(requirements);
                skill.insert("security".into(), security);
            }
        }
    }
    if let Some(requirements) = card.get("securityRequirements") {
        let security = security_from_v1(requirements);
        card.insert("security".into(), security);
    }
    if let Some(Value::Object(schemes)) = card.get_mut("securitySchemes") {
        for scheme in schemes.values_mut() {
            *scheme = security_scheme_from_v1(scheme.take());
        }
    }
    Value::Object(card)
}

/// The full protocol version a v0.3 card names.
const PROTOCOL_VERSION_FULL: &str = "0.3.0";

/// v1.0 `securityRequirements` (`[{"schemes": {name: {"list": [scopes]}}}]`) as v0.3
/// `security` (`[{name: [scopes]}]`).
fn security_from_v1(requirements: &Value) -> Value {
    let requirements = requirements.as_array().into_iter().flatten();
    Value::Array(
        requirements
            .map(|requirement| {
                let schemes = requirement.get("schemes").and_then(Value::as_object);
                let entries = schemes.into_iter().flatten().map(|(name, scopes)| {
                    let scopes = scopes.get("list").cloned().unwrap_or_else(|| json!([]));
                    (name.clone(), scopes)
                });
                Value::Object(entries.collect())
            })
            .collect(),
    )
}

/// A v1.0 security scheme (`{"apiKeySecurityScheme": {..}}`, ...) as v0.3's `type`-tagged
/// object; an unknown shape is left as it is.
fn security_scheme_from_v1(scheme: Value) -> Value {
    let Value::Object(scheme) = scheme else {
        return scheme;
    };
    let Some((kind, Value::Object(fields))) = scheme.iter().next() else {
        return Value::Object(scheme);
    };
    let kind = match kind.as_str() {
        "apiKeySecurityScheme" => "apiKey",
        "httpAuthSecurityScheme" => "http",
        "oauth2SecurityScheme" => "oauth2",
        "openIdConnectSecurityScheme" => "openIdConnect",
        "mtlsSecurityScheme" => "mutualTLS",
        _ => return Value::Object(scheme),
    };
    let mut out = fields.clone();
    if let Some(location) = out.remove("location") {
        out.insert("in".into(), location);
    }
    out.insert("type".into(), json!(kind));
    Value::Object(out)
}

/// A v1.0 `StreamResponse` (or `SendMessageResponse`) as the v0.3 event object.
pub(crate) fn stream_event_from_v1(event: Value) -> Value {
    let Value::Object(mut event) = event else {
        return event;
    };
    if let Some(task) = event.remove("task") {
        return task_from_v1(task);
    }
    if let Some(message) = event.remove("message") {
        return message_from_v1(message);
    }
    if let Some(Value::Object(mut update)) = event.remove("statusUpdate") {
        let state = update
            .get("status")
            .and_then(|s| s.get("state"))
            .and_then(Value::as_str)
            .and_then(wire::state_from_name);
        if let Some(status) = update.remove("status") {
            update.insert("status".into(), status_from_v1(status));
        }
        update.insert("kind".into(), json!("status-update"));
        update.insert("final".into(), json!(state.is_some_and(ends_stream)));
        return Value::Object(update);
    }
    if let Some(Value::Object(mut update)) = event.remove("artifactUpdate") {
        if let Some(artifact) = update.remove("artifact") {
            update.insert("artifact".into(), artifact_from_v1(artifact));
        }
        update.insert("kind".into(), json!("artifact-update"));
        return Value::Object(update);
    }
    Value::Object(event)
}

/// A v1.0 state name as v0.3's kebab-case one.
fn state_from_v1(name: &str) -> String {
    match name.strip_prefix("TASK_STATE_") {
        Some("UNSPECIFIED") | None => "unknown".into(),
        Some(rest) => rest.to_ascii_lowercase().replace('_', "-"),
    }
}

fn status_from_v1(status: Value) -> Value {
    let Value::Object(mut status) = status else {
        return status;
    };
    if let Some(Value::String(state)) = status.get("state") {
        let state = state_from_v1(state);
        status.insert("state".into(), Value::String(state));
    }
    if let Some(message) = status.remove("message") {
        status.insert("message".into(), message_from_v1(message));
    }
    Value::Object(status)
}

fn task_from_v1(task: Value) -> Value {
    let Value::Object(mut task) = task else {
        return task;
    };
    task.insert("kind".into(), json!("task"));
    if let Some(status) = task.remove("status") {
        task.insert("status".into(), status_from_v1(status));
    }
    if let Some(Value::Array(history)) = task.remove("history") {
        let history = history.into_iter().map(message_from_v1).collect();
        task.insert("history".into(), Value::Array(history));
    }
    if let Some(Value::Array(artifacts)) = task.remove("artifacts") {
        let artifacts = artifacts.into_iter().map(artifact_from_v1).collect();
        task.insert("artifacts".into(), Value::Array(artifacts));
    }
    if let Some(Value::Object(block)) = task
        .get_mut("metadata")
        .and_then(|m| m.get_mut(wire::KEEL_METADATA_KEY))
    {
        keel_block_from_v1(block);
    }
    Value::Object(task)
}

/// Keel's task metadata block in v0.3's terms: its states by v0.3 names, an approval's
/// previews and result as v0.3 artifacts.
fn keel_block_from_v1(block: &mut Map<String, Value>) {
    if let Some(Value::Array(history)) = block.get_mut("stateHistory") {
        for change in history.iter_mut().filter_map(Value::as_object_mut) {
            for field in ["previousState", "newState"] {
                if let Some(Value::String(state)) = change.get_mut(field) {
                    *state = state_from_v1(state);
                }
            }
        }
    }
    let Some(Value::Object(action)) = block
        .get_mut("pendingApproval")
        .and_then(|p| p.get_mut("action"))
    else {
        return;
    };
    if let Some(Value::Array(previews)) = action.remove("previews") {
        let previews = previews.into_iter().map(artifact_from_v1).collect();
        action.insert("previews".into(), Value::Array(previews));
    }
    if let Some(result) = action.remove("result") {
        action.insert("result".into(), artifact_from_v1(result));
    }
}

/// The `parts` of a message or an artifact in v0.3's shape (always an array).
fn parts_from_v1(holder: &mut Map<String, Value>) {
    let parts = match holder.remove("parts") {
        Some(Value::Array(parts)) => parts.into_iter().map(part_from_v1).collect(),
        _ => Vec::new(),
    };
    holder.insert("parts".into(), Value::Array(parts));
}

fn message_from_v1(message: Value) -> Value {
    let Value::Object(mut message) = message else {
        return message;
    };
    message.insert("kind".into(), json!("message"));
    if let Some(Value::String(role)) = message.get("role") {
        let role = match role.as_str() {
            "ROLE_AGENT" => "agent",
            _ => "user",
        };
        message.insert("role".into(), json!(role));
    }
    parts_from_v1(&mut message);
    Value::Object(message)
}

fn artifact_from_v1(artifact: Value) -> Value {
    let Value::Object(mut artifact) = artifact else {
        return artifact;
    };
    parts_from_v1(&mut artifact);
    Value::Object(artifact)
}

fn part_from_v1(part: Value) -> Value {
    let Value::Object(mut part) = part else {
        return part;
    };
    let mut metadata = match part.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let mut out = Map::new();
    if let Some(text) = part.remove("text") {
        out.insert("kind".into(), json!("text"));
        out.insert("text".into(), text);
    } else if let Some(data) = part.remove("data") {
        out.insert("kind".into(), json!("data"));
        if data.is_object() {
            out.insert("data".into(), data);
        } else {
            out.insert("data".into(), json!({ "value": data }));
            metadata.insert(WRAPPED_KEY.into(), Value::Bool(true));
        }
    } else {
        let mut file = Map::new();
        if let Some(raw) = part.remove("raw") {
            file.insert("bytes".into(), raw);
        }
        if let Some(url) = part.remove("url") {
            file.insert("uri".into(), url);
        }
        if let Some(name) = part.remove("filename") {
            file.insert("name".into(), name);
        }
        if let Some(media_type) = part.remove("mediaType") {
            file.insert("mimeType".into(), media_type);
        }
        out.insert("kind".into(), json!("file"));
        out.insert("file".into(), Value::Object(file));
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v0_3_send_params_become_v1_params() {
        let params = json!({
            "message": {
                "kind": "message", "messageId": "m1", "role": "user",
                "parts": [
                    {"kind": "text", "text": "hi"},
                    {"kind": "data", "data": {"k": 1}, "metadata": {"x": true}},
                    {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain", "name": "a.txt"}},
                    {"kind": "file", "file": {"uri": "https://x/y"}}
                ]
            },
            "configuration": {"blocking": false, "historyLength": 2}
        });
        let v1 = params_to_v1(Operation::SendMessage, params).unwrap();
        assert_eq!(
            v1,
            json!({
                "message": {
                    "messageId": "m1", "role": "ROLE_USER",
                    "parts": [
                        {"text": "hi"},
                        {"data": {"k": 1}, "metadata": {"x": true}},
                        {"raw": "aGk=", "mediaType": "text/plain", "filename": "a.txt"},
                        {"url": "https://x/y"}
                    ]
                },
                "configuration": {"returnImmediately": true, "historyLength": 2}
            })
        );
        let call = wire::decode_send_message(v1).unwrap();
        assert!(call.return_immediately);
    }

    #[test]
    fn v0_3_push_configs_map_to_v1_and_back() {
        let params = json!({
            "message": {"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "text", "text": "x"}]},
            "configuration": {"pushNotificationConfig": {"url": "https://x", "token": "t",
                "authentication": {"schemes": ["Bearer"], "credentials": "c"}}}
        });
        let v1 = params_to_v1(Operation::SendMessage, params).unwrap();
        assert_eq!(
            v1["configuration"]["taskPushNotificationConfig"],
            json!({"url": "https://x", "token": "t", "authentication": {"scheme": "Bearer", "credentials": "c"}})
        );
        let set =
            json!({"taskId": "t1", "pushNotificationConfig": {"id": "p", "url": "https://x"}});
        let v1 = params_to_v1(Operation::CreatePushConfig, set).unwrap();
        assert_eq!(v1, json!({"taskId": "t1", "id": "p", "url": "https://x"}));
        let get = json!({"id": "t1", "pushNotificationConfigId": "p"});
        let v1 = params_to_v1(Operation::GetPushConfig, get).unwrap();
        assert_eq!(v1, json!({"taskId": "t1", "id": "p"}));
        let back = result_from_v1(
            Operation::GetPushConfig,
            json!({"taskId": "t1", "id": "p", "url": "https://x", "authentication": {"scheme": "Bearer"}}),
        );
        assert_eq!(
            back,
            json!({"taskId": "t1", "pushNotificationConfig": {"id": "p", "url": "https://x", "authentication": {"schemes": ["Bearer"]}}})
        );
    }

    #[test]
    fn v1_tasks_and_events_become_v0_3_shapes_with_kinds_and_kebab_states() {
        let task = json!({
            "id": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "which?"}]}},
            "artifacts": [{"artifactId": "a", "parts": [{"data": 5}]}]
        });
        let v03 = result_from_v1(Operation::SendMessage, json!({ "task": task }));
        assert_eq!(v03["kind"], "task");
        assert_eq!(v03["status"]["state"], "input-required");
        assert_eq!(v03["status"]["message"]["kind"], "message");
        assert_eq!(v03["status"]["message"]["role"], "agent");
        assert_eq!(
            v03["status"]["message"]["parts"][0],
            json!({"kind": "text", "text": "which?"})
        );
        assert_eq!(
            v03["artifacts"][0]["parts"][0],
            json!({"kind": "data", "data": {"value": 5}, "metadata": {"keel.wrapped": true}})
        );
        // and the wrapped data part comes back as it was
        assert_eq!(
            part_to_v1(v03["artifacts"][0]["parts"][0].clone()).unwrap(),
            json!({"data": 5})
        );

        let update = stream_event_from_v1(json!({"statusUpdate": {
            "taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}
        }}));
        assert_eq!(update["kind"], "status-update");
        assert_eq!(update["final"], true);
        assert_eq!(update["status"]["state"], "completed");
        let update = stream_event_from_v1(json!({"statusUpdate": {
            "taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}
        }}));
        assert_eq!(update["final"], false);
        let artifact = stream_event_from_v1(json!({"artifactUpdate": {
            "taskId": "t", "contextId": "c", "artifact": {"artifactId": "a", "parts": [{"text": "x"}]}, "lastChunk": true
        }}));
        assert_eq!(artifact["kind"], "artifact-update");
        assert_eq!(artifact["artifact"]["parts"][0]["kind"], "text");
    }

    #[test]
    fn keels_task_metadata_block_names_states_and_previews_in_v0_3_terms() {
        let task = json!({
            "id": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED"},
            "metadata": {"mine": {"newState": "TASK_STATE_WORKING"}, "keel": {
                "stateHistory": [{"previousState": "TASK_STATE_WORKING",
                                  "newState": "TASK_STATE_INPUT_REQUIRED", "timestamp": "x"}],
                "pendingApproval": {"requestId": "r", "action": {
                    "previews": [{"artifactId": "a", "parts": [{"text": "the row"}]}]}}
            }}
        });
        let v03 = stream_event_from_v1(json!({ "task": task }));
        let block = &v03["metadata"]["keel"];
        assert_eq!(block["stateHistory"][0]["previousState"], "working");
        assert_eq!(block["stateHistory"][0]["newState"], "input-required");
        assert_eq!(
            block["pendingApproval"]["action"]["previews"][0]["parts"][0],
            json!({"kind": "text", "text": "the row"})
        );
        // The caller's own keys are left as they are.
        assert_eq!(v03["metadata"]["mine"]["newState"], "TASK_STATE_WORKING");
    }

    #[test]
    fn every_state_has_its_v0_3_name() {
        for (v1, v03) in [
            ("TASK_STATE_SUBMITTED", "submitted"),
            ("TASK_STATE_WORKING", "working"),
            ("TASK_STATE_INPUT_REQUIRED", "input-required"),
            ("TASK_STATE_AUTH_REQUIRED", "auth-required"),
            ("TASK_STATE_COMPLETED", "completed"),
            ("TASK_STATE_FAILED", "failed"),
            ("TASK_STATE_CANCELED", "canceled"),
            ("TASK_STATE_REJECTED", "rejected"),
            ("TASK_STATE_UNSPECIFIED", "unknown"),
        ] {
            assert_eq!(state_from_v1(v1), v03);
        }
    }
}
