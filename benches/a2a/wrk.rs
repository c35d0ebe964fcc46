//! Running `wrk` on CPU 1 with the bench's Lua script (`load.lua`) and reading the summary
//! line the script prints when it is done (requests, duration, p50, p99, errors).

use std::path::Path;
use std::process::Command;

/// What one wrk run measured.
#[derive(Clone, Copy, Debug)]
pub struct Figure {
    pub per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

/// One load: `connections` keep-alive connections on one wrk thread against 127.0.0.1:`port`.
pub struct Load<'a> {
    pub script: &'a Path,
    pub port: u16,
    pub connections: u32,
    pub seconds: u64,
    /// The script's arguments: scenario, messageId prefix, task id.
    pub scenario: &'a str,
    pub prefix: &'a str,
    pub task_id: &'a str,
    /// Each connection's first request starts at a random moment within this many
    /// milliseconds (0: all at once), as conversations arrive over time.
    pub ramp_ms: u64,
}

impl Load<'_> {
    /// Runs wrk pinned to CPU 1 (the servers are on CPU 0) and parses its summary.
    pub fn run(&self) -> Result<Figure, String> {
        let output = Command::new("taskset")
            .args(["-c", "1", "wrk", "-t1"])
            .arg(format!("-c{}", self.connections))
            .arg(format!("-d{}s", self.seconds))
            // SSE and blocking sends on a durable store can take longer than wrk's 2 s.
            .args(["--timeout", "10s", "--latency", "-s"])
            .arg(self.script)
            .arg(format!("http://127.0.0.1:{}/", self.port))
            .arg("--")
            .args([self.scenario, self.prefix, self.task_id])
            .args([self.ramp_ms.to_string(), self.connections.to_string()])
            .output()
            .map_err(|e| format!("cannot run wrk: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "wrk failed ({}): {}{}",
                output.status,
                stdout,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        parse_summary(&stdout).ok_or_else(|| format!("no summary line in wrk's output: {stdout}"))
    }
}

/// The `keel-bench: key=value ...` line `load.lua`'s `done` prints.
fn parse_summary(stdout: &str) -> Option<Figure> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("keel-bench:"))?;
    let field = |name: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    let requests = field("requests")?;
    let duration_us = field("duration_us")?.max(1.0);
    Some(Figure {
        per_sec: requests * 1e6 / duration_us,
        p50_us: field("p50_us")?,
        p99_us: field("p99_us")?,
        errors: field("errors")? as u64,
    })
}
