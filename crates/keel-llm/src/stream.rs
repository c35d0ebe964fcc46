//! Streaming answers: [`LlmStreamEvent`], the [`LlmStream`] a model returns, and the
//! assembler that providers use to turn wire deltas into events and a final response.

use std::future::Future;

use futures::stream::{self, BoxStream, StreamExt};
use keel_core::AgentResult;
use serde::{Deserialize, Serialize};

use crate::{LlmError, LlmErrorKind, LlmResponse, ToolCall, Usage};

/// A streamed answer: events in order, ending with [`LlmStreamEvent::Done`] or an error.
pub type LlmStream<'a> = BoxStream<'a, AgentResult<LlmStreamEvent>>;

/// One event of a streamed answer.
///
/// A well-formed stream carries any number of deltas, then one [`LlmStreamEvent::ToolCall`]
/// per requested call, then [`LlmStreamEvent::Usage`], and ends with
/// [`LlmStreamEvent::Done`] holding the assembled response. A stream that ends without
/// `Done` yields an error instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LlmStreamEvent {
    /// More answer text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A fragment of a tool call as it arrives; `id` and `name` come with the first fragment.
    ToolCallDelta {
        /// Which call of this answer (0-based, in the provider's order).
        index: usize,
        /// The call's id, when this fragment carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool's name, when this fragment carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// More of the arguments' JSON text.
        arguments_delta: String,
    },
    /// A tool call whose arguments are complete.
    ToolCall {
        /// The call.
        call: ToolCall,
    },
    /// Token usage of the whole call.
    Usage {
        /// The figures.
        usage: Usage,
    },
    /// The answer is complete.
    Done {
        /// Everything the stream carried, assembled.
        response: LlmResponse,
    },
}

impl LlmStreamEvent {
    /// The answer text this event adds, if it is a [`TextDelta`](Self::TextDelta).
    ///
    /// ```
    /// use keel_llm::LlmStreamEvent;
    /// let delta = LlmStreamEvent::TextDelta { text: "Hel".into() };
    /// assert_eq!(delta.text_delta(), Some("Hel"));
    /// ```
    pub fn text_delta(&self) -> Option<&str> {
        match self {
            Self::TextDelta { text } => Some(text),
            _ => None,
        }
    }

    /// The arguments text this event adds, if it is a [`ToolCallDelta`](Self::ToolCallDelta).
    pub fn arguments_delta(&self) -> Option<&str> {
        match self {
            Self::ToolCallDelta {
                arguments_delta, ..
            } => Some(arguments_delta),
            _ => None,
        }
    }
}

/// Drain a stream into its final response, failing on the first error or if the stream ends
/// without [`LlmStreamEvent::Done`].
pub async fn collect_stream(mut events: LlmStream<'_>) -> AgentResult<LlmResponse> {
    while let Some(event) = events.next().await {
        if let LlmStreamEvent::Done { response } = event? {
            return Ok(response);
        }
    }
    Err(LlmError::new(
        LlmErrorKind::Transport,
        "stream",
        "the stream ended before the final event",
    )
    .into())
}

/// The events that stream a finished response: its text as one delta, its calls, usage, done.
pub(crate) fn response_events(response: LlmResponse) -> Vec<LlmStreamEvent> {
    let mut events = Vec::new();
    if let Some(text) = response.content.as_ref().filter(|t| !t.is_empty()) {
        events.push(LlmStreamEvent::TextDelta { text: text.clone() });
    }
    for call in &response.tool_calls {
        events.push(LlmStreamEvent::ToolCall { call: call.clone() });
    }
    events.push(LlmStreamEvent::Usage {
        usage: response.usage,
    });
    events.push(LlmStreamEvent::Done { response });
    events
}

/// Stream a completion future's answer once it is ready (the default [`crate::Llm::stream`]).
pub(crate) fn replay_completion<'a>(
    completion: impl Future<Output = AgentResult<LlmResponse>> + Send + 'a,
) -> LlmStream<'a> {
    stream::once(completion)
        .flat_map(|result| {
            let events: Vec<AgentResult<LlmStreamEvent>> = match result {
                Ok(response) => response_events(response).into_iter().map(Ok).collect(),
                Err(error) => vec![Err(error)],
            };
            stream::iter(events)
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_without_done_is_a_transport_error() {
        let events: LlmStream<'static> =
            stream::iter(vec![Ok(LlmStreamEvent::TextDelta { text: "x".into() })]).boxed();
        let err = collect_stream(events).await.unwrap_err();
        assert_eq!(LlmErrorKind::of(&err), Some(LlmErrorKind::Transport));
    }
}
