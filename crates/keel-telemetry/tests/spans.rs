//! A run's events become OpenTelemetry spans by the GenAI conventions, with the events' own
//! ids: the span sink on a real engine run with a tool call and an approval.

#![cfg(feature = "otel")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, Message, RunContext, TaskState};
use keel_events::{InMemoryEventSink, RedactionPolicy};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_policy::{approve_request, ApprovalFn, CapabilityPolicy, CapabilityRule};
use keel_runtime::{Runtime, Services};
use keel_telemetry::{semconv, SpanSink};
use opentelemetry::trace::SpanKind;
use opentelemetry::Value;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};
use serde_json::json;

/// Keeps every span it is handed.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanProcessor for Collected {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}
    fn on_end(&self, span: SpanData) {
        self.0.lock().unwrap().push(span);
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> String {
    attribute(span, key)
        .map(|v| v.to_string())
        .unwrap_or_else(|| panic!("{} has no {key}: {:?}", span.name, span.attributes))
}

async fn run(content: bool) -> (Vec<SpanData>, Vec<keel_events::RunEvent>, RunContext) {
    let approver = ApprovalFn::new(
        |request: keel_core::ApprovalRequest, _ctx: RunContext| async move {
            Ok(approve_request(&request, "ops"))
        },
    );
    let write = FnTool::new(
        "write_record",
        "Write a record",
        json!({"type": "object", "properties": {"id": {"type": "string"}, "api_key": {"type": "string"}}}),
        |args, _ctx| async move { Ok(json!(format!("wrote {}", args["id"].as_str().unwrap_or_default()))) },
    )
    .with_capabilities(["records.write"]);
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new(
            "write_record",
            json!({"id": "r0", "api_key": "sk-secret-value"}),
        )]),
        MockResponse::Text("done".into()),
    ]));
    let agent = Agent::builder(AgentCard::new(
        "records",
        "keeps records",
        "http://127.0.0.1:0",
    ))
    .llm_shared(llm)
    .tool(write)
    .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval))
    .approval_handler(approver)
    .build()
    .unwrap();
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let auth = runtime.auth_service().auth_context();
    let exec = AgentExecutor::new(agent, runtime);
    let collected = Collected::default();
    let mut sink = SpanSink::new(collected.clone());
    if content {
        sink = sink.with_content(RedactionPolicy::default());
    }
    exec.add_event_sink(Arc::new(sink));
    let events = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(events.clone());
    let task = exec
        .send_message(&auth, Message::user("write r0"), SendOptions::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    let context = RunContext::from_task(&task).unwrap().unwrap();
    let spans = collected.0.lock().unwrap().clone();
    (spans, events.events().to_vec(), context)
}

#[tokio::test]
async fn a_run_is_exported_as_genai_spans_with_its_events_ids() {
    let (spans, events, context) = run(false).await;
    let by_name: HashMap<&str, &SpanData> = spans.iter().map(|s| (s.name.as_ref(), s)).collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    for name in [
        "invoke_agent records",
        "step 1",
        "step 2",
        "chat mock",
        "execute_tool write_record",
    ] {
        assert!(by_name.contains_key(name), "no span {name} in {names:?}");
    }
    assert_eq!(spans.len(), 6, "{names:?}");

    // One trace, the run's, and every span is one the events named, under the parent they
    // named.
    let trace = context.trace_id.as_str();
    let mut named: HashMap<String, Option<String>> = HashMap::new();
    for event in &events {
        named.insert(
            event.span_id.as_deref().unwrap().to_owned(),
            event.parent_span_id.as_deref().map(str::to_owned),
        );
    }
    assert_eq!(named.len(), spans.len());
    for span in &spans {
        assert_eq!(span.span_context.trace_id().to_string(), trace);
        let id = span.span_context.span_id().to_string();
        let parent = named
            .get(&id)
            .unwrap_or_else(|| panic!("{} is no event's span", span.name));
        let exported_parent = (span.parent_span_id != opentelemetry::SpanId::INVALID)
            .then(|| span.parent_span_id.to_string());
        assert_eq!(&exported_parent, parent, "{}", span.name);
        assert!(span.start_time <= span.end_time);
    }

    let run = by_name["invoke_agent records"];
    assert_eq!(run.parent_span_id, opentelemetry::SpanId::INVALID);
    assert_eq!(text(run, semconv::OPERATION_NAME), "invoke_agent");
    assert_eq!(text(run, semconv::AGENT_NAME), "records");
    assert_eq!(text(run, semconv::KEEL_RUN_ID), context.run_id.as_str());
    assert_eq!(
        text(run, semconv::CONVERSATION_ID),
        context.thread_id.as_ref().unwrap().as_str()
    );
    assert_eq!(text(run, semconv::KEEL_RUN_STATE), "completed");
    assert!(attribute(run, semconv::KEEL_TASK_ID).is_some());

    let tool = by_name["execute_tool write_record"];
    assert_eq!(
        tool.parent_span_id,
        by_name["step 1"].span_context.span_id()
    );
    assert_eq!(text(tool, semconv::OPERATION_NAME), "execute_tool");
    assert_eq!(text(tool, semconv::TOOL_NAME), "write_record");
    assert!(attribute(tool, semconv::TOOL_CALL_ID).is_some());
    assert!(
        attribute(tool, semconv::TOOL_CALL_ARGUMENTS).is_none(),
        "content is opt-in"
    );
    assert!(
        attribute(tool, semconv::TOOL_CALL_RESULT).is_none(),
        "content is opt-in"
    );
    let span_events: Vec<&str> = tool.events.iter().map(|e| e.name.as_ref()).collect();
    assert_eq!(
        span_events,
        [
            semconv::EVENT_POLICY,
            semconv::EVENT_APPROVAL_REQUIRED,
            semconv::EVENT_APPROVAL_DECIDED
        ]
    );
    assert_eq!(tool.span_kind, SpanKind::Internal);

    let chats: Vec<&SpanData> = spans.iter().filter(|s| s.name == "chat mock").collect();
    assert_eq!(chats.len(), 2);
    for chat in chats {
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert_eq!(text(chat, semconv::OPERATION_NAME), "chat");
        assert_eq!(text(chat, semconv::PROVIDER_NAME), "mock");
        assert_eq!(text(chat, semconv::REQUEST_MODEL), "mock");
        assert_eq!(text(chat, semconv::RESPONSE_MODEL), "mock");
        assert!(attribute(chat, semconv::USAGE_INPUT_TOKENS).is_some());
        assert!(attribute(chat, semconv::USAGE_OUTPUT_TOKENS).is_some());
        assert!(attribute(chat, semconv::RESPONSE_FINISH_REASONS).is_some());
        assert!(attribute(chat, semconv::OUTPUT_MESSAGES).is_none());
    }
}

#[tokio::test]
async fn content_is_captured_only_when_asked_and_redacted_even_then() {
    let (spans, _, _) = run(true).await;
    let tool = spans
        .iter()
        .find(|s| s.name == "execute_tool write_record")
        .unwrap();
    let arguments = text(tool, semconv::TOOL_CALL_ARGUMENTS);
    assert!(arguments.contains("r0"), "{arguments}");
    assert!(!arguments.contains("sk-secret-value"), "{arguments}");
    assert_eq!(text(tool, semconv::TOOL_CALL_RESULT), "\"wrote r0\"");
    let answer = spans
        .iter()
        .filter(|s| s.name == "chat mock")
        .map(|s| text(s, semconv::OUTPUT_MESSAGES))
        .collect::<Vec<_>>();
    assert!(answer.iter().any(|m| m.contains("done")), "{answer:?}");
}
