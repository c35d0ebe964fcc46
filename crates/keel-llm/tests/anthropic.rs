//! The Anthropic provider against a local server replaying the Messages API's documented
//! request, response and streaming formats.
#![cfg(feature = "anthropic")]

mod support;

use keel_llm::providers::AnthropicLlm;
use keel_llm::{Llm, LlmErrorKind, LlmMessage, LlmStreamEvent};
use serde_json::{json, Value};
use support::*;

const KEY: &str = "sk-ant-test-secret";

fn llm(url: &str) -> AnthropicLlm {
    let builder = AnthropicLlm::builder("claude-sonnet-4-5");
    scripted(builder, url.to_owned(), KEY).build().unwrap()
}

/// A text answer.
fn says(text: &str) -> Value {
    message(json!([{"type": "text", "text": text}]), "end_turn")
}

fn message(content: Value, stop: &str) -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": 25, "output_tokens": 12}
    })
}

#[tokio::test]
async fn completion_sends_system_messages_tools_and_key_headers_and_reads_usage() {
    let request = brief_hi().with_tools(vec![weather_tool()]);
    let (response, sent) = exchange(llm, says("Hello!"), request).await;
    assert_eq!(response.content.as_deref(), Some("Hello!"));
    assert_eq!(response.usage, usage(25, 12));

    assert_eq!(sent.uri, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), KEY);
    assert_eq!(sent.header("anthropic-version"), "2023-06-01");
    assert_eq!(sent.body["model"], "claude-sonnet-4-5");
    assert_eq!(sent.body["system"], "Be brief.");
    assert_eq!(sent.body["max_tokens"], 32_000, "from the model profile");
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    );
    assert_eq!(
        sent.body["tools"],
        json!([{"name": "get_weather", "description": "Current weather for a city", "input_schema": weather_tool().parameters}])
    );
}

#[tokio::test]
async fn tool_use_round_trips_and_results_share_one_user_turn() {
    let server = serve(vec![
        Reply::ok(message(
            json!([
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}
            ]),
            "tool_use",
        )),
        Reply::ok(says("Both sunny.")),
    ])
    .await;
    let llm = llm(&server.url);
    let mut messages = vec![LlmMessage::user("Paris and Rome?")];
    let first = ask_about_weather(&llm, messages.clone()).await;
    assert_eq!(first.content.as_deref(), Some("Checking both."));
    assert_eq!(first.tool_calls.len(), 2);
    assert_eq!(first.tool_calls[0].id, "toolu_1");
    assert_eq!(first.tool_calls[1].arguments, json!({"city": "Rome"}));

    messages.push(LlmMessage::assistant(
        "Checking both.",
        first.tool_calls.clone(),
    ));
    messages.push(LlmMessage::tool_result(&first.tool_calls[0], "20C"));
    messages.push(LlmMessage::tool_result(&first.tool_calls[1], "25C"));
    ask_about_weather(&llm, messages).await;
    let sent = &server.requests()[1].body["messages"];
    assert_eq!(
        sent[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}
        ]})
    );
    assert_eq!(
        sent[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "20C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "25C"}
        ]})
    );
    assert_eq!(sent.as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn output_schema_is_answered_through_a_forced_tool() {
    let answer = json!([{"type": "tool_use", "id": "toolu_9", "name": "structured_output", "input": {"city": "Paris"}}]);
    let server = serve(vec![Reply::ok(message(answer, "tool_use"))]).await;
    let schema = city_schema();
    let response = llm(&server.url)
        .complete(ask("Where?").with_output_schema(schema.clone()))
        .await
        .unwrap();
    assert!(response.tool_calls.is_empty());
    let answer: Value = serde_json::from_str(response.content.as_deref().unwrap()).unwrap();
    assert_eq!(answer, json!({"city": "Paris"}));
    let sent = &server.requests()[0].body;
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "tool", "name": "structured_output"})
    );
    assert_eq!(sent["tools"][0]["input_schema"], schema);
}

#[tokio::test]
async fn errors_are_typed_auth_rate_limit_and_context_overflow() {
    let server = serve(vec![
        Reply::Json(401, vec![], json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})),
        Reply::Json(
            429,
            vec![("retry-after", "0".into())],
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}),
        ),
        Reply::Json(529, vec![], json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        Reply::ok(says("ok")),
        Reply::Json(
            400,
            vec![],
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"}}),
        ),
    ])
    .await;
    let llm = llm(&server.url);
    // 429 with Retry-After 0, then 529 overloaded with backoff, then success.
    assert_auth_retries_and_overflow(&llm, KEY).await;
    assert_eq!(server.requests().len(), 5);
}

fn sse_body() -> String {
    typed_frames(&[
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null, "usage": {"input_tokens": 472, "output_tokens": 2}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Okay, let me "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"San"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": " Francisco\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 89}}),
        json!({"type": "message_stop"}),
    ])
}

/// Anthropic's stream: each event named by its payload's `type`, as the API sends it.
fn typed_frames(events: &[Value]) -> String {
    let named: Vec<(Option<&str>, Value)> = events
        .iter()
        .map(|event| (event["type"].as_str(), event.clone()))
        .collect();
    frames(&named)
}

#[tokio::test]
async fn stream_reassembles_split_frames_and_tool_input_deltas() {
    let body = sse_body();
    let cuts: Vec<usize> = (1..12).map(|i| i * body.len() / 12).collect();
    let server = serve(vec![Reply::Chunks(split_at(&body, &cuts))]).await;
    let request = ask("Weather?").with_tools(vec![weather_tool()]);
    let (events, response) = stream_events(&llm(&server.url), request).await;
    assert_eq!(response.content.as_deref(), Some("Okay, let me check."));
    assert_eq!(response.tool_calls[0].id, "toolu_01");
    assert_eq!(
        response.tool_calls[0].arguments,
        json!({"city": "San Francisco"})
    );
    assert_eq!(response.usage, usage(472, 89));
    let deltas = events
        .iter()
        .filter(|e| matches!(e, LlmStreamEvent::ToolCallDelta { .. }))
        .count();
    assert_eq!(deltas, 4, "start plus three input_json_delta fragments");
    assert_eq!(server.requests()[0].body["stream"], true);
}

#[tokio::test]
async fn a_stream_cut_before_message_stop_is_a_transport_error() {
    stream_cut_at(&sse_body(), |body| body.find("event: message_delta"), llm).await;
}

#[tokio::test]
async fn a_mid_stream_error_event_is_typed() {
    let mut body = sse_body();
    let cut = body.find("event: content_block_start").unwrap();
    body.truncate(cut);
    body.push_str(&typed_frames(&[
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]));
    let server = serve(vec![Reply::Chunks(vec![body])]).await;
    let err = stream_fails(&llm(&server.url), LlmErrorKind::Api).await;
    assert!(err.to_string().contains("Overloaded"));
}

#[tokio::test]
async fn images_travel_as_base64_and_url_image_blocks_before_the_text() {
    let bitmap = file("scan.bmp", "image/bmp", "Qk0=");
    let request = ask_with("What are these?", [photo_bytes(), photo_url(), bitmap]);
    let body = body_sent(llm, says("Two pets."), request).await;
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/dog.jpg"}},
            {"type": "text", "text": "[image `scan.bmp` (image/bmp) attached; this model does not accept that format]"},
            {"type": "text", "text": "What are these?"},
        ]}])
    );
}

#[tokio::test]
async fn an_image_a_tool_returned_travels_in_its_tool_result() {
    let body = body_sent(llm, says("A cat."), tool_result_with_image()).await;
    assert_eq!(
        body["messages"][2],
        json!({"role": "user", "content": [{
            "type": "tool_result",
            "tool_use_id": "call_1",
            "content": [
                {"type": "text", "text": "here:\n[file `report.pdf` (application/pdf, 8 bytes) attached; its contents are not shown to the model]"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
            ],
        }]})
    );
}
