//! Conformance checks of [`RunStore`]: lookup by each index, time windows, and text search
//! over the stored JSON.

use chrono::Utc;
use keel_core::{AgentError, RunContext, RunId, Task, TaskState, ThreadId, TraceId};
use serde_json::{json, Value};

use super::{fresh_tenant, fresh_thread, tenant_and_thread};
use crate::{AuthContext, RunQuery, RunRecord, RunStore, TaskRecord};

/// The task records `query` finds for `auth`.
async fn task_records(runs: &dyn RunStore, auth: &AuthContext, query: RunQuery) -> Vec<TaskRecord> {
    runs.find_task_records(auth, &query).await.unwrap()
}

/// The query for `thread`'s records whose stored JSON contains `needle`.
fn containing(thread: &ThreadId, needle: &str) -> RunQuery {
    RunQuery {
        thread_id: Some(thread.clone()),
        contains: Some(needle.to_owned()),
        ..Default::default()
    }
}

/// A run report of `task` on its thread, by `agent`, recorded at `recorded_at`, with no trace:
/// the record a store's own tests save beside the conformance suite's.
pub fn report_of(
    task: &Task,
    agent: Option<&str>,
    recorded_at: chrono::DateTime<Utc>,
    report: Value,
) -> RunRecord {
    RunRecord {
        run_id: RunId::new(),
        task_id: Some(task.id.clone()),
        thread_id: Some(task.thread_id.clone()),
        trace_id: None,
        agent_name: agent.map(str::to_owned),
        recorded_at,
        report,
    }
}

/// Records are found by each index, by time range and by text; newest first; reports upsert.
pub async fn run_store_index_and_search(runs: &dyn RunStore) {
    let (auth, thread) = tenant_and_thread();
    let trace = TraceId::new();
    let mut task = Task::new(thread.clone());
    let ctx = RunContext {
        trace_id: trace.clone(),
        ..RunContext::new()
    };
    ctx.attach_to_task(&mut task).unwrap();
    let before = Utc::now() - chrono::Duration::seconds(1);
    runs.save_task_record(&auth, &TaskRecord::of(&task, Some("alpha")).unwrap())
        .await
        .unwrap();
    task.complete("the answer is 42").unwrap();
    runs.save_task_record(&auth, &TaskRecord::of(&task, Some("alpha")).unwrap())
        .await
        .unwrap();
    runs.save_task_record(
        &auth,
        &TaskRecord::of(&Task::new(fresh_thread()), Some("beta")).unwrap(),
    )
    .await
    .unwrap();

    let by_task = task_records(
        runs,
        &auth,
        RunQuery {
            task_id: Some(task.id.clone()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(by_task.len(), 2, "every snapshot is kept");
    assert_eq!(by_task[0].state, TaskState::Completed, "newest first");
    let cases = [
        (
            RunQuery {
                run_id: Some(ctx.run_id.clone()),
                ..Default::default()
            },
            2,
            "by run",
        ),
        (
            RunQuery {
                thread_id: Some(thread.clone()),
                ..Default::default()
            },
            2,
            "by thread",
        ),
        (
            RunQuery {
                trace_id: Some(trace.clone()),
                ..Default::default()
            },
            2,
            "by trace",
        ),
        (
            RunQuery {
                agent_name: Some("alpha".into()),
                ..Default::default()
            },
            2,
            "by agent",
        ),
        (
            RunQuery {
                contains: Some("the answer is 42".into()),
                ..Default::default()
            },
            1,
            "text search",
        ),
        (
            RunQuery {
                since: Some(before),
                until: Some(Utc::now() + chrono::Duration::seconds(1)),
                ..Default::default()
            },
            3,
            "time window",
        ),
        (
            RunQuery {
                since: Some(Utc::now() + chrono::Duration::hours(1)),
                ..Default::default()
            },
            0,
            "nothing is recorded in the future",
        ),
        (
            RunQuery {
                limit: Some(1),
                ..Default::default()
            },
            1,
            "limit",
        ),
    ];
    for (query, expected, rule) in cases {
        let found = task_records(runs, &auth, query.clone()).await;
        assert_eq!(found.len(), expected, "{rule}: {query:?}");
    }
    assert!(matches!(
        runs.find_task_records(
            &auth,
            &RunQuery {
                limit: Some(0),
                ..Default::default()
            }
        )
        .await,
        Err(AgentError::InvalidInput { .. })
    ));
    assert!(
        runs.find_task_records(&fresh_tenant(), &RunQuery::default())
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );

    let mut record = RunRecord {
        trace_id: Some(trace.clone()),
        ..report_of(
            &task,
            Some("alpha"),
            Utc::now(),
            json!({"events": 3, "final": "completed"}),
        )
    };
    let run_id = record.run_id.clone();
    assert_eq!(
        runs.get_run_report(&auth, &run_id).await.unwrap(),
        None,
        "unknown run is None"
    );
    runs.save_run_report(&auth, &record).await.unwrap();
    record.report = json!({"events": 4, "final": "completed", "note": "replaced"});
    runs.save_run_report(&auth, &record).await.unwrap();
    let stored = runs.get_run_report(&auth, &run_id).await.unwrap().unwrap();
    assert_eq!(stored.report, record.report, "save_run_report replaces");
    // The same through the text form the engine writes.
    let text = json!({"events": 5, "final": "completed", "note": "as text"});
    let json_text = keel_core::stored::JsonText::of(&text).unwrap();
    runs.save_run_report_json(&auth, record.clone(), json_text)
        .await
        .unwrap();
    let stored = runs.get_run_report(&auth, &run_id).await.unwrap().unwrap();
    assert_eq!(stored.report, text, "save_run_report_json replaces too");
    runs.save_run_report(&auth, &record).await.unwrap();
    for (query, rule) in [
        (
            RunQuery {
                trace_id: Some(trace),
                ..Default::default()
            },
            "report by trace",
        ),
        (
            RunQuery {
                contains: Some("replaced".into()),
                ..Default::default()
            },
            "report text search",
        ),
    ] {
        let found = runs.find_run_reports(&auth, &query).await.unwrap();
        assert_eq!(found.len(), 1, "{rule}");
    }
    assert_eq!(
        runs.get_run_report(&fresh_tenant(), &run_id).await.unwrap(),
        None,
        "tenant isolation"
    );
}

/// `since` is inclusive and `until` exclusive: a record at exactly `until` is not found, one at
/// exactly `since` is, so adjacent windows never share a record. Checked for task records and
/// run reports.
pub async fn run_store_time_window_is_half_open(runs: &dyn RunStore) {
    let (auth, thread) = tenant_and_thread();
    let t0 = Utc::now();
    let t1 = t0 + chrono::Duration::milliseconds(1);
    let nanosecond = chrono::Duration::nanoseconds(1);
    let mut task = Task::new(thread.clone());
    for (at, text) in [(t0, "first"), (t1, "second")] {
        let mut record = TaskRecord::of(&task, None).unwrap();
        record.recorded_at = at;
        record.task.metadata.insert("which".into(), json!(text));
        runs.save_task_record(&auth, &record).await.unwrap();
        let report = report_of(&task, None, at, json!({"which": text}));
        runs.save_run_report(&auth, &report).await.unwrap();
    }
    task.metadata.clear();

    let window = |since, until| RunQuery {
        thread_id: Some(thread.clone()),
        since,
        until,
        ..Default::default()
    };
    let cases = [
        (window(None, Some(t0)), vec![], "until is exclusive"),
        (
            window(None, Some(t0 + nanosecond)),
            vec!["first"],
            "one nanosecond later includes it",
        ),
        (
            window(Some(t0), Some(t1)),
            vec!["first"],
            "[t0, t1) holds only the first",
        ),
        (
            window(Some(t1), Some(t1 + nanosecond)),
            vec!["second"],
            "since is inclusive",
        ),
        (
            window(Some(t0), None),
            vec!["second", "first"],
            "open-ended, newest first",
        ),
    ];
    for (query, expected, rule) in cases {
        let found: Vec<Value> = runs
            .find_task_records(&auth, &query)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.task.metadata["which"].clone())
            .collect();
        assert_eq!(found, expected, "task records: {rule}");
        let found: Vec<Value> = runs
            .find_run_reports(&auth, &query)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.report["which"].clone())
            .collect();
        assert_eq!(found, expected, "run reports: {rule}");
    }
}

/// `contains` is a case-sensitive substring of the record's stored JSON, the same text on
/// every backend (see [`RunQuery`]): compact, keys sorted, strings JSON-escaped, non-ASCII as
/// is, `%` and `_` literal, the envelope included.
pub async fn run_store_contains_searches_the_stored_json(runs: &dyn RunStore) {
    let (auth, thread) = tenant_and_thread();
    let notes = [
        "Grüße: 50%_off, say \"hi\" C:\\tmp",
        "grüße: 50 percent off",
    ];
    for note in notes {
        let mut task = Task::new(thread.clone());
        task.metadata.insert("note".into(), json!(note));
        runs.save_task_record(&auth, &TaskRecord::of(&task, Some("gamma")).unwrap())
            .await
            .unwrap();
        let report = report_of(
            &task,
            Some("gamma"),
            Utc::now(),
            json!({"note": note, "zeta": 1, "alpha": 2}),
        );
        runs.save_run_report(&auth, &report).await.unwrap();
    }
    let envelope = format!("\"format\":{}", keel_core::stored::FORMAT_VERSION);
    let cases: [(&str, usize, &str); 12] = [
        ("Grüße", 1, "case-sensitive, non-ASCII matched as is"),
        ("grüße", 1, "case-sensitive"),
        ("GRÜSSE", 0, "no case folding"),
        ("50%_off", 1, "% and _ are literal"),
        ("5_%", 0, "% and _ are not patterns"),
        ("50%", 1, "% is literal"),
        (r#"say \"hi\""#, 1, "quotes are matched JSON-escaped"),
        (
            r#"say "hi""#,
            0,
            "unescaped quotes are not in the JSON text",
        ),
        (r"C:\\tmp", 1, "backslashes are matched JSON-escaped"),
        (
            r#""agent_name":"gamma","recorded_at""#,
            2,
            "compact JSON with keys in sorted order",
        ),
        (&envelope, 2, "the stored envelope is part of the text"),
        ("no such text", 0, "absent text"),
    ];
    for (needle, expected, rule) in cases {
        let query = containing(&thread, needle);
        assert_eq!(
            runs.find_task_records(&auth, &query).await.unwrap().len(),
            expected,
            "task records containing {needle:?}: {rule}"
        );
    }
    for (needle, expected, rule) in [
        ("Grüße", 1, "non-ASCII matched as is"),
        (r#""alpha":2,"note""#, 2, "report keys in sorted order"),
        (r#""zeta":1,"alpha""#, 0, "not in insertion order"),
        (
            envelope.as_str(),
            2,
            "the stored envelope is part of the text",
        ),
    ] {
        let query = containing(&thread, needle);
        assert_eq!(
            runs.find_run_reports(&auth, &query).await.unwrap().len(),
            expected,
            "run reports containing {needle:?}: {rule}"
        );
    }
}
