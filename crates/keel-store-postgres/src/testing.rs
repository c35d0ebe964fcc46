//! A fresh schema per test on the PostgreSQL server named by `KEEL_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`): what Keel's own Postgres tests share, so that
//! tests running at once never see each other's rows; and a private server of a test's own
//! ([`PrivateServer`]) for the tests that restart the database.

use keel_core::{AgentError, AgentResult};

use crate::PostgresStore;

/// The environment variable naming the test server.
pub const URL_VAR: &str = "KEEL_POSTGRES_URL";
/// The server used when [`URL_VAR`] is unset.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

/// The test server's URL.
pub fn server_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A schema of its own on the test server, for one test. Drop it with
/// [`TestSchema::drop_schema`] at the end (a test that fails leaves it behind, to look at).
#[derive(Debug, Clone)]
pub struct TestSchema {
    /// The schema's name (`t_<random>`).
    pub name: String,
    /// A URL whose connections use the schema (`search_path`).
    pub url: String,
}

impl TestSchema {
    /// Create a fresh schema. A server that does not answer fails with a message saying how
    /// to provide one: CI always does, so a silent skip would hide a broken setup.
    pub async fn new() -> AgentResult<TestSchema> {
        let base = server_url();
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        admin(&base, &format!("CREATE SCHEMA {name}")).await?;
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-c%20search_path%3D{name}");
        Ok(TestSchema { name, url })
    }

    /// A store on the schema.
    pub async fn store(&self) -> AgentResult<PostgresStore> {
        PostgresStore::connect_with_pool_size(&self.url, 4).await
    }

    /// A fresh schema ([`TestSchema::new`]) and a store on it: what most tests start with.
    pub async fn with_store() -> AgentResult<(TestSchema, PostgresStore)> {
        let schema = TestSchema::new().await?;
        let store = schema.store().await?;
        Ok((schema, store))
    }

    /// A store on the schema (a pool of 2) whose connections carry a fresh name, returned
    /// with it, for [`TestSchema::end_connections`] to end them as a server restart does.
    pub async fn named_store(&self) -> AgentResult<(String, PostgresStore)> {
        let name = format!("keel_{}", uuid::Uuid::new_v4().simple());
        let url = format!("{}&application_name={name}", self.url);
        Ok((name, PostgresStore::connect_with_pool_size(&url, 2).await?))
    }

    /// End every connection named `name` (see [`TestSchema::named_store`]), as a server
    /// restart does: pooled ones and a store's change listener alike.
    pub async fn end_connections(&self, name: &str) -> AgentResult<()> {
        admin(
            &server_url(),
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = '{}'",
                name.replace('\'', "''")
            ),
        )
        .await
    }

    /// Drop the schema and everything in it.
    ///
    /// The test is over, so a connection still holding a lock in the schema is ended first:
    /// a store whose connections live on a runtime that is blocked waiting for this drop (a
    /// test's runtime dropping its last handle) would otherwise never commit, and the drop
    /// would wait on its lock forever. A lock taken between the two statements fails the drop
    /// after `lock_timeout` instead of hanging, and the drop is tried again.
    pub async fn drop_schema(self) -> AgentResult<()> {
        let name = &self.name;
        let sql = format!(
            "SET lock_timeout = '2s';
             SELECT pg_terminate_backend(l.pid) FROM pg_locks l
                 JOIN pg_class c ON c.oid = l.relation
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = '{name}' AND l.pid <> pg_backend_pid();
             DROP SCHEMA IF EXISTS {name} CASCADE"
        );
        let mut tries = 0;
        loop {
            tries += 1;
            match admin(&server_url(), &sql).await {
                Err(_) if tries < 5 => continue,
                result => return result,
            }
        }
    }
}

/// Run `sql` on a connection of its own to `url`.
async fn admin(url: &str, sql: &str) -> AgentResult<()> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| {
            AgentError::storage(format!(
                "the PostgreSQL tests need a server at {URL_VAR} ({url}), and it did not \
                 answer: {e}; start one (`cargo xtask ci` does) or point {URL_VAR} at one"
            ))
        })?;
    let driver = tokio::spawn(connection);
    let result = client
        .batch_execute(sql)
        .await
        .map_err(crate::error::doing("preparing a test schema"));
    drop(client);
    let _ = driver.await;
    result
}

mod local_server;

pub use local_server::LocalServer;

/// A PostgreSQL of a test's own, started from the installed binaries
/// (`/usr/lib/postgresql/*/bin`) on a data directory in a temp dir and a free port: for the
/// tests that restart the database, which must never restart the server other tests share.
/// Stopped (immediately) when dropped.
#[derive(Debug)]
pub struct PrivateServer {
    // Declared before the directory, so the server stops before its directory goes.
    server: LocalServer,
    _dir: tempfile::TempDir,
}

impl PrivateServer {
    /// Initialize and start one; `None` when no PostgreSQL is installed to start one.
    ///
    /// # Panics
    ///
    /// When the installed binaries fail to initialize or start it (a test helper: the test
    /// cannot go on).
    pub fn start() -> Option<PrivateServer> {
        let dir = tempfile::tempdir().expect("a temp dir for the data directory");
        let server = LocalServer::new(dir.path()).expect("a free port")?;
        server.init().expect("initdb");
        server.pg_ctl("start").expect("pg_ctl start");
        Some(PrivateServer { server, _dir: dir })
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        self.server.url("postgres")
    }

    /// Restart it with a fast shutdown (clients' connections are dropped), waiting until it
    /// answers again.
    pub fn restart(&self) {
        self.server.pg_ctl("restart").expect("pg_ctl restart");
    }
}
