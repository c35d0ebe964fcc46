//! The servers under test, each its own process pinned to CPU 0 (`taskset -c 0`): the release
//! `keel serve` on one store, the bare axum peer and the A2A SDK peer. Started on a free port,
//! waited for until they answer HTTP, stopped with SIGTERM (then SIGKILL).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http;

/// Where Keel keeps its tasks in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Store {
    Memory,
    Sqlite,
    Redis,
    /// A fresh schema of the server at `KEEL_POSTGRES_URL`.
    Postgres,
}

impl Store {
    pub const ALL: [Store; 4] = [Store::Memory, Store::Sqlite, Store::Redis, Store::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Sqlite => "sqlite",
            Store::Redis => "redis",
            Store::Postgres => "postgres",
        }
    }
}

/// Which server a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Keel(Store),
    /// The baseline `keel` binary (`KEEL_BENCH_BASE_BIN`): an earlier build measured in the
    /// same run, so that a change's effect is not confused with the machine's mood.
    Base(Store),
    Bare,
    Sdk,
}

impl Kind {
    pub fn server(self) -> &'static str {
        match self {
            Kind::Keel(_) => "keel",
            Kind::Base(_) => "keel-base",
            Kind::Bare => "bare-axum",
            Kind::Sdk => "a2a-sdk",
        }
    }

    pub fn store(self) -> &'static str {
        match self {
            Kind::Keel(store) | Kind::Base(store) => store.name(),
            Kind::Bare => "-",
            Kind::Sdk => "memory",
        }
    }
}

/// The binaries and places a server needs.
pub struct Binaries {
    pub keel: PathBuf,
    /// The baseline `keel` binary, when one is compared.
    pub base: Option<PathBuf>,
    pub peers: PathBuf,
    /// Holds SQLite files and server logs; removed at exit.
    pub dir: PathBuf,
    pub redis_url: String,
}

/// A running server process.
pub struct Server {
    pub kind: Kind,
    pub port: u16,
    child: Child,
    log: PathBuf,
    /// The SQLite file or Redis key prefix of a Keel server (to reuse or clean up).
    pub place: Option<String>,
    /// From spawning the process to its first answer (for Keel: its agent card).
    pub started_in: Duration,
}

impl Server {
    /// Starts `kind` on a free port (Keel on `place`: a SQLite path, a Redis key prefix or a
    /// PostgreSQL URL naming a fresh schema) and
    /// waits until it answers.
    pub fn start(bins: &Binaries, kind: Kind, place: Option<String>) -> Result<Server, String> {
        Self::start_with(bins, kind, place, &[])
    }

    /// [`Server::start`] with more arguments for Keel's `keel serve` (say, `--llm`).
    pub fn start_with(
        bins: &Binaries,
        kind: Kind,
        place: Option<String>,
        extra: &[&str],
    ) -> Result<Server, String> {
        let port = free_port()?;
        let log = bins
            .dir
            .join(format!("{}-{}-{port}.log", kind.server(), kind.store()));
        let mut args: Vec<String> = Vec::new();
        let program = match kind {
            Kind::Keel(store) | Kind::Base(store) => {
                args.extend(["serve".into(), "--port".into(), port.to_string()]);
                match (store, &place) {
                    (Store::Memory, _) => args.extend(["--store".into(), "memory".into()]),
                    (Store::Sqlite, Some(path)) => {
                        args.extend(["--store".into(), format!("sqlite:{path}")]);
                    }
                    (Store::Redis, Some(prefix)) => args.extend([
                        "--store".into(),
                        bins.redis_url.clone(),
                        "--redis-prefix".into(),
                        prefix.clone(),
                    ]),
                    (Store::Postgres, Some(url)) => args.extend(["--store".into(), url.clone()]),
                    _ => return Err(format!("keel on {} needs a place", store.name())),
                }
                args.extend(extra.iter().map(|arg| (*arg).to_owned()));
                match kind {
                    Kind::Base(_) => bins.base.clone().ok_or("no baseline binary")?,
                    _ => bins.keel.clone(),
                }
            }
            Kind::Bare => {
                args.push(port.to_string());
                bins.peers.join("bare-peer")
            }
            Kind::Sdk => {
                args.push(port.to_string());
                bins.peers.join("sdk-peer")
            }
        };
        let spawned = Instant::now();
        let child = spawn_pinned(&program, &args, &log)?;
        let mut server = Server {
            kind,
            port,
            child,
            log,
            place,
            started_in: Duration::ZERO,
        };
        server.wait_answering(spawned, Duration::from_secs(30))?;
        server.started_in = spawned.elapsed();
        Ok(server)
    }

    /// Waits until the server answers HTTP (Keel: its agent card; the peers, which serve no
    /// card, answer 404 there, which is answering all the same).
    fn wait_answering(&mut self, started: Instant, limit: Duration) -> Result<(), String> {
        let need_card = matches!(self.kind, Kind::Keel(_) | Kind::Base(_));
        while started.elapsed() < limit {
            let answer = http::get(
                self.port,
                "/.well-known/agent-card.json",
                Duration::from_secs(1),
            );
            if let Ok(response) = answer {
                if !need_card || response.status == 200 {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "{} exited early ({status}); its log: {}",
                    self.kind.server(),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(format!(
            "{} did not answer within {limit:?}; its log: {}",
            self.kind.server(),
            self.log_tail()
        ))
    }

    /// The process's resident set size in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// SIGTERM, then SIGKILL after 10 s: Keel closes its store on SIGTERM, so a SQLite file
    /// it leaves is one a later `keel serve` opens as a user's would be.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Server {
    /// A server left running by an early return is killed.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `taskset -c 0 program args...`: taskset execs the program, so the child's pid is the
/// server's (for `/proc/<pid>/status`).
fn spawn_pinned(program: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    Command::new("taskset")
        .args(["-c", "0"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))
}

/// A port nothing listens on now (the kernel's pick, released at once for the server).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}
