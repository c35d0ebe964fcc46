//! [`GeminiLlm`]: Google Gemini's `generateContent` and `streamGenerateContent?alt=sse`,
//! with function calling, JSON-schema output, usage and SSE streaming.

use eventsource_stream::Event;
use keel_core::AgentResult;
use serde_json::{json, Map, Value};

use super::assembler::{tool_call, ResponseAssembler};
use super::attachments::{tool_result_parts, Attachment};
use super::builder::ProviderBuilder;
use super::http::{array_at, join_url, str_at, u64_at};
use super::turns::{system_texts, turns, TurnFormat};
use super::wire::{
    event_json, provider_model, tool_declaration, Endpoint, Frame, KeyHeader, Provider,
    StreamDecoder, Wire, WireError,
};
use crate::{LlmErrorKind, LlmRequest, LlmResponse, ToolCall, Usage};

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
        // Accept `gemini-2.5-flash` and `models/gemini-2.5-flash` alike.
        let path = self.model.trim_start_matches("models/");
        let url = |method: &str| join_url(&self.base_url, &format!("models/{path}:{method}"));
        let endpoint = Endpoint {
            provider: "gemini",
            url: url("generateContent"),
            stream_url: Some(url("streamGenerateContent?alt=sse")),
            api_key: Some(api_key),
        };
        Ok(GeminiLlm(Provider::new(&self, endpoint, Gemini)?))
    }
}

provider_model! {
    /// A Google Gemini model.
    ///
    /// ```
    /// use keel_llm::{providers::GeminiLlm, Llm};
    /// let llm = GeminiLlm::builder("gemini-2.5-flash").with_api_key("AIza-secret").build()?;
    /// assert_eq!(llm.profile().provider, "gemini");
    /// assert!(!format!("{llm:?}").contains("secret"));
    /// # Ok::<(), keel_core::AgentError>(())
    /// ```
    GeminiLlm(Gemini)
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

/// The `generateContent` wire format.
#[derive(Debug)]
struct Gemini;

impl Wire for Gemini {
    type Decoder = Decoder;

    const KEY_HEADER: KeyHeader = KeyHeader::Named("x-goog-api-key");

    /// The model is named by the URL; `stream` is chosen by the URL too.
    fn encode_request(&self, request: &LlmRequest, _stream: bool) -> Value {
        let mut body = Map::new();
        let system: Vec<Value> = system_texts(&request.messages)
            .into_iter()
            .map(|text| json!({"text": text}))
            .collect();
        if !system.is_empty() {
            body.insert("systemInstruction".into(), json!({"parts": system}));
        }
        body.insert(
            "contents".into(),
            Value::Array(turns(&request.messages, &TURNS)),
        );
        if !request.tools.is_empty() {
            // `parametersJsonSchema` takes full JSON Schema, which Keel's specs are; the older
            // `parameters` accepts only an OpenAPI subset.
            let declare = |tool| tool_declaration(tool, "parametersJsonSchema");
            let declarations: Vec<Value> = request.tools.iter().map(declare).collect();
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

    fn decode_response(&self, _: &LlmRequest, body: &Value) -> Result<LlmResponse, WireError> {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for part in answer_parts(body)? {
            if let Some(t) = part.get("text").and_then(Value::as_str) {
                text.push_str(t);
            }
            if let Some(call) = part.get("functionCall") {
                tool_calls.push(function_call(call)?);
            }
        }
        Ok(LlmResponse {
            content: (!text.is_empty()).then_some(text),
            tool_calls,
            usage: usage(body).unwrap_or_default(),
        })
    }

    fn stream_decoder(&self, _: &LlmRequest) -> Decoder {
        Decoder
    }

    /// Gemini answers a bad key with 400 and a token overflow with 400 too; tell them apart.
    fn map_error(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind> {
        let lower = detail.to_ascii_lowercase();
        let reason_is = |reason: &str| {
            array_at(json, "/error/details")
                .iter()
                .any(|d| str_at(d, "/reason") == reason)
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
}

/// Gemini contents: the model's turns are `model`, tool results are `functionResponse` parts
/// in user turns.
const TURNS: TurnFormat = TurnFormat {
    model_role: "model",
    pieces: "parts",
    image_formats: IMAGE_FORMATS,
    part,
    tool_call: |call| json!({"functionCall": {"name": call.name, "args": call.arguments}}),
    tool_result: function_response,
};

/// A tool's result; `response` must be an object, so a plain result is wrapped. Images the
/// tool returned follow it as `inlineData` (or `fileData`) parts of the same turn, which
/// every Gemini model with vision reads (a `functionResponse` holding media parts itself is
/// for Gemini 3 models only).
fn function_response(message: &crate::LlmMessage) -> Vec<Value> {
    let (content, images) = tool_result_parts(message, IMAGE_FORMATS);
    let response = match serde_json::from_str::<Value>(&content) {
        Ok(Value::Object(object)) => Value::Object(object),
        _ => json!({"result": content}),
    };
    let name = message.tool_name.as_deref().unwrap_or_default();
    let call = json!({"functionResponse": {"name": name, "response": response}});
    std::iter::once(call)
        .chain(images.into_iter().map(part))
        .collect()
}

/// One part: `inlineData`, `fileData` or text.
fn part(attachment: Attachment<'_>) -> Value {
    match attachment {
        Attachment::InlineImage { media_type, data } => {
            json!({"inlineData": {"mimeType": media_type, "data": data}})
        }
        Attachment::ImageUrl { media_type, url } => {
            json!({"fileData": {"mimeType": media_type, "fileUri": url}})
        }
        Attachment::Text(text) => json!({"text": text}),
    }
}

fn bad_response(what: &str) -> WireError {
    WireError::bad_response(format!("the Gemini response {what}"))
}

/// One functionCall part as a [`ToolCall`].
fn function_call(call: &Value) -> Result<ToolCall, WireError> {
    let name = call
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_response("has a functionCall without a name"))?;
    let arguments = call.get("args").cloned().unwrap_or_else(|| json!({}));
    Ok(tool_call(name, arguments, str_at(call, "/id")))
}

/// The answer's parts of the first candidate, thoughts left out; an answer without
/// candidates says why (a blocked prompt) as a bad response.
fn answer_parts(body: &Value) -> Result<impl Iterator<Item = &Value>, WireError> {
    let Some(candidate) = body.pointer("/candidates/0") else {
        let reason = str_at(body, "/promptFeedback/blockReason");
        let what = if reason.is_empty() {
            "has no candidates".to_owned()
        } else {
            format!("has no candidates: the prompt was blocked ({reason})")
        };
        return Err(bad_response(&what));
    };
    Ok(array_at(candidate, "/content/parts")
        .iter()
        .filter(|part| part.get("thought").and_then(Value::as_bool) != Some(true)))
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

/// Decodes `streamGenerateContent?alt=sse` chunks. Gemini has no final event: the chunk with
/// a `finishReason` is the last, and the body then ends.
struct Decoder;

impl StreamDecoder for Decoder {
    fn event(&mut self, event: &Event, answer: &mut ResponseAssembler) -> Result<Frame, WireError> {
        let chunk = event_json(&event.data)?;
        if chunk.get("error").is_some() {
            let status = u16::try_from(u64_at(&chunk, "/error/code")).unwrap_or(400);
            return Err(WireError::in_stream(
                status,
                &chunk,
                &event.data,
                Gemini::map_error,
            ));
        }
        if let Some(usage) = usage(&chunk) {
            *answer.usage() = usage;
        }
        for part in answer_parts(&chunk)? {
            if let Some(text) = part.get("text").and_then(Value::as_str) {
                answer.text(text);
            }
            if let Some(call) = part.get("functionCall") {
                // Gemini sends each call whole, never in fragments.
                answer.whole_tool_call(function_call(call)?);
            }
        }
        let finished = chunk
            .pointer("/candidates/0/finishReason")
            .is_some_and(|reason| !reason.is_null());
        Ok(if finished { Frame::Whole } else { Frame::More })
    }
}
