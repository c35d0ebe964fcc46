//! Making sure a PostgreSQL answers for the tests: reuse the one at `KEEL_POSTGRES_URL` (or
//! 127.0.0.1:5432), else start a throwaway one from the installed binaries
//! (`/usr/lib/postgresql/*/bin`) in a data directory kept under `target/`, else say what to
//! install.
//!
//! std only: the server is checked with the protocol's first message (an SSL request, which
//! every server answers with one byte) rather than a client library.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::Stdio;
use std::time::Duration;

use crate::util;

/// How a server is started from the installed binaries: the same file as the tests' private
/// server (`keel_store_postgres::testing::LocalServer`), kept std only for this.
#[path = "../../crates/keel-store-postgres/src/testing/local_server.rs"]
mod local_server;

use local_server::LocalServer;

/// The environment variable the tests read.
pub const URL_VAR: &str = "KEEL_POSTGRES_URL";
/// The URL used when [`URL_VAR`] is unset (trust auth, database `test`).
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

/// A PostgreSQL the tests can use; a server we started is stopped when this is dropped.
pub struct Postgres {
    /// The URL to hand to the tests as `KEEL_POSTGRES_URL`.
    pub url: String,
    _started: Option<LocalServer>,
}

/// Finds or starts a PostgreSQL; an error says what to install or set.
pub fn ensure() -> Result<Postgres, String> {
    let url = std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    if host_port(&url).is_some_and(|hp| answers(&hp)) {
        println!("PostgreSQL answers at {url}");
        return Ok(Postgres {
            url,
            _started: None,
        });
    }
    let Some(postgres) = start()? else {
        return Err(format!(
            "nothing answers at {URL_VAR} ({url}) and no PostgreSQL is installed to start one \
             (looked for /usr/lib/postgresql/*/bin/initdb): install it \
             (`apt-get install postgresql`) or point {URL_VAR} at a server"
        ));
    };
    println!("started PostgreSQL for this run at {}", postgres.url);
    Ok(postgres)
}

/// Initialise (once; the directory is kept between runs under `target/`) and start a server
/// on a free port, and create the `test` database; `None` when none is installed.
fn start() -> Result<Option<Postgres>, String> {
    let dir = util::workspace_root().join("target").join("postgres-ci");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let Some(server) = LocalServer::new(&dir)? else {
        return Ok(None);
    };
    server.init()?;
    server.pg_ctl("start")?;
    // `createdb` fails when `test` exists (a kept data directory): that is fine.
    let _ = server
        .command("createdb")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(["-U", "postgres", "test"])
        .stderr(Stdio::null())
        .status();
    Ok(Some(Postgres {
        url: server.url("test"),
        _started: Some(server),
    }))
}

/// `host:port` out of `postgres://[user[:pass]@]host[:port][/db][?...]`.
fn host_port(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit('@').next()?;
    if host_port.is_empty() {
        None
    } else if host_port.contains(':') {
        Some(host_port.to_owned())
    } else {
        Some(format!("{host_port}:5432"))
    }
}

/// Whether a PostgreSQL at `addr` answers an SSL request (`S` or `N`).
fn answers(addr: &str) -> bool {
    let timeout = Duration::from_millis(500);
    let Some(sock) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&sock, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    // Length 8, then the SSLRequest code 80877103.
    let request = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    if stream.write_all(&request).is_err() {
        return false;
    }
    let mut reply = [0u8; 1];
    matches!(stream.read(&mut reply), Ok(1) if matches!(reply[0], b'S' | b'N'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_reads_every_url_form() {
        assert_eq!(host_port(DEFAULT_URL).as_deref(), Some("127.0.0.1:5432"));
        assert_eq!(
            host_port("postgresql://u:p@db:6000/x").as_deref(),
            Some("db:6000")
        );
        assert_eq!(
            host_port("postgres://db?sslmode=disable").as_deref(),
            Some("db:5432")
        );
        assert_eq!(host_port("redis://db"), None);
    }

    /// Starts a server from the installed binaries (slow, needs them: `--ignored`).
    #[test]
    #[ignore]
    fn a_server_started_from_the_installed_binaries_answers() {
        let started = start().unwrap().expect("PostgreSQL installed");
        assert!(answers(&host_port(&started.url).unwrap()));
    }
}
