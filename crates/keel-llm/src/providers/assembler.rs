//! [`ResponseAssembler`]: turns a provider's streamed deltas into [`LlmStreamEvent`]s and the
//! final [`LlmResponse`], so each provider only decodes its own wire format.

use std::collections::BTreeMap;

use serde_json::Value;

use super::wire::WireError;
use crate::{LlmResponse, LlmStreamEvent, ToolCall, Usage};

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
    /// Set when the provider sent the arguments whole (Gemini) rather than as JSON text.
    complete: Option<Value>,
}

/// Accumulates a streamed answer: text, tool calls by index, usage, and the events not yet
/// sent.
#[derive(Debug, Default)]
pub(crate) struct ResponseAssembler {
    text: String,
    calls: BTreeMap<usize, PartialCall>,
    usage: Usage,
    events: Vec<LlmStreamEvent>,
}

impl ResponseAssembler {
    /// Record a text delta and its event (none for empty text).
    pub(crate) fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.text.push_str(text);
        self.events
            .push(LlmStreamEvent::TextDelta { text: text.into() });
    }

    /// Record a fragment of tool call `index` and its event.
    #[cfg_attr(not(any(feature = "openai", feature = "anthropic")), allow(dead_code))]
    pub(crate) fn tool_delta(
        &mut self,
        index: usize,
        id: Option<String>,
        name: Option<String>,
        arguments: &str,
    ) {
        let call = self.calls.entry(index).or_default();
        if id.is_some() {
            call.id.clone_from(&id);
        }
        if name.is_some() {
            call.name.clone_from(&name);
        }
        call.arguments.push_str(arguments);
        self.events.push(LlmStreamEvent::ToolCallDelta {
            index,
            id,
            name,
            arguments_delta: arguments.into(),
        });
    }

    /// Record a tool call that arrived whole.
    #[cfg_attr(not(feature = "gemini"), allow(dead_code))]
    pub(crate) fn whole_tool_call(&mut self, call: ToolCall) {
        let index = self.calls.len();
        self.calls.insert(
            index,
            PartialCall {
                id: Some(call.id),
                name: Some(call.name),
                arguments: String::new(),
                complete: Some(call.arguments),
            },
        );
    }

    /// The usage figures, to replace as the provider reports them (once, or cumulatively).
    pub(crate) fn usage(&mut self) -> &mut Usage {
        &mut self.usage
    }

    /// The events recorded since the last call.
    pub(crate) fn take_events(&mut self) -> Vec<LlmStreamEvent> {
        std::mem::take(&mut self.events)
    }

    /// The closing events: each assembled tool call, usage, and done.
    pub(crate) fn finish(self) -> Result<Vec<LlmStreamEvent>, WireError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, call) in self.calls {
            let name = call.name.ok_or_else(|| {
                WireError::bad_response(format!("streamed tool call {index} has no name"))
            })?;
            let arguments = match call.complete {
                Some(arguments) => arguments,
                None => parse_arguments(&call.arguments),
            };
            let id = call.id.as_deref().unwrap_or_default();
            tool_calls.push(tool_call(&name, arguments, id));
        }
        let response = LlmResponse {
            content: (!self.text.is_empty()).then_some(self.text),
            tool_calls,
            usage: self.usage,
        };
        let mut events: Vec<LlmStreamEvent> = response
            .tool_calls
            .iter()
            .map(|call| LlmStreamEvent::ToolCall { call: call.clone() })
            .collect();
        events.push(LlmStreamEvent::Usage {
            usage: response.usage,
        });
        events.push(LlmStreamEvent::Done { response });
        Ok(events)
    }
}

/// A tool call as a provider sent it: its own id when it gave one (`id` is not empty), else
/// a fresh one.
pub(crate) fn tool_call(name: &str, arguments: Value, id: &str) -> ToolCall {
    let mut call = ToolCall::new(name, arguments);
    if !id.is_empty() {
        call.id = id.to_owned();
    }
    call
}

/// Tool arguments from the JSON text a model wrote. Empty text means no arguments. Text that
/// is not JSON is kept as a string rather than failing the whole call: the tool's argument
/// validation then tells the model what was wrong, which it can fix on the next step.
pub(crate) fn parse_arguments(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn assembler_joins_argument_fragments_in_index_order() {
        let mut a = ResponseAssembler::default();
        a.text("Hel");
        a.text("lo");
        a.tool_delta(1, Some("b".into()), Some("second".into()), "");
        a.tool_delta(0, Some("a".into()), Some("first".into()), "{\"x\":");
        a.tool_delta(0, None, None, "1}");
        a.usage().input_tokens = 3;
        a.usage().output_tokens = 4;
        assert_eq!(a.take_events().len(), 5, "two text and three call deltas");
        let events = a.finish().unwrap();
        let Some(LlmStreamEvent::Done { response }) = events.last() else {
            panic!("no done event: {events:?}");
        };
        assert_eq!(response.content.as_deref(), Some("Hello"));
        assert_eq!(response.tool_calls[0].name, "first");
        assert_eq!(response.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(response.tool_calls[1].arguments, json!({}));
        assert_eq!(response.usage.output_tokens, 4);
    }

    #[test]
    fn a_nameless_call_is_a_bad_response() {
        let mut a = ResponseAssembler::default();
        a.tool_delta(0, Some("a".into()), None, "{}");
        assert_eq!(
            a.finish().unwrap_err(),
            WireError::bad_response("streamed tool call 0 has no name")
        );
    }
}
