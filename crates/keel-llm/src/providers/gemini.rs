//! [`GeminiLlm`]: Google Gemini's `generateContent` and `streamGenerateContent?alt=sse`,
//! with function calling, JSON-schema output, usage and SSE streaming.

use std::sync::Arc;

use async_trait::async_trait;
use eventsource_stream::Event;
use futures::StreamExt as _;
use keel_core::AgentResult;
use serde_json::{json, Map, Value};
use tracing::Instrument;

use super::assembler::{ended_early, ResponseAssembler};
use super::attachments::{attachment, text_with_attachments, Attachment};
use super::builder::ProviderBuilder;
use super::http::{
    drive_sse, error_detail, join_url, open_stream, str_at, u64_at, ApiKey, CallSite, HttpClient,
    SseDecoder,
};
use crate::{
    Llm, LlmError, LlmErrorKind, LlmMessage, LlmRequest, LlmResponse, LlmRole, LlmStream,
    LlmStreamEvent, ModelProfile, ToolCall, Usage,
};

const GEMINI_BASE_URL: &str = "https://generativelanguage.googleapis.com/v1beta";
/// The image formats Gemini accepts.
const IMAGE_FORMATS: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/webp",
    "image/heic",
    "image/heif",
];

/// Builds a [`GeminiLlm`]: the shared [`ProviderBuilder`], whose `build` is below.
pub type GeminiBuilder = ProviderBuilder<GeminiLlm>;

impl GeminiBuilder {
    /// Build the client; fails without a key (from the builder, `GEMINI_API_KEY` or
    /// `GOOGLE_API_KEY`).
    pub fn build(self) -> AgentResult<GeminiLlm> {
        let api_key = self.required_key(
            "no Gemini API key: set GEMINI_API_KEY (or GOOGLE_API_KEY) or give one to the \
             builder",
        )?;
        let profile = self.profile("gemini");
        let http = self.http()?;
        // Accept `gemini-2.5-flash` and `models/gemini-2.5-flash` alike.
        let path = self.model.trim_start_matches("models/");
        Ok(GeminiLlm {
            inner: Arc::new(Inner {
                url: join_url(&self.base_url, &format!("models/{path}:generateContent")),
                stream_url: join_url(
                    &self.base_url,
                    &format!("models/{path}:streamGenerateContent?alt=sse"),
                ),
                model: self.model,
                api_key,
                http,
                profile,
            }),
        })
    }
}

/// A Google Gemini model.
///
/// ```
/// use keel_llm::{providers::GeminiLlm, Llm};
/// let llm = GeminiLlm::builder("gemini-2.5-flash").with_api_key("AIza-secret").build()?;
/// assert_eq!(llm.profile().provider, "gemini");
/// assert!(!format!("{llm:?}").contains("secret"));
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GeminiLlm {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: String,
    stream_url: String,
    model: String,
    api_key: ApiKey,
    http: HttpClient,
    profile: ModelProfile,
}

impl GeminiLlm {
    /// A builder for `model`, keyed from `GEMINI_API_KEY` or `GOOGLE_API_KEY` unless given
    /// one (`/models/MODEL:generateContent` is appended to a base URL it is given).
    pub fn builder(model: impl Into<String>) -> GeminiBuilder {
        ProviderBuilder::new(
            model,
            GEMINI_BASE_URL,
            &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        )
    }
}

impl Inner {
    fn site(&self) -> CallSite<'_> {
        CallSite {
            provider: "gemini",
            model: &self.model,
            key: Some(&self.api_key),
            classify,
        }
    }

    /// The key travels in a header, never in the URL (`?key=`), so it cannot leak through a
    /// logged URL.
    fn request(&self, url: &str, body: &Value) -> reqwest::RequestBuilder {
        self.http
            .post(url)
            .header("x-goog-api-key", self.api_key.expose())
            .json(body)
    }

    fn body(&self, request: &LlmRequest) -> Value {
        let mut body = Map::new();
        let system: Vec<Value> = request
            .messages
            .iter()
            .filter(|m| m.role == LlmRole::System)
            .map(text_with_attachments)
            .filter(|text| !text.is_empty())
            .map(|text| json!({"text": text}))
            .collect();
        if !system.is_empty() {
            body.insert("systemInstruction".into(), json!({"parts": system}));
        }
        body.insert(
            "contents".into(),
            Value::Array(wire_contents(&request.messages)),
        );
        if !request.tools.is_empty() {
            let declarations: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| {
                    // `parametersJsonSchema` takes full JSON Schema, which Keel's specs are;
                    // the older `parameters` accepts only an OpenAPI subset.
                    json!({
                        "name": tool.name,
                        "description": tool.description,
                        "parametersJsonSchema": tool.parameters,
                    })
                })
                .collect();
            body.insert(
                "tools".into(),
                json!([{"functionDeclarations": declarations}]),
            );
        }
        let mut config = Map::new();
        if let Some(schema) = &request.output_schema {
            config.insert("responseMimeType".into(), json!("application/json"));
            config.insert("responseJsonSchema".into(), schema.clone());
        }
        if let Some(max) = request.max_output_tokens {
            config.insert("maxOutputTokens".into(), json!(max));
        }
        if let Some(temperature) = request.temperature {
            config.insert("temperature".into(), json!(temperature));
        }
        if !config.is_empty() {
            body.insert("generationConfig".into(), Value::Object(config));
        }
        Value::Object(body)
    }
}

/// Keel's turns as Gemini contents: the model's turns are `model`, tool results are
/// `functionResponse` parts in user turns, and consecutive turns of one role merge.
fn wire_contents(messages: &[LlmMessage]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, parts) = match message.role {
            LlmRole::System => continue,
            LlmRole::User => ("user", user_parts(message)),
            LlmRole::Assistant => {
                let mut parts = text_part(&text_with_attachments(message));
                parts.extend(message.tool_calls.iter().map(
                    |call| json!({"functionCall": {"name": call.name, "args": call.arguments}}),
                ));
                ("model", parts)
            }
            LlmRole::Tool => {
                // `response` must be an object; a plain result is wrapped.
                let content = text_with_attachments(message);
                let response = match serde_json::from_str::<Value>(&content) {
                    Ok(Value::Object(object)) => Value::Object(object),
                    _ => json!({"result": content}),
                };
                let name = message.tool_name.as_deref().unwrap_or_default();
                (
                    "user",
                    vec![json!({"functionResponse": {"name": name, "response": response}})],
                )
            }
        };
        if parts.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_parts)) if *last_role == role => last_parts.extend(parts),
            _ => turns.push((role, parts)),
        }
    }
    turns
        .into_iter()
        .map(|(role, parts)| json!({"role": role, "parts": parts}))
        .collect()
}

/// A user turn's parts: each attachment (`inlineData`, `fileData` or text), then the text,
/// the order Gemini's guide advises for images.
fn user_parts(message: &LlmMessage) -> Vec<Value> {
    let mut parts: Vec<Value> = message
        .attachments
        .iter()
        .map(|file| match attachment(file, IMAGE_FORMATS) {
            Attachment::InlineImage { media_type, data } => {
                json!({"inlineData": {"mimeType": media_type, "data": data}})
            }
            Attachment::ImageUrl { media_type, url } => {
                json!({"fileData": {"mimeType": media_type, "fileUri": url}})
            }
            Attachment::Text(text) => json!({"text": text}),
        })
        .collect();
    parts.extend(text_part(&message.content));
    parts
}

fn text_part(text: &str) -> Vec<Value> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"text": text})]
    }
}

/// Gemini answers a bad key with 400 and a token overflow with 400 too; tell them apart.
fn classify(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind> {
    let lower = detail.to_ascii_lowercase();
    let reason_is = |reason: &str| {
        json.pointer("/error/details")
            .and_then(Value::as_array)
            .is_some_and(|details| details.iter().any(|d| str_at(d, "/reason") == reason))
    };
    if status == 400 && (reason_is("API_KEY_INVALID") || lower.contains("api key not valid")) {
        return Some(LlmErrorKind::Auth);
    }
    let overflow = lower.contains("exceeds the maximum number of tokens")
        || lower.contains("input token count")
        || lower.contains("token limit")
        || lower.contains("context window");
    (status == 400 && overflow).then_some(LlmErrorKind::ContextOverflow)
}

fn bad_response(model: &str, what: &str) -> LlmError {
    LlmError::new(
        LlmErrorKind::BadResponse,
        model,
        format!("the Gemini response {what}"),
    )
}

/// One functionCall part as a [`ToolCall`].
fn function_call(model: &str, call: &Value) -> Result<ToolCall, LlmError> {
    let name = call
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_response(model, "has a functionCall without a name"))?;
    let mut tool_call = ToolCall::new(name, call.get("args").cloned().unwrap_or_else(|| json!({})));
    if let Some(id) = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
    {
        tool_call.id = id.to_owned();
    }
    Ok(tool_call)
}

/// The parts of the first candidate; an answer without candidates says why (a blocked
/// prompt) as a bad response.
fn parts<'a>(model: &str, body: &'a Value) -> Result<&'a [Value], LlmError> {
    let Some(candidate) = body.pointer("/candidates/0") else {
        let reason = str_at(body, "/promptFeedback/blockReason");
        let what = if reason.is_empty() {
            "has no candidates".to_owned()
        } else {
            format!("has no candidates: the prompt was blocked ({reason})")
        };
        return Err(bad_response(model, &what));
    };
    Ok(candidate
        .pointer("/content/parts")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice))
}

fn usage(body: &Value) -> Option<Usage> {
    let metadata = body.get("usageMetadata")?;
    Some(Usage {
        input_tokens: u64_at(metadata, "/promptTokenCount"),
        // Thinking models bill thoughts as output too.
        output_tokens: u64_at(metadata, "/candidatesTokenCount")
            + u64_at(metadata, "/thoughtsTokenCount"),
    })
}

/// A `generateContent` body as an [`LlmResponse`].
fn parse_response(model: &str, body: &Value) -> Result<LlmResponse, LlmError> {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for part in parts(model, body)? {
        if part.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if let Some(t) = part.get("text").and_then(Value::as_str) {
            text.push_str(t);
        }
        if let Some(call) = part.get("functionCall") {
            tool_calls.push(function_call(model, call)?);
        }
    }
    Ok(LlmResponse {
        content: (!text.is_empty()).then_some(text),
        tool_calls,
        usage: usage(body).unwrap_or_default(),
    })
}

/// Decodes `streamGenerateContent?alt=sse` chunks. Gemini has no final event: the chunk with
/// a `finishReason` is the last, and the body then ends.
struct Decoder {
    model: String,
    assembler: Option<ResponseAssembler>,
    finish_reason_seen: bool,
}

impl SseDecoder for Decoder {
    fn event(&mut self, event: &Event, out: &mut Vec<LlmStreamEvent>) -> Result<bool, LlmError> {
        let chunk: Value = serde_json::from_str(&event.data).map_err(|e| {
            bad_response(
                &self.model,
                &format!("stream sent a chunk that is not JSON: {e}"),
            )
        })?;
        if chunk.get("error").is_some() {
            let detail = error_detail(&chunk, &event.data);
            let status = u64_at(&chunk, "/error/code");
            let kind = classify(u16::try_from(status).unwrap_or(400), &chunk, &detail).unwrap_or(
                match status {
                    429 => LlmErrorKind::RateLimit,
                    401 | 403 => LlmErrorKind::Auth,
                    _ => LlmErrorKind::Api,
                },
            );
            return Err(LlmError::new(
                kind,
                self.model.as_str(),
                format!("stream error: {detail}"),
            ));
        }
        let Some(assembler) = self.assembler.as_mut() else {
            return Ok(true);
        };
        if let Some(usage) = usage(&chunk) {
            assembler.set_input_tokens(usage.input_tokens);
            assembler.set_output_tokens(usage.output_tokens);
        }
        for part in parts(&self.model, &chunk)? {
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(text) = part.get("text").and_then(Value::as_str) {
                out.extend(assembler.text(text));
            }
            if let Some(call) = part.get("functionCall") {
                // Gemini sends each call whole, never in fragments.
                assembler.whole_tool_call(function_call(&self.model, call)?);
            }
        }
        if chunk
            .pointer("/candidates/0/finishReason")
            .is_some_and(|reason| !reason.is_null())
        {
            self.finish_reason_seen = true;
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), LlmError> {
        match self.assembler.take() {
            Some(assembler) if self.finish_reason_seen => {
                out.extend(assembler.finish(&self.model)?);
                Ok(())
            }
            _ => Err(ended_early(&self.model)),
        }
    }
}

#[async_trait]
impl Llm for GeminiLlm {
    fn model_name(&self) -> &str {
        &self.inner.model
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let inner = &self.inner;
        let span = tracing::info_span!("llm.complete", provider = "gemini", model = %inner.model);
        async move {
            let site = inner.site();
            let body = inner.body(&request);
            let json = inner
                .http
                .send(&site, || inner.request(&inner.url, &body), true)
                .await?
                .json(&site)
                .await?;
            Ok(parse_response(&inner.model, &json)?)
        }
        .instrument(span)
        .await
    }

    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::info_span!("llm.stream", provider = "gemini", model = %inner.model);
        let opening = async move {
            let site = inner.site();
            let body = inner.body(&request);
            let opened = inner
                .http
                .send(&site, || inner.request(&inner.stream_url, &body), false)
                .await?;
            let decoder = Decoder {
                model: inner.model.clone(),
                assembler: Some(ResponseAssembler::default()),
                finish_reason_seen: false,
            };
            Ok(drive_sse(
                opened.events(&site).boxed(),
                decoder,
                tracing::Span::current(),
            ))
        };
        open_stream(opening.instrument(span))
    }

    fn profile(&self) -> ModelProfile {
        self.inner.profile.clone()
    }
}
