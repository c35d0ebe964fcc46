//! Negotiation (seed 002's `Negotiator`): before a task starts, decide whether the agent
//! takes the message on (and with which skill), asks for more input, or rejects it.

use async_trait::async_trait;
use keel_core::{AgentCard, AgentResult, Message};
use keel_llm::{Llm, LlmMessage, LlmRequest};
use serde::Deserialize;

/// What to do with an incoming message.
#[derive(Debug, Clone, PartialEq)]
pub enum Negotiation {
    /// Start the task, optionally for one of the card's skills (kept in `metadata.skill`).
    Accept {
        /// The skill chosen, if any.
        skill: Option<String>,
    },
    /// Ask the sender for more before starting: the task waits in `input-required`.
    AskInput {
        /// The question.
        question: String,
    },
    /// Ask the sender to authorize before starting: the task waits in `auth-required`, and
    /// the next message to it (carrying the credentials the agent asked for) starts it.
    AskAuth {
        /// What the agent needs.
        request: String,
    },
    /// Refuse: the task ends `rejected`.
    Reject {
        /// Why.
        reason: String,
    },
    /// Answer at once with this message and create no task (A2A's `SendMessageResponse`
    /// holding a `Message`): for requests that need no tracked work. Nothing is stored; the
    /// engine sends the reply as the agent's, in the message's thread (a new one when the
    /// message names none). See [`crate::AgentExecutor::send`].
    Reply {
        /// The reply (its role, ids and thread are set by the engine).
        message: Message,
    },
}

/// Decides about each new task's first message.
#[async_trait]
pub trait Negotiator: Send + Sync {
    /// Look at `message` for the agent described by `card`.
    async fn negotiate(&self, card: &AgentCard, message: &Message) -> AgentResult<Negotiation>;
}

/// Accepts everything (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAll;

#[async_trait]
impl Negotiator for AcceptAll {
    async fn negotiate(&self, _card: &AgentCard, _message: &Message) -> AgentResult<Negotiation> {
        Ok(Negotiation::Accept { skill: None })
    }
}

/// Asks a model, showing it the agent card ([`AgentCard::prompt_format`]) and the message,
/// for a JSON verdict `{"decision": "accept"|"ask"|"reject", "skill"?, "question"?,
/// "reason"?}`. An answer it cannot read accepts (the model is advisory, not a gate that
/// fails closed: policy is the gate for side effects).
pub struct LlmNegotiator {
    llm: std::sync::Arc<dyn Llm>,
}

impl LlmNegotiator {
    /// Negotiate with `llm` (typically the runtime's default model).
    pub fn new(llm: std::sync::Arc<dyn Llm>) -> Self {
        Self { llm }
    }
}

#[derive(Deserialize)]
struct Verdict {
    decision: String,
    #[serde(default)]
    skill: Option<String>,
    #[serde(default)]
    question: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

#[async_trait]
impl Negotiator for LlmNegotiator {
    async fn negotiate(&self, card: &AgentCard, message: &Message) -> AgentResult<Negotiation> {
        let system = format!(
            "You route requests for this agent:\n{}\nAnswer only with JSON: \
             {{\"decision\": \"accept\" | \"ask\" | \"reject\", \"skill\": skill id, \
             \"question\": what to ask, \"reason\": why}}.",
            card.prompt_format()
        );
        let request = LlmRequest::new(vec![
            LlmMessage::system(system),
            LlmMessage::user(message.text()),
        ]);
        let answer = self
            .llm
            .complete(request)
            .await?
            .content
            .unwrap_or_default();
        let verdict: Option<Verdict> = serde_json::from_str(answer.trim()).ok();
        Ok(match verdict {
            Some(v) if v.decision == "reject" => Negotiation::Reject {
                reason: v
                    .reason
                    .unwrap_or_else(|| "the agent does not handle this request".into()),
            },
            Some(v) if v.decision == "ask" => Negotiation::AskInput {
                question: v
                    .question
                    .unwrap_or_else(|| "Could you tell me more?".into()),
            },
            Some(v) => Negotiation::Accept { skill: v.skill },
            None => Negotiation::Accept { skill: None },
        })
    }
}
