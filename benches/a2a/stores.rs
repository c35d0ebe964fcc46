//! What the stores under Keel do on their own and what one SendMessage costs them, read in
//! the same run as Keel's figures, so that each store row can be judged against its ceiling:
//!
//! - the raw ceiling of each durable store (`store_bench::ceiling`): one-row commits per
//!   second on SQLite (one connection, WAL, `synchronous=FULL`) and on PostgreSQL
//!   (`synchronous_commit = on`, as many connections as wrk's largest figure), and Redis
//!   `SET`s per second at that concurrency, beside Keel's blocking SendMessage at that
//!   concurrency and the ratio;
//! - per SendMessage, read from the store's own counters around the sends of the memory
//!   figures: Redis commands (`INFO stats`), PostgreSQL transactions and WAL bytes
//!   (`pg_stat_database`, `pg_stat_wal`), and the growth of the SQLite file.

use std::path::Path;
use std::time::Duration;

use crate::servers::{Kind, Store};
use crate::{postgres, redis_root, Bench};

/// One raw ceiling line per durable store of the run, beside `keel_rate`, Keel's blocking
/// SendMessage per second at `connections` on that store (when the run measured it).
pub fn ceilings(
    bench: &mut Bench,
    connections: usize,
    keel_rate: impl Fn(Store) -> Option<f64>,
) -> Result<(), String> {
    let secs = Duration::from_secs(bench.settings.secs);
    let durable: Vec<Store> = bench
        .settings
        .stores
        .iter()
        .copied()
        .filter(|s| *s != Store::Memory)
        .collect();
    if durable.is_empty() {
        return Ok(());
    }
    println!("store ceilings, same run: what the store does alone, beside Keel's blocking SendMessage at {connections} connections");
    println!(
        "{:<9} {:<38} {:>10} {:>14} {:>9}",
        "store", "ceiling", "ops/s", "SendMessage/s", "keel/raw"
    );
    for store in durable {
        let (what, rate) = match store {
            Store::Sqlite => {
                let n = bench.next();
                let path = bench.bins.dir.join(format!("raw-{n}.db"));
                let rate = store_bench::ceiling::sqlite_commits(&path, secs)
                    .map_err(|e| format!("SQLite ceiling: {e}"))?;
                ("one-row commits, 1 connection, FULL", rate)
            }
            Store::Redis => {
                let (url, prefix) = (bench.settings.redis_url.clone(), redis_root());
                let rate = block_on(store_bench::ceiling::redis_sets(
                    &url,
                    &prefix,
                    connections,
                    secs,
                ))?
                .map_err(|e| format!("Redis ceiling: {e}"))?;
                ("SETs, shared connection", rate)
            }
            Store::Postgres => {
                let schema = postgres(keel_store_postgres::testing::TestSchema::new())?;
                let url = schema.url.clone();
                bench.schemas.push(schema);
                let rate = block_on(store_bench::ceiling::postgres_commits(
                    &url,
                    connections,
                    secs,
                ))?
                .map_err(|e| format!("PostgreSQL ceiling: {e}"))?;
                ("one-row commits, synchronous_commit=on", rate)
            }
            Store::Memory => continue,
        };
        let raw = rate.per_sec();
        let (keel, ratio) = match keel_rate(store) {
            Some(keel) => (format!("{keel:.0}"), format!("{:.2}x", keel / raw)),
            None => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "{:<9} {:<38} {:>10.0} {:>14} {:>9}",
            store.name(),
            what,
            raw,
            keel,
            ratio
        );
    }
    println!();
    Ok(())
}

/// Runs one future to its end on a runtime of its own (the bench itself is synchronous).
pub fn block_on<T>(work: impl std::future::Future<Output = T>) -> Result<T, String> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(work))
}

/// A store's own counters, read before and after sends to a Keel server on it.
pub enum Counters {
    /// Redis: commands processed, those run by scripts included (the whole server: the
    /// bench is its only client).
    Redis(u64),
    /// PostgreSQL: transactions committed in the database, and WAL bytes of the cluster.
    Postgres { commits: i64, wal_bytes: i64 },
    /// SQLite: the size of the database file and its WAL (a stopped server has
    /// checkpointed its WAL into the file).
    Sqlite(u64),
    /// Nothing to read (memory, the peers).
    None,
}

impl Counters {
    /// The counters of the store at `place` of a `kind` server (running or stopped).
    pub fn read_place(bench: &Bench, kind: Kind, place: Option<&str>) -> Counters {
        let read = match (kind, place) {
            (Kind::Keel(Store::Redis), _) => {
                redis_commands(&bench.settings.redis_url).map(Counters::Redis)
            }
            (Kind::Keel(Store::Postgres), Some(url)) => postgres_counters(url),
            (Kind::Keel(Store::Sqlite), Some(path)) => Ok(Counters::Sqlite(file_bytes(path))),
            _ => Ok(Counters::None),
        };
        read.unwrap_or_else(|e| {
            println!(
                "note: cannot read the {} store's counters: {e}",
                kind.store()
            );
            Counters::None
        })
    }

    /// What the store did per send between `self` and `after`, for the memory table.
    pub fn per_send(&self, after: &Counters, sends: u64) -> String {
        let per = |d: f64| d / sends.max(1) as f64;
        match (self, after) {
            (Counters::Redis(a), Counters::Redis(b)) => {
                format!(
                    "{:.1} Redis commands (those its scripts run included)",
                    per(b.saturating_sub(*a) as f64)
                )
            }
            (
                Counters::Postgres {
                    commits: c0,
                    wal_bytes: w0,
                },
                Counters::Postgres {
                    commits: c1,
                    wal_bytes: w1,
                },
            ) => format!(
                "{:.1} transactions, {:.0} WAL bytes",
                per((c1 - c0) as f64),
                per((w1 - w0) as f64)
            ),
            (Counters::Sqlite(a), Counters::Sqlite(b)) => {
                format!("{:.0} file bytes", per(b.saturating_sub(*a) as f64))
            }
            _ => "-".to_owned(),
        }
    }
}

/// What a Keel server on SQLite asked of its store, from its `/metrics` (served with
/// `--metrics`): writes, commits, reads and read transactions, in that order
/// (`keel_sqlite_*_total`, docs/observability.md).
pub fn sqlite_work(port: u16) -> Result<[f64; 4], String> {
    let response = crate::http::get(port, "/metrics", std::time::Duration::from_secs(10))
        .map_err(|e| format!("GET /metrics: {e}"))?;
    if response.status != 200 {
        return Err(format!("GET /metrics answered {}", response.status));
    }
    let value = |name: &str| {
        response
            .body
            .lines()
            .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .filter_map(|value| value.trim().parse::<f64>().ok())
            .sum::<f64>()
    };
    Ok([
        value("keel_sqlite_writes_total"),
        value("keel_sqlite_commits_total"),
        value("keel_sqlite_reads_total"),
        value("keel_sqlite_read_transactions_total"),
    ])
}

/// `[writes, commits, reads, read transactions]` between two [`sqlite_work`] readings, per
/// send.
pub fn sqlite_work_per_send(before: [f64; 4], after: [f64; 4], sends: u64) -> String {
    let per = |i: usize| (after[i] - before[i]) / sends.max(1) as f64;
    format!(
        "{:.1} writes in {:.2} commits, {:.1} reads in {:.1} read transactions",
        per(0),
        per(1),
        per(2),
        per(3)
    )
}

/// `total_commands_processed` of the Redis at `url`.
fn redis_commands(url: &str) -> Result<u64, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client.get_connection().map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut con)
        .map_err(|e| e.to_string())?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "INFO stats has no total_commands_processed".to_owned())
}

/// Transactions committed in the database of `url` and WAL bytes written by its cluster.
/// A server's backends report their counts when they exit (or every few seconds): read
/// after the Keel server has stopped.
fn postgres_counters(url: &str) -> Result<Counters, String> {
    block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let row = client
            .query_one(
                "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                        (SELECT wal_bytes::bigint FROM pg_stat_wal)",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(Counters::Postgres {
            commits: row.get(0),
            wal_bytes: row.get(1),
        })
    })?
}

/// The bytes of a SQLite database file and its WAL.
fn file_bytes(path: &str) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    size(Path::new(path)) + size(Path::new(&format!("{path}-wal")))
}
