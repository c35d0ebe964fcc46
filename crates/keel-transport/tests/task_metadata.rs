//! A task's metadata as callers see it on every binding: Keel's own fields in one camelCase
//! `keel` object, states by their wire names, the run context only for a caller that sent one
//! (its own keys as sent), and Keel's client reading it all back into the engine's keys.

mod support;

use keel_core::{RunContext, TaskId, RUN_CONTEXT_KEY};
use keel_runtime::AuthContext;
use keel_transport::{A2aClient, KEEL_METADATA_KEY};
use serde_json::{json, Value};
use support::{user_message, SendJson, TestServer};

/// Fields whose keys are the caller's or an application's, not Keel's.
const FREE_FORM: [&str; 4] = ["permissions", "metadata", "payload", "parts"];

fn keys_outside_free_form(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                out.push(key.clone());
                if !FREE_FORM.contains(&key.as_str()) {
                    keys_outside_free_form(field, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| keys_outside_free_form(i, out)),
        _ => {}
    }
}

/// The engine's keys that stay inside Keel (decision 253), by their engine and wire names.
const BOOKKEEPING: [&str; 4] = ["agent", "skill", "awaiting_tool_call", "approval_decision"];
const BOOKKEEPING_ON_THE_WIRE: [&str; 4] =
    ["agent", "skill", "awaitingToolCall", "approvalDecision"];

/// A message that sends a run context with a budget and the application's own metadata.
fn with_run_context(text: &str) -> Value {
    let mut message = user_message(text);
    message["metadata"] = json!({"run_context": {
        "run_id": "run-from-caller",
        "trace_id": "trace-from-caller",
        "budget": {"max_steps": 5},
        "metadata": {"my_app_key": {"inner_key": 1}}
    }});
    message
}

/// The checks every binding's task passes; `sent_context` when its caller sent one.
fn assert_callers_metadata(task: &Value, sent_context: bool) {
    let metadata = task["metadata"].as_object().expect("a metadata object");
    // Only the one namespaced key: no engine key (`run_context`, `stop_reason`, ...) at the top.
    assert_eq!(
        metadata.keys().collect::<Vec<_>>(),
        [KEEL_METADATA_KEY],
        "{task}"
    );
    let block = &task["metadata"][KEEL_METADATA_KEY];
    let mut keys = Vec::new();
    keys_outside_free_form(block, &mut keys);
    assert!(
        keys.iter().all(|k| !k.contains('_')),
        "snake_case in {block}"
    );
    assert_eq!(block["threadId"], task["contextId"], "{block}");
    assert!(block["runId"].is_string() && block["traceId"].is_string());
    assert!(block["createdAt"].is_string());
    let history = block.get("stateHistory").and_then(Value::as_array);
    for change in history.into_iter().flatten() {
        for state in [&change["previousState"], &change["newState"]] {
            assert!(
                state.as_str().unwrap().starts_with("TASK_STATE_"),
                "{change}"
            );
        }
    }
    if sent_context {
        assert_eq!(block["runId"], "run-from-caller");
        assert_eq!(block["traceId"], "trace-from-caller");
        let ctx = &block["runContext"];
        assert_eq!(ctx["budget"], json!({"maxSteps": 5}), "{ctx}");
        assert_eq!(ctx["agentChain"], json!(["echo"]), "{ctx}");
        assert_eq!(ctx["metadata"]["my_app_key"], json!({"inner_key": 1}));
    } else {
        assert!(block.get("runContext").is_none(), "{block}");
    }
}

#[tokio::test]
async fn tasks_over_json_rpc_rest_and_streams_carry_keels_fields_in_one_camel_case_block() {
    let server = TestServer::start().await;

    // JSON-RPC: SendMessage and GetTask, with a context and without.
    for sent_context in [true, false] {
        let message = if sent_context {
            with_run_context("hello")
        } else {
            user_message("hello")
        };
        let answer = server.send_message(message).await;
        let task = &answer["result"]["task"];
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
        assert_callers_metadata(task, sent_context);
        assert_eq!(
            task["metadata"]["keel"]["stateHistory"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()["newState"],
            "TASK_STATE_COMPLETED"
        );
        let got = server.rpc("GetTask", json!({"id": task["id"]})).await;
        assert_callers_metadata(&got["result"], sent_context);
    }

    // HTTP+JSON.
    let sent: Value = server
        .post_v1("/message:send")
        .json(&json!({"message": with_run_context("over rest")}))
        .json_body()
        .await;
    assert_callers_metadata(&sent["task"], true);
    let got = server
        .get_json(&format!("/tasks/{}", sent["task"]["id"].as_str().unwrap()))
        .await;
    assert_callers_metadata(&got, true);

    // A stream: its first event is the task.
    let events = server
        .rpc_stream(
            "SendStreamingMessage",
            json!({"message": with_run_context("streamed")}),
        )
        .await;
    let first = &events[0].1["result"]["task"];
    assert_callers_metadata(first, true);
    server.stop().await;
}

#[tokio::test]
async fn v0_3_tasks_carry_the_same_block_with_v0_3_state_names() {
    let server = TestServer::start().await;
    let answer: Value = server
        .rpc_as(
            None,
            "message/send",
            json!({"message": {"kind": "message", "messageId": "v03-m", "role": "user",
                               "parts": [{"kind": "text", "text": "hi"}]}}),
        )
        .await;
    let task = &answer["result"];
    assert_eq!(task["status"]["state"], "completed", "{answer}");
    let block = &task["metadata"][KEEL_METADATA_KEY];
    assert!(block["runId"].is_string(), "{task}");
    let history = block["stateHistory"].as_array().unwrap();
    assert_eq!(history[0]["previousState"], "submitted", "{block}");
    assert_eq!(history.last().unwrap()["newState"], "completed");
    server.stop().await;
}

#[tokio::test]
async fn keels_client_reads_the_block_back_into_the_engines_keys() {
    let server = TestServer::start().await;
    let answer = server.send_message(with_run_context("hello")).await;
    let id = TaskId::from(answer["result"]["task"]["id"].as_str().unwrap());
    let stored = server
        .executor
        .get_task(&AuthContext::new("default-app", "default-user"), &id, None)
        .await
        .unwrap();
    let fetched = A2aClient::new(&server.base)
        .get_task(&id, None)
        .await
        .unwrap();
    let mut sent = stored.metadata.clone();
    for key in BOOKKEEPING {
        sent.remove(key);
    }
    assert_eq!(fetched.metadata, sent);
    assert_eq!(fetched.state_history, stored.state_history);
    assert_eq!(fetched.created_at, stored.created_at);
    let ctx = RunContext::from_task(&fetched).unwrap().unwrap();
    assert_eq!(ctx.budget.max_steps, Some(5));
    assert!(fetched.metadata.contains_key(RUN_CONTEXT_KEY));
    assert!(!fetched.metadata.contains_key(KEEL_METADATA_KEY));
    server.stop().await;
}

/// A SendMessage answer is what the caller asked for: `historyLength` messages of history
/// (none for 0), none of the engine's bookkeeping, and the caller's own metadata back.
#[tokio::test]
async fn a_send_message_answer_respects_history_length_and_carries_no_bookkeeping() {
    let server = TestServer::start().await;
    let mine = |text: &str| {
        let mut message = user_message(text);
        message["metadata"] = json!({"clientKey": "mine"});
        message
    };
    let lean = |task: &Value, asked: Option<usize>| {
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
        let block = &task["metadata"][KEEL_METADATA_KEY];
        for key in BOOKKEEPING_ON_THE_WIRE {
            assert!(block.get(key).is_none(), "{key} went out: {block}");
        }
        let history = task.get("history").and_then(Value::as_array);
        match asked {
            Some(0) => assert!(task.get("history").is_none(), "{task}"),
            Some(n) => assert_eq!(history.map(Vec::len), Some(n), "{task}"),
            None => {
                let history = history.expect("the whole history");
                assert_eq!(history[0]["metadata"]["clientKey"], "mine", "{task}");
            }
        }
    };
    for asked in [None, Some(0), Some(1)] {
        let mut params = json!({"message": mine("hello")});
        if let Some(n) = asked {
            params["configuration"] = json!({"historyLength": n});
        }
        // JSON-RPC.
        let answer = server.rpc("SendMessage", params.clone()).await;
        println!(
            "JSON-RPC historyLength {asked:?}: {} bytes",
            answer.to_string().len()
        );
        lean(&answer["result"]["task"], asked);
        // HTTP+JSON.
        params["message"] = mine("over rest");
        let sent: Value = server
            .post_v1("/message:send")
            .json(&params)
            .json_body()
            .await;
        lean(&sent["task"], asked);
    }
    server.stop().await;
}
