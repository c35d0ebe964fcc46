//! The one request/response skeleton every provider runs. A provider implements [`Wire`]:
//! the header its key travels in, its request body, its answer, its stream events and its
//! error codes; its builder settles the [`Endpoint`]. [`Provider`] is the one model
//! implementation that drives any `Wire` over the shared HTTP layer (timeouts, retries,
//! status mapping, SSE); its stream reader owns what every stream shares: assembling text,
//! tool calls and usage, and telling a whole answer from one cut short.

use std::fmt;
use std::sync::Arc;

use eventsource_stream::Event;
use futures::stream::{self, StreamExt};
use keel_core::AgentResult;
use serde_json::{json, Value};
use tracing::Instrument;

use super::assembler::ResponseAssembler;
use super::builder::ProviderBuilder;
use super::http::{error_detail, error_kind, ApiKey, CallSite, HttpClient, MapError, SseEvents};
use crate::{
    LlmError, LlmErrorKind, LlmRequest, LlmResponse, LlmStream, LlmStreamEvent, ModelProfile,
    ToolSpec,
};

/// One provider's wire format: everything that differs between providers, and nothing else.
pub(crate) trait Wire: fmt::Debug + Send + Sync + 'static {
    /// Reads one streamed answer.
    type Decoder: StreamDecoder;

    /// The header the key travels in (never the URL, which may be logged).
    const KEY_HEADER: KeyHeader;

    /// Headers every call carries, such as an API version.
    const HEADERS: &'static [(&'static str, &'static str)] = &[];

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

/// The header an API key travels in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyHeader {
    /// `Authorization: Bearer KEY`.
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    Bearer,
    /// A header of this name holding the key.
    #[cfg_attr(not(any(feature = "anthropic", feature = "gemini")), allow(dead_code))]
    Named(&'static str),
}

/// Where a provider's calls go and with which key: what its builder settled.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// The provider's name in errors, spans and the model profile.
    pub(crate) provider: &'static str,
    /// Where calls go.
    pub(crate) url: String,
    /// Where streamed calls go, when the API has an endpoint of its own for them.
    pub(crate) stream_url: Option<String>,
    /// The key calls carry, if any.
    pub(crate) api_key: Option<ApiKey>,
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
    fn new(kind: LlmErrorKind, message: impl Into<String>) -> Self {
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

/// A tool offered to the model: its name, description, and parameters' JSON schema under
/// the API's `schema_field`.
pub(crate) fn tool_declaration(tool: &ToolSpec, schema_field: &str) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        schema_field: tool.parameters,
    })
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
    endpoint: Endpoint,
    model: String,
    http: HttpClient,
    profile: ModelProfile,
}

impl<W: Wire> Provider<W> {
    /// A model with `builder`'s settings speaking `wire` to `endpoint`.
    pub(crate) fn new<L>(
        builder: &ProviderBuilder<L>,
        endpoint: Endpoint,
        wire: W,
    ) -> Result<Arc<Self>, LlmError> {
        Ok(Arc::new(Self {
            model: builder.model.clone(),
            profile: builder.profile(endpoint.provider),
            http: builder.http()?,
            endpoint,
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
            provider: self.endpoint.provider,
            model: &self.model,
            key: self.endpoint.api_key.as_ref(),
            map_error: W::map_error,
        }
    }

    fn post(&self, body: &Value, stream: bool) -> reqwest::RequestBuilder {
        let url = match &self.endpoint.stream_url {
            Some(url) if stream => url,
            _ => &self.endpoint.url,
        };
        let mut request = self.http.post(url).json(body);
        for &(name, value) in W::HEADERS {
            request = request.header(name, value);
        }
        match (&self.endpoint.api_key, W::KEY_HEADER) {
            (Some(key), KeyHeader::Bearer) => request.bearer_auth(key.expose()),
            (Some(key), KeyHeader::Named(name)) => request.header(name, key.expose()),
            (None, _) => request,
        }
    }

    pub(crate) async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let span = tracing::info_span!(
            "llm.complete",
            provider = self.endpoint.provider,
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
            provider = self.endpoint.provider,
            model = %self.model
        );
        let opening = async move {
            let site = self.site();
            let body = self.wire.encode_request(&request, true);
            let opened = self
                .http
                .send(&site, || self.post(&body, true), false)
                .await?;
            Ok::<_, LlmError>(Reading {
                events: opened.events(),
                site,
                decoder: self.wire.stream_decoder(&request),
                answer: Some(ResponseAssembler::default()),
                whole: false,
            })
        };
        stream::once(opening.instrument(span.clone()))
            .flat_map(move |opened| match opened {
                Ok(reading) => reading.into_stream(span.clone()),
                Err(error) => stream::iter([Err(error.into())]).boxed(),
            })
            .boxed()
    }
}

/// A streamed answer being read: the body's events, the provider's decoder, and the answer
/// so far (`None` once the stream ended).
struct Reading<'a, D> {
    site: CallSite<'a>,
    events: SseEvents,
    decoder: D,
    answer: Option<ResponseAssembler>,
    /// The answer's finish reason came: a body that ends now is complete.
    whole: bool,
}

impl<'a, D: StreamDecoder> Reading<'a, D> {
    /// The answer's events, each read inside `span`. The stream stops after the final event
    /// or the first error, and never hangs on a body that ended early.
    fn into_stream(self, span: tracing::Span) -> LlmStream<'a> {
        stream::unfold(self, move |mut reading| {
            let span = span.clone();
            async move {
                let batch = reading.next_batch().instrument(span).await?;
                Some((stream::iter(batch), reading))
            }
        })
        .flatten()
        .boxed()
    }

    /// The events of the body's next event, or `None` once the answer closed: on the final
    /// event, when the body ends after a finish reason, or on the first error.
    async fn next_batch(&mut self) -> Option<Vec<AgentResult<LlmStreamEvent>>> {
        let answer = self.answer.as_mut()?;
        let frame = match self.events.next().await {
            None if self.whole => Ok(Frame::Last),
            None => Err(self.site.error(
                LlmErrorKind::Transport,
                "the stream ended before the final event (connection dropped?)",
            )),
            Some(Err(error)) => Err(self.site.stream_error(error)),
            Some(Ok(event)) => self
                .decoder
                .event(&event, answer)
                .map_err(|e| e.at(&self.site)),
        };
        // What the event added goes out even when the event then failed.
        let mut batch: Vec<_> = answer.take_events().into_iter().map(Ok).collect();
        let closing = match frame {
            Ok(Frame::More) => Ok(Vec::new()),
            Ok(Frame::Whole) => {
                self.whole = true;
                Ok(Vec::new())
            }
            Ok(Frame::Last) => self
                .answer
                .take()
                .map_or(Ok(Vec::new()), ResponseAssembler::finish)
                .map_err(|e| e.at(&self.site)),
            Err(error) => Err(error),
        };
        match closing {
            Ok(events) => batch.extend(events.into_iter().map(Ok)),
            Err(error) => {
                tracing::warn!(error = %error, "model stream failed");
                self.answer = None;
                batch.push(Err(error.into()));
            }
        }
        Some(batch)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
