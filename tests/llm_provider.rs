//! `keel serve --llm openai-compatible:URL:MODEL` drives the tool loop through a real HTTP
//! model provider: here a local server speaking the OpenAI chat-completions wire format.

mod support;

use std::sync::{Arc, Mutex};

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::{KeelServer, Rpc};

/// A fake OpenAI-compatible model: asks for `word_count` first, then answers from the tool
/// result. Records every request body.
async fn fake_openai(requests: Arc<Mutex<Vec<Value>>>) -> String {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| {
            let requests = requests.clone();
            async move {
                let has_tool_result = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
                requests.lock().unwrap().push(body.clone());
                let message = if has_tool_result {
                    let result = body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap()["content"].clone();
                    json!({"role": "assistant", "content": format!("There are {} words.", result.as_str().unwrap_or("?"))})
                } else {
                    json!({"role": "assistant", "content": null, "tool_calls": [{
                        "id": "call_1", "type": "function",
                        "function": {"name": "word_count", "arguments": "{\"text\": \"one two three\"}"}
                    }]})
                };
                support::openai_reply(&body, message)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}/v1")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tool_loop_runs_end_to_end_through_an_openai_compatible_provider() {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let base = fake_openai(requests.clone()).await;
    let llm = format!("openai-compatible:{base}:fake-model");
    let server = KeelServer::start(&["--llm", &llm]);
    let rpc = Rpc::new(&server);
    let task = rpc
        .send("how many words in 'one two three'?", None, false)
        .await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(
        task["status"]["message"]["parts"][0]["text"],
        "There are 3 words."
    );
    let kinds: Vec<String> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["parts"][0]["metadata"]["keel.partType"]
                .as_str()
                .unwrap_or("text")
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["text", "tool_call", "tool_output", "text"]);

    let requests = requests.lock().unwrap();
    assert_eq!(requests.len(), 2, "one model call per step");
    assert_eq!(requests[0]["model"], "fake-model");
    let tools: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"word_count"),
        "the agent's tools are offered: {tools:?}"
    );
    let tool_message = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(tool_message["tool_call_id"], "call_1");
    assert_eq!(tool_message["content"], "3");
}

#[test]
fn an_unknown_model_spec_is_refused_with_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--port",
            "0",
            "--store",
            "memory",
            "--llm",
            "hal9000:x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown model kind"));
}
