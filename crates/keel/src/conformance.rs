//! The conformance agent that `keel serve --agent conformance` runs: it answers the A2A TCK's
//! scenario contract, choosing its behaviour by the prefix of each incoming `messageId`
//! (longest prefix first), so a test suite can drive every task lifecycle without a model.
//!
//! The scenarios and their prefixes are listed in [`SCENARIOS`] and in `docs/conformance.md`.
//! Rejection and the request for input are decided before the task starts (a
//! [`Negotiator`]); everything else is the run of a scripted model ([`ScenarioModel`]) that
//! reads the `messageId` the engine keeps on each user history entry.

use std::time::Duration;

use async_trait::async_trait;
use keel_agent::{Agent, FnTool, Negotiation, Negotiator, MESSAGE_ID_META};
use keel_core::{AgentCard, AgentError, AgentResult, AgentSkill, Message};
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
    /// A TCK scenario the engine cannot play yet (named by its prefix): the task is
    /// rejected with a reason that says so, rather than completed as if it had passed.
    Unsupported(&'static str),
}

/// The prefixes and their scenarios. A message whose id matches none completes the task.
pub const SCENARIOS: &[(&str, Scenario)] = &[
    ("tck-complete-task", Scenario::Complete),
    ("tck-delayed-complete", Scenario::DelayedComplete),
    ("tck-artifact-text", Scenario::ArtifactText),
    ("tck-input-required", Scenario::InputRequired),
    ("tck-reject-task", Scenario::Reject),
    ("tck-long-running", Scenario::LongRunning),
    // Artifacts other than the answer's text, and a Message reply without a task, need
    // the engine to let a run produce them (see docs/conformance.md).
    (
        "tck-artifact-file",
        Scenario::Unsupported("tck-artifact-file"),
    ),
    (
        "tck-artifact-file-url",
        Scenario::Unsupported("tck-artifact-file-url"),
    ),
    (
        "tck-artifact-data",
        Scenario::Unsupported("tck-artifact-data"),
    ),
    (
        "tck-message-response",
        Scenario::Unsupported("tck-message-response"),
    ),
    (
        "tck-auth-required",
        Scenario::Unsupported("tck-auth-required"),
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
            "Completes, delays, adds a text artifact, asks for input or rejects, by messageId prefix.",
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
    let wait = FnTool::new(
        WAIT_TOOL,
        "Stay working for some seconds, stopping early if the task is canceled.",
        json!({
            "type": "object",
            "properties": {"seconds": {"type": "number", "minimum": 0}},
            "required": ["seconds"],
            "additionalProperties": false
        }),
        |args, ctx| async move {
            let seconds = args["seconds"].as_f64().unwrap_or(0.0);
            tokio::select! {
                () = ctx.cancel.cancelled() => Err(AgentError::Canceled { reason: "task canceled".into() }),
                () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => Ok(json!("waited")),
            }
        },
    );
    Agent::builder(card())
        .instructions("Follow the TCK scenario named by the messageId prefix.")
        .llm(ScenarioModel { delay })
        .negotiator(ScenarioNegotiator)
        .tool(wait)
        .build()
}

const WAIT_TOOL: &str = "wait";

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
            Some(Scenario::Unsupported(prefix)) => Negotiation::Reject {
                reason: format!("the scenario `{prefix}` is not supported by this agent"),
            },
            _ => Negotiation::Accept { skill: None },
        })
    }
}

/// A scripted model: it answers as the scenario of the latest user message's `messageId`
/// says, calling the `wait` tool first for the scenarios that stay working.
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
        // A tool result after the message means the wait is over.
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
        match scenario(message_id) {
            Some(Scenario::DelayedComplete) if !waited => wait(self.delay.as_secs_f64()),
            Some(Scenario::LongRunning) if !waited => wait(LONG_RUNNING.as_secs_f64()),
            Some(Scenario::DelayedComplete) => Ok(LlmResponse::text(DELAYED_TEXT)),
            Some(Scenario::ArtifactText) => Ok(LlmResponse::text(ARTIFACT_TEXT)),
            // Only the follow-up reaches the model: the first message waits for input.
            Some(Scenario::InputRequired) => Ok(LlmResponse::text(INPUT_RECEIVED_TEXT)),
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
            Some(Scenario::Unsupported("tck-artifact-file-url"))
        );
        assert_eq!(
            scenario("tck-artifact-file-1"),
            Some(Scenario::Unsupported("tck-artifact-file"))
        );
        assert_eq!(scenario("tck-artifact"), None);
        assert_eq!(scenario(""), None);
    }
}
