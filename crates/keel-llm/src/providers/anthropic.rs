//! [`AnthropicLlm`]: Anthropic's Messages API, with tools, structured output (through a
//! forced tool), usage and SSE streaming.

use eventsource_stream::Event;
use keel_core::AgentResult;
use serde_json::{json, Map, Value};

use super::assembler::{tool_call, ResponseAssembler};
use super::attachments::{tool_result_parts, Attachment};
use super::builder::ProviderBuilder;
use super::http::{join_url, str_at, u64_at};
use super::turns::{system_texts, turns, TurnFormat};
use super::wire::{
    event_json, provider_model, tool_declaration, Endpoint, Frame, KeyHeader, Provider,
    StreamDecoder, Wire, WireError,
};
use crate::{LlmErrorKind, LlmRequest, LlmResponse, ToolCall, Usage};

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
        let endpoint = Endpoint {
            provider: "anthropic",
            url: join_url(&self.base_url, "v1/messages"),
            stream_url: None,
            api_key: Some(api_key),
        };
        let wire = Anthropic {
            model: self.model.clone(),
            max_tokens: self
                .profile(endpoint.provider)
                .max_output_tokens
                .unwrap_or(DEFAULT_MAX_TOKENS),
        };
        Ok(AnthropicLlm(Provider::new(&self, endpoint, wire)?))
    }
}

provider_model! {
    /// An Anthropic Messages model.
    ///
    /// ```
    /// use keel_llm::{providers::AnthropicLlm, Llm};
    /// let llm = AnthropicLlm::builder("claude-sonnet-4-5").with_api_key("sk-ant-secret").build()?;
    /// assert_eq!(llm.profile().context_window, Some(200_000));
    /// assert!(!format!("{llm:?}").contains("secret"));
    /// # Ok::<(), keel_core::AgentError>(())
    /// ```
    AnthropicLlm(Anthropic)
}

impl AnthropicLlm {
    /// A builder for `model`, keyed from `ANTHROPIC_API_KEY` unless given one (the path
    /// `/v1/messages` is appended to a base URL it is given).
    pub fn builder(model: impl Into<String>) -> AnthropicBuilder {
        ProviderBuilder::new(model, ANTHROPIC_BASE_URL, &["ANTHROPIC_API_KEY"])
    }
}

/// The Messages wire format.
#[derive(Debug)]
struct Anthropic {
    model: String,
    /// `max_tokens` when the request sets none (the API requires one).
    max_tokens: u64,
}

/// Whether this request's answer comes back through the forced output tool.
fn uses_output_tool(request: &LlmRequest) -> bool {
    request.output_schema.is_some() && request.tools.is_empty()
}

impl Wire for Anthropic {
    type Decoder = Decoder;

    const KEY_HEADER: KeyHeader = KeyHeader::Named("x-api-key");
    const HEADERS: &'static [(&'static str, &'static str)] =
        &[("anthropic-version", ANTHROPIC_VERSION)];

    fn encode_request(&self, request: &LlmRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        let max_tokens = request.max_output_tokens.unwrap_or(self.max_tokens);
        body.insert("max_tokens".into(), json!(max_tokens));

        // Messages takes instructions apart from the turns.
        let mut system = system_texts(&request.messages);
        let output_tool = uses_output_tool(request);
        if let (Some(schema), false) = (&request.output_schema, output_tool) {
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
            Value::Array(turns(&request.messages, &TURNS)),
        );

        let declare = |tool| tool_declaration(tool, "input_schema");
        let mut tools: Vec<Value> = request.tools.iter().map(declare).collect();
        if let (Some(schema), true) = (&request.output_schema, output_tool) {
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

    fn decode_response(
        &self,
        request: &LlmRequest,
        body: &Value,
    ) -> Result<LlmResponse, WireError> {
        parse_message(body, uses_output_tool(request))
    }

    fn stream_decoder(&self, request: &LlmRequest) -> Decoder {
        Decoder {
            output_tool: uses_output_tool(request),
            output_block: None,
        }
    }

    /// Context overflow as Anthropic reports it.
    fn map_error(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind> {
        let kind = str_at(json, "/error/type");
        let detail = detail.to_ascii_lowercase();
        if status == 413 || kind == "request_too_large" {
            return Some(LlmErrorKind::ContextOverflow);
        }
        let too_long = detail.contains("prompt is too long") || detail.contains("context window");
        (status == 400 && too_long).then_some(LlmErrorKind::ContextOverflow)
    }
}

/// Messages turns: tool results travel in user turns, as `tool_result` blocks.
const TURNS: TurnFormat = TurnFormat {
    model_role: "assistant",
    pieces: "content",
    image_formats: IMAGE_FORMATS,
    part: block,
    tool_call: |call| json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}),
    tool_result,
};

/// A `tool_result` block: its text, or with images the tool returned a list of a text block
/// and `image` blocks (the Messages API takes images in tool results).
fn tool_result(message: &crate::LlmMessage) -> Vec<Value> {
    let (text, images) = tool_result_parts(message, IMAGE_FORMATS);
    let content = if images.is_empty() {
        json!(text)
    } else {
        let text = (!text.is_empty()).then(|| block(Attachment::Text(text)));
        Value::Array(
            text.into_iter()
                .chain(images.into_iter().map(block))
                .collect(),
        )
    };
    vec![json!({
        "type": "tool_result",
        "tool_use_id": message.tool_call_id.as_deref().unwrap_or_default(),
        "content": content,
    })]
}

/// One content block: an `image` block, or text (the API rejects empty text blocks, which
/// [`turns`] leaves out).
fn block(attachment: Attachment<'_>) -> Value {
    match attachment {
        Attachment::InlineImage { media_type, data } => json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }),
        Attachment::ImageUrl { url, .. } => {
            json!({"type": "image", "source": {"type": "url", "url": url}})
        }
        Attachment::Text(text) => json!({"type": "text", "text": text}),
    }
}

fn bad_response(what: &str) -> WireError {
    WireError::bad_response(format!("the message {what}"))
}

/// A tool call, or the text of a structured answer when it came through the output tool.
fn tool_use(block: &Value, output_tool: bool) -> Result<Result<ToolCall, String>, WireError> {
    let name = block
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_response("has a tool_use block without a name"))?;
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    if output_tool && name == OUTPUT_TOOL {
        return Ok(Err(input.to_string()));
    }
    Ok(Ok(tool_call(name, input, str_at(block, "/id"))))
}

/// A Messages response body as an [`LlmResponse`].
fn parse_message(body: &Value, output_tool: bool) -> Result<LlmResponse, WireError> {
    let blocks = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_response("has no content array"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match str_at(block, "/type") {
            "text" => text.push_str(str_at(block, "/text")),
            "tool_use" => match tool_use(block, output_tool)? {
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
    output_tool: bool,
    /// The block index of the forced output tool, whose input is streamed as text.
    output_block: Option<u64>,
}

impl StreamDecoder for Decoder {
    fn event(&mut self, event: &Event, answer: &mut ResponseAssembler) -> Result<Frame, WireError> {
        let data = event_json(&event.data)?;
        let kind = match str_at(&data, "/type") {
            "" => event.event.as_str(),
            kind => kind,
        };
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        let call_index = usize::try_from(index).unwrap_or(usize::MAX);
        match kind {
            "error" => {
                // Read as the error answer of that type would be.
                let status = match str_at(&data, "/error/type") {
                    "rate_limit_error" => 429,
                    "authentication_error" | "permission_error" => 401,
                    _ => 400,
                };
                return Err(WireError::in_stream(
                    status,
                    &data,
                    &event.data,
                    Anthropic::map_error,
                ));
            }
            "message_stop" => return Ok(Frame::Last),
            "message_start" => {
                *answer.usage() = Usage {
                    input_tokens: u64_at(&data, "/message/usage/input_tokens"),
                    output_tokens: u64_at(&data, "/message/usage/output_tokens"),
                };
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                if str_at(block, "/type") == "tool_use" {
                    let name = str_at(block, "/name");
                    if self.output_tool && name == OUTPUT_TOOL {
                        self.output_block = Some(index);
                    } else {
                        let id = block.get("id").and_then(Value::as_str).map(str::to_owned);
                        answer.tool_delta(call_index, id, Some(name.to_owned()), "");
                    }
                } else if let Some(text) = block.get("text").and_then(Value::as_str) {
                    answer.text(text);
                }
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                match str_at(delta, "/type") {
                    "text_delta" => answer.text(str_at(delta, "/text")),
                    "input_json_delta" if self.output_block == Some(index) => {
                        answer.text(str_at(delta, "/partial_json"));
                    }
                    "input_json_delta" => {
                        answer.tool_delta(call_index, None, None, str_at(delta, "/partial_json"));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(tokens) = data.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    answer.usage().output_tokens = tokens;
                }
                if let Some(tokens) = data.pointer("/usage/input_tokens").and_then(Value::as_u64) {
                    answer.usage().input_tokens = tokens;
                }
                if data
                    .pointer("/delta/stop_reason")
                    .is_some_and(|reason| !reason.is_null())
                {
                    return Ok(Frame::Whole);
                }
            }
            // ping, content_block_stop, and event types added later.
            _ => {}
        }
        Ok(Frame::More)
    }
}
