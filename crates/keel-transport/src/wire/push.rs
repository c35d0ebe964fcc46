//! Push notification configs: `TaskPushNotificationConfig` and the params of the four config
//! operations.

use keel_core::{AgentResult, TaskId};
use serde_json::Value;

use super::codec::{decode, invalid, non_empty, params_object, to_json};
use crate::push_config::{PushAuthentication, PushConfig};

pub(super) fn push_config_from_wire(config: a2a::TaskPushNotificationConfig) -> PushConfig {
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
pub(crate) fn decode_push_config_ref(params: Value) -> AgentResult<(TaskId, String)> {
    let request: a2a::GetTaskPushNotificationConfigRequest = decode(params_object(params)?)?;
    let task_id = non_empty(request.task_id, "taskId", "is required")?;
    let id = non_empty(request.id, "id", "is required")?;
    Ok((task_id.into(), id))
}

/// Decode `ListTaskPushNotificationConfigs` params: the task id (all configs of a task fit
/// one page, so the page size and token are accepted and ignored).
pub(crate) fn decode_list_push_configs(params: Value) -> AgentResult<TaskId> {
    let request: a2a::ListTaskPushNotificationConfigsRequest = decode(params_object(params)?)?;
    Ok(non_empty(request.task_id, "taskId", "is required")?.into())
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
