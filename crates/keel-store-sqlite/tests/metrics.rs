//! The SQLite store's counters in the process's `metrics` recorder (`keel serve --metrics`):
//! writes, commits, reads and read transactions, each equal to what [`SqliteStore::stats`]
//! says. A test binary of its own, since the recorder is the process's one.

use std::sync::Arc;

use keel_core::{Message, Task, TaskEvent};
use keel_runtime::{AuthContext, TaskManager};
use keel_store_sqlite::{
    SqliteStore, COMMITS_METRIC, READS_METRIC, READ_TRANSACTIONS_METRIC, WRITES_METRIC,
};
use metrics_exporter_prometheus::PrometheusBuilder;

/// The value of the unlabelled counter `name` in Prometheus's text, 0 when it is absent.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map(|value| value.trim().parse::<u64>().expect("a whole number"))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_recorder_counts_the_writes_commits_and_reads_the_store_counts() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("keel.db")).unwrap());
    let auth = AuthContext::new("acme", "alice");
    // Writes and reads at once from many tasks, so that batches of several form.
    let work: Vec<_> = (0..32)
        .map(|i| {
            let (store, auth) = (store.clone(), auth.clone());
            tokio::spawn(async move {
                let task = Task::create(Message::user(format!("q{i}")));
                let event = TaskEvent::Message {
                    message: Message::agent("a"),
                };
                store
                    .save_task_with_events(&auth, &task, &[event])
                    .await
                    .unwrap();
                assert!(store.get_task(&auth, &task.id).await.unwrap().is_some());
            })
        })
        .collect();
    for work in work {
        work.await.unwrap();
    }

    let stats = store.stats();
    let text = handle.render();
    assert!(
        stats.writes_finished >= 32 && stats.reads_submitted >= 32,
        "{stats:?}"
    );
    assert_eq!(
        counter(&text, WRITES_METRIC),
        stats.writes_finished,
        "{text}"
    );
    assert_eq!(counter(&text, COMMITS_METRIC), stats.commits, "{text}");
    assert_eq!(
        counter(&text, READS_METRIC),
        stats.reads_submitted,
        "{text}"
    );
    assert_eq!(
        counter(&text, READ_TRANSACTIONS_METRIC),
        stats.read_batches,
        "{text}"
    );
}
