//! [`HttpTool`]: a synchronous tool that is an HTTP endpoint, declared without Rust (a
//! `keel.toml` `[[agents.tools.http]]`) or built in code. The call's answer is the tool's
//! output.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use keel_agent::{Tool, ToolContext};
use keel_core::{AgentError, AgentResult};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::Method;
use serde_json::Value;

use crate::config::EnvString;

/// How long a call waits for its answer unless set.
pub const DEFAULT_HTTP_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// A tool whose calls are HTTP requests. `{name}` in the URL is replaced by the argument
/// `name`, percent-encoded; the other arguments go in the query string (`GET`, `DELETE`,
/// `HEAD`) or as the JSON body (other methods). A 2xx answer is the output (its JSON, or its
/// text); any other status is a tool error the model sees, with the status and the start of
/// the body.
///
/// ```
/// use keel::config::EnvString;
/// use keel::http_tool::HttpTool;
/// let weather = HttpTool::new(
///     "weather",
///     "The weather in a city.",
///     "GET",
///     EnvString::plain("http://127.0.0.1:9000/weather/{city}"),
/// )?
/// .with_parameters(serde_json::json!({
///     "type": "object",
///     "properties": {"city": {"type": "string"}},
///     "required": ["city"]
/// }))
/// .idempotent(true);
/// # let _ = weather;
/// # Ok::<(), keel::core::AgentError>(())
/// ```
pub struct HttpTool {
    name: String,
    description: String,
    method: Method,
    url: EnvString,
    headers: Vec<(HeaderName, HeaderValue)>,
    parameters: Value,
    idempotent: bool,
    capabilities: Vec<String>,
    timeout: Duration,
    client: reqwest::Client,
}

impl HttpTool {
    /// A tool named `name` that sends `method` requests to `url` (with `{arg}` placeholders).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        method: &str,
        url: EnvString,
    ) -> AgentResult<Self> {
        let name = name.into();
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map_err(|_| {
            AgentError::invalid_input(
                format!("method of tool `{name}`"),
                format!("`{method}` is not an HTTP method"),
            )
        })?;
        Ok(Self {
            name,
            description: description.into(),
            method,
            url,
            headers: Vec::new(),
            parameters: serde_json::json!({"type": "object"}),
            idempotent: false,
            capabilities: Vec::new(),
            timeout: DEFAULT_HTTP_TOOL_TIMEOUT,
            client: reqwest::Client::new(),
        })
    }

    /// The JSON schema of the arguments (default: any object).
    #[must_use]
    pub fn with_parameters(mut self, parameters: Value) -> Self {
        self.parameters = parameters;
        self
    }

    /// Send this header with every call; a value from the environment stays masked in errors.
    pub fn with_header(mut self, name: &str, value: EnvString) -> AgentResult<Self> {
        let invalid = |what: &str| {
            AgentError::invalid_input(
                format!("header `{name}` of tool `{}`", self.name),
                format!("not a valid header {what}"),
            )
        };
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid("name"))?;
        let mut header_value =
            HeaderValue::from_str(value.value()).map_err(|_| invalid("value"))?;
        header_value.set_sensitive(value.is_secret());
        self.headers.push((header, header_value));
        Ok(self)
    }

    /// Whether calling it twice with the same arguments is harmless (re-run after a crash).
    #[must_use]
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Capabilities every call needs, for the agent's policy.
    #[must_use]
    pub fn with_capabilities(mut self, capabilities: impl IntoIterator<Item = String>) -> Self {
        self.capabilities = capabilities.into_iter().collect();
        self
    }

    /// How long a call waits for the answer.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn failed(&self, message: impl Into<String>) -> AgentError {
        AgentError::ToolFailed {
            tool: self.name.clone(),
            message: message.into(),
        }
    }

    /// The URL with its placeholders filled, and the arguments no placeholder used.
    fn fill(&self, args: &Value) -> AgentResult<(String, serde_json::Map<String, Value>)> {
        let mut rest = args.as_object().cloned().unwrap_or_default();
        let mut used = HashSet::new();
        let template = self.url.value();
        let mut url = String::with_capacity(template.len());
        let mut remaining = template;
        while let Some(open) = remaining.find('{') {
            url.push_str(&remaining[..open]);
            let after = &remaining[open + 1..];
            let Some(close) = after.find('}') else {
                url.push_str(&remaining[open..]);
                remaining = "";
                break;
            };
            let name = &after[..close];
            let value = match args.get(name) {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Null) | None => {
                    return Err(self.failed(format!("the argument `{name}` is missing")))
                }
                Some(other) => other.to_string(),
            };
            url.extend(utf8_percent_encode(&value, NON_ALPHANUMERIC));
            used.insert(name.to_owned());
            remaining = &after[close + 1..];
        }
        url.push_str(remaining);
        rest.retain(|key, _| !used.contains(key));
        Ok((url, rest))
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> Value {
        self.parameters.clone()
    }
    fn idempotent(&self) -> bool {
        self.idempotent
    }
    fn capabilities(&self) -> Vec<String> {
        self.capabilities.clone()
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let (url, rest) = self.fill(&args)?;
        let mut request = self
            .client
            .request(self.method.clone(), &url)
            .timeout(self.timeout);
        // The call's trace goes with it (W3C `traceparent`, under the tool call's span), so
        // the service's own spans join the run's trace; a header the tool sets wins.
        if !self
            .headers
            .iter()
            .any(|(name, _)| name == keel_core::TraceParent::HEADER)
        {
            request = request.header(
                keel_core::TraceParent::HEADER,
                ctx.traceparent().to_string(),
            );
            if let Some(state) = &ctx.run.trace_state {
                request = request.header(keel_core::TraceParent::STATE_HEADER, state);
            }
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let in_query = matches!(self.method, Method::GET | Method::DELETE | Method::HEAD);
        if in_query {
            let query: Vec<(String, String)> = rest
                .into_iter()
                .map(|(key, value)| match value {
                    Value::String(text) => (key, text),
                    other => (key, other.to_string()),
                })
                .collect();
            if !query.is_empty() {
                request = request.query(&query);
            }
        } else {
            request = request.json(&Value::Object(rest));
        }
        let request = request.build().map_err(|err| {
            self.failed(format!(
                "{} {url}: {}",
                self.method,
                keel_core::ErrorSource::innermost(&err)
            ))
        })?;
        // Errors name the URL called, its placeholders filled and its query as sent, so a user
        // sees which call failed; a URL from the environment may hold a secret and is named
        // masked.
        let called = if self.url.is_secret() {
            self.url.to_string()
        } else {
            request.url().to_string()
        };
        let response = tokio::select! {
            () = ctx.cancel.cancelled() => {
                return Err(AgentError::Canceled { reason: "task canceled".into() });
            }
            response = self.client.execute(request) => response.map_err(|err| {
                let cause = if err.is_timeout() {
                    format!("no answer within {}s", self.timeout.as_secs_f64())
                } else {
                    keel_core::ErrorSource::innermost(&err)
                };
                self.failed(format!("{} {called}: {cause}", self.method))
            })?,
        };
        let status = response.status();
        let body = response.text().await.map_err(|err| {
            self.failed(format!(
                "{} {called}: the answer broke off ({})",
                self.method,
                keel_core::ErrorSource::innermost(&err)
            ))
        })?;
        if !status.is_success() {
            let start: String = body.chars().take(500).collect();
            return Err(self.failed(format!(
                "{} {called} answered HTTP {}: {start}",
                self.method,
                status.as_u16()
            )));
        }
        Ok(serde_json::from_str(&body).unwrap_or(Value::String(body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_percent_encoded_and_the_rest_is_kept() {
        let tool = HttpTool::new(
            "t",
            "",
            "get",
            EnvString::plain("http://h/cities/{city}/days/{days}"),
        )
        .unwrap();
        let (url, rest) = tool
            .fill(&serde_json::json!({"city": "São Paulo/x", "days": 3, "units": "metric"}))
            .unwrap();
        assert_eq!(url, "http://h/cities/S%C3%A3o%20Paulo%2Fx/days/3");
        assert_eq!(Value::Object(rest), serde_json::json!({"units": "metric"}));
        let missing = tool.fill(&serde_json::json!({"city": "x"})).unwrap_err();
        assert!(
            missing.to_string().contains("`days` is missing"),
            "{missing}"
        );
    }

    #[test]
    fn a_bad_method_or_header_is_invalid_input() {
        assert!(HttpTool::new("t", "", "FETCH THIS", EnvString::plain("http://h")).is_err());
        let tool = HttpTool::new("t", "", "POST", EnvString::plain("http://h")).unwrap();
        assert!(tool
            .with_header("bad header", EnvString::plain("x"))
            .is_err());
    }
}
