//! Making sure a Redis answers for the tests: reuse one that answers PING, else start a throwaway `redis-server`.
//!
//! std only and self-contained: xtask uses all of it, and the root tests include this very
//! file (`tests/support`) to find the Redis they need the same way.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Redis URL used when `REDIS_URL` is unset.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// A Redis the tests can use; a server we started is killed when this is dropped.
pub struct Redis {
    /// The URL to hand to the tests as `REDIS_URL`.
    pub url: String,
    child: Option<Child>,
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Redis URL the tests use: `REDIS_URL`, else [`DEFAULT_URL`].
pub fn url_from_env() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// Whether a Redis at `url` answers PING.
pub fn answers_ping(url: &str) -> bool {
    host_port(url).is_some_and(|hp| ping(&hp))
}

/// Finds or starts a Redis; `None` (after a warning) when neither is possible.
pub fn ensure() -> Option<Redis> {
    let url = url_from_env();
    if answers_ping(&url) {
        println!("Redis answers PING at {url}");
        return Some(Redis { url, child: None });
    }
    match start() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!(
                "WARNING: nothing answers PING at {url} and `redis-server` is not on PATH; \
                 continuing without Redis"
            );
            None
        }
        Ok(redis) => {
            println!("started redis-server for this run at {}", redis.url);
            Some(redis)
        }
        Err(e) => {
            println!("WARNING: could not start redis-server ({e}); continuing without Redis");
            None
        }
    }
}

/// Starts `redis-server` on a free port and waits (up to 10 s) until it answers PING; an
/// error of kind `NotFound` means there is no `redis-server` to start.
fn start() -> Result<Redis, std::io::Error> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| std::io::Error::other(format!("no free port: {e}")))?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--daemonize", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    // Constructed before waiting so the child is killed on every early return.
    let mut redis = Redis {
        url: format!("redis://127.0.0.1:{port}"),
        child: Some(child),
    };
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if ping(&addr) {
            return Ok(redis);
        }
        if let Some(Ok(Some(status))) = redis.child.as_mut().map(Child::try_wait) {
            return Err(std::io::Error::other(format!(
                "redis-server exited early ({status})"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(std::io::Error::other(
        "redis-server did not answer PING within 10 s",
    ))
}

/// `host:port` out of `redis://[user:pass@]host[:port][/db]`.
fn host_port(url: &str) -> Option<String> {
    let rest = url.strip_prefix("redis://")?;
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit('@').next()?;
    if host_port.is_empty() {
        None
    } else if host_port.contains(':') {
        Some(host_port.to_owned())
    } else {
        Some(format!("{host_port}:6379"))
    }
}

/// Whether a server at `addr` answers an inline `PING` with `+PONG`.
fn ping(addr: &str) -> bool {
    let timeout = Duration::from_millis(500);
    let Some(sock) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&sock, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(stream.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}
