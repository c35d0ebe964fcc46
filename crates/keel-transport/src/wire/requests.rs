//! The params and results of the task operations (SendMessage, GetTask, CancelTask, ListTasks):
//! decoded on the server side, encoded on the client side, and the other way round.

use std::collections::HashMap;

use keel_core::{AgentResult, Message, Task, TaskId, TaskState, TaskStatus};
use serde_json::Value;

use super::codec::{
    bad_answer, decode, history_length, invalid, non_empty, params_object, to_json,
};
use super::push::push_config_from_wire;
use super::task::{
    message_from_wire, message_to_wire, state_from_wire, state_to_wire, task_from_wire,
    task_to_wire,
};
use crate::jsonrpc::{encode, Encoded};
use crate::push_config::PushConfig;
use crate::task_list::{TaskList, TaskListQuery};

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

/// Decode `SendMessage` params (a `SendMessageRequest`).
pub(crate) fn decode_send_message(params: Value) -> AgentResult<SendMessageCall> {
    let params = params_object(params)?;
    match params.get("message") {
        None | Some(Value::Null) => return Err(invalid("message", "is required")),
        Some(Value::Object(_)) => {}
        Some(_) => return Err(invalid("message", "must be an object")),
    }
    check_single_contents(&params)?;
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

/// The content fields of an A2A part, of which a part holds exactly one (a proto `oneof`).
const PART_CONTENTS: [&str; 4] = ["text", "raw", "url", "data"];

/// Refuse a message part that holds several contents (`text` and `url`, ...): decoding would
/// keep one and silently drop the others, so the caller would never learn that the agent saw
/// only part of what was sent.
fn check_single_contents(params: &Value) -> AgentResult<()> {
    let Some(parts) = params["message"]["parts"].as_array() else {
        return Ok(());
    };
    for (index, part) in parts.iter().enumerate() {
        let present: Vec<&str> = PART_CONTENTS
            .into_iter()
            .filter(|field| part.get(*field).is_some_and(|v| !v.is_null()))
            .collect();
        if present.len() > 1 {
            return Err(invalid(
                format!("message.parts[{index}]"),
                format!(
                    "holds several contents ({}); a part holds exactly one of `text`, `raw`, `url` or `data`",
                    present
                        .iter()
                        .map(|field| format!("`{field}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Decode `GetTask` params: the task id and the history length.
pub(crate) fn decode_get_task(params: Value) -> AgentResult<(TaskId, Option<usize>)> {
    let request: a2a::GetTaskRequest = decode(params_object(params)?)?;
    let id = non_empty(request.id, "id", "must not be empty")?;
    Ok((
        id.into(),
        history_length(request.history_length, "historyLength")?,
    ))
}

/// Decode `CancelTask` params: the task id and the reason (`metadata.reason`, when a string).
pub(crate) fn decode_cancel_task(params: Value) -> AgentResult<(TaskId, Option<String>)> {
    let request: a2a::CancelTaskRequest = decode(params_object(params)?)?;
    let id = non_empty(request.id, "id", "must not be empty")?;
    let reason = request
        .metadata
        .and_then(|m| m.get("reason").and_then(Value::as_str).map(str::to_owned));
    Ok((id.into(), reason))
}

/// A task as the wire `Task` object.
pub(crate) fn encode_task(task: &Task) -> Encoded {
    encode(&task_to_wire(task))
}

/// A task as a `SendMessageResponse`: `{"task": {...}}`.
pub(crate) fn encode_send_message_result(task: &Task) -> Encoded {
    encode(&a2a::SendMessageResponse::Task(task_to_wire(task)))
}

/// An agent's direct reply as a `SendMessageResponse`: `{"message": {...}}`.
pub(crate) fn encode_send_message_reply(message: &Message) -> Encoded {
    encode(&a2a::SendMessageResponse::Message(message_to_wire(message)))
}

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
pub(crate) fn encode_get_task(task_id: &TaskId, history_length: Option<usize>) -> Value {
    to_json(&a2a::GetTaskRequest {
        id: task_id.to_string(),
        history_length: history_length.map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        tenant: None,
    })
}

/// `CancelTask` params; the reason travels as `metadata.reason`.
pub(crate) fn encode_cancel_task(task_id: &TaskId, reason: Option<&str>) -> Value {
    to_json(&a2a::CancelTaskRequest {
        id: task_id.to_string(),
        metadata: reason.map(|r| HashMap::from([("reason".into(), Value::String(r.into()))])),
        tenant: None,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{full_message, tasks};
    use keel_core::{AgentError, TaskId};
    use serde_json::json;

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
            decode_send_message_result(
                serde_json::from_str(encode_send_message_result(&task).get()).unwrap()
            )
            .unwrap(),
            crate::wire::fixtures::as_sent(task)
        );
        let reply = json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "hello"}], "contextId": "c"}});
        let task = decode_send_message_result(reply).unwrap();
        assert_eq!(task.state(), TaskState::Completed);
        assert_eq!(task.status().message.as_ref().unwrap().text(), "hello");
        assert_eq!(task.thread_id, "c");
    }
}
