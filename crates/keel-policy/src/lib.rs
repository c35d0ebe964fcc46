//! Keel's action policy: whether a prepared [`RunAction`](keel_core::RunAction) may run, how
//! an application approves it, and whether the run is still inside its budget.
//!
//! The pieces, in the order the engine meets them:
//!
//! - [`Policy`] judges one action in its [`RunContext`](keel_core::RunContext) and returns a
//!   [`PolicyDecision`]: allow, deny, or require approval. [`CapabilityPolicy`] is the
//!   built-in one: rules by capability name with namespace wildcards (`records.*`).
//! - [`ActionAuthorizer`] combines the agent's policy with the run's own
//!   [`permissions`](keel_core::RunContext::permissions) by the most restrictive result (a
//!   task can narrow the agent's authority, never widen it), asks the application's
//!   [`ApprovalHandler`] when approval is required, and fails closed when there is none.
//! - [`BudgetEnforcer`] applies a [`RunBudget`](keel_core::RunBudget) at the points where a
//!   step, a model call or a tool call is about to happen.
//!
//! ```
//! use keel_core::{RunAction, RunContext};
//! use keel_policy::{ActionAuthorizer, CapabilityPolicy, CapabilityRule};
//! # tokio_test_block(async {
//! let policy = CapabilityPolicy::new()
//!     .with_rule("records.read", CapabilityRule::Allow)
//!     .with_rule("records.*", CapabilityRule::RequireApproval);
//! let authorizer = ActionAuthorizer::new(policy);
//!
//! let mut action = RunAction::tool_call("publish_record", serde_json::json!({"id": 42}));
//! action.capabilities = vec!["records.write".into()];
//! // No approval handler is configured, so the action fails closed and the error carries
//! // the request an application could answer out of band.
//! let err = authorizer.authorize(&action, &RunContext::new()).await.unwrap_err();
//! assert!(matches!(err, keel_core::AgentError::ApprovalRequired { .. }));
//! # });
//! # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

mod approval;
mod authorizer;
mod budget;
mod capability;
mod decision;

pub use approval::{approve_request, deny_request, ApprovalFn, ApprovalHandler};
pub use authorizer::{ActionAuthorizer, Authorization, AuthorizationObserver, NoObserver};
pub use budget::{
    BudgetEnforcer, BudgetPolicy, BudgetPolicyFactory, BudgetWarning, Clock, EnforceBudget,
    ManualClock, SystemClock, DEFAULT_WARNING_FRACTION,
};
pub use capability::{permissions_decision, CapabilityPolicy, CapabilityRule};
pub use decision::{Policy, PolicyDecision};
