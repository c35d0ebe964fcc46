//! The OpenAI-compatible provider against a local server replaying OpenAI's documented
//! request, response and streaming formats.
#![cfg(feature = "openai")]

mod support;

use futures::StreamExt;
use keel_llm::providers::OpenAiLlm;
use keel_llm::{collect_stream, Llm, LlmErrorKind, LlmMessage, LlmRequest, LlmStreamEvent};
use serde_json::{json, Value};
use support::*;

const KEY: &str = "sk-test-secret-key";

fn llm(url: &str) -> OpenAiLlm {
    let builder = OpenAiLlm::builder("gpt-4o-mini");
    scripted(builder, format!("{url}/v1"), KEY).build().unwrap()
}

/// A text answer.
fn says(text: &str) -> Value {
    completion(json!({"role": "assistant", "content": text}), "stop")
}

fn completion(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29}
    })
}

#[tokio::test]
async fn completion_sends_model_messages_tools_and_bearer_key_and_reads_usage() {
    let request = brief_hi()
        .with_tools(vec![weather_tool()])
        .with_max_output_tokens(100);
    let (response, sent) = exchange(llm, says("Hello there!"), request).await;
    assert_eq!(response.content.as_deref(), Some("Hello there!"));
    assert_eq!(response.usage, usage(19, 10));

    assert_eq!(sent.uri, "/v1/chat/completions");
    assert_eq!(sent.header("authorization"), format!("Bearer {KEY}"));
    assert_eq!(sent.body["model"], "gpt-4o-mini");
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    );
    assert_eq!(
        sent.body["tools"],
        json!([{"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": weather_tool().parameters,
        }}])
    );
    // A compatible server gets the classic field name.
    assert_eq!(sent.body["max_tokens"], 100);
    assert!(sent.body.get("stream").is_none());
}

#[tokio::test]
async fn tool_calls_round_trip_through_the_wire_format() {
    let server = serve(vec![
        Reply::ok(completion(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_abc",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}
            }]}),
            "tool_calls",
        )),
        Reply::ok(says("Sunny in Paris.")),
    ])
    .await;
    let llm = llm(&server.url);
    let mut messages = vec![LlmMessage::user("Weather in Paris?")];
    let first = ask_about_weather(&llm, messages.clone()).await;
    assert_eq!(first.content, None);
    assert_eq!(first.tool_calls.len(), 1);
    let call = &first.tool_calls[0];
    assert_eq!(
        (call.id.as_str(), call.name.as_str()),
        ("call_abc", "get_weather")
    );
    assert_eq!(call.arguments, json!({"city": "Paris"}));

    messages.push(LlmMessage::assistant("", first.tool_calls.clone()));
    messages.push(LlmMessage::tool_result(call, "22C, sunny"));
    let second = ask_about_weather(&llm, messages).await;
    assert_eq!(second.content.as_deref(), Some("Sunny in Paris."));

    let sent = &server.requests()[1].body["messages"];
    assert_eq!(
        sent[1],
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}
        }]})
    );
    assert_eq!(
        sent[2],
        json!({"role": "tool", "tool_call_id": "call_abc", "content": "22C, sunny"})
    );
}

#[tokio::test]
async fn output_schema_becomes_a_json_schema_response_format() {
    let server = serve(vec![Reply::ok(says("{\"city\":\"Paris\"}"))]).await;
    let schema = city_schema();
    let response = llm(&server.url)
        .complete(ask("Where?").with_output_schema(schema.clone()))
        .await
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("{\"city\":\"Paris\"}"));
    assert_eq!(
        server.requests()[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}})
    );
}

#[tokio::test]
async fn unauthorized_is_an_auth_error_without_the_key() {
    let server = serve(vec![Reply::Json(
        401,
        vec![],
        json!({"error": {"message": format!("Incorrect API key provided: {KEY}."), "type": "invalid_request_error", "code": "invalid_api_key"}}),
    )])
    .await;
    let err = call_fails(&llm(&server.url), LlmErrorKind::Auth).await;
    assert!(!err.to_string().contains(KEY), "{err}");
    assert_eq!(server.requests().len(), 1, "auth failures are not retried");
}

#[tokio::test]
async fn rate_limit_with_retry_after_is_retried_then_succeeds() {
    let server = serve(vec![
        Reply::Json(
            429,
            vec![("retry-after", "0".into())],
            json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}),
        ),
        Reply::Json(503, vec![], json!({"error": {"message": "overloaded"}})),
        Reply::ok(says("ok")),
    ])
    .await;
    let response = llm(&server.url).complete(ask("Hi")).await.unwrap();
    assert_eq!(response.content.as_deref(), Some("ok"));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn rate_limit_after_every_attempt_is_a_rate_limit_error() {
    let limited = || {
        Reply::Json(
            429,
            vec![("retry-after", "0".into())],
            json!({"error": {"message": "Rate limit reached"}}),
        )
    };
    let server = serve(vec![limited(), limited(), limited()]).await;
    let err = call_fails(&llm(&server.url), LlmErrorKind::RateLimit).await;
    assert!(err.to_string().contains("after 3 attempts"), "{err}");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn context_length_exceeded_is_a_context_overflow() {
    let server = serve(vec![Reply::Json(
        400,
        vec![],
        json!({"error": {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"
        }}),
    )])
    .await;
    call_fails(&llm(&server.url), LlmErrorKind::ContextOverflow).await;
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_connection_refused_is_a_transport_error_after_retries() {
    // Bind and drop a listener to get a port nobody listens on.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = call_fails(&llm(&url), LlmErrorKind::Transport).await;
    // The endpoint it tried is named, so a wrong base URL is seen at once.
    assert!(err.to_string().contains(&format!(" at {url}/")), "{err}");
}

fn chunk(delta: Value, finish: Option<&str>) -> (Option<&'static str>, Value) {
    (
        None,
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
    )
}

#[tokio::test]
async fn stream_reassembles_split_frames_text_and_tool_call_argument_deltas() {
    let mut body = frames(&[
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Let me "}), None),
        chunk(json!({"content": "check."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Par"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "is\"}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        (
            None,
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}}),
        ),
    ]);
    body.push_str("data: [DONE]\n\n");
    // Cut inside frames: mid-JSON, between "data" and ":", and in the blank line.
    let first_frame_end = body.find("\n\n").unwrap();
    let cuts = [
        first_frame_end + 1,
        body.len() / 3,
        body.len() / 2,
        body.find("ty\\\"").unwrap() + 2,
        body.len() - 9,
        body.len() - 1,
    ];
    let server = serve(vec![Reply::Chunks(split_at(&body, &cuts))]).await;
    let request = ask("Weather?").with_tools(vec![weather_tool()]);
    let (events, response) = stream_events(&llm(&server.url), request).await;

    let text: String = events
        .iter()
        .filter_map(LlmStreamEvent::text_delta)
        .collect();
    assert_eq!(text, "Let me check.");
    let fragments: Vec<&str> = events
        .iter()
        .filter_map(LlmStreamEvent::arguments_delta)
        .collect();
    assert_eq!(fragments, ["", "{\"ci", "ty\": \"Par", "is\"}"]);
    assert_eq!(response.tool_calls.len(), 1);
    assert_eq!(response.tool_calls[0].id, "call_1");
    assert_eq!(response.tool_calls[0].arguments, json!({"city": "Paris"}));
    assert_eq!(response.usage, usage(30, 12));
    assert!(events.contains(&LlmStreamEvent::ToolCall {
        call: response.tool_calls[0].clone()
    }));

    let sent = &server.requests()[0];
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn a_stream_that_ends_before_the_final_event_is_a_transport_error() {
    let body = frames(&[
        chunk(json!({"role": "assistant", "content": "Hel"}), None),
        chunk(json!({"content": "lo"}), None),
    ]);
    let server = serve(vec![Reply::Chunks(vec![body.clone()])]).await;
    stream_fails(&llm(&server.url), LlmErrorKind::Transport).await;

    // The same when the connection is cut mid-frame. (Should the cut come before any byte of
    // the body, the call is retried, so every attempt is cut the same way.)
    let cut = || {
        Reply::ChunksThenAbort(split_at(
            &body,
            &[body.find("\n\n").unwrap() + 2, body.len() - 10],
        ))
    };
    let server = serve(vec![cut(), cut(), cut()]).await;
    let model = llm(&server.url);
    let mut events = model.stream(ask("Hi"));
    let mut last = None;
    while let Some(event) = events.next().await {
        last = Some(event);
    }
    let err = last.expect("an error item").unwrap_err();
    assert_eq!(
        LlmErrorKind::of(&err),
        Some(LlmErrorKind::Transport),
        "{err}"
    );
}

#[tokio::test]
async fn stream_errors_before_the_body_are_retried_like_calls() {
    let done = {
        let mut body = frames(&[chunk(json!({"content": "ok"}), Some("stop"))]);
        body.push_str("data: [DONE]\n\n");
        body
    };
    let server = serve(vec![
        Reply::Json(
            429,
            vec![("retry-after", "0".into())],
            json!({"error": {"message": "slow down"}}),
        ),
        Reply::Chunks(vec![done]),
    ])
    .await;
    let response = collect_stream(llm(&server.url).stream(ask("Hi")))
        .await
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("ok"));
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn openai_needs_a_key_but_a_compatible_server_does_not() {
    // Built with an explicit empty key so the test does not depend on the environment.
    let err = OpenAiLlm::builder("gpt-4o")
        .with_api_key("")
        .with_base_url("http://127.0.0.1:9")
        .build();
    if std::env::var("OPENAI_API_KEY").is_err() {
        let err = err.unwrap_err();
        assert_eq!(LlmErrorKind::of(&err), Some(LlmErrorKind::Config));
    }
    let llm = OpenAiLlm::compatible("http://localhost:11434/v1", "llama3.2:3b")
        .with_api_key(KEY)
        .build()
        .unwrap();
    assert_eq!(llm.profile().provider, "openai-compatible");
    assert!(!format!("{llm:?}").contains(KEY));
}

#[test]
fn spec_builds_an_openai_compatible_model() {
    let llm =
        keel_llm::llm_from_spec("openai-compatible:http://localhost:11434/v1:llama3.2:3b").unwrap();
    assert_eq!(llm.model_name(), "llama3.2:3b");
    assert_eq!(llm.profile().provider, "openai-compatible");
}

#[tokio::test]
async fn images_travel_as_image_url_parts_and_other_files_as_text() {
    let notes = file("notes.txt", "text/plain", "aGVsbG8="); // "hello"
    let report = file("report.pdf", "application/pdf", "JVBERi0xLjc="); // "%PDF-1.7"
    let request = LlmRequest::new(vec![
        LlmMessage::user("What are these?")
            .with_attachment(photo_bytes())
            .with_attachment(photo_url())
            .with_attachment(notes)
            .with_attachment(report),
        LlmMessage::assistant("Two pets.", vec![]),
        LlmMessage::user("Thanks"),
    ]);
    let body = body_sent(llm, says("Two pets."), request).await;
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_B64}")}},
                {"type": "image_url", "image_url": {"url": "https://example.com/dog.jpg"}},
                {"type": "text", "text": "[file `notes.txt` (text/plain)]\nhello\n[end of file `notes.txt`]"},
                {"type": "text", "text": "[file `report.pdf` (application/pdf, 8 bytes) attached; its contents are not shown to the model]"},
                {"type": "text", "text": "What are these?"},
            ]},
            {"role": "assistant", "content": "Two pets."},
            {"role": "user", "content": "Thanks"},
        ])
    );
}

#[test]
fn a_compatible_server_reads_images_only_when_configured() {
    let plain = OpenAiLlm::compatible("http://localhost:11434/v1", "gpt-4o")
        .build()
        .unwrap();
    assert!(!plain.profile().supports_vision);
    let llava = OpenAiLlm::compatible("http://localhost:11434/v1", "llava")
        .with_vision(true)
        .build()
        .unwrap();
    assert!(llava.profile().supports_vision);
    let openai = OpenAiLlm::builder("gpt-4o")
        .with_api_key(KEY)
        .build()
        .unwrap();
    assert!(openai.profile().supports_vision);
}

#[tokio::test]
async fn an_image_a_tool_returned_is_named_in_its_text_only_tool_message() {
    let body = body_sent(llm, says("A cat."), tool_result_with_image()).await;
    assert_eq!(
        body["messages"][2],
        json!({
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "here:\n[image `cat.png` attached; not shown: this turn cannot carry images]\n[file `report.pdf` (application/pdf, 8 bytes) attached; its contents are not shown to the model]",
        })
    );
}
