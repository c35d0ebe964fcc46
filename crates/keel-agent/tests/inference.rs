//! Model calls made outside the engine (`Inference`) report and budget themselves exactly as
//! the engine's own calls do.

use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, Inference, SendOptions};
use keel_core::{AgentCard, AgentError, Message, RunBudget, RunContext};
use keel_events::{InMemoryEventSink, RunEvent};
use keel_llm::{LlmMessage, LlmRequest, MockLlm, MockResponse};
use keel_runtime::Services;

/// The model-call checkpoints, as the engine emits them.
const CALL_EVENTS: [&str; 6] = [
    "context.prepared",
    "budget.warning",
    "llm.call.started",
    "llm.stream",
    "llm.call.completed",
    "budget.exceeded",
];

fn model() -> Arc<MockLlm> {
    Arc::new(MockLlm::scripted(vec![MockResponse::Text(
        "a short summary".into(),
    )]))
}

/// An event as compared between the two paths: type, step, summary, and payload without the
/// fields that differ per call by nature (latency, and the manifest's run and thread).
fn shape(event: &RunEvent) -> (String, Option<u32>, String, serde_json::Value) {
    let mut payload = event.payload.clone();
    if let Some(object) = payload.as_object_mut() {
        object.remove("latency_ms");
        if let Some(usage) = object.get_mut("usage").and_then(|u| u.as_object_mut()) {
            usage.remove("runtime_seconds");
        }
    }
    if let Some(manifest) = payload.get_mut("manifest").and_then(|m| m.as_object_mut()) {
        for volatile in ["run_id", "thread_id", "agent_name", "context_items"] {
            manifest.remove(volatile);
        }
    }
    (
        event.event_type.to_string(),
        event.step,
        event.summary.clone(),
        payload,
    )
}

#[tokio::test]
async fn a_call_outside_the_engine_emits_the_engines_call_events() {
    let budget = RunBudget {
        max_llm_calls: Some(1),
        ..Default::default()
    };

    // The engine's own call: an agent without tools or instructions answering "summarize".
    let agent = Agent::builder(AgentCard::new(
        "summarizer",
        "summarizes",
        "http://127.0.0.1:0",
    ))
    .llm_shared(model())
    .build()
    .unwrap();
    let runtime = Arc::new(Services::in_memory(Arc::new(MockLlm::new())));
    let exec = AgentExecutor::new(agent, runtime.clone());
    let engine_sink = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(engine_sink.clone());
    let auth = keel_runtime::Runtime::auth_service(runtime.as_ref()).auth_context();
    exec.send_message(
        &auth,
        Message::user("summarize"),
        SendOptions {
            run_context: Some(RunContext::new().with_budget(budget.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let from_engine: Vec<_> = engine_sink
        .events()
        .iter()
        .filter(|e| CALL_EVENTS.contains(&e.event_type.as_str()))
        .map(shape)
        .collect();

    // The same call from application code, with a run context and a sink.
    let context = RunContext::new().with_budget(budget);
    let sink = Arc::new(InMemoryEventSink::new());
    let inference = Inference::new(model(), &context, sink.clone());
    let answer = inference
        .infer(LlmRequest::new(vec![LlmMessage::user("summarize")]))
        .await
        .unwrap();
    assert_eq!(answer.content.as_deref(), Some("a short summary"));
    let events = sink.events();
    let outside: Vec<_> = events.iter().map(shape).collect();
    assert_eq!(outside, from_engine);
    assert!(outside.iter().any(|(t, ..)| t == "budget.warning"));
    // Numbered from 1 for the context's run; the manifest names the run.
    assert_eq!(
        events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
    assert!(events.iter().all(|e| e.run_id == context.run_id));
    assert_eq!(
        events[0].payload["manifest"]["run_id"],
        context.run_id.as_str()
    );
    assert_eq!(inference.usage().llm_calls, 1);

    // The run's budget holds across calls: a second call is refused before the model is asked.
    let err = inference
        .infer(LlmRequest::new(vec![LlmMessage::user("again")]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::BudgetExceeded { limit, .. } if limit == "max_llm_calls"),
        "{err:?}"
    );
    let last = sink.events().last().cloned().unwrap();
    assert!(last.is("budget.exceeded"));
    assert_eq!(inference.usage().llm_calls, 1);
}
