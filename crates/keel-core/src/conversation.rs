//! Provider-neutral conversation messages, tool declarations and tool calls: what a model
//! reads and writes, and what a thread's history stores. They live here, below the model
//! interface, so stores can keep history without depending on `keel-llm` (which re-exports
//! them under their old paths).

use crate::{FileContent, Metadata};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks in a model conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmRole {
    /// Instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// A tool offered to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// A tool call requested by a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Correlates the call with its result.
    pub id: String,
    /// The tool to run.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
}

impl ToolCall {
    /// A call with a fresh id.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: {
                let mut buffer = uuid::Uuid::encode_buffer();
                let simple = uuid::Uuid::now_v7().simple();
                let mut id = String::with_capacity(5 + uuid::fmt::Simple::LENGTH);
                id.push_str("call_");
                id.push_str(simple.encode_lower(&mut buffer));
                id
            },
            name: name.into(),
            arguments,
        }
    }
}

/// One message of a model conversation.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmMessage {
    /// The message's id.
    pub id: String,
    /// Who speaks.
    pub role: LlmRole,
    /// The text.
    pub content: String,
    /// Speaker name, when a provider wants one.
    pub name: Option<String>,
    /// Tool calls requested by an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    pub tool_call_id: Option<String>,
    /// For a tool message: the tool's name.
    pub tool_name: Option<String>,
    /// Files attached to the message (images, documents), kept as they arrived; a provider
    /// sends them as multimodal content where the model reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<FileContent>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl LlmMessage {
    /// A message with a role and text.
    pub fn new(role: LlmRole, content: impl Into<String>) -> Self {
        Self {
            // Encoded by hand: `to_string` goes through the formatting machinery, several
            // times the cost, and every persisted message gets an id.
            id: (*uuid::Uuid::now_v7()
                .hyphenated()
                .encode_lower(&mut uuid::Uuid::encode_buffer()))
            .to_owned(),
            role,
            content: content.into(),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
            attachments: Vec::new(),
            metadata: Metadata::new(),
            created_at: Utc::now(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(LlmRole::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(LlmRole::User, content)
    }

    /// An assistant message, possibly with tool calls.
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        let mut message = Self::new(LlmRole::Assistant, content);
        message.tool_calls = tool_calls;
        message
    }

    /// The same message with `file` attached.
    #[must_use]
    pub fn with_attachment(mut self, file: FileContent) -> Self {
        self.attachments.push(file);
        self
    }

    /// Whether any attachment is an image.
    pub fn has_images(&self) -> bool {
        self.attachments.iter().any(is_image)
    }

    /// Request-time filtering for a model that reads no images (Standard Agents §4): image
    /// attachments are removed and a short note naming each one is appended to the text, so
    /// the model knows a file was there. Other attachments stay. The stored message is not
    /// touched: call this on the copy that goes into the request.
    ///
    /// ```
    /// use keel_core::FileContent;
    /// use keel_core::conversation::LlmMessage;
    /// let photo = FileContent { name: Some("cat.png".into()), media_type: Some("image/png".into()), ..Default::default() };
    /// let mut sent = LlmMessage::user("look").with_attachment(photo);
    /// sent.drop_images();
    /// assert!(sent.attachments.is_empty());
    /// assert_eq!(sent.content, "look\n[image `cat.png` omitted: this model does not read images]");
    /// ```
    pub fn drop_images(&mut self) {
        if !self.has_images() {
            return;
        }
        let (images, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.attachments)
            .into_iter()
            .partition(is_image);
        self.attachments = kept;
        for image in images {
            if !self.content.is_empty() {
                self.content.push('\n');
            }
            let name = image
                .name
                .as_deref()
                .or(image.uri.as_deref())
                .unwrap_or("unnamed");
            self.content.push_str(&format!(
                "[image `{name}` omitted: this model does not read images]"
            ));
        }
    }

    /// A tool result answering `call`.
    pub fn tool_result(call: &ToolCall, content: impl Into<String>) -> Self {
        let mut message = Self::new(LlmRole::Tool, content);
        message.tool_call_id = Some(call.id.clone());
        message.tool_name = Some(call.name.clone());
        message
    }
}

/// Whether a file is an image: by its media type, else by a data URL's type or its name's
/// extension.
pub fn is_image(file: &FileContent) -> bool {
    media_type_of(file).is_some_and(|m| m.starts_with("image/"))
}

/// A file's media type, lowercased and without parameters (`image/jpg` read as
/// `image/jpeg`); else a data URL's; else guessed from its name's (or URI's) extension.
pub fn media_type_of(file: &FileContent) -> Option<String> {
    let declared = file.media_type.clone().or_else(|| {
        file.uri
            .as_deref()
            .and_then(|uri| uri.strip_prefix("data:"))
            .and_then(|rest| rest.split([';', ',']).next())
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
    });
    if let Some(declared) = declared {
        let essence = declared
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        return Some(match essence.as_str() {
            "image/jpg" => "image/jpeg".to_owned(),
            _ => essence,
        });
    }
    let name = file.name.as_deref().or(file.uri.as_deref())?;
    let path = name.split(['?', '#']).next().unwrap_or_default();
    let (_, ext) = path.rsplit_once('.')?;
    let guessed = match ext.to_ascii_lowercase().as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "bmp" => "image/bmp",
        "tif" | "tiff" => "image/tiff",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "txt" | "log" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "xml" => "application/xml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        _ => return None,
    };
    Some(guessed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_ids_are_uuids_as_before() {
        let call = ToolCall::new("noop", Value::Null);
        let hex = call.id.strip_prefix("call_").expect("a call_ prefix");
        assert_eq!(hex.len(), 32);
        assert!(hex
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        let message = LlmMessage::user("hi");
        let id = uuid::Uuid::parse_str(&message.id).expect("a UUID");
        assert_eq!(id.get_version_num(), 7);
        assert_eq!(message.id, id.hyphenated().to_string());
    }

    #[test]
    fn messages_round_trip() {
        let call = ToolCall::new("add", serde_json::json!({"a": 1}));
        for msg in [
            LlmMessage::system("be brief"),
            LlmMessage::user("hi"),
            LlmMessage::assistant("", vec![call.clone()]),
            LlmMessage::tool_result(&call, "2"),
        ] {
            let back: LlmMessage =
                serde_json::from_value(serde_json::to_value(&msg).unwrap()).unwrap();
            assert_eq!(back, msg);
        }
    }

    #[test]
    fn drop_images_keeps_other_files_and_names_each_image() {
        let doc = FileContent {
            name: Some("notes.pdf".into()),
            media_type: Some("application/pdf".into()),
            ..Default::default()
        };
        let photo = FileContent {
            uri: Some("https://example.com/a.JPG".into()),
            ..Default::default()
        };
        let mut message = LlmMessage::user("")
            .with_attachment(doc.clone())
            .with_attachment(photo);
        message.drop_images();
        assert_eq!(message.attachments, [doc]);
        assert_eq!(
            message.content,
            "[image `https://example.com/a.JPG` omitted: this model does not read images]"
        );
        let back: LlmMessage =
            serde_json::from_value(serde_json::to_value(&message).unwrap()).unwrap();
        assert_eq!(back, message);
    }
}
