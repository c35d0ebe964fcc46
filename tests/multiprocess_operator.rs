//! Two `keel serve` processes on one Redis: a task runs on one, and the operator API's event
//! stream of it is read from the other, which does not run it: the log first, then live
//! events, resumed with `Last-Event-ID` with no gap and no duplicate, to the task's end.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{redis_url, uuid_like, KeelServer};

/// One SSE event of the operator API: its `id:` and its `data:`.
struct Event {
    id: String,
    data: Value,
}

/// The complete events in `buffer`, removing them from it (keep-alive comments skipped).
fn take_events(buffer: &mut String) -> Vec<Event> {
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let field = |name: &str| {
            block
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|v| v.trim_start().to_owned())
        };
        if let (Some(id), Some(data)) = (field("id:"), field("data:")) {
            let data = serde_json::from_str(&data).expect("SSE data is JSON");
            events.push(Event { id, data });
        }
    }
    events
}

/// Open `url`'s event stream (after `last_event_id`) and read events until `enough` says so
/// or the stream ends.
async fn read_events(
    url: &str,
    last_event_id: Option<&str>,
    enough: impl Fn(&[Event]) -> bool,
) -> Vec<Event> {
    let mut request = reqwest::Client::new().get(url);
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id);
    }
    let mut response = request.send().await.unwrap();
    assert_eq!(response.status(), 200, "{response:?}");
    let mut buffer = String::new();
    let mut events = Vec::new();
    let read = async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            events.extend(take_events(&mut buffer));
            if enough(&events) {
                break;
            }
        }
    };
    // A guard against a hang, not a timing assertion.
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the events arrive");
    events
}

fn state_of(event: &Event) -> Option<&str> {
    event.data["event"]["status"]["state"].as_str()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_running_on_one_replica_streams_its_events_from_the_other() {
    let prefix = format!("keel-test-{}:", uuid_like());
    let url = redis_url();
    let args = ["--store", url.as_str(), "--redis-prefix", prefix.as_str()];
    let (runner, watcher) = (KeelServer::start_with(&args), KeelServer::start_with(&args));
    let http = reqwest::Client::new();

    // The task is sent to, and runs on, `runner`.
    let task = support::post_rpc(
        &format!("{}api/v1/threads/shared/messages", runner.url),
        &json!({"text": r#"/sleep {"seconds": 300}"#, "return_immediately": true}),
    )
    .await;
    let id = task["id"].as_str().expect("a task").to_owned();
    let events_url = format!("{}api/v1/tasks/{id}/events", watcher.url);

    // On `watcher`: the log up to the working status.
    let first = read_events(&events_url, None, |events| {
        events.iter().any(|e| state_of(e) == Some("working"))
    })
    .await;
    let last_id = first.last().unwrap().id.clone();
    assert_eq!(last_id, first.len().to_string());

    // Cancel through `watcher`, then resume there after the last event read.
    let canceled = http
        .post(format!("{}api/v1/tasks/{id}/cancel", watcher.url))
        .json(&json!({"reason": "from the other replica"}))
        .send()
        .await
        .unwrap();
    assert_eq!(canceled.status(), 200);
    let rest = read_events(&events_url, Some(&last_id), |_| false).await;
    let seqs: Vec<u64> = first
        .iter()
        .chain(&rest)
        .map(|e| e.data["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "no gap, no repeat"
    );
    assert_eq!(state_of(rest.last().unwrap()), Some("canceled"));
    assert_eq!(
        rest.iter()
            .filter(|e| state_of(e) == Some("canceled"))
            .count(),
        1
    );

    // The thread's stream on `runner` holds the same events.
    let thread = read_events(
        &format!("{}api/v1/threads/shared/events", runner.url),
        None,
        |events| events.iter().any(|e| state_of(e) == Some("canceled")),
    )
    .await;
    assert_eq!(thread.len(), seqs.len());
}
