//! The operator API acting and watching over real HTTP: approving and denying a pending
//! action, messages and compaction of a thread, and live events over SSE that resume with
//! `Last-Event-ID` with no gap and no duplicate.

mod support;

use std::sync::atomic::Ordering;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::operator::{Operator, SseEvent, WRITE};
use support::{ALICE, BOB};

/// The pending request of Alice's only waiting task.
async fn pending_request(op: &Operator) -> String {
    let (status, approvals) = op.get(Some(ALICE), "/approvals").await;
    assert_eq!(status, StatusCode::OK, "{approvals}");
    assert_eq!(
        approvals["approvals"].as_array().unwrap().len(),
        1,
        "{approvals}"
    );
    approvals["approvals"][0]["request"]["request_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn seqs(events: &[SseEvent]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e.data["seq"].as_u64().unwrap())
        .collect()
}

fn final_state(events: &[SseEvent]) -> Value {
    events.last().unwrap().data["event"]["status"]["state"].clone()
}

#[tokio::test]
async fn an_approved_action_runs_and_the_task_stream_shows_it_live_and_resumes_exactly() {
    let op = Operator::start().await;
    let waiting = op.send("approve", WRITE).await;
    assert_eq!(waiting["status"]["state"], "input-required", "{waiting}");
    let task_id = waiting["id"].as_str().unwrap().to_owned();
    let request_id = pending_request(&op).await;

    // Watch the task live from its first event, then approve.
    let path = format!("/tasks/{task_id}/events");
    let mut live = op.events(ALICE, &path, None).await;
    let before = live.take(1).await;
    assert_eq!(before[0].id.as_deref(), Some("1"));
    let decide = format!("/tasks/{task_id}/approvals/{request_id}");
    let task = op
        .post_ok(
            &decide,
            json!({"decision": "approve", "reason": "looks right"}),
        )
        .await;
    assert_eq!(task["status"]["state"], "completed", "{task}");
    assert_eq!(op.writes.load(Ordering::SeqCst), 1);

    // The stream went on from the log to the live events and ended with the terminal status.
    let mut events = before;
    events.extend(live.rest().await);
    // Beside the log, live: the model call of the run the approval resumed, with no `id:`
    // (the log's positions stay the only resume points).
    let (model_calls, events): (Vec<SseEvent>, Vec<SseEvent>) =
        events.into_iter().partition(|e| e.name == "run");
    let kinds: Vec<&str> = model_calls
        .iter()
        .map(|e| e.data["run_event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"llm.call.started"), "{model_calls:?}");
    println!("live model-call events: {kinds:?}");
    assert!(
        kinds
            .iter()
            .all(|k| ["llm.call.started", "llm.call.completed"].contains(k)),
        "{kinds:?}"
    );
    assert!(model_calls
        .iter()
        .all(|e| e.id.is_none() && e.data["run_event"]["task_id"] == task_id.as_str()));
    let all = seqs(&events);
    assert_eq!(
        all,
        (1..=all.len() as u64).collect::<Vec<_>>(),
        "no gap, no repeat"
    );
    assert!(events
        .iter()
        .all(|e| e.id == Some(e.data["seq"].to_string())));
    assert!(events.iter().all(|e| e.data["task_id"] == task_id.as_str()));
    assert_eq!(final_state(&events), "completed", "{:?}", events.last());

    // Resuming after any event sends exactly the ones after it, by header or by query.
    for after in [1, 2, all.len() as u64 - 1] {
        let resumed = op
            .events(ALICE, &path, Some(&after.to_string()))
            .await
            .rest()
            .await;
        assert_eq!(
            seqs(&resumed),
            ((after + 1)..=all.len() as u64).collect::<Vec<_>>()
        );
        let by_query = op
            .events(ALICE, &format!("{path}?after={after}"), None)
            .await
            .rest()
            .await;
        assert_eq!(seqs(&by_query), seqs(&resumed));
    }
    // After the last event of a finished task: nothing, and the stream ends.
    let last = all.len().to_string();
    assert!(op
        .events(ALICE, &path, Some(&last))
        .await
        .rest()
        .await
        .is_empty());

    // The decision is spent: deciding again is a conflict, not a second run.
    let (status, again) = op
        .post(Some(ALICE), &decide, Some(json!({"decision": "approve"})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    assert_eq!(again["error"]["code"], "not_awaiting_approval");
    assert_eq!(op.writes.load(Ordering::SeqCst), 1);
    op.stop().await;
}

#[tokio::test]
async fn a_denied_action_does_not_run_and_a_wrong_request_id_is_not_found() {
    let op = Operator::start().await;
    let waiting = op.send("deny", WRITE).await;
    let task_id = waiting["id"].as_str().unwrap().to_owned();
    let request_id = pending_request(&op).await;

    let (status, wrong) = op
        .post(
            Some(ALICE),
            &format!("/tasks/{task_id}/approvals/not-{request_id}"),
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{wrong}");
    assert_eq!(wrong["error"]["code"], "approval_not_found");
    // Bob cannot decide it either; it still waits.
    let decide = format!("/tasks/{task_id}/approvals/{request_id}");
    let (status, _) = op
        .post(Some(BOB), &decide, Some(json!({"decision": "approve"})))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let task = op
        .post_ok(&decide, json!({"decision": "deny", "reason": "not today"}))
        .await;
    assert_ne!(task["status"]["state"], "input-required", "{task}");
    assert_eq!(
        op.writes.load(Ordering::SeqCst),
        0,
        "a denied action never runs"
    );
    let (_, approvals) = op.get(Some(ALICE), "/approvals").await;
    assert_eq!(approvals["approvals"], json!([]));

    // The run's report records who denied it and why.
    let (_, runs) = op
        .get(Some(ALICE), &format!("/runs?task_id={task_id}"))
        .await;
    let report = runs["runs"][0]["report"].to_string();
    assert!(report.contains("not today"), "{report}");
    op.stop().await;
}

#[tokio::test]
async fn messages_go_to_a_thread_and_its_history_compacts() {
    let op = Operator::start().await;
    for text in ["one", "two", "three"] {
        let task = op.send("chat", text).await;
        assert_eq!(task["status"]["state"], "completed", "{task}");
        assert_eq!(task["thread_id"], "chat");
    }
    // Named agent, and an answer at once.
    let task = op
        .post_ok(
            "/threads/chat/messages",
            json!({"text": "four", "agent": "records", "return_immediately": true}),
        )
        .await;
    let task_id = task["id"].as_str().unwrap();
    let rest = op
        .events(ALICE, &format!("/tasks/{task_id}/events"), None)
        .await
        .rest()
        .await;
    assert_eq!(final_state(&rest), "completed");

    let compacted = op
        .post_ok(
            "/threads/chat/compact",
            json!({"strategy": "recent", "max_messages": 2}),
        )
        .await;
    assert!(
        compacted["removed_messages"].as_u64().unwrap() > 0,
        "{compacted}"
    );
    assert!(compacted["after_messages"].as_u64() < compacted["before_messages"].as_u64());
    // Without a body: the defaults, over a history already within them.
    let (status, again) = op.post(Some(ALICE), "/threads/chat/compact", None).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["removed_messages"], 0, "{again}");
    op.stop().await;
}

#[tokio::test]
async fn a_thread_stream_follows_every_task_and_resumes_by_position() {
    let op = Operator::start().await;
    op.send("watched", "first").await;
    let path = "/threads/watched/events";
    let mut stream = op.events(ALICE, path, None).await;
    // The first task's whole log, from the store.
    let mut first = Vec::new();
    loop {
        let event = stream.next().await.unwrap();
        let done = event.data["event"]["status"]["state"] == "completed";
        first.push(event);
        if done {
            break;
        }
    }
    let position = first.last().unwrap().id.clone().unwrap();
    // A second task, seen live on the open stream.
    let second = op.send("watched", "second").await;
    let live = stream.take(1).await;
    assert_eq!(live[0].data["task_id"], second["id"]);
    assert_eq!(live[0].data["seq"], 1);
    drop(stream);

    // Resuming at the end of the first task's log: the second task's events only, from 1.
    let mut resumed = op.events(ALICE, path, Some(&position)).await;
    let mut seen = Vec::new();
    loop {
        let event = resumed.next().await.unwrap();
        assert_eq!(event.data["task_id"], second["id"], "{event:?}");
        let done = event.data["event"]["status"]["state"] == "completed";
        seen.push(event.data["seq"].as_u64().unwrap());
        if done {
            break;
        }
    }
    assert_eq!(seen, (1..=seen.len() as u64).collect::<Vec<_>>());
    // The stream never ends by itself; stopping the server ends it.
    op.stop().await;
    assert!(resumed.next().await.is_none());
}
