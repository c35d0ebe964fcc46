//! A PostgreSQL started from the installed binaries (`/usr/lib/postgresql/*/bin`) in a
//! directory of its own and on a free port. std only: `cargo xtask` includes this file (with
//! `#[path]`) to start a server for CI, and [`PrivateServer`](super::PrivateServer) wraps it
//! for the tests that restart the database, so both start it the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A server whose data directory is `<dir>/data`, with its socket and log in `<dir>`.
/// Stopped (immediately: its data is throwaway) when dropped.
#[derive(Debug)]
pub struct LocalServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    root: bool,
}

impl LocalServer {
    /// A server on the existing directory `dir` and a free port, not started yet; `Ok(None)`
    /// when no PostgreSQL is installed to start one.
    pub fn new(dir: &Path) -> Result<Option<LocalServer>, String> {
        let Some(bin) = installed_bin() else {
            return Ok(None);
        };
        // PostgreSQL refuses to run as root: as root, run it as the `postgres` user.
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        if root {
            run(Command::new("chown").args(["-R", "postgres:"]).arg(dir))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        Ok(Some(LocalServer {
            bin,
            dir: dir.to_owned(),
            port,
            root,
        }))
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of its database `db`.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// Create the data directory (trust auth, user `postgres`) unless it holds one already.
    pub fn init(&self) -> Result<(), String> {
        if self.data().join("PG_VERSION").exists() {
            return Ok(());
        }
        run(self
            .command("initdb")
            .arg("-D")
            .arg(self.data())
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .stdout(Stdio::null()))
    }

    /// `pg_ctl <action>` (start, restart; a fast shutdown drops clients' connections),
    /// waiting until the server answers.
    pub fn pg_ctl(&self, action: &str) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        run(self
            .command("pg_ctl")
            .arg(action)
            .arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "-o", &options, "-l"])
            .arg(self.dir.join("log"))
            .stdout(Stdio::null()))
    }

    /// `program` of the installed binaries, run as the `postgres` user when we are root.
    pub fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
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

/// Run `cmd`; its failure as text.
fn run(cmd: &mut Command) -> Result<(), String> {
    match cmd.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("{cmd:?} failed ({status})")),
        Err(e) => Err(format!("{cmd:?} did not start: {e}")),
    }
}
