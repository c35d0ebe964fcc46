//! The conformance agent that `keel serve --agent conformance` runs: it answers the A2A TCK's
//! scenario contract, choosing its behaviour by the prefix of each incoming `messageId`
//! (longest prefix first), so a test suite can drive every task lifecycle without a model.
//!
//! The scenarios and their prefixes are listed in [`SCENARIOS`] and in `docs/conformance.md`.
//! Rejection, the requests for input or authorization and the direct message reply are
//! decided before any task starts (a [`Negotiator`]); everything else is the run of a
//! scripted model ([`ScenarioModel`]) that reads the `messageId` the engine keeps on each user
//! history entry, and adds artifacts through its `artifact` tool.

use std::time::Duration;

use async_trait::async_trait;
use keel_agent::{
    Agent, ArtifactChunk, FnTool, Negotiation, Negotiator, ToolContext, MESSAGE_ID_META,
};
use keel_core::{
    AgentCard, AgentError, AgentResult, AgentSkill, Artifact, FileContent, Message, Part,
};
use keel_llm::{Llm, LlmRequest, LlmResponse, LlmRole, ToolCall};
use serde_json::json;

/// What the agent does for one message, chosen by its `messageId` prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Complete the task with the agent message [`COMPLETE_TEXT`].
    Complete,
    /// Stay `working` for the agent's delay, then complete with [`DELAYED_TEXT`].
    DelayedComplete,
    /// Complete the task with a text artifact holding [`ARTIFACT_TEXT`].
    ArtifactText,
    /// Wait in `input-required`; the follow-up message completes the task.
    InputRequired,
    /// Reject the task with the reason [`REJECT_REASON`].
    Reject,
    /// Stay `working` until canceled (at most [`LONG_RUNNING`]), then complete: a task to
    /// resubscribe to or cancel.
    LongRunning,
    /// Complete the task with a file artifact holding bytes: [`FILE_NAME`], [`FILE_MEDIA_TYPE`],
    /// [`FILE_BYTES_BASE64`].
    ArtifactFile,
    /// Complete the task with a file artifact by URL: [`FILE_URL`], [`FILE_NAME`],
    /// [`FILE_MEDIA_TYPE`].
    ArtifactFileUrl,
    /// Complete the task with a data artifact: [`data_artifact_value`].
    ArtifactData,
    /// Answer with the message [`MESSAGE_RESPONSE_TEXT`] and create no task.
    MessageResponse,
    /// Wait in `auth-required`; the follow-up message completes the task.
    AuthRequired,
    /// Send one text artifact in two chunks ([`CHUNKS`]: the second appended, and the last),
    /// then complete: its final artifact is their concatenation.
    StreamArtifactChunked,
}

/// The prefixes and their scenarios. A message whose id matches none completes the task.
pub const SCENARIOS: &[(&str, Scenario)] = &[
    ("tck-complete-task", Scenario::Complete),
    ("tck-delayed-complete", Scenario::DelayedComplete),
    ("tck-artifact-text", Scenario::ArtifactText),
    ("tck-input-required", Scenario::InputRequired),
    ("tck-reject-task", Scenario::Reject),
    ("tck-long-running", Scenario::LongRunning),
    ("tck-artifact-file", Scenario::ArtifactFile),
    ("tck-artifact-file-url", Scenario::ArtifactFileUrl),
    ("tck-artifact-data", Scenario::ArtifactData),
    ("tck-message-response", Scenario::MessageResponse),
    ("tck-auth-required", Scenario::AuthRequired),
    (
        "tck-stream-artifact-chunked",
        Scenario::StreamArtifactChunked,
    ),
];

/// The answer of [`Scenario::Complete`] (and of an id with no known prefix).
pub const COMPLETE_TEXT: &str = "Hello from TCK";
/// The answer of [`Scenario::DelayedComplete`].
pub const DELAYED_TEXT: &str = "Done after delay";
/// The text artifact of [`Scenario::ArtifactText`].
pub const ARTIFACT_TEXT: &str = "Generated text content";
/// The question of [`Scenario::InputRequired`].
pub const INPUT_QUESTION: &str = "Input required: send a follow-up message to complete the task";
/// The answer to the follow-up of [`Scenario::InputRequired`].
pub const INPUT_RECEIVED_TEXT: &str = "Input received";
/// The reason of [`Scenario::Reject`].
pub const REJECT_REASON: &str = "rejected";
/// The request of [`Scenario::AuthRequired`].
pub const AUTH_REQUEST: &str =
    "Authorization required: send a follow-up message to complete the task";
/// The answer to the follow-up of [`Scenario::AuthRequired`].
pub const AUTH_RECEIVED_TEXT: &str = "Authorization received";
/// The reply of [`Scenario::MessageResponse`].
pub const MESSAGE_RESPONSE_TEXT: &str = "Direct message response";
/// The name of the file artifacts.
pub const FILE_NAME: &str = "output.txt";
/// The media type of the file artifacts.
pub const FILE_MEDIA_TYPE: &str = "text/plain";
/// The bytes of [`Scenario::ArtifactFile`], base64 (`Generated file content`).
pub const FILE_BYTES_BASE64: &str = "R2VuZXJhdGVkIGZpbGUgY29udGVudA==";
/// The URL of [`Scenario::ArtifactFileUrl`].
pub const FILE_URL: &str = "https://example.com/output.txt";
/// The chunks of [`Scenario::StreamArtifactChunked`], in order.
pub const CHUNKS: [&str; 2] = ["chunk-1 ", "chunk-2"];
/// The answer (the status message) of the scenarios that add their own artifacts.
pub const ARTIFACT_ADDED_TEXT: &str = "Artifact added";

/// The structured data of [`Scenario::ArtifactData`].
pub fn data_artifact_value() -> serde_json::Value {
    json!({"key": "value", "count": 42})
}

/// How long [`Scenario::LongRunning`] works when nobody cancels it.
pub const LONG_RUNNING: Duration = Duration::from_secs(300);
/// The default delay of [`Scenario::DelayedComplete`].
pub const DEFAULT_DELAY: Duration = Duration::from_secs(2);

/// The scenario of `message_id`: the longest matching prefix wins (so a longer prefix that
/// extends a shorter one is never shadowed by it); `None` when no prefix matches.
///
/// ```
/// use keel::conformance::{scenario, Scenario};
/// assert_eq!(scenario("tck-reject-task-42"), Some(Scenario::Reject));
/// assert_eq!(scenario("tck-artifact-file-url-1"), Some(Scenario::ArtifactFileUrl));
/// assert_eq!(scenario("hello"), None);
/// ```
pub fn scenario(message_id: &str) -> Option<Scenario> {
    SCENARIOS
        .iter()
        .filter(|(prefix, _)| message_id.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, scenario)| *scenario)
}

/// The conformance agent's card: streaming and push notifications declared (the server
/// fills in its URL; `keel serve` also offers it as the extended card).
pub fn card() -> AgentCard {
    let mut card = AgentCard::new(
        "keel-conformance",
        "Keel's conformance agent: behaves as the A2A TCK scenario named by the messageId prefix.",
        "http://127.0.0.1:8080/",
    )
    .with_skill(
        AgentSkill::new(
            "tck-scenarios",
            "Completes, delays, adds artifacts (text, file, URL, data, chunked), replies without a task, asks for input or authorization, or rejects, by messageId prefix.",
        )
        .with_tags(["conformance"])
        .with_example("messageId tck-complete-task-1"),
    )
    .with_tags(["conformance"]);
    card.capabilities.streaming = true;
    card.capabilities.push_notifications = true;
    card
}

/// `server` offering the conformance card as its extended card too (A2A
/// `GetExtendedAgentCard`), as the TCK's capability checks expect of this agent.
pub fn with_extended_card(server: keel_transport::A2aServer) -> keel_transport::A2aServer {
    server.with_extended_card(card())
}

/// The conformance agent, with [`DEFAULT_DELAY`].
pub fn agent() -> AgentResult<Agent> {
    agent_with_delay(DEFAULT_DELAY)
}

/// The conformance agent whose [`Scenario::DelayedComplete`] works for `delay`.
pub fn agent_with_delay(delay: Duration) -> AgentResult<Agent> {
    let wait = crate::demo::wait_tool(
        WAIT_TOOL,
        "Stay working for some seconds, stopping early if the task is canceled.",
        json!({"type": "number", "minimum": 0}),
        |_| json!("waited"),
    );
    let artifact = FnTool::new(
        ARTIFACT_TOOL,
        "Add the artifacts of a TCK scenario to the task.",
        json!({
            "type": "object",
            "properties": {"scenario": {"type": "string", "enum": ["file", "file-url", "data", "chunked"]}},
            "required": ["scenario"],
            "additionalProperties": false
        }),
        |args, ctx| async move {
            add_artifacts(args["scenario"].as_str().unwrap_or_default(), &ctx).await?;
            Ok(json!("added"))
        },
    );
    Agent::builder(card())
        .instructions("Follow the TCK scenario named by the messageId prefix.")
        .llm(ScenarioModel { delay })
        .negotiator(ScenarioNegotiator)
        .human_handoff(true)
        .tool(wait)
        .tool(artifact)
        .build()
}

const WAIT_TOOL: &str = "wait";
const ARTIFACT_TOOL: &str = "artifact";

/// The `artifact` tool: the artifacts of one scenario, added to the calling task.
async fn add_artifacts(which: &str, ctx: &ToolContext) -> AgentResult<()> {
    let file = |bytes: Option<&str>, uri: Option<&str>| {
        Part::file(FileContent {
            name: Some(FILE_NAME.into()),
            media_type: Some(FILE_MEDIA_TYPE.into()),
            uri: uri.map(Into::into),
            bytes: bytes.map(Into::into),
        })
    };
    let whole = |part: Part| Artifact::new().with_part(part).named(FILE_NAME);
    match which {
        "file" => {
            let artifact = whole(file(Some(FILE_BYTES_BASE64), None));
            ctx.add_artifact(artifact, ArtifactChunk::WHOLE).await
        }
        "file-url" => {
            let artifact = whole(file(None, Some(FILE_URL)));
            ctx.add_artifact(artifact, ArtifactChunk::WHOLE).await
        }
        "data" => {
            let artifact = Artifact::new()
                .with_part(Part::data(data_artifact_value()))
                .named("data");
            ctx.add_artifact(artifact, ArtifactChunk::WHOLE).await
        }
        "chunked" => {
            let first = Artifact::text(CHUNKS[0]).named("chunked");
            let mut last = Artifact::text(CHUNKS[1]).named("chunked");
            last.id = first.id.clone();
            ctx.add_artifact(first, ArtifactChunk::FIRST).await?;
            ctx.add_artifact(last, ArtifactChunk::LAST).await
        }
        other => Err(AgentError::invalid_input(
            "scenario",
            format!("no artifacts for `{other}`"),
        )),
    }
}

/// Decides the scenarios that end or pause a task before it starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScenarioNegotiator;

#[async_trait]
impl Negotiator for ScenarioNegotiator {
    async fn negotiate(&self, _card: &AgentCard, message: &Message) -> AgentResult<Negotiation> {
        Ok(match scenario(message.message_id.as_str()) {
            Some(Scenario::Reject) => Negotiation::Reject {
                reason: REJECT_REASON.into(),
            },
            Some(Scenario::InputRequired) => Negotiation::AskInput {
                question: INPUT_QUESTION.into(),
            },
            Some(Scenario::AuthRequired) => Negotiation::AskAuth {
                request: AUTH_REQUEST.into(),
            },
            Some(Scenario::MessageResponse) => Negotiation::Reply {
                message: Message::agent(MESSAGE_RESPONSE_TEXT),
            },
            _ => Negotiation::Accept { skill: None },
        })
    }
}

/// A scripted model: it answers as the scenario of the latest user message's `messageId`
/// says, calling the `wait` tool first for the scenarios that stay working and the `artifact`
/// tool for those that add artifacts.
#[derive(Debug, Clone, Copy)]
pub struct ScenarioModel {
    delay: Duration,
}

#[async_trait]
impl Llm for ScenarioModel {
    fn model_name(&self) -> &str {
        "keel-conformance"
    }

    async fn complete(&self, request: LlmRequest) -> AgentResult<LlmResponse> {
        let latest_user = request
            .messages
            .iter()
            .rposition(|m| m.role == LlmRole::User);
        let message_id = latest_user
            .and_then(|at| request.messages[at].metadata.get(MESSAGE_ID_META))
            .and_then(|id| id.as_str())
            .unwrap_or_default();
        // A tool result after the message means the wait (or the artifact) is done.
        let waited = latest_user.is_some_and(|at| {
            request.messages[at..]
                .iter()
                .any(|m| m.role == LlmRole::Tool)
        });
        let wait = |seconds: f64| {
            Ok(LlmResponse {
                tool_calls: vec![ToolCall::new(WAIT_TOOL, json!({ "seconds": seconds }))],
                ..LlmResponse::default()
            })
        };
        let add = |which: &str| {
            Ok(LlmResponse {
                tool_calls: vec![ToolCall::new(ARTIFACT_TOOL, json!({ "scenario": which }))],
                ..LlmResponse::default()
            })
        };
        // A task opened by `tck-input-required` asks again while the follow-up asks for input
        // (its id has that prefix too), as the TCK's own agents do; any other follow-up ends it.
        let opening = request
            .messages
            .iter()
            .find(|m| m.role == LlmRole::User)
            .and_then(|m| m.metadata.get(MESSAGE_ID_META))
            .and_then(|id| id.as_str())
            .unwrap_or_default();
        if scenario(opening) == Some(Scenario::InputRequired) {
            return if scenario(message_id) == Some(Scenario::InputRequired) && !waited {
                Ok(LlmResponse {
                    tool_calls: vec![ToolCall::new(
                        keel_agent::ASK_HUMAN_TOOL,
                        json!({ "question": INPUT_QUESTION }),
                    )],
                    ..LlmResponse::default()
                })
            } else {
                Ok(LlmResponse::text(INPUT_RECEIVED_TEXT))
            };
        }
        match scenario(message_id) {
            Some(Scenario::ArtifactFile) if !waited => add("file"),
            Some(Scenario::ArtifactFileUrl) if !waited => add("file-url"),
            Some(Scenario::ArtifactData) if !waited => add("data"),
            Some(Scenario::StreamArtifactChunked) if !waited => add("chunked"),
            Some(
                Scenario::ArtifactFile
                | Scenario::ArtifactFileUrl
                | Scenario::ArtifactData
                | Scenario::StreamArtifactChunked,
            ) => Ok(LlmResponse::text(ARTIFACT_ADDED_TEXT)),
            Some(Scenario::DelayedComplete) if !waited => wait(self.delay.as_secs_f64()),
            Some(Scenario::LongRunning) if !waited => wait(LONG_RUNNING.as_secs_f64()),
            Some(Scenario::DelayedComplete) => Ok(LlmResponse::text(DELAYED_TEXT)),
            Some(Scenario::ArtifactText) => Ok(LlmResponse::text(ARTIFACT_TEXT)),
            // Only the follow-up reaches the model: the first message waits for input.
            Some(Scenario::InputRequired) => Ok(LlmResponse::text(INPUT_RECEIVED_TEXT)),
            Some(Scenario::AuthRequired) => Ok(LlmResponse::text(AUTH_RECEIVED_TEXT)),
            _ => Ok(LlmResponse::text(COMPLETE_TEXT)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_prefix_wins() {
        assert_eq!(scenario("tck-complete-task-7"), Some(Scenario::Complete));
        assert_eq!(
            scenario("tck-delayed-complete-x"),
            Some(Scenario::DelayedComplete)
        );
        assert_eq!(scenario("tck-long-running"), Some(Scenario::LongRunning));
        // `tck-artifact-file` is a prefix of `tck-artifact-file-url`: order must not matter.
        assert_eq!(
            scenario("tck-artifact-file-url-1"),
            Some(Scenario::ArtifactFileUrl)
        );
        assert_eq!(
            scenario("tck-artifact-file-1"),
            Some(Scenario::ArtifactFile)
        );
        assert_eq!(
            scenario("tck-stream-artifact-chunked-3"),
            Some(Scenario::StreamArtifactChunked)
        );
        assert_eq!(scenario("tck-artifact"), None);
        assert_eq!(scenario(""), None);
    }
}
