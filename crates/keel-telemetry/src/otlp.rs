//! The OTLP exporter of a process's spans and metrics: configured by the standard `OTEL_*`
//! environment variables and by `keel.toml`'s `[telemetry]`, over HTTP/protobuf (decisions
//! 182 and 233).

use std::sync::Arc;

use keel_events::RedactionPolicy;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanProcessor};
use opentelemetry_sdk::Resource;

use crate::semconv;
use crate::{OtlpRecorder, SpanSink};

/// The variables that name an OTLP endpoint for traces, the signal's own first.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variables that name an OTLP endpoint for metrics, the signal's own first.
const METRICS_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Where and how a process exports its spans. The environment's `OTEL_*` variables win over
/// what a file says, as for every OpenTelemetry SDK.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL (`http://collector:4318`); spans go to its `/v1/traces`.
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`, a full URL) wins.
    pub endpoint: Option<String>,
    /// The `service.name` of the process's spans (`OTEL_SERVICE_NAME` wins); `keel` when
    /// neither says.
    pub service_name: Option<String>,
    /// Put prompt and completion content on the spans (tool arguments and results, the
    /// model's output), masked by the redaction policy;
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` turns it on too.
    pub capture_content: bool,
}

/// A process's OTLP export: the span sink every engine run's events go through, over a
/// batch processor and the OTLP/HTTP exporter; and the meter provider its metrics recorder
/// ([`Telemetry::recorder`]) records onto, read periodically
/// (`OTEL_METRIC_EXPORT_INTERVAL`, 60 s by default) and at shutdown.
#[derive(Debug, Clone)]
pub struct Telemetry {
    sink: Arc<SpanSink>,
    meters: Option<SdkMeterProvider>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl TelemetryConfig {
    /// Whether spans are to be exported: an endpoint is named (by a variable or the file),
    /// and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` says no.
    pub fn enabled(&self) -> bool {
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return false;
        }
        self.endpoint.is_some() || ENDPOINT_VARS.iter().any(|name| var(name).is_some())
    }

    /// Whether metrics are exported too: `OTEL_METRICS_EXPORTER=none` says no.
    fn exports_metrics(&self) -> bool {
        !var("OTEL_METRICS_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    }

    /// `exporter` sent to the URL of `signal`'s export (`{endpoint}/v1/{signal}`) the file
    /// names, unless one of `vars` names one (the exporter reads those itself).
    fn aim<B: WithExportConfig>(&self, exporter: B, vars: &[&str], signal: &str) -> B {
        match &self.endpoint {
            Some(endpoint) if !vars.iter().any(|name| var(name).is_some()) => {
                exporter.with_endpoint(format!("{}/v1/{signal}", endpoint.trim_end_matches('/')))
            }
            _ => exporter,
        }
    }

    fn captures_content(&self) -> bool {
        self.capture_content
            || var(semconv::CAPTURE_CONTENT_VAR).is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

impl Telemetry {
    /// The export `config` and the environment ask for, or `None` when they ask for none
    /// (then nothing is installed and runs pay only for their events' ids). A protocol
    /// other than `http/protobuf` is an error: it is the one this build exports over.
    pub fn install(config: &TelemetryConfig) -> Result<Option<Self>, String> {
        if !config.enabled() {
            return Ok(None);
        }
        for (signal, names) in [
            (
                "traces",
                [
                    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                ],
            ),
            (
                "metrics",
                [
                    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                ],
            ),
        ] {
            if let Some((name, protocol)) =
                names.iter().find_map(|name| var(name).map(|p| (name, p)))
            {
                if protocol != "http/protobuf" {
                    return Err(format!(
                        "{name}={protocol}: Keel exports {signal} over http/protobuf only"
                    ));
                }
            }
        }
        // The exporter's HTTP client is reqwest's over rustls, which is given ring here (as
        // keel-mcp does for rmcp's): no aws-lc, no OpenSSL.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Another thread may have installed it meanwhile: either way there is one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
        let exporter = config
            .aim(exporter, &ENDPOINT_VARS, "traces")
            .build()
            .map_err(|err| format!("cannot build the OTLP exporter: {err}"))?;
        let mut resource = Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none() {
            resource = resource
                .with_service_name(config.service_name.clone().unwrap_or_else(|| "keel".into()));
        }
        let resource = resource.build();
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        processor.set_resource(&resource);
        let mut sink = SpanSink::new(processor);
        if config.captures_content() {
            sink = sink.with_content(RedactionPolicy::default());
        }
        let meters = if config.exports_metrics() {
            Some(meter_provider(config, resource)?)
        } else {
            None
        };
        Ok(Some(Self {
            sink: Arc::new(sink),
            meters,
        }))
    }

    /// The `metrics` recorder whose counts are exported over OTLP, or `None` when metrics
    /// are not (`OTEL_METRICS_EXPORTER=none`). The process installs it (beside its
    /// Prometheus recorder, if it has one) and turns the engine's meter on.
    pub fn recorder(&self) -> Option<OtlpRecorder> {
        self.meters.as_ref().map(OtlpRecorder::new)
    }

    /// The sink to add to every executor's event sinks.
    pub fn sink(&self) -> Arc<SpanSink> {
        self.sink.clone()
    }

    /// Export what is pending (spans, and the metrics' last values) and stop (at the
    /// process's end).
    pub fn shutdown(&self) {
        self.sink.shutdown();
        if let Some(meters) = &self.meters {
            let _ = meters.shutdown();
        }
    }
}

/// The meter provider over the OTLP/HTTP metrics exporter, to `config`'s endpoint's
/// `/v1/metrics` unless a variable names one.
fn meter_provider(
    config: &TelemetryConfig,
    resource: Resource,
) -> Result<SdkMeterProvider, String> {
    let exporter = opentelemetry_otlp::MetricExporter::builder().with_http();
    let exporter = config
        .aim(exporter, &METRICS_ENDPOINT_VARS, "metrics")
        .build()
        .map_err(|err| format!("cannot build the OTLP metrics exporter: {err}"))?;
    Ok(SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter).build())
        .with_resource(resource)
        .build())
}
