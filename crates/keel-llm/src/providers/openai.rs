//! [`OpenAiLlm`]: an OpenAI-compatible chat completions client (OpenAI, Ollama, vLLM,
//! llama.cpp, Groq, OpenRouter), with tools, JSON-schema output, usage and SSE streaming.

use std::sync::Arc;

use async_trait::async_trait;
use eventsource_stream::Event;
use futures::StreamExt as _;
use keel_core::AgentResult;
use serde_json::{json, Map, Value};
use tracing::Instrument;

use super::assembler::{ended_early, parse_arguments, ResponseAssembler};
use super::attachments::{attachment, text_with_attachments, Attachment};
use super::builder::ProviderBuilder;
use super::http::{
    drive_sse, join_url, open_stream, str_at, u64_at, ApiKey, CallSite, HttpClient, SseDecoder,
};
use crate::{
    Llm, LlmError, LlmErrorKind, LlmMessage, LlmRequest, LlmResponse, LlmRole, LlmStream,
    LlmStreamEvent, ModelProfile, ToolCall, Usage,
};

const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// What building an OpenAI client without a key says.
const MISSING_KEY: &str = "no OpenAI API key: set OPENAI_API_KEY or give one to the builder";
/// The image formats chat completions accept (compatible servers take the same set).
const IMAGE_FORMATS: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Builds an [`OpenAiLlm`]: the shared [`ProviderBuilder`], whose `build` is below.
pub type OpenAiBuilder = ProviderBuilder<OpenAiLlm>;

impl OpenAiBuilder {
    /// Build the client. OpenAI itself needs a key (from the builder or `OPENAI_API_KEY`);
    /// a compatible server is called without one unless one was given. A compatible
    /// server's model is taken as text-only unless [`with_vision`](Self::with_vision) (or a
    /// profile) says it reads images (e.g. `llava` on Ollama, a vision model on vLLM or
    /// OpenRouter).
    pub fn build(self) -> AgentResult<OpenAiLlm> {
        let key_required = self.reads_key_env();
        let api_key = if key_required {
            Some(self.required_key(MISSING_KEY)?)
        } else {
            self.key()
        };
        let provider = if key_required {
            "openai"
        } else {
            "openai-compatible"
        };
        let profile = self.profile(provider);
        let http = self.http()?;
        // Only OpenAI itself insists on the newer field; compatible servers know `max_tokens`.
        let max_tokens_field = if self.base_url.trim_end_matches('/') == OPENAI_BASE_URL {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        Ok(OpenAiLlm {
            inner: Arc::new(Inner {
                url: join_url(&self.base_url, "chat/completions"),
                model: self.model,
                api_key,
                http,
                profile,
                provider,
                max_tokens_field,
            }),
        })
    }
}

/// An OpenAI-compatible chat completions model.
///
/// ```
/// use keel_llm::{providers::OpenAiLlm, Llm};
/// // Ollama needs no key; nothing is sent until the first call.
/// let llm = OpenAiLlm::compatible("http://localhost:11434/v1", "llama3.2").build()?;
/// assert_eq!(llm.model_name(), "llama3.2");
/// assert!(!format!("{llm:?}").contains("sk-"));
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiLlm {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: String,
    model: String,
    api_key: Option<ApiKey>,
    http: HttpClient,
    profile: ModelProfile,
    provider: &'static str,
    max_tokens_field: &'static str,
}

impl OpenAiLlm {
    /// A builder for OpenAI's `model`, keyed from `OPENAI_API_KEY` unless given one (the
    /// path `/chat/completions` is appended to a base URL it is given).
    pub fn builder(model: impl Into<String>) -> OpenAiBuilder {
        ProviderBuilder::new(model, OPENAI_BASE_URL, &["OPENAI_API_KEY"])
    }

    /// A builder for `model` on an OpenAI-compatible server at `base_url` (e.g.
    /// `http://localhost:11434/v1` for Ollama). It never reads `OPENAI_API_KEY`: that key is
    /// not sent to another host unless given explicitly.
    pub fn compatible(base_url: impl Into<String>, model: impl Into<String>) -> OpenAiBuilder {
        ProviderBuilder::new(model, base_url, &[])
    }
}

impl Inner {
    fn site(&self) -> CallSite<'_> {
        CallSite {
            provider: self.provider,
            model: &self.model,
            key: self.api_key.as_ref(),
            classify,
        }
    }

    fn request(&self, body: &Value) -> reqwest::RequestBuilder {
        let builder = self.http.post(&self.url).json(body);
        match &self.api_key {
            Some(key) => builder.bearer_auth(key.expose()),
            None => builder,
        }
    }

    fn body(&self, request: &LlmRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert(
            "messages".into(),
            Value::Array(request.messages.iter().map(wire_message).collect()),
        );
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.parameters,
                        }
                    })
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
        }
        if let Some(schema) = &request.output_schema {
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
            );
        }
        if let Some(max) = request.max_output_tokens {
            body.insert(self.max_tokens_field.into(), json!(max));
        }
        if let Some(temperature) = request.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if stream {
            body.insert("stream".into(), json!(true));
            // Without this OpenAI sends no usage figures on a stream.
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Value::Object(body)
    }
}

/// One Keel message in OpenAI's chat format.
fn wire_message(message: &LlmMessage) -> Value {
    match message.role {
        LlmRole::System => json!({"role": "system", "content": text_with_attachments(message)}),
        LlmRole::User => {
            let mut wire = json!({"role": "user", "content": user_content(message)});
            if let Some(name) = &message.name {
                wire["name"] = json!(name);
            }
            wire
        }
        LlmRole::Assistant => {
            let content = text_with_attachments(message);
            let mut wire = json!({"role": "assistant", "content": content});
            if !message.tool_calls.is_empty() {
                if content.is_empty() {
                    wire["content"] = Value::Null;
                }
                wire["tool_calls"] = message
                    .tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments.to_string()},
                        })
                    })
                    .collect();
            }
            wire
        }
        LlmRole::Tool => json!({
            "role": "tool",
            "tool_call_id": message.tool_call_id.as_deref().unwrap_or_default(),
            "content": text_with_attachments(message),
        }),
    }
}

/// A user turn's content: its text alone, or with attachments an array of content parts,
/// each file (as an `image_url` part or as text) and then the text (files before the
/// question, the order every provider's guide shows; decision 60).
fn user_content(message: &LlmMessage) -> Value {
    if message.attachments.is_empty() {
        return json!(message.content);
    }
    let mut parts = Vec::with_capacity(message.attachments.len() + 1);
    for file in &message.attachments {
        parts.push(match attachment(file, IMAGE_FORMATS) {
            Attachment::InlineImage { media_type, data } => json!({
                "type": "image_url",
                "image_url": {"url": format!("data:{media_type};base64,{data}")},
            }),
            Attachment::ImageUrl { url, .. } => {
                json!({"type": "image_url", "image_url": {"url": url}})
            }
            Attachment::Text(text) => json!({"type": "text", "text": text}),
        });
    }
    if !message.content.is_empty() {
        parts.push(json!({"type": "text", "text": message.content}));
    }
    Value::Array(parts)
}

/// Context overflow as OpenAI and the common compatible servers report it.
fn classify(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind> {
    if !matches!(status, 400 | 413) {
        return None;
    }
    let code = str_at(json, "/error/code");
    let kind = str_at(json, "/error/type");
    let detail = detail.to_ascii_lowercase();
    let overflow = code == "context_length_exceeded"
        || kind == "exceed_context_size_error" // llama.cpp
        || detail.contains("maximum context length") // OpenAI, vLLM
        || detail.contains("context length")
        || detail.contains("context window")
        || detail.contains("exceeds the available context size");
    overflow.then_some(LlmErrorKind::ContextOverflow)
}

fn bad_response(model: &str, what: &str) -> LlmError {
    LlmError::new(
        LlmErrorKind::BadResponse,
        model,
        format!("the chat completion {what}"),
    )
}

/// A chat completion body as an [`LlmResponse`].
fn parse_completion(model: &str, body: &Value) -> Result<LlmResponse, LlmError> {
    let message = body
        .pointer("/choices/0/message")
        .ok_or_else(|| bad_response(model, "has no choices[0].message"))?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    let mut tool_calls = Vec::new();
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_response(model, "has a tool call without a function name"))?;
        let mut tool_call =
            ToolCall::new(name, parse_arguments(str_at(call, "/function/arguments")));
        if let Some(id) = call.get("id").and_then(Value::as_str) {
            tool_call.id = id.to_owned();
        }
        tool_calls.push(tool_call);
    }
    Ok(LlmResponse {
        content,
        tool_calls,
        usage: Usage {
            input_tokens: u64_at(body, "/usage/prompt_tokens"),
            output_tokens: u64_at(body, "/usage/completion_tokens"),
        },
    })
}

/// Decodes `chat.completion.chunk` events.
struct Decoder {
    model: String,
    assembler: Option<ResponseAssembler>,
    finish_reason_seen: bool,
}

impl Decoder {
    fn finish(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), LlmError> {
        if let Some(assembler) = self.assembler.take() {
            out.extend(assembler.finish(&self.model)?);
        }
        Ok(())
    }
}

impl SseDecoder for Decoder {
    fn event(&mut self, event: &Event, out: &mut Vec<LlmStreamEvent>) -> Result<bool, LlmError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.finish(out)?;
            return Ok(true);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            bad_response(
                &self.model,
                &format!("stream sent a chunk that is not JSON: {e}"),
            )
        })?;
        if chunk.get("error").is_some() {
            let detail = super::http::error_detail(&chunk, data);
            let kind = classify(400, &chunk, &detail).unwrap_or(LlmErrorKind::Api);
            return Err(LlmError::new(
                kind,
                self.model.as_str(),
                format!("stream error: {detail}"),
            ));
        }
        let Some(assembler) = self.assembler.as_mut() else {
            return Ok(true);
        };
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            assembler.set_input_tokens(u64_at(usage, "/prompt_tokens"));
            assembler.set_output_tokens(u64_at(usage, "/completion_tokens"));
        }
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str) {
                out.extend(assembler.text(text));
            }
            for call in choice
                .pointer("/delta/tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .and_then(|i| usize::try_from(i).ok())
                    .unwrap_or(0);
                let text = |pointer| {
                    call.pointer(pointer)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                out.push(assembler.tool_delta(
                    index,
                    text("/id"),
                    text("/function/name"),
                    str_at(call, "/function/arguments"),
                ));
            }
            if choice
                .get("finish_reason")
                .is_some_and(|reason| !reason.is_null())
            {
                self.finish_reason_seen = true;
            }
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), LlmError> {
        // Some compatible servers omit `[DONE]`; an answer with its finish reason is whole.
        if self.finish_reason_seen {
            return self.finish(out);
        }
        Err(ended_early(&self.model))
    }
}

#[async_trait]
impl Llm for OpenAiLlm {
    fn model_name(&self) -> &str {
        &self.inner.model
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let inner = &self.inner;
        let span =
            tracing::info_span!("llm.complete", provider = inner.provider, model = %inner.model);
        async move {
            let site = inner.site();
            let body = inner.body(&request, false);
            let json = inner
                .http
                .send(&site, || inner.request(&body), true)
                .await?
                .json(&site)
                .await?;
            Ok(parse_completion(&inner.model, &json)?)
        }
        .instrument(span)
        .await
    }

    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        let inner = Arc::clone(&self.inner);
        let span =
            tracing::info_span!("llm.stream", provider = inner.provider, model = %inner.model);
        let opening = async move {
            let site = inner.site();
            let body = inner.body(&request, true);
            let opened = inner
                .http
                .send(&site, || inner.request(&body), false)
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
