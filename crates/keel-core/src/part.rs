//! Parts: the atomic content units of messages and artifacts, including Keel's typed parts
//! (tool calls and outputs, inference requests, errors, status, routing decisions).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Metadata, TaskState};

/// One content unit: what it holds plus optional metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// What the part holds, tagged by `type` in JSON.
    #[serde(flatten)]
    pub content: PartContent,
    /// Extension metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

/// A file, by reference or inline.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FileContent {
    /// The file name.
    pub name: Option<String>,
    /// Its MIME type.
    pub media_type: Option<String>,
    /// Where it can be fetched.
    pub uri: Option<String>,
    /// Its bytes, base64-encoded (standard alphabet, padded).
    pub bytes: Option<String>,
}

/// A structured routing or decision outcome (used by [`PartContent::Route`] and
/// [`PartContent::Decision`]).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteDecision {
    /// The chosen route key.
    pub route: String,
    /// Why it was chosen.
    pub reason: Option<String>,
    /// How confident the chooser is, 0.0 to 1.0.
    pub confidence: Option<f64>,
    /// Extra data.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

/// What a [`Part`] holds.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PartContent {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A file.
    File {
        /// The file.
        file: FileContent,
    },
    /// Arbitrary structured data.
    Data {
        /// The data.
        data: Value,
    },
    /// A request to run one tool directly.
    ToolCall {
        /// Correlates the call with its output.
        call_id: String,
        /// The tool to run.
        tool_name: String,
        /// Its arguments.
        #[serde(default)]
        args: Value,
    },
    /// The result of a tool call.
    ToolOutput {
        /// The call this answers.
        call_id: String,
        /// The tool that ran.
        tool_name: String,
        /// What it returned (or the error text).
        output: Value,
        /// Whether the tool failed.
        #[serde(default)]
        is_error: bool,
    },
    /// A request for a model inference.
    Infer {
        /// The prompt.
        prompt: Option<String>,
        /// The user the inference is for.
        user: Option<String>,
        /// JSON schema the output must follow.
        output_schema: Option<Value>,
    },
    /// The result of an inference.
    InferOutput {
        /// What the model produced.
        output: Value,
    },
    /// A JSON document.
    Json {
        /// The document.
        content: Value,
    },
    /// An error report.
    Error {
        /// What went wrong.
        message: String,
        /// A machine-readable code.
        code: Option<String>,
        /// Extra detail.
        details: Option<Value>,
    },
    /// A status signal, e.g. asking for more input.
    Status {
        /// The state the sender asks for or reports.
        state: TaskState,
        /// Explanation.
        message: Option<String>,
    },
    /// A flow routing decision.
    Route(RouteDecision),
    /// A structured decision, shaped like a route.
    Decision(RouteDecision),
}

impl PartContent {
    /// The `type` tag of this content (`text`, `tool_call`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            PartContent::Text { .. } => "text",
            PartContent::File { .. } => "file",
            PartContent::Data { .. } => "data",
            PartContent::ToolCall { .. } => "tool_call",
            PartContent::ToolOutput { .. } => "tool_output",
            PartContent::Infer { .. } => "infer",
            PartContent::InferOutput { .. } => "infer_output",
            PartContent::Json { .. } => "json",
            PartContent::Error { .. } => "error",
            PartContent::Status { .. } => "status",
            PartContent::Route(_) => "route",
            PartContent::Decision(_) => "decision",
        }
    }
}

impl From<PartContent> for Part {
    fn from(content: PartContent) -> Self {
        Part {
            content,
            metadata: Metadata::new(),
        }
    }
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        PartContent::Text { text: text.into() }.into()
    }

    /// A file part.
    pub fn file(file: FileContent) -> Self {
        PartContent::File { file }.into()
    }

    /// A structured data part.
    pub fn data(data: Value) -> Self {
        PartContent::Data { data }.into()
    }

    /// A JSON document part.
    pub fn json(content: Value) -> Self {
        PartContent::Json { content }.into()
    }

    /// A direct tool call.
    ///
    /// ```
    /// use keel_core::Part;
    /// let part = Part::tool_call("c1", "get_weather", serde_json::json!({"city": "Athens"}));
    /// assert_eq!(part.content.type_name(), "tool_call");
    /// ```
    pub fn tool_call(
        call_id: impl Into<String>,
        tool_name: impl Into<String>,
        args: Value,
    ) -> Self {
        PartContent::ToolCall {
            call_id: call_id.into(),
            tool_name: tool_name.into(),
            args,
        }
        .into()
    }

    /// A tool's output.
    pub fn tool_output(
        call_id: impl Into<String>,
        tool_name: impl Into<String>,
        output: Value,
        is_error: bool,
    ) -> Self {
        PartContent::ToolOutput {
            call_id: call_id.into(),
            tool_name: tool_name.into(),
            output,
            is_error,
        }
        .into()
    }

    /// An inference request.
    pub fn infer(prompt: impl Into<String>) -> Self {
        PartContent::Infer {
            prompt: Some(prompt.into()),
            user: None,
            output_schema: None,
        }
        .into()
    }

    /// An inference request with every field the seed names: the prompt, the user it is
    /// for, and the JSON schema its output must follow.
    ///
    /// ```
    /// use keel_core::{Part, PartContent};
    /// let part = Part::infer_with(Some("Sum 2 and 3".into()), None, Some(serde_json::json!({"type": "number"})));
    /// assert!(matches!(part.content, PartContent::Infer { output_schema: Some(_), .. }));
    /// ```
    pub fn infer_with(
        prompt: Option<String>,
        user: Option<String>,
        output_schema: Option<Value>,
    ) -> Self {
        PartContent::Infer {
            prompt,
            user,
            output_schema,
        }
        .into()
    }

    /// An inference result.
    pub fn infer_output(output: Value) -> Self {
        PartContent::InferOutput { output }.into()
    }

    /// An error report.
    pub fn error(message: impl Into<String>) -> Self {
        PartContent::Error {
            message: message.into(),
            code: None,
            details: None,
        }
        .into()
    }

    /// A status signal.
    pub fn status(state: TaskState, message: Option<String>) -> Self {
        PartContent::Status { state, message }.into()
    }

    /// A routing decision.
    pub fn route(route: impl Into<String>, reason: Option<String>) -> Self {
        PartContent::Route(RouteDecision {
            route: route.into(),
            reason,
            confidence: None,
            metadata: Metadata::new(),
        })
        .into()
    }

    /// A structured decision.
    pub fn decision(route: impl Into<String>, reason: Option<String>) -> Self {
        PartContent::Decision(RouteDecision {
            route: route.into(),
            reason,
            confidence: None,
            metadata: Metadata::new(),
        })
        .into()
    }

    /// The text, if this is a text part.
    pub fn as_text(&self) -> Option<&str> {
        match &self.content {
            PartContent::Text { text } => Some(text),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn every_part() -> Vec<Part> {
        vec![
            Part::text("t"),
            Part::file(FileContent {
                name: Some("a.txt".into()),
                media_type: Some("text/plain".into()),
                uri: None,
                bytes: Some("aGk=".into()),
            }),
            Part::data(json!({"x": [1, 2]})),
            Part::json(json!({"ok": true})),
            Part::tool_call("c1", "add", json!({"a": 1})),
            Part::tool_output("c1", "add", json!(2), false),
            Part::infer("who are you?"),
            Part::infer_output(json!("a bot")),
            Part::error("boom"),
            Part::status(TaskState::InputRequired, Some("which city?".into())),
            Part::route("quality", Some("ready".into())),
            Part::decision("approve", None),
        ]
    }

    #[test]
    fn every_part_kind_round_trips() {
        for part in every_part() {
            let json = serde_json::to_value(&part).unwrap();
            assert_eq!(json["type"], part.content.type_name());
            let back: Part = serde_json::from_value(json).unwrap();
            assert_eq!(back, part);
        }
    }

    #[test]
    fn part_metadata_round_trips() {
        let mut part = Part::text("x");
        part.metadata.insert("k".into(), json!("v"));
        let back: Part = serde_json::from_value(serde_json::to_value(&part).unwrap()).unwrap();
        assert_eq!(back, part);
    }

    #[test]
    fn unknown_part_type_is_an_error() {
        assert!(serde_json::from_value::<Part>(json!({"type": "hologram"})).is_err());
    }
}
