//! Keel's store benchmarks, run by `cargo xtask bench stores` (this crate's `stores` bench
//! target). The figures are printed for people, never asserted: speed is measured here, not in
//! tests.
//!
//! What is measured is what the engine persists per step ([`steps`]): with the thread's lease
//! taken once, each step appends two history messages (the assistant's tool call and the
//! tool's result) under the lease, adds one task event and saves the task snapshot. That is
//! run on each backend (memory, a SQLite file, Redis, PostgreSQL) by 1 and by 64 concurrent
//! threads, and
//! printed beside the raw ceiling of the medium measured in the same run ([`ceiling`]): for
//! SQLite, one commit per `INSERT` with the store's pragmas (WAL, `synchronous=FULL`) through
//! rusqlite directly; for Redis, `SET` through the same client and connection type the store
//! uses, at the same concurrency; for PostgreSQL, single-row commits with
//! `synchronous_commit = on` on as many connections as the store's pool. Each ceiling is measured right before the figure it is
//! printed beside: fsync latency on a shared disk drifts by an order of magnitude within
//! minutes, so a ceiling taken once per run would compare different disks.
//!
//! A step is three store calls, and at one thread each is its own commit or round trip, so a
//! ratio near 1/3 there means the store adds next to nothing to the medium. With 64 threads
//! SQLite's group commit lets many writes share one fsync, so its ratio can pass 1.

pub mod ceiling;
pub mod steps;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_runtime::{InMemoryTaskManager, InMemoryThreadStore, TaskManager, ThreadStore};
use keel_store_redis::RedisStore;
use keel_store_sqlite::SqliteStore;

/// The concurrency levels every backend is measured at.
pub const CONCURRENCY: [usize; 2] = [1, 64];

/// The most steps one measurement takes, whatever its duration: keeps the in-memory store
/// (whose logs only grow while its tasks are live) from filling RAM on a fast machine.
const MAX_STEPS: u64 = 2_000_000;

/// How the benchmark runs, from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long each measurement runs (a warm-up of a fifth of it, at most 0.5 s, comes first).
    pub duration: Duration,
    /// Where the SQLite files go.
    pub dir: PathBuf,
    /// The Redis server.
    pub redis_url: String,
}

impl Settings {
    /// `KEEL_BENCH_SECS` (default 2), `KEEL_BENCH_DIR` (default the system temp dir),
    /// `REDIS_URL` (default `redis://127.0.0.1:6379`).
    pub fn from_env() -> Result<Settings, String> {
        let duration = match std::env::var("KEEL_BENCH_SECS") {
            Err(_) => Duration::from_secs(2),
            Ok(text) => text
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    format!(
                        "KEEL_BENCH_SECS must be a number of seconds in (0, 3600], not `{text}`"
                    )
                })?,
        };
        Ok(Settings {
            duration,
            dir: std::env::var_os("KEEL_BENCH_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir),
            redis_url: std::env::var("REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        })
    }

    fn warm_up(&self) -> Duration {
        (self.duration / 5).min(Duration::from_millis(500))
    }
}

/// A throughput: how many operations in how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Operations completed.
    pub ops: u64,
    /// Wall time they took.
    pub elapsed: Duration,
}

impl Rate {
    /// Operations per second.
    pub fn per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// `memory`, `sqlite`, `redis`.
    pub backend: &'static str,
    /// Concurrent threads.
    pub threads: usize,
    /// Persisted steps, or why there are none.
    pub steps: Result<Rate, String>,
    /// What the ceiling is, and its rate (or why it is missing); `None` for memory.
    pub ceiling: Option<(String, Result<Rate, String>)>,
    /// Anything else worth printing (SQLite's writes per commit).
    pub note: String,
}

/// Everything measured in one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The settings used.
    pub settings: Settings,
    /// Where the SQLite files were, and on what file system.
    pub sqlite_location: String,
    /// The lines of the table.
    pub rows: Vec<Row>,
}

/// Measure every backend at every concurrency level, with the ceilings.
pub async fn run(settings: &Settings) -> Result<Report, String> {
    let mut rows = Vec::new();
    eprintln!(
        "measuring {} s per figure (KEEL_BENCH_SECS), after a {} s warm-up",
        settings.duration.as_secs_f64(),
        settings.warm_up().as_secs_f64()
    );

    let tasks: Arc<dyn TaskManager> = Arc::new(InMemoryTaskManager::new());
    let threads: Arc<dyn ThreadStore> = Arc::new(InMemoryThreadStore::new());
    for concurrency in CONCURRENCY {
        rows.push(Row {
            backend: "memory",
            threads: concurrency,
            steps: measure_steps(settings, &tasks, &threads, concurrency).await,
            ceiling: None,
            note: String::new(),
        });
    }
    drop((tasks, threads));

    let dir = tempfile::Builder::new()
        .prefix("keel-bench-")
        .tempdir_in(&settings.dir)
        .map_err(|e| {
            format!(
                "cannot create a temp dir in {} (KEEL_BENCH_DIR): {e}",
                settings.dir.display()
            )
        })?;
    let sqlite_location = describe_location(dir.path());
    rows.extend(sqlite_rows(settings, dir.path()).await);
    rows.extend(redis_rows(settings).await);
    rows.extend(postgres_rows(settings).await);
    Ok(Report {
        settings: settings.clone(),
        sqlite_location,
        rows,
    })
}

/// Warm up, then measure persisted steps.
async fn measure_steps(
    settings: &Settings,
    tasks: &Arc<dyn TaskManager>,
    threads: &Arc<dyn ThreadStore>,
    concurrency: usize,
) -> Result<Rate, String> {
    let warm_up = steps::Budget {
        duration: settings.warm_up(),
        max_steps: MAX_STEPS,
    };
    let budget = steps::Budget {
        duration: settings.duration,
        max_steps: MAX_STEPS,
    };
    steps::persisted_steps(tasks.clone(), threads.clone(), concurrency, warm_up)
        .await
        .map_err(|e| e.to_string())?;
    steps::persisted_steps(tasks.clone(), threads.clone(), concurrency, budget)
        .await
        .map_err(|e| e.to_string())
}

async fn sqlite_rows(settings: &Settings, dir: &Path) -> Vec<Row> {
    let ceiling_label = "INSERT, 1 commit each, 1 connection".to_owned();
    let store = match SqliteStore::open(dir.join("keel.db")) {
        Ok(store) => store,
        Err(e) => {
            return CONCURRENCY
                .iter()
                .map(|&threads| Row {
                    backend: "sqlite",
                    threads,
                    steps: Err(format!("cannot open the store: {e}")),
                    ceiling: None,
                    note: String::new(),
                })
                .collect();
        }
    };
    let tasks: Arc<dyn TaskManager> = Arc::new(store.clone());
    let threads: Arc<dyn ThreadStore> = Arc::new(store.clone());
    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        // The raw ceiling right before the figure, on its own file, with nothing else writing.
        let raw_path = dir.join("raw.db");
        let (warm_up, duration) = (settings.warm_up(), settings.duration);
        let raw = tokio::task::spawn_blocking(move || {
            ceiling::sqlite_commits(&raw_path, warm_up)?;
            ceiling::sqlite_commits(&raw_path, duration)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        let before = store.stats();
        let steps = measure_steps(settings, &tasks, &threads, concurrency).await;
        let after = store.stats();
        let commits = after.commits - before.commits;
        let writes = after.writes_finished - before.writes_finished;
        rows.push(Row {
            backend: "sqlite",
            threads: concurrency,
            steps,
            ceiling: Some((ceiling_label.clone(), raw)),
            note: if commits > 0 {
                format!("{:.1} writes/commit", writes as f64 / commits as f64)
            } else {
                String::new()
            },
        });
    }
    rows
}

async fn redis_rows(settings: &Settings) -> Vec<Row> {
    let url = &settings.redis_url;
    let store = match RedisStore::connect(url).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("Redis: {e}");
            let skipped = format!("skipped (no Redis at {url})");
            return CONCURRENCY
                .iter()
                .map(|&threads| Row {
                    backend: "redis",
                    threads,
                    steps: Err(skipped.clone()),
                    ceiling: None,
                    note: String::new(),
                })
                .collect();
        }
    };
    // A fresh prefix, deleted afterwards: the server may hold other data, so never FLUSH.
    let prefix = format!("keel-bench-{}:", uuid::Uuid::new_v4().simple());
    let store = store.with_prefix(&prefix);
    let tasks: Arc<dyn TaskManager> = Arc::new(store.clone());
    let threads: Arc<dyn ThreadStore> = Arc::new(store);
    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        let label = format!("SET, {concurrency} concurrent, 1 connection");
        let ceiling = async {
            ceiling::redis_sets(url, &prefix, concurrency, settings.warm_up()).await?;
            ceiling::redis_sets(url, &prefix, concurrency, settings.duration).await
        }
        .await
        .map_err(|e| e.to_string());
        rows.push(Row {
            backend: "redis",
            threads: concurrency,
            steps: measure_steps(settings, &tasks, &threads, concurrency).await,
            ceiling: Some((label, ceiling)),
            note: String::new(),
        });
    }
    match ceiling::delete_keys(url, &prefix).await {
        Ok(n) => eprintln!("Redis: deleted the {n} keys under `{prefix}`"),
        Err(e) => eprintln!("Redis: could not delete the keys under `{prefix}`: {e}"),
    }
    rows
}

/// The Postgres rows, in a fresh schema of the server at `KEEL_POSTGRES_URL` (dropped after):
/// each beside single-row commits on as many connections as the store's pool holds.
async fn postgres_rows(settings: &Settings) -> Vec<Row> {
    use keel_store_postgres::testing::TestSchema;
    let skipped = |why: String| {
        eprintln!("PostgreSQL: {why}");
        CONCURRENCY
            .iter()
            .map(|&threads| Row {
                backend: "postgres",
                threads,
                steps: Err(format!("skipped ({why})")),
                ceiling: None,
                note: String::new(),
            })
            .collect()
    };
    let schema = match TestSchema::new().await {
        Ok(schema) => schema,
        Err(e) => return skipped(e.to_string()),
    };
    let store = match keel_store_postgres::PostgresStore::connect_with_pool_size(
        &schema.url,
        POSTGRES_POOL,
    )
    .await
    {
        Ok(store) => store,
        Err(e) => return skipped(e.to_string()),
    };
    let tasks: Arc<dyn TaskManager> = Arc::new(store.clone());
    let threads: Arc<dyn ThreadStore> = Arc::new(store);
    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        let connections = concurrency.min(POSTGRES_POOL);
        let label = format!("INSERT, 1 commit each, {connections} conn.");
        let ceiling = async {
            ceiling::postgres_commits(&schema.url, connections, settings.warm_up()).await?;
            ceiling::postgres_commits(&schema.url, connections, settings.duration).await
        }
        .await
        .map_err(|e| e.to_string());
        rows.push(Row {
            backend: "postgres",
            threads: concurrency,
            steps: measure_steps(settings, &tasks, &threads, concurrency).await,
            ceiling: Some((label, ceiling)),
            note: "3 statements/step (1 each)".to_owned(),
        });
    }
    drop((tasks, threads));
    if let Err(e) = schema.drop_schema().await {
        eprintln!("PostgreSQL: could not drop the bench schema: {e}");
    }
    rows
}

/// The Postgres store's pool size in the bench (its default).
const POSTGRES_POOL: usize = 16;

/// `path (fstype)`, from the longest matching mount point in `/proc/mounts` (Linux), with a
/// warning on a RAM-backed file system, where fsync costs nothing and the figures mislead.
fn describe_location(path: &Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let fs_type = std::fs::read_to_string("/proc/mounts")
        .ok()
        .and_then(|mounts| {
            mounts
                .lines()
                .filter_map(|line| {
                    let mut fields = line.split_whitespace();
                    let (_, mount, fs) = (fields.next()?, fields.next()?, fields.next()?);
                    path.starts_with(mount)
                        .then(|| (mount.len(), fs.to_owned()))
                })
                .max()
                .map(|(_, fs)| fs)
        });
    match fs_type.as_deref() {
        Some(fs @ ("tmpfs" | "ramfs")) => format!(
            "{} ({fs}: fsync is free there, so these SQLite figures overstate a disk; set \
             KEEL_BENCH_DIR to a directory on one)",
            path.display()
        ),
        Some(fs) => format!("{} ({fs})", path.display()),
        None => path.display().to_string(),
    }
}

fn group_digits(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nKeel stores: persisted steps/s (a step = append_history of 2 messages under the \
             thread's lease + add_task_event + save_task; lease taken once per thread)"
        )?;
        writeln!(
            f,
            "{} s per figure; SQLite in {}; Redis at {}; PostgreSQL at {}\n",
            self.settings.duration.as_secs_f64(),
            self.sqlite_location,
            self.settings.redis_url,
            keel_store_postgres::testing::server_url()
        )?;
        writeln!(
            f,
            "{:<8} {:>7} {:>10}   {:<38} {:>10} {:>8}   notes",
            "backend", "threads", "steps/s", "ceiling (same run)", "ceiling/s", "ratio"
        )?;
        writeln!(f, "{}", "-".repeat(100))?;
        for row in &self.rows {
            let steps = match &row.steps {
                Ok(rate) => group_digits(rate.per_sec()),
                Err(why) => {
                    writeln!(f, "{:<8} {:>7}   {why}", row.backend, row.threads)?;
                    continue;
                }
            };
            let (label, ceiling, ratio) = match &row.ceiling {
                None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
                Some((label, Ok(ceiling))) => {
                    let ratio = row.steps.as_ref().map_or(0.0, Rate::per_sec) / ceiling.per_sec();
                    (
                        label.clone(),
                        group_digits(ceiling.per_sec()),
                        format!("{ratio:.2}"),
                    )
                }
                Some((label, Err(why))) => (label.clone(), format!("failed: {why}"), "-".into()),
            };
            writeln!(
                f,
                "{:<8} {:>7} {:>10}   {:<38} {:>10} {:>8}   {}",
                row.backend, row.threads, steps, label, ceiling, ratio, row.note
            )?;
        }
        writeln!(
            f,
            "\nratio = steps/s ÷ ceiling ops/s. A step is 3 store calls; at 1 thread each is its \
             own commit or round trip, so ~0.33 means the store costs next to nothing beyond \
             the medium. SQLite admits one writer at a time, so one connection's commit rate is \
             its ceiling at any concurrency; group commit lets concurrent steps share fsyncs \
             and pass it. Each ceiling is measured right before its row."
        )
    }
}

/// A positive count from the environment variable `name`, else `default`.
pub fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}
