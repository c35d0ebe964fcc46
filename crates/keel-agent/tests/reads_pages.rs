//! The engine's paged lists that no store indexes as such: run records paged by a token that
//! neither repeats nor skips a record when several share a timestamp, and threads listed once
//! each at their first task, on a real SQLite file and in memory.

use std::sync::Arc;

use chrono::{TimeZone, Utc};
use keel_agent::reads::{Reads, RunPageQuery};
use keel_core::{AgentError, RunId, Task, TaskId, ThreadId};
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, RunRecord, Runtime, Services};
use serde_json::json;

fn runtimes(dir: &std::path::Path) -> Vec<(&'static str, Arc<dyn Runtime>)> {
    let store = keel_store_sqlite::SqliteStore::open(dir.join("keel.db")).expect("open SQLite");
    vec![
        (
            "memory",
            Arc::new(Services::in_memory(Arc::new(MockLlm::new()))),
        ),
        ("sqlite", Arc::new(store.services(Arc::new(MockLlm::new())))),
    ]
}

fn record(run: &str, thread: &str, second: u32) -> RunRecord {
    RunRecord {
        run_id: RunId::from(run),
        task_id: Some(TaskId::from(format!("task-{run}"))),
        thread_id: Some(ThreadId::from(thread)),
        trace_id: None,
        agent_name: Some("echo".into()),
        recorded_at: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, second).unwrap(),
        report: json!({"run": run}),
    }
}

/// Every page of `query` at `size`: the run ids in order.
async fn all_runs(reads: &Reads, auth: &AuthContext, mut query: RunPageQuery) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let page = reads.runs_page(auth, &query).await.unwrap();
        assert!(page.items.len() <= query.page_size.unwrap() as usize);
        ids.extend(page.items.iter().map(|r| r.run_id.to_string()));
        match page.next_page_token {
            Some(token) => query.page_token = Some(token),
            None => return ids,
        }
    }
}

#[tokio::test]
async fn runs_sharing_a_timestamp_are_paged_without_repeat_or_skip() {
    let dir = tempfile::tempdir().unwrap();
    for (name, runtime) in runtimes(dir.path()) {
        let auth = AuthContext::new("acme", "alice");
        let store = runtime.run_store();
        // Five runs at one instant between two others; one of another thread.
        let mut records = vec![record("early", "t", 1), record("late", "t", 3)];
        records.extend((0..5).map(|i| record(&format!("tied-{i}"), "t", 2)));
        records.push(record("other", "u", 2));
        for r in &records {
            store.save_run_report(&auth, r).await.unwrap();
        }
        let reads = Reads::new(runtime.clone());
        for size in [1, 2, 3, 100] {
            let query = RunPageQuery {
                thread_id: Some("t".into()),
                page_size: Some(size),
                ..RunPageQuery::default()
            };
            let ids = all_runs(&reads, &auth, query).await;
            assert_eq!(ids.len(), 7, "{name} at {size}: {ids:?}");
            assert_eq!(ids[0], "late", "{name}: newest first");
            assert_eq!(ids[6], "early", "{name}");
            let mut unique = ids.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), 7, "{name} at {size}: a run repeated: {ids:?}");
        }
        let bad = RunPageQuery {
            page_token: Some("not-a-token".into()),
            ..RunPageQuery::default()
        };
        let err = reads.runs_page(&auth, &bad).await.unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "page_token"),
            "{err:?}"
        );
        let zero = RunPageQuery {
            page_size: Some(0),
            ..RunPageQuery::default()
        };
        let err = reads.runs_page(&auth, &zero).await.unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "page_size"),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn threads_are_listed_once_at_their_first_task() {
    let dir = tempfile::tempdir().unwrap();
    for (name, runtime) in runtimes(dir.path()) {
        let auth = AuthContext::new("acme", "alice");
        let tasks = runtime.task_manager();
        // Tasks of threads a, b, a, c, b, a in creation order.
        for (i, thread) in ["a", "b", "a", "c", "b", "a"].iter().enumerate() {
            let task = Task::with_id(TaskId::from(format!("task-{i}")), ThreadId::from(*thread));
            tasks.save_task(&auth, &task).await.unwrap();
        }
        let reads = Reads::new(runtime.clone());
        for size in [1, 2, 50] {
            let mut listed = Vec::new();
            let mut token = None;
            loop {
                let page = reads.threads(&auth, Some(size), token).await.unwrap();
                assert!(page.items.len() <= size as usize);
                listed.extend(
                    page.items
                        .iter()
                        .map(|t| (t.thread_id.to_string(), t.first_task_id.to_string())),
                );
                token = page.next_page_token;
                if token.is_none() {
                    break;
                }
            }
            let expected = [("a", "task-0"), ("b", "task-1"), ("c", "task-3")]
                .map(|(t, f)| (t.to_owned(), f.to_owned()));
            assert_eq!(listed, expected, "{name} at {size}");
        }
        // Another tenant has none of them.
        let bob = AuthContext::new("globex", "bob");
        assert!(reads
            .threads(&bob, None, None)
            .await
            .unwrap()
            .items
            .is_empty());
    }
}
