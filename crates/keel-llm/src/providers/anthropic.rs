//! [`AnthropicLlm`]: Anthropic's Messages API, with tools, structured output (through a
//! forced tool), usage and SSE streaming.

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

const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The synthetic tool that carries a structured answer (Messages has no schema option).
const OUTPUT_TOOL: &str = "structured_output";
/// `max_tokens` is required by the API; used when neither request nor profile sets it.
const DEFAULT_MAX_TOKENS: u64 = 4096;
/// The image formats Messages accepts.
const IMAGE_FORMATS: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Builds an [`AnthropicLlm`]: the shared [`ProviderBuilder`], whose `build` is below.
pub type AnthropicBuilder = ProviderBuilder<AnthropicLlm>;

impl AnthropicBuilder {
    /// Build the client; fails without a key (from the builder or `ANTHROPIC_API_KEY`).
    pub fn build(self) -> AgentResult<AnthropicLlm> {
        let api_key = self.required_key(
            "no Anthropic API key: set ANTHROPIC_API_KEY or give one to the builder",
        )?;
        let profile = self.profile("anthropic");
        let http = self.http()?;
        Ok(AnthropicLlm {
            inner: Arc::new(Inner {
                url: join_url(&self.base_url, "v1/messages"),
                model: self.model,
                api_key,
                http,
                profile,
            }),
        })
    }
}

/// An Anthropic Messages model.
///
/// ```
/// use keel_llm::{providers::AnthropicLlm, Llm};
/// let llm = AnthropicLlm::builder("claude-sonnet-4-5").with_api_key("sk-ant-secret").build()?;
/// assert_eq!(llm.profile().context_window, Some(200_000));
/// assert!(!format!("{llm:?}").contains("secret"));
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AnthropicLlm {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: String,
    model: String,
    api_key: ApiKey,
    http: HttpClient,
    profile: ModelProfile,
}

impl AnthropicLlm {
    /// A builder for `model`, keyed from `ANTHROPIC_API_KEY` unless given one (the path
    /// `/v1/messages` is appended to a base URL it is given).
    pub fn builder(model: impl Into<String>) -> AnthropicBuilder {
        ProviderBuilder::new(model, ANTHROPIC_BASE_URL, &["ANTHROPIC_API_KEY"])
    }
}

impl Inner {
    fn site(&self) -> CallSite<'_> {
        CallSite {
            provider: "anthropic",
            model: &self.model,
            key: Some(&self.api_key),
            classify,
        }
    }

    fn request(&self, body: &Value) -> reqwest::RequestBuilder {
        self.http
            .post(&self.url)
            .header("x-api-key", self.api_key.expose())
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(body)
    }

    /// Whether this request's answer comes back through the forced output tool.
    fn uses_output_tool(request: &LlmRequest) -> bool {
        request.output_schema.is_some() && request.tools.is_empty()
    }

    fn body(&self, request: &LlmRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        let max_tokens = request
            .max_output_tokens
            .or(self.profile.max_output_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        body.insert("max_tokens".into(), json!(max_tokens));

        // Messages takes instructions apart from the turns; system messages anywhere in the
        // conversation (a compaction summary, a late note) join them in order.
        let mut system: Vec<String> = request
            .messages
            .iter()
            .filter(|m| m.role == LlmRole::System)
            .map(text_with_attachments)
            .filter(|text| !text.is_empty())
            .collect();
        if let (Some(schema), false) = (&request.output_schema, Self::uses_output_tool(request)) {
            // With other tools offered the output tool cannot be forced; say it instead.
            system.push(format!(
                "Answer with JSON only, matching this JSON schema: {schema}"
            ));
        }
        if !system.is_empty() {
            body.insert("system".into(), json!(system.join("\n\n")));
        }
        body.insert(
            "messages".into(),
            Value::Array(wire_messages(&request.messages)),
        );

        let mut tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        if let (Some(schema), true) = (&request.output_schema, Self::uses_output_tool(request)) {
            tools.push(json!({
                "name": OUTPUT_TOOL,
                "description": "Give the final answer as structured data.",
                "input_schema": schema,
            }));
            body.insert(
                "tool_choice".into(),
                json!({"type": "tool", "name": OUTPUT_TOOL}),
            );
        }
        if !tools.is_empty() {
            body.insert("tools".into(), Value::Array(tools));
        }
        if let Some(temperature) = request.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        if stream {
            body.insert("stream".into(), json!(true));
        }
        Value::Object(body)
    }
}

/// Keel's turns as Messages turns: tool results travel in user turns, and consecutive turns
/// of one role merge (the API wants all results of a step in the one user turn after it).
fn wire_messages(messages: &[LlmMessage]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role {
            LlmRole::System => continue,
            LlmRole::User => ("user", user_blocks(message)),
            LlmRole::Assistant => {
                let mut blocks = text_block(&text_with_attachments(message));
                blocks.extend(message.tool_calls.iter().map(|call| {
                    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
                }));
                ("assistant", blocks)
            }
            LlmRole::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id.as_deref().unwrap_or_default(),
                    "content": text_with_attachments(message),
                })],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// A user turn's blocks: each attachment (an `image` block, or text), then the text, the
/// order Anthropic advises for images.
fn user_blocks(message: &LlmMessage) -> Vec<Value> {
    let mut blocks: Vec<Value> = message
        .attachments
        .iter()
        .map(|file| match attachment(file, IMAGE_FORMATS) {
            Attachment::InlineImage { media_type, data } => json!({
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }),
            Attachment::ImageUrl { url, .. } => {
                json!({"type": "image", "source": {"type": "url", "url": url}})
            }
            Attachment::Text(text) => json!({"type": "text", "text": text}),
        })
        .collect();
    blocks.extend(text_block(&message.content));
    blocks
}

/// A text block, or none: the API rejects empty text blocks.
fn text_block(text: &str) -> Vec<Value> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": text})]
    }
}

/// Context overflow as Anthropic reports it.
fn classify(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind> {
    let kind = str_at(json, "/error/type");
    let detail = detail.to_ascii_lowercase();
    if status == 413 || kind == "request_too_large" {
        return Some(LlmErrorKind::ContextOverflow);
    }
    if status == 400 && (detail.contains("prompt is too long") || detail.contains("context window"))
    {
        return Some(LlmErrorKind::ContextOverflow);
    }
    None
}

fn bad_response(model: &str, what: &str) -> LlmError {
    LlmError::new(
        LlmErrorKind::BadResponse,
        model,
        format!("the message {what}"),
    )
}

/// A tool call, or the text of a structured answer when it came through the output tool.
fn tool_use(
    model: &str,
    block: &Value,
    output_tool: bool,
) -> Result<Result<ToolCall, String>, LlmError> {
    let name = block
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_response(model, "has a tool_use block without a name"))?;
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    if output_tool && name == OUTPUT_TOOL {
        return Ok(Err(input.to_string()));
    }
    let mut call = ToolCall::new(name, input);
    if let Some(id) = block.get("id").and_then(Value::as_str) {
        call.id = id.to_owned();
    }
    Ok(Ok(call))
}

/// A Messages response body as an [`LlmResponse`].
fn parse_message(model: &str, body: &Value, output_tool: bool) -> Result<LlmResponse, LlmError> {
    let blocks = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_response(model, "has no content array"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match str_at(block, "/type") {
            "text" => text.push_str(str_at(block, "/text")),
            "tool_use" => match tool_use(model, block, output_tool)? {
                Ok(call) => tool_calls.push(call),
                Err(structured) => text.push_str(&structured),
            },
            // Thinking and other blocks are not part of the answer.
            _ => {}
        }
    }
    Ok(LlmResponse {
        content: (!text.is_empty()).then_some(text),
        tool_calls,
        usage: Usage {
            input_tokens: u64_at(body, "/usage/input_tokens"),
            output_tokens: u64_at(body, "/usage/output_tokens"),
        },
    })
}

/// Decodes Messages stream events.
struct Decoder {
    model: String,
    output_tool: bool,
    assembler: Option<ResponseAssembler>,
    /// The block index of the forced output tool, whose input is streamed as text.
    output_block: Option<u64>,
    stop_reason_seen: bool,
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
        let data: Value = serde_json::from_str(&event.data).map_err(|e| {
            bad_response(
                &self.model,
                &format!("stream sent an event that is not JSON: {e}"),
            )
        })?;
        let kind = match str_at(&data, "/type") {
            "" => event.event.as_str(),
            kind => kind,
        };
        if kind == "error" {
            let detail = error_detail(&data, &event.data);
            let kind = match str_at(&data, "/error/type") {
                "rate_limit_error" => LlmErrorKind::RateLimit,
                "authentication_error" | "permission_error" => LlmErrorKind::Auth,
                _ => classify(400, &data, &detail).unwrap_or(LlmErrorKind::Api),
            };
            return Err(LlmError::new(
                kind,
                self.model.as_str(),
                format!("stream error: {detail}"),
            ));
        }
        if kind == "message_stop" {
            self.finish(out)?;
            return Ok(true);
        }
        let Some(assembler) = self.assembler.as_mut() else {
            return Ok(true);
        };
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                assembler.set_input_tokens(u64_at(&data, "/message/usage/input_tokens"));
                assembler.set_output_tokens(u64_at(&data, "/message/usage/output_tokens"));
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                if str_at(block, "/type") == "tool_use" {
                    let name = str_at(block, "/name");
                    if self.output_tool && name == OUTPUT_TOOL {
                        self.output_block = Some(index);
                    } else {
                        let id = block.get("id").and_then(Value::as_str).map(str::to_owned);
                        out.push(assembler.tool_delta(
                            usize::try_from(index).unwrap_or(usize::MAX),
                            id,
                            Some(name.to_owned()),
                            "",
                        ));
                    }
                } else if let Some(text) = block.get("text").and_then(Value::as_str) {
                    out.extend(assembler.text(text));
                }
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                match str_at(delta, "/type") {
                    "text_delta" => out.extend(assembler.text(str_at(delta, "/text"))),
                    "input_json_delta" if self.output_block == Some(index) => {
                        out.extend(assembler.text(str_at(delta, "/partial_json")));
                    }
                    "input_json_delta" => out.push(assembler.tool_delta(
                        usize::try_from(index).unwrap_or(usize::MAX),
                        None,
                        None,
                        str_at(delta, "/partial_json"),
                    )),
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(tokens) = data.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    assembler.set_output_tokens(tokens);
                }
                if let Some(tokens) = data.pointer("/usage/input_tokens").and_then(Value::as_u64) {
                    assembler.set_input_tokens(tokens);
                }
                if data
                    .pointer("/delta/stop_reason")
                    .is_some_and(|reason| !reason.is_null())
                {
                    self.stop_reason_seen = true;
                }
            }
            // ping, content_block_stop, and event types added later.
            _ => {}
        }
        Ok(false)
    }

    fn end(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), LlmError> {
        if self.stop_reason_seen {
            return self.finish(out);
        }
        Err(ended_early(&self.model))
    }
}

#[async_trait]
impl Llm for AnthropicLlm {
    fn model_name(&self) -> &str {
        &self.inner.model
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let inner = &self.inner;
        let span =
            tracing::info_span!("llm.complete", provider = "anthropic", model = %inner.model);
        async move {
            let site = inner.site();
            let body = inner.body(&request, false);
            let json = inner
                .http
                .send(&site, || inner.request(&body), true)
                .await?
                .json(&site)
                .await?;
            Ok(parse_message(
                &inner.model,
                &json,
                Inner::uses_output_tool(&request),
            )?)
        }
        .instrument(span)
        .await
    }

    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::info_span!("llm.stream", provider = "anthropic", model = %inner.model);
        let opening = async move {
            let site = inner.site();
            let body = inner.body(&request, true);
            let opened = inner
                .http
                .send(&site, || inner.request(&body), false)
                .await?;
            let decoder = Decoder {
                model: inner.model.clone(),
                output_tool: Inner::uses_output_tool(&request),
                assembler: Some(ResponseAssembler::default()),
                output_block: None,
                stop_reason_seen: false,
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
