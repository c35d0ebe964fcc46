//! A run's events carry the span they belong to: one trace per run (or per caller), a span
//! for the run, each step, each model call and each tool call, and a delegated run's span
//! under the delegating tool call's (decision 180). The tests draw a report's events as the
//! tree their spans make.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use keel_agent::{Agent, AgentExecutor, FnTool, SendOptions};
use keel_core::{AgentCard, Message, RunContext, Task, TaskState, TraceParent};
use keel_events::RunEvent;
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_runtime::AuthContext;
use serde_json::json;
use support::{executor, stored_report};

fn card(name: &str) -> AgentCard {
    AgentCard::new(name, "spans", "http://127.0.0.1:0")
}

/// An agent of `card(name)` whose model answers `text`.
fn answering(name: &str, text: &str) -> Agent {
    let llm = MockLlm::scripted(vec![MockResponse::Text(text.into())]);
    Agent::builder(card(name)).llm(llm).build().unwrap()
}

/// Send "go" to `exec` as `auth` and wait for the task's answer.
async fn go(exec: &AgentExecutor, auth: &AuthContext) -> Task {
    exec.send_message(auth, Message::user("go"), SendOptions::default())
        .await
        .unwrap()
}

fn echo_tool() -> FnTool {
    FnTool::new(
        "echo",
        "Echo",
        json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        |args, _ctx| async move { Ok(args["text"].clone()) },
    )
}

/// The model calls `echo` twice in one step, then answers.
fn two_calls() -> Arc<MockLlm> {
    Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![
            ToolCall::new("echo", json!({"text": "a"})),
            ToolCall::new("echo", json!({"text": "b"})),
        ]),
        MockResponse::Text("done".into()),
    ]))
}

/// The span tree the events draw: each span's kind (by its first event) and its children,
/// indented, children in order of first appearance.
fn draw(events: &[RunEvent]) -> String {
    let mut parent_of: HashMap<String, Option<String>> = HashMap::new();
    let mut label: HashMap<String, String> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    for event in events {
        let span = event
            .span_id
            .as_deref()
            .expect("every event names its span")
            .to_owned();
        let parent = event.parent_span_id.as_deref().map(str::to_owned);
        match parent_of.get(&span) {
            Some(known) => assert_eq!(
                known, &parent,
                "span {span} changed its parent at {event:?}"
            ),
            None => {
                parent_of.insert(span.clone(), parent);
                label.insert(span.clone(), kind(event));
                order.push(span);
            }
        }
    }
    let mut children: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for span in &order {
        let parent = parent_of[span]
            .clone()
            .filter(|p| parent_of.contains_key(p));
        children.entry(parent).or_default().push(span.clone());
    }
    fn walk(
        at: Option<String>,
        depth: usize,
        children: &BTreeMap<Option<String>, Vec<String>>,
        label: &HashMap<String, String>,
        out: &mut String,
    ) {
        for span in children.get(&at).into_iter().flatten() {
            out.push_str(&format!("{}{}\n", "  ".repeat(depth), label[span]));
            walk(Some(span.clone()), depth + 1, children, label, out);
        }
    }
    let mut out = String::new();
    walk(None, 0, &children, &label, &mut out);
    out
}

fn kind(event: &RunEvent) -> String {
    if event.action_id.is_some() {
        "tool".into()
    } else if let Some(step) = event.step {
        if event.event_type.as_str().starts_with("llm.") || event.is("context.prepared") {
            format!("chat {step}")
        } else {
            format!("step {step}")
        }
    } else {
        "run".into()
    }
}

#[tokio::test]
async fn a_runs_events_draw_the_tree_of_its_spans() {
    let agent = Agent::builder(card("spans"))
        .llm_shared(two_calls())
        .tool(echo_tool())
        .build()
        .unwrap();
    let (exec, auth, sink) = executor(agent);
    let task = go(&exec, &auth).await;
    assert_eq!(task.state(), TaskState::Completed);
    let context = RunContext::from_task(&task).unwrap().unwrap();
    let events = sink.events();
    for event in events.iter() {
        assert_eq!(event.trace_id.as_deref(), Some(context.trace_id.as_str()));
        assert_eq!(event.trace_id.as_deref().map(str::len), Some(32));
        assert_eq!(
            event.span_id.as_deref().map(str::len),
            Some(16),
            "{event:?}"
        );
        assert_eq!(event.delegation_id, None);
    }
    // The run's span is the trace's root; no caller gave a parent.
    assert_eq!(events[0].parent_span_id, None);
    assert_eq!(
        draw(&events),
        "run\n  step 1\n    chat 1\n    tool\n    tool\n  step 2\n    chat 2\n"
    );
    // The stored report carries the same ids.
    let report = stored_report(&exec, &auth, &context.run_id).await;
    let stored = keel_events::RunReport::from_value(report.report)
        .unwrap()
        .events;
    assert_eq!(draw(&stored), draw(&events));
}

#[tokio::test]
async fn a_run_under_a_callers_traceparent_joins_its_trace() {
    let (exec, auth, sink) = executor(answering("spans", "hi"));
    let caller =
        TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let options = SendOptions {
        run_context: Some(RunContext::new().continuing_trace(&caller, Some("k=v".into()))),
        ..Default::default()
    };
    exec.send_message(&auth, Message::user("hi"), options)
        .await
        .unwrap();
    let events = sink.events();
    let run_span = events[0].span_id.clone();
    for event in events.iter() {
        assert_eq!(
            event.trace_id.as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        if event.span_id == run_span {
            assert_eq!(event.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        }
    }
}

#[tokio::test]
async fn a_delegated_run_hangs_under_the_delegating_tool_call() {
    // The child agent, run by the parent's `ask` tool under the call's delegated context.
    let (child, child_auth, child_sink) = executor(answering("child", "ok"));
    let child = Arc::new(child);
    let ask = {
        let child = child.clone();
        FnTool::new(
            "ask",
            "Ask the child",
            json!({"type": "object"}),
            move |_args, ctx| {
                let (child, auth) = (child.clone(), child_auth.clone());
                async move {
                    let options = SendOptions {
                        run_context: Some(ctx.delegated_run("child")),
                        ..Default::default()
                    };
                    let task = child
                        .send_message(&auth, Message::user("help"), options)
                        .await?;
                    Ok(json!(task.state().as_str()))
                }
            },
        )
    };
    let parent_agent = Agent::builder(card("parent"))
        .llm_shared(Arc::new(MockLlm::scripted(vec![
            MockResponse::ToolCalls(vec![ToolCall::new("ask", json!({}))]),
            MockResponse::Text("done".into()),
        ])))
        .tool(ask)
        .build()
        .unwrap();
    let (parent, auth, parent_sink) = executor(parent_agent);
    parent
        .send_message(&auth, Message::user("go"), SendOptions::default())
        .await
        .unwrap();

    let parent_events = parent_sink.events();
    let call = parent_events
        .iter()
        .find(|e| e.is("action.started"))
        .expect("the ask call started");
    let child_events = child_sink.events();
    assert!(!child_events.is_empty());
    for event in child_events.iter() {
        assert_eq!(event.trace_id, call.trace_id, "one trace");
        assert_eq!(
            event.delegation_id.as_deref(),
            call.action_id.as_ref().map(|a| a.as_str())
        );
    }
    // The child's run span hangs under the tool call's span.
    assert_eq!(child_events[0].parent_span_id, call.span_id);
    // Drawn together, the two runs are one tree.
    let mut both: Vec<RunEvent> = parent_events.to_vec();
    both.extend(child_events.iter().cloned());
    assert_eq!(
        draw(&both),
        "run\n  step 1\n    chat 1\n    tool\n      run\n        step 1\n          chat 1\n  step 2\n    chat 2\n"
    );
}

#[tokio::test]
async fn a_run_resumed_after_an_approval_continues_its_trace_and_spans() {
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("echo", json!({"text": "a"}))]),
        MockResponse::Text("done".into()),
    ]));
    let agent = Agent::builder(card("spans"))
        .llm_shared(llm)
        .tool(echo_tool().with_capabilities(["echo"]))
        .policy(
            keel_policy::CapabilityPolicy::new()
                .with_rule("echo", keel_policy::CapabilityRule::RequireApproval),
        )
        .build()
        .unwrap();
    let (exec, auth, sink) = executor(agent);
    let task = go(&exec, &auth).await;
    assert_eq!(task.state(), TaskState::InputRequired);
    let before = sink.events().len();
    let pending: keel_core::ApprovalRequest =
        serde_json::from_value(task.metadata["pending_approval"].clone()).unwrap();
    let done = exec
        .decide_approval(
            &auth,
            &task.id,
            keel_policy::approve_request(&pending, "ops"),
        )
        .await
        .unwrap();
    assert_eq!(done.state(), TaskState::Completed);
    let events = sink.events();
    let (first, resumed) = events.split_at(before);
    assert!(!resumed.is_empty());
    // The resumed part is the same trace, under the same run span, and its model call of
    // step 2 hangs under step 2 of the same run: the whole run draws one tree.
    let run_span = first[0].span_id.clone();
    for event in resumed {
        assert_eq!(event.trace_id, first[0].trace_id);
        if event.step.is_none() && event.action_id.is_none() {
            assert_eq!(event.span_id, run_span, "{event:?}");
        }
    }
    let tree = draw(&events);
    assert!(
        tree.starts_with("run\n  step 1\n    chat 1\n    tool\n"),
        "{tree}"
    );
    assert_eq!(tree.matches("run").count(), 1, "{tree}");
}
