//! The HTTP plumbing every provider shares: timeouts, retries with exponential backoff and
//! jitter honouring `Retry-After`, error classification, secret-safe messages, and bodies
//! read as JSON or as server-sent events.

use std::fmt;
use std::time::Duration;

use std::sync::atomic::{AtomicU32, Ordering};

use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::Value;

use crate::{LlmError, LlmErrorKind};

/// Timeouts and retry behaviour of a provider's HTTP client.
///
/// ```
/// use std::time::Duration;
/// use keel_llm::providers::HttpOptions;
/// let options = HttpOptions::default()
///     .with_max_attempts(5)
///     .with_backoff(Duration::from_millis(200), Duration::from_secs(10));
/// assert_eq!(options.max_attempts, 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOptions {
    /// Longest wait to establish a connection.
    pub connect_timeout: Duration,
    /// Longest a whole non-streaming call may take (streams are bounded by `read_timeout`
    /// instead, since a long answer may legitimately stream for minutes).
    pub request_timeout: Duration,
    /// Longest wait for the next piece of a response body.
    pub read_timeout: Duration,
    /// Attempts per call, the first included (1 disables retries).
    pub max_attempts: u32,
    /// The first retry's backoff; each later one doubles, with jitter.
    pub backoff_base: Duration,
    /// The longest backoff.
    pub backoff_max: Duration,
    /// The longest `Retry-After` honoured; a provider asking for more fails the call at once
    /// with the delay recorded on the error, so the caller can decide.
    pub max_retry_after: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(600),
            read_timeout: Duration::from_secs(120),
            max_attempts: 3,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl HttpOptions {
    /// Set the connect and whole-request timeouts.
    #[must_use]
    pub fn with_timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Set the timeout between pieces of a response body.
    #[must_use]
    pub fn with_read_timeout(mut self, read: Duration) -> Self {
        self.read_timeout = read;
        self
    }

    /// Set the attempts per call (at least 1).
    #[must_use]
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Set the first and the longest backoff.
    #[must_use]
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Set the longest `Retry-After` honoured.
    #[must_use]
    pub fn with_max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// The retry schedule: doubling from the base, capped, with "equal jitter" (half fixed,
    /// half random) so that clients rate-limited together do not retry together. backon adds
    /// a random part of up to the delay itself, so it is given half of each bound.
    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.backoff_base / 2)
            .with_max_delay(self.backoff_max / 2)
            .with_max_times(self.max_attempts.max(1).saturating_sub(1) as usize)
            .with_jitter()
    }
}

/// An API key. Its `Debug` prints `***`, and it has no `Display`, so it cannot reach a log
/// or an error message by accident.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ApiKey(String);

impl ApiKey {
    pub(crate) fn new(key: impl Into<String>) -> Option<Self> {
        let key = key.into();
        let key = key.trim();
        (!key.is_empty()).then(|| Self(key.to_owned()))
    }

    /// The first set variable among `names`.
    pub(crate) fn from_env(names: &[&str]) -> Option<Self> {
        names
            .iter()
            .find_map(|name| std::env::var(name).ok().and_then(Self::new))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Who is being called, for errors, spans and provider-specific classification.
pub(crate) struct CallSite<'a> {
    pub(crate) provider: &'static str,
    pub(crate) model: &'a str,
    pub(crate) key: Option<&'a ApiKey>,
    /// The provider's reading of an error answer.
    pub(crate) map_error: MapError,
}

/// A provider's own reading of an error answer (context overflow, odd auth codes); `None`
/// leaves the kind to the HTTP status.
pub(crate) type MapError = fn(u16, &Value, &str) -> Option<LlmErrorKind>;

/// An error answer's kind: the provider's reading first, then the status.
pub(crate) fn error_kind(
    map_error: MapError,
    status: u16,
    json: &Value,
    detail: &str,
) -> LlmErrorKind {
    map_error(status, json, detail).unwrap_or(match status {
        401 | 403 => LlmErrorKind::Auth,
        429 => LlmErrorKind::RateLimit,
        _ => LlmErrorKind::Api,
    })
}

impl CallSite<'_> {
    /// An error of this call, with the key removed from its message.
    pub(crate) fn error(&self, kind: LlmErrorKind, message: impl Into<String>) -> LlmError {
        LlmError::new(kind, self.model, self.redact(message.into()))
    }

    /// Remove the key from text that may echo it (some providers quote a bad key back).
    fn redact(&self, text: String) -> String {
        match self.key {
            Some(key) if !key.expose().is_empty() => text.replace(key.expose(), "***"),
            _ => text,
        }
    }

    /// A connection failure: `what` failed (`request failed`, `stream broke`).
    fn transport(&self, error: reqwest::Error, what: &str) -> LlmError {
        // The endpoint tried is named without its query: a URL may carry a query parameter
        // a provider treats as secret (`without_url` keeps it out of the message).
        let endpoint = error
            .url()
            .map(|url| format!(" at {}{}", url.origin().ascii_serialization(), url.path()))
            .unwrap_or_default();
        let timeout = error.is_timeout();
        let error = error.without_url();
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        let kind = if timeout {
            LlmErrorKind::Timeout
        } else {
            LlmErrorKind::Transport
        };
        self.error(
            kind,
            format!("{} {what}{endpoint}: {message}", self.provider),
        )
    }

    /// A failure reading an event stream: the connection, or events that do not parse.
    pub(crate) fn stream_error(&self, error: EventStreamError<reqwest::Error>) -> LlmError {
        match error {
            EventStreamError::Transport(error) => self.transport(error, "stream broke"),
            other => self.error(
                LlmErrorKind::BadResponse,
                format!("{} sent an invalid event stream: {other}", self.provider),
            ),
        }
    }
}

/// A response body's server-sent events.
pub(crate) type SseEvents = BoxStream<'static, Result<Event, EventStreamError<reqwest::Error>>>;

/// A shared HTTP client with its options.
#[derive(Debug, Clone)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    pub(crate) options: HttpOptions,
}

/// A successful response's body, its first chunk already received.
pub(crate) struct OpenedBody {
    chunks: BoxStream<'static, Result<Vec<u8>, reqwest::Error>>,
}

impl HttpClient {
    pub(crate) fn new(options: HttpOptions, model: &str) -> Result<Self, LlmError> {
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout)
            .build()
            .map_err(|e| {
                LlmError::new(
                    LlmErrorKind::Config,
                    model,
                    format!("cannot build the HTTP client: {}", e.without_url()),
                )
            })?;
        Ok(Self { client, options })
    }

    pub(crate) fn post(&self, url: &str) -> reqwest::RequestBuilder {
        self.client.post(url)
    }

    /// Send a request, retrying 408/429/5xx answers and connection failures that happened
    /// before any byte of the body arrived; return the body once its first chunk is in.
    ///
    /// A `Retry-After` replaces the backoff; one longer than `max_retry_after` fails the call
    /// at once. `whole_call_timeout` bounds the whole call by `request_timeout`
    /// (non-streaming calls).
    pub(crate) async fn send(
        &self,
        site: &CallSite<'_>,
        request: impl Fn() -> reqwest::RequestBuilder,
        whole_call_timeout: bool,
    ) -> Result<OpenedBody, LlmError> {
        let attempts = self.options.max_attempts.max(1);
        let made = AtomicU32::new(0);
        let result = (|| {
            made.fetch_add(1, Ordering::Relaxed);
            self.attempt(site, &request, whole_call_timeout)
        })
        .retry(self.options.backoff())
        .sleep(tokio::time::sleep)
        .when(|failure: &Failure| failure.retryable)
        .adjust(|failure, backoff| match failure.error.retry_after() {
            Some(wait) if wait > self.options.max_retry_after => None,
            // Honoured only while attempts remain (`backoff` is `None` once they ran out).
            Some(wait) => backoff.map(|_| wait),
            None => backoff,
        })
        .notify(|failure, delay| {
            tracing::warn!(
                provider = site.provider,
                model = site.model,
                attempt = made.load(Ordering::Relaxed),
                status = failure.error.status(),
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                error = %failure.error,
                "model call failed; retrying"
            );
        })
        .await;
        let Failure { error, retryable } = match result {
            Ok(body) => return Ok(body),
            Err(failure) => failure,
        };
        let made = made.load(Ordering::Relaxed);
        Err(if retryable && attempts > 1 && made >= attempts {
            let message = format!("{} (after {made} attempts)", error.message());
            LlmError::new(error.kind(), error.model(), message)
                .with_retry_after(error.retry_after())
                .with_status_opt(error.status())
        } else {
            error
        })
    }

    /// One try: the opened body, or the error and whether another try may succeed.
    async fn attempt(
        &self,
        site: &CallSite<'_>,
        request: &impl Fn() -> reqwest::RequestBuilder,
        whole_call_timeout: bool,
    ) -> Result<OpenedBody, Failure> {
        let mut builder = request();
        if whole_call_timeout {
            builder = builder.timeout(self.options.request_timeout);
        }
        // A timeout already waited the configured time; retrying would multiply it. Any other
        // transport failure happened before the provider saw the request whole.
        let transport = |error: reqwest::Error| Failure {
            retryable: !error.is_timeout(),
            error: site.transport(error, "request failed"),
        };
        let response = builder.send().await.map_err(transport)?;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let retry_after = retry_after(response.headers(), Utc::now());
            // The error body is small; a failure to read it only loses detail.
            let body = response.text().await.unwrap_or_default();
            return Err(Failure {
                error: classify(site, status, &body).with_retry_after(retry_after),
                retryable: matches!(status, 408 | 429 | 500..=599),
            });
        }
        let mut chunks = response
            .bytes_stream()
            .map(|chunk| chunk.map(|bytes| bytes.to_vec()));
        match chunks.next().await {
            Some(Err(error)) => Err(transport(error)),
            first => Ok(OpenedBody {
                chunks: stream::iter(first).chain(chunks).boxed(),
            }),
        }
    }
}

/// A failed try of [`HttpClient::send`].
struct Failure {
    error: LlmError,
    retryable: bool,
}

impl LlmError {
    fn with_status_opt(self, status: Option<u16>) -> Self {
        match status {
            Some(status) => self.with_status(status),
            None => self,
        }
    }
}

impl OpenedBody {
    /// Read the whole body as JSON.
    pub(crate) async fn json(mut self, site: &CallSite<'_>) -> Result<Value, LlmError> {
        let mut body = Vec::new();
        while let Some(chunk) = self.chunks.next().await {
            body.extend(chunk.map_err(|e| site.transport(e, "request failed"))?);
        }
        serde_json::from_slice(&body).map_err(|e| {
            site.error(
                LlmErrorKind::BadResponse,
                format!("{} answered JSON that cannot be parsed: {e}", site.provider),
            )
        })
    }

    /// Decode the body as server-sent events.
    pub(crate) fn events(self) -> SseEvents {
        self.chunks.eventsource().boxed()
    }
}

/// An error answer as an [`LlmError`]: provider-specific kinds first, then by status.
fn classify(site: &CallSite<'_>, status: u16, body: &str) -> LlmError {
    let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let detail = error_detail(&json, body);
    let kind = error_kind(site.map_error, status, &json, &detail);
    site.error(
        kind,
        format!("{} answered HTTP {status}: {detail}", site.provider),
    )
    .with_status(status)
}

/// The human-readable part of an error body, shortened for logs.
pub(crate) fn error_detail(json: &Value, raw: &str) -> String {
    let text = json
        .pointer("/error/message")
        .or_else(|| json.get("error").filter(|e| e.is_string()))
        .or_else(|| json.get("message"))
        .or_else(|| json.get("detail"))
        .and_then(Value::as_str)
        .unwrap_or(raw)
        .trim();
    const LIMIT: usize = 500;
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None if text.is_empty() => "(no detail)".into(),
        None => text.to_owned(),
    }
}

/// The delay a response asks for: `retry-after-ms`, or `Retry-After` as seconds or an HTTP
/// date.
pub(crate) fn retry_after(
    headers: &reqwest::header::HeaderMap,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    parse_retry_after(header("retry-after")?, now)
}

/// `Retry-After`'s value: delay seconds (integer or decimal) or an HTTP date (a date in the
/// past means now).
pub(crate) fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = DateTime::parse_from_rfc2822(value).ok()?;
    Some(
        (date.with_timezone(&Utc) - now)
            .to_std()
            .unwrap_or(Duration::ZERO),
    )
}

/// A JSON array field's items, or none.
#[cfg_attr(not(any(feature = "openai", feature = "gemini")), allow(dead_code))]
pub(crate) fn array_at<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Text of a JSON string field, or empty.
pub(crate) fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A JSON number field as u64, or 0.
pub(crate) fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_default()
}

/// Join a base URL and a path with exactly one slash.
pub(crate) fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;
    use chrono::TimeZone;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = Utc.with_ymd_and_hms(2015, 10, 21, 7, 28, 0).unwrap();
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after("0.5", now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let options = HttpOptions::default()
            .with_max_attempts(31)
            .with_backoff(Duration::from_millis(100), Duration::from_millis(350));
        let between = |delay: Duration, low: u64, high: u64| {
            assert!(
                delay >= Duration::from_millis(low) && delay <= Duration::from_millis(high),
                "{delay:?} is not within {low}..={high} ms"
            );
        };
        for _ in 0..50 {
            let delays: Vec<Duration> = options.backoff().build().collect();
            assert_eq!(delays.len(), 30, "one delay before each retry");
            between(delays[0], 50, 100);
            between(delays[1], 100, 200);
            between(delays[29], 175, 350);
        }
        let once = HttpOptions::default().with_max_attempts(1);
        assert_eq!(once.backoff().build().count(), 0, "one attempt never waits");
    }

    #[test]
    fn api_keys_never_print() {
        let key = ApiKey::new("sk-secret").unwrap();
        assert_eq!(format!("{key:?}"), "***");
        assert!(ApiKey::new("  ").is_none());
        let site = CallSite {
            provider: "openai",
            model: "m",
            key: Some(&key),
            map_error: |_, _, _| None,
        };
        let err = classify(
            &site,
            401,
            r#"{"error": {"message": "Incorrect API key provided: sk-secret"}}"#,
        );
        assert_eq!(err.kind(), LlmErrorKind::Auth);
        assert!(!err.to_string().contains("sk-secret"), "{err}");
    }

    #[test]
    fn error_detail_prefers_the_providers_message_and_is_bounded() {
        let json = serde_json::json!({"error": {"message": "bad"}});
        assert_eq!(error_detail(&json, "raw"), "bad");
        assert_eq!(error_detail(&Value::Null, "plain text"), "plain text");
        assert_eq!(error_detail(&Value::Null, ""), "(no detail)");
        assert!(error_detail(&Value::Null, &"x".repeat(2000)).len() < 600);
    }
}
