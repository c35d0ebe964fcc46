//! The raw ceilings the store figures are read against, measured with the same libraries the
//! stores use but none of their logic: SQLite commits through rusqlite, Redis `SET`s through
//! the redis crate's `ConnectionManager`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use rusqlite::Connection;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::Rate;

/// A payload about the size of one step's records.
fn payload() -> String {
    format!(r#"{{"format":1,"data":{{"text":"{}"}}}}"#, "x".repeat(400))
}

/// One `INSERT` per transaction (autocommit), one connection, for `duration`, with the
/// pragmas the SQLite store uses: WAL and `synchronous=FULL`, so every commit fsyncs the WAL.
/// Blocking: call it off the async runtime.
pub fn sqlite_commits(path: &Path, duration: Duration) -> rusqlite::Result<Rate> {
    let conn = Connection::open(path)?;
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
    )?;
    let body = payload();
    let mut insert = conn.prepare("INSERT INTO raw (body) VALUES (?1)")?;
    let began = std::time::Instant::now();
    let deadline = began + duration;
    let mut ops = 0;
    while std::time::Instant::now() < deadline {
        insert.execute([&body])?;
        ops += 1;
    }
    Ok(Rate {
        ops,
        elapsed: began.elapsed(),
    })
}

/// `SET` throughput: `concurrency` tasks sharing one multiplexed `ConnectionManager` (as the
/// Redis store's clones do), each setting its own key under `prefix` in a loop.
pub async fn redis_sets(
    url: &str,
    prefix: &str,
    concurrency: usize,
    duration: Duration,
) -> redis::RedisResult<Rate> {
    let connection = ConnectionManager::new(redis::Client::open(url)?).await?;
    let body: Arc<str> = payload().into();
    let start = Arc::new(Barrier::new(concurrency + 1));
    let mut workers = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let (mut con, body, start) = (connection.clone(), body.clone(), start.clone());
        let key = format!("{prefix}raw-set:{i}");
        workers.push(tokio::spawn(async move {
            start.wait().await;
            let deadline = Instant::now() + duration;
            let mut ops = 0u64;
            while Instant::now() < deadline {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&*body)
                    .query_async::<()>(&mut con)
                    .await?;
                ops += 1;
            }
            Ok::<_, redis::RedisError>(ops)
        }));
    }
    start.wait().await;
    let began = Instant::now();
    let mut ops = 0;
    for worker in workers {
        ops += worker.await.map_err(|e| {
            redis::RedisError::from(std::io::Error::other(format!("a SET task failed: {e}")))
        })??;
    }
    Ok(Rate {
        ops,
        elapsed: began.elapsed(),
    })
}

/// Single-row commits with `synchronous_commit = on` (each waits for its WAL flush):
/// `connections` connections to `url` (whose `search_path` names a fresh schema), each
/// inserting one row per transaction in a loop, as the Postgres store's pool does.
pub async fn postgres_commits(
    url: &str,
    connections: usize,
    duration: Duration,
) -> Result<Rate, tokio_postgres::Error> {
    let body: Arc<str> = payload().into();
    let start = Arc::new(Barrier::new(connections + 1));
    let mut workers = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(
                "SET synchronous_commit = on; \
                 CREATE TABLE IF NOT EXISTS raw (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)",
            )
            .await?;
        let (body, start) = (body.clone(), start.clone());
        workers.push(tokio::spawn(async move {
            let insert = client.prepare("INSERT INTO raw (body) VALUES ($1)").await?;
            start.wait().await;
            let deadline = Instant::now() + duration;
            let mut ops = 0u64;
            while Instant::now() < deadline {
                client.execute(&insert, &[&&*body]).await?;
                ops += 1;
            }
            Ok::<_, tokio_postgres::Error>(ops)
        }));
    }
    start.wait().await;
    let began = Instant::now();
    let mut ops = 0;
    for worker in workers {
        // A worker that panicked counts nothing; its error, if any, is the figure's.
        ops += worker.await.unwrap_or(Ok(0))?;
    }
    Ok(Rate {
        ops,
        elapsed: began.elapsed(),
    })
}

/// Delete every key under `prefix` (SCAN + DEL, never FLUSH); answers how many.
pub async fn delete_keys(url: &str, prefix: &str) -> redis::RedisResult<u64> {
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await?;
        if !keys.is_empty() {
            deleted += redis::cmd("DEL")
                .arg(&keys)
                .query_async::<u64>(&mut con)
                .await?;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}
