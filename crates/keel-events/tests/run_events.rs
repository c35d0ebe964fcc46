//! Whole-crate behaviour: numbering across sinks, recording, replay, assertions,
//! redaction and golden normalization over a scripted run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use chrono::Utc;
use keel_core::{
    ActionId, AgentError, AgentResult, ApprovalDecision, ApprovalOutcome, ApprovalRequest,
    Artifact, BudgetLimit, ContextManifest, Message, RunAction, RunContext, Task, TaskState,
    ThreadId,
};
use keel_events::payload::{
    ActionCompletedPayload, ActionFailedPayload, ActionPolicyPayload, BudgetPayload,
    LlmCallCompletedPayload, LlmCallStartedPayload,
};
use keel_events::{
    assert_budget_under, assert_no_denied_actions, assert_run_events, normalize, ActionStatus,
    BroadcastEventSink, EventEmitter, EventSink, EventType, InMemoryEventSink, Match, MultiSink,
    RedactionPolicy, ReportWriter, RunEvent, RunEventBuilder, RunRecorder, RunReplay, RunReport,
    REDACTED, RUN_REPORT_VERSION, STORED_RUN_VERSION,
};
use serde_json::json;

/// Ids and times fixed by the script, so two runs differ only where the engine's would.
#[derive(Clone)]
struct Script {
    context: RunContext,
    task: Task,
    write: RunAction,
    delete: RunAction,
    request: ApprovalRequest,
}

fn script() -> Script {
    let context = RunContext::new()
        .with_thread(ThreadId::new())
        .with_agent("clerk");
    let mut task = Task::create(Message::user("publish record 42"));
    task.begin().expect("submitted -> working");
    let mut write = RunAction::tool_call(
        "publish_record",
        json!({"record_id": "42", "api_key": "sk-live-123"}),
    );
    write.capabilities = vec!["records.write".into()];
    let mut delete = RunAction::tool_call("delete_record", json!({"record_id": "7"}));
    delete.capabilities = vec!["records.delete".into()];
    let request = ApprovalRequest {
        request_id: uuid_like(),
        action: write.clone(),
        reason: "capability `records.write` is approval-gated".into(),
        run_id: Some(context.run_id.clone()),
        requested_at: Utc::now(),
    };
    Script {
        context,
        task,
        write,
        delete,
        request,
    }
}

fn uuid_like() -> String {
    ActionId::new().into_string()
}

/// Emit a complete run: one step that writes (approved) and deletes (denied), then a
/// second step that answers; the task completes.
async fn run_script(s: &mut Script, emitter: &impl ScriptOut) -> AgentResult<()> {
    let manifest = ContextManifest {
        system_tokens: 100,
        user_tokens: 20,
        total_estimated_tokens: 120,
        ..Default::default()
    };
    // The model's answer, as the step's `llm.call.completed` reports it.
    let completed = |input_tokens, output_tokens, latency_ms| {
        RunEvent::llm_call_completed(LlmCallCompletedPayload {
            model: Some("mock".into()),
            input_tokens,
            output_tokens,
            latency_ms: Some(latency_ms),
            ..Default::default()
        })
    };
    // `action` requested in step 1, and the policy's `decision` on it for `capability`.
    let judged = |action: &RunAction, decision: &str, reason: &str, capability: &str| {
        let policy = RunEvent::action_policy(ActionPolicyPayload {
            action_id: action.id.clone(),
            decision: decision.into(),
            reason: Some(reason.into()),
            capability: Some(capability.into()),
        });
        [RunEvent::action_requested(action).step(1), policy.step(1)]
    };
    emitter
        .emit(RunEvent::task_status_of(&s.task).summary("task working"))
        .await?;
    emitter
        .emit(RunEvent::context_prepared(&manifest).step(1))
        .await?;
    emitter
        .emit(
            RunEvent::llm_call_started(LlmCallStartedPayload {
                model: Some("mock".into()),
                estimated_input_tokens: 120,
                ..Default::default()
            })
            .step(1),
        )
        .await?;
    emitter.emit(completed(118, 30, 12).step(1)).await?;
    // The approved write.
    let gate = "require_approval";
    for event in judged(&s.write, gate, &s.request.reason, "records.write") {
        emitter.emit(event).await?;
    }
    emitter
        .emit(RunEvent::approval_required(&s.request).step(1))
        .await?;
    let decision = ApprovalDecision {
        request_id: s.request.request_id.clone(),
        outcome: ApprovalOutcome::Approved,
        reason: None,
        decided_by: Some("operator".into()),
        decided_at: Utc::now(),
    };
    emitter
        .emit(RunEvent::approval_decided(&s.request, &decision).step(1))
        .await?;
    emitter
        .emit(RunEvent::action_started(&s.write).step(1))
        .await?;
    let artifact = Artifact::text("published").for_action(s.write.id.clone());
    emitter
        .emit(
            RunEvent::action_completed(ActionCompletedPayload {
                action_id: s.write.id.clone(),
                output: json!({"status": "published"}),
                artifacts: vec![artifact.clone()],
                duration_ms: Some(3),
            })
            .step(1),
        )
        .await?;
    // The denied delete.
    let reason = "deletes are not allowed";
    for event in judged(&s.delete, "deny", reason, "records.delete") {
        emitter.emit(event).await?;
    }
    emitter
        .emit(RunEvent::action_denied(s.delete.id.clone(), "deletes are not allowed").step(1))
        .await?;
    // Second step: a budget warning and the answer.
    emitter
        .emit(
            RunEvent::budget_warning(BudgetPayload {
                limit: "max_steps".into(),
                used: 2,
                max: 2,
                usage: None,
            })
            .step(2),
        )
        .await?;
    emitter.emit(completed(200, 10, 8).step(2)).await?;
    emitter
        .emit(RunEvent::task_artifact(&artifact, false, true))
        .await?;
    s.task.complete("done")?;
    emitter.emit(RunEvent::task_status_of(&s.task)).await?;
    Ok(())
}

/// Where a script's events go: an emitter's sink, or a report writer fed by the emitter.
#[async_trait::async_trait]
trait ScriptOut: Sync {
    async fn emit(&self, event: RunEventBuilder) -> AgentResult<()>;
}

#[async_trait::async_trait]
impl ScriptOut for EventEmitter {
    async fn emit(&self, event: RunEventBuilder) -> AgentResult<()> {
        EventEmitter::emit(self, event).await.map(|_| ())
    }
}

struct Reported<'a>(&'a EventEmitter, &'a ReportWriter);

#[async_trait::async_trait]
impl ScriptOut for Reported<'_> {
    async fn emit(&self, event: RunEventBuilder) -> AgentResult<()> {
        self.0.emit_reported(event, self.1).await
    }
}

fn expected_types() -> Vec<&'static str> {
    vec![
        "task.status",
        "context.prepared",
        "llm.call.started",
        "llm.call.completed",
        "action.requested",
        "action.policy",
        "approval.required",
        "approval.decided",
        "action.started",
        "action.completed",
        "action.requested",
        "action.policy",
        "action.denied",
        "budget.warning",
        "llm.call.completed",
        "task.artifact",
        "task.status",
    ]
}

async fn recorded_run() -> (Script, Vec<RunEvent>) {
    let mut s = script();
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&s.context, sink.clone()).with_task(s.task.id.clone());
    run_script(&mut s, &emitter).await.expect("script runs");
    (s, sink.events())
}

fn panics(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test]
async fn sequence_starts_at_one_and_every_sink_sees_the_same_numbers() {
    let mut s = script();
    let a = Arc::new(InMemoryEventSink::new());
    let b = Arc::new(RunRecorder::new());
    let live = BroadcastEventSink::new(64);
    let mut subscriber = live.subscribe();
    let sink = MultiSink::new()
        .with(a.clone())
        .with(b.clone())
        .with(Arc::new(live));
    let emitter = EventEmitter::new(&s.context, Arc::new(sink));
    run_script(&mut s, &emitter).await.unwrap();

    let from_a = a.events();
    let from_b = b.events();
    let numbers: Vec<u64> = from_a.iter().map(|e| e.sequence).collect();
    assert_eq!(numbers, (1..=from_a.len() as u64).collect::<Vec<_>>());
    assert_eq!(from_a, from_b);
    let mut from_live = Vec::new();
    while let Ok(event) = subscriber.try_recv() {
        from_live.push(event);
    }
    assert_eq!(from_live, from_a);
    assert_eq!(emitter.last_sequence(), from_a.len() as u64);
}

#[tokio::test]
async fn concurrent_emits_reach_the_sink_in_sequence_order() {
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = Arc::new(EventEmitter::new(&RunContext::new(), sink.clone()));
    let mut handles = Vec::new();
    for i in 0..50 {
        let emitter = emitter.clone();
        handles.push(tokio::spawn(async move {
            emitter.emit(RunEvent::llm_stream(format!("{i}"))).await
        }));
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let numbers: Vec<u64> = sink.events().iter().map(|e| e.sequence).collect();
    assert_eq!(numbers, (1..=50).collect::<Vec<_>>());
}

#[tokio::test]
async fn resumed_run_continues_numbering() {
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&RunContext::new(), sink.clone()).continuing_after(41);
    let event = emitter.emit(RunEvent::llm_stream("x")).await.unwrap();
    assert_eq!(event.sequence, 42);
}

struct FailingSink;

#[async_trait::async_trait]
impl EventSink for FailingSink {
    async fn emit(&self, _event: &RunEvent) -> AgentResult<()> {
        Err(AgentError::storage("disk full"))
    }
}

#[tokio::test]
async fn multi_sink_delivers_to_all_and_reports_the_first_error() {
    let ok = Arc::new(InMemoryEventSink::new());
    let sink = MultiSink::new()
        .with(Arc::new(FailingSink))
        .with(ok.clone());
    let emitter = EventEmitter::new(&RunContext::new(), Arc::new(sink));
    let err = emitter.emit(RunEvent::llm_stream("x")).await.unwrap_err();
    assert!(matches!(err, AgentError::Storage { .. }));
    assert_eq!(ok.len(), 1);
}

#[tokio::test]
async fn recorder_builds_the_report_from_a_scripted_run() {
    let mut s = script();
    let recorder = Arc::new(
        RunRecorder::new().with_metadata(
            json!({"source": "test"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
    );
    let emitter = EventEmitter::new(&s.context, recorder.clone()).with_task(s.task.id.clone());
    run_script(&mut s, &emitter).await.unwrap();
    let report = recorder.report();

    assert_eq!(report.run_id.as_ref(), Some(&s.context.run_id));
    assert_eq!(report.task_id.as_ref(), Some(&s.task.id));
    assert_eq!(report.thread_id, s.context.thread_id);
    assert_eq!(report.agent_name.as_deref(), Some("clerk"));
    assert_eq!(report.event_count, expected_types().len() as u64);
    assert_eq!(report.final_state, Some(TaskState::Completed));
    assert_eq!(
        report.final_task.as_ref().and_then(|t| t["id"].as_str()),
        Some(s.task.id.as_str())
    );
    assert!(report.started_at.is_some() && report.finished_at.is_some());
    assert_eq!(report.context_manifests.len(), 1);
    assert_eq!(report.context_manifests[0].total_estimated_tokens, 120);

    assert_eq!(report.actions.len(), 2);
    let write = &report.actions[0];
    assert_eq!(write.action.as_ref(), Some(&s.write));
    assert_eq!(write.status, ActionStatus::Completed);
    assert_eq!(
        write.policy.as_ref().map(|p| p.decision.as_str()),
        Some("require_approval")
    );
    assert_eq!(write.approval_request.as_ref(), Some(&s.request));
    assert_eq!(
        write.approval.as_ref().map(|d| d.outcome),
        Some(ApprovalOutcome::Approved)
    );
    assert_eq!(write.output, Some(json!({"status": "published"})));
    assert_eq!(write.artifacts.len(), 1);
    let delete = &report.actions[1];
    assert_eq!(delete.status, ActionStatus::Denied);
    assert_eq!(delete.error.as_deref(), Some("deletes are not allowed"));

    assert_eq!(report.approvals.len(), 1);
    assert!(report.approvals[0].decision.is_some());
    assert_eq!(report.artifacts.len(), 1);

    assert_eq!(report.model.started_calls, 1);
    assert_eq!(report.model.calls, 2);
    assert_eq!(report.model.input_tokens, 318);
    assert_eq!(report.model.output_tokens, 40);
    assert_eq!(report.model.latency_ms, 20);
    assert_eq!(report.model.models, ["mock"]);

    let usage = &report.budget.usage;
    assert_eq!((usage.steps, usage.llm_calls, usage.tool_calls), (2, 2, 1));
    assert_eq!(report.budget.warnings.len(), 1);
    assert!(report.budget.exceeded.is_none());
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.metadata["source"], "test");
}

#[test]
fn unreadable_payloads_are_noted_not_fatal() {
    let emitter = EventEmitter::new(&RunContext::new(), Arc::new(InMemoryEventSink::new()));
    let bad = emitter.create(RunEvent::builder(EventType::ACTION_POLICY, "?").payload(json!(3)));
    let report = RunReport::from_events(&[bad]);
    assert_eq!(report.event_count, 1);
    assert_eq!(report.problems.len(), 1);
    assert!(report.problems[0].contains("action.policy"));
}

#[tokio::test]
async fn replay_reads_events_and_reports_without_an_engine() {
    let (_, mut events) = recorded_run().await;
    // Arrival order does not matter: the replay sorts by sequence.
    events.reverse();
    let replay = RunReplay::from_events(events);
    let types: Vec<&str> = replay.event_types().iter().map(|t| t.as_str()).collect();
    assert_eq!(types, expected_types());
    assert_eq!(replay.find_events("action.requested").len(), 2);
    assert_eq!(replay.find_events("queue.injected").len(), 0);
    let last = replay.final_event().expect("a final event");
    assert_eq!(last.event_type, EventType::TASK_STATUS);
    assert_eq!(last.sequence, replay.len() as u64);
    assert_eq!(replay.iter().count(), replay.len());

    // From a persisted report, and from its JSON.
    let report = replay.report();
    let from_report = RunReplay::from_report(&report);
    assert_eq!(from_report, replay);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(RunReplay::from_json(&json).unwrap(), replay);
    let events_json = serde_json::to_value(replay.events()).unwrap();
    assert_eq!(RunReplay::from_json(&events_json).unwrap(), replay);
    for not_a_replay in [json!("nope"), json!({"events": 3})] {
        let err = RunReplay::from_json(&not_a_replay).unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn assert_run_events_passes_and_fails_as_documented() {
    let (_, events) = recorded_run().await;
    assert_run_events(&events, &expected_types(), Match::Exact);
    assert_run_events(
        &events,
        &["context.prepared", "approval.decided", "task.status"],
        Match::Subsequence,
    );
    assert_run_events(&events, &[], Match::Subsequence);

    let msg = panics(|| assert_run_events(&events, &["task.status"], Match::Exact));
    assert!(msg.contains("expected") && msg.contains("actual"), "{msg}");
    // Out of order is not a subsequence.
    panics(|| {
        assert_run_events(
            &events,
            &["approval.decided", "approval.required"],
            Match::Subsequence,
        )
    });
    panics(|| assert_run_events(&events, &["subagent.created"], Match::Subsequence));
}

#[tokio::test]
async fn assert_no_denied_actions_passes_and_fails_as_documented() {
    let (_, events) = recorded_run().await;
    // The script denies a delete: action.policy deny comes first.
    let msg = panics(|| assert_no_denied_actions(&events));
    assert!(msg.contains("action.policy"), "{msg}");
    // Without the delete's events the run is clean.
    let clean: Vec<RunEvent> = events
        .iter()
        .filter(|e| e.action_id.as_ref() != Some(&script_delete_id(&events)))
        .cloned()
        .collect();
    assert_no_denied_actions(&clean);
    // An approver's denial alone also counts.
    let emitter = EventEmitter::new(&RunContext::new(), Arc::new(InMemoryEventSink::new()));
    let s = script();
    let denied = ApprovalDecision {
        request_id: s.request.request_id.clone(),
        outcome: ApprovalOutcome::Denied,
        reason: Some("no".into()),
        decided_by: None,
        decided_at: Utc::now(),
    };
    let only = vec![emitter.create(RunEvent::approval_decided(&s.request, &denied))];
    let msg = panics(|| assert_no_denied_actions(&only));
    assert!(msg.contains("approval.decided"), "{msg}");
    let only = vec![emitter.create(RunEvent::action_denied(ActionId::new(), "no"))];
    panics(|| assert_no_denied_actions(&only));
    // A failure is not a denial.
    let only = vec![emitter.create(RunEvent::action_failed(ActionFailedPayload {
        action_id: ActionId::new(),
        error: "boom".into(),
        duration_ms: None,
    }))];
    assert_no_denied_actions(&only);
}

fn script_delete_id(events: &[RunEvent]) -> ActionId {
    events
        .iter()
        .find(|e| e.event_type == EventType::ACTION_DENIED)
        .and_then(|e| e.action_id.clone())
        .expect("the script denies an action")
}

#[tokio::test]
async fn assert_budget_under_passes_and_fails_as_documented() {
    let (_, events) = recorded_run().await;
    let report = RunReport::from_events(&events);
    assert_budget_under(&events, BudgetLimit::MaxSteps, 2);
    assert_budget_under(&report, BudgetLimit::MaxLlmCalls, 2);
    assert_budget_under(&report, BudgetLimit::MaxToolCalls, 1);
    assert_budget_under(&report, BudgetLimit::MaxInputTokens, 318);
    assert_budget_under(&report, BudgetLimit::MaxOutputTokens, 40);
    assert_budget_under(&report, BudgetLimit::MaxRuntimeSeconds, 60);

    let msg = panics(|| assert_budget_under(&report, BudgetLimit::MaxSteps, 1));
    assert!(msg.contains("max_steps"), "{msg}");
    panics(|| assert_budget_under(&events, BudgetLimit::MaxInputTokens, 317));
    panics(|| assert_budget_under(&events, BudgetLimit::MaxOutputTokens, 39));
}

#[tokio::test]
async fn redacted_report_masks_credentials_and_keeps_its_shape() {
    let (_, events) = recorded_run().await;
    let report = RunReport::from_events(&events);
    let redacted = report.redacted(&RedactionPolicy::default()).unwrap();
    // The write's payload carried an api_key, in the action record and in the events.
    let write = redacted.actions[0].action.as_ref().unwrap();
    assert_eq!(write.payload["api_key"], REDACTED);
    assert_eq!(write.payload["record_id"], "42");
    let requested = &redacted.events[4];
    assert_eq!(requested.payload["action"]["payload"]["api_key"], REDACTED);
    // Token counts survive.
    assert_eq!(redacted.model.input_tokens, 318);
    assert_eq!(redacted.context_manifests[0].total_estimated_tokens, 120);
    // And nothing else changed.
    assert_eq!(redacted.actions.len(), report.actions.len());
    assert_eq!(redacted.final_state, report.final_state);
}

#[tokio::test]
async fn golden_normalization_is_stable_across_runs() {
    let (_, first) = recorded_run().await;
    let (_, second) = recorded_run().await;
    assert_ne!(first[0].run_id, second[0].run_id);
    let a = normalize(&first);
    let b = normalize(&second);
    assert_eq!(a, b);
    // No timestamps remain, ids are placeholders, and correlations are kept.
    let text = serde_json::to_string(&a).unwrap();
    assert!(!text.contains("timestamp") && !text.contains("requested_at"));
    assert!(!text.contains(first[0].run_id.as_str()));
    assert_eq!(a[4]["action_id"], a[9]["action_id"]);
    assert_ne!(a[4]["action_id"], a[10]["action_id"]);
    assert_eq!(a[0]["sequence"], 1);
    assert_eq!(a[16]["final"], true);
}

#[tokio::test]
async fn a_redacting_recorder_gives_the_redacted_report() {
    let (_, events) = recorded_run().await;
    let policy = RedactionPolicy::default();
    let plain = RunRecorder::new().with_metadata(
        json!({"note": "Bearer t-1"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    let redacting = RunRecorder::new()
        .with_metadata(plain.report().metadata)
        .redacting(policy.clone());
    for event in &events {
        plain.emit(event).await.unwrap();
        redacting.emit(event).await.unwrap();
    }
    // The same JSON as redacting the whole report at the end.
    let expected = plain.report().redacted_json(&policy).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(redacting.take_report_json().unwrap().as_str()).unwrap();
    assert_eq!(read(&json), read(&expected));
    // The stored events leave out the task, thread and agent they share with the report.
    let first = &json["events"][0];
    assert!(first.get("task_id").is_none() && first.get("agent_name").is_none());
    assert!(!json.to_string().contains("sk-live-123"));
    assert_eq!(json["metadata"]["note"], REDACTED);
    // Events are masked as they arrive, and taking the report empties the recorder.
    assert!(redacting.events().is_empty());
    let events_json = serde_json::to_string(&events).unwrap();
    assert!(
        events_json.contains("sk-live-123"),
        "the sink's copy is untouched"
    );
    // Without a policy the JSON is the report's own.
    report_json_round_trip(&events).await;
}

#[tokio::test]
async fn report_json_holds_each_context_manifest_once_and_reads_back_whole() {
    let (_, events) = recorded_run().await;
    let report = RunReport::from_events(&events);
    assert_eq!(report.context_manifests.len(), 1);
    let json = serde_json::to_value(&report).unwrap();
    assert!(json.get("context_manifests").is_none());
    assert_eq!(json["version"], RUN_REPORT_VERSION);
    let text = json.to_string();
    assert_eq!(text.matches("\"total_estimated_tokens\":120").count(), 1);
    // Reading it back rebuilds the manifests from the `context.prepared` events.
    let back: RunReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
}

#[tokio::test]
async fn report_json_reads_back_whole_events() {
    let (_, mut events) = recorded_run().await;
    // One event of another agent and one with no task: they read back as they were.
    events[1].agent_name = Some("helper".into());
    events[2].task_id = None;
    let report = RunReport::from_events(&events);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["events"].as_array().map(Vec::len), Some(events.len()));
    let back: RunReport = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back.events, report.events);
    assert_eq!(back, report);
    assert_eq!(
        RunReplay::from_json(&json).unwrap().events(),
        &report.events[..]
    );
    // Events that are not an array are an error, not an empty report.
    let mut broken = json;
    broken["events"] = json!(3);
    let err = serde_json::from_value::<RunReport>(broken).unwrap_err();
    assert!(err.is_data(), "{err}");
}

#[tokio::test]
async fn a_report_of_another_version_is_an_error_naming_both_versions() {
    let (_, events) = recorded_run().await;
    let json = serde_json::to_value(RunReport::from_events(&events)).unwrap();
    let expected = format!("this Keel reads version {RUN_REPORT_VERSION}");
    for found in [
        json!(5),
        json!(STORED_RUN_VERSION + 1),
        json!("6"),
        json!(null),
    ] {
        let mut other = json.clone();
        other["version"] = found.clone();
        let err = RunReport::from_value(other.clone()).unwrap_err();
        assert_eq!(err.kind(), keel_core::ErrorKind::InvalidInput);
        let message = err.to_string();
        assert!(message.contains(&format!("version {found}")), "{message}");
        assert!(message.contains(&expected), "{message}");
        // Through serde and a replay, the same message.
        let err = serde_json::from_value::<RunReport>(other.clone()).unwrap_err();
        assert!(err.to_string().contains(&expected), "{err}");
        let err = RunReplay::from_json(&other).unwrap_err();
        assert!(err.to_string().contains(&expected), "{err}");
    }
    let mut none = json;
    none.as_object_mut().unwrap().remove("version");
    assert!(RunReport::from_value(none)
        .unwrap_err()
        .to_string()
        .contains(&expected));
}

#[test]
fn redact_event_masks_the_payload_and_free_text_like_the_report_walk() {
    let emitter = EventEmitter::new(&RunContext::new(), Arc::new(InMemoryEventSink::new()));
    let mut event = emitter.create(
        RunEvent::builder(EventType::new("custom.note"), "Bearer abc")
            .payload(json!({"headers": {"Authorization": "x"}, "n": 1, "input_tokens": 3})),
    );
    let mut walked = serde_json::to_value(&event).unwrap();
    let policy = RedactionPolicy::default();
    policy.redact_value(&mut walked);
    policy.redact_event(&mut event);
    assert_eq!(serde_json::to_value(&event).unwrap(), walked);
    assert_eq!(event.summary, REDACTED);
    assert_eq!(event.payload["headers"]["Authorization"], REDACTED);
    // A configured key naming the payload masks all of it, as the walk would.
    let mut all =
        emitter.create(RunEvent::builder(EventType::new("x"), "ok").payload(json!({"a": 1})));
    RedactionPolicy::new()
        .with_key("payload")
        .redact_event(&mut all);
    assert_eq!(all.payload, json!(REDACTED));
    // Envelope names follow the configured keys too, allowed keys included.
    let mut named = emitter.create(
        RunEvent::builder(EventType::new("x"), "plain").span("span-1", Some("span-0".into())),
    );
    let policy = RedactionPolicy::new().with_key("summary").with_key("span");
    policy.redact_event(&mut named);
    assert_eq!(
        (named.summary.as_str(), named.span_id.as_deref()),
        (REDACTED, Some(REDACTED))
    );
    assert_eq!(named.parent_span_id.as_deref(), Some(REDACTED));
    let mut allowed =
        emitter.create(RunEvent::builder(EventType::new("x"), "plain").payload(json!({"a": 1})));
    policy
        .clone()
        .allow_key("summary")
        .redact_event(&mut allowed);
    assert_eq!(allowed.summary, "plain");
}

#[tokio::test]
async fn report_json_reads_back_every_envelope_shape() {
    let (_, events) = recorded_run().await;
    let mut odd = events.clone();
    // Envelopes unlike the report's own: another run and version, fields absent or set,
    // every severity, text that needs escaping, floats and nesting in the payload.
    odd[1].version = 99;
    odd[1].run_id = keel_core::RunId::new();
    odd[2].task_id = None;
    odd[2].thread_id = Some(ThreadId::new());
    odd[2].agent_name = None;
    odd[3].span_id = Some("span \"1\"\n".into());
    odd[3].parent_span_id = Some("\u{1}parent".into());
    odd[3].delegation_id = Some("delegation/é".into());
    odd[3].parent_action_id = Some(ActionId::new());
    odd[3].severity = keel_events::Severity::Warning;
    odd[4].severity = keel_events::Severity::Error;
    odd[4].summary = "tab\tquote\"backslash\\ bell\u{7}".into();
    // On an event whose payload the report does not read, so it stays well-formed.
    let started = odd.iter().position(|e| e.is("llm.call.started")).unwrap();
    odd[started].payload =
        json!({"f": [0.5, -2.5e-9, 1e300], "n": -3, "big": u64::MAX, "s": "\r\n"});
    odd[6].step = None;
    odd[6].is_final = true;
    report_json_round_trip(&odd).await;
}

#[tokio::test]
async fn report_json_leaves_actions_out_and_reading_rebuilds_them() {
    let (_, events) = recorded_run().await;
    let recorder = recorder_of(&events).await;
    let report = recorder.report();
    assert_eq!(report.actions.len(), 2);
    let text = recorder.take_report_json().unwrap().into_string();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["version"], STORED_RUN_VERSION);
    assert!(json.get("actions").is_none());
    let back: RunReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back.actions, report.actions);
    // An action payload that does not read is noted, and read back.
    let mut broken = events.clone();
    let policy = broken.iter().position(|e| e.is("action.policy")).unwrap();
    broken[policy].payload = json!({"decision": "allow"});
    let recorder = recorder_of(&broken).await;
    let full = recorder.report();
    assert_eq!(full.problems.len(), 1);
    let back: RunReport =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    assert_eq!(back.problems, full.problems);
    assert_eq!(back.actions, full.actions);
}

/// `json` without what differs between two runs of one script: times, and the ids of the
/// artifacts and messages the script makes as it runs.
fn timeless(mut json: serde_json::Value) -> serde_json::Value {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.retain(|k, _| {
                    !(k.ends_with("_at")
                        || ["timestamp", "runtime_seconds", "id", "message_id"]
                            .contains(&k.as_str()))
                });
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut json);
    json
}

#[tokio::test]
async fn a_report_writer_writes_the_redacted_report_of_its_events() {
    let policy = RedactionPolicy::default();
    let s = script();
    // The reference: the script's events through a sink, reported and redacted at the end.
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&s.context, sink.clone()).with_task(s.task.id.clone());
    run_script(&mut s.clone(), &emitter).await.unwrap();
    let events = sink.events();
    let plain = recorder_of(&events).await;
    let expected = plain.report().redacted_json(&policy).unwrap();

    // Fed the same events, a writer writes that report.
    let writer = ReportWriter::new().redacting(policy.clone());
    for event in &events {
        writer.record(event);
    }
    let text = writer.take_json().unwrap().into_string();
    assert!(!text.contains("sk-live-123"));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(read(&json), read(&expected));
    // Taking the report leaves the writer empty.
    let empty: RunReport = serde_json::from_str(writer.take_json().unwrap().as_str()).unwrap();
    assert_eq!(empty.event_count, 0);

    // Fed by its emitter, with no sink listening, it writes the same report, up to the
    // times.
    let writer = ReportWriter::new().redacting(policy.clone());
    let emitter =
        EventEmitter::new(&s.context, Arc::new(MultiSink::new())).with_task(s.task.id.clone());
    run_script(&mut s.clone(), &Reported(&emitter, &writer))
        .await
        .unwrap();
    let text = writer.take_json().unwrap().into_string();
    assert!(!text.contains("sk-live-123"));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let whole = serde_json::to_value(read(&json)).unwrap();
    assert_eq!(timeless(whole), timeless(expected));

    // Unmasked, it reads back as the report of the events.
    let writer = ReportWriter::new();
    let emitter =
        EventEmitter::new(&s.context, Arc::new(MultiSink::new())).with_task(s.task.id.clone());
    run_script(&mut s.clone(), &Reported(&emitter, &writer))
        .await
        .unwrap();
    let back: RunReport = serde_json::from_str(writer.take_json().unwrap().as_str()).unwrap();
    let report = plain.report();
    assert_eq!(back.final_state, report.final_state);
    assert_eq!(
        back.final_task.as_ref().map(|t| &t["id"]),
        report.final_task.as_ref().map(|t| &t["id"])
    );
    assert_eq!(back.actions.len(), report.actions.len());
    assert_eq!(back.context_manifests, report.context_manifests);
    assert_eq!(back.event_count, report.event_count);
    assert_eq!(
        timeless(serde_json::to_value(&back.events).unwrap()),
        timeless(serde_json::to_value(&report.events).unwrap())
    );
}

#[tokio::test]
async fn report_json_leaves_the_final_task_out_and_reading_rebuilds_it() {
    let (_, events) = recorded_run().await;
    let report = RunReport::from_events(&events);
    assert!(report.final_task.is_some());
    let json = serde_json::to_value(&report).unwrap();
    assert!(json.get("final_task").is_none());
    let back: RunReport = serde_json::from_value(json).unwrap();
    assert_eq!(back.final_task, report.final_task);
}

/// A recorder that has recorded `events`.
/// Assert that the report of `events`, as JSON, reads back as the report.
async fn report_json_round_trip(events: &[RunEvent]) {
    let recorder = recorder_of(events).await;
    let report = recorder.report();
    let text = recorder.take_report_json().unwrap().into_string();
    assert_eq!(serde_json::from_str::<RunReport>(&text).unwrap(), report);
}

async fn recorder_of(events: &[RunEvent]) -> RunRecorder {
    let recorder = RunRecorder::new();
    for event in events {
        recorder.emit(event).await.unwrap();
    }
    recorder
}

/// Reported events emitted from several threads at once land in the report in the order of
/// their numbers, each number once, and their times never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reported_events_land_in_sequence_order() {
    let emitter = Arc::new(EventEmitter::new(
        &RunContext::new().with_agent("worker"),
        Arc::new(MultiSink::new()),
    ));
    let report = Arc::new(ReportWriter::new());
    let (tasks, per_task) = (8u64, 200u64);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (emitter, report) = (emitter.clone(), report.clone());
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let event = RunEvent::builder("test.tick", format!("{t}/{i}"));
                emitter
                    .emit_reported(event, &report)
                    .await
                    .expect("reported");
                tokio::task::yield_now().await;
            }
        }));
    }
    for handle in handles {
        handle.await.expect("no panic");
    }
    let text = report.take_json().expect("a report");
    let events = serde_json::from_str::<RunReport>(text.as_str())
        .expect("the report reads")
        .events;
    let numbers: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(numbers, (1..=tasks * per_task).collect::<Vec<_>>());
    assert!(events.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
}

/// `docs/run-report.md` shows a report of the version this crate reads, whose summary is the
/// one its events make.
#[test]
fn the_documented_example_is_a_report_of_this_version() {
    let doc = include_str!("../../../docs/run-report.md");
    let example = doc
        .split("```json")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the doc has a JSON example");
    let json: serde_json::Value = serde_json::from_str(example).expect("the example is JSON");
    let report = RunReport::from_value(json).expect("the example reads");
    assert_eq!(RunReport::from_events(&report.events), report);
    assert!(doc.contains(&format!("today **{RUN_REPORT_VERSION}**")));
}

/// A report's JSON, read.
fn read(json: &serde_json::Value) -> RunReport {
    RunReport::from_value(json.clone()).expect("a report")
}

/// Events whose task, thread and agent all match the report's are stored without them and
/// read back whole; when one event differs, every event keeps its own.
#[tokio::test]
async fn stored_events_leave_out_only_the_ids_all_of_them_share() {
    let (_, events) = recorded_run().await;
    let recorder = recorder_of(&events).await;
    let report = recorder.report();
    let json: serde_json::Value =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    // Decision 257: a run is stored as its events and a small summary; what the events
    // say is rendered from them on reading.
    assert_eq!(json["version"], STORED_RUN_VERSION);
    for left_out in [
        "actions",
        "context_manifests",
        "final_task",
        "problems",
        "approvals",
        "artifacts",
        "model",
        "budget",
        "event_count",
    ] {
        assert!(
            json.get(left_out).is_none(),
            "{left_out} is rebuilt on reading"
        );
    }
    assert_eq!(json["usage"]["llm_calls"], report.budget.usage.llm_calls);
    assert_eq!(json["final_state"], json!(report.final_state));
    assert_eq!(json["trace_id"], json!(events[0].trace_id));
    for event in json["events"].as_array().unwrap() {
        for field in [
            "version",
            "run_id",
            "trace_id",
            "task_id",
            "thread_id",
            "agent_name",
            "sequence",
            "span_id",
            "parent_span_id",
            "timestamp",
        ] {
            assert!(event.get(field).is_none(), "{field} in {event}");
        }
    }
    // Derived spans are the rule: said only when not so (decision 281).
    assert!(json.get("derived_spans").is_none(), "{json}");
    assert_eq!(read(&json), report);
    // Version 10 said `true`, and its absence meant `false`.
    let mut version_10 = json.clone();
    version_10["version"] = json!(10);
    version_10["derived_spans"] = json!(true);
    assert_eq!(read(&version_10).events, report.events);
    version_10.as_object_mut().unwrap().remove("derived_spans");
    assert!(read(&version_10).events.iter().all(|e| e.span_id.is_none()));
    // An event whose span is not the one its run derives keeps its own, and so do the
    // others; a gap in the numbering is written where it is.
    let mut odd = events.clone();
    odd[1].span_id = Some("00000000000000aa".into());
    let last = odd.len() - 1;
    odd[last].sequence += 5;
    let odd_report = RunReport::from_events(&odd);
    let odd_recorder = recorder_of(&odd).await;
    let odd_json: serde_json::Value =
        serde_json::from_str(odd_recorder.take_report_json().unwrap().as_str()).unwrap();
    assert_eq!(odd_json["derived_spans"], false, "{odd_json}");
    assert!(odd_json["events"][0].get("span_id").is_some());
    assert!(odd_json["events"][1].get("sequence").is_none());
    assert_eq!(odd_json["events"][last]["sequence"], odd[last].sequence);
    assert_eq!(read(&odd_json), odd_report);
    // Rendered, it is the documented report of this version, each event whole.
    let rendered = RunReport::render(json).unwrap();
    assert_eq!(rendered["version"], RUN_REPORT_VERSION);
    assert_eq!(rendered, serde_json::to_value(&report).unwrap());

    let mut mixed = events.clone();
    mixed[1].agent_name = Some("helper".into());
    mixed[2].task_id = None;
    let recorder = recorder_of(&mixed).await;
    let report = recorder.report();
    let json: serde_json::Value =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    assert_eq!(json["events"][0]["agent_name"], "clerk");
    assert_eq!(json["events"][1]["agent_name"], "helper");
    assert!(json["events"][2].get("task_id").is_none());
    assert!(
        json["events"][0].get("thread_id").is_none(),
        "the thread is still shared"
    );
    assert_eq!(read(&json), report);
}

/// Decision 270: an event's summary that its payload gives is left out of the stored run and
/// rendered again on reading; a summary its emitter wrote by hand is kept; a run stored by
/// the version before, with every summary, reads as it was written.
#[tokio::test]
async fn stored_events_leave_out_the_summaries_their_payloads_give() {
    let (_, mut events) = recorded_run().await;
    let status = events.iter().position(|e| e.is("task.status")).unwrap();
    events[status].summary = "a summary of the emitter's own".into();
    // The manifest names its run and thread, as the engine's do, but no agent.
    let first = events[0].clone();
    let prepared_at = events
        .iter()
        .position(|e| e.is("context.prepared"))
        .unwrap();
    let manifest = &mut events[prepared_at].payload["manifest"];
    manifest["run_id"] = json!(first.run_id);
    manifest["thread_id"] = json!(first.thread_id.expect("the script names its thread"));
    manifest.as_object_mut().unwrap().remove("agent_name");
    let recorder = recorder_of(&events).await;
    let report = recorder.report();
    let json: serde_json::Value =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    let stored = json["events"].as_array().unwrap();
    let derived = ["llm.call.started", "llm.call.completed", "context.prepared"];
    for kind in derived {
        let event = stored.iter().find(|e| e["type"] == kind).unwrap();
        assert!(event.get("summary").is_none(), "{event}");
    }
    assert_eq!(stored[status]["summary"], "a summary of the emitter's own");
    let back = read(&json);
    assert_eq!(back, report);
    for (read_back, live) in back.events.iter().zip(&events) {
        assert_eq!(read_back.summary, live.summary, "{}", live.event_type);
    }
    // The manifest names the run's ids once, in the run (and none it does not have).
    let prepared = stored
        .iter()
        .find(|e| e["type"] == "context.prepared")
        .unwrap();
    let manifest = &prepared["payload"]["manifest"];
    let live = events.iter().find(|e| e.is("context.prepared")).unwrap();
    for id in ["run_id", "thread_id", "agent_name"] {
        match live.payload["manifest"].get(id) {
            Some(_) => assert!(manifest.get(id).is_none(), "{id} in {manifest}"),
            None => assert_eq!(manifest[id], json!(null), "{id}: none is said"),
        }
    }
    assert!(
        live.payload["manifest"].get("run_id").is_some(),
        "the script names its run"
    );
    let back_prepared = back
        .events
        .iter()
        .find(|e| e.is("context.prepared"))
        .unwrap();
    assert_eq!(back_prepared.payload, live.payload);
    // Version 8 always wrote the summary: such a run reads as written.
    let mut version_8 = json.clone();
    version_8["version"] = json!(8);
    for event in version_8["events"].as_array_mut().unwrap() {
        event["summary"] = json!("as stored");
    }
    let old = read(&version_8);
    assert!(old.events.iter().all(|e| e.summary == "as stored"));
}

/// A `context.prepared` manifest leaves out the per-section items and the total that its
/// section totals give, and its step's model calls the model and estimate it said (decision
/// 273); all read back whole; items or a total that say something else, and a manifest
/// without items, are kept as they were; a run stored by version 9 reads as written.
#[tokio::test]
async fn stored_manifests_leave_out_the_tokens_their_sections_give() {
    let (_, mut events) = recorded_run().await;
    let at = events
        .iter()
        .position(|e| e.is("context.prepared"))
        .unwrap();
    let sections = [("system", 100), ("tools", 0), ("history", 0), ("user", 20)];
    let items: Vec<_> = sections
        .iter()
        .map(|(section, tokens)| json!({"section": section, "tokens": tokens}))
        .collect();
    events[at].payload["manifest"]["context_items"] = json!(items);
    let back_payload = |back: &RunReport| {
        back.events
            .iter()
            .find(|e| e.is("context.prepared"))
            .unwrap()
            .payload
            .clone()
    };

    events[at].payload["manifest"]["model"] = json!("mock");
    events[at].payload["manifest"]["provider"] = json!("scripted");
    let (json, manifest, back) = stored_manifest(&events).await;
    assert_eq!(json["version"], STORED_RUN_VERSION);
    assert!(manifest.get("context_items").is_none(), "{manifest}");
    assert!(
        manifest.get("total_estimated_tokens").is_none(),
        "{manifest}"
    );
    assert_eq!(back_payload(&back), events[at].payload);
    // The step's model calls leave out the model and estimate their manifest said, and say
    // they name no provider where their manifest names one.
    for kind in ["llm.call.started", "llm.call.completed"] {
        let stored = json["events"].as_array().unwrap();
        let call = &stored.iter().find(|e| e["type"] == kind).unwrap()["payload"];
        let fields = call.as_object().unwrap();
        for key in ["model", "estimated_input_tokens"] {
            assert!(!fields.contains_key(key), "{key} in {call}");
        }
        assert_eq!(call["provider"], json!(null), "{call}");
        let live = events.iter().find(|e| e.is(kind)).unwrap();
        let read_back = back.events.iter().find(|e| e.is(kind)).unwrap();
        assert_eq!(read_back.payload, live.payload, "{kind}");
    }

    // Version 9 wrote them whole: one without them reads without them.
    let mut version_9 = json.clone();
    version_9["version"] = json!(9);
    let old = back_payload(&read(&version_9));
    assert!(old["manifest"].get("context_items").is_none(), "{old}");

    // Items and a total that are not what the sections give are kept.
    let mut other = events.clone();
    other[at].payload["manifest"]["context_items"] = json!([{"section": "user", "tokens": 20}]);
    other[at].payload["manifest"]["total_estimated_tokens"] = json!(999);
    let (_, manifest, back) = stored_manifest(&other).await;
    assert_eq!(manifest["total_estimated_tokens"], 999);
    assert_eq!(manifest["context_items"].as_array().unwrap().len(), 1);
    assert_eq!(back_payload(&back), other[at].payload);

    // A manifest without items says so, and reads back without them.
    let mut bare = events.clone();
    let fields = bare[at].payload["manifest"].as_object_mut().unwrap();
    fields.remove("context_items");
    let (_, manifest, back) = stored_manifest(&bare).await;
    assert_eq!(manifest["context_items"], json!(null));
    assert_eq!(back_payload(&back), bare[at].payload);
}

/// The stored JSON of `events`' run, its `context.prepared` manifest as stored, and the
/// report read back from it.
async fn stored_manifest(events: &[RunEvent]) -> (serde_json::Value, serde_json::Value, RunReport) {
    let recorder = recorder_of(events).await;
    let json: serde_json::Value =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    let back = read(&json);
    let prepared = json["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "context.prepared")
        .unwrap()["payload"]["manifest"]
        .clone();
    (json, prepared, back)
}

/// Decision 281: a model's streamed chunks are stored in the first one's entry, an empty
/// payload is left out, and the run reads back event for event as it was emitted; a chunk
/// that says more than its delta (its own summary, another field, another step, a number
/// that does not follow) keeps an entry of its own; a run stored by version 10, an entry a
/// chunk, reads as written.
#[tokio::test]
async fn streamed_chunks_are_stored_as_a_list_and_read_back_as_their_events() {
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&RunContext::new().with_agent("writer"), sink.clone());
    let builders = [
        RunEvent::llm_call_started(LlmCallStartedPayload::default()).step(1),
        RunEvent::llm_stream("You").step(1),
        RunEvent::llm_stream(" said:").step(1),
        RunEvent::llm_stream(" hello").step(1),
        RunEvent::llm_stream(" (said by hand)")
            .step(1)
            .summary("a summary of its own"),
        RunEvent::llm_stream(" there").step(1),
        RunEvent::llm_stream("{")
            .step(1)
            .payload(json!({"delta": "{", "tool": "t"})),
        RunEvent::llm_stream("Next").step(2),
        RunEvent::llm_stream(" step").step(2),
        RunEvent::builder("queue.drained", "queue drained").step(2),
    ];
    for builder in builders {
        emitter.emit(builder).await.unwrap();
    }
    let mut events = sink.events();
    // A gap in the numbers: the chunk after it keeps its own entry.
    events.last_mut().unwrap().sequence += 1;
    let recorder = recorder_of(&events).await;
    let report = recorder.report();
    let json: serde_json::Value =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    assert_eq!(json["version"], STORED_RUN_VERSION);
    let stored = json["events"].as_array().unwrap();
    let entries: Vec<_> = stored
        .iter()
        .map(|e| (e["payload"]["delta"].clone(), e.get("chunks").cloned()))
        .collect();
    let chunk_texts = |e: &serde_json::Value| -> Vec<String> {
        e["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c[0].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(stored.len(), 7, "{entries:?}");
    assert_eq!(stored[1]["payload"]["delta"], "You");
    assert_eq!(chunk_texts(&stored[1]), [" said:", " hello"]);
    assert_eq!(stored[2]["summary"], "a summary of its own");
    assert!(stored[2].get("chunks").is_none(), "{}", stored[2]);
    // A chunk after a hand-written summary starts an entry of its own.
    assert_eq!(stored[3]["payload"]["delta"], " there");
    assert_eq!(stored[4]["payload"]["tool"], "t");
    assert_eq!(chunk_texts(&stored[5]), [" step"]);
    assert_eq!(stored[5]["step"], 2);
    // The chunk's time, as nanoseconds after the run's start.
    let said = &events[2];
    let elapsed = (said.timestamp - events[0].timestamp)
        .num_nanoseconds()
        .unwrap();
    assert_eq!(stored[1]["chunks"][0][1], elapsed);
    // The empty payload is left out.
    assert!(stored[6].get("payload").is_none(), "{}", stored[6]);

    let back = read(&json);
    assert_eq!(back.events, events);
    assert_eq!(back, report);

    // Version 10 wrote an entry a chunk and every payload: such a run reads as written.
    let mut version_10 = json.clone();
    version_10["version"] = json!(10);
    let flat: Vec<serde_json::Value> = back
        .events
        .iter()
        .map(|e| {
            let mut entry =
                json!({"type": e.event_type, "payload": e.payload, "sequence": e.sequence});
            if let Some(step) = e.step {
                entry["step"] = json!(step);
            }
            entry
        })
        .collect();
    version_10["events"] = json!(flat);
    let old = read(&version_10);
    let sequences: Vec<u64> = old.events.iter().map(|e| e.sequence).collect();
    assert_eq!(
        sequences,
        events.iter().map(|e| e.sequence).collect::<Vec<_>>()
    );
    assert_eq!(old.events[2].payload, json!({"delta": " said:"}));
}

/// Decision 281: a status whose message is the text of the run's answer (the one text part of
/// the last artifact before it) is stored without it and reads back with it; a message that
/// says something else, and one after an artifact of two parts, are kept; a status without a
/// message after the answer says so with `null`.
#[tokio::test]
async fn a_status_saying_the_answer_is_stored_without_its_text() {
    use keel_core::Part;
    use keel_events::payload::TaskStatusPayload;
    let status = |message: &str| {
        RunEvent::task_status(TaskStatusPayload {
            state: TaskState::Completed,
            message: Some(message.to_owned()),
            task: None,
        })
    };
    let two_parts = Artifact::text("two").with_part(Part::text(" parts"));
    let builders = [
        status("You said: hello"),
        RunEvent::task_artifact(
            &Artifact::text("You said: hello").named("answer"),
            false,
            true,
        ),
        status("something else"),
        status("You said: hello"),
        RunEvent::task_status(TaskStatusPayload {
            state: TaskState::Working,
            message: None,
            task: None,
        }),
        RunEvent::task_artifact(&two_parts, false, true),
        status("two parts"),
    ];
    let sink = Arc::new(InMemoryEventSink::new());
    let emitter = EventEmitter::new(&RunContext::new(), sink.clone());
    for builder in builders {
        emitter.emit(builder).await.unwrap();
    }
    let events = sink.events();
    let recorder = recorder_of(&events).await;
    let json: serde_json::Value =
        serde_json::from_str(recorder.take_report_json().unwrap().as_str()).unwrap();
    let stored = json["events"].as_array().unwrap();
    let left_out: Vec<bool> = stored
        .iter()
        .filter(|e| e["type"] == "task.status")
        .map(|e| e["payload"].get("message").is_none())
        .collect();
    // Before any answer, another text, the answer, none, after an answer of two parts.
    assert_eq!(left_out, [false, false, true, false, false]);
    assert_eq!(
        stored[4]["payload"]["message"],
        json!(null),
        "{}",
        stored[4]
    );
    assert_eq!(read(&json).events, events);
}
