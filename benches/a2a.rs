//! `cargo xtask bench a2a`: what Keel's A2A server costs per request. SendMessage and GetTask
//! requests/s against an echo agent (the offline `MockLlm`, unscripted) on the in-memory store
//! through `A2aServer` on 127.0.0.1:0, beside a bare axum JSON-RPC handler (it parses the
//! envelope and answers a fixed result) measured in the same run with the same client; the
//! ratio is the figure. Then the process's resident memory (`VmRSS`, server and client share
//! the process) before and after 100,000 sends, which the in-memory store's bounded retention
//! should keep roughly flat. Asserts nothing.
//!
//! Settings: `KEEL_BENCH_SECS` (seconds per figure, default 2), `KEEL_BENCH_CONCURRENCY`
//! (client tasks, default 32), `KEEL_BENCH_SENDS` (sends of the memory figure, default
//! 100000), `KEEL_BENCH_ROWS` (memory rows printed over those sends, default 8: growth that
//! levels off after the stores fill is the allocator settling, steady growth a leak).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use axum::{Json, Router};
use keel_agent::{Agent, AgentExecutor};
use keel_core::AgentCard;
use keel_llm::MockLlm;
use keel_runtime::{InMemoryTaskManager, InMemoryThreadStore, Services};
use keel_transport::A2aServer;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// A request body for the `n`th call of a load.
type Body = Arc<dyn Fn(u64) -> Value + Send + Sync>;

fn env_number(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .unwrap_or(default)
}

/// The process's resident set size in KiB, from `/proc/self/status` (None off Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn send_message(n: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": n,
        "method": "SendMessage",
        "params": {"message": {
            "messageId": format!("bench-{n}"),
            "role": "ROLE_USER",
            "parts": [{"text": "hello, echo"}]
        }}
    })
}

fn get_task(task_id: String) -> Body {
    Arc::new(
        move |n| json!({"jsonrpc": "2.0", "id": n, "method": "GetTask", "params": {"id": task_id}}),
    )
}

/// The bare ceiling: parse the JSON-RPC envelope, answer a fixed task.
async fn bare(body: Bytes) -> Json<Value> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let valid = request.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && request.get("method").and_then(Value::as_str).is_some();
    Json(if valid {
        json!({"jsonrpc": "2.0", "id": id, "result": {"task": {
            "id": "t-1",
            "contextId": "c-1",
            "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-01-01T00:00:00Z"}
        }}})
    } else {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": "invalid request"}})
    })
}

/// A running server and the sender that stops it.
struct Served {
    url: String,
    stop: oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<()>,
}

async fn serve_bare() -> std::io::Result<Served> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let router = Router::new().route("/", post(bare));
    let serving = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
    });
    Ok(Served { url, stop, serving })
}

/// The in-memory stores of a bench server, held to report how many records they keep.
#[derive(Clone)]
struct Held {
    tasks: Arc<InMemoryTaskManager>,
    threads: Arc<InMemoryThreadStore>,
}

impl Held {
    fn describe(&self) -> String {
        format!(
            "{} tasks, {} threads held",
            self.tasks.len(),
            self.threads.len()
        )
    }
}

async fn serve_keel() -> Result<(Served, Held), Box<dyn std::error::Error>> {
    let agent = Agent::builder(AgentCard::new("echo", "Echoes", "http://127.0.0.1:0")).build()?;
    let held = Held {
        tasks: Arc::new(InMemoryTaskManager::new()),
        threads: Arc::new(InMemoryThreadStore::new()),
    };
    let mut services = Services::in_memory(Arc::new(MockLlm::new()));
    services.tasks = held.tasks.clone();
    services.threads = held.threads.clone();
    let runtime = Arc::new(services);
    let server = A2aServer::new(AgentExecutor::new(agent, runtime));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        if let Err(err) = server
            .serve(listener, async move {
                let _ = stopped.await;
            })
            .await
        {
            eprintln!("a2a bench: the Keel server failed: {err}");
        }
    });
    Ok((Served { url, stop, serving }, held))
}

async fn stop(served: Served) {
    let _ = served.stop.send(());
    let _ = served.serving.await;
}

/// What a load did.
struct Load {
    ok: u64,
    failed: u64,
    elapsed: Duration,
}

impl Load {
    fn per_sec(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }
}

/// `concurrency` client tasks POST `body(n)` to `url` until `duration` has passed or `total`
/// requests have been made, whichever comes first.
async fn load(
    http: &reqwest::Client,
    url: &str,
    body: Body,
    concurrency: usize,
    duration: Duration,
    total: u64,
) -> Load {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (http, url, body, next) = (http.clone(), url.to_owned(), body.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, 0u64);
            while started.elapsed() < duration {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                let answer = http
                    .post(&url)
                    .header("A2A-Version", "1.0")
                    .json(&body(n))
                    .send()
                    .await;
                let good = match answer {
                    Ok(response) if response.status().is_success() => response
                        .bytes()
                        .await
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                        .is_some_and(|v| v.get("result").is_some()),
                    _ => false,
                };
                if good {
                    ok += 1;
                } else {
                    failed += 1;
                }
            }
            (ok, failed)
        }));
    }
    let (mut ok, mut failed) = (0, 0);
    for worker in workers {
        if let Ok((o, f)) = worker.await {
            ok += o;
            failed += f;
        }
    }
    Load {
        ok,
        failed,
        elapsed: started.elapsed(),
    }
}

/// A task id on `url`, from one SendMessage.
async fn one_task(http: &reqwest::Client, url: &str) -> Option<String> {
    let answer: Value = http
        .post(url)
        .header("A2A-Version", "1.0")
        .json(&send_message(u64::MAX))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    answer["result"]["task"]["id"].as_str().map(str::to_owned)
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || "n/a".to_owned(),
        |k| format!("{:.1} MiB", k as f64 / 1024.0),
    )
}

async fn run(
    duration: Duration,
    concurrency: usize,
    sends: u64,
    row_count: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let (keel, _) = serve_keel().await?;
    let bare = serve_bare().await?;
    // Checked up front, so a server that cannot answer fails before any figure.
    one_task(&http, &keel.url)
        .await
        .ok_or("the Keel server answered SendMessage without a task")?;

    println!(
        "a2a: JSON-RPC over HTTP/1.1 on 127.0.0.1, {concurrency} client tasks (reqwest), {:.1} s per figure",
        duration.as_secs_f64()
    );
    println!("keel: echo agent (MockLlm, unscripted), in-memory store, A2aServer");
    println!("bare: axum handler that parses the envelope and answers a fixed result");
    println!(
        "{:<12} {:>12} {:>12} {:>10} {:>8}",
        "operation", "keel req/s", "bare req/s", "keel/bare", "errors"
    );
    let loads: [(&str, Body, Body); 2] = [
        (
            "SendMessage",
            Arc::new(send_message),
            Arc::new(send_message),
        ),
        // The task to get is made after the SendMessage load (below): made before it, it
        // could be among the oldest finished tasks the store has let go by then.
        ("GetTask", get_task(String::new()), get_task("t-1".into())),
    ];
    for (name, mut keel_body, bare_body) in loads {
        if name == "GetTask" {
            let task = one_task(&http, &keel.url)
                .await
                .ok_or("the Keel server answered SendMessage without a task")?;
            keel_body = get_task(task);
        }
        // Warm both servers' connections first.
        let warm = Duration::from_millis(200);
        load(
            &http,
            &keel.url,
            keel_body.clone(),
            concurrency,
            warm,
            u64::MAX,
        )
        .await;
        load(
            &http,
            &bare.url,
            bare_body.clone(),
            concurrency,
            warm,
            u64::MAX,
        )
        .await;
        let k = load(&http, &keel.url, keel_body, concurrency, duration, u64::MAX).await;
        let b = load(&http, &bare.url, bare_body, concurrency, duration, u64::MAX).await;
        println!(
            "{:<12} {:>12.0} {:>12.0} {:>9.1}% {:>8}",
            name,
            k.per_sec(),
            b.per_sec(),
            100.0 * k.per_sec() / b.per_sec().max(f64::MIN_POSITIVE),
            k.failed + b.failed
        );
    }
    stop(bare).await;

    // Memory: a fresh Keel server, so the figure is of `sends` sends from a known start.
    stop(keel).await;
    let (keel, held) = serve_keel().await?;
    let warm = load(
        &http,
        &keel.url,
        Arc::new(send_message),
        concurrency,
        Duration::MAX,
        1_000,
    )
    .await;
    let before = rss_kib();
    let mut rows = Vec::new();
    let step = (sends / row_count.max(1)).max(1);
    let mut done = 0;
    let started = Instant::now();
    let mut failed = warm.failed;
    while done < sends {
        let n = step.min(sends - done);
        let offset = done + 1_000;
        let body: Body = Arc::new(move |i| send_message(offset + i));
        let l = load(&http, &keel.url, body, concurrency, Duration::MAX, n).await;
        failed += l.failed;
        done += n;
        rows.push((done, rss_kib(), held.describe()));
    }
    let elapsed = started.elapsed();
    stop(keel).await;
    println!(
        "memory (VmRSS of the bench process, server and client): {sends} SendMessage in {:.1} s ({:.0}/s), {failed} errors",
        elapsed.as_secs_f64(),
        sends as f64 / elapsed.as_secs_f64()
    );
    println!("{:>10} {:>12}", "sends", "rss");
    println!("{:>10} {:>12}", 0, mib(before));
    for (done, rss, held) in rows {
        println!("{done:>10} {:>12}   {held}", mib(rss));
    }
    Ok(())
}

fn main() -> ExitCode {
    let duration = Duration::from_secs_f64(env_number("KEEL_BENCH_SECS", 2.0));
    let concurrency = env_number("KEEL_BENCH_CONCURRENCY", 32.0) as usize;
    let sends = env_number("KEEL_BENCH_SENDS", 100_000.0) as u64;
    let rows = env_number("KEEL_BENCH_ROWS", 8.0) as u64;
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        eprintln!("a2a bench: cannot start a tokio runtime");
        return ExitCode::FAILURE;
    };
    match rt.block_on(run(duration, concurrency, sends, rows)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("a2a bench: {err}");
            ExitCode::FAILURE
        }
    }
}
