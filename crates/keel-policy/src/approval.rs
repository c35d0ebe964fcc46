//! Approval checkpoints: the application-owned [`ApprovalHandler`] and helpers to answer
//! an [`ApprovalRequest`].
//!
//! Keel decides *whether* an approval-gated action may continue; the application decides
//! *how* the question is put (a terminal prompt, a web page, a chat message, a ticket).

use std::future::Future;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::{AgentResult, ApprovalDecision, ApprovalOutcome, ApprovalRequest, RunContext};

/// Answers approval requests. Owned by the application.
///
/// The handler sees the complete [`RunAction`](keel_core::RunAction) inside the request
/// (arguments, capabilities, preview artifact), so it can show the approver what will
/// actually happen. Its answer must carry the request's `request_id`; a decision for any
/// other request is rejected and the action does not run. Returning an error also stops
/// the action (fail closed).
///
/// Persist requests and decisions only after redaction (`keel-events`'
/// `RedactionPolicy`): action payloads often carry credentials.
#[async_trait]
pub trait ApprovalHandler: Send + Sync {
    /// Decide about `request`, raised inside the run described by `context`.
    async fn decide(
        &self,
        request: &ApprovalRequest,
        context: &RunContext,
    ) -> AgentResult<ApprovalDecision>;
}

#[async_trait]
impl<H: ApprovalHandler + ?Sized> ApprovalHandler for std::sync::Arc<H> {
    async fn decide(
        &self,
        request: &ApprovalRequest,
        context: &RunContext,
    ) -> AgentResult<ApprovalDecision> {
        (**self).decide(request, context).await
    }
}

/// An [`ApprovalHandler`] made from an async closure, for applications and tests that do
/// not need a type of their own. The closure gets owned copies so it can move them into
/// its future.
///
/// ```
/// use keel_core::{ApprovalRequest, RunContext};
/// use keel_policy::{approve_request, ActionAuthorizer, ApprovalFn, CapabilityPolicy};
/// let handler = ApprovalFn::new(|request: ApprovalRequest, _context: RunContext| async move {
///     Ok(approve_request(&request, "operator"))
/// });
/// let authorizer = ActionAuthorizer::new(CapabilityPolicy::new()).with_approval_handler(handler);
/// assert!(authorizer.has_approval_handler());
/// ```
pub struct ApprovalFn<F> {
    f: F,
}

impl<F> ApprovalFn<F> {
    /// Wrap `f`.
    pub fn new(f: F) -> Self {
        Self { f }
    }
}

impl<F> std::fmt::Debug for ApprovalFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApprovalFn")
    }
}

#[async_trait]
impl<F, Fut> ApprovalHandler for ApprovalFn<F>
where
    F: Fn(ApprovalRequest, RunContext) -> Fut + Send + Sync,
    Fut: Future<Output = AgentResult<ApprovalDecision>> + Send,
{
    async fn decide(
        &self,
        request: &ApprovalRequest,
        context: &RunContext,
    ) -> AgentResult<ApprovalDecision> {
        (self.f)(request.clone(), context.clone()).await
    }
}

/// An approving decision for `request`, made now by `decided_by`.
///
/// ```
/// # use keel_core::{ApprovalOutcome, ApprovalRequest, RunAction};
/// # let request = ApprovalRequest {
/// #     request_id: "r-1".into(),
/// #     action: RunAction::tool_call("t", serde_json::json!({})),
/// #     reason: "why".into(),
/// #     run_id: None,
/// #     requested_at: chrono::Utc::now(),
/// # };
/// let decision = keel_policy::approve_request(&request, "operator");
/// assert_eq!(decision.request_id, "r-1");
/// assert_eq!(decision.outcome, ApprovalOutcome::Approved);
/// ```
pub fn approve_request(
    request: &ApprovalRequest,
    decided_by: impl Into<String>,
) -> ApprovalDecision {
    ApprovalDecision {
        request_id: request.request_id.clone(),
        outcome: ApprovalOutcome::Approved,
        reason: None,
        decided_by: Some(decided_by.into()),
        decided_at: Utc::now(),
    }
}

/// A denying decision for `request`, with the reason the model and the user will see.
pub fn deny_request(request: &ApprovalRequest, reason: impl Into<String>) -> ApprovalDecision {
    ApprovalDecision {
        request_id: request.request_id.clone(),
        outcome: ApprovalOutcome::Denied,
        reason: Some(reason.into()),
        decided_by: None,
        decided_at: Utc::now(),
    }
}
