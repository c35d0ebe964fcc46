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
/// fails closed: policy is the gate for side effects), and so does a skill the card does not
/// have, without a skill. This is the default negotiator of an agent with skills, on the
/// runtime's default model ([`Agent::negotiator_for`](crate::Agent::negotiator_for)).
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
            Some(v) => Negotiation::Accept {
                // Only a skill the card declares: a made-up one would be recorded as chosen.
                skill: v
                    .skill
                    .filter(|id| card.skills.iter().any(|skill| &skill.id == id)),
            },
            None => Negotiation::Accept { skill: None },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_core::AgentSkill;
    use keel_llm::{MockLlm, MockResponse};

    use super::*;

    fn card() -> AgentCard {
        AgentCard::new("desk", "a help desk", "http://127.0.0.1:0")
            .with_skill(AgentSkill::new("translate", "Translates text"))
            .with_skill(AgentSkill::new("summarize", "Summarizes text"))
    }

    async fn verdict(answer: &str) -> (Negotiation, Arc<MockLlm>) {
        let llm = Arc::new(MockLlm::scripted(vec![MockResponse::Text(answer.into())]));
        let negotiation = LlmNegotiator::new(llm.clone())
            .negotiate(&card(), &Message::user("say hello in French"))
            .await
            .unwrap();
        (negotiation, llm)
    }

    #[tokio::test]
    async fn the_model_sees_the_skills_and_chooses_one() {
        let (negotiation, llm) = verdict(r#"{"decision": "accept", "skill": "translate"}"#).await;
        assert_eq!(
            negotiation,
            Negotiation::Accept {
                skill: Some("translate".into())
            }
        );
        let request = &llm.requests()[0];
        let shown = format!("{:?}", request.messages);
        assert!(
            shown.contains("translate") && shown.contains("summarize"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn a_skill_the_card_lacks_or_an_unreadable_answer_accepts_without_a_skill() {
        for answer in [
            r#"{"decision": "accept", "skill": "juggle"}"#,
            "I think translate fits",
        ] {
            assert_eq!(verdict(answer).await.0, Negotiation::Accept { skill: None });
        }
        assert!(matches!(
            verdict(r#"{"decision": "reject", "reason": "not ours"}"#).await.0,
            Negotiation::Reject { reason } if reason == "not ours"
        ));
    }
}
