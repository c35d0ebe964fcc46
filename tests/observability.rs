//! What `keel serve` tells its operator (docs/observability.md): `/metrics` scraped and
//! parsed as Prometheus does, its counters moved by exactly what a run did, and log lines that
//! are JSON objects carrying each request's fields.

mod support;

use std::process::Command;
use std::sync::Arc;

use keel_runtime::testing::eventually;
use prometheus_parse::{Scrape, Value};
use serde_json::json;
use support::KeelServer;

/// The demo agent's offline model calls `word_count` for this message, then answers.
const TOOL_MESSAGE: &str = r#"/word_count {"text": "one two three"}"#;

/// Send `text` to the server and return the finished task's id.
async fn run_task(url: &str, text: &str) -> String {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": text}]}}
    });
    let answer = support::post_rpc(url, &body).await;
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
    answer["result"]["task"]["id"].as_str().unwrap().to_owned()
}

/// GET `/metrics`, parsed by a Prometheus text parser.
async fn scrape(url: &str) -> Scrape {
    let response = reqwest::get(format!("{url}metrics")).await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap()
}

/// The sum of the samples of `name` whose labels include `labels` (0 when there is none).
fn total(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(_) | Value::Summary(_) => panic!("{name} is not a number"),
        })
        .sum()
}

#[tokio::test]
async fn metrics_move_by_exactly_what_a_run_with_a_tool_call_did() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let server = KeelServer::start_with(&["--store", &store, "--metrics"]);
    let before = scrape(&server.url).await;
    assert_eq!(total(&before, "keel_runs_started_total", &[]), 0.0);

    let task_id = run_task(&server.url, TOOL_MESSAGE).await;
    let after = scrape(&server.url).await;

    // What the run did, from its own report.
    let report = support::run_report(&store, &task_id);
    let events = report["events"].as_array().unwrap();
    let of = |kind: &'static str| events.iter().filter(move |e| e["type"] == kind);
    let model_calls = of("llm.call.completed").count() as f64;
    let tokens = |field: &str| -> f64 {
        of("llm.call.completed")
            .map(|e| e["payload"][field].as_u64().unwrap() as f64)
            .sum()
    };
    let tool_calls = of("action.completed").count() as f64;
    assert_eq!((model_calls, tool_calls), (2.0, 1.0), "{report}");
    assert!(tokens("input_tokens") > 0.0 && tokens("output_tokens") > 0.0);

    let agent = [("agent", "keel-demo")];
    assert_eq!(total(&after, "keel_runs_started_total", &agent), 1.0);
    assert_eq!(
        total(
            &after,
            "keel_runs_ended_total",
            &[("agent", "keel-demo"), ("outcome", "completed")]
        ),
        1.0
    );
    assert_eq!(total(&after, "keel_steps_total", &agent), 2.0);
    let mock = [("provider", "mock"), ("model", "mock")];
    assert_eq!(total(&after, "keel_model_calls_total", &mock), model_calls);
    for (direction, field) in [("input", "input_tokens"), ("output", "output_tokens")] {
        let labels = [
            ("provider", "mock"),
            ("model", "mock"),
            ("direction", direction),
        ];
        assert_eq!(
            total(&after, "keel_model_tokens_total", &labels),
            tokens(field),
            "{direction} tokens"
        );
    }
    assert_eq!(
        total(
            &after,
            "keel_tool_calls_total",
            &[("tool", "word_count"), ("outcome", "completed")]
        ),
        tool_calls
    );
    assert_eq!(
        total(
            &after,
            "keel_policy_decisions_total",
            &[("decision", "allow")]
        ),
        1.0
    );
    assert_eq!(total(&after, "keel_approvals_waiting", &[]), 0.0);
    // The store's own work for the run: its writes shared commits, its reads transactions.
    let moved = |name: &str| total(&after, name, &[]) - total(&before, name, &[]);
    for (each, shared) in [
        ("keel_sqlite_writes_total", "keel_sqlite_commits_total"),
        (
            "keel_sqlite_reads_total",
            "keel_sqlite_read_transactions_total",
        ),
    ] {
        let (many, batches) = (moved(each), moved(shared));
        assert!(
            batches >= 1.0 && many >= batches,
            "{each} {many} in {shared} {batches}"
        );
    }
    // Histograms count every call they time.
    let counted = |name: &str, labels: &[(&str, &str)]| -> u64 {
        after
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                Value::Histogram(buckets) => buckets.last().unwrap().count as u64,
                _ => panic!("{name} is not a histogram"),
            })
            .sum()
    };
    assert_eq!(counted("keel_model_call_duration_seconds", &mock), 2);
    assert_eq!(
        counted("keel_tool_call_duration_seconds", &[("tool", "word_count")]),
        1
    );
    // The HTTP layer: the first scrape and the SendMessage, by route and status.
    assert_eq!(
        total(
            &after,
            "keel_http_requests_total",
            &[("method", "POST"), ("route", "/"), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &after,
            "keel_http_requests_total",
            &[("method", "GET"), ("route", "/metrics"), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(
        counted(
            "keel_http_request_duration_seconds",
            &[("method", "POST"), ("route", "/")]
        ),
        1
    );
}

#[tokio::test]
async fn metrics_are_off_unless_asked_and_answer_only_the_token_when_one_is_set() {
    let plain = KeelServer::start(&[]);
    let response = reqwest::get(format!("{}metrics", plain.url)).await.unwrap();
    assert_eq!(response.status(), 404);

    let guarded = KeelServer::start_with_env(
        &["--store", "memory", "--metrics"],
        &[("KEEL_METRICS_TOKEN", "scrape-secret")],
    );
    let client = reqwest::Client::new();
    let url = format!("{}metrics", guarded.url);
    let refused = client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    let wrong = client
        .get(&url)
        .bearer_auth("scrape-secreT")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let answered = client
        .get(&url)
        .bearer_auth("scrape-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    assert!(answered
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
}

#[tokio::test]
async fn json_logs_carry_each_request_and_the_runs_milestones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.log");
    let logs = std::fs::File::create(&path).unwrap();
    let server = KeelServer::start_logging(
        0,
        &["--store", "memory", "--log-format", "json"],
        &[("RUST_LOG", "info")],
        logs,
    );
    let task_id = run_task(&server.url, TOOL_MESSAGE).await;
    let status = reqwest::Client::new()
        .get(format!("{}tasks/{task_id}", server.url))
        .header("A2A-Version", "1.0")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);

    let lines: Vec<serde_json::Value> = eventually("the GetTask request's log line", || {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect();
        let done = lines
            .iter()
            .any(|l| l["message"] == "request" && l["method"] == "GET");
        async move { done.then_some(lines) }
    })
    .await;
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("no `{message}` line in {lines:?}"))
    };
    let send = lines
        .iter()
        .find(|l| l["message"] == "request" && l["method"] == "POST")
        .unwrap();
    assert_eq!(send["target"], "keel::http");
    assert_eq!(send["level"], "INFO");
    assert_eq!(send["route"], "/");
    assert_eq!(send["path"], "/");
    assert_eq!(send["status"], 200);
    assert_eq!(send["operation"], "SendMessage");
    assert_eq!(send["tenant"], "default-app/default-user");
    assert!(send["duration_ms"].as_f64().unwrap() > 0.0, "{send}");
    let get = lines
        .iter()
        .find(|l| l["message"] == "request" && l["method"] == "GET")
        .unwrap();
    assert_eq!(get["route"], "/tasks/{id}");
    assert_eq!(get["path"], format!("/tasks/{task_id}"));
    assert_eq!(get["task_id"], task_id.as_str());
    assert_eq!(get["status"], 200);

    // One line per run at `info`, when it stops: its start is a `debug` line.
    let of_run: Vec<_> = lines
        .iter()
        .filter(|l| l["target"] == "keel::run" && l["task_id"] == task_id.as_str())
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    assert_eq!(of_run, ["tool call", "run ended"]);
    let tool = find("tool call");
    assert_eq!(
        (&tool["tool"], &tool["outcome"], &tool["task_id"]),
        (&json!("word_count"), &json!("completed"), &json!(task_id))
    );
    let ended = find("run ended");
    assert_eq!(
        (&ended["state"], &ended["task_id"], &ended["agent"]),
        (&json!("completed"), &json!(task_id), &json!("keel-demo"))
    );
    // The tool call's step and the answer's.
    assert_eq!(ended["steps"], 2, "{ended}");
    assert!(ended["duration_ms"].is_u64(), "{ended}");
    assert!(ended["run_id"].is_string(), "{ended}");
}

/// Issue 43, item 12: in the default text format each request and each run is one line of
/// `key=value` fields an operator can grep.
#[tokio::test]
async fn text_logs_give_a_line_per_request_and_per_run_as_key_value_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.log");
    let logs = std::fs::File::create(&path).unwrap();
    let server =
        KeelServer::start_logging(0, &["--store", "memory"], &[("RUST_LOG", "info")], logs);
    let task_id = run_task(&server.url, TOOL_MESSAGE).await;
    let text = eventually("the run's and the request's log lines", || {
        let text = std::fs::read_to_string(&path).unwrap();
        let done = text.contains(" run ended ") && text.contains("request method=POST");
        async move { done.then_some(text) }
    })
    .await;
    let line = |needle: &str| {
        text.lines()
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line with `{needle}` in:\n{text}"))
            .to_owned()
    };
    let request = line("request method=POST");
    assert!(request.contains(" INFO keel::http: "), "{request}");
    assert!(
        request.contains("request method=POST path=/ route=/ status=200 duration_ms="),
        "{request}"
    );
    let ended = line(" run ended ");
    assert!(ended.contains(" INFO "), "{ended}");
    for field in [
        format!("task_id=\"{task_id}\""),
        "agent=keel-demo".to_owned(),
        "state=\"completed\"".to_owned(),
        "steps=2".to_owned(),
        "duration_ms=".to_owned(),
        "run_id=".to_owned(),
    ] {
        assert!(ended.contains(&field), "`{field}` not in {ended}");
    }
}

#[tokio::test]
async fn a_keel_toml_turns_metrics_and_json_logs_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keel.toml");
    std::fs::write(
        &config,
        "[server]\nstore = \"memory\"\nmetrics = true\nlog_format = \"json\"\n\n\
         [[agents]]\nname = \"echo\"\ndescription = \"Echoes.\"\n",
    )
    .unwrap();
    let path = dir.path().join("serve.log");
    let logs = std::fs::File::create(&path).unwrap();
    let server = KeelServer::start_logging(
        0,
        &["--config", config.to_str().unwrap()],
        &[("RUST_LOG", "info")],
        logs,
    );
    // `/metrics` is served at the root (the URL printed), beside the agents.
    let scraped = scrape(&server.url).await;
    assert_eq!(total(&scraped, "keel_runs_started_total", &[]), 0.0);
    let line: serde_json::Value = eventually("the scrape's JSON log line", || {
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|l| l["message"] == "request" && l["route"] == "/metrics");
        async move { line }
    })
    .await;
    assert_eq!(
        (&line["method"], &line["status"]),
        (&json!("GET"), &json!(200))
    );
}

#[tokio::test]
async fn a_priced_model_s_cost_is_in_the_report_and_the_metrics_and_tenant_labels_are_opt_in() {
    // A tool that answers only when the test lets it: a stream of its task stays open.
    // Beside it, webhooks that take push notifications (`/hook`) or refuse them (`/broken`).
    let release = Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    let hooks = Arc::new(std::sync::Mutex::new(Vec::<&'static str>::new()));
    let (took, refused) = (hooks.clone(), hooks.clone());
    let tool = support::serve(
        axum::Router::new()
            .route(
                "/slow",
                axum::routing::post(move || {
                    let held = held.clone();
                    async move {
                        held.notified().await;
                        axum::Json(json!({"done": true}))
                    }
                }),
            )
            .route(
                "/hook",
                axum::routing::post(move || {
                    took.lock().unwrap().push("delivered");
                    async { "ok" }
                }),
            )
            .route(
                "/broken",
                axum::routing::post(move || {
                    refused.lock().unwrap().push("failed");
                    async { (axum::http::StatusCode::BAD_REQUEST, "no") }
                }),
            ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let config = dir.path().join("keel.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nstore = \"{store}\"\nmetrics = true\nmetrics_tenant_labels = true\n\
             [server.push]\nallow_private_targets = true\n\n\
             [prices.mock]\ninput = 2.5\noutput = 10.0\n\n\
             [[agents]]\nname = \"priced\"\ndescription = \"Costs.\"\n\n\
             [[agents.tools.http]]\nname = \"slow\"\ndescription = \"Slow.\"\nurl = \"{tool}/slow\"\n"
        ),
    )
    .unwrap();
    // One thread at a time: a second thread waits for the slot the slow one holds.
    let server =
        KeelServer::start_with(&["--config", config.to_str().unwrap(), "--max-threads", "1"]);
    let tenant = ("tenant", "default-app/default-user");

    // A run that answers: its calls' costs add up to the report's and to the counter.
    let task_id = run_task(&server.url, "hello").await;
    let report = support::run_report(&store, &task_id);
    let events = report["events"].as_array().unwrap();
    let cost: u64 = events
        .iter()
        .filter(|e| e["type"] == "llm.call.completed")
        .map(|e| {
            e["payload"]["cost_micros"]
                .as_u64()
                .expect("a priced call's cost")
        })
        .sum();
    assert!(cost > 0, "{report}");
    assert_eq!(report["model"]["cost_micros"].as_u64(), Some(cost));
    assert_eq!(
        report["budget"]["usage"]["cost_micros"].as_u64(),
        Some(cost)
    );
    let after = scrape(&server.url).await;
    let mock = [("provider", "mock"), ("model", "mock"), tenant];
    assert_eq!(
        total(&after, "keel_model_cost_micros_total", &mock),
        cost as f64
    );
    assert_eq!(
        total(
            &after,
            "keel_task_states_total",
            &[("state", "completed"), tenant]
        ),
        1.0
    );
    // The HTTP metrics never carry the tenant.
    assert!(after
        .samples
        .iter()
        .filter(|s| s.metric == "keel_http_requests_total")
        .all(|s| s.labels.get("tenant").is_none()));

    // A streamed send is an open subscriber until its stream ends.
    let body = json!({
        "jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage",
        "params": {"message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "/slow {}"}]}}
    });
    let stream = reqwest::Client::new()
        .post(&server.url)
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let open = |n: f64| {
        let url = server.url.clone();
        async move {
            let scraped = scrape(&url).await;
            (total(&scraped, "keel_sse_subscribers", &[]) == n).then_some(())
        }
    };
    eventually("one open subscriber", || open(1.0)).await;
    let queued = |n: f64| {
        let url = server.url.clone();
        async move {
            let scraped = scrape(&url).await;
            (total(&scraped, "keel_queue_depth", &[tenant]) == n).then_some(())
        }
    };
    // Two more tasks, each asking for push notifications, wait behind the slow one.
    let sends: Vec<_> = ["hook", "broken"]
        .into_iter()
        .map(|path| {
            let (url, webhook) = (server.url.clone(), format!("{tool}/{path}"));
            tokio::spawn(async move {
                let body = json!({
                    "jsonrpc": "2.0", "id": 3, "method": "SendMessage",
                    "params": {
                        "message": {"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": "hello"}]},
                        "configuration": {"taskPushNotificationConfig": {"url": webhook}}
                    }
                });
                support::post_rpc(&url, &body).await
            })
        })
        .collect();
    eventually("two threads waiting for the slot", || queued(2.0)).await;
    release.notify_one();
    let streamed = stream.text().await.unwrap();
    assert!(streamed.contains("TASK_STATE_COMPLETED"), "{streamed}");
    eventually("no open subscriber", || open(0.0)).await;
    for send in sends {
        let answer = send.await.unwrap();
        assert_eq!(
            answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
            "{answer}"
        );
    }
    eventually("no thread waiting", || queued(0.0)).await;

    // Every push notification counted by how it ended, as the webhooks saw them.
    let pushed = |outcome: &'static str| {
        let (url, hooks) = (server.url.clone(), hooks.clone());
        async move {
            let seen = hooks
                .lock()
                .unwrap()
                .iter()
                .filter(|o| **o == outcome)
                .count();
            let scraped = scrape(&url).await;
            let counted = total(
                &scraped,
                "keel_push_deliveries_total",
                &[("outcome", outcome)],
            );
            (seen > 0 && counted == seen as f64).then_some(())
        }
    };
    eventually("delivered pushes counted", || pushed("delivered")).await;
    eventually("failed pushes counted", || pushed("failed")).await;
}

/// Stop or continue a process (`-STOP`, `-CONT`).
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// Wait until `name` (all its series summed) reads `n` at `url`'s `/metrics`.
async fn reads(url: &str, name: &'static str, n: f64) {
    eventually(name, || {
        let url = url.to_owned();
        async move { (total(&scrape(&url).await, name, &[]) == n).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_process_loses_its_lease_and_the_other_counts_the_takeover() {
    let prefix = format!("keel-test-{}:", support::uuid_like());
    let redis = support::redis_url();
    let args = [
        "--store",
        redis.as_str(),
        "--redis-prefix",
        prefix.as_str(),
        "--lease-ttl",
        "1",
        "--metrics",
    ];
    let a = KeelServer::start_with(&args);
    let b = KeelServer::start_with(&args);
    let rpc_a = support::Rpc::new(&a);
    let task = rpc_a.send(r#"/sleep {"seconds": 300}"#, None, true).await;
    let id = task["id"].as_str().unwrap().to_owned();
    rpc_a
        .wait_for(&id, std::time::Duration::from_secs(10), |s| {
            s == "TASK_STATE_WORKING"
        })
        .await;
    assert_eq!(
        total(&scrape(&b.url).await, "keel_takeovers_total", &[]),
        0.0
    );
    // A stalls past its lease: B takes the thread over; A, woken, finds its lease gone.
    signal(a.pid(), "-STOP");
    reads(&b.url, "keel_takeovers_total", 1.0).await;
    signal(a.pid(), "-CONT");
    reads(&a.url, "keel_lease_losses_total", 1.0).await;
    a.kill_hard();
}
