//! Making sure a PostgreSQL answers for the tests: reuse the one at `KEEL_POSTGRES_URL` (or
//! 127.0.0.1:5432), else start a throwaway one from the installed binaries
//! (`/usr/lib/postgresql/*/bin`) in a data directory kept under `target/`, else say what to
//! install.
//!
//! std only: the server is checked with the protocol's first message (an SSL request, which
//! every server answers with one byte) rather than a client library.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util;

/// The environment variable the tests read.
pub const URL_VAR: &str = "KEEL_POSTGRES_URL";
/// The URL used when [`URL_VAR`] is unset (trust auth, database `test`).
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

/// A PostgreSQL the tests can use; a server we started is stopped when this is dropped.
pub struct Postgres {
    /// The URL to hand to the tests as `KEEL_POSTGRES_URL`.
    pub url: String,
    started: Option<Started>,
}

/// A server this run started: the `postgres` process (under `runuser` when we are root, so
/// killing the child would not reach it) and how to stop it.
struct Started {
    child: Child,
    bin: PathBuf,
    data: PathBuf,
    root: bool,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(started) = self.started.as_mut() {
            // An immediate shutdown: the data is throwaway, and it stops every backend.
            let stopped = command(&started.bin, "pg_ctl", started.root)
                .arg("stop")
                .arg("-D")
                .arg(&started.data)
                .args(["-m", "immediate"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !stopped.is_ok_and(|s| s.success()) {
                let _ = started.child.kill();
            }
            let _ = started.child.wait();
        }
    }
}

/// Finds or starts a PostgreSQL; an error says what to install or set.
pub fn ensure() -> Result<Postgres, String> {
    let url = std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    if host_port(&url).is_some_and(|hp| answers(&hp)) {
        println!("PostgreSQL answers at {url}");
        return Ok(Postgres { url, started: None });
    }
    let Some(bin) = installed_bin() else {
        return Err(format!(
            "nothing answers at {URL_VAR} ({url}) and no PostgreSQL is installed to start one \
             (looked for /usr/lib/postgresql/*/bin/initdb): install it \
             (`apt-get install postgresql`) or point {URL_VAR} at a server"
        ));
    };
    let postgres = start(&bin)?;
    println!("started PostgreSQL for this run at {}", postgres.url);
    Ok(postgres)
}

/// The newest `/usr/lib/postgresql/<version>/bin` that has `initdb`.
fn installed_bin() -> Option<PathBuf> {
    let mut bins: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    bins.sort();
    bins.pop().map(|(_, bin)| bin)
}

/// Run `program` of `bin`, as the `postgres` user when we are root (PostgreSQL refuses to
/// run as root).
fn command(bin: &Path, program: &str, as_postgres: bool) -> Command {
    let program = bin.join(program);
    if as_postgres {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Whether this process runs as root.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// Initialise (once; the directory is kept between runs) and start a server on a free port,
/// wait until it answers and create the `test` database.
fn start(bin: &Path) -> Result<Postgres, String> {
    let root = is_root();
    let dir = util::workspace_root().join("target").join("postgres-ci");
    let data = dir.join("data");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    if root {
        util::status(Command::new("chown").args(["-R", "postgres:"]).arg(&dir))?;
    }
    if !data.join("PG_VERSION").exists() {
        util::status(
            command(bin, "initdb", root)
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "--auth=trust", "--no-sync"])
                .stdout(Stdio::null()),
        )?;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let child = command(bin, "postgres", root)
        .arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&dir)
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting postgres: {e}"))?;
    // Constructed before waiting so the server is stopped on every early return.
    let mut postgres = Postgres {
        url: format!("postgres://postgres@127.0.0.1:{port}/test?sslmode=disable"),
        started: Some(Started {
            child,
            bin: bin.to_owned(),
            data,
            root,
        }),
    };
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(&addr) {
        if let Some(Ok(Some(status))) = postgres.started.as_mut().map(|s| s.child.try_wait()) {
            return Err(format!("postgres exited early ({status})"));
        }
        if Instant::now() > deadline {
            return Err("postgres did not answer within 30 s".to_owned());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // `createdb` fails when `test` exists (a kept data directory): that is fine.
    let _ = command(bin, "createdb", false)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "test",
        ])
        .stderr(Stdio::null())
        .status();
    Ok(postgres)
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
        let bin = installed_bin().expect("PostgreSQL installed");
        let started = start(&bin).unwrap();
        assert!(answers(&host_port(&started.url).unwrap()));
    }
}
