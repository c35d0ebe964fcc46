//! Shared helpers for the whole-system tests: start the real `keel` binary, wait for a
//! condition, and find (or make) what a test needs from outside: the Python A2A SDK venv and
//! a Redis.

#![allow(dead_code)] // each test file uses a different subset

use std::fmt::Debug;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

// xtask's own code for these, included rather than copied, so that `cargo xtask` and the
// tests make and find the venvs and the Redis the same way.
#[path = "../../xtask/src/mcp.rs"]
mod mcp_servers;
#[path = "../../xtask/src/py_sdk.rs"]
mod py_sdk;
#[path = "../../xtask/src/redis.rs"]
mod redis;

/// Run `command` to its end, which must be a success (the failure shows its stderr): what
/// it printed.
pub fn succeeds(command: &mut Command) -> std::process::Output {
    let out = command.output().expect("run the command");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The run report of `task_id`, as `keel runs export` prints it from `store`.
pub fn run_report(store: &str, task_id: &str) -> serde_json::Value {
    let out = succeeds(
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["runs", "export", task_id, "--store", store]),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A fresh schema on the PostgreSQL at `KEEL_POSTGRES_URL` (which CI always provides) and the
/// `--store` arguments of `keel serve` processes sharing it.
pub async fn postgres_store() -> (keel_store_postgres::testing::TestSchema, Vec<String>) {
    let schema = keel_store_postgres::testing::TestSchema::new()
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let args = vec!["--store".to_owned(), schema.url.clone()];
    (schema, args)
}

/// Through two processes on one store: a task accepted by `a` is read through `b`, and a
/// cancel through `b` stops `a`'s run, leaving exactly one final status.
pub async fn accepted_by_one_canceled_through_the_other(a: &KeelServer, b: &KeelServer) {
    let (rpc_a, rpc_b) = (Rpc::new(a), Rpc::new(b));
    let task = rpc_a.send(r#"/sleep {"seconds": 300}"#, None, true).await;
    let id = task["id"].as_str().unwrap().to_owned();
    let seen = rpc_b.get(&id).await;
    assert_eq!(
        seen["id"],
        id.as_str(),
        "process B reads the task process A accepted: {seen}"
    );
    // Wait until A is running it, then cancel through B: A's run must stop.
    rpc_b
        .wait_for(&id, Duration::from_secs(10), |s| s == "TASK_STATE_WORKING")
        .await;
    let canceled = rpc_b
        .call(
            "CancelTask",
            serde_json::json!({"id": id, "metadata": {"reason": "from B"}}),
        )
        .await;
    assert_eq!(
        canceled["result"]["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    let on_a = rpc_a.get(&id).await;
    assert_eq!(on_a["status"]["state"], "TASK_STATE_CANCELED");
    assert_eq!(on_a["metadata"]["keel"]["cancelReason"], "from B");
    // Exactly one final status: a second cancel is refused.
    let again = rpc_a
        .call("CancelTask", serde_json::json!({"id": id}))
        .await;
    assert_eq!(again["error"]["code"], -32002, "{again}");
}

/// A running `keel serve`, killed when dropped.
pub struct KeelServer {
    child: Child,
    /// The base URL it printed, ending in `/`.
    pub url: String,
}

impl KeelServer {
    /// Start `keel serve --port 0 --store memory` and wait for the line naming its URL (the
    /// server is listening once it is printed).
    pub fn start(extra: &[&str]) -> KeelServer {
        let mut args = vec!["--store", "memory"];
        args.extend_from_slice(extra);
        Self::start_with(&args)
    }

    /// Start `keel serve --port 0` with exactly these extra arguments.
    pub fn start_with(extra: &[&str]) -> KeelServer {
        Self::start_with_env(extra, &[])
    }

    /// Start `keel serve --port 0` with these arguments and environment variables.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> KeelServer {
        Self::start_on(0, extra, env)
    }

    /// Start `keel serve` on `port` (0 picks a free one) with these arguments and
    /// environment variables.
    pub fn start_on(port: u16, extra: &[&str], env: &[(&str, &str)]) -> KeelServer {
        Self::start_logging(port, extra, env, Stdio::inherit())
    }

    /// [`Self::start_on`] with its log lines (stderr) going to `logs`; `env` may set
    /// `RUST_LOG` (default `warn`).
    pub fn start_logging(
        port: u16,
        extra: &[&str],
        env: &[(&str, &str)],
        logs: impl Into<Stdio>,
    ) -> KeelServer {
        let mut command = Self::command(port, extra);
        command.envs(env.iter().copied()).stderr(logs);
        Self::serving(command)
    }

    /// Start `keel serve --port 0` with these arguments, its log (`RUST_LOG=info`, stderr)
    /// written to `log`.
    pub fn start_logging_to(extra: &[&str], log: &std::path::Path) -> KeelServer {
        let log = std::fs::File::create(log).expect("create the log file");
        Self::start_logging(0, extra, &[("RUST_LOG", "info")], log)
    }

    /// Start `keel serve --port 0` in `dir` (where it looks for `keel.toml`).
    pub fn start_in(dir: &std::path::Path, extra: &[&str]) -> KeelServer {
        let mut command = Self::command(0, extra);
        command.current_dir(dir);
        Self::serving(command)
    }

    /// `keel serve` on 127.0.0.1 and `port` with these arguments, logging at `warn` to the
    /// test's stderr unless the caller says otherwise, its stdout piped for [`Self::serving`].
    fn command(port: u16, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command
    }

    /// Spawn `command` and wait for the started server's line naming its URL.
    fn serving(mut command: Command) -> KeelServer {
        let mut child = command.spawn().expect("start keel serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the serving line");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("keel serve printed no URL: {line:?}"))
            .to_owned();
        KeelServer { child, url }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send SIGTERM and return at once: the server shuts down while the test goes on.
    #[cfg(unix)]
    pub fn send_sigterm(&mut self) {
        self.signal("-TERM");
    }

    /// Wait, off the async runtime's threads, for the process to exit (after a signal);
    /// panics after `within`.
    pub async fn exited(mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for keel") {
                std::mem::forget(self);
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "keel serve did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Send SIGTERM and wait for the exit status.
    #[cfg(unix)]
    pub fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("-TERM");
        let status = self.child.wait().expect("wait for keel");
        std::mem::forget(self);
        status
    }

    /// SIGKILL: the process gets no chance to clean up.
    #[cfg(unix)]
    pub fn kill_hard(mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
        std::mem::forget(self);
    }

    #[cfg(unix)]
    fn signal(&mut self, signal: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }
}

impl Drop for KeelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python interpreter of the A2A SDK 1.x venv: `KEEL_PYTHON` (set by `cargo xtask ci`),
/// else the venv `cargo xtask py-sdk` keeps under `target/`, created on first use.
pub fn sdk_python() -> PathBuf {
    venv_python(&py_sdk::V1)
}

/// The Python interpreter of the A2A SDK 0.3.x venv: `KEEL_PYTHON_V03`, else its cached venv,
/// created on first use.
pub fn sdk_python_v03() -> PathBuf {
    venv_python(&py_sdk::V03)
}

/// The Python interpreter of the MCP SDK venv: `KEEL_MCP_PYTHON` (set by `cargo xtask ci`),
/// else the venv `cargo xtask mcp` keeps under `target/`, created on first use.
pub fn mcp_python() -> PathBuf {
    venv_python(&mcp_servers::PYTHON)
}

/// What a Python check script (`tests/python/*.py`) reported: one JSON object per line of
/// its stdout, each naming its `step` (and, for scripts that try both, its `binding`).
pub struct PythonSteps {
    /// Every step, in the order printed.
    pub steps: Vec<serde_json::Value>,
    stdout: String,
}

impl PythonSteps {
    /// Run `script` (under `tests/python/`) with `python` and `args`; the test fails, showing
    /// both streams, unless the script succeeds.
    pub fn run(python: PathBuf, script: &str, args: &[&str]) -> PythonSteps {
        let output = Command::new(python)
            .arg(workspace_root().join("tests/python").join(script))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {script}: {e}"));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{script} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        let steps = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        PythonSteps { steps, stdout }
    }

    /// The first step named `name`.
    pub fn step(&self, name: &str) -> &serde_json::Value {
        self.find(name, None)
    }

    /// The first step named `name` over `binding`.
    pub fn step_over(&self, name: &str, binding: &str) -> &serde_json::Value {
        self.find(name, Some(binding))
    }

    fn find(&self, name: &str, binding: Option<&str>) -> &serde_json::Value {
        self.steps
            .iter()
            .find(|s| s["step"] == name && binding.is_none_or(|b| s["binding"] == b))
            .unwrap_or_else(|| panic!("no `{name}` step ({binding:?}) in {}", self.stdout))
    }
}

/// Panics saying what is needed when the venv cannot be made: a test that needs the real
/// SDK never passes without it.
fn venv_python(venv: &py_sdk::SdkVenv) -> PathBuf {
    if let Some(python) = std::env::var_os(venv.env_var) {
        return PathBuf::from(python);
    }
    // The tests of one binary run at once, and two of them making the venv together each
    // clear what the other is installing: one makes it, the others wait and find it made.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    venv.ensure().unwrap_or_else(|error| {
        panic!(
            "this test needs the official Python SDK ({}) in a venv at {}, made on first \
             use with python3's venv module and pip, which needs PyPI. It could not be made: \
             {error}\nInstall python3 with venv and pip and allow access to PyPI, or set {} \
             to a python that has the SDK.",
            venv.requirements.join(", "),
            venv.dir().display(),
            venv.env_var,
        )
    })
}

/// The Redis for a test that needs one: `REDIS_URL`, else `redis://127.0.0.1:6379`. Panics
/// saying so when nothing answers PING there, rather than failing later in a less clear way.
pub fn redis_url() -> String {
    let url = redis::url_from_env();
    assert!(
        redis::answers_ping(&url),
        "this test needs a Redis at {url} (REDIS_URL, default {}), and nothing answers PING \
         there: start one (e.g. `redis-server --daemonize yes`) or point REDIS_URL at one",
        redis::DEFAULT_URL,
    );
    url
}

/// Calls `probe` until `done` holds for its answer, and returns that answer; fails after
/// `within`, naming `what` it waited for and printing the last answer seen. The polling is
/// `keel_runtime::testing`'s, as in every crate's tests.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    within: Duration,
    mut probe: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    T: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    /// The last answer, printed if the wait fails (the panic unwinds through it).
    struct LastAnswer(std::sync::Mutex<String>);
    impl Drop for LastAnswer {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("the last answer was {}", self.0.lock().unwrap());
            }
        }
    }
    let (done, last) = (&done, &LastAnswer(Default::default()));
    keel_runtime::testing::eventually_within(what, within, || {
        let answer = probe();
        async move {
            let answer = answer.await;
            *last.0.lock().unwrap() = format!("{answer:?}");
            done(&answer).then_some(answer)
        }
    })
    .await
}

/// A JSON-RPC client for the A2A endpoint of a running server.
pub struct Rpc {
    http: reqwest::Client,
    url: String,
}

impl Rpc {
    /// A client for `server`.
    pub fn new(server: &KeelServer) -> Rpc {
        Rpc {
            http: reqwest::Client::new(),
            url: server.url.clone(),
        }
    }

    /// Call `method`; answers the whole JSON-RPC response.
    pub async fn call(&self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let body =
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.http
            .post(&self.url)
            .header("A2A-Version", "1.0")
            .json(&body)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("JSON answer")
    }

    /// SendMessage with `text` (in `context_id` when given); answers the task.
    pub async fn send(
        &self,
        text: &str,
        context_id: Option<&str>,
        return_immediately: bool,
    ) -> serde_json::Value {
        let mut message = serde_json::json!({
            "messageId": uuid_like(), "role": "ROLE_USER", "parts": [{"text": text}]
        });
        if let Some(context) = context_id {
            message["contextId"] = serde_json::json!(context);
        }
        let answer = self
            .call("SendMessage", serde_json::json!({"message": message, "configuration": {"returnImmediately": return_immediately}}))
            .await;
        answer["result"]["task"].clone()
    }

    /// GetTask; answers the task (or the error object).
    pub async fn get(&self, task_id: &str) -> serde_json::Value {
        let answer = self
            .call("GetTask", serde_json::json!({"id": task_id}))
            .await;
        if answer.get("error").is_some() {
            return answer;
        }
        answer["result"].clone()
    }

    /// GetTask until `done(state)` holds (at most `within`); answers the task.
    pub async fn wait_for(
        &self,
        task_id: &str,
        within: Duration,
        done: impl Fn(&str) -> bool,
    ) -> serde_json::Value {
        let what = format!("task {task_id} to reach the expected state");
        wait_until(
            &what,
            within,
            || self.get(task_id),
            |task| task["status"]["state"].as_str().is_some_and(&done),
        )
        .await
    }

    /// GetTask until the task is in a terminal state (at most `within`); answers the task.
    pub async fn wait_for_end(&self, task_id: &str, within: Duration) -> serde_json::Value {
        self.wait_for(task_id, within, |s| {
            matches!(
                s,
                "TASK_STATE_COMPLETED"
                    | "TASK_STATE_FAILED"
                    | "TASK_STATE_CANCELED"
                    | "TASK_STATE_REJECTED"
            )
        })
        .await
    }
}

/// The agent card served under `url` (which ends in `/`), as a v1.0 caller reads it.
pub async fn card(url: &str) -> serde_json::Value {
    answer_as_v1(reqwest::Client::new().get(format!("{url}.well-known/agent-card.json"))).await
}

/// POST the JSON-RPC `body` to `url` as a v1.0 caller; the JSON answer.
pub async fn post_rpc(url: &str, body: &serde_json::Value) -> serde_json::Value {
    answer_as_v1(reqwest::Client::new().post(url).json(body)).await
}

/// Send `request` with `A2A-Version: 1.0`; the JSON answer.
async fn answer_as_v1(request: reqwest::RequestBuilder) -> serde_json::Value {
    let response = request.header("A2A-Version", "1.0").send().await.unwrap();
    response.json().await.unwrap()
}

/// Serve `app` on a free port of 127.0.0.1 in the background; its `http://` base URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// A fresh id for messages and prefixes.
pub fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{nanos:x}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Answer an OpenAI chat-completions request with `message` (an assistant message), as a
/// server-sent event stream when the request asked for `"stream": true`, else as one JSON
/// body — what a fake OpenAI-compatible model in a test needs.
pub fn openai_reply(
    request: &serde_json::Value,
    message: serde_json::Value,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let usage =
        serde_json::json!({"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18});
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    if request["stream"] != true {
        let body = serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": request["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage
        });
        return axum::Json(body).into_response();
    }
    let mut delta = serde_json::json!({"role": "assistant"});
    if let Some(content) = message["content"].as_str() {
        delta["content"] = serde_json::json!(content);
    }
    if let Some(calls) = message["tool_calls"].as_array() {
        let calls: Vec<serde_json::Value> = calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                let mut call = call.clone();
                call["index"] = serde_json::json!(index);
                call
            })
            .collect();
        delta["tool_calls"] = serde_json::json!(calls);
    }
    let chunk = |choices: serde_json::Value, usage: Option<&serde_json::Value>| {
        let mut chunk = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": request["model"], "choices": choices});
        if let Some(usage) = usage {
            chunk["usage"] = usage.clone();
        }
        format!("data: {chunk}\n\n")
    };
    let body = [
        chunk(
            serde_json::json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            None,
        ),
        chunk(
            serde_json::json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
            Some(&usage),
        ),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    ([("content-type", "text/event-stream")], body).into_response()
}

/// What a finished `keel run-once` process left behind.
pub struct RunOnceOutput {
    /// Its exit status.
    pub status: std::process::ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `keel run-once` as a fresh process per input, with fixed arguments and environment.
pub struct RunOnce {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl RunOnce {
    /// `keel run-once ARGS...` with these environment variables added.
    pub fn new(args: Vec<String>, env: Vec<(String, String)>) -> RunOnce {
        RunOnce { args, env }
    }

    /// Run one process with `extra` arguments to its end (at most 120 s), off the async
    /// runtime's threads.
    pub async fn run_raw(&self, extra: &[&str]) -> RunOnceOutput {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .arg("run-once")
            .args(&self.args)
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        let output = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::task::spawn_blocking(move || command.output()),
        )
        .await
        .expect("keel run-once finished within 120 s")
        .expect("join")
        .expect("start keel run-once");
        RunOnceOutput {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Run one process that must succeed; answers the JSON it printed.
    pub async fn run(&self, extra: &[&str]) -> serde_json::Value {
        let out = self.run_raw(extra).await;
        assert!(
            out.status.success(),
            "keel run-once {extra:?} failed: {}\n{}",
            out.status,
            out.stderr
        );
        serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|err| panic!("run-once printed no JSON ({err}): {:?}", out.stdout))
    }
}

/// The `careful` agent of the tests' keel.toml files, as a literal for `concat!`: every
/// action waits for approval, with the sandboxed `run_code` tool.
#[allow(unused_macros)] // each test file uses a different subset
macro_rules! careful_agent {
    () => {
        r#"
[[agents]]
name = "careful"
description = "Asks before it acts"

[agents.tools]
run_code = true

[agents.policy]
default = "require_approval"
"#
    };
}
#[allow(unused_imports)]
pub(crate) use careful_agent;
