//! [`MockLlm`]: a deterministic offline model.
//!
//! Unscripted, it answers sensibly with no network: a user message `/tool {json}` naming an
//! offered tool becomes a call of that tool; tool results are summarised; anything else is
//! echoed (`You said: ...`). Scripted, it plays back responses in order, so tests can drive
//! exact tool-call sequences and failures.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult};
use serde_json::Value;

use crate::{estimate_tokens, Llm, LlmRequest, LlmResponse, LlmRole, ToolCall, Usage};

/// One scripted answer of a [`MockLlm`].
#[derive(Debug, Clone, PartialEq)]
pub enum MockResponse {
    /// Answer with text.
    Text(String),
    /// Ask for these tool calls.
    ToolCalls(Vec<ToolCall>),
    /// Answer with this exact response.
    Response(LlmResponse),
    /// Fail with [`AgentError::Llm`] carrying this message.
    Error(String),
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
    requests: Mutex<Vec<LlmRequest>>,
}

impl MockLlm {
    /// The unscripted offline model.
    pub fn new() -> Self {
        Self::default()
    }

    /// A model that plays back `responses` in order and fails once they run out.
    pub fn scripted(responses: Vec<MockResponse>) -> Self {
        Self {
            script: Some(Mutex::new(responses.into())),
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<LlmRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
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
}

#[async_trait]
impl Llm for MockLlm {
    fn model_name(&self) -> &str {
        "mock"
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(request.clone());
        let mut response = match &self.script {
            None => Self::unscripted(&request),
            Some(script) => {
                let next = script
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .pop_front();
                match next {
                    Some(MockResponse::Text(text)) => LlmResponse::text(text),
                    Some(MockResponse::ToolCalls(calls)) => LlmResponse {
                        content: None,
                        tool_calls: calls,
                        usage: Usage::default(),
                    },
                    Some(MockResponse::Response(response)) => return Ok(response),
                    Some(MockResponse::Error(message)) => {
                        return Err(AgentError::Llm {
                            model: "mock".into(),
                            message,
                        })
                    }
                    None => {
                        return Err(AgentError::Llm {
                            model: "mock".into(),
                            message: "the script has no more responses".into(),
                        })
                    }
                }
            }
        };
        response.usage = Usage {
            input_tokens: request
                .messages
                .iter()
                .map(|m| estimate_tokens(&m.content))
                .sum(),
            output_tokens: estimate_tokens(response.content.as_deref().unwrap_or_default()),
        };
        Ok(response)
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
    async fn exhausted_script_is_an_llm_error() {
        let llm = MockLlm::scripted(vec![MockResponse::Error("rate limited".into())]);
        let err = llm.complete(LlmRequest::default()).await.unwrap_err();
        assert!(matches!(err, AgentError::Llm { ref message, .. } if message == "rate limited"));
        let err = llm.complete(LlmRequest::default()).await.unwrap_err();
        assert!(err.to_string().contains("no more responses"));
        assert_eq!(llm.requests().len(), 2);
    }
}
