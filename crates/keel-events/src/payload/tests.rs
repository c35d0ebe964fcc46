//! Every event constructor held to its name, summary, payload JSON and typed payload.

use super::*;
use chrono::{DateTime, Utc};
use keel_core::{AgentError, Message, RunContext, ThreadId};
use serde_json::json;

use crate::{EventEmitter, EventSink, InMemoryEventSink};

/// Hold an event type to its name, summary and payload JSON, and its payload to reading
/// back as `typed`.
pub(crate) fn assert_event<T>(
    builder: RunEventBuilder,
    name: &str,
    summary: &str,
    payload: Value,
    typed: &T,
) where
    T: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let emitter = EventEmitter::new(
        &RunContext::new(),
        std::sync::Arc::new(InMemoryEventSink::new()),
    );
    let event = emitter.create(builder);
    assert_eq!(event.event_type.as_str(), name);
    assert!(EventType::KNOWN.contains(&event.event_type), "{name}");
    assert_eq!(event.summary, summary, "{name}");
    assert_eq!(event.payload, payload, "{name}");
    assert_eq!(&event.payload_as::<T>().unwrap(), typed, "{name}");
    // Decision 270: a summary rendered from the payload is the constructor's own.
    if let Some(rendered) = crate::summary::of(&event.event_type, &event.payload) {
        assert_eq!(rendered, summary, "{name}");
    }
}

#[test]
fn summaries_read_as_their_pieces_say() {
    let action = RunAction::tool_call("noop", json!({}));
    let manifest = ContextManifest {
        total_estimated_tokens: 20,
        ..Default::default()
    };
    let completed = LlmCallCompletedPayload {
        provider: None,
        model: Some("loop".into()),
        input_tokens: 12,
        output_tokens: 3,
        latency_ms: None,
        finish_reason: None,
        cost_micros: None,
    };
    let policy = |reason: Option<&str>| ActionPolicyPayload {
        action_id: action.id.clone(),
        decision: "deny".into(),
        reason: reason.map(Into::into),
        capability: None,
    };
    let cases = [
        (
            RunEvent::context_prepared(&manifest),
            "context prepared: ~20 tokens",
        ),
        (
            RunEvent::llm_call_started(LlmCallStartedPayload {
                provider: None,
                model: None,
                estimated_input_tokens: 0,
            }),
            "calling model",
        ),
        (
            RunEvent::llm_call_completed(completed),
            "loop answered: 12 in / 3 out tokens",
        ),
        (
            RunEvent::action_requested(&action),
            "tool_call `noop` requested",
        ),
        (
            RunEvent::action_started(&action),
            "tool_call `noop` started",
        ),
        (RunEvent::action_policy(policy(None)), "policy: deny"),
        (
            RunEvent::action_policy(policy(Some("no network"))),
            "policy: deny (no network)",
        ),
        (
            RunEvent::task_state_of(&keel_core::Task::new(keel_core::ThreadId::new())),
            "task submitted",
        ),
    ];
    for (builder, summary) in cases {
        assert_eq!(builder.summary, summary);
    }
}

#[test]
fn every_constructor_builds_its_type_and_a_payload_that_reads_back() {
    let action = RunAction::tool_call("t", json!({"a": 1}));
    let request = ApprovalRequest {
        request_id: "r".into(),
        action: action.clone(),
        reason: "why".into(),
        run_id: None,
        requested_at: Utc::now(),
    };
    let decision = ApprovalDecision {
        request_id: "r".into(),
        outcome: ApprovalOutcome::Denied,
        reason: None,
        decided_by: None,
        decided_at: Utc::now(),
    };
    let mut task = Task::create(Message::user("x"));
    task.fail("boom").unwrap_or_else(|e| panic!("{e}"));
    let budget = BudgetPayload {
        limit: "max_steps".into(),
        used: 1,
        max: 1,
        usage: None,
    };
    let emitter = EventEmitter::new(
        &RunContext::new(),
        std::sync::Arc::new(InMemoryEventSink::new()),
    );
    let cases: Vec<(RunEventBuilder, &str)> = vec![
        (RunEvent::task_status_of(&task), "task.status"),
        (
            RunEvent::task_artifact(&Artifact::text("a"), false, true),
            "task.artifact",
        ),
        (
            RunEvent::context_prepared(&ContextManifest::default()),
            "context.prepared",
        ),
        (
            RunEvent::llm_call_started(Default::default()),
            "llm.call.started",
        ),
        (
            RunEvent::llm_call_completed(Default::default()),
            "llm.call.completed",
        ),
        (RunEvent::llm_stream("d"), "llm.stream"),
        (RunEvent::budget_warning(budget.clone()), "budget.warning"),
        (RunEvent::budget_exceeded(budget), "budget.exceeded"),
        (RunEvent::action_requested(&action), "action.requested"),
        (
            RunEvent::action_policy(ActionPolicyPayload {
                action_id: action.id.clone(),
                decision: "allow".into(),
                reason: None,
                capability: None,
            }),
            "action.policy",
        ),
        (RunEvent::action_started(&action), "action.started"),
        (
            RunEvent::action_completed(ActionCompletedPayload {
                action_id: action.id.clone(),
                output: json!(1),
                artifacts: vec![],
                duration_ms: None,
            }),
            "action.completed",
        ),
        (
            RunEvent::action_denied(action.id.clone(), "no"),
            "action.denied",
        ),
        (
            RunEvent::action_failed(ActionFailedPayload {
                action_id: action.id.clone(),
                error: "e".into(),
                duration_ms: None,
            }),
            "action.failed",
        ),
        (RunEvent::approval_required(&request), "approval.required"),
        (
            RunEvent::approval_decided(&request, &decision),
            "approval.decided",
        ),
    ];
    for (builder, name) in cases {
        let event = emitter.create(builder);
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], name);
        assert!(json["payload"].get("payload_error").is_none(), "{name}");
        if name.starts_with("action.") || name.starts_with("approval.") {
            assert_eq!(event.action_id.as_ref(), Some(&action.id), "{name}");
        }
    }
    // The failed task's status is final and an error.
    let status = emitter.create(RunEvent::task_status_of(&task));
    assert!(status.is_final);
    assert_eq!(status.severity, Severity::Error);
    let p: TaskStatusPayload = status.payload_as().unwrap();
    assert_eq!(p.state, TaskState::Failed);
}

#[tokio::test]
async fn broadcast_without_subscribers_is_not_an_error() {
    let sink = crate::BroadcastEventSink::new(0);
    let emitter = EventEmitter::new(
        &RunContext::new(),
        std::sync::Arc::new(InMemoryEventSink::new()),
    );
    let event = emitter.create(RunEvent::llm_stream("x"));
    assert!(sink.emit(&event).await.is_ok());
    assert_eq!(sink.subscriber_count(), 0);
}

#[tokio::test]
async fn task_events_become_run_events_through_one_path() {
    let mut task = Task::create(keel_core::Message::user("hi"));
    let context = RunContext::new();
    context.attach_to_task(&mut task).unwrap();
    let sink = std::sync::Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&context, sink.clone());

    let message = TaskEvent::Message {
        message: task.history[0].clone(),
    };
    assert_eq!(
        emitter
            .emit_task_event(&message, Some(&task))
            .await
            .unwrap(),
        None
    );

    let artifact = TaskEvent::ArtifactUpdate {
        task_id: task.id.clone(),
        thread_id: task.thread_id.clone(),
        artifact: Artifact::text("a").named("answer"),
        append: false,
        last_chunk: true,
    };
    let event = emitter
        .emit_task_event(&artifact, None)
        .await
        .unwrap()
        .unwrap();
    assert!(event.is(EventType::TASK_ARTIFACT.as_str()));
    assert_eq!(event.task_id.as_ref(), Some(&task.id));
    assert_eq!(event.run_context().unwrap(), None);

    task.begin().unwrap();
    let working = TaskEvent::status_of(&task, false);
    let event = emitter
        .emit_task_event(&working, None)
        .await
        .unwrap()
        .unwrap();
    assert!(!event.is_final);
    assert_eq!(event.run_context().unwrap(), None, "no task rides on it");

    task.complete("done").unwrap();
    let done = TaskEvent::status_of(&task, true);
    let event = emitter
        .emit_task_event(&done, Some(&task))
        .await
        .unwrap()
        .unwrap();
    assert!(event.is_final);
    let p: TaskStatusPayload = event.payload_as().unwrap();
    assert_eq!(
        (p.state, p.message.as_deref()),
        (TaskState::Completed, Some("done"))
    );
    let recovered = event.run_context().unwrap().unwrap();
    assert_eq!(recovered.run_id, context.run_id);
    assert_eq!(recovered.trace_id, context.trace_id);
    // The task's own helper takes the same path: the same payload, the same boundary.
    let of_task = emitter.create(RunEvent::task_status_of(&task));
    assert_eq!(
        (of_task.payload, of_task.is_final),
        (event.payload, event.is_final)
    );
    assert_eq!(sink.events().len(), 3);
}

#[tokio::test]
async fn a_carried_context_that_does_not_read_is_a_typed_error() {
    let mut task = Task::create(keel_core::Message::user("hi"));
    task.metadata
        .insert(keel_core::RUN_CONTEXT_KEY.into(), serde_json::json!(42));
    let emitter = EventEmitter::new(
        &RunContext::new(),
        std::sync::Arc::new(InMemoryEventSink::new()),
    );
    let event = emitter.create(RunEvent::task_status_of(&task));
    let err = event.run_context().unwrap_err();
    assert!(
        matches!(&err, AgentError::InvalidInput { field, .. } if field.ends_with("run_context")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_slow_subscriber_loses_the_oldest_events_and_is_told_how_many() {
    let sink = crate::BroadcastEventSink::new(2);
    let mut slow = sink.subscribe();
    let emitter = EventEmitter::new(
        &RunContext::new(),
        std::sync::Arc::new(InMemoryEventSink::new()),
    );
    for i in 0..5 {
        // Never blocks, however far behind the subscriber is.
        sink.emit(&emitter.create(RunEvent::llm_stream(i.to_string())))
            .await
            .unwrap();
    }
    assert_eq!(
        slow.try_recv(),
        Err(async_broadcast::TryRecvError::Overflowed(3))
    );
    let rest: Vec<u64> = std::iter::from_fn(|| slow.try_recv().ok())
        .map(|e| e.sequence)
        .collect();
    assert_eq!(rest, [4, 5]);
}

// Effects.

/// The one instant the effect and deadline payloads name.
fn due() -> DateTime<Utc> {
    "2026-01-02T03:04:05Z".parse().unwrap_or_default()
}

#[test]
fn effect_scheduled() {
    let payload = EffectScheduledPayload {
        timer_id: "t-1".into(),
        name: "remind".into(),
        due_at: due(),
    };
    assert_event(
        RunEvent::effect_scheduled(payload.clone()),
        "effect.scheduled",
        "effect `remind` scheduled for 2026-01-02T03:04:05+00:00",
        json!({"timer_id": "t-1", "name": "remind", "due_at": "2026-01-02T03:04:05Z"}),
        &payload,
    );
}

#[test]
fn effect_fired() {
    let payload = EffectFiredPayload {
        timer_id: "t-1".into(),
        name: "remind".into(),
        due_at: due(),
        error: None,
    };
    assert_event(
        RunEvent::effect_fired(payload.clone()),
        "effect.fired",
        "effect `remind` fired",
        json!({"timer_id": "t-1", "name": "remind", "due_at": "2026-01-02T03:04:05Z",
               "error": null}),
        &payload,
    );
    let failed = EffectFiredPayload {
        error: Some("boom".into()),
        ..payload
    };
    assert_event(
        RunEvent::effect_fired(failed.clone()),
        "effect.fired",
        "effect `remind` fired",
        json!({"timer_id": "t-1", "name": "remind", "due_at": "2026-01-02T03:04:05Z",
               "error": "boom"}),
        &failed,
    );
}

#[test]
fn effect_canceled() {
    let payload = EffectCanceledPayload {
        timer_id: "t-1".into(),
        name: "remind".into(),
    };
    assert_event(
        RunEvent::effect_canceled(payload.clone()),
        "effect.canceled",
        "effect `remind` canceled",
        json!({"timer_id": "t-1", "name": "remind"}),
        &payload,
    );
}

#[test]
fn effect_dropped() {
    let payload = EffectDroppedPayload {
        timer_id: "t-1".into(),
        name: "remind".into(),
        reason: "no handler".into(),
    };
    assert_event(
        RunEvent::effect_dropped(payload.clone()),
        "effect.dropped",
        "effect `remind` dropped: no handler",
        json!({"timer_id": "t-1", "name": "remind", "reason": "no handler"}),
        &payload,
    );
}

// The thread engine's markers.

/// Both events that carry a [`ToolAsyncDeadlinePayload`], checked against one payload.
#[test]
fn tool_async_dispatched_and_timed_out() {
    let payload = ToolAsyncDeadlinePayload {
        call_id: "c-1".into(),
        tool_call_id: "t-1".into(),
        tool: "fetch".into(),
        deadline: due(),
    };
    let cases = [
        (
            RunEvent::tool_async_dispatched as fn(_) -> _,
            "tool.async.dispatched",
            "asynchronous tool `fetch` dispatched",
        ),
        (
            RunEvent::tool_async_timed_out,
            "tool.async.timed_out",
            "asynchronous tool `fetch` timed out",
        ),
    ];
    for (build, kind, text) in cases {
        assert_event(
            build(payload.clone()),
            kind,
            text,
            json!({"call_id": "c-1", "tool_call_id": "t-1", "tool": "fetch",
                   "deadline": "2026-01-02T03:04:05Z"}),
            &payload,
        );
    }
}

#[test]
fn tool_async_progress() {
    let payload = ToolAsyncProgressPayload {
        call_id: "c-1".into(),
        tool_call_id: "t-1".into(),
        tool: "fetch".into(),
        progress: json!({"percent": 40}),
    };
    assert_event(
        RunEvent::tool_async_progress(payload.clone()),
        "tool.async.progress",
        "asynchronous tool `fetch` reported progress",
        json!({"call_id": "c-1", "tool_call_id": "t-1", "tool": "fetch",
               "progress": {"percent": 40}}),
        &payload,
    );
}

#[test]
fn thread_terminated() {
    let payload = ThreadTerminatedPayload {
        thread_id: ThreadId::from("th-1"),
        terminated_at: Some(due()),
    };
    assert_event(
        RunEvent::thread_terminated(payload.clone()),
        "thread.terminated",
        "thread th-1 terminated",
        json!({"thread_id": "th-1", "terminated_at": "2026-01-02T03:04:05Z"}),
        &payload,
    );
}

#[test]
fn tool_async_acknowledged() {
    let payload = ToolAsyncAcknowledgedPayload {
        call_id: "c-1".into(),
        tool_call_id: "t-1".into(),
        tool: "fetch".into(),
    };
    assert_event(
        RunEvent::tool_async_acknowledged(payload.clone()),
        "tool.async.acknowledged",
        "asynchronous tool `fetch` acknowledged",
        json!({"call_id": "c-1", "tool_call_id": "t-1", "tool": "fetch"}),
        &payload,
    );
}

#[test]
fn tool_async_result() {
    let payload = ToolAsyncResultPayload {
        call_id: "c-1".into(),
        tool_call_id: "t-1".into(),
        tool: "fetch".into(),
        is_error: true,
    };
    assert_event(
        RunEvent::tool_async_result(payload.clone()),
        "tool.async.result",
        "asynchronous tool `fetch` called back",
        json!({"call_id": "c-1", "tool_call_id": "t-1", "tool": "fetch", "is_error": true}),
        &payload,
    );
}

#[test]
fn queue_injected() {
    let payload = QueueInjectedPayload {
        items: vec!["q-1".into(), "q-2".into()],
    };
    assert_event(
        RunEvent::queue_injected(payload.clone()),
        "queue.injected",
        "2 queued item(s) injected",
        json!({"items": ["q-1", "q-2"]}),
        &payload,
    );
}

#[test]
fn queue_drained() {
    assert_event(
        RunEvent::queue_drained(),
        "queue.drained",
        "queue drained",
        json!({}),
        &json!({}),
    );
}

#[test]
fn message_persisted() {
    let payload = MessagePersistedPayload {
        role: "assistant".into(),
        tool_calls: 2,
    };
    assert_event(
        RunEvent::message_persisted(payload.clone()),
        "message.persisted",
        "assistant message persisted",
        json!({"role": "assistant", "tool_calls": 2}),
        &payload,
    );
}

#[test]
fn tool_result_persisted() {
    let payload = ToolResultPersistedPayload {
        call_id: "t-1".into(),
        is_error: false,
        tool: "fetch".into(),
    };
    assert_event(
        RunEvent::tool_result_persisted(payload.clone()),
        "tool_result.persisted",
        "tool result persisted",
        json!({"call_id": "t-1", "is_error": false, "tool": "fetch"}),
        &payload,
    );
}

#[test]
fn run_stopped() {
    let awaiting = RunStoppedPayload {
        reason: "awaiting_tool".into(),
        call_id: Some("c-1".into()),
        state: TaskState::Working,
    };
    assert_event(
        RunEvent::run_stopped(awaiting.clone()),
        "run.stopped",
        "run stopped: awaiting_tool",
        json!({"reason": "awaiting_tool", "call_id": "c-1", "state": "working"}),
        &awaiting,
    );
    let answered = RunStoppedPayload {
        reason: "response".into(),
        call_id: None,
        state: TaskState::Completed,
    };
    assert_event(
        RunEvent::run_stopped(answered.clone()),
        "run.stopped",
        "run stopped: response",
        json!({"reason": "response", "state": "completed"}),
        &answered,
    );
}

#[test]
fn stop_evaluated() {
    let fired = StopEvaluatedPayload {
        stop: Some("stop_tool".into()),
    };
    assert_event(
        RunEvent::stop_evaluated(fired.clone()),
        "stop.evaluated",
        "stop rules evaluated",
        json!({"stop": "stop_tool"}),
        &fired,
    );
    let none = StopEvaluatedPayload { stop: None };
    assert_event(
        RunEvent::stop_evaluated(none.clone()),
        "stop.evaluated",
        "stop rules evaluated",
        json!({"stop": null}),
        &none,
    );
}

// Subagents.
#[test]
fn subagent_created() {
    let payload = SubagentCreatedPayload {
        subagent: "researcher".into(),
        name: "r-1".into(),
        child_thread_id: ThreadId::from("th-2"),
        agent: "research".into(),
        attachments: vec!["keel://files/a".into()],
        wait: true,
    };
    assert_event(
        RunEvent::subagent_created(payload.clone()),
        "subagent.created",
        "subagent `r-1` created",
        json!({"subagent": "researcher", "name": "r-1", "child_thread_id": "th-2",
               "agent": "research", "attachments": ["keel://files/a"], "wait": true}),
        &payload,
    );
}

#[test]
fn subagent_messaged() {
    let payload = SubagentMessagedPayload {
        subagent: "researcher".into(),
        name: "r-1".into(),
        child_thread_id: ThreadId::from("th-2"),
        attachments: vec![],
    };
    assert_event(
        RunEvent::subagent_messaged(payload.clone()),
        "subagent.messaged",
        "subagent `r-1` messaged",
        json!({"subagent": "researcher", "name": "r-1", "child_thread_id": "th-2",
               "attachments": []}),
        &payload,
    );
}

fn ended(state: TaskState) -> SubagentEndedPayload {
    SubagentEndedPayload {
        subagent: "researcher".into(),
        name: "r-1".into(),
        child_thread_id: ThreadId::from("th-2"),
        task_id: TaskId::from("task-2"),
        state,
        result: "found it".into(),
        attachments: vec![SubagentFile {
            uri: Some("keel://files/b".into()),
            name: Some("b.txt".into()),
            media_type: None,
        }],
    }
}

fn ended_json(state: &str) -> serde_json::Value {
    json!({"subagent": "researcher", "name": "r-1", "child_thread_id": "th-2",
           "task_id": "task-2", "state": state, "result": "found it",
           "attachments": [{"uri": "keel://files/b", "name": "b.txt", "media_type": null}]})
}

#[test]
fn subagent_returned() {
    let payload = ended(TaskState::Completed);
    assert_event(
        RunEvent::subagent_ended(payload.clone()),
        "subagent.returned",
        "subagent `r-1` ended completed",
        ended_json("completed"),
        &payload,
    );
}

#[test]
fn subagent_failed() {
    let payload = ended(TaskState::InputRequired);
    assert_event(
        RunEvent::subagent_ended(payload.clone()),
        "subagent.failed",
        "subagent `r-1` ended input-required",
        ended_json("input-required"),
        &payload,
    );
}

#[test]
fn subagent_status() {
    let payload = SubagentStatusPayload {
        child_thread_id: ThreadId::from("th-2"),
        parent_thread_id: ThreadId::from("th-1"),
        status: "busy".into(),
    };
    assert_event(
        RunEvent::subagent_status(payload.clone()),
        "subagent.status",
        "subagent status: busy",
        json!({"child_thread_id": "th-2", "parent_thread_id": "th-1", "status": "busy"}),
        &payload,
    );
}

#[test]
fn subagent_bootstrap_required() {
    let payload = SubagentBootstrapPayload {
        error: "scoped_variables_missing".into(),
        subagent: "researcher".into(),
        name: "r-1".into(),
        request_id: "req-1".into(),
        missing: vec!["API_TOKEN".into()],
        complete: ScopedVariablesRoute {
            get: "GET /threads/th-1/variables/req-1".into(),
            post: "POST /threads/th-1/variables/req-1".into(),
        },
        note: "the subagent starts as soon as the missing variables are provided".into(),
    };
    assert_event(
        RunEvent::subagent_bootstrap_required(payload.clone()),
        "subagent.bootstrap_required",
        "subagent `r-1` waits for scoped variables",
        json!({"error": "scoped_variables_missing", "subagent": "researcher",
               "name": "r-1", "request_id": "req-1", "missing": ["API_TOKEN"],
               "complete": {"get": "GET /threads/th-1/variables/req-1",
                            "post": "POST /threads/th-1/variables/req-1"},
               "note": "the subagent starts as soon as the missing variables are provided"}),
        &payload,
    );
}
