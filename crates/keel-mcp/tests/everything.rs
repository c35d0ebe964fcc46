//! Keel's MCP client against the reference "everything" server from npm, over stdio: the
//! tools as the model sees them, calls through the engine (text, structured content, an
//! image attached to its result and sent to Anthropic and Gemini), and a killed server
//! started again by the next call.

mod support;

#[path = "../../keel-llm/tests/support/mod.rs"]
mod llm_support;

use std::sync::Arc;

use base64::Engine as _;
use keel_agent::{attachment_uri, Agent, SendOptions, Tool};
use keel_core::{AgentCard, FileContent, Message, PartContent, TaskState};
use keel_events::InMemoryEventSink;
use keel_llm::providers::{AnthropicLlm, GeminiLlm};
use keel_llm::{Llm, MockLlm, MockResponse, ModelProfile, ToolCall};
use keel_mcp::{McpServer, ToolFlags};
use llm_support::{scripted, serve, Reply};
use serde_json::json;
use support::{call, completed, everything_spec, executor, serving, tools_of};

#[tokio::test]
async fn the_model_sees_each_tool_prefixed_with_its_schema_description_and_flags() {
    let server = McpServer::start(everything_spec()).await.unwrap();
    let tools = tools_of(&server).await;
    let mut agent = Agent::builder(AgentCard::new("a", "A.", "http://127.0.0.1/"));
    for tool in &tools {
        agent = agent.tool_shared(tool.clone() as Arc<dyn Tool>);
    }
    let specs = agent.build().unwrap().tool_specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    support::assert_offered(
        &names,
        &[
            "everything_echo",
            "everything_get-structured-content",
            "everything_get-tiny-image",
            "everything_get-sum",
        ],
    );
    for name in &names {
        assert!(name.len() <= 64, "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{name}"
        );
    }
    let echo = specs.iter().find(|s| s.name == "everything_echo").unwrap();
    assert_eq!(echo.description, "Echoes back the input string");
    assert_eq!(echo.parameters["properties"]["message"]["type"], "string");
    assert_eq!(echo.parameters["required"], json!(["message"]));
    let echo_tool = tools
        .iter()
        .find(|t| t.name() == "everything_echo")
        .unwrap();
    assert_eq!(echo_tool.mcp_name(), "echo");
    // Its annotations: read-only, not destructive, idempotent.
    assert_eq!(
        echo_tool.flags(),
        ToolFlags {
            read_only: true,
            destructive: false,
            idempotent: true
        }
    );
    assert!(echo_tool.idempotent());
    assert_eq!(
        echo_tool.capabilities(),
        vec!["mcp.everything.echo".to_owned(), "mcp.read".to_owned()]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_allow_and_deny_lists_choose_the_tools() {
    let mut spec = everything_spec();
    spec.allow = vec!["echo".into(), "get-sum".into()];
    spec.deny = vec!["get-sum".into()];
    let server = McpServer::start(spec).await.unwrap();
    let tools = tools_of(&server).await;
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["everything_echo"]);
    server.shutdown().await;
}

#[tokio::test]
async fn a_model_call_is_a_normal_tool_call_with_policy_events_and_result() {
    let server = McpServer::start(everything_spec()).await.unwrap();
    let tools = tools_of(&server).await;
    let exec = executor(&tools, |b| b);
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let task = completed(&exec, r#"/everything_echo {"message": "hello over stdio"}"#).await;
    let answer = task.status().message.as_ref().unwrap().text();
    assert!(
        answer.contains("everything_echo: Echo: hello over stdio"),
        "{answer}"
    );
    let events = sink.events();
    let requested = events
        .iter()
        .find(|e| e.event_type.as_str() == "action.requested")
        .expect("the call was prepared as an action");
    assert_eq!(requested.payload["action"]["name"], "everything_echo");
    assert_eq!(
        requested.payload["action"]["capabilities"],
        json!(["mcp.everything.echo", "mcp.read"])
    );
    let completed = events
        .iter()
        .find(|e| e.event_type.as_str() == "action.completed")
        .expect("the call completed");
    assert_eq!(completed.payload["output"], "Echo: hello over stdio");
    server.shutdown().await;
}

#[tokio::test]
async fn policy_judges_mcp_calls_by_their_capabilities() {
    let server = McpServer::start(everything_spec()).await.unwrap();
    let tools = tools_of(&server).await;
    let exec = executor(&tools, |b| {
        b.policy(
            keel_policy::CapabilityPolicy::new()
                .with_rule("mcp.everything.echo", keel_policy::CapabilityRule::Deny),
        )
    });
    let err = call(&exec, "everything_echo", json!({"message": "x"}))
        .await
        .unwrap_err();
    assert!(
        matches!(err, keel_core::AgentError::ActionDenied { .. }),
        "{err:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn structured_content_is_the_json_result() {
    let (server, exec) = serving(everything_spec()).await;
    let output = call(
        &exec,
        "everything_get-structured-content",
        json!({"location": "Chicago"}),
    )
    .await
    .unwrap();
    assert_eq!(
        output,
        json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82})
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_image_becomes_a_line_describing_it_between_the_texts() {
    let (server, exec) = serving(everything_spec()).await;
    let output = call(&exec, "everything_get-tiny-image", json!({}))
        .await
        .unwrap();
    let text = output.as_str().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "Here's the image you requested:");
    assert!(
        lines[1].starts_with("[image: image/png, ") && lines[1].ends_with(" bytes]"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], "The image above is the MCP logo.");
    server.shutdown().await;
}

#[tokio::test]
async fn an_image_result_is_attached_and_reaches_anthropic_and_gemini_as_an_image() {
    let server = McpServer::start(everything_spec()).await.unwrap();
    let llm = Arc::new(
        MockLlm::scripted(vec![
            MockResponse::ToolCalls(vec![ToolCall::new("everything_get-tiny-image", json!({}))]),
            MockResponse::Text("The MCP logo.".into()),
        ])
        .with_profile(ModelProfile::new("mock", "mock").with_vision(true)),
    );
    let exec = executor(&tools_of(&server).await, |b| b.llm_shared(llm.clone()));
    let sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(sink.clone());
    let task = completed(&exec, "Show me.").await;
    // The tool result carries the image as a file of the thread's store, by reference.
    let stored = FileContent {
        name: Some("get-tiny-image-1.png".into()),
        media_type: Some("image/png".into()),
        uri: Some(attachment_uri(&task.thread_id, "get-tiny-image-1.png")),
        bytes: None,
    };
    let result = task
        .history
        .iter()
        .find(|m| {
            m.parts
                .iter()
                .any(|p| matches!(p.content, PartContent::ToolOutput { .. }))
        })
        .expect("the tool result is in the task's history");
    let files: Vec<&FileContent> = result
        .parts
        .iter()
        .filter_map(|p| match &p.content {
            PartContent::File { file } => Some(file),
            _ => None,
        })
        .collect();
    assert_eq!(files, [&stored]);
    // The model's next request has it with its bytes, loaded from the store: a PNG.
    let request = llm.requests()[1].clone();
    let tool_result = request.messages.last().unwrap();
    assert_eq!(
        tool_result.tool_name.as_deref(),
        Some("everything_get-tiny-image")
    );
    let [attached] = tool_result.attachments.as_slice() else {
        panic!("one attachment: {:?}", tool_result.attachments);
    };
    assert_eq!(attached.uri, stored.uri);
    let data = attached
        .bytes
        .clone()
        .expect("the bytes are loaded for the model");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&data)
        .unwrap();
    assert_eq!(png[..8], *b"\x89PNG\r\n\x1a\n");
    // The run's events name the image; they never carry its bytes.
    let events = serde_json::to_string(&sink.events()).unwrap();
    assert!(
        !events.contains(&data),
        "an event carries the image's base64"
    );

    // Anthropic: an `image` block inside the `tool_result`.
    let anthropic = serve(vec![Reply::ok(json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "A logo."}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1}
    }))])
    .await;
    let claude = scripted(
        AnthropicLlm::builder("claude-sonnet-4-5"),
        anthropic.url.clone(),
        "k",
    );
    claude
        .build()
        .unwrap()
        .complete(request.clone())
        .await
        .unwrap();
    let body = &anthropic.requests()[0].body;
    let turn = body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(turn["role"], "user");
    assert_eq!(turn["content"][0]["type"], "tool_result");
    assert_eq!(
        turn["content"][0]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}})
    );

    // Gemini: an `inlineData` part after the `functionResponse`.
    let google = serve(vec![Reply::ok(json!({
        "candidates": [{"content": {"role": "model", "parts": [{"text": "A logo."}]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}
    }))])
    .await;
    let gemini = scripted(
        GeminiLlm::builder("gemini-2.5-flash"),
        format!("{}/v1beta", google.url),
        "k",
    );
    gemini.build().unwrap().complete(request).await.unwrap();
    let body = &google.requests()[0].body;
    let turn = body["contents"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        turn["parts"][0]["functionResponse"]["name"],
        "everything_get-tiny-image"
    );
    assert_eq!(
        turn["parts"][1],
        json!({"inlineData": {"mimeType": "image/png", "data": data}})
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_killed_server_is_started_again_by_the_next_call() {
    let (server, exec) = serving(everything_spec()).await;
    let echo = |text: &'static str| call(&exec, "everything_echo", json!({"message": text}));
    assert_eq!(echo("one").await.unwrap(), "Echo: one");
    let first = server.process_id().await.expect("a stdio server has a pid");
    support::kill(first);
    keel_runtime::testing::eventually("the server's exit is noticed", || {
        let server = server.clone();
        async move { server.process_id().await.is_none() }
    })
    .await;
    assert_eq!(echo("two").await.unwrap(), "Echo: two");
    let second = server.process_id().await.expect("started again");
    assert_ne!(first, second);
    server.shutdown().await;
}

#[tokio::test]
async fn a_call_that_needs_approval_waits_and_runs_once_approved() {
    let server = McpServer::start(everything_spec()).await.unwrap();
    let exec = executor(&tools_of(&server).await, |b| {
        b.policy(keel_policy::CapabilityPolicy::new().with_rule(
            "mcp.everything.*",
            keel_policy::CapabilityRule::RequireApproval,
        ))
    });
    let auth = exec.runtime().auth_service().auth_context();
    let task = exec
        .send_message(
            &auth,
            Message::user(r#"/everything_echo {"message": "approved call"}"#),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::InputRequired);
    let pending: keel_core::ApprovalRequest =
        serde_json::from_value(task.metadata["pending_approval"].clone()).unwrap();
    assert_eq!(pending.action.name, "everything_echo");
    assert_eq!(pending.action.payload, json!({"message": "approved call"}));
    exec.decide_approval(
        &auth,
        &task.id,
        keel_policy::approve_request(&pending, "ops"),
    )
    .await
    .unwrap();
    let task = keel_runtime::testing::eventually("the approved run completes", || {
        let (exec, auth, id) = (exec.clone(), auth.clone(), task.id.clone());
        async move {
            let task = exec.get_task(&auth, &id, None).await.unwrap();
            (task.state() == TaskState::Completed).then_some(task)
        }
    })
    .await;
    let answer = task.status().message.as_ref().unwrap().text();
    assert!(
        answer.contains("everything_echo: Echo: approved call"),
        "{answer}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_long_calls_progress_reaches_the_tasks_stream() {
    let (server, exec) = serving(everything_spec()).await;
    let auth = exec.runtime().auth_service().auth_context();
    let task = completed(
        &exec,
        r#"/everything_trigger-long-running-operation {"duration": 0.3, "steps": 3}"#,
    )
    .await;
    let events = exec.reads().task_events(&auth, &task.id).await.unwrap();
    // Each of the server's progress notifications is a `working` status update of the task,
    // marked as a tool's progress, as an asynchronous tool's report is.
    let reports: Vec<serde_json::Value> = events
        .iter()
        .filter_map(|event| match event {
            keel_core::TaskEvent::StatusUpdate { status, .. } => status.message.as_ref(),
            _ => None,
        })
        .filter(|message| message.status_kind() == Some(keel_core::StatusKind::ToolProgress))
        .map(|message| {
            assert_eq!(
                message.metadata["tool"],
                "everything_trigger-long-running-operation"
            );
            serde_json::to_value(&message.parts[0]).unwrap()
        })
        .collect();
    // The server sends its last progress right before the call's result, and the two can
    // be handled in either order: a progress that comes after the result has no call to
    // report on. The ones before it are all there, in order.
    assert!((2..=3).contains(&reports.len()), "{reports:?}");
    for (step, report) in reports.iter().enumerate() {
        assert_eq!(
            report["data"]["progress"].as_f64(),
            Some((step + 1) as f64),
            "{report}"
        );
        assert_eq!(report["data"]["total"].as_f64(), Some(3.0), "{report}");
    }
    server.shutdown().await;
}
