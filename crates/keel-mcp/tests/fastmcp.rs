//! Keel's MCP client against a server built with the Python SDK's FastMCP: over streamable
//! HTTP behind a bearer token (calls, `isError`, cancellation and timeouts that reach the
//! server, the run's trace context in `_meta` and headers), over stdio (a server killed
//! during a call, the trace context in `_meta`), and servers that never start.

mod support;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use keel_agent::{SendOptions, Tool, ToolSource};
use keel_core::{AgentError, Message, RunContext, TaskState, TraceParent};
use keel_events::payload::ActionCompletedPayload;
use keel_events::{InMemoryEventSink, RunEvent};
use keel_llm::{MockLlm, MockResponse, ToolCall};
use keel_mcp::{Header, McpError, McpServer, McpToolSet, ServerSpec, TransportSpec};
use keel_runtime::testing::eventually;
use serde_json::json;
use support::{call, completed, executor, serving, tools_of};

const TOKEN: &str = "fixture-token";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fastmcp_server.py")
}

/// The fixture over HTTP, killed when dropped.
struct HttpFixture {
    child: Child,
    url: String,
    markers: tempfile::TempDir,
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpFixture {
    fn start() -> Self {
        let markers = tempfile::tempdir().unwrap();
        let mut child = Command::new(support::python())
            .arg(fixture())
            .args(["http", TOKEN])
            .arg(markers.path())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the FastMCP fixture starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the fixture prints its port");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            markers,
        }
    }

    fn spec(&self, token: &str) -> ServerSpec {
        ServerSpec::new(
            "fixture",
            TransportSpec::Http {
                url: self.url.clone(),
                headers: vec![Header {
                    name: "Authorization".into(),
                    value: format!("Bearer {token}"),
                    secret: true,
                }],
            },
            format!("{} (Authorization: Bearer ****)", self.url),
        )
    }

    fn marker(&self, name: &str) -> bool {
        self.markers.path().join(name).exists()
    }
}

#[tokio::test]
async fn a_call_over_http_with_a_bearer_token_returns_the_result() {
    let fixture = HttpFixture::start();
    let server = McpServer::start(fixture.spec(TOKEN)).await.unwrap();
    let tools = tools_of(&server).await;
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    // `weird.name` is offered as a name every provider accepts.
    support::assert_offered(
        &names,
        &[
            "fixture_add",
            "fixture_fail",
            "fixture_slow",
            "fixture_weird_name",
        ],
    );
    let exec = executor(&tools, |b| b);
    let output = call(&exec, "fixture_add", json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    // FastMCP gives an int result as structured content.
    assert_eq!(output, json!({"result": 5}));
    server.shutdown().await;
}

/// A caller's trace context, which a run given it continues.
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CALLER_STATE: &str = "keel=test";

/// The `action.completed` event of the run's only tool call.
fn completed_call(events: &[RunEvent]) -> RunEvent {
    let completed: Vec<&RunEvent> = events.iter().filter(|e| e.is("action.completed")).collect();
    assert_eq!(completed.len(), 1, "{events:#?}");
    completed[0].clone()
}

/// The `traceparent` a tool call of the caller's trace sends: the caller's trace, under the
/// span of the tool call `event` belongs to (the id its exported span has, decision 181).
fn expected_traceparent(event: &RunEvent) -> String {
    let trace = TraceParent::parse(CALLER).unwrap().trace_id.to_hex();
    assert_eq!(event.trace_id.as_deref(), Some(trace.as_str()));
    let span = event.span_id.as_deref().unwrap();
    format!("00-{trace}-{span}-01")
}

#[tokio::test]
async fn a_runs_tool_call_sends_its_trace_context_in_meta_and_http_headers() {
    let fixture = HttpFixture::start();
    let (server, exec) = serving(fixture.spec(TOKEN)).await;
    let events = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(events.clone());
    let auth = exec.runtime().auth_service().auth_context();
    let context = RunContext::new().continuing_trace(
        &TraceParent::parse(CALLER).unwrap(),
        Some(CALLER_STATE.into()),
    );
    let options = SendOptions {
        run_context: Some(context),
        ..SendOptions::default()
    };
    let task = exec
        .send_message(&auth, Message::user("/fixture_trace {}"), options)
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::Completed);
    let call = completed_call(&events.events());
    let seen = call.payload_as::<ActionCompletedPayload>().unwrap().output;
    let traceparent = expected_traceparent(&call);
    assert_eq!(
        seen,
        json!({
            "meta_traceparent": traceparent,
            "meta_tracestate": CALLER_STATE,
            "header_traceparent": traceparent,
            "header_tracestate": CALLER_STATE,
        })
    );
    server.shutdown().await;
}

/// The error starting `spec` fails with, which must be [`McpError::NotStarted`].
async fn not_started(spec: ServerSpec) -> McpError {
    let err = McpServer::start(spec)
        .await
        .err()
        .expect("the server started");
    assert!(matches!(err, McpError::NotStarted { .. }), "{err:?}");
    err
}

#[tokio::test]
async fn a_wrong_token_is_a_start_error_naming_the_server_without_the_secret() {
    let fixture = HttpFixture::start();
    let err = not_started(fixture.spec("wrong-token")).await;
    let McpError::NotStarted { server, shown, .. } = &err else {
        unreachable!()
    };
    assert_eq!(server, "fixture");
    assert!(shown.contains(&fixture.url), "{shown}");
    let text = err.to_string();
    assert!(
        text.starts_with("MCP server `fixture` (http://127.0.0.1:"),
        "{text}"
    );
    assert!(!text.contains("wrong-token"), "{text}");
}

#[tokio::test]
async fn an_is_error_result_is_a_tool_error_the_model_reads_and_the_run_goes_on() {
    let fixture = HttpFixture::start();
    let (server, exec) = serving(fixture.spec(TOKEN)).await;
    let err = call(&exec, "fixture_fail", json!({"reason": "because"}))
        .await
        .unwrap_err();
    let AgentError::ToolFailed { tool, message } = &err else {
        panic!("expected ToolFailed, got {err:?}");
    };
    assert_eq!(tool, "fixture_fail");
    assert!(message.contains("refused: because"), "{message}");
    // In a run, the model reads the error and answers: the task completes.
    let task = completed(&exec, r#"/fixture_fail {"reason": "no"}"#).await;
    let answer = task.status().message.as_ref().unwrap().text();
    assert!(answer.contains("refused: no"), "{answer}");
    server.shutdown().await;
}

#[tokio::test]
async fn canceling_the_task_cancels_the_mcp_request_on_the_server() {
    let fixture = HttpFixture::start();
    let (server, exec) = serving(fixture.spec(TOKEN)).await;
    let auth = exec.runtime().auth_service().auth_context();
    let task = exec
        .send_message(
            &auth,
            Message::user(r#"/fixture_slow {"seconds": 60}"#),
            SendOptions::in_background(),
        )
        .await
        .unwrap();
    eventually("the slow call reached the server", || async {
        fixture.marker("started")
    })
    .await;
    exec.cancel_task(&auth, &task.id, None).await.unwrap();
    eventually("the server saw the cancellation", || async {
        fixture.marker("cancelled")
    })
    .await;
    let task = eventually("the task rests canceled", || {
        let (exec, auth, id) = (exec.clone(), auth.clone(), task.id.clone());
        async move {
            let task = exec.get_task(&auth, &id, None).await.unwrap();
            (task.state() == TaskState::Canceled).then_some(task)
        }
    })
    .await;
    assert_eq!(task.state(), TaskState::Canceled);
    server.shutdown().await;
}

#[tokio::test]
async fn a_call_past_its_timeout_fails_and_the_server_sees_it_cancelled() {
    let fixture = HttpFixture::start();
    let mut spec = fixture.spec(TOKEN);
    spec.call_timeout = Duration::from_millis(1500);
    let (server, exec) = serving(spec).await;
    let err = call(&exec, "fixture_slow", json!({"seconds": 60}))
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::ToolFailed { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "tool `fixture_slow` failed: MCP server `fixture`: `slow` gave no result within 1.5s",
        "the tool is named once"
    );
    eventually("the server saw the cancellation", || async {
        fixture.marker("cancelled")
    })
    .await;
    server.shutdown().await;
}

/// The names of the tools a model request offered, sorted.
fn offered(request: &keel_llm::LlmRequest) -> Vec<String> {
    let mut names: Vec<String> = request.tools.iter().map(|t| t.name.clone()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_tool_list_change_is_offered_at_the_next_step() {
    let fixture = HttpFixture::start();
    let server = McpServer::start(fixture.spec(TOKEN)).await.unwrap();
    let set = Arc::new(McpToolSet::connect(vec![server.clone()]).await.unwrap());
    let llm = Arc::new(MockLlm::scripted(vec![
        MockResponse::ToolCalls(vec![ToolCall::new("fixture_change_tools", json!({}))]),
        MockResponse::ToolCalls(vec![ToolCall::new(
            "fixture_multiply",
            json!({"a": 6, "b": 7}),
        )]),
        MockResponse::Text("done".into()),
    ]));
    let exec = executor(&[], |b| {
        b.llm_shared(llm.clone())
            .tool_source(set.clone() as Arc<dyn ToolSource>)
    });
    completed(&exec, "change them").await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        offered(&requests[0]),
        [
            "fixture_add",
            "fixture_change_tools",
            "fixture_fail",
            "fixture_slow",
            "fixture_trace",
            "fixture_weird_name"
        ]
    );
    // The step after the change offers `multiply` and no longer `weird.name`.
    let changed = [
        "fixture_add",
        "fixture_change_tools",
        "fixture_fail",
        "fixture_multiply",
        "fixture_slow",
        "fixture_trace",
    ];
    assert_eq!(offered(&requests[1]), changed);
    assert_eq!(offered(&requests[2]), changed);
    // The new tool was called on the server, and its result is what the model read.
    let result = requests[2].messages.last().unwrap();
    assert_eq!(result.tool_name.as_deref(), Some("fixture_multiply"));
    assert_eq!(result.content, r#"{"result":42}"#);
    let names: Vec<String> = exec
        .agent()
        .tool_specs()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(names.contains(&"fixture_multiply".to_owned()), "{names:?}");
    server.shutdown().await;
}

/// A stdio server `name` running `command` with `args`, shown as `shown`.
fn stdio(name: &str, command: &str, args: &[&str], shown: &str) -> ServerSpec {
    let transport = TransportSpec::Stdio {
        command: command.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: Vec::new(),
        cwd: None,
    };
    ServerSpec::new(name, transport, shown)
}

/// The fixture over stdio.
fn stdio_spec(markers: &Path) -> ServerSpec {
    let python = support::python().display().to_string();
    let script = fixture().display().to_string();
    let markers = markers.display().to_string();
    stdio(
        "fixture",
        &python,
        &[&script, "stdio", &markers],
        &format!("{python} fastmcp_server.py stdio"),
    )
}

#[tokio::test]
async fn a_stdio_server_killed_during_a_call_fails_that_call_and_the_next_call_restarts_it() {
    let markers = tempfile::tempdir().unwrap();
    let server = McpServer::start(stdio_spec(markers.path())).await.unwrap();
    let tools = tools_of(&server).await;
    let slow = tools.iter().find(|t| t.name() == "fixture_slow").unwrap();
    // `slow` has no annotations: not idempotent, so it is not retried.
    assert!(!slow.idempotent());
    let exec = executor(&tools, |b| b);
    let first = server.process_id().await.unwrap();
    let slow_call = tokio::spawn({
        let exec = exec.clone();
        async move { call(&exec, "fixture_slow", json!({"seconds": 60})).await }
    });
    let started = markers.path().join("started");
    eventually("the call reached the server", || {
        let started = started.clone();
        async move { started.exists() }
    })
    .await;
    support::kill(first);
    let err = tokio::time::timeout(Duration::from_secs(20), slow_call)
        .await
        .expect("the call ends when the server dies")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, AgentError::ToolFailed { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "tool `fixture_slow` failed: MCP server `fixture` stopped during the call of `slow`; it \
         is started again on the next call"
    );
    let output = call(&exec, "fixture_add", json!({"a": 1, "b": 1}))
        .await
        .unwrap();
    assert_eq!(output, json!({"result": 2}));
    assert_ne!(server.process_id().await.unwrap(), first);
    server.shutdown().await;
}

#[tokio::test]
async fn a_tool_call_over_stdio_sends_its_trace_context_in_meta() {
    let markers = tempfile::tempdir().unwrap();
    let (server, exec) = serving(stdio_spec(markers.path())).await;
    let events = Arc::new(InMemoryEventSink::new());
    exec.add_event_sink(events.clone());
    let auth = exec.runtime().auth_service().auth_context();
    let context = RunContext::new().continuing_trace(&TraceParent::parse(CALLER).unwrap(), None);
    let seen = exec
        .call_tool_in_context(
            &auth,
            keel_core::ThreadId::new(),
            "fixture_trace",
            json!({}),
            context,
        )
        .await
        .unwrap();
    let call = completed_call(&events.events());
    assert_eq!(
        seen,
        json!({
            "meta_traceparent": expected_traceparent(&call),
            "meta_tracestate": null,
            "header_traceparent": null,
            "header_tracestate": null,
        })
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_command_that_cannot_run_is_a_start_error_naming_server_and_command() {
    let spec = stdio(
        "ghost",
        "keel-no-such-mcp-server",
        &[],
        "keel-no-such-mcp-server --flag",
    );
    let err = not_started(spec).await;
    let text = err.to_string();
    assert!(
        text.starts_with(
            "MCP server `ghost` (keel-no-such-mcp-server --flag) did not start: cannot run it:"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_server_that_exits_at_once_is_a_start_error_with_what_it_printed() {
    let spec = stdio(
        "quitter",
        "sh",
        &["-c", "echo 'missing API key' >&2; exit 3"],
        "sh -c …",
    );
    let err = not_started(spec).await;
    let McpError::NotStarted { server, stderr, .. } = &err else {
        unreachable!()
    };
    assert_eq!(server, "quitter");
    assert_eq!(stderr, "missing API key");
}

#[tokio::test]
async fn env_reaches_a_stdio_server() {
    let mut spec = support::everything_spec();
    if let TransportSpec::Stdio { env, .. } = &mut spec.transport {
        env.push(("KEEL_MCP_TEST_VALUE".into(), "from-keel".into()));
    }
    let (server, exec) = serving(spec).await;
    let output = call(&exec, "everything_get-env", json!({})).await.unwrap();
    let env: serde_json::Value = serde_json::from_str(output.as_str().unwrap()).unwrap();
    assert_eq!(env["KEEL_MCP_TEST_VALUE"], "from-keel");
    server.shutdown().await;
}

#[tokio::test]
async fn a_stdio_server_runs_in_its_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    // Markers in `.`: they land in the working directory given.
    let mut spec = stdio_spec(Path::new("."));
    if let TransportSpec::Stdio { cwd, .. } = &mut spec.transport {
        *cwd = Some(dir.path().to_owned());
    }
    let (server, exec) = serving(spec).await;
    let output = call(&exec, "fixture_slow", json!({"seconds": 0}))
        .await
        .unwrap();
    assert_eq!(output, json!({"result": "slept"}));
    assert!(dir.path().join("started").exists());
    server.shutdown().await;
}
