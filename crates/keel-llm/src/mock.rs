//! [`MockLlm`]: a deterministic offline model.
//!
//! Unscripted, it answers sensibly with no network: a user message `/tool {json}` naming an
//! offered tool becomes a call of that tool; tool results are summarised; anything else is
//! echoed (`You said: ...`). Scripted, it plays back responses in order, so tests can drive
//! exact tool-call sequences, streamed chunks and failures of every [`LlmErrorKind`]. It can
//! also wait before answering (latency) and report fixed usage figures.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use keel_core::{AgentError, AgentResult};
use serde_json::Value;

use crate::stream::response_events;
use crate::{
    estimate_message_tokens, estimate_tokens, Llm, LlmError, LlmErrorKind, LlmRequest, LlmResponse,
    LlmRole, LlmStream, LlmStreamEvent, ModelProfile, ToolCall, Usage,
};

/// One scripted answer of a [`MockLlm`].
#[derive(Debug, Clone, PartialEq)]
pub enum MockResponse {
    /// Answer with text (streamed word by word).
    Text(String),
    /// Ask for these tool calls.
    ToolCalls(Vec<ToolCall>),
    /// Answer with this exact response.
    Response(LlmResponse),
    /// Answer with the text of these chunks, streamed as exactly these deltas.
    Chunks(Vec<String>),
    /// Fail with [`AgentError::Llm`] carrying this message.
    Error(String),
    /// Fail with an [`LlmError`] of this kind and message.
    Fail(LlmErrorKind, String),
}

/// A deterministic offline model; see the module docs for its unscripted behaviour.
///
/// ```
/// use keel_llm::{Llm, LlmMessage, LlmRequest, MockLlm, MockResponse, ToolCall};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_core::AgentError> {
/// let llm = MockLlm::scripted(vec![
///     MockResponse::ToolCalls(vec![ToolCall::new("add", serde_json::json!({"a": 1, "b": 2}))]),
///     MockResponse::Text("3".into()),
/// ]);
/// let first = llm.complete(LlmRequest::new(vec![LlmMessage::user("1+2?")])).await?;
/// assert_eq!(first.tool_calls[0].name, "add");
/// assert_eq!(llm.complete(LlmRequest::default()).await?.content.as_deref(), Some("3"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct MockLlm {
    script: Option<Mutex<VecDeque<MockResponse>>>,
    requests: Mutex<VecDeque<LlmRequest>>,
    latency: Option<Duration>,
    chunk_delay: Option<Duration>,
    usage: Option<Usage>,
    profile: Option<ModelProfile>,
    /// How many requests [`requests`](Self::requests) keeps; `None` is
    /// [`RECORDED_REQUESTS`](Self::RECORDED_REQUESTS).
    keep: Option<usize>,
}

/// A mock answer before it is returned or streamed: the response and its text deltas.
type Answer = (LlmResponse, Vec<String>);

impl MockLlm {
    /// How many of the latest requests [`requests`](Self::requests) keeps unless
    /// [`keep_requests`](Self::keep_requests) says otherwise.
    pub const RECORDED_REQUESTS: usize = 1_000;

    /// The unscripted offline model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep at most the latest `count` requests for [`requests`](Self::requests); `0` keeps
    /// none. A served offline model (the `mock` spec, the runtime's default model) keeps
    /// none: each request holds the whole context, so even a bounded number of them grows
    /// with a thread's history (a thousand requests of a long conversation are gigabytes),
    /// and the copy is work on every call.
    pub fn keep_requests(mut self, count: usize) -> Self {
        self.keep = Some(count);
        self
    }

    /// A model that plays back `responses` in order and fails once they run out.
    pub fn scripted(responses: Vec<MockResponse>) -> Self {
        Self {
            script: Some(Mutex::new(responses.into())),
            ..Self::default()
        }
    }

    /// Wait this long before answering (use tokio's paused time in tests).
    #[must_use]
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = Some(latency);
        self
    }

    /// Wait this long between streamed events.
    #[must_use]
    pub fn with_chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = Some(delay);
        self
    }

    /// Report these usage figures instead of estimating them (scripted
    /// [`MockResponse::Response`]s keep their own).
    #[must_use]
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Describe the model with this profile (the default is provider `mock`, model `mock`,
    /// no known context window).
    #[must_use]
    pub fn with_profile(mut self, profile: ModelProfile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// The requests received so far, oldest first: all of them, or the latest
    /// [`RECORDED_REQUESTS`](Self::RECORDED_REQUESTS) when there were more.
    pub fn requests(&self) -> Vec<LlmRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn unscripted(request: &LlmRequest) -> LlmResponse {
        let Some(last) = request.messages.last() else {
            return LlmResponse::text("Hello! Send me a message and I will answer.");
        };
        if last.role == LlmRole::Tool {
            let results: Vec<String> = request
                .messages
                .iter()
                .rev()
                .take_while(|m| m.role == LlmRole::Tool)
                .map(|m| {
                    format!(
                        "{}: {}",
                        m.tool_name.as_deref().unwrap_or("tool"),
                        m.content
                    )
                })
                .collect();
            let mut results = results;
            results.reverse();
            return LlmResponse::text(format!("Tool results:\n{}", results.join("\n")));
        }
        let text = last.content.trim();
        if let Some(call) = Self::tool_directive(text, request) {
            return LlmResponse {
                content: None,
                tool_calls: vec![call],
                usage: Usage::default(),
            };
        }
        LlmResponse::text(format!("You said: {text}"))
    }

    /// `/name {json}` or `/name free text` for an offered tool `name`.
    fn tool_directive(text: &str, request: &LlmRequest) -> Option<ToolCall> {
        let rest = text.strip_prefix('/')?;
        let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        request.tools.iter().find(|tool| tool.name == name)?;
        let args = args.trim();
        let arguments = if args.is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(args).unwrap_or_else(|_| serde_json::json!({ "input": args }))
        };
        Some(ToolCall::new(name, arguments))
    }

    /// Record the request and work out the answer (or the scripted failure).
    async fn answer(&self, request: LlmRequest) -> AgentResult<Answer> {
        let keep = self.keep.unwrap_or(Self::RECORDED_REQUESTS);
        if keep > 0 {
            let mut requests = self
                .requests
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            while requests.len() >= keep {
                requests.pop_front();
            }
            requests.push_back(request.clone());
        }
        if let Some(latency) = self.latency {
            tokio::time::sleep(latency).await;
        }
        let (mut response, chunks) = match &self.script {
            None => {
                let response = Self::unscripted(&request);
                let chunks = word_chunks(response.content.as_deref().unwrap_or_default());
                (response, chunks)
            }
            Some(script) => {
                let next = script
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .pop_front();
                match next {
                    Some(MockResponse::Text(text)) => {
                        let chunks = word_chunks(&text);
                        (LlmResponse::text(text), chunks)
                    }
                    Some(MockResponse::Chunks(chunks)) => {
                        (LlmResponse::text(chunks.concat()), chunks)
                    }
                    Some(MockResponse::ToolCalls(calls)) => (
                        LlmResponse {
                            content: None,
                            tool_calls: calls,
                            usage: Usage::default(),
                        },
                        Vec::new(),
                    ),
                    Some(MockResponse::Response(response)) => {
                        let chunks = word_chunks(response.content.as_deref().unwrap_or_default());
                        return Ok((response, chunks));
                    }
                    Some(MockResponse::Error(message)) => {
                        return Err(AgentError::llm("mock", message))
                    }
                    Some(MockResponse::Fail(kind, message)) => {
                        return Err(LlmError::new(kind, "mock", message).into())
                    }
                    None => {
                        return Err(AgentError::llm("mock", "the script has no more responses"))
                    }
                }
            }
        };
        response.usage = self.usage.unwrap_or_else(|| Usage {
            input_tokens: request.messages.iter().map(estimate_message_tokens).sum(),
            output_tokens: estimate_tokens(response.content.as_deref().unwrap_or_default()),
        });
        Ok((response, chunks))
    }
}

/// Split text into word-sized deltas that join back to it exactly (spaces go with the word
/// that follows them).
fn word_chunks(text: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut start = 0;
    for (index, ch) in text.char_indices() {
        if ch.is_whitespace() && index > start && !text[start..index].trim().is_empty() {
            chunks.push(text[start..index].to_owned());
            start = index;
        }
    }
    if start < text.len() {
        chunks.push(text[start..].to_owned());
    }
    chunks
}

/// The events that stream `response` with `chunks` as its text deltas: each tool call as two
/// argument fragments and then whole, usage, done.
fn streamed_events(response: LlmResponse, chunks: Vec<String>) -> Vec<LlmStreamEvent> {
    let mut events: Vec<LlmStreamEvent> = chunks
        .into_iter()
        .filter(|c| !c.is_empty())
        .map(|text| LlmStreamEvent::TextDelta { text })
        .collect();
    for (index, call) in response.tool_calls.iter().enumerate() {
        let arguments = call.arguments.to_string();
        let middle = arguments
            .char_indices()
            .map(|(i, _)| i)
            .nth(arguments.chars().count() / 2)
            .unwrap_or(0);
        events.push(LlmStreamEvent::ToolCallDelta {
            index,
            id: Some(call.id.clone()),
            name: Some(call.name.clone()),
            arguments_delta: arguments[..middle].to_owned(),
        });
        events.push(LlmStreamEvent::ToolCallDelta {
            index,
            id: None,
            name: None,
            arguments_delta: arguments[middle..].to_owned(),
        });
    }
    // The closing events (calls, usage, done) are the same as for any finished response.
    events.extend(
        response_events(response)
            .into_iter()
            .filter(|e| !matches!(e, LlmStreamEvent::TextDelta { .. })),
    );
    events
}

#[async_trait]
impl Llm for MockLlm {
    fn model_name(&self) -> &str {
        self.profile.as_ref().map_or("mock", |p| p.model.as_str())
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        self.answer(request).await.map(|(response, _)| response)
    }

    fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        let delay = self.chunk_delay;
        stream::once(self.answer(request))
            .flat_map(move |answer| {
                let events: Vec<AgentResult<LlmStreamEvent>> = match answer {
                    Ok((response, chunks)) => streamed_events(response, chunks)
                        .into_iter()
                        .map(Ok)
                        .collect(),
                    Err(error) => vec![Err(error)],
                };
                stream::iter(events).then(move |event| async move {
                    if let Some(delay) = delay {
                        tokio::time::sleep(delay).await;
                    }
                    event
                })
            })
            .boxed()
    }

    fn profile(&self) -> ModelProfile {
        self.profile
            .clone()
            .unwrap_or_else(|| ModelProfile::new("mock", "mock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LlmMessage, ToolSpec};
    use serde_json::json;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }
    }

    #[tokio::test]
    async fn unscripted_echoes_plain_text() {
        let r = MockLlm::new()
            .complete(LlmRequest::new(vec![LlmMessage::user("hi")]))
            .await
            .unwrap();
        assert_eq!(r.content.as_deref(), Some("You said: hi"));
        assert!(r.usage.input_tokens > 0);
    }

    #[tokio::test]
    async fn unscripted_calls_an_offered_tool_by_directive() {
        let req = LlmRequest::new(vec![LlmMessage::user("/sleep {\"seconds\": 2}")])
            .with_tools(vec![tool("sleep")]);
        let r = MockLlm::new().complete(req).await.unwrap();
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].arguments, json!({"seconds": 2}));
    }

    #[tokio::test]
    async fn directive_for_a_tool_not_offered_is_echoed() {
        let req = LlmRequest::new(vec![LlmMessage::user("/rm -rf")]);
        let r = MockLlm::new().complete(req).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("You said: /rm -rf"));
    }

    #[tokio::test]
    async fn unscripted_summarises_tool_results() {
        let call = ToolCall::new("clock", json!({}));
        let req = LlmRequest::new(vec![
            LlmMessage::user("/clock"),
            LlmMessage::assistant("", vec![call.clone()]),
            LlmMessage::tool_result(&call, "12:00"),
        ]);
        let r = MockLlm::new().complete(req).await.unwrap();
        assert_eq!(r.content.as_deref(), Some("Tool results:\nclock: 12:00"));
    }

    #[tokio::test]
    async fn a_model_told_to_keep_no_requests_records_none() {
        let llm = MockLlm::new().keep_requests(0);
        llm.complete(LlmRequest::new(vec![LlmMessage::user("hi")]))
            .await
            .unwrap();
        assert!(llm.requests().is_empty());
        let llm = MockLlm::new().keep_requests(1);
        for text in ["one", "two"] {
            llm.complete(LlmRequest::new(vec![LlmMessage::user(text)]))
                .await
                .unwrap();
        }
        assert_eq!(llm.requests().len(), 1);
    }

    #[tokio::test]
    async fn only_the_latest_requests_are_kept() {
        let llm = MockLlm::new();
        let extra = 5;
        for n in 0..MockLlm::RECORDED_REQUESTS + extra {
            let request = LlmRequest::new(vec![LlmMessage::user(format!("m{n}"))]);
            llm.complete(request).await.unwrap();
        }
        let kept = llm.requests();
        assert_eq!(kept.len(), MockLlm::RECORDED_REQUESTS);
        assert_eq!(kept[0].messages[0].content, format!("m{extra}"));
    }

    #[tokio::test]
    async fn exhausted_script_is_an_llm_error() {
        let llm = MockLlm::scripted(vec![MockResponse::Error("rate limited".into())]);
        let err = llm.complete(LlmRequest::default()).await.unwrap_err();
        assert!(matches!(err, AgentError::Llm { ref message, .. } if message == "rate limited"));
        let err = llm.complete(LlmRequest::default()).await.unwrap_err();
        assert!(err.to_string().contains("no more responses"));
        assert_eq!(llm.requests().len(), 2);
    }

    #[tokio::test]
    async fn scripted_text_streams_as_several_deltas() {
        let llm = MockLlm::scripted(vec![
            MockResponse::Text("the quick brown fox".into()),
            MockResponse::Chunks(vec!["ab".into(), "cd".into()]),
        ]);
        let events: Vec<LlmStreamEvent> = llm
            .stream(LlmRequest::default())
            .map(Result::unwrap)
            .collect()
            .await;
        let deltas: Vec<&str> = events
            .iter()
            .filter_map(LlmStreamEvent::text_delta)
            .collect();
        assert_eq!(deltas, ["the", " quick", " brown", " fox"]);
        assert!(
            matches!(events.last(), Some(LlmStreamEvent::Done { response })
            if response.content.as_deref() == Some("the quick brown fox"))
        );
        let response = crate::collect_stream(llm.stream(LlmRequest::default()))
            .await
            .unwrap();
        assert_eq!(response.content.as_deref(), Some("abcd"));
    }

    #[tokio::test]
    async fn streamed_tool_calls_arrive_as_fragments_then_whole() {
        let call = ToolCall::new("add", json!({"a": 1, "b": 2}));
        let llm = MockLlm::scripted(vec![MockResponse::ToolCalls(vec![call.clone()])]);
        let events: Vec<LlmStreamEvent> = llm
            .stream(LlmRequest::default())
            .map(Result::unwrap)
            .collect()
            .await;
        let fragments: String = events
            .iter()
            .filter_map(LlmStreamEvent::arguments_delta)
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&fragments).unwrap(),
            call.arguments
        );
        assert!(events.contains(&LlmStreamEvent::ToolCall { call }));
    }

    #[tokio::test]
    async fn failures_of_every_kind_are_typed() {
        for kind in [
            LlmErrorKind::Auth,
            LlmErrorKind::RateLimit,
            LlmErrorKind::ContextOverflow,
            LlmErrorKind::BadResponse,
            LlmErrorKind::Transport,
            LlmErrorKind::Timeout,
        ] {
            let llm = MockLlm::scripted(vec![
                MockResponse::Fail(kind, "scripted".into()),
                MockResponse::Fail(kind, "scripted".into()),
            ]);
            let err = llm.complete(LlmRequest::default()).await.unwrap_err();
            assert_eq!(LlmErrorKind::of(&err), Some(kind));
            let err = crate::collect_stream(llm.stream(LlmRequest::default()))
                .await
                .unwrap_err();
            assert_eq!(LlmErrorKind::of(&err), Some(kind));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn latency_and_usage_are_configurable() {
        let usage = Usage {
            input_tokens: 100,
            output_tokens: 7,
        };
        let llm = MockLlm::new()
            .with_latency(Duration::from_secs(30))
            .with_usage(usage);
        let started = tokio::time::Instant::now();
        let response = llm
            .complete(LlmRequest::new(vec![LlmMessage::user("hi")]))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_secs(30));
        assert_eq!(response.usage, usage);
    }

    #[test]
    fn word_chunks_join_back_exactly() {
        for text in ["", "one", "  lead", "a  b c ", "héllo wörld"] {
            assert_eq!(word_chunks(text).concat(), text);
        }
    }
}
