//! [`McpTool`]: one tool of an MCP server as a Keel [`Tool`], so that its calls go through the
//! engine like any other: judged by policy, counted by budgets, shown in events (redacted).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use keel_agent::{Tool, ToolContext};
use keel_core::conversation::ToolSpec;
use keel_core::{AgentError, AgentResult};
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ResourceContents};
use serde_json::Value;

use crate::names::tool_name;
use crate::server::{CallError, McpServer, Trace};
use crate::spec::ToolFlags;
use crate::McpError;

/// A tool of an MCP server.
pub struct McpTool {
    server: Arc<McpServer>,
    /// What the model sees: `{server}_{tool}` sanitized, the server's description and schema.
    offered: ToolSpec,
    /// Its MCP name, as the server knows it.
    mcp_name: String,
    flags: ToolFlags,
    capabilities: Vec<String>,
}

impl McpTool {
    /// The server's tools that its spec's allow and deny lists let through, named so that
    /// none is one of `taken` (every name given is added to it).
    pub async fn list(
        server: &Arc<McpServer>,
        taken: &mut HashSet<String>,
    ) -> Result<Vec<McpTool>, McpError> {
        let listed = server.list_tools().await?;
        Ok(Self::of_listed(server, listed, taken))
    }

    /// [`McpTool::list`] of a list `server` gave already.
    pub(crate) fn of_listed(
        server: &Arc<McpServer>,
        listed: Vec<rmcp::model::Tool>,
        taken: &mut HashSet<String>,
    ) -> Vec<McpTool> {
        let spec = server.spec();
        let mut tools = Vec::new();
        for tool in listed {
            if !spec.offers(&tool.name) {
                continue;
            }
            let hints = tool.annotations.as_ref();
            let flags = ToolFlags::from_hints(
                hints.and_then(|h| h.read_only_hint),
                hints.and_then(|h| h.destructive_hint),
                hints.and_then(|h| h.idempotent_hint),
                spec.overrides.get(tool.name.as_ref()),
            );
            let mut capabilities = vec![
                format!("mcp.{}.{}", spec.name, tool.name),
                if flags.read_only {
                    "mcp.read"
                } else {
                    "mcp.write"
                }
                .to_owned(),
            ];
            if flags.destructive {
                capabilities.push("mcp.destructive".to_owned());
            }
            capabilities.extend(spec.capabilities.iter().cloned());
            let description = tool
                .description
                .as_deref()
                .or(tool.title.as_deref())
                .map_or_else(
                    || {
                        format!(
                            "The tool `{}` of the MCP server `{}`.",
                            tool.name, spec.name
                        )
                    },
                    str::to_owned,
                );
            tools.push(McpTool {
                server: server.clone(),
                offered: ToolSpec {
                    name: tool_name(&spec.name, &tool.name, taken),
                    description,
                    parameters: Value::Object(tool.input_schema.as_ref().clone()),
                },
                mcp_name: tool.name.to_string(),
                flags,
                capabilities,
            });
        }
        tools
    }

    /// Its MCP name, as the server knows it.
    pub fn mcp_name(&self) -> &str {
        &self.mcp_name
    }

    /// What Keel treats it as.
    pub fn flags(&self) -> ToolFlags {
        self.flags
    }

    /// The server it belongs to.
    pub fn server(&self) -> &Arc<McpServer> {
        &self.server
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.offered.name
    }
    fn description(&self) -> &str {
        &self.offered.description
    }
    fn parameters(&self) -> Value {
        self.offered.parameters.clone()
    }
    fn idempotent(&self) -> bool {
        self.flags.idempotent
    }
    fn capabilities(&self) -> Vec<String> {
        self.capabilities.clone()
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> AgentResult<Value> {
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            other => {
                return Err(self.failed(format!("the arguments must be a JSON object, not {other}")))
            }
        };
        let (progress, mut reports) = tokio::sync::mpsc::unbounded_channel();
        // The call's trace goes with it, under the tool call's span, so the server's spans
        // join the run's trace.
        let trace = Trace {
            parent: ctx.traceparent().to_string(),
            state: ctx.run.trace_state.clone(),
        };
        let call = self.server.call(
            &self.mcp_name,
            arguments,
            self.flags.idempotent,
            &ctx.cancel,
            progress,
            &trace,
        );
        tokio::pin!(call);
        // The server's progress reports reach the task's stream while the call goes on.
        let result = loop {
            tokio::select! {
                result = &mut call => break result,
                Some(report) = reports.recv() => {
                    if let Err(err) = ctx.report_progress(self.name(), progress_value(&report)).await {
                        tracing::warn!(tool = self.name(), error = %err, "an MCP progress report was not recorded");
                    }
                }
            }
        };
        match result {
            Ok(result) => {
                if result.is_error != Some(true) {
                    self.attach_images(&result, ctx).await;
                }
                output(result).map_err(|message| self.failed(message))
            }
            Err(CallError::Canceled) => Err(AgentError::Canceled {
                reason: "task canceled".into(),
            }),
            Err(CallError::Failed(err)) => Err(self.failed(err.to_string())),
        }
    }
}

impl McpTool {
    fn failed(&self, message: String) -> AgentError {
        AgentError::ToolFailed {
            tool: self.offered.name.clone(),
            message,
        }
    }

    /// Store each image of `result` in the thread's attachment store and attach it to the
    /// call's result, so that the model sees it where its provider takes images with a tool
    /// result; the output keeps a line describing it. An image that cannot be decoded or
    /// stored stays that line alone (a warning says why).
    async fn attach_images(&self, result: &CallToolResult, ctx: &ToolContext) {
        let images = result.content.iter().filter_map(|block| match block {
            ContentBlock::Image(image) => Some(image),
            _ => None,
        });
        for (i, image) in images.enumerate() {
            let extension = image
                .mime_type
                .strip_prefix("image/")
                .map(|subtype| subtype.split(['+', ';']).next().unwrap_or(subtype))
                .unwrap_or("bin");
            let name = format!("{}-{}.{extension}", self.mcp_name, i + 1);
            let stored = match base64::engine::general_purpose::STANDARD.decode(image.data.trim()) {
                Ok(bytes) => {
                    ctx.thread
                        .put_attachment(&name, Some(&image.mime_type), &bytes)
                        .await
                }
                Err(err) => Err(AgentError::invalid_input("image", err.to_string())),
            };
            match stored {
                Ok(file) => ctx.attach_to_result(file),
                Err(err) => {
                    tracing::warn!(tool = self.name(), error = %err, "an MCP image result was not attached");
                }
            }
        }
    }
}

/// A tool result as Keel's tool output: its `structuredContent` when it has one, else its
/// content as text (one block's text, or the blocks' texts one per line). `isError` makes it
/// the message of a tool error, which the model reads like any tool's error. An image or
/// audio block becomes a line describing it (a call also attaches each image to its result,
/// see [`ToolContext::attach_to_result`]).
pub fn output(result: CallToolResult) -> Result<Value, String> {
    let texts: Vec<String> = result.content.iter().map(block_text).collect();
    let text = texts.join("\n");
    if result.is_error == Some(true) {
        return Err(if text.is_empty() {
            "the tool reported an error and said nothing more".to_owned()
        } else {
            text
        });
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    Ok(Value::String(text))
}

/// An MCP progress notification as the progress Keel records: its `progress`, and its `total`
/// and `message` when the server gave them.
fn progress_value(report: &ProgressNotificationParam) -> Value {
    let mut progress = serde_json::Map::new();
    progress.insert("progress".into(), serde_json::json!(report.progress));
    if let Some(total) = report.total {
        progress.insert("total".into(), serde_json::json!(total));
    }
    if let Some(message) = &report.message {
        progress.insert("message".into(), Value::String(message.clone()));
    }
    Value::Object(progress)
}

/// One content block as text.
fn block_text(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => format!(
            "[image: {}, {} bytes]",
            image.mime_type,
            base64_len(&image.data)
        ),
        ContentBlock::Audio(audio) => format!(
            "[audio: {}, {} bytes, not shown: Keel sends no audio to models]",
            audio.mime_type,
            base64_len(&audio.data)
        ),
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes, not shown]",
                mime_type.as_deref().unwrap_or("binary"),
                base64_len(blob)
            ),
            other => serde_json::to_string(other).unwrap_or_default(),
        },
        ContentBlock::ResourceLink(link) => format!("[resource link {}: {}]", link.name, link.uri),
        // Content kinds newer than this build: their JSON, rather than nothing.
        #[allow(unreachable_patterns)]
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// The number of bytes base64 `data` decodes to.
fn base64_len(data: &str) -> usize {
    let data = data.trim_end_matches('=');
    data.len() * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ImageContent;

    #[test]
    fn structured_content_wins_over_its_text() {
        let mut result = CallToolResult::success(vec![ContentBlock::text("{\"t\":1}")]);
        result.structured_content = Some(serde_json::json!({"t": 1}));
        assert_eq!(output(result), Ok(serde_json::json!({"t": 1})));
    }

    #[test]
    fn an_error_result_is_an_error_with_its_text() {
        let result = CallToolResult::error(vec![ContentBlock::text("no such file")]);
        assert_eq!(output(result), Err("no such file".to_owned()));
    }

    #[test]
    fn images_become_a_described_line() {
        let image = ContentBlock::Image(ImageContent::new("aGVsbG8=", "image/png"));
        let result = CallToolResult::success(vec![ContentBlock::text("here:"), image]);
        assert_eq!(
            output(result),
            Ok(Value::String("here:\n[image: image/png, 5 bytes]".into()))
        );
    }
}
