//! `cargo xtask bench soak`: many clients against one release `keel serve` for a while, to
//! see whether it stays up, how often it errs, how its latency spreads per operation, and
//! whether its memory grows. Prints; asserts nothing.
//!
//! `KEEL_SOAK_CLIENTS` client threads (default 50) each loop for `KEEL_SOAK_SECS` (default
//! 60) over a mix of operations on their own thread of conversation: a blocking SendMessage,
//! a SendMessage with `returnImmediately`, a GetTask of their last task, and a ListTasks page.
//! Each request is its own connection (the harness's `http` client), as many unrelated
//! clients would be. The server runs on `KEEL_SOAK_STORE` (`memory`, `sqlite`, the default,
//! or `redis` at `REDIS_URL`), pinned to CPU 0.
//!
//! Printed: per operation the count, errors (transport failures, non-200 answers and JSON-RPC
//! errors), p50 and p99; the server's RSS at start and at end.

// The harness modules of the A2A bench, shared as they are; this bench uses part of them.
#[allow(dead_code)]
#[path = "../a2a/http.rs"]
mod http;
#[allow(dead_code)]
#[path = "../a2a/servers.rs"]
mod servers;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use servers::{Binaries, Kind, Server, Store};

/// Timeout of one request: a request slower than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The operations a client mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Send,
    SendAsync,
    Get,
    List,
}

impl Operation {
    const ALL: [Operation; 4] = [
        Operation::Send,
        Operation::SendAsync,
        Operation::Get,
        Operation::List,
    ];

    fn label(self) -> &'static str {
        match self {
            Operation::Send => "SendMessage",
            Operation::SendAsync => "SendMessage/returnImmediately",
            Operation::Get => "GetTask",
            Operation::List => "ListTasks",
        }
    }
}

/// What one client saw: per operation, the latencies of the answered requests and the
/// number of errors.
#[derive(Default)]
struct Seen {
    latencies: [Vec<Duration>; 4],
    errors: [u64; 4],
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

fn number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("{name}={s} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn run() -> Result<(), String> {
    let secs = number("KEEL_SOAK_SECS", 60)?.max(1);
    let clients = number("KEEL_SOAK_CLIENTS", 50)?.max(1) as usize;
    let store = match std::env::var("KEEL_SOAK_STORE").as_deref() {
        Ok("memory") => Store::Memory,
        Ok("redis") => Store::Redis,
        Ok("sqlite") | Err(_) => Store::Sqlite,
        Ok(other) => return Err(format!("KEEL_SOAK_STORE={other}: memory, sqlite or redis")),
    };
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    let keel = std::env::var_os("KEEL_BENCH_KEEL_BIN")
        .map_or_else(|| target.join("release/keel"), PathBuf::from);
    if !keel.is_file() {
        return Err(format!(
            "{} is missing: run this bench with `cargo xtask bench soak`, which builds it",
            keel.display()
        ));
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let bins = Binaries {
        keel,
        base: None,
        peers: PathBuf::new(),
        dir: dir.path().to_owned(),
        redis_url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    };
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let place = match store {
        Store::Memory => None,
        Store::Sqlite => Some(dir.path().join("soak.db").display().to_string()),
        Store::Redis => Some(format!("keel-soak-{tag}:")),
        Store::Postgres => {
            return Err("the soak runs on memory, sqlite or redis (not postgres yet)".into())
        }
    };
    let server = Server::start(&bins, Kind::Keel(store), place)?;
    let rss_start = server.rss_kib();
    println!(
        "soak: {clients} clients for {secs} s against the release `keel serve` on {}",
        store.name()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|n| {
            let (stop, port, tag) = (stop.clone(), server.port, tag.clone());
            std::thread::spawn(move || client(port, &format!("{tag}-{n}"), &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut seen = Seen::default();
    for worker in workers {
        let one = worker
            .join()
            .map_err(|_| "a client thread panicked".to_owned())?;
        for i in 0..Operation::ALL.len() {
            seen.latencies[i].extend(one.latencies[i].iter().copied());
            seen.errors[i] += one.errors[i];
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let rss_end = server.rss_kib();
    server.stop();
    print_report(&seen, elapsed, rss_start, rss_end);
    Ok(())
}

/// One client: its own thread of conversation, operations in turn until `stop`.
fn client(port: u16, name: &str, stop: &AtomicBool) -> Seen {
    let mut seen = Seen::default();
    let context = format!("soak-{name}");
    let mut last_task: Option<String> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let operation = Operation::ALL[(n % 4) as usize];
        n += 1;
        let message = json!({
            "messageId": format!("{name}-{n}"),
            "role": "ROLE_USER",
            "contextId": context,
            "parts": [{"text": "hello, soak"}]
        });
        let (method, params) = match operation {
            Operation::Send => ("SendMessage", json!({"message": message})),
            Operation::SendAsync => (
                "SendMessage",
                json!({"message": message, "configuration": {"returnImmediately": true}}),
            ),
            Operation::Get => match &last_task {
                Some(id) => ("GetTask", json!({"id": id, "historyLength": 2})),
                None => continue,
            },
            Operation::List => ("ListTasks", json!({"contextId": context, "pageSize": 10})),
        };
        let body = json!({"jsonrpc": "2.0", "id": n, "method": method, "params": params});
        let sent = Instant::now();
        let answer = http::post_json(port, &body.to_string(), REQUEST_TIMEOUT);
        let took = sent.elapsed();
        let index = operation as usize;
        let result = answer.ok().filter(|r| r.status == 200).and_then(|r| {
            let value: Value = serde_json::from_str(&r.body).ok()?;
            value.get("result").cloned()
        });
        match result {
            Some(result) => {
                seen.latencies[index].push(took);
                if let Some(id) = result["task"]["id"].as_str() {
                    last_task = Some(id.to_owned());
                }
            }
            None => seen.errors[index] += 1,
        }
    }
    seen
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn print_report(seen: &Seen, elapsed: f64, rss_start: Option<u64>, rss_end: Option<u64>) {
    println!(
        "\n| operation | answered | errors | error rate | req/s | p50 | p99 |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for operation in Operation::ALL {
        let index = operation as usize;
        let mut latencies = seen.latencies[index].clone();
        latencies.sort();
        let answered = latencies.len() as u64;
        let errors = seen.errors[index];
        let total = answered + errors;
        let rate = if total == 0 {
            0.0
        } else {
            errors as f64 * 100.0 / total as f64
        };
        println!(
            "| {} | {answered} | {errors} | {rate:.2}% | {:.0} | {:.2} ms | {:.2} ms |",
            operation.label(),
            answered as f64 / elapsed,
            percentile(&latencies, 0.50).as_secs_f64() * 1e3,
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        );
    }
    let kib =
        |rss: Option<u64>| rss.map_or("?".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
    println!(
        "\nserver RSS: {} at start, {} at end",
        kib(rss_start),
        kib(rss_end)
    );
}
