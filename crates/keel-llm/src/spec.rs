//! [`llm_from_spec`]: build a model from a short text spec such as `openai:gpt-4o`, for
//! command lines and configuration files.

use std::sync::Arc;

use keel_core::{AgentError, AgentResult};

use crate::{Llm, MockLlm};

/// Build a model from a spec:
///
/// | spec | model |
/// |---|---|
/// | `mock` | [`MockLlm::new`] |
/// | `mock:LATENCY` | [`MockLlm::new`] answering after `LATENCY` (`200ms`, `2s`): a stand-in for a real model's wait, for capacity tests |
/// | `openai:MODEL` | OpenAI; key from `OPENAI_API_KEY` (feature `openai`) |
/// | `anthropic:MODEL` | Anthropic; key from `ANTHROPIC_API_KEY` (feature `anthropic`) |
/// | `gemini:MODEL` | Gemini; key from `GEMINI_API_KEY` or `GOOGLE_API_KEY` (feature `gemini`) |
/// | `openai-compatible:URL:MODEL` | an OpenAI-compatible server at `URL` (Ollama, vLLM, llama.cpp, Groq, OpenRouter); key from `OPENAI_COMPATIBLE_API_KEY` if set (feature `openai`) |
///
/// In `openai-compatible:URL:MODEL` the URL's own colons (scheme, port) are skipped, so
/// `openai-compatible:http://localhost:11434/v1:llama3.2:3b` names model `llama3.2:3b`.
/// `OPENAI_API_KEY` is deliberately not sent to a compatible server, which may be another
/// party's host.
///
/// An unknown kind, a missing model, or a provider whose feature is off is
/// [`AgentError::InvalidInput`]; a missing API key is an `LlmError` of kind `config`.
///
/// ```
/// use keel_llm::llm_from_spec;
/// assert_eq!(llm_from_spec("mock").unwrap().model_name(), "mock");
/// assert_eq!(llm_from_spec("mock:200ms").unwrap().model_name(), "mock");
/// assert!(llm_from_spec("mock:soon").is_err());
/// assert!(llm_from_spec("parrot:polly").is_err());
/// ```
pub fn llm_from_spec(spec: &str) -> AgentResult<Arc<dyn Llm>> {
    llm_from_spec_with_key(spec, None)
}

/// [`llm_from_spec`] with an API key given by the caller (a configuration file's per-model
/// key), used instead of the provider's environment variable; `None` reads the variable as
/// [`llm_from_spec`] does. The offline `mock` model takes no key and ignores it.
///
/// ```
/// use keel_llm::llm_from_spec_with_key;
/// let model = llm_from_spec_with_key("mock", Some("unused")).unwrap();
/// assert_eq!(model.model_name(), "mock");
/// ```
pub fn llm_from_spec_with_key(spec: &str, api_key: Option<&str>) -> AgentResult<Arc<dyn Llm>> {
    let spec = spec.trim();
    if spec == "mock" {
        return Ok(Arc::new(MockLlm::new().keep_requests(0)));
    }
    if let Some(latency) = spec.strip_prefix("mock:") {
        let latency = parse_latency(latency).ok_or_else(|| {
            invalid(format!(
                "`{spec}`: `mock:LATENCY` takes a time such as `200ms` or `2s`"
            ))
        })?;
        return Ok(Arc::new(
            MockLlm::new().keep_requests(0).with_latency(latency),
        ));
    }
    if let Some(rest) = spec.strip_prefix("openai-compatible:") {
        let (url, model) = split_url_and_model(rest).ok_or_else(|| {
            invalid(format!(
                "`{spec}` must be `openai-compatible:URL:MODEL`, e.g. \
                 `openai-compatible:http://localhost:11434/v1:llama3.2`"
            ))
        })?;
        return openai_compatible(url, model, api_key);
    }
    let (kind, model) = spec
        .split_once(':')
        .ok_or_else(|| invalid(format!("`{spec}` must be `mock` or `KIND:MODEL`")))?;
    if model.trim().is_empty() {
        return Err(invalid(format!("`{spec}` names no model")));
    }
    match kind {
        "openai" => openai(model, api_key),
        "anthropic" => anthropic(model, api_key),
        "gemini" => gemini(model, api_key),
        other => Err(invalid(format!(
            "unknown model kind `{other}`; expected mock, openai, anthropic, gemini or \
             openai-compatible"
        ))),
    }
}

/// `200ms`, `1.5s`: a whole or fractional number of milliseconds or seconds.
fn parse_latency(text: &str) -> Option<std::time::Duration> {
    let (number, unit) = match text.strip_suffix("ms") {
        Some(number) => (number, 1e-3),
        None => (text.strip_suffix('s')?, 1.0),
    };
    let seconds = number.trim().parse::<f64>().ok()? * unit;
    std::time::Duration::try_from_secs_f64(seconds).ok()
}

fn invalid(reason: String) -> AgentError {
    AgentError::invalid_input("llm", reason)
}

#[allow(dead_code)] // Used only when a provider feature is off.
fn feature_off(feature: &str) -> AgentError {
    invalid(format!(
        "the `{feature}` provider is not compiled in; enable keel-llm's `{feature}` feature"
    ))
}

/// Split `URL:MODEL` at the first colon that is neither the scheme's nor the port's.
fn split_url_and_model(rest: &str) -> Option<(&str, &str)> {
    let scheme_end = rest.find("://")? + 3;
    let mut authority = true;
    let bytes = rest.as_bytes();
    let mut index = scheme_end;
    while index < bytes.len() {
        match bytes[index] {
            b'/' => authority = false,
            b':' => {
                let digits = bytes[index + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let after = bytes.get(index + 1 + digits);
                let is_port = authority && digits > 0 && matches!(after, None | Some(b'/' | b':'));
                if is_port {
                    authority = false;
                    index += 1 + digits;
                    continue;
                }
                let (url, model) = (&rest[..index], &rest[index + 1..]);
                return (!model.is_empty() && url.len() > scheme_end).then_some((url, model));
            }
            _ => {}
        }
        index += 1;
    }
    None
}

/// `builder` with the caller's key, when one was given.
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
fn keyed<L>(
    builder: crate::providers::ProviderBuilder<L>,
    api_key: Option<impl Into<String>>,
) -> crate::providers::ProviderBuilder<L> {
    match api_key {
        Some(key) => builder.with_api_key(key),
        None => builder,
    }
}

/// One function per provider with a key-only builder: its `model`, keyed with the caller's
/// key when one was given, or, with the provider's feature off, the error naming the feature.
macro_rules! keyed_providers {
    ($($name:ident: $feature:tt => $llm:ident;)*) => {$(
        #[cfg(feature = $feature)]
        fn $name(model: &str, api_key: Option<&str>) -> AgentResult<Arc<dyn Llm>> {
            let builder = keyed(crate::providers::$llm::builder(model), api_key);
            Ok(Arc::new(builder.build()?))
        }

        #[cfg(not(feature = $feature))]
        fn $name(_model: &str, _api_key: Option<&str>) -> AgentResult<Arc<dyn Llm>> {
            Err(feature_off($feature))
        }
    )*};
}

keyed_providers! {
    openai: "openai" => OpenAiLlm;
    anthropic: "anthropic" => AnthropicLlm;
    gemini: "gemini" => GeminiLlm;
}

#[cfg(feature = "openai")]
fn openai_compatible(url: &str, model: &str, api_key: Option<&str>) -> AgentResult<Arc<dyn Llm>> {
    let api_key = api_key
        .map(str::to_owned)
        .or_else(|| std::env::var("OPENAI_COMPATIBLE_API_KEY").ok());
    let builder = keyed(crate::providers::OpenAiLlm::compatible(url, model), api_key);
    Ok(Arc::new(builder.build()?))
}

#[cfg(not(feature = "openai"))]
fn openai_compatible(
    _url: &str,
    _model: &str,
    _api_key: Option<&str>,
) -> AgentResult<Arc<dyn Llm>> {
    Err(feature_off("openai"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::ErrorKind;

    #[test]
    fn a_mock_latency_is_milliseconds_or_seconds() {
        use std::time::Duration;
        assert_eq!(parse_latency("200ms"), Some(Duration::from_millis(200)));
        assert_eq!(parse_latency("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_latency("soon"), None);
        assert_eq!(parse_latency("-1s"), None);
        let err = llm_from_spec("mock:soon").err().expect("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn url_and_model_split_past_scheme_and_port_colons() {
        let cases = [
            (
                "http://localhost:11434/v1:llama3.2",
                Some(("http://localhost:11434/v1", "llama3.2")),
            ),
            (
                "http://localhost:11434/v1:llama3.2:3b",
                Some(("http://localhost:11434/v1", "llama3.2:3b")),
            ),
            (
                "http://127.0.0.1:8080:qwen",
                Some(("http://127.0.0.1:8080", "qwen")),
            ),
            (
                "https://api.groq.com/openai/v1:llama-3.1-8b-instant",
                Some(("https://api.groq.com/openai/v1", "llama-3.1-8b-instant")),
            ),
            (
                "https://openrouter.ai/api/v1:openai/gpt-4o",
                Some(("https://openrouter.ai/api/v1", "openai/gpt-4o")),
            ),
            ("http://host:8000:123", Some(("http://host:8000", "123"))),
            ("http://localhost:11434/v1", None),
            ("http://localhost:11434/v1:", None),
            ("localhost:11434", None),
        ];
        for (input, expected) in cases {
            assert_eq!(split_url_and_model(input), expected, "{input}");
        }
    }

    #[test]
    fn bad_specs_are_invalid_input() {
        for spec in [
            "",
            "parrot:polly",
            "openai",
            "openai:",
            "openai-compatible:nope",
        ] {
            let err = llm_from_spec(spec).err().expect(spec);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{spec}: {err}");
        }
    }

    #[cfg(not(feature = "openai"))]
    #[test]
    fn a_provider_whose_feature_is_off_names_the_feature() {
        let err = llm_from_spec("openai:gpt-4o").err().expect("feature off");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("`openai` feature"));
    }
}
