//! The built-in capability policy, and the run permissions that narrow it.
//!
//! Capabilities are opaque, dot-separated names chosen by the application
//! (`records.write`, `messages.send`). A rule's pattern is either an exact name, a namespace
//! wildcard `ns.*` (every name below `ns.`, at any depth, but not `ns` itself) or `*`
//! (every name). For one capability the most specific matching pattern wins: the exact
//! name, then the longest wildcard namespace, then `*`. A `*` anywhere else is an ordinary
//! character, so `rec*` only matches a capability literally named `rec*`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use keel_core::{Metadata, RunAction, RunContext};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Policy, PolicyDecision};

/// What a rule says about a capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapabilityRule {
    /// Actions needing the capability may run.
    Allow,
    /// Actions needing the capability may run once approved.
    RequireApproval,
    /// Actions needing the capability must not run.
    Deny,
}

impl CapabilityRule {
    /// `allow`, `require_approval` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::RequireApproval => "require_approval",
            Self::Deny => "deny",
        }
    }

    /// Read a rule from a permission value: the three names, or a boolean (`true` allows,
    /// `false` denies). Anything else is `None`; callers decide how to treat it.
    pub fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Bool(true) => Some(Self::Allow),
            Value::Bool(false) => Some(Self::Deny),
            Value::String(s) => match s.as_str() {
                "allow" => Some(Self::Allow),
                "require_approval" => Some(Self::RequireApproval),
                "deny" => Some(Self::Deny),
                _ => None,
            },
            _ => None,
        }
    }

    fn decision(self, reason: String, capability: Option<&str>) -> PolicyDecision {
        let capability = capability.map(str::to_owned);
        match self {
            Self::Allow => PolicyDecision::Allow,
            Self::RequireApproval => PolicyDecision::require_approval(reason, capability),
            Self::Deny => PolicyDecision::deny(reason, capability),
        }
    }
}

/// How specifically a pattern matches a capability; higher is more specific.
fn specificity(pattern: &str, capability: &str) -> Option<usize> {
    if pattern == capability {
        // Exact matches beat every wildcard, however long.
        return Some(usize::MAX);
    }
    if pattern == "*" {
        return Some(0);
    }
    let namespace = pattern.strip_suffix(".*")?;
    let rest = capability.strip_prefix(namespace)?;
    // `records.*` matches `records.write` but neither `records` nor `recordsx.write`.
    (rest.starts_with('.') && rest.len() > 1).then_some(namespace.len() + 1)
}

/// The most specific of `patterns` that matches `capability`.
fn best_match<'a, I>(patterns: I, capability: &str) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a String>,
{
    patterns
        .into_iter()
        .filter_map(|p| specificity(p, capability).map(|s| (s, p.as_str())))
        .max_by_key(|(s, _)| *s)
        .map(|(_, p)| p)
}

/// Rules by capability name, with a default for capabilities no rule matches.
///
/// Across all capabilities an action requires, the strongest result wins: deny outranks
/// require-approval, which outranks allow. An action that requires no capability gets the
/// default. The default is allow, so adding Keel to an application changes nothing until a
/// rule (or a run permission) protects a capability.
///
/// The serde form is a config-friendly object:
/// `{"default": "allow", "rules": {"records.*": "require_approval"}}`.
///
/// ```
/// use keel_core::{RunAction, RunContext};
/// use keel_policy::{CapabilityPolicy, CapabilityRule, Policy, PolicyDecision};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let policy = CapabilityPolicy::new()
///     .with_rule("records.*", CapabilityRule::RequireApproval)
///     .with_rule("records.read", CapabilityRule::Allow)
///     .with_rule("records.delete", CapabilityRule::Deny);
///
/// let mut action = RunAction::tool_call("sync", serde_json::json!({}));
/// action.capabilities = vec!["records.read".into(), "records.delete".into()];
/// let decision = policy.evaluate(&action, &RunContext::new()).await;
/// assert_eq!(decision.as_str(), "deny");
/// assert_eq!(decision.capability(), Some("records.delete"));
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityPolicy {
    /// The rule for capabilities no pattern matches (and for actions with none).
    #[serde(default = "default_rule")]
    pub default: CapabilityRule,
    /// Rules by pattern: exact names, `ns.*` wildcards, or `*`.
    #[serde(default)]
    pub rules: BTreeMap<String, CapabilityRule>,
}

fn default_rule() -> CapabilityRule {
    CapabilityRule::Allow
}

impl Default for CapabilityPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl CapabilityPolicy {
    /// A policy with no rules that allows everything.
    pub fn new() -> Self {
        Self {
            default: CapabilityRule::Allow,
            rules: BTreeMap::new(),
        }
    }

    /// Set the rule for `pattern` (replacing an earlier one for the same pattern).
    #[must_use]
    pub fn with_rule(mut self, pattern: impl Into<String>, rule: CapabilityRule) -> Self {
        self.rules.insert(pattern.into(), rule);
        self
    }

    /// Set the default rule.
    #[must_use]
    pub fn with_default(mut self, rule: CapabilityRule) -> Self {
        self.default = rule;
        self
    }

    /// The rule that applies to one capability, and the pattern that supplied it (`None`
    /// when the default applies).
    ///
    /// ```
    /// use keel_policy::{CapabilityPolicy, CapabilityRule};
    /// let policy = CapabilityPolicy::new()
    ///     .with_rule("*", CapabilityRule::Deny)
    ///     .with_rule("records.*", CapabilityRule::RequireApproval)
    ///     .with_rule("records.read", CapabilityRule::Allow);
    /// assert_eq!(policy.rule_for("records.read"), (CapabilityRule::Allow, Some("records.read")));
    /// assert_eq!(policy.rule_for("records.sub.x").0, CapabilityRule::RequireApproval);
    /// assert_eq!(policy.rule_for("mail.send"), (CapabilityRule::Deny, Some("*")));
    /// ```
    pub fn rule_for(&self, capability: &str) -> (CapabilityRule, Option<&str>) {
        match best_match(self.rules.keys(), capability) {
            Some(pattern) => (self.rules[pattern], Some(pattern)),
            None => (self.default, None),
        }
    }

    /// The decision for a set of capabilities, without a context (what
    /// [`Policy::evaluate`] returns for this policy).
    pub fn decide(&self, capabilities: &[String]) -> PolicyDecision {
        if capabilities.is_empty() {
            return self.default.decision(
                "the action requires no capability; default policy rule".into(),
                None,
            );
        }
        capabilities
            .iter()
            .map(|capability| {
                let (rule, pattern) = self.rule_for(capability);
                let source = match pattern {
                    Some(p) if p == capability => "policy rule".to_owned(),
                    Some(p) => format!("policy rule `{p}`"),
                    None => "default policy rule".to_owned(),
                };
                rule.decision(
                    format!("capability `{capability}` is {} by {source}", verb(rule)),
                    Some(capability),
                )
            })
            .fold(PolicyDecision::Allow, PolicyDecision::most_restrictive)
    }
}

fn verb(rule: CapabilityRule) -> &'static str {
    match rule {
        CapabilityRule::Allow => "allowed",
        CapabilityRule::RequireApproval => "approval-gated",
        CapabilityRule::Deny => "denied",
    }
}

#[async_trait]
impl Policy for CapabilityPolicy {
    async fn evaluate(&self, action: &RunAction, _context: &RunContext) -> PolicyDecision {
        self.decide(&action.capabilities)
    }
}

/// What a run's own [`permissions`](RunContext::permissions) say about an action.
///
/// Keys are capability patterns matched exactly like [`CapabilityPolicy`] rules (exact,
/// `ns.*`, `*`; the most specific wins). Values are `"allow"`, `"deny"`,
/// `"require_approval"`, `true` (allow) or `false` (deny). A capability no key matches is
/// not narrowed (allow), since the agent's policy already decides it.
///
/// **Fail closed:** any other value (an unknown string, a number, an object, `null`)
/// denies the capability it matches. A typo such as `"denied"` must never silently
/// grant what it meant to restrict; richer grants (`{"paths": [...]}`) belong to a
/// custom [`Policy`], which may read them from the context itself.
///
/// The [`ActionAuthorizer`](crate::ActionAuthorizer) combines this with the agent's policy
/// by the most restrictive result, so permissions narrow but never widen.
///
/// ```
/// use keel_core::{RunAction, RunContext};
/// use keel_policy::permissions_decision;
/// let mut context = RunContext::new();
/// context.permissions.insert("records.*".into(), false.into());
/// let mut action = RunAction::tool_call("publish", serde_json::json!({}));
/// action.capabilities = vec!["records.write".into()];
/// assert_eq!(permissions_decision(&action, &context).as_str(), "deny");
/// ```
pub fn permissions_decision(action: &RunAction, context: &RunContext) -> PolicyDecision {
    decide_by_permissions(&action.capabilities, &context.permissions)
}

fn decide_by_permissions(capabilities: &[String], permissions: &Metadata) -> PolicyDecision {
    if permissions.is_empty() {
        return PolicyDecision::Allow;
    }
    capabilities
        .iter()
        .map(|capability| {
            let Some(pattern) = best_match(permissions.keys(), capability) else {
                return PolicyDecision::Allow;
            };
            let value = &permissions[pattern];
            match CapabilityRule::from_value(value) {
                Some(rule) => rule.decision(
                    format!(
                        "capability `{capability}` is {} by run permission `{pattern}`",
                        verb(rule)
                    ),
                    Some(capability),
                ),
                None => PolicyDecision::deny(
                    format!(
                        "run permission `{pattern}` has unrecognized value {value}; \
                         denied (fail closed)"
                    ),
                    Some(capability.clone()),
                ),
            }
        })
        .fold(PolicyDecision::Allow, PolicyDecision::most_restrictive)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn caps(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn seed_policy() -> CapabilityPolicy {
        CapabilityPolicy::new()
            .with_rule("records.read", CapabilityRule::Allow)
            .with_rule("records.write", CapabilityRule::RequireApproval)
            .with_rule("records.delete", CapabilityRule::Deny)
    }

    #[test]
    fn deny_outranks_approval_outranks_allow_across_capabilities() {
        let policy = seed_policy();
        assert!(policy.decide(&caps(&["records.read"])).is_allow());
        let d = policy.decide(&caps(&["records.read", "records.write"]));
        assert_eq!(d.as_str(), "require_approval");
        assert_eq!(d.capability(), Some("records.write"));
        // Order of capabilities does not matter.
        for order in [
            ["records.read", "records.write", "records.delete"],
            ["records.delete", "records.write", "records.read"],
            ["records.write", "records.delete", "records.read"],
        ] {
            let d = policy.decide(&caps(&order));
            assert_eq!(d.as_str(), "deny");
            assert_eq!(d.capability(), Some("records.delete"));
        }
    }

    #[test]
    fn exact_rule_beats_wildcard_and_longer_namespace_beats_shorter() {
        let policy = CapabilityPolicy::new()
            .with_rule("*", CapabilityRule::Deny)
            .with_rule("records.*", CapabilityRule::RequireApproval)
            .with_rule("records.public.*", CapabilityRule::Allow)
            .with_rule("records.public.purge", CapabilityRule::Deny);
        for (capability, rule) in [
            ("records.write", CapabilityRule::RequireApproval),
            ("records.sub.x", CapabilityRule::RequireApproval),
            ("records.public.read", CapabilityRule::Allow),
            ("records.public.purge", CapabilityRule::Deny),
        ] {
            assert_eq!(policy.rule_for(capability).0, rule, "{capability}");
        }
        assert_eq!(
            policy.rule_for("mail.send"),
            (CapabilityRule::Deny, Some("*"))
        );
    }

    #[test]
    fn namespace_wildcard_matches_children_only() {
        let policy = CapabilityPolicy::new().with_rule("records.*", CapabilityRule::Deny);
        assert_eq!(policy.rule_for("records.write").0, CapabilityRule::Deny);
        assert_eq!(policy.rule_for("records").0, CapabilityRule::Allow);
        assert_eq!(policy.rule_for("recordsx.write").0, CapabilityRule::Allow);
        assert_eq!(policy.rule_for("records.").0, CapabilityRule::Allow);
    }

    #[test]
    fn action_without_capabilities_gets_the_default() {
        assert!(CapabilityPolicy::new().decide(&[]).is_allow());
        let strict = CapabilityPolicy::new()
            .with_default(CapabilityRule::RequireApproval)
            .with_rule("*", CapabilityRule::Allow);
        let d = strict.decide(&[]);
        assert_eq!(d.as_str(), "require_approval");
        assert_eq!(d.capability(), None);
    }

    #[test]
    fn unmatched_capability_gets_the_default() {
        let policy = seed_policy().with_default(CapabilityRule::Deny);
        let d = policy.decide(&caps(&["mail.send"]));
        assert_eq!(d.as_str(), "deny");
        assert!(d.reason().unwrap_or_default().contains("default"));
    }

    #[test]
    fn policy_round_trips_as_config() {
        let json = json!({"rules": {"records.*": "require_approval", "records.read": "allow"}});
        let policy: CapabilityPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(policy.default, CapabilityRule::Allow);
        assert_eq!(
            policy.rule_for("records.x").0,
            CapabilityRule::RequireApproval
        );
        let back: CapabilityPolicy =
            serde_json::from_value(serde_json::to_value(&policy).unwrap()).unwrap();
        assert_eq!(back, policy);
    }

    #[test]
    fn permissions_accept_names_and_booleans() {
        let mut p = Metadata::new();
        p.insert("a.x".into(), json!("allow"));
        p.insert("b.x".into(), json!("require_approval"));
        p.insert("c.x".into(), json!("deny"));
        p.insert("d.x".into(), json!(true));
        p.insert("e.x".into(), json!(false));
        let d = |c: &str| decide_by_permissions(&caps(&[c]), &p).as_str();
        assert_eq!(
            [
                d("a.x"),
                d("b.x"),
                d("c.x"),
                d("d.x"),
                d("e.x"),
                d("unlisted")
            ],
            [
                "allow",
                "require_approval",
                "deny",
                "allow",
                "deny",
                "allow"
            ]
        );
    }

    #[test]
    fn unknown_permission_values_fail_closed() {
        for value in [
            json!("denied"),
            json!("ALLOW"),
            json!(1),
            json!(null),
            json!({"paths": []}),
        ] {
            let mut p = Metadata::new();
            p.insert("records.write".into(), value.clone());
            let d = decide_by_permissions(&caps(&["records.write"]), &p);
            assert_eq!(d.as_str(), "deny", "value {value} must deny");
            assert!(d.reason().unwrap_or_default().contains("fail closed"));
        }
    }
}
