//! [`ActionAuthorizer`]: the one gate every side-effecting action passes before it runs.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::{
    ActionId, AgentError, AgentResult, ApprovalDecision, ApprovalOutcome, ApprovalRequest,
    RunAction, RunContext,
};

use crate::{permissions_decision, ApprovalHandler, Policy, PolicyDecision};

/// What happened while authorizing an action that was allowed to run.
///
/// The engine emits events from it (or, live, from an [`AuthorizationObserver`]):
/// `action.policy` from `decision`, `approval.required` from `approval_request`,
/// `approval.decided` from `approval`.
#[derive(Debug, Clone, PartialEq)]
pub struct Authorization {
    /// The action authorized.
    pub action_id: ActionId,
    /// The combined decision of the agent's policy and the run's permissions.
    pub decision: PolicyDecision,
    /// The approval request, when the decision required one.
    pub approval_request: Option<ApprovalRequest>,
    /// The approver's (approving) decision, when one was needed.
    pub approval: Option<ApprovalDecision>,
}

/// Hears each checkpoint of an authorization as it happens, so the engine can emit
/// `action.policy`, `approval.required` (before a possibly long wait for a human) and
/// `approval.decided` in order. Every method defaults to doing nothing.
///
/// An error returned by the observer stops the authorization and the action does not run
/// (fail closed): an action whose checkpoints could not be recorded must not happen.
#[async_trait]
pub trait AuthorizationObserver: Send + Sync {
    /// The combined policy decision is known.
    async fn policy_decided(
        &self,
        _action: &RunAction,
        _decision: &PolicyDecision,
    ) -> AgentResult<()> {
        Ok(())
    }

    /// An approval request was created and is about to be handed to the handler (or, with
    /// no handler, returned inside [`AgentError::ApprovalRequired`]).
    async fn approval_required(&self, _request: &ApprovalRequest) -> AgentResult<()> {
        Ok(())
    }

    /// The handler answered `request` (with a correctly correlated decision).
    async fn approval_decided(
        &self,
        _request: &ApprovalRequest,
        _decision: &ApprovalDecision,
    ) -> AgentResult<()> {
        Ok(())
    }
}

/// An [`AuthorizationObserver`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl AuthorizationObserver for NoObserver {}

/// Decides whether an action may run: the agent's [`Policy`], narrowed by the run's
/// permissions, then the application's [`ApprovalHandler`] when approval is required.
///
/// | combined decision | handler | result |
/// |---|---|---|
/// | allow | – | `Ok(Authorization)` |
/// | deny | – | [`AgentError::ActionDenied`] |
/// | require approval | none | [`AgentError::ApprovalRequired`] carrying the request (fail closed) |
/// | require approval | approves | `Ok(Authorization)` with request and decision |
/// | require approval | denies | [`AgentError::ActionDenied`] with the approver's reason |
/// | require approval | answers another request id, or errors | an error; the action does not run |
///
/// ```
/// use keel_core::{RunAction, RunContext};
/// use keel_policy::{approve_request, ActionAuthorizer, ApprovalFn, CapabilityPolicy, CapabilityRule};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let authorizer = ActionAuthorizer::new(
///     CapabilityPolicy::new().with_rule("records.write", CapabilityRule::RequireApproval),
/// )
/// .with_approval_handler(ApprovalFn::new(|request, _ctx| async move {
///     Ok(approve_request(&request, "operator"))
/// }));
/// let mut action = RunAction::tool_call("publish_record", serde_json::json!({"id": 42}));
/// action.capabilities = vec!["records.write".into()];
/// let authorization = authorizer.authorize(&action, &RunContext::new()).await?;
/// assert!(authorization.approval.is_some());
/// # Ok::<(), keel_core::AgentError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct ActionAuthorizer {
    policy: Arc<dyn Policy>,
    handler: Option<Arc<dyn ApprovalHandler>>,
}

impl std::fmt::Debug for ActionAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionAuthorizer")
            .field("has_approval_handler", &self.handler.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ActionAuthorizer {
    /// Allow-by-default capability policy, no approval handler.
    fn default() -> Self {
        Self::new(crate::CapabilityPolicy::new())
    }
}

impl ActionAuthorizer {
    /// An authorizer for `policy` with no approval handler.
    pub fn new(policy: impl Policy + 'static) -> Self {
        Self {
            policy: Arc::new(policy),
            handler: None,
        }
    }

    /// An authorizer sharing an existing policy.
    pub fn from_arc(policy: Arc<dyn Policy>) -> Self {
        Self {
            policy,
            handler: None,
        }
    }

    /// Ask `handler` when an action requires approval.
    #[must_use]
    pub fn with_approval_handler(mut self, handler: impl ApprovalHandler + 'static) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Ask a shared `handler` when an action requires approval.
    #[must_use]
    pub fn with_approval_handler_arc(mut self, handler: Arc<dyn ApprovalHandler>) -> Self {
        self.handler = Some(handler);
        self
    }

    /// Whether an approval handler is configured.
    pub fn has_approval_handler(&self) -> bool {
        self.handler.is_some()
    }

    /// The combined decision, without asking anyone: the agent's policy and the run's
    /// [`permissions`](RunContext::permissions) (see [`permissions_decision`]), the most
    /// restrictive winning. The policy's reason is kept on a tie.
    pub async fn evaluate(&self, action: &RunAction, context: &RunContext) -> PolicyDecision {
        let agent = self.policy.evaluate(action, context).await;
        agent.most_restrictive(permissions_decision(action, context))
    }

    /// Authorize `action`; see the type's table for the outcomes.
    pub async fn authorize(
        &self,
        action: &RunAction,
        context: &RunContext,
    ) -> AgentResult<Authorization> {
        self.authorize_observed(action, context, &NoObserver).await
    }

    /// [`authorize`](Self::authorize), telling `observer` about each checkpoint as it
    /// happens (the engine's hook for live events).
    pub async fn authorize_observed(
        &self,
        action: &RunAction,
        context: &RunContext,
        observer: &dyn AuthorizationObserver,
    ) -> AgentResult<Authorization> {
        let decision = self.evaluate(action, context).await;
        observer.policy_decided(action, &decision).await?;
        let reason = match &decision {
            PolicyDecision::Allow => {
                return Ok(Authorization {
                    action_id: action.id.clone(),
                    decision,
                    approval_request: None,
                    approval: None,
                })
            }
            PolicyDecision::Deny { reason, .. } => {
                return Err(AgentError::ActionDenied {
                    action_id: action.id.clone(),
                    reason: reason.clone(),
                })
            }
            PolicyDecision::RequireApproval { reason, .. } => reason.clone(),
        };

        let request = ApprovalRequest {
            request_id: uuid::Uuid::new_v4().to_string(),
            action: action.clone(),
            reason,
            run_id: Some(context.run_id.clone()),
            requested_at: Utc::now(),
        };
        observer.approval_required(&request).await?;
        let Some(handler) = &self.handler else {
            // Nobody in-process can approve: fail closed, handing the request back so the
            // application can ask out of band and retry with a decision.
            return Err(AgentError::ApprovalRequired {
                request: Box::new(request),
            });
        };

        let approval = handler.decide(&request, context).await?;
        if approval.request_id != request.request_id {
            // A decision meant for another request proves nothing about this one.
            return Err(AgentError::invalid_input(
                "approval_decision.request_id",
                format!(
                    "decision answers request `{}` but `{}` was asked; action not run",
                    approval.request_id, request.request_id
                ),
            ));
        }
        observer.approval_decided(&request, &approval).await?;
        match approval.outcome {
            ApprovalOutcome::Approved => Ok(Authorization {
                action_id: action.id.clone(),
                decision,
                approval_request: Some(request),
                approval: Some(approval),
            }),
            ApprovalOutcome::Denied => Err(AgentError::ActionDenied {
                action_id: action.id.clone(),
                reason: approval
                    .reason
                    .clone()
                    .unwrap_or_else(|| "denied by approver".to_owned()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{approve_request, deny_request, ApprovalFn, CapabilityPolicy, CapabilityRule};
    use keel_core::ErrorKind;
    use serde_json::json;

    fn action(caps: &[&str]) -> RunAction {
        let mut action = RunAction::tool_call("publish_record", json!({"record_id": "42"}));
        action.capabilities = caps.iter().map(|c| (*c).to_owned()).collect();
        action
    }

    fn policy() -> CapabilityPolicy {
        CapabilityPolicy::new()
            .with_rule("records.read", CapabilityRule::Allow)
            .with_rule("records.write", CapabilityRule::RequireApproval)
            .with_rule("records.delete", CapabilityRule::Deny)
    }

    fn approving() -> ApprovalFn<
        impl Fn(ApprovalRequest, RunContext) -> std::future::Ready<AgentResult<ApprovalDecision>>,
    > {
        ApprovalFn::new(|r: ApprovalRequest, _| std::future::ready(Ok(approve_request(&r, "op"))))
    }

    /// A `records.write` action, which needs approval, decided by `handler`.
    async fn write_decided_by(
        handler: impl ApprovalHandler + 'static,
    ) -> AgentResult<Authorization> {
        ActionAuthorizer::new(policy())
            .with_approval_handler(handler)
            .authorize(&action(&["records.write"]), &RunContext::new())
            .await
    }

    #[tokio::test]
    async fn allowed_action_is_authorized_without_approval() {
        let auth = ActionAuthorizer::new(policy())
            .authorize(&action(&["records.read"]), &RunContext::new())
            .await
            .unwrap();
        assert!(auth.decision.is_allow());
        assert!(auth.approval_request.is_none());
    }

    #[tokio::test]
    async fn denied_action_is_action_denied() {
        let a = action(&["records.read", "records.delete"]);
        let err = ActionAuthorizer::new(policy())
            .with_approval_handler(approving())
            .authorize(&a, &RunContext::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied);
        assert!(
            matches!(err, AgentError::ActionDenied { ref action_id, ref reason }
                if *action_id == a.id && reason.contains("records.delete"))
        );
    }

    #[tokio::test]
    async fn approval_without_handler_fails_closed_with_serializable_request() {
        let a = action(&["records.write"]);
        let ctx = RunContext::new();
        let err = ActionAuthorizer::new(policy())
            .authorize(&a, &ctx)
            .await
            .unwrap_err();
        let AgentError::ApprovalRequired { request } = err else {
            panic!("expected ApprovalRequired, got {err:?}");
        };
        assert_eq!(request.action, a);
        assert_eq!(request.run_id, Some(ctx.run_id.clone()));
        assert!(request.reason.contains("records.write"));
        let json = serde_json::to_string(&*request).unwrap();
        let back: ApprovalRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, *request);
    }

    #[tokio::test]
    async fn approved_action_records_request_and_decision() {
        let auth = write_decided_by(approving()).await.unwrap();
        assert_eq!(auth.decision.as_str(), "require_approval");
        let request = auth.approval_request.unwrap();
        let approval = auth.approval.unwrap();
        assert_eq!(approval.request_id, request.request_id);
        assert_eq!(approval.outcome, ApprovalOutcome::Approved);
    }

    #[tokio::test]
    async fn denied_decision_is_action_denied_with_approver_reason() {
        let handler = ApprovalFn::new(|r: ApprovalRequest, _| async move {
            Ok(deny_request(&r, "not on a friday"))
        });
        let err = write_decided_by(handler).await.unwrap_err();
        assert!(
            matches!(err, AgentError::ActionDenied { ref reason, .. } if reason == "not on a friday")
        );
    }

    #[tokio::test]
    async fn decision_for_another_request_is_rejected() {
        let handler = ApprovalFn::new(|r: ApprovalRequest, _| async move {
            let mut decision = approve_request(&r, "op");
            decision.request_id = "someone-else".into();
            Ok(decision)
        });
        let err = write_decided_by(handler).await.unwrap_err();
        assert!(
            matches!(err, AgentError::InvalidInput { ref field, .. } if field == "approval_decision.request_id"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn handler_error_stops_the_action() {
        let handler = ApprovalFn::new(|_r: ApprovalRequest, _| async move {
            Err::<ApprovalDecision, _>(AgentError::internal("approval service down"))
        });
        let err = write_decided_by(handler).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal);
    }

    #[tokio::test]
    async fn permissions_narrow_the_agent_policy() {
        let mut ctx = RunContext::new();
        ctx.permissions.insert("records.read".into(), json!(false));
        let err = ActionAuthorizer::new(policy())
            .authorize(&action(&["records.read"]), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied);

        let mut ctx = RunContext::new();
        ctx.permissions
            .insert("records.*".into(), json!("require_approval"));
        let decision = ActionAuthorizer::new(policy())
            .evaluate(&action(&["records.read"]), &ctx)
            .await;
        assert_eq!(decision.as_str(), "require_approval");
    }

    #[tokio::test]
    async fn permissions_cannot_widen_the_agent_policy() {
        let mut ctx = RunContext::new();
        for (cap, value) in [
            ("records.write", json!("allow")),
            ("records.delete", json!(true)),
            ("*", json!("allow")),
        ] {
            ctx.permissions.insert(cap.into(), value);
        }
        let authorizer = ActionAuthorizer::new(policy());
        // The agent requires approval for writes: a task saying "allow" changes nothing.
        let err = authorizer
            .authorize(&action(&["records.write"]), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ApprovalRequired);
        // The agent denies deletes: a task saying `true` changes nothing.
        let err = authorizer
            .authorize(&action(&["records.delete"]), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied);
        // A default-deny agent policy is not widened by a `*` permission either.
        let strict =
            ActionAuthorizer::new(CapabilityPolicy::new().with_default(CapabilityRule::Deny));
        let err = strict
            .authorize(&action(&["mail.send"]), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied);
    }

    #[derive(Default)]
    struct Recording(Mutex<Vec<String>>);

    #[async_trait]
    impl AuthorizationObserver for Recording {
        async fn policy_decided(&self, _: &RunAction, d: &PolicyDecision) -> AgentResult<()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("action.policy:{}", d.as_str()));
            Ok(())
        }
        async fn approval_required(&self, _: &ApprovalRequest) -> AgentResult<()> {
            self.0.lock().unwrap().push("approval.required".into());
            Ok(())
        }
        async fn approval_decided(
            &self,
            _: &ApprovalRequest,
            d: &ApprovalDecision,
        ) -> AgentResult<()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("approval.decided:{:?}", d.outcome));
            Ok(())
        }
    }

    #[tokio::test]
    async fn observer_hears_each_checkpoint_in_order() {
        let observer = Recording::default();
        ActionAuthorizer::new(policy())
            .with_approval_handler(approving())
            .authorize_observed(&action(&["records.write"]), &RunContext::new(), &observer)
            .await
            .unwrap();
        assert_eq!(
            *observer.0.lock().unwrap(),
            [
                "action.policy:require_approval",
                "approval.required",
                "approval.decided:Approved"
            ]
        );
        // Without a handler the request is still announced before failing closed.
        let observer = Recording::default();
        let _ = ActionAuthorizer::new(policy())
            .authorize_observed(&action(&["records.write"]), &RunContext::new(), &observer)
            .await;
        assert_eq!(
            *observer.0.lock().unwrap(),
            ["action.policy:require_approval", "approval.required"]
        );
    }
}
