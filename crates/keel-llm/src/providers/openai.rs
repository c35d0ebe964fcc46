//! [`OpenAiLlm`]: an OpenAI-compatible chat completions client (OpenAI, Ollama, vLLM,
//! llama.cpp, Groq, OpenRouter), with tools, JSON-schema output, usage and SSE streaming.

use eventsource_stream::Event;
use keel_core::AgentResult;
use serde_json::{json, Map, Value};

use super::assembler::{parse_arguments, tool_call, ResponseAssembler};
use super::attachments::{text_with_attachments, user_parts, Attachment};
use super::builder::ProviderBuilder;
use super::http::{array_at, join_url, str_at, u64_at};
use super::wire::{
    event_json, provider_model, tool_declaration, Endpoint, Frame, KeyHeader, Provider,
    StreamDecoder, Wire, WireError,
};
use crate::{LlmErrorKind, LlmMessage, LlmRequest, LlmResponse, LlmRole, Usage};

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
        let endpoint = Endpoint {
            provider,
            url: join_url(&self.base_url, "chat/completions"),
            stream_url: None,
            api_key,
        };
        let wire = OpenAi {
            model: self.model.clone(),
            // Only OpenAI itself insists on the newer field; compatible servers know
            // `max_tokens`.
            max_tokens_field: if self.base_url.trim_end_matches('/') == OPENAI_BASE_URL {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
        };
        Ok(OpenAiLlm(Provider::new(&self, endpoint, wire)?))
    }
}

provider_model! {
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
    OpenAiLlm(OpenAi)
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

/// The chat completions wire format.
#[derive(Debug)]
struct OpenAi {
    model: String,
    max_tokens_field: &'static str,
}

impl Wire for OpenAi {
    type Decoder = Decoder;

    const KEY_HEADER: KeyHeader = KeyHeader::Bearer;

    fn encode_request(&self, request: &LlmRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert(
            "messages".into(),
            Value::Array(request.messages.iter().map(wire_message).collect()),
        );
        if !request.tools.is_empty() {
            let declare = |tool| json!({"type": "function", "function": tool_declaration(tool, "parameters")});
            let tools: Vec<Value> = request.tools.iter().map(declare).collect();
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

    fn decode_response(&self, _: &LlmRequest, body: &Value) -> Result<LlmResponse, WireError> {
        parse_completion(body)
    }

    fn stream_decoder(&self, _: &LlmRequest) -> Decoder {
        Decoder
    }

    /// Context overflow as OpenAI and the common compatible servers report it.
    fn map_error(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind> {
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
/// each file (as an `image_url` part or as text) and then the text.
fn user_content(message: &LlmMessage) -> Value {
    if message.attachments.is_empty() {
        return json!(message.content);
    }
    Value::Array(user_parts(
        message,
        IMAGE_FORMATS,
        |attachment| match attachment {
            Attachment::InlineImage { media_type, data } => json!({
                "type": "image_url",
                "image_url": {"url": format!("data:{media_type};base64,{data}")},
            }),
            Attachment::ImageUrl { url, .. } => {
                json!({"type": "image_url", "image_url": {"url": url}})
            }
            Attachment::Text(text) => json!({"type": "text", "text": text}),
        },
    ))
}

fn bad_response(what: &str) -> WireError {
    WireError::bad_response(format!("the chat completion {what}"))
}

/// A chat completion body as an [`LlmResponse`].
fn parse_completion(body: &Value) -> Result<LlmResponse, WireError> {
    let message = body
        .pointer("/choices/0/message")
        .ok_or_else(|| bad_response("has no choices[0].message"))?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    let mut tool_calls = Vec::new();
    for call in array_at(message, "/tool_calls") {
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_response("has a tool call without a function name"))?;
        let arguments = parse_arguments(str_at(call, "/function/arguments"));
        tool_calls.push(tool_call(name, arguments, str_at(call, "/id")));
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
struct Decoder;

impl StreamDecoder for Decoder {
    fn event(&mut self, event: &Event, answer: &mut ResponseAssembler) -> Result<Frame, WireError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(Frame::Last);
        }
        let chunk = event_json(data)?;
        if chunk.get("error").is_some() {
            return Err(WireError::in_stream(400, &chunk, data, OpenAi::map_error));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            *answer.usage() = Usage {
                input_tokens: u64_at(usage, "/prompt_tokens"),
                output_tokens: u64_at(usage, "/completion_tokens"),
            };
        }
        // Some compatible servers omit `[DONE]`; an answer with its finish reason is whole.
        let mut frame = Frame::More;
        for choice in array_at(&chunk, "/choices") {
            if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str) {
                answer.text(text);
            }
            for call in array_at(choice, "/delta/tool_calls") {
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
                answer.tool_delta(
                    index,
                    text("/id"),
                    text("/function/name"),
                    str_at(call, "/function/arguments"),
                );
            }
            if choice
                .get("finish_reason")
                .is_some_and(|reason| !reason.is_null())
            {
                frame = Frame::Whole;
            }
        }
        Ok(frame)
    }
}
