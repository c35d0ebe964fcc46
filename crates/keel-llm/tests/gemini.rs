//! The Gemini provider against a local server replaying generateContent and
//! streamGenerateContent (`alt=sse`) as documented.
#![cfg(feature = "gemini")]

mod support;

use keel_llm::providers::GeminiLlm;
use keel_llm::{Llm, LlmErrorKind, LlmMessage, LlmRequest};
use serde_json::{json, Value};
use support::*;

const KEY: &str = "AIza-test-secret";

fn llm(url: &str) -> GeminiLlm {
    let builder = GeminiLlm::builder("gemini-2.5-flash");
    scripted(builder, format!("{url}/v1beta"), KEY)
        .build()
        .unwrap()
}

/// A text answer.
fn says(text: &str) -> Value {
    answer(json!([{"text": text}]), Some("STOP"))
}

fn answer(parts: Value, finish: Option<&str>) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let Some(finish) = finish {
        candidate["finishReason"] = json!(finish);
    }
    json!({
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 7, "totalTokenCount": 18},
        "modelVersion": "gemini-2.5-flash"
    })
}

#[tokio::test]
async fn completion_sends_contents_system_instruction_tools_and_key_header() {
    let schema = json!({"type": "object", "properties": {"greeting": {"type": "string"}}});
    let request = brief_hi()
        .with_tools(vec![weather_tool()])
        .with_output_schema(schema.clone())
        .with_max_output_tokens(64);
    let (response, sent) = exchange(llm, says("Hello!"), request).await;
    assert_eq!(response.content.as_deref(), Some("Hello!"));
    assert_eq!(response.usage, usage(11, 7));

    assert_eq!(sent.uri, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(sent.header("x-goog-api-key"), KEY);
    assert!(!sent.uri.contains(KEY), "the key never travels in the URL");
    assert_eq!(
        sent.body["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
    assert_eq!(
        sent.body["contents"],
        json!([{"role": "user", "parts": [{"text": "Hi"}]}])
    );
    assert_eq!(
        sent.body["tools"],
        json!([{"functionDeclarations": [{"name": "get_weather", "description": "Current weather for a city", "parametersJsonSchema": weather_tool().parameters}]}])
    );
    assert_eq!(
        sent.body["generationConfig"],
        json!({"responseMimeType": "application/json", "responseJsonSchema": schema, "maxOutputTokens": 64})
    );
}

#[tokio::test]
async fn function_calls_round_trip_as_function_responses() {
    let server = serve(vec![
        Reply::ok(answer(
            json!([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]),
            Some("STOP"),
        )),
        Reply::ok(says("Sunny.")),
    ])
    .await;
    let llm = llm(&server.url);
    let mut messages = vec![LlmMessage::user("Paris?")];
    let first = ask_about_weather(&llm, messages.clone()).await;
    assert_eq!(first.tool_calls[0].name, "get_weather");
    assert_eq!(first.tool_calls[0].arguments, json!({"city": "Paris"}));
    messages.push(LlmMessage::assistant("", first.tool_calls.clone()));
    messages.push(LlmMessage::tool_result(
        &first.tool_calls[0],
        "{\"temp\": 22}",
    ));
    let second = llm.complete(LlmRequest::new(messages)).await.unwrap();
    assert_eq!(second.content.as_deref(), Some("Sunny."));
    let sent = &server.requests()[1].body["contents"];
    assert_eq!(
        sent[1],
        json!({"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]})
    );
    assert_eq!(
        sent[2],
        json!({"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 22}}}]})
    );
}

#[tokio::test]
async fn errors_are_typed_including_a_bad_key_answered_with_400() {
    let server = serve(vec![
        Reply::Json(
            400,
            vec![],
            json!({"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT",
                   "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]}}),
        ),
        Reply::Json(429, vec![("retry-after", "0".into())], json!({"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}})),
        Reply::ok(says("ok")),
        Reply::Json(
            400,
            vec![],
            json!({"error": {"code": 400, "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}),
        ),
    ])
    .await;
    let llm = llm(&server.url);
    assert_auth_retries_and_overflow(&llm, KEY).await;
}

#[tokio::test]
async fn a_blocked_prompt_is_a_bad_response() {
    let server = serve(vec![Reply::ok(
        json!({"promptFeedback": {"blockReason": "SAFETY"}}),
    )])
    .await;
    let err = call_fails(&llm(&server.url), LlmErrorKind::BadResponse).await;
    assert!(err.to_string().contains("SAFETY"));
}

fn sse_body() -> String {
    frames(&[
        (None, answer(json!([{"text": "The weather "}]), None)),
        (None, answer(json!([{"text": "is: "}]), None)),
        (
            None,
            answer(
                json!([{"functionCall": {"name": "get_weather", "args": {"city": "Zürich"}}}]),
                Some("STOP"),
            ),
        ),
    ])
}

#[tokio::test]
async fn stream_uses_alt_sse_and_reassembles_split_frames() {
    let body = sse_body();
    // Cut inside the multi-byte 'ü' and elsewhere: the decoder must wait for whole chars.
    let umlaut = body.find('ü').unwrap();
    let cuts = [body.len() / 4, umlaut + 1, body.len() - 3];
    let server = serve(vec![Reply::Chunks(split_at(&body, &cuts))]).await;
    let request = ask("Weather?").with_tools(vec![weather_tool()]);
    let (_, response) = stream_events(&llm(&server.url), request).await;
    assert_eq!(response.content.as_deref(), Some("The weather is: "));
    assert_eq!(response.tool_calls[0].arguments, json!({"city": "Zürich"}));
    assert_eq!(response.usage.output_tokens, 7);
    assert_eq!(
        server.requests()[0].uri,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
}

#[tokio::test]
async fn a_stream_cut_before_the_finish_reason_is_a_transport_error() {
    stream_cut_at(&sse_body(), |body| body.rfind("data:"), llm).await;
}

#[tokio::test]
async fn images_travel_as_inline_data_and_file_data_parts_before_the_text() {
    let linked = keel_core::FileContent {
        name: Some("dog".into()),
        media_type: Some("image/jpeg".into()),
        uri: Some("https://example.com/dog".into()),
        ..Default::default()
    };
    let request = ask_with("What are these?", [photo_bytes(), linked]);
    let body = body_sent(llm, says("Two pets."), request).await;
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [
            {"inlineData": {"mimeType": "image/png", "data": PNG_B64}},
            {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/dog"}},
            {"text": "What are these?"},
        ]}])
    );
}

#[tokio::test]
async fn an_image_a_tool_returned_follows_its_function_response() {
    let body = body_sent(llm, says("A cat."), tool_result_with_image()).await;
    assert_eq!(
        body["contents"][2],
        json!({"role": "user", "parts": [
            {"functionResponse": {"name": "snap", "response": {"result": "here:\n[file `report.pdf` (application/pdf, 8 bytes) attached; its contents are not shown to the model]"}}},
            {"inlineData": {"mimeType": "image/png", "data": PNG_B64}},
        ]})
    );
}
