//! What `keel serve` tells its operator: log lines as text or one JSON object per line
//! (`--log-format`), with `--metrics` the Prometheus recorder behind `/metrics`, and over OTLP
//! the traces and the same metrics (`[telemetry]`, `OTEL_*`). The
//! libraries only log through `tracing` and count through the `metrics` macros; the process
//! chooses where both go, here (docs/observability.md).

use clap::ValueEnum;
use keel::transport::MetricsRoute;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// The environment variable whose value, when set, `/metrics` requires as a bearer token.
pub(crate) const METRICS_TOKEN_VAR: &str = "KEEL_METRICS_TOKEN";

/// The histogram buckets of every duration (seconds): from a fast HTTP answer (5 ms) to a
/// long model call or tool run (2 minutes).
const SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable text (colored on a terminal).
    #[default]
    Text,
    /// One JSON object per line, the event's fields at its top level.
    Json,
}

/// The log format of `keel serve`: the flag's (or its variable's) when `given`, else the
/// `[server] log_format` of the file it will serve, if there is one that loads (a file that
/// does not is reported by `keel serve` itself, after logging starts).
pub(crate) fn serve_log_format(
    flag: LogFormat,
    given: bool,
    file: Option<&keel::config::LoadedConfig>,
) -> LogFormat {
    match file {
        Some(loaded) if !given => match loaded.server.log_format {
            keel::config::LogFormat::Text => LogFormat::Text,
            keel::config::LogFormat::Json => LogFormat::Json,
        },
        _ => flag,
    }
}

/// Send log lines to stderr in `format`, filtered by `RUST_LOG`, else by `default`.
///
/// With `buffered` (a server, which logs a line a request), the lines are formatted where
/// they are logged and written by a thread of their own through a buffer it flushes whenever
/// no line waits: one write for every line waiting under load (a write a line cost GetTask
/// about 5% of its throughput on the memory store and a quarter on SQLite, decision 280),
/// each line at once when idle. None is dropped (a
/// full queue makes the logger wait); the guard returned flushes what is left when it is
/// dropped, so it is held until the process ends. Client commands, which print their own
/// output between log lines, write each line directly.
pub(crate) fn init_logs(
    format: LogFormat,
    default: &str,
    buffered: bool,
) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    if !buffered {
        install(format, filter, std::io::stderr);
        return None;
    }
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("keel-logs")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    install(format, filter, writer);
    Some(guard)
}

/// Install the process's subscriber: lines in `format`, filtered by `filter`, to `writer`.
fn install<W>(format: LogFormat, filter: EnvFilter, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

/// What a serving process exports: its traces (and metrics) over OTLP, and `/metrics`.
pub(crate) struct Observed {
    /// The OTLP export, when the file's `[telemetry]` or an `OTEL_*` variable names an
    /// endpoint (docs/observability.md#traces).
    pub(crate) traces: Option<keel::telemetry::Telemetry>,
    /// The `/metrics` route, when asked for.
    pub(crate) metrics: Option<MetricsRoute>,
}

/// Install what the file's `[telemetry]` (when serving one), the standard `OTEL_*` variables
/// and `prometheus` (`--metrics` or `[server] metrics`) ask for: the OTLP span export, and
/// one `metrics` recorder that feeds `/metrics` (behind a bearer token when
/// [`METRICS_TOKEN_VAR`] is set), the OTLP metrics export, or both through a fan-out, so
/// both show the same metrics (decision 233). Call it once per process.
pub(crate) fn observe(
    file: Option<&keel::config::TelemetryConfig>,
    prometheus: bool,
) -> Result<Observed, String> {
    let config = file.map(|f| f.exporter()).unwrap_or_default();
    let traces = keel::telemetry::Telemetry::install(&config)?;
    if traces.is_some() {
        tracing::info!(
            conventions = keel::telemetry::semconv::GENAI_CONVENTIONS,
            "exporting traces and metrics over OTLP/HTTP"
        );
    }
    let otlp = traces
        .as_ref()
        .and_then(keel::telemetry::Telemetry::recorder)
        .map(|recorder| recorder.with_seconds_buckets(&SECONDS_BUCKETS));
    let (prometheus, metrics) = if prometheus {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&SECONDS_BUCKETS)
            .map_err(|err| format!("cannot build the metrics recorder: {err}"))?
            .build_recorder();
        let route = metrics_route(recorder.handle());
        (Some(recorder), Some(route))
    } else {
        (None, None)
    };
    let installed = match (prometheus, otlp) {
        (Some(prometheus), Some(otlp)) => metrics::set_global_recorder(
            metrics_util::layers::FanoutBuilder::default()
                .add_recorder(prometheus)
                .add_recorder(otlp)
                .build(),
        )
        .is_ok(),
        (Some(prometheus), None) => metrics::set_global_recorder(prometheus).is_ok(),
        (None, Some(otlp)) => metrics::set_global_recorder(otlp).is_ok(),
        (None, None) => false,
    };
    if installed {
        // Runs are counted only from here: without a recorder the meter builds no labels.
        keel::agent::meter::enable();
    } else if metrics.is_some() {
        return Err("cannot install the metrics recorder: one is installed already".into());
    }
    Ok(Observed { traces, metrics })
}

/// The route that renders the Prometheus recorder of `handle`, behind a bearer token when
/// [`METRICS_TOKEN_VAR`] is set.
fn metrics_route(handle: PrometheusHandle) -> MetricsRoute {
    let route = MetricsRoute::new(move || {
        // Histograms are folded into their buckets here, when someone looks.
        handle.run_upkeep();
        handle.render()
    });
    match std::env::var(METRICS_TOKEN_VAR) {
        Ok(token) if !token.is_empty() => route.with_bearer_token(token),
        _ => route,
    }
}

/// Export the spans still pending before the process ends (the batch processor's thread
/// sends them; this waits for it off the async runtime's threads).
pub(crate) async fn flush_traces(traces: Option<keel::telemetry::Telemetry>) {
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_logs_as_the_loaded_file_says_unless_the_flag_is_given() {
        let file = keel::Config::parse(
            "[server]\nlog_format = \"json\"\n\n[[agents]]\nname = \"a\"\ndescription = \"A.\"\n",
            "keel.toml",
        )
        .unwrap();
        assert_eq!(
            serve_log_format(LogFormat::Text, false, Some(&file)),
            LogFormat::Json
        );
        assert_eq!(
            serve_log_format(LogFormat::Text, true, Some(&file)),
            LogFormat::Text
        );
        assert_eq!(
            serve_log_format(LogFormat::Json, false, None),
            LogFormat::Json
        );
    }
}
