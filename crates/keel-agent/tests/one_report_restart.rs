//! One run, one report across a real restart (issue 36): a run paused for an approval in one
//! process, whose store is a SQLite file, and approved in the next process on the same file,
//! keeps one event sequence and one stored report with both model calls and the approval.

use std::path::Path;
use std::sync::Arc;

use keel_llm::MockLlm;
use keel_runtime::Runtime;
use keel_store_sqlite::SqliteStore;

mod one_report_fixture {
    include!("rules/one_report_fixture.rs");
}

/// A process's runtime on the SQLite file at `path`.
fn open(path: &Path) -> Arc<dyn Runtime> {
    let store = SqliteStore::open(path).expect("open SQLite");
    Arc::new(store.services(Arc::new(MockLlm::new())))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_across_a_restart_on_sqlite_keeps_one_report_with_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    one_report_fixture::one_report_across_a_restart(open(&path), || open(&path)).await;
}
