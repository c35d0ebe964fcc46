//! The one request/response skeleton every provider runs. A provider implements [`Wire`]:
//! where its calls go and which headers carry its key, its request body, its answer, its
//! stream events and its error codes. [`Provider`] is the one model implementation that
//! drives any `Wire` over the shared HTTP layer (timeouts, retries, status mapping, SSE); its
//! stream reader owns what every stream shares: assembling text, tool calls and usage, and
//! telling a whole answer from one cut short.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use eventsource_stream::Event;
use futures::stream::{self, BoxStream, StreamExt};
use keel_core::AgentResult;
use serde_json::Value;
use tracing::Instrument;

use super::assembler::ResponseAssembler;
use super::attachments::text_with_attachments;
use super::builder::ProviderBuilder;
use super::http::{error_detail, error_kind, ApiKey, CallSite, HttpClient, MapError};
use crate::{
    LlmError, LlmErrorKind, LlmMessage, LlmRequest, LlmResponse, LlmRole, LlmStream,
    LlmStreamEvent, ModelProfile,
};

/// One provider's wire format: everything that differs between providers, and nothing else.
pub(crate) trait Wire: fmt::Debug + Send + Sync + 'static {
    /// Reads one streamed answer.
    type Decoder: StreamDecoder;

    /// The provider's name in errors, spans and the model profile.
    fn provider(&self) -> &'static str;

    /// Where a call goes; `stream` picks the streaming endpoint where the API has one.
    fn url(&self, stream: bool) -> &str;

    /// Add the provider's headers: the key (never in the URL, which may be logged) and any
    /// API version.
    fn headers(
        &self,
        request: reqwest::RequestBuilder,
        key: Option<&ApiKey>,
    ) -> reqwest::RequestBuilder;

    /// The request body; `stream` asks for server-sent events.
    fn encode_request(&self, request: &LlmRequest, stream: bool) -> Value;

    /// A whole answer to `request`.
    fn decode_response(&self, request: &LlmRequest, body: &Value)
        -> Result<LlmResponse, WireError>;

    /// A reader for one streamed answer to `request`.
    fn stream_decoder(&self, request: &LlmRequest) -> Self::Decoder;

    /// The provider's reading of an error answer, before the status decides.
    fn map_error(status: u16, json: &Value, detail: &str) -> Option<LlmErrorKind>;
}

/// How one streamed event moved the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame {
    /// More may follow.
    More,
    /// The answer is whole (its finish reason came); a body ending after this is complete,
    /// since some servers never send their final event.
    Whole,
    /// The provider's final event: the answer ends here.
    Last,
}

/// A provider's reading of its server-sent events.
pub(crate) trait StreamDecoder: Send + 'static {
    /// Read one event into `answer`.
    fn event(&mut self, event: &Event, answer: &mut ResponseAssembler) -> Result<Frame, WireError>;
}

/// What a wire mapping reports: an answer it cannot read, or an error the provider sent inside
/// a successful answer. [`Provider`] names the model and removes the key on the way out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireError {
    kind: LlmErrorKind,
    message: String,
}

impl WireError {
    pub(crate) fn new(kind: LlmErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// An answer that does not have the shape the API documents.
    pub(crate) fn bad_response(message: impl Into<String>) -> Self {
        Self::new(LlmErrorKind::BadResponse, message)
    }

    /// An error the provider reported mid-stream as `data`, read the way an error answer
    /// with HTTP `status` is.
    pub(crate) fn in_stream(status: u16, data: &Value, raw: &str, map_error: MapError) -> Self {
        let detail = error_detail(data, raw);
        let kind = error_kind(map_error, status, data, &detail);
        Self::new(kind, format!("stream error: {detail}"))
    }

    /// This failure of a call to `site`'s model, with its key removed.
    fn at(self, site: &CallSite<'_>) -> LlmError {
        site.error(self.kind, self.message)
    }
}

/// An event's data as JSON.
pub(crate) fn event_json(data: &str) -> Result<Value, WireError> {
    serde_json::from_str(data).map_err(|e| {
        WireError::bad_response(format!("the stream sent an event that is not JSON: {e}"))
    })
}

/// One model behind a provider's [`Wire`]: the settings a builder checked, and the calls.
#[derive(Debug)]
pub(crate) struct Provider<W> {
    wire: W,
    model: String,
    api_key: Option<ApiKey>,
    http: HttpClient,
    profile: ModelProfile,
}

impl<W: Wire> Provider<W> {
    /// A model with `builder`'s settings speaking `wire`.
    pub(crate) fn new<L>(
        builder: &ProviderBuilder<L>,
        wire: W,
        api_key: Option<ApiKey>,
    ) -> Result<Arc<Self>, LlmError> {
        Ok(Arc::new(Self {
            model: builder.model.clone(),
            profile: builder.profile(wire.provider()),
            http: builder.http()?,
            api_key,
            wire,
        }))
    }

    pub(crate) fn model_name(&self) -> &str {
        &self.model
    }

    pub(crate) fn profile(&self) -> ModelProfile {
        self.profile.clone()
    }

    fn site(&self) -> CallSite<'_> {
        CallSite {
            provider: self.wire.provider(),
            model: &self.model,
            key: self.api_key.as_ref(),
            map_error: W::map_error,
        }
    }

    fn post(&self, body: &Value, stream: bool) -> reqwest::RequestBuilder {
        let request = self.http.post(self.wire.url(stream));
        self.wire.headers(request, self.api_key.as_ref()).json(body)
    }

    pub(crate) async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let span = tracing::info_span!(
            "llm.complete",
            provider = self.wire.provider(),
            model = %self.model
        );
        async {
            let site = self.site();
            let body = self.wire.encode_request(&request, false);
            let answer = self
                .http
                .send(&site, || self.post(&body, false), true)
                .await?
                .json(&site)
                .await?;
            let response = self.wire.decode_response(&request, &answer);
            Ok(response.map_err(|e| e.at(&site))?)
        }
        .instrument(span)
        .await
    }

    /// Stream an answer; failing to open the call is the stream's only item.
    pub(crate) fn stream(&self, request: LlmRequest) -> LlmStream<'_> {
        let span = tracing::info_span!(
            "llm.stream",
            provider = self.wire.provider(),
            model = %self.model
        );
        let opening = async move {
            let site = self.site();
            let body = self.wire.encode_request(&request, true);
            let opened = self
                .http
                .send(&site, || self.post(&body, true), false)
                .await?;
            let events = opened.events(&site).boxed();
            let decoder = self.wire.stream_decoder(&request);
            Ok::<_, LlmError>(read_stream(site, events, decoder, tracing::Span::current()))
        };
        stream::once(opening.instrument(span))
            .flat_map(|opened| match opened {
                Ok(events) => events,
                Err(error) => stream::once(async move { Err(error.into()) }).boxed(),
            })
            .boxed()
    }
}

/// A stream being read: its events, the provider's decoder, and the answer so far (`None`
/// once the stream ended).
struct Reading<'a, D> {
    site: CallSite<'a>,
    events: BoxStream<'static, Result<Event, LlmError>>,
    decoder: D,
    answer: Option<ResponseAssembler>,
    /// The answer's finish reason came: a body that ends now is complete.
    whole: bool,
    queue: VecDeque<AgentResult<LlmStreamEvent>>,
    span: tracing::Span,
}

impl<D: StreamDecoder> Reading<'_, D> {
    /// Read the next event into the queue; the answer closes on the final event, or when
    /// the body ends after a finish reason.
    async fn advance(&mut self) {
        let Some(answer) = self.answer.as_mut() else {
            return;
        };
        let frame = match self.events.next().await {
            None if self.whole => Ok(Frame::Last),
            None => Err(self.site.error(
                LlmErrorKind::Transport,
                "the stream ended before the final event (connection dropped?)",
            )),
            Some(Err(error)) => Err(error),
            Some(Ok(event)) => self
                .decoder
                .event(&event, answer)
                .map_err(|e| e.at(&self.site)),
        };
        // What the event added goes out even when the event then failed.
        self.queue.extend(answer.take_events().into_iter().map(Ok));
        match frame {
            Ok(Frame::More) => {}
            Ok(Frame::Whole) => self.whole = true,
            Ok(Frame::Last) => {
                let closing = self
                    .answer
                    .take()
                    .map_or(Ok(Vec::new()), ResponseAssembler::finish);
                match closing {
                    Ok(events) => self.queue.extend(events.into_iter().map(Ok)),
                    Err(error) => self.fail(error.at(&self.site)),
                }
            }
            Err(error) => self.fail(error),
        }
    }

    /// End the stream with `error`.
    fn fail(&mut self, error: LlmError) {
        tracing::warn!(error = %error, "model stream failed");
        self.answer = None;
        self.queue.push_back(Err(error.into()));
    }
}

/// Turn a provider's events into an [`LlmStream`] through its decoder. The stream stops after
/// the final event or the first error, and never hangs on a body that ended early.
fn read_stream<'a, D: StreamDecoder>(
    site: CallSite<'a>,
    events: BoxStream<'static, Result<Event, LlmError>>,
    decoder: D,
    span: tracing::Span,
) -> LlmStream<'a> {
    let reading = Reading {
        site,
        events,
        decoder,
        answer: Some(ResponseAssembler::default()),
        whole: false,
        queue: VecDeque::new(),
        span,
    };
    stream::unfold(reading, |mut reading| async move {
        let span = reading.span.clone();
        async move {
            loop {
                if let Some(item) = reading.queue.pop_front() {
                    return Some((item, reading));
                }
                // Nothing queued and the answer closed: the stream is over.
                reading.answer.as_ref()?;
                reading.advance().await;
            }
        }
        .instrument(span)
        .await
    })
    .boxed()
}

/// Declares a provider's public model type: a cheap-to-clone handle on a [`Provider`] of
/// `$wire`, whose [`Llm`](crate::Llm) implementation passes every call to it.
macro_rules! provider_model {
    ($(#[$attr:meta])* $name:ident($wire:ty)) => {
        $(#[$attr])*
        #[derive(Debug, Clone)]
        pub struct $name(std::sync::Arc<super::wire::Provider<$wire>>);

        #[async_trait::async_trait]
        impl crate::Llm for $name {
            fn model_name(&self) -> &str {
                self.0.model_name()
            }

            async fn complete(
                &self,
                request: crate::LlmRequest,
            ) -> keel_core::AgentResult<crate::LlmResponse> {
                self.0.complete(request).await
            }

            fn stream(&self, request: crate::LlmRequest) -> crate::LlmStream<'_> {
                self.0.stream(request)
            }

            fn profile(&self) -> crate::ModelProfile {
                self.0.profile()
            }
        }
    };
}
pub(crate) use provider_model;

/// The system messages' texts, in order, for APIs that take instructions apart from the
/// turns (a compaction summary or a late note joins them where it stands).
#[cfg_attr(not(any(feature = "anthropic", feature = "gemini")), allow(dead_code))]
pub(crate) fn system_texts(messages: &[LlmMessage]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.role == LlmRole::System)
        .map(text_with_attachments)
        .filter(|text| !text.is_empty())
        .collect()
}

/// Turns for APIs whose roles alternate: empty turns dropped, and consecutive turns of one
/// role merged (all of a step's tool results travel in the one user turn after it).
#[cfg_attr(not(any(feature = "anthropic", feature = "gemini")), allow(dead_code))]
pub(crate) fn merge_turns(
    turns: impl IntoIterator<Item = (&'static str, Vec<Value>)>,
) -> Vec<(&'static str, Vec<Value>)> {
    let mut merged: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (role, blocks) in turns {
        if blocks.is_empty() {
            continue;
        }
        match merged.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => merged.push((role, blocks)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn consecutive_turns_of_one_role_merge_and_empty_ones_drop() {
        let turns = merge_turns([
            ("user", vec![json!(1)]),
            ("assistant", vec![]),
            ("user", vec![json!(2)]),
            ("assistant", vec![json!(3)]),
        ]);
        assert_eq!(
            turns,
            vec![
                ("user", vec![json!(1), json!(2)]),
                ("assistant", vec![json!(3)])
            ]
        );
    }

    #[test]
    fn an_error_in_the_stream_is_read_like_an_error_answer() {
        let data = json!({"error": {"message": "slow down"}});
        let error = WireError::in_stream(429, &data, "", |_, _, _| None);
        assert_eq!(error.kind, LlmErrorKind::RateLimit);
        assert_eq!(error.message, "stream error: slow down");
        let overflow = WireError::in_stream(429, &data, "", |_, _, _| {
            Some(LlmErrorKind::ContextOverflow)
        });
        assert_eq!(overflow.kind, LlmErrorKind::ContextOverflow);
    }
}
