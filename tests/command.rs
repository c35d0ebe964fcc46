//! The `keel` command driven as a user drives it: `keel init` → `keel check` → `keel run` of
//! an agent whose model calls an HTTP tool that needs approval, answered on stdin; the run's
//! events as JSON lines; `keel runs` over the store the run wrote; the A2A commands against a
//! real `keel serve`.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use assert_cmd::Command;
use axum::extract::Path as UrlPath;
use axum::routing::get;
use serde_json::{json, Value};

/// An HTTP endpoint on 127.0.0.1:0 counting its calls: the tool the agent calls.
struct WeatherService {
    url: String,
    calls: Arc<AtomicUsize>,
}

impl WeatherService {
    fn start() -> Self {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let app = axum::Router::new().route(
            "/weather/{city}",
            get(move |UrlPath(city): UrlPath<String>| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    axum::Json(json!({"city": city, "sky": "clear-7c2e"}))
                }
            }),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        Self { url, calls }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// `keel ARGS` run in `dir`, quiet logs, no colour.
fn keel(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env_remove("KEEL_CONFIG")
        .env_remove("KEEL_STORE");
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `keel init` in a temp dir, then the file's weather tool pointed at `weather`.
fn plain_project(weather: &WeatherService) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    keel(dir.path()).arg("init").assert().success();
    let path = dir.path().join("keel.toml");
    let file = std::fs::read_to_string(&path).unwrap();
    let file = file.replace("http://127.0.0.1:9000", &weather.url);
    assert!(file.contains(&weather.url));
    std::fs::write(&path, file).unwrap();
    dir
}

/// [`plain_project`] with the weather tool made to need approval; `keel check` accepts it.
fn project(weather: &WeatherService) -> tempfile::TempDir {
    let dir = plain_project(weather);
    let path = dir.path().join("keel.toml");
    let file = std::fs::read_to_string(&path).unwrap();
    let file = file.replace(
        r#"require_approval = ["email.send"]"#,
        r#"require_approval = ["weather.*"]"#,
    );
    assert!(file.contains(&weather.url) && file.contains(r#"["weather.*"]"#));
    std::fs::write(&path, file).unwrap();
    let check = keel(dir.path()).arg("check").assert().success();
    let shown = text(&check.get_output().stdout);
    assert!(shown.contains("tool (http): weather GET"), "{shown}");
    dir
}

const ASK_WEATHER: &str = r#"/weather {"city": "Oslo"}"#;

#[test]
fn init_check_run_an_http_tool_approved_on_stdin_then_denied() {
    let weather = WeatherService::start();
    let dir = project(&weather);

    // Approved on stdin: the tool runs and its result reaches the answer.
    let approved = keel(dir.path())
        .args(["run", ASK_WEATHER])
        .write_stdin("y\n")
        .assert()
        .success();
    let (out, err) = (
        text(&approved.get_output().stdout),
        text(&approved.get_output().stderr),
    );
    assert_eq!(weather.calls(), 1, "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("clear-7c2e"),
        "the answer misses the tool's result: {out}"
    );
    for shown in [
        "approval needed: weather",
        "Oslo",
        "policy: require_approval",
        "completed",
    ] {
        assert!(
            err.contains(shown),
            "`{shown}` not in the run's view:\n{err}"
        );
    }
    // Progress goes to stderr, only the answer to stdout.
    assert!(!out.contains("policy:"), "{out}");

    // Denied on stdin: the tool does not run, and the model sees the denial.
    let denied = keel(dir.path())
        .args(["run", ASK_WEATHER])
        .write_stdin("n\n")
        .assert()
        .success();
    let out = text(&denied.get_output().stdout);
    assert_eq!(weather.calls(), 1, "a denied call reached the tool");
    assert!(out.contains("denied"), "{out}");
    assert!(!out.contains("clear-7c2e"), "{out}");

    // No answer at all (stdin closed, no terminal): it fails closed.
    let unanswered = keel(dir.path())
        .args(["run", ASK_WEATHER])
        .write_stdin("")
        .assert()
        .success();
    assert_eq!(
        weather.calls(),
        1,
        "an unanswered approval let the call run"
    );
    assert!(text(&unanswered.get_output().stdout).contains("denied"));

    // `--approve` answers without asking.
    keel(dir.path())
        .args(["run", "--approve", ASK_WEATHER])
        .assert()
        .success();
    assert_eq!(weather.calls(), 2);
}

#[test]
fn run_against_a_served_agent_asks_for_its_approvals_and_streams_to_the_end() {
    let weather = WeatherService::start();
    let dir = project(&weather);
    let server = support::KeelServer::start_in(dir.path(), &["--store", "memory"]);
    let run_remote = |extra: &[&str], stdin: &str| {
        let mut command = keel(dir.path());
        command
            .args(["run", "--url", &server.url])
            .args(extra)
            .arg(ASK_WEATHER)
            .write_stdin(stdin.to_owned());
        let output = command.output().unwrap();
        (output.status, text(&output.stdout), text(&output.stderr))
    };

    // Approved on stdin: the served agent runs the tool, and the stream goes on to the end.
    let (status, out, err) = run_remote(&[], "y\n");
    assert!(status.success(), "stdout: {out}\nstderr: {err}");
    assert_eq!(weather.calls(), 1, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("clear-7c2e"), "{out}");
    for shown in [
        "approval needed: weather",
        "Oslo",
        "approval-gated",
        "completed",
    ] {
        assert!(err.contains(shown), "`{shown}` not shown:\n{err}");
    }

    // Denied on stdin: the tool does not run and the model hears of the denial.
    let (status, out, err) = run_remote(&[], "n\n");
    assert!(status.success(), "stderr: {err}");
    assert_eq!(weather.calls(), 1, "a denied call reached the tool");
    assert!(
        out.contains("denied") && !out.contains("clear-7c2e"),
        "{out}"
    );

    // No terminal and nothing on stdin: it fails closed.
    let (_, out, _) = run_remote(&[], "");
    assert_eq!(
        weather.calls(),
        1,
        "an unanswered approval let the call run"
    );
    assert!(out.contains("denied"), "{out}");

    // The flags answer without asking.
    let (status, out, _) = run_remote(&["--deny"], "y\n");
    assert!(status.success() && out.contains("denied"), "{out}");
    assert_eq!(weather.calls(), 1);
    let (status, out, _) = run_remote(&["--approve"], "");
    assert!(status.success() && out.contains("clear-7c2e"), "{out}");
    assert_eq!(weather.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_http_tool_finishes_under_run_through_the_runs_own_callback_listener() {
    // A service that acknowledges the invocation, then answers on its callback URL.
    let callback_urls = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = callback_urls.clone();
    let app = axum::Router::new().route(
        "/render",
        axum::routing::post(move |axum::Json(invocation): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                let url = invocation["callback_url"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                seen.lock().unwrap().push(url.clone());
                tokio::spawn(async move {
                    let answered = reqwest::Client::new()
                        .post(url)
                        .header(
                            "x-keel-callback-secret",
                            invocation["callback_secret"].as_str().unwrap_or_default(),
                        )
                        .json(&json!({"output": {"frames": 24, "by": "render-farm-e3"}}))
                        .send()
                        .await;
                    assert!(answered.is_ok_and(|r| r.status() == 202));
                });
                (
                    axum::http::StatusCode::ACCEPTED,
                    axum::Json(json!({"status": "accepted"})),
                )
            }
        }),
    );
    let service = support::serve(app).await;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        format!(
            r#"
[server]
store = "memory"

[[agents]]
name = "studio"
description = "Renders."

[[agents.tools.http]]
name = "render"
description = "Render; the result arrives later."
url = "{service}/render"
asynchronous = true
"#
        ),
    )
    .unwrap();
    let dir_path = dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        // Without a callback listener the run would wait for the callback for the tool's
        // whole timeout: a bound on the process, so that such a failure fails, not hangs.
        keel(&dir_path)
            .args(["run", "/render {}"])
            .timeout(std::time::Duration::from_secs(120))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (out, err) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("render-farm-e3"),
        "stdout: {out}\nstderr: {err}"
    );
    let urls = callback_urls.lock().unwrap();
    assert_eq!(urls.len(), 1, "{urls:?}");
    assert!(
        urls[0].starts_with("http://127.0.0.1:") && urls[0].contains("/agents/studio/callbacks/"),
        "{urls:?}"
    );
}

/// The run's events, one JSON document a line.
fn events(stdout: &[u8]) -> Vec<Value> {
    text(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[test]
fn json_prints_the_normalized_events_and_nothing_else_on_stdout() {
    let weather = WeatherService::start();
    let dir = project(&weather);
    let run = keel(dir.path())
        .args(["run", "--json", "--deny", ASK_WEATHER])
        .assert()
        .success();
    let events = events(&run.get_output().stdout);
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for expected in [
        "llm.call.started",
        "llm.call.completed",
        "action.requested",
        "action.policy",
        "approval.required",
        "approval.decided",
        "action.denied",
    ] {
        assert!(types.contains(&expected), "no {expected} in {types:?}");
    }
    let last = events.last().unwrap();
    assert_eq!(last["type"], "task.status", "{last}");
    assert_eq!(last["final"], true, "{last}");
    assert_eq!(last["payload"]["state"], "completed", "{last}");
    assert_eq!(weather.calls(), 0);
}

#[test]
fn the_exit_status_follows_the_final_state() {
    let dir = tempfile::tempdir().unwrap();
    // A file whose agent waits for the human (`ask_human`): the task rests input-required.
    std::fs::write(
        dir.path().join("keel.toml"),
        "[server]\nstore = \"sqlite:./keel.db\"\n\n[[agents]]\nname = \"asker\"\ndescription = \"Asks.\"\n\n[agents.tools]\nbuiltin = [\"ask_human\"]\n",
    )
    .unwrap();
    keel(dir.path())
        .args(["run", r#"/ask_human {"question": "which city?"}"#])
        .assert()
        .code(3);
    keel(dir.path()).args(["run", "hello"]).assert().success();
    // An agent the file does not declare is a clear error.
    let missing = keel(dir.path())
        .args(["run", "--agent", "nobody", "hello"])
        .assert()
        .failure();
    assert!(text(&missing.get_output().stderr).contains("no agent `nobody`"));
}

#[test]
fn runs_list_show_and_export_read_the_reports_a_run_left_in_the_store() {
    let weather = WeatherService::start();
    let dir = project(&weather);
    keel(dir.path())
        .args(["run", "--approve", "--thread", "t-runs", ASK_WEATHER])
        .assert()
        .success();
    keel(dir.path())
        .args(["run", "--thread", "t-other", "just text"])
        .assert()
        .success();

    let listed = keel(dir.path())
        .args(["runs", "list", "--thread", "t-runs", "--json"])
        .assert()
        .success();
    let listed: Value = serde_json::from_slice(&listed.get_output().stdout).unwrap();
    let runs = listed["runs"].as_array().unwrap();
    // The approval split the task into runs: up to the approval, then on to the answer.
    assert!(!runs.is_empty(), "{listed}");
    assert!(runs.iter().all(|r| r["thread_id"] == "t-runs"), "{listed}");
    let finished = runs
        .iter()
        .find(|r| r["final_state"] == "completed")
        .unwrap_or_else(|| panic!("no completed run in {listed}"));
    let run_id = finished["run_id"].as_str().unwrap();

    let waiting = keel(dir.path())
        .args([
            "runs",
            "list",
            "--state",
            "completed",
            "--limit",
            "1",
            "--json",
        ])
        .assert()
        .success();
    let waiting: Value = serde_json::from_slice(&waiting.get_output().stdout).unwrap();
    assert_eq!(waiting["runs"].as_array().unwrap().len(), 1, "{waiting}");
    assert_eq!(waiting["runs"][0]["final_state"], "completed");

    let shown = keel(dir.path())
        .args(["runs", "show", run_id])
        .env("NO_COLOR", "1")
        .assert()
        .success();
    let shown = text(&shown.get_output().stdout);
    for expected in [
        "llm.call.completed",
        "action.completed",
        "clear-7c2e",
        "final state: completed",
        "budget used:",
    ] {
        assert!(shown.contains(expected), "`{expected}` not in:\n{shown}");
    }
    assert!(
        !shown.contains('\u{1b}'),
        "colour without a terminal:\n{shown}"
    );

    let exported = keel(dir.path())
        .args(["runs", "export", run_id])
        .assert()
        .success();
    let report: Value = serde_json::from_slice(&exported.get_output().stdout).unwrap();
    assert_eq!(report["run_id"], run_id);
    assert_eq!(report["final_state"], "completed");
    assert!(report["events"].as_array().is_some_and(|e| !e.is_empty()));

    let missing = keel(dir.path())
        .args(["runs", "show", "nope"])
        .assert()
        .failure();
    assert!(text(&missing.get_output().stderr).contains("no run `nope`"));
    keel(dir.path())
        .args(["runs", "list", "--state", "sideways"])
        .assert()
        .failure();
}

/// The task id of `keel send --json`'s (or `tasks get --json`'s) A2A task.
fn a2a_task(stdout: &[u8]) -> Value {
    serde_json::from_slice(stdout).unwrap_or_else(|e| panic!("{e}: {}", text(stdout)))
}

#[tokio::test]
async fn the_a2a_commands_send_list_get_follow_and_cancel_tasks_of_a_served_agent() {
    let server = support::KeelServer::start(&["--api-key", "k-91c=app/ann"]);
    let url = server.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let a2a = |args: &[&str]| {
        let mut command = keel(dir.path());
        command
            .args(args)
            .args(["--url", &url, "--api-key", "k-91c"]);
        command
    };

    // `send`: the answer on stdout, the exit status from the final state.
    let sent = a2a(&["send", "--thread", "c-7", "hello there"])
        .assert()
        .success();
    assert_eq!(
        text(&sent.get_output().stdout).trim(),
        "You said: hello there"
    );
    // Without the key the agent refuses, and so does the command.
    keel(dir.path())
        .args(["send", "--url", &url, "hello"])
        .assert()
        .failure();

    // `run --url`: streamed, the answer at the end; `--json`: A2A stream responses.
    let streamed = a2a(&["run", "--thread", "c-7", "streamed words"])
        .assert()
        .success();
    assert_eq!(
        text(&streamed.get_output().stdout).trim(),
        "You said: streamed words"
    );
    let lines = a2a(&["run", "--json", "more words"]).assert().success();
    let lines = events(&lines.get_output().stdout);
    assert!(
        lines.first().is_some_and(|l| l.get("task").is_some()),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"),
        "{lines:?}"
    );

    // `tasks list --json`: one document, ids as A2A names them.
    let listed = a2a(&["tasks", "list", "--thread", "c-7", "--json"])
        .assert()
        .success();
    let listed = a2a_task(&listed.get_output().stdout);
    let tasks = listed["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{listed}");
    assert!(tasks.iter().all(|t| t["contextId"] == "c-7"), "{listed}");

    // A task that sleeps, followed by `tasks subscribe` and ended by `tasks cancel`.
    let sleeper = a2a(&[
        "send",
        "--json",
        r#"/sleep {"seconds": 300}"#,
        "--return-immediately",
    ])
    .assert()
    .success();
    let sleeper = a2a_task(&sleeper.get_output().stdout);
    let id = sleeper["id"].as_str().unwrap().to_owned();
    let mut follow = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "tasks",
            "subscribe",
            &id,
            "--json",
            "--url",
            &url,
            "--api-key",
            "k-91c",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the follower has the task's first event it is subscribed: then cancel.
    let mut reader = std::io::BufReader::new(follow.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut reader, &mut first).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&first).unwrap()["task"]["id"],
        id.as_str()
    );
    let canceled = a2a(&["tasks", "cancel", &id, "--json"]).assert().success();
    assert_eq!(
        a2a_task(&canceled.get_output().stdout)["status"]["state"],
        "TASK_STATE_CANCELED"
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    assert!(rest.contains("TASK_STATE_CANCELED"), "{rest}");
    assert_eq!(follow.wait().unwrap().code(), Some(130));

    // `tasks get` exits as `send` does for the same state: 130 for canceled.
    let got = a2a(&["tasks", "get", &id, "--json"]).assert().code(130);
    assert_eq!(
        a2a_task(&got.get_output().stdout)["status"]["state"],
        "TASK_STATE_CANCELED"
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_cancels_the_run_live_and_the_task_ends_canceled() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    // No keel.toml: the demo agent, on ./keel.db.
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["run", "--json", r#"/sleep {"seconds": 300}"#])
        .current_dir(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(run.stdout.take().unwrap()).lines();
    // The tool has started: the run is live.
    for line in lines.by_ref() {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if event["type"] == "action.started" {
            break;
        }
    }
    let sent = std::process::Command::new("kill")
        .args(["-INT", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let rest: Vec<Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let last = rest.last().expect("events after Ctrl-C");
    assert_eq!(last["type"], "task.status", "{last}");
    assert_eq!(last["payload"]["state"], "canceled", "{last}");
    assert_eq!(run.wait().unwrap().code(), Some(130));

    // The canceled run is in the store.
    let listed = keel(dir.path())
        .args(["runs", "list", "--state", "canceled", "--json"])
        .assert()
        .success();
    let listed: Value = serde_json::from_slice(&listed.get_output().stdout).unwrap();
    assert_eq!(listed["runs"].as_array().unwrap().len(), 1, "{listed}");
}

#[test]
fn chat_holds_one_thread_a_line_a_turn_until_exit() {
    let dir = tempfile::tempdir().unwrap();
    let chat = keel(dir.path())
        .arg("chat")
        .write_stdin("first words\n\nsecond words\n/exit\nnever sent\n")
        .assert()
        .success();
    let out = text(&chat.get_output().stdout);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["You said: first words", "You said: second words"],
        "{out}"
    );
    // Both turns are on one thread.
    let listed = keel(dir.path())
        .args(["runs", "list", "--json"])
        .assert()
        .success();
    let listed: Value = serde_json::from_slice(&listed.get_output().stdout).unwrap();
    let runs = listed["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{listed}");
    assert_eq!(runs[0]["thread_id"], runs[1]["thread_id"], "{listed}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, marker) in [
        ("bash", "_keel()"),
        ("zsh", "#compdef keel"),
        ("fish", "complete -c keel"),
    ] {
        let script = keel(dir.path())
            .args(["completions", shell])
            .assert()
            .success();
        let script = text(&script.get_output().stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("runs"), "{shell} misses a subcommand");
    }
}

/// A stand-in A2A agent: the real server's card, pointed at itself, and one canned answer to
/// every JSON-RPC call; it keeps the requests it received.
struct RecordingAgent {
    url: String,
    requests: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl RecordingAgent {
    async fn start(card: Value, real_url: &str, answer: Value) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let card: Value = serde_json::from_str(&card.to_string().replace(real_url, &url)).unwrap();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = requests.clone();
        let app = axum::Router::new()
            .route(
                "/.well-known/agent-card.json",
                get(move || async move { axum::Json(card) }),
            )
            .route(
                "/",
                axum::routing::post(move |axum::Json(body): axum::Json<Value>| async move {
                    let id = body["id"].clone();
                    kept.lock().unwrap().push(body);
                    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": answer}))
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, requests }
    }
}

// Multi-threaded: the stand-in agent answers while the test waits on the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_approve_sends_the_decision_as_a_data_part_to_the_task() {
    let real = support::KeelServer::start(&[]);
    let http = reqwest::Client::new();
    let card = support::card(&real.url).await;
    let answer: Value = http
        .post(&real.url)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let agent = RecordingAgent::start(card, &real.url, answer["result"].clone()).await;
    let dir = tempfile::tempdir().unwrap();
    for (flags, decision) in [
        (&["--reason", "looks fine"][..], "approve"),
        (&["--deny"][..], "deny"),
    ] {
        keel(dir.path())
            .args([
                "tasks",
                "approve",
                "task-5",
                "--request",
                "req-9",
                "--url",
                &agent.url,
            ])
            .args(flags)
            .assert()
            .success();
        let sent = agent.requests.lock().unwrap().pop().unwrap();
        assert_eq!(sent["method"], "SendMessage", "{sent}");
        let message = &sent["params"]["message"];
        assert_eq!(message["taskId"], "task-5", "{sent}");
        let mut expected = json!({"requestId": "req-9", "decision": decision});
        if decision == "approve" {
            expected["reason"] = json!("looks fine");
        }
        assert_eq!(
            message["parts"][0]["data"],
            json!({"approval": expected}),
            "{sent}"
        );
    }
}

#[test]
fn help_names_the_tasks_commands_as_they_are_spelled() {
    let dir = tempfile::tempdir().unwrap();
    let help = keel(dir.path()).arg("--help").output().unwrap();
    let help = text(&help.stdout);
    assert!(help.contains("subscribe"), "{help}");
    assert!(!help.contains("follow"), "{help}");
    // The approval request is named by `--request`, as docs/approvals.md shows it.
    let approve = keel(dir.path())
        .args(["tasks", "approve", "--help"])
        .output()
        .unwrap();
    assert!(text(&approve.stdout).contains("--request"));
}

#[test]
fn runs_list_without_a_store_names_the_one_it_looked_at_and_creates_none() {
    let dir = tempfile::tempdir().unwrap();
    let out = keel(dir.path()).args(["runs", "list"]).output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("keel.db"), "{err}");
    assert!(!dir.path().join("keel.db").exists());
}

#[test]
fn a_task_waiting_for_approval_shows_its_request_and_is_approved_by_its_id_alone() {
    let weather = WeatherService::start();
    let dir = project(&weather);
    let server = support::KeelServer::start_in(dir.path(), &["--store", "memory"]);
    let keel_at = |args: &[&str]| {
        let output = keel(dir.path())
            .args(args)
            .args(["--url", &server.url])
            .output()
            .unwrap();
        (
            output.status.code(),
            text(&output.stdout),
            text(&output.stderr),
        )
    };

    let (code, out, err) = keel_at(&["send", ASK_WEATHER]);
    assert_eq!(code, Some(3), "stdout: {out}\nstderr: {err}");
    let task = err
        .split_whitespace()
        .skip_while(|word| *word != "task")
        .nth(1)
        .expect("the task's id")
        .to_owned();
    for shown in [
        "approval needed: weather",
        "Oslo",
        "request ",
        "keel tasks approve",
    ] {
        assert!(err.contains(shown), "`{shown}` not shown:\n{err}");
    }
    // The request's id, as shown (`request ID; answer with ...`).
    let request_of = |err: &str| {
        err.split("keel: request ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .unwrap_or_else(|| panic!("no request id in {err}"))
            .to_owned()
    };
    let request = request_of(&err);
    // `tasks get` says the same, with the same exit status as `send`.
    let (code, _, err) = keel_at(&["tasks", "get", &task]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("approval needed: weather"), "{err}");
    assert!(err.contains("Oslo"), "{err}");
    assert_eq!(request_of(&err), request, "{err}");
    assert_eq!(weather.calls(), 0);

    // The one request the task waits for is the one approved.
    let (code, out, err) = keel_at(&["tasks", "approve", &task]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("clear-7c2e"), "{out}");
    assert_eq!(weather.calls(), 1);
    let (code, _, err) = keel_at(&["tasks", "approve", &task]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("waits for no approval (it is completed)"),
        "{err}"
    );
}

/// Every client command: what follows `keel` before `--url URL`.
const CLIENT_COMMANDS: [&[&str]; 8] = [
    &["send", "hi"],
    &["tasks", "list"],
    &["tasks", "get", "t-1"],
    &["tasks", "cancel", "t-1"],
    &["tasks", "subscribe", "t-1"],
    &["tasks", "approve", "t-1"],
    &["run", "hi"],
    &["threads", "compact", "th-1"],
];

#[test]
fn client_commands_say_what_the_user_got_wrong_not_internal_error() {
    let dir = tempfile::tempdir().unwrap();
    // Each client command at `url`: it fails (exit 1) and says so in the user's terms.
    let each = |url: &str| -> Vec<String> {
        CLIENT_COMMANDS
            .iter()
            .map(|command| {
                let output = keel(dir.path())
                    .args(*command)
                    .args(["--url", url])
                    .output()
                    .unwrap();
                let err = text(&output.stderr);
                assert_eq!(output.status.code(), Some(1), "{command:?}: {err}");
                assert!(!err.contains("internal error"), "{command:?}: {err}");
                err
            })
            .collect()
    };

    // Nothing listens: the URL that refused is named.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for err in each(&format!("http://127.0.0.1:{port}")) {
        assert!(
            err.contains(&format!("cannot use http://127.0.0.1:{port}/")),
            "{err}"
        );
        assert!(err.to_lowercase().contains("refused"), "{err}");
    }

    // No scheme.
    for err in each(&format!("127.0.0.1:{port}")) {
        assert!(
            err.contains("names no scheme") && err.contains("http://127.0.0.1:"),
            "{err}"
        );
    }

    // An agent path the server does not have: the agents it has are named.
    let weather = WeatherService::start();
    let project = project(&weather);
    let served = support::KeelServer::start_in(project.path(), &["--store", "memory"]);
    for err in each(&format!("{}/agents/nope", served.url.trim_end_matches('/'))) {
        assert!(err.contains("no agent is named `nope`"), "{err}");
        assert!(err.contains("`assistant` (/agents/assistant/)"), "{err}");
    }

    // One agent served at `/` only: its card names it.
    let demo = support::KeelServer::start(&[]);
    for err in each(&format!("{}/agents/nope", demo.url.trim_end_matches('/'))) {
        assert!(
            err.contains("HTTP 404") && err.contains("serves the agent `keel-demo`"),
            "{err}"
        );
    }
}

#[test]
fn threads_compact_shrinks_what_the_model_sees_of_a_served_thread() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::KeelServer::start(&[]);
    for turn in 1..=4 {
        keel(dir.path())
            .args(["send", "--url", &server.url, "--thread", "th-long"])
            .arg(format!("turn {turn}"))
            .assert()
            .success();
    }
    let compacted = keel(dir.path())
        .args([
            "threads",
            "compact",
            "th-long",
            "--max-messages",
            "3",
            "--json",
        ])
        .args(["--url", &server.url])
        .output()
        .unwrap();
    assert!(compacted.status.success(), "{}", text(&compacted.stderr));
    let result: Value = serde_json::from_slice(&compacted.stdout).unwrap();
    assert_eq!(result["strategy"], "recent", "{result}");
    assert_eq!(result["after_messages"], 3, "{result}");
    assert!(result["before_messages"].as_u64().unwrap() > 3, "{result}");
    // The thread goes on after it.
    keel(dir.path())
        .args([
            "send",
            "--url",
            &server.url,
            "--thread",
            "th-long",
            "turn 5",
        ])
        .assert()
        .success();
}

/// `keel ARGS` on a pseudo-terminal (tests/python/on_a_terminal.py), in `dir`: its exit
/// status and what the terminal showed (stdout and stderr together).
#[cfg(unix)]
fn on_a_terminal(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let script = support::workspace_root().join("tests/python/on_a_terminal.py");
    let run = std::process::Command::new("python3")
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .output()
        .expect("python3 runs the terminal script");
    let seen: Value = serde_json::from_slice(&run.stdout)
        .unwrap_or_else(|_| panic!("{}\n{}", text(&run.stdout), text(&run.stderr)));
    let status = seen["status"].as_i64().map(|code| code as i32);
    // Colours and cursor moves (`ESC [ ... letter`) dropped: the text as a person reads it.
    let mut shown = String::new();
    let mut chars = seen["output"].as_str().unwrap_or_default().chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().skip(1).find(char::is_ascii_alphabetic);
        } else {
            shown.push(c);
        }
    }
    (status, shown)
}

/// Issue 43, item 12: on a terminal the answer is shown once, by `keel run` here and by
/// `keel run --url` against a server (which shows it as the task's artifact); to a pipe it
/// is still printed on stdout.
#[cfg(unix)]
#[test]
fn on_a_terminal_the_answer_is_shown_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::KeelServer::start(&[]);
    let answer = "You said: hello there";
    for args in [
        &["run", "--store", "memory", "hello there"][..],
        &["run", "--url", &server.url, "hello there"][..],
    ] {
        let (status, shown) = on_a_terminal(dir.path(), args);
        assert_eq!(status, Some(0), "{args:?}: {shown}");
        assert_eq!(shown.matches(answer).count(), 1, "{args:?}:\n{shown}");
        let piped = keel(dir.path()).args(args).output().unwrap();
        assert_eq!(text(&piped.stdout).trim_end(), answer, "{args:?}");
    }
}

/// Issue 43, item 12: client commands log no `INFO` lines unless `-v` asks (with no
/// `RUST_LOG` set; it is documented to override both).
#[test]
fn client_commands_log_info_lines_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let run = |verbose: &[&str]| {
        let output = keel(dir.path())
            .env_remove("RUST_LOG")
            .args(verbose)
            .args(["run", "--store", "memory", r#"/word_count {"text": "a b"}"#])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stderr)
    };
    let quiet = run(&[]);
    assert!(!quiet.contains("INFO"), "{quiet}");
    let told = run(&["-v"]);
    assert!(
        told.contains(" INFO ") && told.contains("run ended"),
        "{told}"
    );
}

/// Issue 43, item 16: without `--url`, `keel threads compact` compacts a thread of the local
/// store (the one `keel run` wrote), and refuses a store that does not exist without making it.
#[test]
fn threads_compact_without_a_url_compacts_a_thread_of_the_local_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    for turn in 1..=4 {
        keel(dir.path())
            .args(["run", "--store", &store, "--thread", "th-local"])
            .arg(format!("turn {turn}"))
            .assert()
            .success();
    }
    let compacted = keel(dir.path())
        .args(["threads", "compact", "th-local", "--max-messages", "3"])
        .args(["--json", "--store", &store])
        .output()
        .unwrap();
    assert!(compacted.status.success(), "{}", text(&compacted.stderr));
    let result: Value = serde_json::from_slice(&compacted.stdout).unwrap();
    assert_eq!(result["strategy"], "recent", "{result}");
    assert_eq!(result["after_messages"], 3, "{result}");
    assert!(result["before_messages"].as_u64().unwrap() > 3, "{result}");
    keel(dir.path())
        .args(["run", "--store", &store, "--thread", "th-local", "turn 5"])
        .assert()
        .success();

    // A thread the store does not have is named as unknown, not "compacted".
    let unknown = keel(dir.path())
        .args(["threads", "compact", "th-misspelt", "--store", &store])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(1));
    let err = text(&unknown.stderr);
    assert!(
        err.contains("cannot compact thread th-misspelt: thread not found"),
        "{err}"
    );

    let elsewhere = tempfile::tempdir().unwrap();
    let missing = keel(elsewhere.path())
        .args(["threads", "compact", "th-local"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let err = text(&missing.stderr);
    assert!(err.contains("no store at ./keel.db"), "{err}");
    assert!(!elsewhere.path().join("keel.db").exists());
}

/// Issue 43, item 15: on a terminal, after an approval prompt is answered (by either key),
/// the first Ctrl-D at `you>` ends the chat.
#[cfg(unix)]
#[test]
fn chat_on_a_terminal_ends_on_the_first_ctrl_d_after_an_approval_prompt() {
    let weather = WeatherService::start();
    let dir = project(&weather);
    let script = support::workspace_root().join("tests/python/chat_on_a_terminal.py");
    for key in ["y", "n"] {
        let run = std::process::Command::new("python3")
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .arg(&script)
            .args([env!("CARGO_BIN_EXE_keel"), key])
            .output()
            .expect("python3 runs the terminal script");
        let seen: Value = serde_json::from_slice(&run.stdout)
            .unwrap_or_else(|_| panic!("{}\n{}", text(&run.stdout), text(&run.stderr)));
        assert_eq!(seen["prompted"], true, "{seen}");
        assert_eq!(seen["answered"], true, "{seen}");
        assert_eq!(seen["ended_on_first_ctrl_d"], true, "{seen}");
    }
    assert_eq!(weather.calls(), 1, "approved once, denied once");
}

#[test]
fn a_model_failure_goes_to_stderr_with_the_endpoint_it_tried() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let llm = format!("openai-compatible:http://127.0.0.1:{port}/v1:m");
    // In process, and through a server whose model fails (`send`, `run --url`): the same.
    let server = support::KeelServer::start(&["--llm", &llm]);
    for args in [
        &["run", "--store", "memory", "--llm", &llm, "hi"][..],
        &["send", "--url", &server.url, "hi"][..],
        &["run", "--url", &server.url, "hi"][..],
    ] {
        let run = keel(dir.path()).args(args).output().unwrap();
        assert_eq!(run.status.code(), Some(1), "{args:?}");
        assert_eq!(text(&run.stdout), "", "{args:?}: a failure is no answer");
        let err = text(&run.stderr);
        assert!(
            err.contains(&format!("at http://127.0.0.1:{port}/v1/chat/completions")),
            "{args:?}: {err}"
        );
    }
}

/// The instructions `keel init` writes, and a longer version of them: 44 characters (11
/// estimated tokens) against 65 (17).
const INSTRUCTIONS: &str = "You are a helpful assistant. Answer briefly.";
const CHANGED_INSTRUCTIONS: &str =
    "You are a helpful assistant. Answer briefly and politely, always.";

/// A copy of the project's `keel.toml` at `changed.toml` with the assistant's instructions
/// changed.
fn changed_config(dir: &Path) -> std::path::PathBuf {
    let file = std::fs::read_to_string(dir.join("keel.toml")).unwrap();
    assert!(
        file.contains(INSTRUCTIONS),
        "the template's instructions moved"
    );
    let changed = dir.join("changed.toml");
    std::fs::write(&changed, file.replace(INSTRUCTIONS, CHANGED_INSTRUCTIONS)).unwrap();
    changed
}

/// `keel run` of the weather question (with `config` when given), exported to `file`; the
/// run's id.
fn record_weather_run(dir: &Path, config: Option<&Path>, file: &Path) -> String {
    let with_config = |command: &mut Command| {
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
    };
    let mut run = keel(dir);
    run.args(["run", ASK_WEATHER]);
    with_config(&mut run);
    run.assert().success();
    let mut list = keel(dir);
    list.args(["runs", "list", "--limit", "1", "--json"]);
    with_config(&mut list);
    let listed: Value =
        serde_json::from_slice(&list.assert().success().get_output().stdout).unwrap();
    let run_id = listed["runs"][0]["run_id"].as_str().unwrap().to_owned();
    let mut export = keel(dir);
    export.args(["runs", "export", &run_id, "-o"]).arg(file);
    with_config(&mut export);
    export.assert().success();
    run_id
}

#[test]
fn replay_finds_no_divergence_in_an_exported_run_and_a_changed_prompt_at_step_1() {
    let weather = WeatherService::start();
    let dir = plain_project(&weather);
    let file = dir.path().join("run.json");
    let run_id = record_weather_run(dir.path(), None, &file);
    assert_eq!(weather.calls(), 1);

    // The export is the report with the user's message that started the run.
    let exported: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(exported["run_id"], run_id.as_str());
    assert_eq!(exported["final_state"], "completed");
    assert_eq!(exported["input"]["role"], "user");
    assert_eq!(exported["input"]["parts"][0]["text"], ASK_WEATHER);
    assert!(
        exported["input"].get("task_id").is_none(),
        "{}",
        exported["input"]
    );

    // Unchanged: no divergence, from the file and from the store, and the tool is not called.
    for target in [file.to_str().unwrap(), run_id.as_str()] {
        let same = keel(dir.path()).args(["replay", target]).assert().code(0);
        let out = text(&same.get_output().stdout);
        assert_eq!(
            out.trim(),
            format!(
                "no divergence: run {run_id} through agent `assistant` (2 model calls, final \
                 state completed)"
            ),
        );
    }
    let verdict = keel(dir.path())
        .args(["replay", "--json"])
        .arg(&file)
        .assert()
        .code(0);
    let verdict: Value = serde_json::from_slice(&verdict.get_output().stdout).unwrap();
    assert_eq!(verdict["passed"], true, "{verdict}");
    assert_eq!(verdict["divergence"], Value::Null, "{verdict}");
    assert_eq!(verdict["run_id"], run_id.as_str());
    assert_eq!(weather.calls(), 1, "a replay called the tool");

    // Changed instructions: the model is sent something else at step 1.
    let changed = changed_config(dir.path());
    let diverged = keel(dir.path())
        .arg("replay")
        .arg(&file)
        .arg("--config")
        .arg(&changed)
        .assert()
        .code(1);
    let out = text(&diverged.get_output().stdout);
    for shown in [
        format!("diverged: run {run_id} through agent `assistant`"),
        "first divergence at step 1, event #3 `context.prepared`, field \
         `payload.manifest.context_items.0.tokens`:"
            .to_owned(),
        "- recorded: 11".to_owned(),
        "+ now:      17".to_owned(),
        "its `system` section, the instructions".to_owned(),
    ] {
        assert!(out.contains(&shown), "`{shown}` not in:\n{out}");
    }
    let verdict = keel(dir.path())
        .args(["replay", "--json", "--config"])
        .arg(&changed)
        .arg(&file)
        .assert()
        .code(1);
    let verdict: Value = serde_json::from_slice(&verdict.get_output().stdout).unwrap();
    assert_eq!(verdict["passed"], false);
    assert_eq!(
        verdict["divergence"],
        json!({
            "step": 1,
            "sequence": 3,
            "event": "context.prepared",
            "field": "payload.manifest.context_items.0.tokens",
            "recorded": 11,
            "now": 17,
        })
    );
    assert_eq!(verdict["model_input_section"], "system");
    assert_eq!(weather.calls(), 1, "a replay called the tool");

    // What cannot be replayed exits 2, saying why.
    let missing = keel(dir.path()).args(["replay", "nope"]).assert().code(2);
    let err = text(&missing.get_output().stderr);
    assert!(err.contains("cannot replay `nope`: no run `nope`"), "{err}");
}

/// The run of the store `keel runs list --json` lists first (the newest).
fn newest_run(dir: &Path) -> Value {
    let listed = keel(dir)
        .args(["runs", "list", "--limit", "1", "--json"])
        .assert()
        .success();
    let listed: Value = serde_json::from_slice(&listed.get_output().stdout).unwrap();
    listed["runs"][0].clone()
}

#[test]
fn replay_fork_at_goes_on_live_from_that_model_call_as_a_new_run_linked_to_its_source() {
    let weather = WeatherService::start();
    let dir = plain_project(&weather);
    let file = dir.path().join("run.json");
    let run_id = record_weather_run(dir.path(), None, &file);
    assert_eq!(weather.calls(), 1);

    // At model call 2: call 1 and its tool result come from the recording (the tool does not
    // run again), call 2 is the agent's own model, live.
    let forked = keel(dir.path())
        .args(["replay", &run_id, "--fork-at", "2", "--json"])
        .assert()
        .code(0);
    let forked: Value = serde_json::from_slice(&forked.get_output().stdout).unwrap();
    assert_eq!(
        forked["forked_from"],
        json!({ "run_id": run_id, "step": 2 }),
        "{forked}"
    );
    assert_eq!(forked["final_state"], "completed", "{forked}");
    assert_eq!(forked["agent"], "assistant");
    assert_eq!(weather.calls(), 1, "the recorded tool result stood in");
    let fork_id = forked["run_id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, run_id);

    // The fork is a run of the store, and says where it came from.
    let newest = newest_run(dir.path());
    assert_eq!(newest["run_id"], fork_id.as_str(), "{newest}");
    assert_eq!(
        newest["forked_from"],
        json!({ "run_id": run_id, "step": 2 })
    );
    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_ne!(
        newest["thread_id"], recorded["thread_id"],
        "a fork writes into a thread of its own, not the recorded conversation"
    );
    let table = keel(dir.path()).args(["runs", "list"]).assert().success();
    let table = text(&table.get_output().stdout);
    assert!(table.contains("FORKED FROM"), "{table}");
    let fork_line = table.lines().find(|l| l.starts_with(&fork_id)).unwrap();
    assert!(fork_line.ends_with(&format!("{run_id}@2")), "{fork_line}");
    let source_line = table.lines().find(|l| l.starts_with(&run_id)).unwrap();
    assert!(source_line.ends_with(" -"), "{source_line}");

    // At model call 1 from the exported file: everything is live, the tool runs for real.
    let forked = keel(dir.path())
        .args(["replay", "--fork-at", "1"])
        .arg(&file)
        .assert()
        .code(0);
    let out = text(&forked.get_output().stdout);
    assert!(
        out.starts_with("forked run ")
            && out.contains(&format!("from run {run_id} at model call 1, through agent `assistant`: final state completed")),
        "{out}"
    );
    assert_eq!(weather.calls(), 2, "the fork's live step called the tool");

    // A step that does not exist is a clear refusal.
    let zero = keel(dir.path())
        .args(["replay", &run_id, "--fork-at", "0"])
        .assert()
        .code(2);
    let err = text(&zero.get_output().stderr);
    assert!(
        err.contains(&format!(
            "cannot fork `{run_id}`: --fork-at counts model calls from 1"
        )),
        "{err}"
    );
}

#[test]
fn test_replays_a_folder_of_exported_runs_and_counts_passed_and_diverged() {
    let weather = WeatherService::start();
    let dir = plain_project(&weather);
    let runs = dir.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    // One run recorded before the instructions changed, one after.
    record_weather_run(dir.path(), None, &runs.join("1-before.json"));
    let changed = changed_config(dir.path());
    record_weather_run(dir.path(), Some(&changed), &runs.join("2-after.json"));
    assert_eq!(weather.calls(), 2);

    let tested = keel(dir.path())
        .args(["test", "runs", "--config"])
        .arg(&changed)
        .assert()
        .code(1);
    let out = text(&tested.get_output().stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("DIVERGED ") && lines[0].ends_with("1-before.json"),
        "{out}"
    );
    assert!(
        out.contains("first divergence at step 1, event #3 `context.prepared`"),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ok ") && l.ends_with("2-after.json")),
        "{out}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("2 runs: 1 passed, 1 diverged, 0 not replayed"),
        "{out}"
    );

    // A run of an older report format is not replayed, and says why.
    let mut old: Value =
        serde_json::from_str(&std::fs::read_to_string(runs.join("2-after.json")).unwrap()).unwrap();
    old["version"] = json!(6);
    std::fs::write(runs.join("3-old.json"), old.to_string()).unwrap();
    let tested = keel(dir.path())
        .args(["test", "runs", "--json", "--config"])
        .arg(&changed)
        .assert()
        .code(1);
    let summary: Value = serde_json::from_slice(&tested.get_output().stdout).unwrap();
    assert_eq!(
        (
            &summary["passed"],
            &summary["diverged"],
            &summary["not_replayed"]
        ),
        (&json!(1), &json!(1), &json!(1)),
        "{summary}"
    );
    let verdicts = summary["runs"].as_array().unwrap();
    assert_eq!(verdicts.len(), 3, "{summary}");
    assert_eq!(verdicts[0]["divergence"]["step"], 1, "{summary}");
    assert_eq!(verdicts[1]["passed"], true, "{summary}");
    let error = verdicts[2]["error"].as_str().unwrap();
    assert!(
        error.contains("a run recorded in report format 6 cannot be replayed"),
        "{error}"
    );

    // Only the runs that agree: exit 0.
    std::fs::remove_file(runs.join("1-before.json")).unwrap();
    std::fs::remove_file(runs.join("3-old.json")).unwrap();
    let passed = keel(dir.path())
        .args(["test", "runs", "--config"])
        .arg(&changed)
        .assert()
        .code(0);
    let out = text(&passed.get_output().stdout);
    assert_eq!(
        out.lines().last(),
        Some("1 run: 1 passed, 0 diverged, 0 not replayed"),
        "{out}"
    );
    assert_eq!(weather.calls(), 2, "a replay called the tool");
}
