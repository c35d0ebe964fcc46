//! The [`Policy`] trait and the three-way [`PolicyDecision`] it returns.

use async_trait::async_trait;
use keel_core::{RunAction, RunContext};
use serde::{Deserialize, Serialize};

/// What a policy says about one action.
///
/// The serde form is the payload shape of the `action.policy` event:
/// `{"decision": "deny", "reason": "...", "capability": "records.delete"}`.
///
/// ```
/// use keel_policy::PolicyDecision;
/// let deny = PolicyDecision::deny("no deletes", Some("records.delete".into()));
/// let approve = PolicyDecision::require_approval("writes need a human", None);
/// // Deny outranks require_approval, which outranks allow.
/// assert_eq!(approve.clone().most_restrictive(deny.clone()), deny);
/// assert_eq!(PolicyDecision::Allow.most_restrictive(approve.clone()), approve);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum PolicyDecision {
    /// The action may run.
    Allow,
    /// The action must not run.
    Deny {
        /// Why, for the model, the user and the event log.
        reason: String,
        /// The capability that caused the denial, when one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        capability: Option<String>,
    },
    /// The action may run only after an approver says yes.
    RequireApproval {
        /// Why approval is needed; shown to the approver.
        reason: String,
        /// The capability that caused it, when one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        capability: Option<String>,
    },
}

impl PolicyDecision {
    /// Shorthand for [`PolicyDecision::Deny`].
    pub fn deny(reason: impl Into<String>, capability: Option<String>) -> Self {
        Self::Deny {
            reason: reason.into(),
            capability,
        }
    }

    /// Shorthand for [`PolicyDecision::RequireApproval`].
    pub fn require_approval(reason: impl Into<String>, capability: Option<String>) -> Self {
        Self::RequireApproval {
            reason: reason.into(),
            capability,
        }
    }

    /// `allow`, `deny` or `require_approval`: the decision's name in events and config.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny { .. } => "deny",
            Self::RequireApproval { .. } => "require_approval",
        }
    }

    /// Whether the action may run without further checks.
    pub fn is_allow(&self) -> bool {
        matches!(self, Self::Allow)
    }

    /// The reason, for deny and require-approval decisions.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Allow => None,
            Self::Deny { reason, .. } | Self::RequireApproval { reason, .. } => Some(reason),
        }
    }

    /// The capability that caused the decision, when one did.
    pub fn capability(&self) -> Option<&str> {
        match self {
            Self::Allow => None,
            Self::Deny { capability, .. } | Self::RequireApproval { capability, .. } => {
                capability.as_deref()
            }
        }
    }

    /// How restrictive the decision is: allow < require approval < deny.
    fn severity(&self) -> u8 {
        match self {
            Self::Allow => 0,
            Self::RequireApproval { .. } => 1,
            Self::Deny { .. } => 2,
        }
    }

    /// The more restrictive of two decisions. On a tie the first (`self`) is kept, so the
    /// reason reported is the one found first.
    #[must_use]
    pub fn most_restrictive(self, other: PolicyDecision) -> PolicyDecision {
        if other.severity() > self.severity() {
            other
        } else {
            self
        }
    }
}

/// Judges whether a prepared action may run.
///
/// Implement it when capability names are not enough: when the decision depends on the
/// resource in the action's payload, the tenant, the time, or a preview artifact. The
/// [`ActionAuthorizer`](crate::ActionAuthorizer) still narrows the result by the run's
/// permissions, so a custom policy cannot be widened by a task either.
///
/// ```
/// use async_trait::async_trait;
/// use keel_core::{RunAction, RunContext};
/// use keel_policy::{Policy, PolicyDecision};
///
/// /// Refuses writes outside the run's workspace.
/// struct WorkspaceOnly;
///
/// #[async_trait]
/// impl Policy for WorkspaceOnly {
///     async fn evaluate(&self, action: &RunAction, context: &RunContext) -> PolicyDecision {
///         let path = action.payload["path"].as_str().unwrap_or_default();
///         match &context.workspace_uri {
///             Some(root) if path.starts_with(root.as_str()) => PolicyDecision::Allow,
///             _ => PolicyDecision::deny(format!("{path} is outside the workspace"), None),
///         }
///     }
/// }
/// ```
#[async_trait]
pub trait Policy: Send + Sync {
    /// Decide about `action`, about to run inside `context`.
    async fn evaluate(&self, action: &RunAction, context: &RunContext) -> PolicyDecision;
}

#[async_trait]
impl<P: Policy + ?Sized> Policy for std::sync::Arc<P> {
    async fn evaluate(&self, action: &RunAction, context: &RunContext) -> PolicyDecision {
        (**self).evaluate(action, context).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_serializes_with_its_name_as_tag() {
        let json = serde_json::to_value(PolicyDecision::require_approval(
            "writes",
            Some("records.write".into()),
        ))
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"decision": "require_approval", "reason": "writes", "capability": "records.write"})
        );
        assert_eq!(
            serde_json::to_value(PolicyDecision::Allow).unwrap(),
            serde_json::json!({"decision": "allow"})
        );
        let back: PolicyDecision = serde_json::from_value(json).unwrap();
        assert_eq!(back.as_str(), "require_approval");
    }

    #[test]
    fn ties_keep_the_first_reason() {
        let a = PolicyDecision::deny("first", None);
        let b = PolicyDecision::deny("second", None);
        assert_eq!(a.clone().most_restrictive(b), a);
    }
}
