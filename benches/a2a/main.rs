//! `cargo xtask bench a2a`: Keel's A2A server measured as a user choosing a runtime would,
//! side by side with two peers. Every server is its own process pinned to CPU 0; the load
//! generator, wrk, is pinned to CPU 1, with keep-alive connections on one thread.
//!
//! - **keel**: the release `keel serve` (its demo agent on the offline model) on each store:
//!   memory, SQLite (a file in a temporary directory), Redis (`REDIS_URL`, a fresh key prefix;
//!   skipped with a note when nothing answers there), PostgreSQL (`KEEL_POSTGRES_URL`, a fresh
//!   schema per server, dropped at the end; skipped likewise).
//! - **bare-axum**: an axum handler that parses the JSON-RPC envelope and answers a fixed
//!   result for every method: what HTTP and JSON cost alone.
//! - **a2a-sdk**: an echo agent on the official Rust A2A SDK's server (`a2a-server-lf`).
//!
//! The peers live in `benches/peers`, a package outside the workspace that xtask builds.
//!
//! Scenarios, each at 8 and 32 connections: SendMessage (blocking), SendMessage with
//! `configuration.returnImmediately`, GetTask of a task created just before the figure, and
//! SendStreamingMessage (SSE, ended by the server when the task ends). Every message has its
//! own `messageId`. Each server answers each scenario once before its figures; one that
//! answers with an error is left out of that scenario with a note.
//!
//! Printed: one table (req/s, p50, p99, and Keel's req/s over each peer's), the median of
//! `KEEL_BENCH_RUNS` interleaved runs, each metric's median taken on its own; the servers'
//! RSS idle and after N and 2N SendMessage, with what those sends cost each store (see
//! `stores.rs`); each durable store's raw ceiling beside Keel's SendMessage on it; Keel's
//! cold start on an existing SQLite file; the capacity figure (see `capacity.rs`). Asserts
//! nothing.
//!
//! Settings: `KEEL_BENCH_SECS` (per figure, default 10), `KEEL_BENCH_RUNS` (default 3),
//! `KEEL_BENCH_BACKENDS` (of memory,sqlite,redis,postgres), `KEEL_BENCH_SCENARIOS` (of
//! send,send-async,get,stream), `KEEL_BENCH_SENDS` (N of the memory figures, default 100000;
//! 0 skips them), `KEEL_BENCH_CAPACITY` (the capacity figure's connection levels, default
//! 64,128,256,512,768, up to one tenant's default work slots; 0 skips it), `REDIS_URL`.
//! `KEEL_BENCH_KEEL_BIN` and `KEEL_BENCH_PEERS_DIR` (set by xtask) say where the binaries are. `KEEL_BENCH_BASE_BIN`, when set, names a second `keel` binary
//! (say, a release build of the commit before a change) that runs beside the current one on
//! each store, as `keel-base`, with Keel's req/s over it in the `keel/base` column.

mod capacity;
mod http;
mod sends;
mod servers;
mod stores;
mod wrk;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};
use servers::{Binaries, Kind, Server, Store};
use wrk::{Figure, Load};

/// The wrk script, written into the bench's temporary directory at start.
const SCRIPT: &str = include_str!("load.lua");

/// Keep-alive connections of each figure.
const CONCURRENCY: [u32; 2] = [8, 32];

/// Timeout of the harness's own requests (probes, the task GetTask reads).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a figure's requests do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Scenario {
    Send,
    SendAsync,
    Get,
    Stream,
}

impl Scenario {
    const ALL: [Scenario; 4] = [
        Scenario::Send,
        Scenario::SendAsync,
        Scenario::Get,
        Scenario::Stream,
    ];

    /// The name in `KEEL_BENCH_SCENARIOS` and the Lua script's first argument.
    fn name(self) -> &'static str {
        match self {
            Scenario::Send => "send",
            Scenario::SendAsync => "send-async",
            Scenario::Get => "get",
            Scenario::Stream => "stream",
        }
    }

    /// The name in the table.
    fn label(self) -> &'static str {
        match self {
            Scenario::Send => "SendMessage",
            Scenario::SendAsync => "SendMessage/returnImmediately",
            Scenario::Get => "GetTask",
            Scenario::Stream => "SendStreamingMessage",
        }
    }

    /// The request the harness sends to check a server answers this scenario; the same JSON
    /// as `load.lua` sends.
    fn request(self, message_id: &str, task_id: &str) -> Value {
        let message = json!({
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"text": "hello, echo"}]
        });
        let (method, params) = match self {
            Scenario::Send => ("SendMessage", json!({"message": message})),
            Scenario::SendAsync => (
                "SendMessage",
                json!({"message": message, "configuration": {"returnImmediately": true}}),
            ),
            Scenario::Get => ("GetTask", json!({"id": task_id})),
            Scenario::Stream => ("SendStreamingMessage", json!({"message": message})),
        };
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    }
}

/// The settings, from the environment.
struct Settings {
    secs: u64,
    runs: usize,
    stores: Vec<Store>,
    scenarios: Vec<Scenario>,
    sends: u64,
    /// The capacity figure's connection levels (none: skipped).
    capacity: Vec<u32>,
    redis_url: String,
    keel_bin: PathBuf,
    base_bin: Option<PathBuf>,
    peers_dir: PathBuf,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        let path =
            |name: &str, default: PathBuf| std::env::var_os(name).map_or(default, PathBuf::from);
        let settings = Settings {
            secs: number("KEEL_BENCH_SECS", 10)?.max(1),
            runs: number("KEEL_BENCH_RUNS", 3)?.max(1) as usize,
            stores: pick("KEEL_BENCH_BACKENDS", &Store::ALL, |s| s.name())?,
            scenarios: pick("KEEL_BENCH_SCENARIOS", &Scenario::ALL, |s| s.name())?,
            sends: number("KEEL_BENCH_SENDS", 100_000)?,
            capacity: levels("KEEL_BENCH_CAPACITY", &[64, 128, 256, 512, 768])?,
            redis_url: std::env::var("REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
            keel_bin: path("KEEL_BENCH_KEEL_BIN", target.join("release/keel")),
            base_bin: std::env::var_os("KEEL_BENCH_BASE_BIN").map(PathBuf::from),
            peers_dir: path("KEEL_BENCH_PEERS_DIR", target.join("peers/release")),
        };
        for binary in [
            settings.keel_bin.clone(),
            settings.peers_dir.join("bare-peer"),
            settings.peers_dir.join("sdk-peer"),
        ]
        .into_iter()
        .chain(settings.base_bin.clone())
        {
            if !binary.is_file() {
                return Err(format!(
                    "{} is missing: run this bench with `cargo xtask bench a2a`, which builds it",
                    binary.display()
                ));
            }
        }
        Ok(settings)
    }
}

/// A whole number from the environment, `default` when unset.
/// A comma-separated list of connection counts; `0` is none.
fn levels(name: &str, default: &[u32]) -> Result<Vec<u32>, String> {
    let Ok(text) = std::env::var(name) else {
        return Ok(default.to_vec());
    };
    let levels = text
        .split(',')
        .map(|level| level.trim().parse::<u32>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{name}: `{text}` is not a list of connection counts: {e}"))?;
    Ok(levels.into_iter().filter(|&level| level > 0).collect())
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

/// The comma-separated subset of `all` named in `name` (all of it when unset), in `all`'s order.
fn pick<T: Copy + PartialEq>(
    name: &str,
    all: &[T],
    key: fn(T) -> &'static str,
) -> Result<Vec<T>, String> {
    let Ok(list) = std::env::var(name) else {
        return Ok(all.to_vec());
    };
    let wanted: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(unknown) = wanted.iter().find(|w| !all.iter().any(|a| key(*a) == **w)) {
        let known: Vec<&str> = all.iter().map(|a| key(*a)).collect();
        return Err(format!(
            "{name}: unknown `{unknown}` (known: {})",
            known.join(",")
        ));
    }
    Ok(all
        .iter()
        .copied()
        .filter(|a| wanted.contains(&key(*a)))
        .collect())
}

/// What the bench holds while it runs.
struct Bench {
    settings: Settings,
    bins: Binaries,
    script: PathBuf,
    /// Makes every wrk run's messageIds and every Keel store's place distinct.
    counter: u64,
    /// The PostgreSQL schemas of this run's Keel servers, dropped at the end.
    schemas: Vec<keel_store_postgres::testing::TestSchema>,
}

/// Runs one PostgreSQL chore (a schema made or dropped) to its end.
fn postgres<T>(
    chore: impl std::future::Future<Output = keel_core::AgentResult<T>>,
) -> Result<T, String> {
    stores::block_on(chore)?.map_err(|e| e.to_string())
}

impl Bench {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// A fresh place for a Keel server: a new SQLite file, a new Redis key prefix or a new
    /// PostgreSQL schema (dropped at the end).
    fn place(&mut self, kind: Kind) -> Result<Option<String>, String> {
        let n = self.next();
        Ok(match kind {
            Kind::Keel(Store::Postgres) | Kind::Base(Store::Postgres) => {
                let schema = postgres(keel_store_postgres::testing::TestSchema::new())?;
                let url = schema.url.clone();
                self.schemas.push(schema);
                Some(url)
            }
            Kind::Keel(Store::Sqlite) | Kind::Base(Store::Sqlite) => Some(
                self.bins
                    .dir
                    .join(format!("keel-{n}.db"))
                    .display()
                    .to_string(),
            ),
            Kind::Keel(Store::Redis) | Kind::Base(Store::Redis) => {
                Some(format!("{}{n}:", redis_root()))
            }
            _ => None,
        })
    }

    fn start(&mut self, kind: Kind) -> Result<Server, String> {
        let place = self.place(kind)?;
        Server::start(&self.bins, kind, place)
    }

    /// One wrk run against `server`.
    fn load(
        &mut self,
        server: &Server,
        scenario: Scenario,
        connections: u32,
        task_id: &str,
    ) -> Result<Figure, String> {
        let prefix = format!("w{}-", self.next());
        Load {
            script: &self.script,
            port: server.port,
            connections,
            seconds: self.settings.secs,
            scenario: scenario.name(),
            prefix: &prefix,
            task_id,
            ramp_ms: 0,
        }
        .run()
    }
}

/// The prefix under which every Redis key of this bench process lives (deleted at the end).
fn redis_root() -> String {
    format!("keel-bench-{}-", std::process::id())
}

/// Sends one request of `scenario` and checks the answer is a JSON-RPC result (for a
/// stream: events, none of them an error).
fn probe(
    bench: &mut Bench,
    server: &Server,
    scenario: Scenario,
    task_id: &str,
) -> Result<(), String> {
    let message_id = format!("probe-{}", bench.next());
    let body = scenario.request(&message_id, task_id).to_string();
    let response = http::post_json(server.port, &body, PROBE_TIMEOUT).map_err(|e| e.to_string())?;
    if response.status != 200 {
        return Err(format!("HTTP {}: {}", response.status, response.body));
    }
    let answers: Vec<Value> = if scenario == Scenario::Stream {
        response
            .body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        serde_json::from_str(&response.body).into_iter().collect()
    };
    match answers.iter().find(|a| a.get("result").is_none()) {
        _ if answers.is_empty() => Err(format!("no JSON-RPC answer: {}", response.body)),
        Some(bad) => Err(format!("answered {bad}")),
        None => Ok(()),
    }
}

/// A task on `server`, from one blocking SendMessage: what GetTask reads.
fn create_task(bench: &mut Bench, server: &Server) -> Result<String, String> {
    let message_id = format!("task-{}", bench.next());
    let body = Scenario::Send.request(&message_id, "").to_string();
    let response = http::post_json(server.port, &body, PROBE_TIMEOUT).map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_str(&response.body)
        .map_err(|_| format!("HTTP {}: {}", response.status, response.body))?;
    answer["result"]["task"]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("SendMessage answered without a task: {answer}"))
}

/// Figures of one (server, scenario, connections), one per run.
type Figures = HashMap<(Kind, Scenario, u32), Vec<Figure>>;

/// The throughput table: every server started once, the runs interleaved (each run measures
/// every figure once, servers side by side). Returns the SQLite file Keel used, if any.
fn throughput(bench: &mut Bench) -> Result<Option<String>, String> {
    let with_base = bench.settings.base_bin.is_some();
    let mut kinds: Vec<Kind> = bench
        .settings
        .stores
        .iter()
        .flat_map(|s| [Some(Kind::Keel(*s)), with_base.then_some(Kind::Base(*s))])
        .flatten()
        .collect();
    kinds.extend([Kind::Bare, Kind::Sdk]);
    let mut running = Vec::new();
    for kind in kinds {
        let server = match bench.start(kind) {
            Ok(server) => server,
            // An older build may not know a store (PostgreSQL came later): no base row.
            Err(e) if matches!(kind, Kind::Base(_)) => {
                println!("note: keel-base left out on {}: {e}", kind.store());
                continue;
            }
            Err(e) => return Err(e),
        };
        // A second of load first: connections, caches and the allocator warm.
        bench.load(&server, Scenario::Send, 8, "")?;
        running.push(server);
    }
    let mut figures = Figures::new();
    let mut left_out: Vec<(Kind, Scenario)> = Vec::new();
    for run in 0..bench.settings.runs {
        for &scenario in &bench.settings.scenarios.clone() {
            for connections in CONCURRENCY {
                for server in &running {
                    if left_out.contains(&(server.kind, scenario)) {
                        continue;
                    }
                    let task_id = if scenario == Scenario::Get {
                        create_task(bench, server)?
                    } else {
                        String::new()
                    };
                    if run == 0 && connections == CONCURRENCY[0] {
                        if let Err(why) = probe(bench, server, scenario, &task_id) {
                            println!(
                                "note: {} ({}) left out of {}: {why}",
                                server.kind.server(),
                                server.kind.store(),
                                scenario.label()
                            );
                            left_out.push((server.kind, scenario));
                            continue;
                        }
                    }
                    let figure = bench.load(server, scenario, connections, &task_id)?;
                    figures
                        .entry((server.kind, scenario, connections))
                        .or_default()
                        .push(figure);
                }
            }
        }
    }
    let kinds: Vec<Kind> = running.iter().map(|s| s.kind).collect();
    print_table(&kinds, &bench.settings.scenarios, &figures);
    let mut sqlite = None;
    for server in running {
        if server.kind == Kind::Keel(Store::Sqlite) {
            sqlite.clone_from(&server.place);
        }
        server.stop();
    }
    let most = CONCURRENCY[CONCURRENCY.len() - 1];
    stores::ceilings(bench, most as usize, |store| {
        figures
            .get(&(Kind::Keel(store), Scenario::Send, most))
            .map(|runs| median(runs, |f| f.per_sec))
    })?;
    Ok(sqlite)
}

/// The median of one metric over a figure's runs.
fn median(figures: &[Figure], metric: fn(&Figure) -> f64) -> f64 {
    let mut values: Vec<f64> = figures.iter().map(metric).collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn latency(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else {
        format!("{:.2}ms", us / 1000.0)
    }
}

fn print_table(kinds: &[Kind], scenarios: &[Scenario], figures: &Figures) {
    println!();
    println!(
        "{:<10} {:<7} {:<30} {:>5} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10} {:>7}",
        "server",
        "store",
        "scenario",
        "conns",
        "req/s",
        "p50",
        "p99",
        "keel/bare",
        "keel/sdk",
        "keel/base",
        "errors"
    );
    let per_sec = |kind: Kind, scenario: Scenario, connections: u32| {
        figures
            .get(&(kind, scenario, connections))
            .map(|f| median(f, |f| f.per_sec))
    };
    for &scenario in scenarios {
        for connections in CONCURRENCY {
            for &kind in kinds {
                let Some(runs) = figures.get(&(kind, scenario, connections)) else {
                    continue;
                };
                let rate = median(runs, |f| f.per_sec);
                let ratio = |peer: Kind| match (kind, per_sec(peer, scenario, connections)) {
                    (Kind::Keel(_) | Kind::Base(_), Some(peer_rate)) if peer != kind => {
                        format!("{:.2}x", rate / peer_rate)
                    }
                    _ => "-".to_owned(),
                };
                let base = match kind {
                    Kind::Keel(store) => ratio(Kind::Base(store)),
                    _ => "-".to_owned(),
                };
                println!(
                    "{:<10} {:<7} {:<30} {:>5} {:>9.0} {:>9} {:>9} {:>10} {:>9} {:>10} {:>7}",
                    kind.server(),
                    kind.store(),
                    scenario.label(),
                    connections,
                    rate,
                    latency(median(runs, |f| f.p50_us)),
                    latency(median(runs, |f| f.p99_us)),
                    ratio(Kind::Bare),
                    ratio(Kind::Sdk),
                    base,
                    runs.iter().map(|f| f.errors).sum::<u64>(),
                );
            }
        }
    }
    println!();
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// Resident memory of a fresh server, idle and after `sends` and `2 * sends` SendMessage
/// (8 keep-alive connections of [`sends`]): for Keel on each store and for the SDK peer.
fn memory(bench: &mut Bench) -> Result<(), String> {
    let sends = bench.settings.sends;
    if sends == 0 {
        println!("memory: skipped (KEEL_BENCH_SENDS=0)");
        return Ok(());
    }
    println!("memory: VmRSS of the server process, idle and after {sends} and {} SendMessage (8 connections)", 2 * sends);
    println!(
        "{:<10} {:<7} {:>11} {:>14} {:>14} {:>9} {:>7}   the store, per send",
        "server",
        "store",
        "idle",
        format!("after {sends}"),
        format!("after {}", 2 * sends),
        "sends/s",
        "errors"
    );
    let mut kinds: Vec<Kind> = bench
        .settings
        .stores
        .iter()
        .map(|s| Kind::Keel(*s))
        .collect();
    kinds.push(Kind::Sdk);
    for kind in kinds {
        // Keel on SQLite serves `/metrics`, where its store counts its writes and reads.
        let counted = kind == Kind::Keel(Store::Sqlite);
        let server = if counted {
            let place = bench.place(kind)?;
            Server::start_with(&bench.bins, kind, place, &["--metrics"])?
        } else {
            bench.start(kind)?
        };
        let work_before = counted.then(|| stores::sqlite_work(server.port));
        let before = stores::Counters::read_place(bench, server.kind, server.place.as_deref());
        let idle = server.rss_kib();
        let first = sends::send_messages(server.port, 8, sends, &format!("s{}-", bench.next()))?;
        let after_first = server.rss_kib();
        let second = sends::send_messages(server.port, 8, sends, &format!("s{}-", bench.next()))?;
        let after_second = server.rss_kib();
        let work = match (
            work_before,
            counted.then(|| stores::sqlite_work(server.port)),
        ) {
            (Some(Ok(before)), Some(Ok(after))) => {
                format!(
                    "; {}",
                    stores::sqlite_work_per_send(before, after, 2 * sends)
                )
            }
            (Some(Err(e)), _) | (_, Some(Err(e))) => format!("; no store counters: {e}"),
            _ => String::new(),
        };
        let place = server.place.clone();
        server.stop();
        // Read once the server has stopped: its store has flushed what it counts.
        let after = stores::Counters::read_place(bench, kind, place.as_deref());
        println!(
            "{:<10} {:<7} {:>11} {:>14} {:>14} {:>9.0} {:>7}   {}{work}",
            kind.server(),
            kind.store(),
            mib(idle),
            mib(after_first),
            mib(after_second),
            (first.per_sec + second.per_sec) / 2.0,
            first.errors + second.errors,
            before.per_send(&after, 2 * sends)
        );
    }
    println!();
    Ok(())
}

/// Keel's cold start: from spawning `keel serve` on the SQLite file the throughput runs
/// left to its agent card answering; the median of at least three starts.
fn cold_start(bench: &Bench, sqlite: Option<String>) -> Result<(), String> {
    let Some(path) = sqlite else {
        println!("cold start: skipped (it starts Keel on the SQLite file of the sqlite backend)");
        return Ok(());
    };
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut times = Vec::new();
    for _ in 0..bench.settings.runs.max(3) {
        let server = Server::start(&bench.bins, Kind::Keel(Store::Sqlite), Some(path.clone()))?;
        times.push(server.started_in.as_secs_f64() * 1e3);
        server.stop();
    }
    times.sort_by(f64::total_cmp);
    println!(
        "cold start: `keel serve` on an existing SQLite file ({:.1} MiB) to its agent card answering: median {:.1} ms (min {:.1}, max {:.1}; {} starts)",
        size as f64 / (1024.0 * 1024.0),
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        times.len()
    );
    Ok(())
}

/// Whether a Redis answers PING at `url`.
fn redis_answers(url: &str) -> bool {
    let ping = || -> redis::RedisResult<String> {
        let client = redis::Client::open(url)?;
        let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
        redis::cmd("PING").query(&mut con)
    };
    ping().is_ok()
}

/// Deletes the keys this bench's Keel servers wrote to Redis.
fn clean_redis(url: &str) -> redis::RedisResult<usize> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection()?;
    let keys: Vec<String> = redis::Commands::scan_match(&mut con, format!("{}*", redis_root()))?
        .collect::<redis::RedisResult<_>>()?;
    for chunk in keys.chunks(1000) {
        redis::cmd("DEL").arg(chunk).query::<()>(&mut con)?;
    }
    Ok(keys.len())
}

fn run() -> Result<(), String> {
    let mut settings = Settings::from_env()?;
    if settings.stores.contains(&Store::Redis) && !redis_answers(&settings.redis_url) {
        println!(
            "note: nothing answers at REDIS_URL ({}): the redis backend is skipped",
            settings.redis_url
        );
        settings.stores.retain(|s| *s != Store::Redis);
    }
    if settings.stores.contains(&Store::Postgres) {
        let probe = postgres(keel_store_postgres::testing::TestSchema::new())
            .and_then(|schema| postgres(schema.drop_schema()));
        if let Err(e) = probe {
            println!("note: no PostgreSQL for the bench ({e}): the postgres backend is skipped");
            settings.stores.retain(|s| *s != Store::Postgres);
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("keel-a2a-bench")
        .tempdir()
        .map_err(|e| format!("no temporary directory: {e}"))?;
    let script = dir.path().join("load.lua");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    println!(
        "a2a: servers on CPU 0, wrk on CPU 1 (1 thread, keep-alive, connections {CONCURRENCY:?}); {} s per figure, median of {} interleaved runs",
        settings.secs, settings.runs
    );
    println!("keel: release `keel serve`, demo agent on the offline model; bare-axum: fixed result; a2a-sdk: echo agent on a2a-server-lf 0.5.3");
    let bins = Binaries {
        keel: settings.keel_bin.clone(),
        base: settings.base_bin.clone(),
        peers: settings.peers_dir.clone(),
        dir: dir.path().to_owned(),
        redis_url: settings.redis_url.clone(),
    };
    let mut bench = Bench {
        settings,
        bins,
        script,
        counter: 0,
        schemas: Vec::new(),
    };
    let outcome = throughput(&mut bench).and_then(|sqlite| {
        memory(&mut bench)?;
        cold_start(&bench, sqlite)?;
        let levels = bench.settings.capacity.clone();
        capacity::capacity(&mut bench, &levels)
    });
    if bench.settings.stores.contains(&Store::Redis) {
        if let Err(e) = clean_redis(&bench.settings.redis_url) {
            println!(
                "note: could not delete the bench's Redis keys ({}*): {e}",
                redis_root()
            );
        }
    }
    for schema in std::mem::take(&mut bench.schemas) {
        let name = schema.name.clone();
        if let Err(e) = postgres(schema.drop_schema()) {
            println!("note: could not drop the bench's PostgreSQL schema {name}: {e}");
        }
    }
    outcome
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("a2a bench: {e}");
            ExitCode::FAILURE
        }
    }
}
