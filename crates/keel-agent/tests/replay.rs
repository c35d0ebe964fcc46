//! Replay as a regression test (issue 42): a recorded run re-driven through the current
//! agent definition, with no model call and no side effect, and its first divergence.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use keel_agent::replay::{Recording, Replay};
use keel_agent::AgentBuilder;
use keel_core::{ErrorKind, Message, RunBudget, TaskState};
use keel_llm::{MockLlm, MockResponse};
use keel_policy::{CapabilityPolicy, CapabilityRule};
use keel_runtime::{Runtime, Services};
use serde_json::{json, Value};

// Its unchanged replay runs on every backend in the rules harness (engine_rules.rs).
#[allow(dead_code)]
#[path = "rules/replay_fixture.rs"]
mod replay_fixture;

use replay_fixture::*;

fn memory() -> Arc<dyn Runtime> {
    Arc::new(Services::in_memory(Arc::new(MockLlm::new())))
}

#[tokio::test]
async fn an_answer_streamed_in_chunks_is_replayed_in_the_same_chunks() {
    let built =
        agent(Arc::new(AtomicUsize::new(0)), INSTRUCTIONS, schema()).llm(MockLlm::scripted(vec![
            MockResponse::Text("all three records are written".into()),
        ]));
    let (exec, auth, task) = send_write(memory(), built).await;
    let recording = recording_of(&exec, &auth, &task).await;
    let chunks = &recording.steps[0].chunks;
    assert!(
        chunks.len() > 1,
        "the offline model streams word by word: {chunks:?}"
    );
    assert_eq!(chunks.concat(), "all three records are written");
    let outcome = replayed(
        recording,
        agent(Arc::new(AtomicUsize::new(0)), INSTRUCTIONS, schema()),
    )
    .await;
    assert_eq!(outcome.divergence, None, "{:?}", outcome.divergence);
}

/// Replay the recording through `changed` and return the first divergence.
async fn divergence_of(changed: AgentBuilder) -> keel_agent::replay::Divergence {
    let recording = record(memory()).await;
    let outcome = replayed(recording, changed).await;
    let found = outcome.divergence.expect("the change shows");
    println!("{found}");
    found
}

#[tokio::test]
async fn changed_instructions_show_as_a_different_model_input_at_step_1() {
    let writes = Arc::new(AtomicUsize::new(0));
    let found = divergence_of(agent(
        writes,
        "You keep records. Never write twice.",
        schema(),
    ))
    .await;
    assert_eq!(found.step, Some(1));
    assert_eq!(found.event, "context.prepared");
    assert_eq!(found.field, "payload.manifest.context_items.0.tokens");
}

#[tokio::test]
async fn a_changed_tool_schema_shows_in_the_tool_declarations_at_step_1() {
    let writes = Arc::new(AtomicUsize::new(0));
    let wider = json!({"type": "object", "properties": {"id": {"type": "string"},
        "note": {"type": "string", "description": "why the record is written"}}, "required": ["id"]});
    let found = divergence_of(agent(writes, INSTRUCTIONS, wider)).await;
    assert_eq!(
        (found.step, found.event.as_str()),
        (Some(1), "context.prepared")
    );
    assert_eq!(found.field, "payload.manifest.context_items.1.tokens");
}

#[tokio::test]
async fn a_tightened_policy_shows_as_a_different_decision() {
    let writes = Arc::new(AtomicUsize::new(0));
    let found = divergence_of(
        agent(writes, INSTRUCTIONS, schema())
            .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::Deny)),
    )
    .await;
    assert_eq!(
        (found.step, found.event.as_str()),
        (Some(1), "action.policy")
    );
    assert_eq!(found.field, "payload.decision");
    assert_eq!(found.now, json!("deny"));
}

#[tokio::test]
async fn a_lower_budget_shows_as_a_budget_stop() {
    let writes = Arc::new(AtomicUsize::new(0));
    let found = divergence_of(agent(writes, INSTRUCTIONS, schema()).budget(RunBudget {
        max_llm_calls: Some(1),
        ..RunBudget::default()
    }))
    .await;
    // One model call allowed: the budget warns before the first one, where none warned.
    assert_eq!(found.step, Some(1));
    assert_eq!(found.now, json!("budget.warning"), "{found}");
}

#[tokio::test]
async fn a_fork_at_step_2_continues_with_the_live_model() {
    let recording = record(memory()).await;
    let writes = Arc::new(AtomicUsize::new(0));
    let live = Arc::new(MockLlm::scripted(vec![MockResponse::Text(
        "forked answer".into(),
    )]));
    let outcome = Replay::new(recording)
        .fork_at(2, live)
        .run(
            agent(writes.clone(), INSTRUCTIONS, schema()),
            Message::user("write r1"),
        )
        .await
        .unwrap();
    assert_eq!(outcome.task.state(), TaskState::Completed);
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "step 1's call came from the recording"
    );
    let answer = serde_json::to_string(&outcome.task).unwrap();
    assert!(answer.contains("forked answer"), "{answer}");
    let found = outcome.divergence.expect("the live answer differs");
    assert_eq!(found.step, Some(2));
}

#[tokio::test]
async fn a_report_of_an_older_format_says_why_it_cannot_be_replayed() {
    let recording = record(memory()).await;
    let mut json = serde_json::to_value(&recording.report).unwrap();
    json["version"] = json!(6);
    let error = Recording::from_json(&json).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    assert!(error.to_string().contains("report format 6"), "{error}");
}

#[tokio::test]
async fn a_tool_call_the_recording_never_made_is_reported_not_run() {
    let deny = |agent: AgentBuilder| {
        agent.policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::Deny))
    };
    let recording = record_as(memory(), deny, 0).await;
    assert!(recording.tool_calls.is_empty());
    let writes = Arc::new(AtomicUsize::new(0));
    let allowed = agent(writes.clone(), INSTRUCTIONS, schema())
        .policy(CapabilityPolicy::new().with_rule("records.write", CapabilityRule::Allow));
    let outcome = replayed(recording, allowed).await;
    assert_eq!(outcome.unrecorded_tools, vec!["write_record".to_owned()]);
    assert_eq!(writes.load(Ordering::SeqCst), 0, "the tool did not run");
    assert!(!outcome.passed());
    let found = outcome.divergence.expect("the allowed call differs");
    assert_eq!(
        (found.step, found.event.as_str()),
        (Some(1), "action.policy")
    );
}

#[tokio::test]
async fn a_folder_of_exported_runs_replays_each_one() {
    let recording = record(memory()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut export = serde_json::to_value(&recording.report).unwrap();
    export["input"] = serde_json::to_value(Message::user("write r1")).unwrap();
    let exported = export.to_string();
    std::fs::write(dir.path().join("a_write.json"), &exported).unwrap();
    let mut old: Value = serde_json::from_str(&exported).unwrap();
    old["version"] = json!(6);
    std::fs::write(dir.path().join("b_old.json"), old.to_string()).unwrap();
    let writes = Arc::new(AtomicUsize::new(0));
    let outcomes = keel_agent::replay::replay_dir(dir.path(), || {
        agent(writes.clone(), INSTRUCTIONS, schema())
    })
    .await
    .unwrap();
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes[0].1.as_ref().unwrap().passed());
    let error = outcomes[1].1.as_ref().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    assert_eq!(writes.load(Ordering::SeqCst), 0);
}

/// A run that paused for an approval and was approved later (as `keel tasks approve` does)
/// replays unchanged: the replay pauses at the same point and is given the recorded decision.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_approved_after_a_pause_replays_without_divergence() {
    let writes = Arc::new(AtomicUsize::new(0));
    let built = unattended(writes.clone(), INSTRUCTIONS, schema()).llm_shared(script());
    let (exec, auth, paused) = send_write(memory(), built).await;
    assert_eq!(paused.state(), TaskState::InputRequired);
    let pending = exec
        .reads()
        .pending_approvals(&auth, None, None, None)
        .await
        .unwrap();
    let decision = keel_policy::approve_request(&pending.items[0].request, "reviewer");
    let done = exec
        .decide_approval(&auth, &paused.id, decision)
        .await
        .unwrap();
    assert_eq!(done.state(), TaskState::Completed);
    assert_eq!(writes.load(Ordering::SeqCst), 1);
    let recording = recording_of(&exec, &auth, &done).await;
    assert!(recording.paused_for_approval());
    assert_eq!(
        recording.steps[0].response.tool_calls.len(),
        1,
        "one call, requested twice"
    );

    let replayed_writes = Arc::new(AtomicUsize::new(0));
    let outcome = replayed(
        recording,
        unattended(replayed_writes.clone(), INSTRUCTIONS, schema()),
    )
    .await;
    assert_eq!(outcome.divergence, None, "{:?}", outcome.divergence);
    assert_eq!(outcome.task.state(), TaskState::Completed);
    assert_eq!(
        replayed_writes.load(Ordering::SeqCst),
        0,
        "a replay runs no tool"
    );
}
