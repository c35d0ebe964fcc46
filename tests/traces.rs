//! Traces of `keel serve` (docs/observability.md#traces): spans by the OpenTelemetry GenAI
//! conventions, exported over OTLP/HTTP to a receiver in the test that decodes them with the
//! `opentelemetry-proto` types, and the same span ids in the run's report.

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use keel_runtime::testing::eventually;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point, Metric};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use support::KeelServer;

/// The demo agent's offline model calls `word_count` for this message, then answers.
const TOOL_MESSAGE: &str = r#"/word_count {"text": "one two three"}"#;

/// A span as received, with its process's `service.name`.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
    fn trace_id(&self) -> String {
        Self::hex(&self.span.trace_id)
    }
    fn span_id(&self) -> String {
        Self::hex(&self.span.span_id)
    }
    fn parent_id(&self) -> Option<String> {
        (!self.span.parent_span_id.is_empty()).then(|| Self::hex(&self.span.parent_span_id))
    }
    fn attribute(&self, key: &str) -> Option<String> {
        string_of(&self.span.attributes, key)
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1: every span posted to `/v1/traces`, and every
/// metric posted to `/v1/metrics` with its process's `service.name`.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
    metrics: Arc<Mutex<Vec<(String, Metric)>>>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let app = axum::Router::new()
            .route("/v1/traces", post(receive))
            .route("/v1/metrics", post(receive_metrics))
            .with_state(receiver.clone());
        let base = support::serve(app).await;
        (receiver, base)
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// The value of the sum `name` of `service` at its latest export, for the data point
    /// whose attributes include `labels`; `None` until one is received.
    fn sum(&self, service: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let metrics = self.metrics.lock().unwrap();
        let (_, metric) = metrics
            .iter()
            .rev()
            .find(|(s, m)| s == service && m.name == name)?;
        let Some(Data::Sum(sum)) = &metric.data else {
            panic!("{name} is not a sum: {metric:?}")
        };
        sum.data_points
            .iter()
            .find(|point| {
                labels
                    .iter()
                    .all(|(k, v)| string_of(&point.attributes, k).as_deref() == Some(*v))
            })
            .map(|point| match point.value {
                Some(number_data_point::Value::AsInt(v)) => v as f64,
                Some(number_data_point::Value::AsDouble(v)) => v,
                None => 0.0,
            })
    }

    /// The spans of `trace`, once its run span (named `invoke_agent ...`) of `service`
    /// has arrived.
    async fn trace_of(&self, service: &str) -> Vec<Received> {
        eventually("the run's span is exported", || async {
            let spans = self.spans();
            let run = spans
                .iter()
                .find(|s| s.service == service && s.span.name.starts_with("invoke_agent "))?;
            let trace = run.trace_id();
            Some(
                spans
                    .into_iter()
                    .filter(|s| s.trace_id() == trace)
                    .collect::<Vec<_>>(),
            )
        })
        .await
    }
}

/// The value of the attribute `key` among `attributes`, as a string (an array's strings in
/// `Debug` form).
fn string_of(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        AnyValue::ArrayValue(a) => format!(
            "{:?}",
            a.values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(AnyValue::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        ),
        other => format!("{other:?}"),
    })
}

/// The `service.name` of an export's `resource`.
fn service_of(resource: Option<&Resource>) -> String {
    resource
        .and_then(|r| string_of(&r.attributes, "service.name"))
        .unwrap_or_default()
}

async fn receive_metrics(State(receiver): State<Receiver>, body: Bytes) -> Vec<u8> {
    let request = ExportMetricsServiceRequest::decode(body).expect("OTLP protobuf");
    let mut received = receiver.metrics.lock().unwrap();
    for resource in request.resource_metrics {
        let service = service_of(resource.resource.as_ref());
        for scope in resource.scope_metrics {
            for metric in scope.metrics {
                received.push((service.clone(), metric));
            }
        }
    }
    ExportMetricsServiceResponse::default().encode_to_vec()
}

async fn receive(State(receiver): State<Receiver>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
    let mut received = receiver.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = service_of(resource.resource.as_ref());
        for scope in resource.scope_spans {
            for span in scope.spans {
                received.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

/// Send `text` (with `traceparent`, when given) and return the finished task's id.
async fn run_task(url: &str, text: &str, traceparent: Option<&str>) -> String {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": text}]}}
    });
    let mut request = reqwest::Client::new()
        .post(url)
        .header("A2A-Version", "1.0")
        .json(&body);
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let answer: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{answer}"
    );
    answer["result"]["task"]["id"].as_str().unwrap().to_owned()
}

/// The environment that has a server export to the receiver at `endpoint` as `service`;
/// tests push what else they set.
fn otlp_env<'a>(endpoint: &'a str, service: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_SERVICE_NAME", service),
        // Sent within 50 ms of ending rather than the default 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ]
}

/// A server on `store` with this environment.
fn start(store: &str, env: &[(&str, &str)]) -> KeelServer {
    KeelServer::start_with_env(&["--store", store], env)
}

/// A `keel.toml` holding `toml` in `dir`: its path, as `--config` takes it.
fn config_in(dir: &tempfile::TempDir, toml: &str) -> String {
    let config = dir.path().join("keel.toml");
    std::fs::write(&config, toml).unwrap();
    config.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_run_is_exported_as_genai_spans_whose_ids_its_events_carry() {
    let (receiver, endpoint) = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let server = start(&store, &otlp_env(&endpoint, "keel-traces-test"));
    let task_id = run_task(&server.url, TOOL_MESSAGE, None).await;
    let spans = receiver.trace_of("keel-traces-test").await;

    let named =
        |name: &str| -> Vec<&Received> { spans.iter().filter(|s| s.span.name == name).collect() };
    let run = named("invoke_agent keel-demo");
    assert_eq!(run.len(), 1, "{spans:#?}");
    let run = run[0];
    assert_eq!(
        run.parent_id(),
        None,
        "no caller: the run is the trace's root"
    );
    assert_eq!(
        run.attribute("gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(
        run.attribute("gen_ai.agent.name").as_deref(),
        Some("keel-demo")
    );
    assert_eq!(
        run.attribute("keel.task.id").as_deref(),
        Some(task_id.as_str())
    );
    assert!(run.attribute("keel.run.id").is_some());
    assert!(run.attribute("gen_ai.conversation.id").is_some());

    let chats = named("chat mock");
    assert_eq!(chats.len(), 2, "{spans:#?}");
    for chat in &chats {
        assert_eq!(
            chat.attribute("gen_ai.operation.name").as_deref(),
            Some("chat")
        );
        assert_eq!(
            chat.attribute("gen_ai.provider.name").as_deref(),
            Some("mock")
        );
        assert_eq!(
            chat.attribute("gen_ai.request.model").as_deref(),
            Some("mock")
        );
        assert_eq!(
            chat.attribute("gen_ai.response.model").as_deref(),
            Some("mock")
        );
        assert!(chat.attribute("gen_ai.usage.input_tokens").is_some());
        assert!(chat.attribute("gen_ai.usage.output_tokens").is_some());
        assert!(chat.attribute("gen_ai.response.finish_reasons").is_some());
    }
    let tools = named("execute_tool word_count");
    assert_eq!(tools.len(), 1, "{spans:#?}");
    let tool = tools[0];
    assert_eq!(
        tool.attribute("gen_ai.tool.name").as_deref(),
        Some("word_count")
    );
    assert!(tool.attribute("gen_ai.tool.call.id").is_some());
    assert!(
        tool.attribute("gen_ai.tool.call.arguments").is_none(),
        "content is opt-in"
    );
    let steps: HashMap<String, &Received> = spans
        .iter()
        .filter(|s| s.span.name.starts_with("step "))
        .map(|s| (s.span_id(), s))
        .collect();
    assert_eq!(steps.len(), 2);
    for step in steps.values() {
        assert_eq!(step.parent_id(), Some(run.span_id()));
    }
    // The tool call and the model calls hang under a step of the run.
    for call in chats.iter().chain(&tools) {
        assert!(steps.contains_key(&call.parent_id().unwrap()), "{call:?}");
    }
    let policy = tool
        .span
        .events
        .iter()
        .map(|e| e.name.as_str())
        .collect::<Vec<_>>();
    assert_eq!(policy, ["keel.policy.decision"]);

    // The report's events name exactly these spans, under the same parents.
    let report = support::run_report(&store, &task_id);
    let mut from_events: HashMap<String, Option<String>> = HashMap::new();
    for event in report["events"].as_array().unwrap() {
        assert_eq!(event["trace_id"].as_str(), Some(run.trace_id().as_str()));
        from_events.insert(
            event["span_id"].as_str().unwrap().to_owned(),
            event["parent_span_id"].as_str().map(str::to_owned),
        );
    }
    let exported: HashMap<String, Option<String>> =
        spans.iter().map(|s| (s.span_id(), s.parent_id())).collect();
    assert_eq!(exported, from_events);
}

#[tokio::test]
async fn otel_traces_exporter_none_turns_the_export_off() {
    let (receiver, endpoint) = Receiver::start().await;
    let mut env = otlp_env(&endpoint, "keel-no-export");
    env.push(("OTEL_TRACES_EXPORTER", "none"));
    let server = start("memory", &env);
    run_task(&server.url, TOOL_MESSAGE, None).await;
    // A second server that does export shows the receiver works and the first sent nothing
    // (each sends its spans as soon as its batch delay passes).
    let exporting = start("memory", &otlp_env(&endpoint, "keel-exporting"));
    run_task(&exporting.url, TOOL_MESSAGE, None).await;
    receiver.trace_of("keel-exporting").await;
    drop(server);
    assert!(receiver
        .spans()
        .iter()
        .all(|s| s.service == "keel-exporting"));
}

#[tokio::test]
async fn the_metrics_prometheus_shows_are_exported_over_otlp_too() {
    let (receiver, endpoint) = Receiver::start().await;
    let mut env = otlp_env(&endpoint, "keel-metrics");
    // Read and sent every 100 ms rather than the default minute.
    env.push(("OTEL_METRIC_EXPORT_INTERVAL", "100"));
    let server = KeelServer::start_with_env(&["--store", "memory", "--metrics"], &env);
    run_task(&server.url, TOOL_MESSAGE, None).await;

    let tool = [("tool", "word_count"), ("outcome", "completed")];
    // Each counter reaches 1 in some export (the run's end is counted as its answer leaves).
    eventually("the run's metrics are exported", || async {
        let started = receiver.sum("keel-metrics", "keel_runs_started_total", &[])?;
        let tools = receiver.sum("keel-metrics", "keel_tool_calls_total", &tool)?;
        let ended = receiver.sum(
            "keel-metrics",
            "keel_runs_ended_total",
            &[("outcome", "completed")],
        )?;
        (started == 1.0 && tools == 1.0 && ended == 1.0).then_some(())
    })
    .await;
    // `/metrics` still shows the same counts: both recorders got every call (fan-out).
    let text = reqwest::get(format!("{}metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l == r#"keel_runs_started_total{agent="keel-demo"} 1"#),
        "{text}"
    );
}

/// Wait for the run span of `service` and check it, and every span of its trace, is in
/// the caller's trace `caller_trace`, under the caller's span `caller_span`.
async fn assert_run_joined(
    receiver: &Receiver,
    service: &str,
    caller_trace: &str,
    caller_span: &str,
) {
    let spans = receiver.trace_of(service).await;
    let run = spans
        .iter()
        .find(|s| s.span.name.starts_with("invoke_agent "))
        .unwrap();
    assert_eq!(run.trace_id(), caller_trace);
    assert_eq!(run.parent_id().as_deref(), Some(caller_span));
    assert!(spans.iter().all(|s| s.trace_id() == caller_trace));
}

#[tokio::test]
async fn a_callers_traceparent_puts_the_run_in_its_trace_under_its_span() {
    let (receiver, endpoint) = Receiver::start().await;
    let server = start("memory", &otlp_env(&endpoint, "keel-traceparent"));
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    run_task(
        &server.url,
        TOOL_MESSAGE,
        Some(&format!("00-{caller_trace}-{caller_span}-01")),
    )
    .await;
    assert_run_joined(&receiver, "keel-traceparent", caller_trace, caller_span).await;

    // A malformed header is ignored: the run starts a trace of its own.
    run_task(&server.url, TOOL_MESSAGE, Some("00-not-a-trace-01")).await;
    let roots = eventually("the second run's span is exported", || async {
        let roots: Vec<Received> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.span.name.starts_with("invoke_agent "))
            .collect();
        (roots.len() == 2).then_some(roots)
    })
    .await;
    let own = roots.iter().find(|s| s.trace_id() != caller_trace).unwrap();
    assert_eq!(own.parent_id(), None);
}

#[tokio::test]
async fn a_grpc_callers_traceparent_metadata_puts_the_run_in_its_trace() {
    use keel::transport::grpc::{from_json, proto, tonic};
    let (receiver, endpoint) = Receiver::start().await;
    let server = start("memory", &otlp_env(&endpoint, "keel-grpc-traceparent"));
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let channel = tonic::transport::Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = proto::a2a_service_client::A2aServiceClient::new(channel);
    let message: proto::SendMessageRequest = from_json(
        &json!({"message": {"messageId": support::uuid_like(), "role": "ROLE_USER",
            "parts": [{"text": TOOL_MESSAGE}]}})
        .to_string(),
    )
    .unwrap();
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("a2a-version", "1.0".parse().unwrap());
    metadata.insert(
        "traceparent",
        format!("00-{caller_trace}-{caller_span}-01")
            .parse()
            .unwrap(),
    );
    grpc.send_message(request).await.unwrap();
    assert_run_joined(
        &receiver,
        "keel-grpc-traceparent",
        caller_trace,
        caller_span,
    )
    .await;
}

#[tokio::test]
async fn a_delegation_from_a_to_b_over_a2a_is_one_trace_with_bs_run_under_as_tool_call() {
    let (receiver, endpoint) = Receiver::start().await;
    let b = start("memory", &otlp_env(&endpoint, "keel-b"));
    let dir = tempfile::tempdir().unwrap();
    let config = config_in(
        &dir,
        &format!(
            "[server]\nstore = \"memory\"\n\n[[agents]]\nname = \"a\"\ndescription = \"Delegates to b.\"\n\n\
             [[agents.remote_agents]]\nname = \"delegate\"\ndescription = \"Ask b.\"\nurl = \"{}\"\n",
            b.url
        ),
    );
    let a = KeelServer::start_with_env(&["--config", &config], &otlp_env(&endpoint, "keel-a"));
    run_task(&a.url, r#"/delegate {"message": "hello b"}"#, None).await;

    let a_spans = receiver.trace_of("keel-a").await;
    let trace = a_spans[0].trace_id();
    let b_run = eventually("b's run span is exported", || async {
        receiver
            .spans()
            .into_iter()
            .find(|s| s.service == "keel-b" && s.span.name == "invoke_agent keel-demo")
    })
    .await;
    let call = a_spans
        .iter()
        .find(|s| s.span.name == "execute_tool delegate")
        .expect("a's tool call span");
    assert_eq!(
        b_run.trace_id(),
        trace,
        "one trace across the two processes"
    );
    assert_eq!(
        b_run.parent_id(),
        Some(call.span_id()),
        "b's run under a's tool call"
    );
    assert_eq!(
        b_run.attribute("keel.delegation.id"),
        call.attribute("keel.action.id"),
        "b's run names the delegation: a's tool call"
    );
}

#[tokio::test]
async fn an_http_tool_sends_its_calls_span_as_traceparent() {
    let (receiver, endpoint) = Receiver::start().await;
    // The service the tool calls: it keeps the traceparent it was sent.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let app =
        axum::Router::new()
            .route(
                "/ping",
                axum::routing::get(
                    |State(seen): State<Arc<Mutex<Vec<String>>>>,
                     headers: axum::http::HeaderMap| async move {
                        if let Some(value) =
                            headers.get("traceparent").and_then(|v| v.to_str().ok())
                        {
                            seen.lock().unwrap().push(value.to_owned());
                        }
                        "pong"
                    },
                ),
            )
            .with_state(seen.clone());
    let target = support::serve(app).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_in(
        &dir,
        &format!(
            "[server]\nstore = \"memory\"\n\n[[agents]]\nname = \"pinger\"\ndescription = \"Pings.\"\n\n\
             [[agents.tools.http]]\nname = \"ping\"\ndescription = \"Ping.\"\nmethod = \"GET\"\n\
             url = \"{target}/ping\"\nidempotent = true\n"
        ),
    );
    let env = otlp_env(&endpoint, "keel-http-tool");
    let server = KeelServer::start_with_env(&["--config", &config], &env);
    run_task(&server.url, "/ping {}", None).await;
    let spans = receiver.trace_of("keel-http-tool").await;
    let call = spans
        .iter()
        .find(|s| s.span.name == "execute_tool ping")
        .expect("the tool call's span");
    let sent = seen.lock().unwrap().clone();
    assert_eq!(
        sent,
        [format!("00-{}-{}-01", call.trace_id(), call.span_id())]
    );
}

#[test]
fn a_protocol_other_than_http_protobuf_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--store",
            "memory",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: Keel exports traces over http/protobuf only"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn json_log_lines_carry_the_trace_and_span_ids_of_the_exported_spans() {
    let (receiver, endpoint) = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.log");
    let mut env = otlp_env(&endpoint, "keel-log-join");
    env.push(("RUST_LOG", "info"));
    let server = KeelServer::start_logging(
        0,
        &["--store", "memory", "--log-format", "json"],
        &env,
        std::fs::File::create(&path).unwrap(),
    );
    let task_id = run_task(&server.url, TOOL_MESSAGE, None).await;
    let spans = receiver.trace_of("keel-log-join").await;
    let span = |prefix: &str| {
        spans
            .iter()
            .find(|s| s.span.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` span"))
    };
    let (run, tool) = (span("invoke_agent "), span("execute_tool "));

    let lines: Vec<serde_json::Value> = eventually("the run's end is logged", || {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .filter(|l: &serde_json::Value| l["task_id"] == task_id.as_str())
            .collect();
        let ended = lines.iter().any(|l| l["message"] == "run ended");
        async move { ended.then_some(lines) }
    })
    .await;
    let line = |message: &str| {
        lines
            .iter()
            .find(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("no `{message}` line in {lines:?}"))
    };
    assert_eq!(line("run ended")["trace_id"], run.trace_id());
    assert_eq!(line("run ended")["span_id"], run.span_id());
    assert_eq!(line("tool call")["trace_id"], tool.trace_id());
    assert_eq!(line("tool call")["span_id"], tool.span_id());
}

/// An agent whose every action waits for approval, with the sandboxed `run_code` tool.
const CAREFUL: &str = support::careful_agent!();

#[tokio::test]
async fn a_run_approved_in_another_process_continues_its_trace_linked_to_the_earlier_spans() {
    let (receiver, endpoint) = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_in(&dir, CAREFUL);
    let store = format!("sqlite:{}", dir.path().join("keel.db").display());
    let args = ["--config", &config, "--store", &store];
    let with_env =
        |service: &'static str| KeelServer::start_with_env(&args, &otlp_env(&endpoint, service));

    // Process A: the run asks for approval and rests; A stops.
    let a = with_env("keel-resume-a");
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": support::uuid_like(), "role": "ROLE_USER",
            "parts": [{"text": r#"/run_code {"source": "console.log(6 * 7)"}"#}]}}
    });
    let answer = support::post_rpc(&a.url, &body).await;
    let task = &answer["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{answer}"
    );
    let task_id = task["id"].as_str().unwrap().to_owned();
    let before = receiver.trace_of("keel-resume-a").await;
    let run = before
        .iter()
        .find(|s| s.span.name == "invoke_agent careful")
        .unwrap();
    let waiting = before
        .iter()
        .find(|s| s.span.name == "execute_tool run_code")
        .unwrap();
    assert_eq!(
        run.attribute("keel.run.state").as_deref(),
        Some("input-required")
    );
    assert!(a.terminate().success());

    // Process B: the approval resumes the run there.
    let b = with_env("keel-resume-b");
    support::succeeds(
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["tasks", "approve", &task_id, "--url", &b.url]),
    );
    let after: Vec<Received> = eventually("B's run span is exported", || async {
        let spans: Vec<Received> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.service == "keel-resume-b")
            .collect();
        spans
            .iter()
            .any(|s| s.span.name == "invoke_agent careful")
            .then_some(spans)
    })
    .await;

    // One trace, and no span id exported twice.
    let trace = run.trace_id();
    assert!(after.iter().all(|s| s.trace_id() == trace), "{after:#?}");
    let mut ids: Vec<String> = before.iter().chain(&after).map(Received::span_id).collect();
    let exported = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), exported, "a span id was exported twice");

    // The run's and the waiting call's later parts link to their earlier parts, where they
    // stand in the tree (the run a root, the call under step 1); what B does next hangs
    // under A's spans by their ids.
    let linked = |name: &str, earlier: &Received| {
        let part = after
            .iter()
            .find(|s| {
                s.span.name == name
                    && s.attribute("keel.resumes").as_deref() == Some(earlier.span_id().as_str())
            })
            .unwrap_or_else(|| panic!("no later part of {name} in {after:#?}"));
        assert_eq!(part.span.links.len(), 1);
        let link = &part.span.links[0];
        assert_eq!(Received::hex(&link.trace_id), trace);
        assert_eq!(Received::hex(&link.span_id), earlier.span_id());
        assert_eq!(
            string_of(&link.attributes, "keel.link.type").as_deref(),
            Some("resumes")
        );
        assert_eq!(part.parent_id(), earlier.parent_id());
        part.clone()
    };
    let resumed = linked("invoke_agent careful", run);
    assert_eq!(resumed.parent_id(), None);
    assert_eq!(
        resumed.attribute("keel.run.state").as_deref(),
        Some("completed")
    );
    let decided = linked("execute_tool", waiting);
    let events: Vec<&str> = decided
        .span
        .events
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(events, ["keel.approval.decided"]);
    let approved = after
        .iter()
        .find(|s| s.span.name == "execute_tool run_code")
        .unwrap();
    assert_eq!(approved.parent_id(), waiting.parent_id());
    let step = after.iter().find(|s| s.span.name == "step 2").unwrap();
    assert_eq!(step.parent_id(), Some(run.span_id()));
}
