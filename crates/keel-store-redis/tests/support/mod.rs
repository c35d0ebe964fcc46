//! What the Redis tests share: the server from `REDIS_URL`, a fresh key prefix per test, and
//! cleanup of that prefix's keys (never `FLUSHALL`: the server may hold other data).

#![allow(dead_code)] // each test file uses a different subset

use keel_runtime::KvLimits;
use keel_store_redis::RedisStore;

/// The server under test: `REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A prefix no other test uses.
pub fn fresh_prefix() -> String {
    format!("keel-test-{}:", uuid::Uuid::new_v4().simple())
}

/// A store on the test server under `prefix`. A server that does not answer fails the test:
/// CI always provides Redis, so a silent skip would hide a broken setup.
pub async fn store(prefix: &str) -> RedisStore {
    match RedisStore::connect(&redis_url()).await {
        Ok(store) => store.with_prefix(prefix),
        Err(err) => panic!(
            "the Redis tests need a server at REDIS_URL ({}), and it did not answer: {err}\n\
             start one (e.g. `redis-server --appendonly yes`) or point REDIS_URL at one",
            redis_url()
        ),
    }
}

/// [`store`] with a key-count cap of `max_keys` per thread (the other limits the defaults):
/// a cap small enough for a test to reach.
pub async fn capped_store(prefix: &str, max_keys: usize) -> RedisStore {
    let limits = KvLimits {
        max_keys,
        ..KvLimits::DEFAULT
    };
    store(prefix).await.with_kv_limits(limits)
}

/// A raw connection, for inspecting and corrupting keys behind the store's back. Its reply
/// timeout is generous: the client's default (500 ms) is too short for SCAN on a busy shared
/// server (several test binaries at once), and a timed-out cleanup leaves keys behind.
pub async fn raw() -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
        .set_response_timeout(Some(std::time::Duration::from_secs(30)));
    redis::Client::open(redis_url())
        .expect("REDIS_URL parses")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("raw connection to the test Redis")
}

/// A store under a fresh prefix, with the prefix (for [`clean_up`]): how most tests start.
pub async fn fresh_store() -> (String, RedisStore) {
    let prefix = fresh_prefix();
    let store = store(&prefix).await;
    (prefix, store)
}

/// Two stores on the test server under the same fresh prefix (returned first, for
/// [`clean_up`]): two processes sharing one Redis.
pub async fn fresh_two_stores() -> (String, RedisStore, RedisStore) {
    let prefix = fresh_prefix();
    let (a, b) = (store(&prefix).await, store(&prefix).await);
    (prefix, a, b)
}

/// Run one command (its name and arguments) on `con`, behind the store's back: how a test
/// corrupts or removes what the store wrote.
pub async fn raw_cmd(con: &mut redis::aio::MultiplexedConnection, command: &[&str]) {
    let (name, args) = command.split_first().expect("a command");
    redis::cmd(name)
        .arg(args)
        .query_async::<()>(con)
        .await
        .unwrap_or_else(|err| panic!("{command:?}: {err}"));
}

/// Every key under `prefix`.
pub async fn keys_under(prefix: &str) -> Vec<String> {
    let mut con = raw().await;
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(500)
            .query_async(&mut con)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Delete every key under `prefix` (SCAN + DEL; the prefix is unique to the test).
pub async fn clean_up(prefix: &str) {
    delete_keys(&keys_under(prefix).await).await;
}

/// Delete `keys`, a few hundred at a time.
pub async fn delete_keys(keys: &[String]) {
    let mut con = raw().await;
    for chunk in keys.chunks(500) {
        redis::cmd("DEL")
            .arg(chunk)
            .query_async::<()>(&mut con)
            .await
            .expect("DEL");
    }
}
