//! The approval data part: how a message answers an action waiting for approval, so that any
//! A2A client can approve or deny by sending a message to the waiting task
//! (`docs/approvals.md`).
//!
//! The part is a data part holding one key, [`APPROVAL_PART_KEY`]:
//! `{"approval": {"requestId": "...", "decision": "approve" | "deny", "reason": "..."}}`.

use chrono::Utc;
use keel_core::{AgentError, AgentResult, ApprovalDecision, ApprovalOutcome, Message, Part};
use keel_core::{PartContent, Role};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The key of a data part that carries an approval decision.
pub const APPROVAL_PART_KEY: &str = "approval";

/// Message metadata key the engine sets on a message it took as an approval decision. Such a
/// message stays in the task's history (A2A callers see what they sent, and a stream follows
/// the turn it began) but never joins the model's conversation: the decision reaches the
/// model as the tool's result, or its refusal.
pub(crate) const DECISION_MESSAGE_KEY: &str = "keel.approval_decision";

/// The approver's verdict, as the part spells it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Approve,
    Deny,
}

/// The part's `approval` object.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApprovalAnswer {
    request_id: String,
    decision: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// The data part that answers the pending approval request `request_id`.
///
/// ```
/// use keel_agent::{approval_part, APPROVAL_PART_KEY};
/// use keel_core::ApprovalOutcome;
/// let part = approval_part("req-1", ApprovalOutcome::Denied, Some("not today"));
/// let json = serde_json::to_value(&part).unwrap();
/// assert_eq!(json["data"][APPROVAL_PART_KEY]["decision"], "deny");
/// assert_eq!(json["data"][APPROVAL_PART_KEY]["requestId"], "req-1");
/// ```
pub fn approval_part(request_id: &str, outcome: ApprovalOutcome, reason: Option<&str>) -> Part {
    let answer = ApprovalAnswer {
        request_id: request_id.to_owned(),
        decision: match outcome {
            ApprovalOutcome::Approved => Verdict::Approve,
            ApprovalOutcome::Denied => Verdict::Deny,
        },
        reason: reason.map(str::to_owned),
    };
    let mut data = serde_json::Map::new();
    data.insert(
        APPROVAL_PART_KEY.into(),
        serde_json::to_value(answer).unwrap_or(Value::Null),
    );
    Part::data(Value::Object(data))
}

/// The index and `approval` object of the message's approval part, if it has one.
pub(crate) fn find(message: &Message) -> Option<(usize, &Value)> {
    message
        .parts
        .iter()
        .enumerate()
        .find_map(|(i, part)| match &part.content {
            PartContent::Data { data } => data.get(APPROVAL_PART_KEY).map(|v| (i, v)),
            _ => None,
        })
}

/// The decision `message` carries: its only part must be the approval part (remarks go in
/// `reason`, since nothing else of the message reaches the model). `decided_by` is the
/// caller's principal.
pub(crate) fn decision_of(message: &Message, decided_by: &str) -> AgentResult<ApprovalDecision> {
    let Some((index, value)) = find(message) else {
        return Err(AgentError::invalid_input(
            "message.parts",
            format!("the task waits for an approval decision: send a data part `{{\"{APPROVAL_PART_KEY}\": {{\"requestId\": ..., \"decision\": \"approve\" | \"deny\"}}}}`"),
        ));
    };
    let field = format!("message.parts[{index}].data.{APPROVAL_PART_KEY}");
    if message.parts.len() != 1 {
        return Err(AgentError::invalid_input(
            "message.parts",
            "a message answering an approval carries only its approval part; put remarks in `reason`",
        ));
    }
    let answer = ApprovalAnswer::deserialize(value)
        .map_err(|err| AgentError::invalid_input(field, err.to_string()))?;
    Ok(ApprovalDecision {
        request_id: answer.request_id,
        outcome: match answer.decision {
            Verdict::Approve => ApprovalOutcome::Approved,
            Verdict::Deny => ApprovalOutcome::Denied,
        },
        reason: answer.reason,
        decided_by: Some(decided_by.to_owned()),
        decided_at: Utc::now(),
    })
}

/// Whether the engine took `message` as an approval decision.
pub(crate) fn is_decision_message(message: &Message) -> bool {
    message.role == Role::User && message.metadata.contains_key(DECISION_MESSAGE_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(parts: Vec<Part>) -> Message {
        Message::new(Role::User, parts)
    }

    #[test]
    fn a_built_part_reads_back_as_its_decision() {
        let part = approval_part("r-1", ApprovalOutcome::Approved, None);
        let decision = decision_of(&message(vec![part]), "alice").unwrap();
        assert_eq!(decision.request_id, "r-1");
        assert_eq!(decision.outcome, ApprovalOutcome::Approved);
        assert_eq!(decision.decided_by.as_deref(), Some("alice"));
        assert_eq!(decision.reason, None);
    }

    #[test]
    fn a_malformed_approval_names_its_field() {
        let bad = Part::data(json!({"approval": {"requestId": "r", "decision": "maybe"}}));
        let err = decision_of(&message(vec![Part::text("x"), bad]), "a").unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, .. } if field == "message.parts"),
            "{err:?}"
        );
        let bad = Part::data(json!({"approval": {"requestId": "r", "decision": "maybe"}}));
        let err = decision_of(&message(vec![bad]), "a").unwrap_err();
        assert!(
            matches!(&err, AgentError::InvalidInput { field, reason }
                if field == "message.parts[0].data.approval" && reason.contains("maybe")),
            "{err:?}"
        );
    }

    #[test]
    fn a_message_without_an_approval_part_is_no_decision() {
        let err = decision_of(&message(vec![Part::text("yes please")]), "a").unwrap_err();
        assert!(matches!(err, AgentError::InvalidInput { .. }), "{err:?}");
        assert!(find(&message(vec![Part::data(json!({"other": 1}))])).is_none());
    }
}
